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

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Resource;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::apiserver;
use crate::invariant::{InvariantChecker, Report};
use crate::kubelet::{ImageTable, Kubelet, KubeletConfig, NodeSpec};
use crate::proxy::ServiceProxy;
use crate::scheduler::Scheduler;

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

/// Why [`TestCluster::exec`] could not run a command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec runs commands in the process kubelet's pods; this is a real cluster")]
    Real,
    #[error("reading the pod")]
    Read(#[source] kube::Error),
    #[error("pod {0} has no such container")]
    NoContainer(String),
    #[error("the container of pod {0} is not running")]
    NotRunning(String),
    #[error("the command is not in the container's image: {0}")]
    Command(String),
    #[error("reading the container's process")]
    Proc(#[source] std::io::Error),
    #[error("running nsenter")]
    Spawn(#[source] std::io::Error),
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

    /// Runs `argv` in a running container of a pod, as `kubectl exec` does: the command is
    /// found in the container's image, with the container's environment, working directory
    /// and mounts (it joins the container's mount namespace), so it sees the pod's volumes
    /// and reaches what the pod reaches. `container` `None`: the pod's default container
    /// (annotation `kubectl.kubernetes.io/default-container`), else the first.
    pub async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
        argv: &[&str],
    ) -> Result<std::process::Output, ExecError> {
        let Some(local) = &self.local else {
            return Err(ExecError::Real);
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let p = pods.get(pod).await.map_err(ExecError::Read)?;
        let spec = p.spec.clone().unwrap_or_default();
        // As kubectl: the named container, else the pod's
        // `kubectl.kubernetes.io/default-container`, else the first.
        let default = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
            .map(String::as_str);
        let c = match container.or(default) {
            Some(n) => spec.containers.iter().find(|c| c.name == n),
            None => spec.containers.first(),
        }
        .ok_or_else(|| ExecError::NoContainer(pod.to_owned()))?;
        let pid = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|s| s.name == c.name))
            .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
            .and_then(|s| s.container_id.as_deref())
            .and_then(|id| id.strip_prefix("process://"))
            .and_then(|id| id.parse::<u32>().ok())
            .ok_or_else(|| ExecError::NotRunning(pod.to_owned()))?;
        let mut spec = c.clone();
        spec.command = Some(argv.iter().map(|a| (*a).to_owned()).collect());
        spec.args = None;
        let launch = local
            .images
            .launch(&spec)
            .map_err(|e| ExecError::Command(format!("{e:?}")))?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let environ = std::fs::read(proc_dir.join("environ")).map_err(ExecError::Proc)?;
        let cwd = std::fs::read_link(proc_dir.join("cwd")).map_err(ExecError::Proc)?;
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--mount={}", proc_dir.join("ns/mnt").display()))
            .arg(format!("--wd={}", cwd.display()))
            .args([
                "--",
                "bash",
                "-c",
                "a0=$1; shift; exec -a \"$a0\" \"$@\"",
                "bash",
            ])
            .arg(&launch.arg0)
            .arg(&launch.program)
            .args(&launch.args)
            .env_clear()
            .stdin(std::process::Stdio::null());
        for kv in environ.split(|b| *b == 0).filter(|kv| !kv.is_empty()) {
            let kv = String::from_utf8_lossy(kv);
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        cmd.output().await.map_err(ExecError::Spawn)
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

/// Parses a multi-document YAML manifest (an `examples/` file, a rendered chart) into
/// objects; empty documents are skipped.
pub fn objects_from_yaml(text: &str) -> Result<Vec<kube::api::DynamicObject>, TestkitError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|source| TestkitError::Yaml { index, source })?;
        if value.is_null() {
            continue;
        }
        let obj: kube::api::DynamicObject =
            serde_yaml::from_value(value).map_err(|source| TestkitError::Yaml { index, source })?;
        if obj.types.is_none() {
            return Err(TestkitError::NoKind { index });
        }
        out.push(obj);
    }
    Ok(out)
}

/// Creates every object of a manifest, in order, finding each kind through discovery (as
/// `kubectl create -f` does). Namespaced objects without a namespace go to `namespace`.
pub async fn create_all(
    client: &kube::Client,
    namespace: &str,
    objects: &[kube::api::DynamicObject],
) -> Result<Vec<kube::api::DynamicObject>, TestkitError> {
    let mut created = Vec::new();
    for (index, obj) in objects.iter().enumerate() {
        let types = obj.types.as_ref().ok_or(TestkitError::NoKind { index })?;
        let gvk = kube::api::GroupVersionKind::try_from(types)
            .map_err(|_| TestkitError::NoKind { index })?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let fail = |source| TestkitError::Create {
            kind: gvk.kind.clone(),
            name: name.clone(),
            source,
        };
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(fail)?;
        let api: Api<kube::api::DynamicObject> = match caps.scope {
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &ar),
            kube::discovery::Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().unwrap_or(namespace);
                Api::namespaced_with(client.clone(), ns, &ar)
            }
        };
        created.push(
            api.create(&PostParams::default(), obj)
                .await
                .map_err(fail)?,
        );
    }
    Ok(created)
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

// === waiting ===

/// A wait that timed out: what was expected, and the last state seen.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {kind} {name} {what}; last observed: {last}")]
pub struct WaitError {
    pub kind: String,
    pub name: String,
    pub what: String,
    pub timeout: Duration,
    /// The last object seen, as JSON, or why there is none.
    pub last: String,
}

/// Waits until the object `name` satisfies `cond` (checked on every version seen) and
/// returns it. `what` completes "waiting for pod x ..." in the error.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&K) -> bool,
) -> Result<K, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + serde::Serialize + 'static,
    K::DynamicType: Default,
{
    match observe(api, name, timeout, |o| o.is_some_and(&cond)).await {
        (true, Some(obj)) => Ok(obj),
        (_, last) => Err(wait_error::<K>(name, what, timeout, last.as_ref(), false)),
    }
}

/// Waits until `name` is gone and returns the last version seen before it went (what
/// the deleting party wrote last), if any was seen.
pub async fn wait_for_deletion<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> Result<Option<K>, WaitError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + serde::Serialize + 'static,
    K::DynamicType: Default,
{
    match observe(api, name, timeout, |o| o.is_none()).await {
        (true, last) => Ok(last),
        (false, last) => Err(wait_error::<K>(
            name,
            "to be deleted",
            timeout,
            last.as_ref(),
            true,
        )),
    }
}

fn wait_error<K: Resource + serde::Serialize>(
    name: &str,
    what: &str,
    timeout: Duration,
    last: Option<&K>,
    exists: bool,
) -> WaitError
where
    K::DynamicType: Default,
{
    let last = match last {
        Some(obj) => {
            serde_json::to_string_pretty(obj).unwrap_or_else(|e| format!("<unprintable: {e}>"))
        }
        None if exists => "<never seen>".into(),
        None => "<not found (never seen, or deleted)>".into(),
    };
    WaitError {
        kind: K::kind(&K::DynamicType::default()).to_lowercase(),
        name: name.to_owned(),
        what: what.to_owned(),
        timeout,
        last,
    }
}

/// Watches one object; `done` sees `Some(current)` or `None` once it is gone. Returns
/// whether `done` held, and the last version seen.
async fn observe<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    done: impl Fn(Option<&K>) -> bool,
) -> (bool, Option<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher::watcher(api.clone(), config).boxed();
    let mut last: Option<K> = None;
    let mut present = false;
    let mut listed = false;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(event)) => event,
            Ok(None) | Err(_) => return (false, last),
        };
        match event {
            Ok(Event::Init) => present = false,
            Ok(Event::InitApply(obj)) => {
                present = true;
                last = Some(obj);
                continue; // judged at InitDone, when the list is complete
            }
            Ok(Event::InitDone) => listed = true,
            Ok(Event::Apply(obj)) => {
                present = true;
                last = Some(obj);
            }
            Ok(Event::Delete(obj)) => {
                present = false;
                last = Some(obj);
            }
            // The watcher retries on its own; a test waiting is not the place to fail.
            Err(_) => continue,
        }
        if listed && done(if present { last.as_ref() } else { None }) {
            return (true, last);
        }
    }
}

/// Polls the pod's log (through the API server's `log` subresource) until it contains
/// `needle`; returns the whole log.
pub async fn wait_for_log(
    pods: &Api<Pod>,
    name: &str,
    needle: &str,
    timeout: Duration,
) -> Result<String, WaitError> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("<no log read yet>");
    while Instant::now() < deadline {
        match pods.logs(name, &kube::api::LogParams::default()).await {
            Ok(text) if text.contains(needle) => return Ok(text),
            Ok(text) => last = format!("log so far: {text:?}"),
            Err(e) => last = format!("log request failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(WaitError {
        kind: "pod".into(),
        name: name.to_owned(),
        what: format!("to log {needle:?}"),
        timeout,
        last,
    })
}

// === fixtures ===

/// A Pod built in code: `PodFixture::new("p").node("n1").sh("echo hi").build()`.
#[derive(Debug, Clone)]
pub struct PodFixture {
    value: serde_json::Value,
}

impl PodFixture {
    /// One container `main` with image `busybox`, `restartPolicy: Never`.
    pub fn new(name: &str) -> Self {
        Self {
            value: json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            }),
        }
    }

    fn main(&mut self) -> &mut serde_json::Value {
        &mut self.value["spec"]["containers"][0]
    }

    pub fn namespace(mut self, ns: &str) -> Self {
        self.value["metadata"]["namespace"] = json!(ns);
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.value["metadata"]["labels"][key] = json!(value);
        self
    }

    /// Binds the pod to a node directly, as the scheduler's binding would.
    pub fn node(mut self, node: &str) -> Self {
        self.value["spec"]["nodeName"] = json!(node);
        self
    }

    pub fn image(mut self, image: &str) -> Self {
        self.main()["image"] = json!(image);
        self
    }

    pub fn command(mut self, argv: &[&str]) -> Self {
        self.main()["command"] = json!(argv);
        self
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.main()["args"] = json!(args);
        self
    }

    /// `sh -c <script>`.
    pub fn sh(self, script: &str) -> Self {
        self.command(&["sh", "-c", script])
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        push(
            &mut self.main()["env"],
            json!({"name": name, "value": value}),
        );
        self
    }

    /// An env var from the downward API (`spec.nodeName`, `metadata.name`, ...).
    pub fn env_field(mut self, name: &str, field_path: &str) -> Self {
        push(
            &mut self.main()["env"],
            json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}),
        );
        self
    }

    /// A `nvidia.com/gpu` limit (requests default to it).
    pub fn gpus(mut self, n: u32) -> Self {
        self.main()["resources"]["limits"]["nvidia.com/gpu"] = json!(n.to_string());
        self
    }

    pub fn requests(mut self, cpu: &str, memory: &str) -> Self {
        self.main()["resources"]["requests"] = json!({"cpu": cpu, "memory": memory});
        self
    }

    /// `Never`, `OnFailure` or `Always`.
    pub fn restart(mut self, policy: &str) -> Self {
        self.value["spec"]["restartPolicy"] = json!(policy);
        self
    }

    pub fn grace(mut self, seconds: i64) -> Self {
        self.value["spec"]["terminationGracePeriodSeconds"] = json!(seconds);
        self
    }

    /// Merges raw JSON into the pod (anything the helpers do not cover).
    pub fn merge(mut self, patch: serde_json::Value) -> Self {
        merge_json(&mut self.value, patch);
        self
    }

    pub fn build(self) -> Pod {
        serde_json::from_value(self.value).expect("PodFixture builds a valid Pod")
    }
}

fn push(slot: &mut serde_json::Value, item: serde_json::Value) {
    match slot {
        serde_json::Value::Array(items) => items.push(item),
        other => *other = json!([item]),
    }
}

/// RFC 7386 merge of `patch` into `target` (`null` removes a key).
pub fn merge_json(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge_json(t.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// The exit code of a pod's (first) terminated container, if any.
pub fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
}

/// The pod's phase, or `""`.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

// === request counting ===

/// Every request a client sent: when, the method and the path with its query. Shared by
/// clones; the client's tower layer appends to it.
#[derive(Debug, Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<RequestRecord>>>);

/// The most of `reqs` (in the order sent) in any one-second window starting at one of them.
pub fn max_in_one_second(reqs: &[RequestRecord]) -> usize {
    let times: Vec<Instant> = reqs.iter().map(|r| r.at).collect();
    let mut best = 0;
    let mut end = 0;
    for start in 0..times.len() {
        while end < times.len() && times[end] < times[start] + Duration::from_secs(1) {
            end += 1;
        }
        best = best.max(end - start);
    }
    best
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub at: Instant,
    pub method: String,
    pub path: String,
}

impl RequestLog {
    pub fn all(&self) -> Vec<RequestRecord> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests sent at or after `since`.
    pub fn since(&self, since: Instant) -> Vec<RequestRecord> {
        self.all().into_iter().filter(|r| r.at >= since).collect()
    }

    /// The most requests in any one-second window starting at a request (a busy loop
    /// shows up here however short it was).
    pub fn max_per_second(&self) -> usize {
        max_in_one_second(&self.all())
    }

    fn record(&self, method: &str, path: String) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(RequestRecord {
                at: Instant::now(),
                method: method.to_owned(),
                path,
            });
    }
}

/// A tower layer that records each request in a [`RequestLog`].
#[derive(Debug, Clone)]
pub struct CountLayer(pub RequestLog);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            log: self.0.clone(),
        }
    }
}

/// The service [`CountLayer`] wraps around a client's stack.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    log: RequestLog,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Counted<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let path = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().to_string(), |p| p.to_string());
        self.log.record(req.method().as_str(), path);
        self.inner.call(req)
    }
}

fn counted_client(config: kube::Config, log: &RequestLog) -> Result<kube::Client, TestkitError> {
    let builder = kube::client::ClientBuilder::try_from(config).map_err(TestkitError::Client)?;
    Ok(builder.with_layer(&CountLayer(log.clone())).build())
}

/// Labels as a map, for fixtures that take them.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
