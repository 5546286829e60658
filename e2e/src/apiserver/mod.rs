//! In-memory Kubernetes API server for tests (see also the `kube-sim` binary).
//!
//! It speaks the Kubernetes REST API over plain HTTP with JSON, faithfully enough that code
//! using `kube::Client` (and `kube::runtime` watchers and controllers), `kubectl` or the
//! Python client behaves as against a real cluster. What it does not do is listed in
//! `e2e/DIFFERENCES.md`.
//!
//! ```text
//!  client ──HTTP──> http.rs ──> ops.rs ──(mutating webhooks)──> strategy.rs ──(validating
//!                     │          │            admission.rs        defaults,       webhooks)
//!                     │          │                                 validation        │
//!                     │          └──────────────────────────────> store.rs <─────────┘
//!                     ├─ list.rs, watch.rs <── store events ──────────┘  │
//!                     ├─ subresource.rs (status, scale, binding,         │
//!                     │   eviction, log -> kubelet)                gc.rs (owner refs,
//!                     └─ discovery.rs, table.rs                   finalizers, namespaces)
//!
//!  workloads.rs (Deployment/ReplicaSet/StatefulSet/Job controllers): woken by store
//!  changes, plans from a snapshot, writes pods through ops.rs like any other client.
//! ```
//!
//! # Layout
//! - `store`: objects, the global resourceVersion, per-type event windows (410 beyond them).
//! - `ops`: create/update/patch/delete in a real server's order of steps.
//! - `strategy`: per-kind defaulting, status handling and validation.
//! - `crd`: CRD -> served type; pruning, defaulting and schema validation of custom resources.
//! - `patch`: JSON, merge, strategic merge patch and server-side apply.
//! - `admission`: mutating and validating webhooks over HTTPS.
//! - `list`, `watch`, `selector`: reads.
//! - `subresource`: scale, binding, eviction, log.
//! - `gc`: garbage collection, namespace and CRD cleanup.
//! - `workloads`: Deployment, ReplicaSet, StatefulSet and Job controllers (make pods).
//! - `events`: mirrors core/v1 and events.k8s.io/v1 Events into each other.
//! - `discovery`, `openapi`, `table`, `http`, `error`, `meta`, `resource`: the rest of the API surface.
//!
//! # Invariants
//! - Every change goes through `Store::with`, which wakes watches, the collector and the
//!   workload controllers; those two settle (a pass with nothing to do writes nothing).
//! - No lock is held across an await: webhooks run before the commit, and the commit
//!   re-checks the object's version (retrying when the client gave none).

mod admission;
mod crd;
mod discovery;
mod error;
mod events;
mod gc;
mod http;
mod list;
mod meta;
mod openapi;
mod ops;
mod patch;
mod resource;
mod selector;
mod store;
mod strategy;
mod subresource;
mod table;
mod watch;
mod workloads;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch as tokio_watch;
use tokio::task::JoinHandle;

pub use error::{ApiError, Cause};

/// Server settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen; port 0 picks a free port.
    pub listen: SocketAddr,
    /// How many recent events each type keeps for watches; older versions get 410 Gone.
    pub watch_window: usize,
    /// How often watches that asked for bookmarks get one. A real server sends one about
    /// every minute; tests want them sooner.
    pub bookmark_interval: Duration,
    /// Namespaces that exist from the start (as on a fresh cluster).
    pub namespaces: Vec<String>,
    /// Run the Deployment/ReplicaSet/StatefulSet/Job controllers (see `workloads`), so
    /// workloads make pods as on a real cluster. Off: those kinds are only stored.
    pub workload_controllers: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            watch_window: 1000,
            bookmark_interval: Duration::from_secs(5),
            workload_controllers: true,
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the listener's address")]
    LocalAddr(#[source] std::io::Error),
    #[error("creating the initial namespace {name}: {source}")]
    Seed {
        name: String,
        #[source]
        source: ApiError,
    },
    #[error("building a client for {url}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error("not a URL: {0}")]
    BadUrl(String),
    #[error("writing kubeconfig {path}")]
    Kubeconfig {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Shared by every request handler and background task.
pub(crate) struct Ctx {
    store: store::Store,
    config: Config,
    /// Flips to true on shutdown; long-lived watch streams end on it.
    shutdown: tokio_watch::Receiver<bool>,
}

/// Entry points.
pub struct Server;

impl Server {
    /// Binds `config.listen` and serves in a background task.
    pub async fn start(config: Config) -> Result<RunningServer, Error> {
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(Error::LocalAddr)?;
        let (tx, rx) = tokio_watch::channel(false);
        let ctx = build(config, rx.clone())?;
        let mut stop = rx;
        let task = tokio::spawn(serve_ctx(ctx, listener, async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
        Ok(RunningServer {
            addr,
            stop: tx,
            task: Some(task),
        })
    }

    /// Serves on a bound listener until `shutdown` completes (mini-redis style; the
    /// `kube-sim` binary uses this).
    pub async fn serve(
        config: Config,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let (tx, rx) = tokio_watch::channel(false);
        let ctx = build(config, rx)?;
        serve_ctx(ctx, listener, async move {
            shutdown.await;
            let _ = tx.send(true);
        })
        .await;
        Ok(())
    }
}

fn build(config: Config, shutdown: tokio_watch::Receiver<bool>) -> Result<Arc<Ctx>, Error> {
    let store = store::Store::new(resource::builtin_types(), config.watch_window);
    for ns in &config.namespaces {
        let rt = store
            .lock()
            .resolve("", "v1", "namespaces")
            .expect("namespaces is a built-in type");
        let mut obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        strategy::prepare_create(&rt, &mut obj);
        store
            .with(|st| {
                let o = st.create(&rt, obj)?;
                let sa_rt = st.resolve("", "v1", "serviceaccounts").expect("built-in");
                let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": meta::name(&o)}});
                st.create(&sa_rt, sa)
            })
            .map_err(|source| Error::Seed { name: ns.clone(), source })?;
    }
    Ok(Arc::new(Ctx {
        store,
        config,
        shutdown,
    }))
}

async fn serve_ctx(
    ctx: Arc<Ctx>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let gc = tokio::spawn(gc::run(ctx.clone()));
    let workloads = ctx
        .config
        .workload_controllers
        .then(|| tokio::spawn(workloads::run(ctx.clone())));
    let app = http::router(ctx.clone());
    let mut stop = ctx.shutdown.clone();
    // Go's net package sets TCP_NODELAY on every connection, so kube-apiserver's watch
    // streams (one small chunk per event) leave at once; without it here, each event
    // written while the previous one is unacknowledged waits for the client's delayed ACK
    // (40 ms), which no real cluster charges.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = shutdown => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "api server stopped with an error");
    }
    gc.abort();
    if let Some(w) = workloads {
        w.abort();
    }
}

/// A server running in this process. Dropping it stops the server too.
pub struct RunningServer {
    addr: SocketAddr,
    stop: tokio_watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for this server, default namespace `default`.
    pub fn client(&self) -> Result<kube::Client, Error> {
        client_for(&self.url())
    }

    /// Writes a kubeconfig that `kube`, `kubectl` and the Python client load unchanged.
    pub fn kubeconfig(&self, path: &Path) -> Result<(), Error> {
        write_kubeconfig(&self.url(), path)
    }

    /// Stops accepting, ends watches, and waits for the server task.
    /// Streams the server does not own (a followed log proxied from a kubelet) could keep
    /// a graceful stop waiting forever, so it gets a few seconds and is then cut short.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(mut t) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(5), &mut t)
                .await
                .is_err()
        {
            t.abort();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A `kube::Client` for a server URL (plain HTTP, no credentials).
pub fn client_for(url: &str) -> Result<kube::Client, Error> {
    let err = |source| Error::Client {
        url: url.to_owned(),
        source,
    };
    let uri: hyper::Uri = url.parse().map_err(|_| Error::BadUrl(url.to_owned()))?;
    kube::Client::try_from(kube::Config::new(uri)).map_err(err)
}

/// The kubeconfig text for a server URL.
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-sim\n  cluster:\n    server: {url}\ncontexts:\n- name: kube-sim\n  context:\n    cluster: kube-sim\n    namespace: default\n    user: kube-sim\ncurrent-context: kube-sim\npreferences: {{}}\nusers:\n- name: kube-sim\n  user: {{}}\n"
    )
}

pub fn write_kubeconfig(url: &str, path: &Path) -> Result<(), Error> {
    // Written aside and renamed, so a reader polling for the file never sees half of it.
    let err = |source| Error::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, kubeconfig_yaml(url)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
