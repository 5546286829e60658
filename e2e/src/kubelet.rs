//! Process kubelet: serves the nodes a test declares, running the containers of the pods
//! bound to them as local processes and driving their status as a kubelet does.
//!
//! It is an ordinary API client (kube-rs), so it runs against the in-repo API server and a
//! real one alike. What it does not do is listed in `e2e/DIFFERENCES.md`.
//!
//! # Layout
//! - [`quantity`], [`admit`], [`env`], [`image`], [`status`]: pure parts (quantities,
//!   admission fit, the container environment, the image table, pod status), unit-tested.
//! - [`node`]: the Node object, its Lease and heartbeat.
//! - [`pod`]: one task per pod: admit, start, restart, delete.
//! - [`probe`]: readiness probes (`exec`, `tcpSocket`, `httpGet`).
//! - [`process`]: container processes in their own process groups.
//! - [`logs`]: captured output and the `/containerLogs` HTTP endpoint.
//!
//! ```text
//!  API server --watch pods (spec.nodeName=N)--> node task --watch channel--> pod task
//!      ^                                                                    |  |
//!      +---- status patches, final delete, events, node status, lease <-----+  |
//!      +---- GET pods/x/log --proxy--> log endpoint <-- LogStore <-- process --+
//! ```
//!
//! # Invariants
//! - A pod task is the only writer of its pod's status.
//! - Admission decisions for one node are serialised (one ledger per node).
//! - Every process group started is killed when the kubelet is dropped.

pub mod admit;
pub mod env;
pub mod image;
pub mod logs;
pub mod node;
pub mod pod;
pub mod probe;
pub mod process;
pub mod quantity;
pub mod status;
pub mod volume;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

pub use image::{Image, ImageTable};
pub use node::NodeSpec;
pub use pod::Backoff;

/// How the kubelet behaves; [`KubeletConfig::new`] has test-friendly defaults.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub images: ImageTable,
    /// Where pod sandboxes and logs go; `None`: a temporary directory removed on drop.
    pub root_dir: Option<PathBuf>,
    /// Lease renewal and node status interval (a real kubelet: 10 s).
    pub heartbeat: Duration,
    pub backoff: Backoff,
    /// The harness id of an [`crate::invariant::InvariantChecker`]: every container's
    /// processes carry its marks (node, pod, owner) in their environment, so the checker
    /// can tell from `/proc` which node and pod a process belongs to. `None`: no marks.
    pub harness: Option<String>,
}

impl KubeletConfig {
    pub fn new(images: ImageTable) -> Self {
        Self {
            images,
            root_dir: None,
            heartbeat: Duration::from_secs(10),
            backoff: Backoff::default(),
            harness: None,
        }
    }
}

/// Why the kubelet could not start or declare a node.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("creating the kubelet directory {path}")]
    RootDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding the kubelet log endpoint on 127.0.0.1")]
    BindLogs(#[source] std::io::Error),
    #[error("node {node}: invalid {field} quantity")]
    InvalidNode {
        node: String,
        field: &'static str,
        #[source]
        source: quantity::QuantityError,
    },
    #[error("node {0} is already declared")]
    DuplicateNode(String),
    #[error("registering node {node}")]
    RegisterNode {
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// A running process kubelet. Dropping it stops its tasks and kills every container.
pub struct Kubelet {
    client: kube::Client,
    config: KubeletConfig,
    root: PathBuf,
    logs: Arc<logs::LogStore>,
    groups: process::ProcessGroups,
    /// Mount points held by this kubelet's pods (given back on shutdown).
    mounts: volume::Held,
    log_addr: SocketAddr,
    /// One task per node (its pod watch, which owns the node's pod tasks) and one per
    /// heartbeat; aborted on drop.
    tasks: Mutex<HashMap<String, Vec<JoinHandle<()>>>>,
    server: JoinHandle<()>,
    /// Keeps the temporary root alive for as long as the kubelet.
    _tmp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("root", &self.root)
            .field("log_addr", &self.log_addr)
            .finish()
    }
}

impl Kubelet {
    /// Starts the log endpoint; nodes come with [`Kubelet::add_node`].
    pub async fn start(client: kube::Client, config: KubeletConfig) -> Result<Self, KubeletError> {
        let (root, tmp) = match &config.root_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix("tandem-kubelet-")
                    .tempdir()
                    .map_err(|source| KubeletError::RootDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (tmp.path().to_owned(), Some(tmp))
            }
        };
        std::fs::create_dir_all(&root).map_err(|source| KubeletError::RootDir {
            path: root.clone(),
            source,
        })?;
        let logs = Arc::new(logs::LogStore::new(root.join("logs")));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(KubeletError::BindLogs)?;
        let log_addr = listener.local_addr().map_err(KubeletError::BindLogs)?;
        let router = logs::router(logs.clone());
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::warn!(error = %e, "kubelet log endpoint stopped");
            }
        });
        Ok(Self {
            client,
            config,
            root,
            logs,
            groups: process::ProcessGroups::default(),
            mounts: volume::Held::default(),
            log_addr,
            tasks: Mutex::new(HashMap::new()),
            server,
            _tmp: tmp,
        })
    }

    /// Where the kubelet serves `/containerLogs/...` (published as the nodes' kubelet port).
    pub fn log_address(&self) -> SocketAddr {
        self.log_addr
    }

    /// Registers a node, starts its heartbeat and begins running the pods bound to it.
    pub async fn add_node(&self, spec: NodeSpec) -> Result<(), KubeletError> {
        let allocatable =
            spec.allocatable()
                .map_err(|(field, source)| KubeletError::InvalidNode {
                    node: spec.name.clone(),
                    field,
                    source,
                })?;
        if self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&spec.name)
        {
            return Err(KubeletError::DuplicateNode(spec.name.clone()));
        }
        let port = self.log_addr.port();
        let node_uid = node::register(&self.client, &spec, port)
            .await
            .map_err(|source| KubeletError::RegisterNode {
                node: spec.name.clone(),
                source,
            })?;
        if let Err(e) = node::heartbeat(&self.client, &spec, &node_uid, port).await {
            return Err(KubeletError::RegisterNode {
                node: spec.name.clone(),
                source: e,
            });
        }
        let ctx = Arc::new(pod::NodeCtx {
            client: self.client.clone(),
            node: spec.name.clone(),
            allocatable,
            labels: spec.all_labels(),
            images: Arc::new(self.config.images.clone()),
            logs: self.logs.clone(),
            groups: self.groups.clone(),
            sandboxes: self.root.join("pods"),
            persistent: self.root.join("pvs"),
            mounts: self.mounts.clone(),
            backoff: self.config.backoff,
            harness: self.config.harness.clone(),
            admitted: Mutex::new(Default::default()),
        });
        let span = tracing::info_span!("node", node = %spec.name);
        let pods = tokio::spawn(watch_pods(ctx).instrument(span.clone()));
        let (client, every) = (self.client.clone(), self.config.heartbeat);
        let name = spec.name.clone();
        let beat = tokio::spawn(
            async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if let Err(e) = node::heartbeat(&client, &spec, &node_uid, port).await {
                        tracing::warn!(error = %e, "node heartbeat failed");
                    }
                }
            }
            .instrument(span),
        );
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, vec![pods, beat]);
        Ok(())
    }

    /// Stops every task and kills every container process.
    pub fn shutdown(&self) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        for (_, handles) in tasks.drain() {
            for h in handles {
                h.abort();
            }
        }
        self.server.abort();
        self.groups.kill_all();
        self.mounts.release_all();
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Watches the pods bound to one node and hands each to its own task.
async fn watch_pods(ctx: Arc<pod::NodeCtx>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    // Pod tasks by uid; dropping the JoinSet (when this task is aborted) aborts them all.
    let mut feeds: HashMap<String, watch::Sender<Option<Pod>>> = HashMap::new();
    let mut tasks = JoinSet::new();
    // uids seen during a relist, to find pods deleted while the watch was down.
    let mut relisted: Option<std::collections::HashSet<String>> = None;
    while let Some(event) = events.next().await {
        while tasks.try_join_next().is_some() {}
        feeds.retain(|_, tx| !tx.is_closed());
        match event {
            Ok(Event::Init) => relisted = Some(Default::default()),
            Ok(Event::InitApply(pod) | Event::Apply(pod)) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    continue;
                };
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(uid.clone());
                }
                match feeds.get(&uid) {
                    Some(tx) => {
                        tx.send_replace(Some(pod));
                    }
                    None => {
                        let (tx, rx) = watch::channel(Some(pod));
                        feeds.insert(uid, tx);
                        tasks.spawn(pod::run(ctx.clone(), rx).in_current_span());
                    }
                }
            }
            Ok(Event::Delete(pod)) => {
                if let Some(tx) = pod.metadata.uid.as_ref().and_then(|uid| feeds.get(uid)) {
                    tx.send_replace(None);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = relisted.take() {
                    for (uid, tx) in &feeds {
                        if !seen.contains(uid) {
                            tx.send_replace(None);
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }
}
