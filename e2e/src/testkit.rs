//! What e2e tests use: a cluster to talk to, nodes, fixtures, and waits that explain
//! themselves when they time out.
//!
//! [`TestCluster::start`] starts the in-repo API server and a process kubelet, or, when
//! `KUBECONFIG` is set, connects to that real cluster instead. Against a real cluster there
//! is no process kubelet: tests that need one call [`TestCluster::needs_process_kubelet`],
//! which prints a `SKIP` line saying why (straight to the terminal, past the test harness's
//! output capture, so a skip is never silent) and returns false.
//!
//! With the in-repo server, every test runs under an [`InvariantChecker`]: it samples the
//! processes and fails the test when [`TestCluster`] drops (or at
//! [`TestCluster::assert_invariant`]) if a node ever ran a batch job and a pod that is not a
//! Tandem worker at the same moment.
//!
//! # Layout
//! - this file: [`TestCluster`] (start, clients, nodes, namespaces, the invariant), its
//!   [`Options`], the images, and the environment ([`tandem_bin`], tracing, [`skip`]).
//! - `wait.rs`: waits on objects and logs that say what they last saw ([`wait_for`]).
//! - `fixture.rs`: [`PodFixture`], [`merge_json`], pod predicates, [`labels`].
//! - `requests.rs`: [`RequestLog`] and the tower layer ([`CountLayer`]) that fills it.
//! - `manifest.rs`: YAML documents to objects ([`objects_from_yaml`]), created through
//!   discovery ([`create_all`]).
//! - `exec.rs`: [`TestCluster::exec`], `kubectl exec` into a process kubelet's pod.

mod exec;
mod fixture;
mod manifest;
mod requests;
mod wait;

pub use exec::ExecError;
pub use fixture::{PodFixture, exit_code, labels, merge_json, phase};
pub use manifest::{create_all, objects_from_yaml};
pub use requests::{CountLayer, Counted, RequestLog, RequestRecord, max_in_one_second};
pub use wait::{WaitError, wait_for, wait_for_deletion, wait_for_log};

use std::io::Write as _;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::apiserver;
use crate::invariant::{InvariantChecker, Report};
use crate::kubelet::{ImageTable, Kubelet, KubeletConfig, NodeSpec};
use crate::proxy::ServiceProxy;
use crate::scheduler::Scheduler;
use requests::counted_client;

/// Why the test kit could not do what a test asked.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("starting the in-repo API server")]
    Server(#[source] apiserver::Error),
    #[error("loading the cluster from KUBECONFIG")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    #[error("building a client")]
    Client(#[source] kube::Error),
    #[error("starting the process kubelet")]
    Kubelet(#[source] crate::kubelet::KubeletError),
    #[error(
        "declaring node {0}: this cluster has no process kubelet (KUBECONFIG points at a real cluster)"
    )]
    NoKubelet(String),
    #[error("reading YAML document {index}")]
    Yaml {
        index: usize,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("YAML document {index} has no apiVersion/kind")]
    NoKind { index: usize },
    #[error("creating {kind} {name} from YAML")]
    Create {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating namespace {name}")]
    Namespace {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// A cluster for one test.
pub struct TestCluster {
    client: kube::Client,
    /// How to reach the cluster, for more clients with their own request logs.
    config: kube::Config,
    requests: RequestLog,
    /// `None` when running against a real cluster.
    local: Option<Local>,
}

struct Local {
    // Field order is drop order: stop checking before the kubelet kills the containers,
    // and stop the kubelet (and its processes) before the server.
    invariant: InvariantChecker,
    /// Set once a failure of the invariant was reported (by an explicit check), so the
    /// drop does not report it again.
    reported: std::sync::atomic::AtomicBool,
    kubelet: Kubelet,
    _scheduler: Option<Scheduler>,
    proxy: Option<ServiceProxy>,
    images: ImageTable,
    system_requests: RequestLog,
    kubelet_requests: RequestLog,
    server: apiserver::RunningServer,
}

/// Options for [`TestCluster::start_with`].
#[derive(Debug, Clone)]
pub struct Options {
    pub kubelet: KubeletConfig,
    pub server: apiserver::Config,
    /// Run the stand-in default scheduler (binds pods that name no scheduler).
    pub scheduler: bool,
    /// Run the service proxy (cluster IPs forward to ready pods).
    pub service_proxy: bool,
}

/// The image the operator runs by default (`ghcr.io/tandem-dev/tandem:<version>`).
pub fn tandem_image() -> String {
    format!("ghcr.io/tandem-dev/tandem:{}", env!("CARGO_PKG_VERSION"))
}

/// The standard images plus Tandem's own image, mapped to the workspace's build directory
/// (`target/<profile>/`, where `tandem`, `tandem-operator` and `tandem-bridge` are built).
pub fn images() -> ImageTable {
    let table = ImageTable::standard(tandem_bin().as_deref());
    match tandem_bin().as_deref().and_then(std::path::Path::parent) {
        Some(dir) => table.with(tandem_image(), crate::kubelet::Image::tandem(dir)),
        None => table,
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            kubelet: KubeletConfig::new(images()),
            server: apiserver::Config::default(),
            scheduler: true,
            service_proxy: true,
        }
    }
}

impl Drop for TestCluster {
    /// Stops the invariant checker, tears the harness down (containers killed), and then
    /// fails the test if the checker saw a violation. A drop that runs because the test
    /// already panicked must not panic again (that aborts the test binary): then the report
    /// goes to the test's captured stderr, printed with its failure.
    fn drop(&mut self) {
        let Some(local) = self.local.take() else {
            return;
        };
        let report: Report = local.invariant.finish();
        tracing::info!(
            samples = report.samples,
            batch_nodes = ?report.batch_nodes,
            pod_nodes = ?report.pod_nodes,
            violations = report.violations.len() as u64 + report.more,
            slowest_sample = ?report.slowest,
            "invariant checker stopped"
        );
        let reported = local.reported.load(std::sync::atomic::Ordering::SeqCst);
        drop(local);
        let Some(msg) = report.failure() else {
            return;
        };
        if reported {
            return;
        }
        if std::thread::panicking() {
            // Not a log line but the test's failure message: libtest shows a failed test's
            // captured stderr.
            eprintln!("{msg}");
        } else {
            panic!("{msg}");
        }
    }
}

impl TestCluster {
    /// The in-repo server with a process kubelet (no nodes yet), or the `KUBECONFIG` cluster.
    pub async fn start() -> Result<Self, TestkitError> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(mut options: Options) -> Result<Self, TestkitError> {
        init_tracing();
        crate::watchdog::arm();
        let requests = RequestLog::default();
        if std::env::var_os("KUBECONFIG").is_some() {
            let config = kube::Config::from_kubeconfig(&kube::config::KubeConfigOptions::default())
                .await
                .map_err(TestkitError::Kubeconfig)?;
            let client = counted_client(config.clone(), &requests)?;
            return Ok(Self {
                client,
                config,
                requests,
                local: None,
            });
        }
        let server = apiserver::Server::start(options.server)
            .await
            .map_err(TestkitError::Server)?;
        let uri = server
            .url()
            .parse()
            .map_err(|_| TestkitError::Server(apiserver::Error::BadUrl(server.url())))?;
        let config = kube::Config::new(uri);
        let client = counted_client(config.clone(), &requests)?;
        // The kubelet gets its own client, so `requests` counts only what the test's code
        // sends, and the kubelet's traffic can be checked on its own.
        let kubelet_requests = RequestLog::default();
        let kubelet_client = counted_client(config.clone(), &kubelet_requests)?;
        // Before the first container, so the checker sees every process from its start.
        let invariant = InvariantChecker::start();
        options.kubelet.harness = Some(invariant.harness().to_owned());
        let images = options.kubelet.images.clone();
        let kubelet = Kubelet::start(kubelet_client, options.kubelet)
            .await
            .map_err(TestkitError::Kubelet)?;
        // The scheduler and the proxy are clients like the kubelet, with a log of their own.
        let system_requests = RequestLog::default();
        let system = counted_client(config.clone(), &system_requests)?;
        let scheduler = options.scheduler.then(|| Scheduler::start(system.clone()));
        let proxy = options
            .service_proxy
            .then(|| ServiceProxy::start(system.clone()));
        let local = Local {
            invariant,
            reported: std::sync::atomic::AtomicBool::new(false),
            kubelet,
            _scheduler: scheduler,
            proxy,
            images,
            system_requests,
            kubelet_requests,
            server,
        };
        Ok(Self {
            client,
            config,
            requests,
            local: Some(local),
        })
    }

    /// The checker of the time partition on this harness's processes (with the in-repo
    /// server): its harness id marks the processes it counts ([`InvariantChecker::node_env`]).
    pub fn invariant(&self) -> Option<&InvariantChecker> {
        self.local.as_ref().map(|l| &l.invariant)
    }

    /// Panics, listing each node with the pid, command line and times of both sides, if a
    /// node ran a batch job and a pod that is not a Tandem worker at the same moment so far.
    /// The drop checks the same at the end of a test; this checks earlier.
    pub fn assert_invariant(&self) {
        let Some(local) = &self.local else {
            return;
        };
        if let Some(msg) = local.invariant.report().failure() {
            local
                .reported
                .store(true, std::sync::atomic::Ordering::SeqCst);
            panic!("{msg}");
        }
    }

    /// Stops the invariant checker and hands its report to the caller, who judges it (a
    /// test of the checker itself); the drop no longer fails on it. `None` on a real
    /// cluster.
    pub fn take_invariant(&self) -> Option<Report> {
        let local = self.local.as_ref()?;
        local
            .reported
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Some(local.invariant.finish())
    }

    /// Starts a cluster for a test that needs the process kubelet; `None` (after printing
    /// a SKIP line) against a real cluster.
    pub async fn start_with_kubelet(test: &str) -> Result<Option<Self>, TestkitError> {
        let cluster = Self::start().await?;
        Ok(cluster.needs_process_kubelet(test).then_some(cluster))
    }

    /// A client for the cluster (default namespace `default`). Its requests are counted
    /// in [`TestCluster::requests`].
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Another client with a request log of its own (to measure one component's traffic).
    pub fn counted_client(&self) -> Result<(kube::Client, RequestLog), TestkitError> {
        let log = RequestLog::default();
        Ok((counted_client(self.config.clone(), &log)?, log))
    }

    /// Whether this is a real cluster from `KUBECONFIG`.
    pub fn is_real(&self) -> bool {
        self.local.is_none()
    }

    /// Every request the test's client sent.
    pub fn requests(&self) -> &RequestLog {
        &self.requests
    }

    /// The in-repo server, if that is what runs.
    pub fn server(&self) -> Option<&apiserver::RunningServer> {
        self.local.as_ref().map(|l| &l.server)
    }

    /// The process kubelet, if the in-repo server runs.
    pub fn kubelet(&self) -> Option<&Kubelet> {
        self.local.as_ref().map(|l| &l.kubelet)
    }

    /// The service proxy, if it runs.
    pub fn service_proxy(&self) -> Option<&ServiceProxy> {
        self.local.as_ref().and_then(|l| l.proxy.as_ref())
    }

    /// Every request the stand-in scheduler and the service proxy sent, if they run.
    pub fn system_requests(&self) -> Option<&RequestLog> {
        self.local.as_ref().map(|l| &l.system_requests)
    }

    /// Every request the process kubelet sent, if it runs.
    pub fn kubelet_requests(&self) -> Option<&RequestLog> {
        self.local.as_ref().map(|l| &l.kubelet_requests)
    }

    /// True if the process kubelet runs; otherwise prints why `test` is skipped.
    pub fn needs_process_kubelet(&self, test: &str) -> bool {
        if self.local.is_none() {
            skip(
                test,
                "it needs the process kubelet (its declared nodes and local processes), and KUBECONFIG points at a real cluster whose kubelets run real containers",
            );
        }
        self.local.is_some()
    }

    /// Declares a node served by the process kubelet: `cpu`/`memory` are quantities
    /// (`"4"`, `"8Gi"`), `gpus` the `nvidia.com/gpu` count.
    pub async fn declare_node(
        &self,
        name: &str,
        cpu: &str,
        memory: &str,
        gpus: u32,
    ) -> Result<(), TestkitError> {
        self.declare(NodeSpec::new(name, cpu, memory, gpus)).await
    }

    /// Declares a node with labels, taints or a pod limit.
    pub async fn declare(&self, spec: NodeSpec) -> Result<(), TestkitError> {
        let Some(local) = &self.local else {
            return Err(TestkitError::NoKubelet(spec.name));
        };
        local
            .kubelet
            .add_node(spec)
            .await
            .map_err(TestkitError::Kubelet)
    }

    /// Declares `count` nodes `{prefix}-0`, `{prefix}-1`, ... of one shape; their names.
    pub async fn declare_nodes(
        &self,
        prefix: &str,
        count: usize,
        cpu: &str,
        memory: &str,
        gpus: u32,
    ) -> Result<Vec<String>, TestkitError> {
        let mut names = Vec::new();
        for i in 0..count {
            let name = format!("{prefix}-{i}");
            self.declare_node(&name, cpu, memory, gpus).await?;
            names.push(name);
        }
        Ok(names)
    }

    /// Creates a namespace `{base}-{random}` so tests never collide on a shared cluster.
    pub async fn namespace(&self, base: &str) -> Result<String, TestkitError> {
        let name = format!("{base}-{:08x}", rand::random::<u32>());
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
            .map_err(|e| TestkitError::Client(kube::Error::SerdeError(e)))?;
        api.create(&PostParams::default(), &ns)
            .await
            .map_err(|source| TestkitError::Namespace {
                name: name.clone(),
                source,
            })?;
        Ok(name)
    }
}

/// Logs to the test's captured output, filtered by `RUST_LOG` (nothing when unset), so
/// a failing test shows what the kubelet and the server did.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Prints `SKIP <test>: <why>` to the terminal, bypassing libtest's output capture.
pub fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
}

/// The `tandem` binary: `$CARGO_BIN_EXE_tandem` if set, else next to the test binary in
/// the target directory (`target/debug/deps/x` -> `target/debug/tandem`), as ripgrep's
/// tests find `rg`. `None` if it has not been built.
pub fn tandem_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CARGO_BIN_EXE_tandem") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?.to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(format!("tandem{}", std::env::consts::EXE_SUFFIX));
    bin.is_file().then_some(bin)
}
