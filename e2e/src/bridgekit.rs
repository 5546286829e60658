//! What the bridge's e2e tests share: a batch side (the real `tandem controller` and one real
//! `tandem worker` per harness node, named after it, as the operator names them), the CRDs and
//! a `TandemCluster` whose bridge namespace map names the test's namespaces, a kubeconfig for
//! the harness, and `tandem-bridge run` processes (one or several, to test two replicas).
//!
//! When the [`BridgeEnv`] drops, its jobs are cancelled first (a killed worker would leave
//! them running), then every process is killed (as is a [`Proc`] dropped alone); their logs
//! stay in [`BridgeEnv::dir`] until then, and [`BridgeEnv::logs`] puts their tails in failure
//! messages.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::bounded::{CALL_LIMIT, output_within, within};
use crate::testkit::{TestCluster, tandem_bin};

/// How long a bridge test waits for any one condition.
pub const T: Duration = Duration::from_secs(60);

/// The name of the `TandemCluster` the bridges read (and the pool taint's value).
pub const CLUSTER: &str = "pool";

/// How long a killed process may take to die before it is left behind.
const KILL_LIMIT: Duration = Duration::from_secs(10);

/// A child process, killed (SIGKILL) when dropped; its output is in a log file.
pub struct Proc(Child);

impl Proc {
    /// Kills the process now (SIGKILL, as a crash) and reaps it.
    pub fn kill(&mut self) {
        crate::bounded::kill_and_reap(&mut self.0, KILL_LIMIT);
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.0.try_wait(), Ok(None))
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `bin` with `args`, stdout and stderr to `log`.
pub fn spawn(bin: &Path, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cloning {}: {e}", log.display()));
    let mut c = Command::new(bin);
    c.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, v) in env {
        c.env(k, v);
    }
    Proc(
        c.spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
    )
}

/// A loopback port free right now (the controller is restarted on another if it is taken
/// before it binds).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("picking a free port: {e}"))
}

/// Polls `f` every 200 ms until it holds; panics after [`T`] with `what`.
pub async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + T;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One batch node (and the harness node of the same name).
#[derive(Debug, Clone)]
pub struct NodeShape {
    pub name: String,
    pub cpus: u32,
    pub mem_gib: u32,
    pub gpus: u32,
}

/// What [`BridgeEnv::start`] sets up.
pub struct Setup {
    pub nodes: Vec<NodeShape>,
    /// Namespaces to create (`{base}-{random}`) and their entries in the bridge namespace
    /// map: the JSON object minus `namespace` (`{"account": "a", "qos": "low"}`).
    pub namespaces: Vec<(String, serde_json::Value)>,
    /// The CRDs to install (`tandem_operator::crd::all()`; the operator is a dev-dependency
    /// of the tests, not of this library).
    pub crds: Vec<CustomResourceDefinition>,
    /// Extra `tandem controller` flags.
    pub controller_args: Vec<String>,
}

impl Setup {
    pub fn new(crds: Vec<CustomResourceDefinition>) -> Self {
        Self {
            nodes: Vec::new(),
            namespaces: Vec::new(),
            crds,
            controller_args: Vec::new(),
        }
    }

    /// Adds a node of `cpus` CPUs, `mem_gib` GiB and `gpus` GPUs.
    pub fn node(mut self, name: &str, cpus: u32, mem_gib: u32, gpus: u32) -> Self {
        self.nodes.push(NodeShape {
            name: name.to_owned(),
            cpus,
            mem_gib,
            gpus,
        });
        self
    }

    /// Adds a namespace mapped to `account` in the bridge map; `extra` adds fields
    /// (`{"qos": "low"}`), `json!({})` for none.
    pub fn namespace(mut self, base: &str, account: &str, extra: serde_json::Value) -> Self {
        let mut entry = json!({ "account": account });
        crate::testkit::merge_json(&mut entry, extra);
        self.namespaces.push((base.to_owned(), entry));
        self
    }

    pub fn controller_arg(mut self, arg: &str) -> Self {
        self.controller_args.push(arg.to_owned());
        self
    }
}

/// The batch side, the cluster resource and the bridges of one test.
pub struct BridgeEnv {
    tandem: PathBuf,
    bridge: PathBuf,
    state: PathBuf,
    key: PathBuf,
    addr: String,
    url: String,
    controller_args: Vec<String>,
    controller: Option<Proc>,
    controller_starts: usize,
    /// The nodes' shapes, to start a worker again as it was first started.
    nodes: Vec<NodeShape>,
    /// The invariant checker's harness id, to mark each worker's node.
    harness: Option<String>,
    /// Each node's worker (absent while killed) and how many times it was started.
    workers: BTreeMap<String, (Option<Proc>, usize)>,
    namespaces: BTreeMap<String, String>,
    cluster_ns: String,
    kubeconfig: PathBuf,
    bridges: usize,
    client: kube::Client,
    // Last: fields drop in order, and the processes above use what is in it.
    dir: tempfile::TempDir,
}

impl Drop for BridgeEnv {
    /// A worker killed with SIGKILL leaves its jobs running, as a crashed slurmd does, and
    /// a test must not leave processes behind: while the controller and the workers are
    /// still up, cancel every job and wait (at most 10 s) until no batch job runs; then the
    /// fields drop and kill the processes. Placeholders (the pods' jobs, named
    /// `namespace/owner`) have no process on a worker and end only when a bridge reports
    /// their pods gone, which the test's bridges, dropped first, no longer do: they are
    /// cancelled but not waited for.
    fn drop(&mut self) {
        if self.controller.is_none() {
            return;
        }
        let Ok(listed) = self.try_cli(&["squeue", "-h", "-o", "%i"]) else {
            return;
        };
        let mut cancel = vec!["scancel"];
        cancel.extend(listed.split_whitespace());
        if cancel.len() == 1 {
            return;
        }
        let _ = self.try_cli(&cancel);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            match self.try_cli(&["squeue", "-h", "-t", "R,CG", "-o", "%j"]) {
                Ok(out) if out.lines().any(|name| !name.contains('/')) => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => return,
            }
        }
    }
}

impl BridgeEnv {
    /// Declares the nodes on the harness, starts the controller and the workers, waits until
    /// every node is idle in `sinfo`, creates the namespaces, the CRDs and the
    /// `TandemCluster`, and writes the kubeconfig. No bridge yet: [`BridgeEnv::spawn_bridge`].
    pub async fn start(cluster: &TestCluster, setup: Setup) -> Self {
        let Some(tandem) = tandem_bin() else {
            panic!(
                "target/<profile>/tandem is missing: run `cargo build --bins -p tandem-cli -p tandem-bridge` first"
            );
        };
        let bridge =
            tandem.with_file_name(format!("tandem-bridge{}", std::env::consts::EXE_SUFFIX));
        assert!(
            bridge.is_file(),
            "{} is missing: run `cargo build --bins -p tandem-bridge` first",
            bridge.display()
        );
        let client = cluster.client();
        for n in &setup.nodes {
            cluster
                .declare_node(
                    &n.name,
                    &n.cpus.to_string(),
                    &format!("{}Gi", n.mem_gib),
                    n.gpus,
                )
                .await
                .unwrap_or_else(|e| panic!("declaring node {}: {e}", n.name));
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temp dir: {e}"));
        crate::watchdog::arm();
        crate::watchdog::logs_in(dir.path());
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap_or_else(|e| panic!("{}: {e}", state.display()));
        let key = state.join("tandem.key");
        let kubeconfig = dir.path().join("kubeconfig");
        let mut env = Self {
            tandem,
            bridge,
            state,
            key,
            addr: String::new(),
            url: String::new(),
            controller_args: setup.controller_args,
            controller: None,
            controller_starts: 0,
            nodes: setup.nodes.clone(),
            harness: cluster.invariant().map(|c| c.harness().to_owned()),
            workers: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            cluster_ns: String::new(),
            kubeconfig,
            bridges: 0,
            client: client.clone(),
            dir,
        };
        env.start_controller_on_a_free_port().await;

        for n in &setup.nodes {
            env.start_worker(&n.name);
        }
        let want = setup.nodes.len();
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let out = env
                .try_cli(&["sinfo", "-N", "-h", "-o", "%N %t"])
                .unwrap_or_default();
            if out.lines().filter(|l| l.ends_with("idle")).count() == want {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{want} idle nodes in sinfo; last:\n{out}\n{}",
                env.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The namespace map lives in the TandemCluster; the bridge reads it from there.
        let mut map = Vec::new();
        for (base, entry) in &setup.namespaces {
            let ns = cluster
                .namespace(base)
                .await
                .unwrap_or_else(|e| panic!("namespace {base}: {e}"));
            let mut entry = entry.clone();
            crate::testkit::merge_json(&mut entry, json!({ "namespace": ns }));
            map.push(entry);
            env.namespaces.insert(base.clone(), ns);
        }
        env.cluster_ns = cluster
            .namespace("tandem")
            .await
            .unwrap_or_else(|e| panic!("namespace tandem: {e}"));
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in &setup.crds {
            crds.create(&PostParams::default(), crd)
                .await
                .unwrap_or_else(|e| panic!("creating CRD {:?}: {e}", crd.metadata.name));
        }
        let tc: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
            "metadata": {"name": CLUSTER},
            "spec": {"bridge": {"namespaces": map}},
        }))
        .unwrap_or_else(|e| panic!("the TandemCluster: {e}"));
        env.tandem_clusters()
            .create(&PostParams::default(), &tc)
            .await
            .unwrap_or_else(|e| panic!("creating the TandemCluster: {e}"));

        let server = cluster
            .server()
            .unwrap_or_else(|| panic!("the bridge kit needs the in-repo server"))
            .url();
        std::fs::write(
            &env.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n\
                 contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n\
                 current-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
            ),
        )
        .unwrap_or_else(|e| panic!("writing the kubeconfig: {e}"));
        env
    }

    /// The `TandemCluster` API in the cluster's namespace.
    pub fn tandem_clusters(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.cluster_ns,
            &ApiResource {
                group: "tandem.dev".into(),
                version: "v1alpha1".into(),
                api_version: "tandem.dev/v1alpha1".into(),
                kind: "TandemCluster".into(),
                plural: "tandemclusters".into(),
            },
        )
    }

    fn key_str(&self) -> String {
        self.key.to_string_lossy().into_owned()
    }

    /// Starts the controller on the current address (a fresh free port if none yet, or if
    /// the port was taken before it bound it) and waits until it answers.
    async fn start_controller_on_a_free_port(&mut self) {
        for attempt in 0..5 {
            if self.addr.is_empty() || attempt > 0 {
                self.addr = format!("127.0.0.1:{}", free_port());
                self.url = format!("http://{}", self.addr);
            }
            if self.spawn_controller().await {
                return;
            }
        }
        panic!("the controller did not start:\n{}", self.logs());
    }

    /// Spawns the controller on `self.addr`; true once it answers, false if it exited.
    async fn spawn_controller(&mut self) -> bool {
        // Each start has its own log, so a restarted controller keeps the first one's.
        self.controller_starts += 1;
        let log = match self.controller_starts {
            1 => self.dir.path().join("controller.log"),
            n => self.dir.path().join(format!("controller-{n}.log")),
        };
        let (state, key) = (self.state.to_string_lossy().into_owned(), self.key_str());
        let mut args: Vec<&str> = vec![
            "controller",
            "--listen",
            &self.addr,
            "--state-dir",
            &state,
            "--key-file",
            &key,
            "--heartbeat-interval",
            "200ms",
            "--kill-wait",
            "1s",
            // Loopback only, as the flag requires; the TLS path has its own tests.
            "--insecure-plaintext",
        ];
        args.extend(self.controller_args.iter().map(String::as_str));
        let mut p = spawn(&self.tandem, &args, &log, &[]);
        let deadline = tokio::time::Instant::now() + T;
        loop {
            if p.exited() {
                return false;
            }
            if self.key.is_file() && self.try_cli(&["sinfo", "-h"]).is_ok() {
                self.controller = Some(p);
                return true;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the controller to answer:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the controller (SIGKILL, as a crash).
    pub fn kill_controller(&mut self) {
        if let Some(mut p) = self.controller.take() {
            p.kill();
        }
    }

    /// Starts the controller again with the same state directory, key and address (workers
    /// and bridges reconnect to it), and waits until it answers.
    pub async fn restart_controller(&mut self) {
        self.kill_controller();
        let deadline = tokio::time::Instant::now() + T;
        while !self.spawn_controller().await {
            // The old socket may linger a moment; the address must stay the same.
            assert!(
                tokio::time::Instant::now() < deadline,
                "the controller to restart on {}:\n{}",
                self.addr,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts the worker of node `name` (with the node's shape, spool and invariant mark, as
    /// at the start); its log is `worker-<name>.log`, then `worker-<name>-<n>.log` for the
    /// n-th start.
    fn start_worker(&mut self, name: &str) {
        let n = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the setup"))
            .clone();
        let starts = self.workers.get(name).map_or(0, |w| w.1) + 1;
        // Each worker carries its node's mark, so the invariant checker places its jobs'
        // processes (its descendants) on that node.
        let mark = self
            .harness
            .as_ref()
            .map(|h| crate::invariant::node_mark(h, &n.name));
        let spool = self.dir.path().join(format!("spool-{}", n.name));
        let (cpus, mem, gpus) = (
            n.cpus.to_string(),
            format!("{}G", n.mem_gib),
            n.gpus.to_string(),
        );
        let log = match starts {
            1 => self.dir.path().join(format!("worker-{}.log", n.name)),
            k => self.dir.path().join(format!("worker-{}-{k}.log", n.name)),
        };
        let (url, key) = (self.url.clone(), self.key_str());
        let p = spawn(
            &self.tandem,
            &[
                "worker",
                "--controller",
                &url,
                "--key-file",
                &key,
                "--name",
                &n.name,
                "--cpus",
                &cpus,
                "--mem",
                &mem,
                "--gpus",
                &gpus,
                "--state-dir",
                &spool.to_string_lossy(),
                "--insecure-plaintext",
            ],
            &log,
            &mark
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        self.workers.insert(n.name.clone(), (Some(p), starts));
    }

    /// Kills the worker of node `name` (SIGKILL, as a crash of slurmd): its jobs' processes
    /// live on until a worker of that node starts again and ends them.
    pub fn kill_worker(&mut self, name: &str) {
        if let Some(mut p) = self.workers.get_mut(name).and_then(|w| w.0.take()) {
            p.kill();
        }
    }

    /// Starts the worker of node `name` again (killing it first if it runs) with the same
    /// spool; it registers with the controller as the same node.
    pub fn restart_worker(&mut self, name: &str) {
        self.kill_worker(name);
        self.start_worker(name);
    }

    /// Starts a `tandem-bridge run` for the cluster, with `extra` flags; its log is
    /// `bridge-<n>.log` in [`BridgeEnv::dir`].
    pub fn spawn_bridge(&mut self, extra: &[&str]) -> Proc {
        self.bridges += 1;
        let key = self.key_str();
        let mut args = vec![
            "run",
            "--controller",
            &self.url,
            "--key-file",
            &key,
            "--cluster",
            CLUSTER,
            "--cluster-namespace",
            &self.cluster_ns,
        ];
        // The GPU holders run as real processes here: the harness runs `busybox` images
        // (the release image is not in its table, so its holders would never start).
        if !extra.iter().any(|a| a.starts_with("--gpu-holder-image")) {
            args.extend_from_slice(&["--gpu-holder-image", "busybox"]);
        }
        args.extend_from_slice(extra);
        let log = self.dir.path().join(format!("bridge-{}.log", self.bridges));
        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        spawn(&self.bridge, &args, &log, &[("KUBECONFIG", &kubeconfig)])
    }

    /// The environment the CLI needs to reach the controller as an administrator.
    pub fn cli_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TANDEM_CONTROLLER", self.url.clone()),
            ("TANDEM_KEY_FILE", self.key_str()),
        ]
    }

    /// Runs `tandem <args>` against the controller; its stdout, or its stderr as the error.
    pub fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new(&self.tandem);
        c.args(args).stdin(Stdio::null());
        for (k, v) in self.cli_env() {
            c.env(k, v);
        }
        let out = output_within(&mut c, CALL_LIMIT)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Runs `tandem <args>`; its stdout. Panics (with the logs) if it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("tandem {args:?}: {e}\n{}", self.logs()))
    }

    /// The real name of the namespace created for `base`.
    pub fn ns(&self, base: &str) -> &str {
        self.namespaces
            .get(base)
            .unwrap_or_else(|| panic!("no namespace {base} in the setup"))
    }

    /// The namespace the `TandemCluster` lives in.
    pub fn cluster_namespace(&self) -> &str {
        &self.cluster_ns
    }

    /// The controller's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Lists the pods `lp` selects in `api` until `cond` holds for them; them. Panics after
    /// [`T`] with `what`, the pods last seen and the logs.
    pub async fn wait_pods(
        &self,
        api: &Api<Pod>,
        lp: &ListParams,
        what: &str,
        cond: impl Fn(&[Pod]) -> bool,
    ) -> Vec<Pod> {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let pods = list_bounded(api, lp).await.unwrap_or_default();
            if cond(&pods) {
                return pods;
            }
            if tokio::time::Instant::now() >= deadline {
                let seen: Vec<String> = pods.iter().map(describe).collect();
                panic!(
                    "timed out waiting for {what}; pods:\n{}\n{}",
                    seen.join("\n"),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `tandem <args>` until `cond` holds for its output; the output.
    pub async fn wait_cli(&self, args: &[&str], what: &str, cond: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let out = self.try_cli(args).unwrap_or_default();
            if cond(&out) {
                return out;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out waiting for {what}; `tandem {}` said:\n{out}\n{}",
                    args.join(" "),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `f` every 200 ms until it holds; panics after [`T`] with `what` and the logs.
    pub async fn wait_until(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + T;
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Lists the Events of `api` until one satisfies `cond`; it. Panics after [`T`] with
    /// `what` and the Events last seen.
    pub async fn wait_event(
        &self,
        api: &Api<KubeEvent>,
        what: &str,
        cond: impl Fn(&KubeEvent) -> bool,
    ) -> KubeEvent {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            let evs = list_bounded(api, &ListParams::default())
                .await
                .unwrap_or_default();
            if let Some(e) = evs.iter().find(|e| cond(e)) {
                return e.clone();
            }
            if tokio::time::Instant::now() >= deadline {
                let seen: Vec<String> = evs
                    .iter()
                    .map(|e| {
                        format!(
                            "{:?} {:?} on {:?}: {:?}",
                            e.type_,
                            e.reason,
                            e.regarding.as_ref().and_then(|r| r.name.as_deref()),
                            e.note
                        )
                    })
                    .collect();
                panic!(
                    "timed out waiting for {what}; events:\n{}\n{}",
                    seen.join("\n"),
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Submits `sbatch --parsable <args> -o /dev/null --wrap <wrap>`; the job id.
    pub fn sbatch(&self, args: &[&str], wrap: &str) -> String {
        let mut all = vec!["sbatch", "--parsable"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "/dev/null", "--wrap", wrap]);
        self.cli(&all).trim().to_owned()
    }

    /// Asserts that `sinfo` shows `node` in `mode` (`kube` or `batch`).
    pub fn assert_mode(&self, node: &str, mode: &str) {
        let m = self.cli(&["sinfo", "-N", "-h", "-n", node, "-o", "%N %k"]);
        assert_eq!(m.trim(), format!("{node} {mode}"), "sinfo of {node}");
    }

    /// Where the logs (and spools) are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last 40 lines of every log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        for f in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "log"))
        {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            out.push_str(&format!(
                "--- {} (last {} lines)\n{}\n",
                f.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                tail.len(),
                tail.join("\n")
            ));
        }
        out
    }
}

/// One line about a pod: name, node, phase, and its `PodScheduled` condition.
pub fn describe(p: &Pod) -> String {
    format!(
        "{} node={:?} phase={:?} scheduled={:?}",
        p.metadata.name.as_deref().unwrap_or(""),
        node_of(p),
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        scheduled(p).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone())),
    )
}

/// The node a pod is bound to.
pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Whether the pod's phase is `Running`.
pub fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The pod's `PodScheduled` condition.
pub fn scheduled(p: &Pod) -> Option<&PodCondition> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
}

/// The message of the pod's `PodScheduled=False` `Unschedulable` condition, if it has one.
pub fn unschedulable(p: &Pod) -> Option<&str> {
    scheduled(p)
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.message.as_deref().unwrap_or(""))
}

/// The `tandem.dev/job-id` annotation of a bound pod.
pub fn job_id(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("tandem.dev/job-id"))
        .map(String::as_str)
}

/// A Deployment of `replicas` pods of `gpus` GPUs each (label `app=<name>`), scheduled by
/// Tandem.
pub fn deployment(name: &str, replicas: u32, gpus: u32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": "tandem",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "serve", "image": "busybox",
                        "command": ["sh", "-c", "sleep 300"],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "limits": {"nvidia.com/gpu": gpus.to_string()}}}],
                },
            },
        },
    }))
    .unwrap_or_else(|e| panic!("deployment {name}: {e}"))
}

/// A pod of one GPU (and 1 CPU, 1 GiB) that sleeps, scheduled by Tandem; `extra` is merged
/// into the whole object (`{"metadata": {"labels": ..}}`, `{"spec": {"nodeSelector": ..}}`).
pub fn gpu_pod(name: &str, extra: serde_json::Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tandem",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", "sleep 300"],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "1"}}}],
        },
    });
    crate::testkit::merge_json(&mut pod, extra);
    serde_json::from_value(pod).unwrap_or_else(|e| panic!("pod {name}: {e}"))
}

/// Sets the Deployment `name`'s replicas.
pub async fn scale(api: &Api<Deployment>, name: &str, replicas: u32) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .unwrap_or_else(|e| panic!("scaling {name} to {replicas}: {e}"));
}

/// A `--wrap` that runs until `file` exists, so the test decides when the job ends.
pub fn held(file: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.1; done", file.display())
}

// === the time partition, checked on every state change observed ===

/// Expands a Slurm host list (`k[1-3,5],gpu-07`) into names.
pub fn hostnames(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let Some((prefix, rest)) = part.split_once('[') else {
            out.push(part.to_owned());
            continue;
        };
        let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
        for r in ranges.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let width = a.len();
            match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) => {
                    for n in a..=b {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
                _ => out.push(format!("{prefix}{r}{suffix}")),
            }
        }
    }
    out
}

/// What one node held at one observation: batch jobs and bridged pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHolds {
    pub batch: BTreeSet<String>,
    pub pods: BTreeSet<String>,
}

/// What the partition watcher saw over a test.
#[derive(Debug, Default)]
pub struct PartitionReport {
    /// Observations made (each: pods, squeue, pods again).
    pub samples: usize,
    /// Every change of what a node held, in order: (ms since start, node, holds).
    pub changes: Vec<(u128, String, NodeHolds)>,
    /// Observations where a node surely held a batch job and a bridged pod at once.
    pub overlaps: Vec<String>,
    /// Nodes seen running batch work, and nodes seen hosting bridged pods (at any time).
    pub batch_nodes: BTreeSet<String>,
    pub pod_nodes: BTreeSet<String>,
}

impl PartitionReport {
    /// The change log, for failure messages.
    pub fn timeline(&self) -> String {
        self.changes
            .iter()
            .map(|(t, n, h)| format!("{t:>6} ms {n}: batch {:?} pods {:?}", h.batch, h.pods))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Asserts that no node ran batch work and a bridged pod at once, and that the watcher
    /// observed something.
    pub fn assert_no_overlap(&self) {
        assert!(
            self.overlaps.is_empty(),
            "batch work and bridged pods shared a node:\n{}\ntimeline:\n{}",
            self.overlaps.join("\n"),
            self.timeline()
        );
        assert!(self.samples > 0, "the watcher observed nothing");
    }
}

/// Watches one pool for a batch job and a bridged pod on one node at the same moment, in
/// its own thread (own runtime, own client), so a test's blocking CLI calls never pause it.
///
/// Each observation lists the bridged pods (bound, not finished), then reads the running
/// batch jobs from `squeue`, then lists the pods again: a pod present in both lists was on
/// its node for the whole `squeue` call, so a batch job `squeue` shows on that node ran at
/// the same moment as the pod. This never reports a false overlap however late a watch or
/// a process is, and it observes every change that lasts longer than one observation.
/// Placeholder jobs (named `namespace/owner`) are the pods' own and are not batch work.
pub struct PartitionWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<PartitionReport>>,
}

impl PartitionWatch {
    /// Stops watching; what was seen.
    pub fn finish(mut self) -> PartitionReport {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => panic!("the partition watcher panicked"),
        }
    }
}

impl Drop for PartitionWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl BridgeEnv {
    /// Starts the [`PartitionWatch`] of this pool.
    pub fn watch_partition(&self, server_url: &str) -> PartitionWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tandem, env) = (self.tandem.clone(), self.cli_env());
        let url = server_url.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("a runtime: {e}"));
            rt.block_on(partition_loop(url, tandem, env, stop2))
        });
        PartitionWatch {
            stop,
            thread: Some(thread),
        }
    }
}

/// The objects `lp` selects in `api`; `None` if the list failed or took longer than
/// [`CALL_LIMIT`].
async fn list_bounded<K>(api: &Api<K>, lp: &ListParams) -> Option<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = within(CALL_LIMIT, "a list", api.list(lp)).await.ok()?;
    listed.ok().map(|l| l.items)
}

/// Bridged pods on their nodes now: node -> `namespace/name`.
async fn pods_on_nodes(api: &Api<Pod>) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let pods = list_bounded(api, &ListParams::default()).await?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in pods {
        let Some(spec) = p.spec.as_ref() else {
            continue;
        };
        if spec.scheduler_name.as_deref() != Some("tandem") {
            continue;
        }
        let Some(node) = spec.node_name.clone() else {
            continue;
        };
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(""),
            p.metadata.name.as_deref().unwrap_or("")
        );
        out.entry(node).or_default().insert(name);
    }
    Some(out)
}

/// Batch jobs running (or completing) now: node -> job ids; `None` if squeue failed.
fn batch_on_nodes(
    tandem: &Path,
    env: &[(&'static str, String)],
) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let mut c = Command::new(tandem);
    c.args(["squeue", "-h", "-t", "R,CG", "-o", "%i|%j|%N"])
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = output_within(&mut c, CALL_LIMIT).ok()?;
    if !out.status.success() {
        return None;
    }
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut f = line.splitn(3, '|');
        let (Some(id), Some(name), Some(nodes)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if name.contains('/') {
            continue; // a placeholder: the pods' own job
        }
        for n in hostnames(nodes) {
            map.entry(n).or_default().insert(id.trim().to_owned());
        }
    }
    Some(map)
}

async fn partition_loop(
    url: String,
    tandem: PathBuf,
    env: Vec<(&'static str, String)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> PartitionReport {
    let mut report = PartitionReport::default();
    let Ok(uri) = url.parse() else {
        panic!("bad server url {url}");
    };
    let client = kube::Client::try_from(kube::Config::new(uri))
        .unwrap_or_else(|e| panic!("a client for the partition watcher: {e}"));
    let api: Api<Pod> = Api::all(client);
    let started = std::time::Instant::now();
    let mut last: BTreeMap<String, NodeHolds> = BTreeMap::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let before = pods_on_nodes(&api).await;
        let tandem2 = tandem.clone();
        let env2 = env.clone();
        let batch = tokio::task::spawn_blocking(move || batch_on_nodes(&tandem2, &env2))
            .await
            .ok()
            .flatten();
        let after = pods_on_nodes(&api).await;
        let (Some(before), Some(batch), Some(after)) = (before, batch, after) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        report.samples += 1;
        let mut now: BTreeMap<String, NodeHolds> = BTreeMap::new();
        for (node, jobs) in &batch {
            now.entry(node.clone()).or_default().batch = jobs.clone();
            report.batch_nodes.insert(node.clone());
            let held: BTreeSet<&String> = before
                .get(node)
                .into_iter()
                .flatten()
                .filter(|p| after.get(node).is_some_and(|a| a.contains(*p)))
                .collect();
            if !held.is_empty() {
                report.overlaps.push(format!(
                    "{} ms: {node} ran batch jobs {jobs:?} while pods {held:?} were on it",
                    started.elapsed().as_millis()
                ));
            }
        }
        for (node, pods) in &after {
            now.entry(node.clone()).or_default().pods = pods.clone();
            report.pod_nodes.insert(node.clone());
        }
        let nodes: BTreeSet<String> = now.keys().chain(last.keys()).cloned().collect();
        for n in nodes {
            let h = now.get(&n).cloned().unwrap_or_default();
            if last.get(&n).cloned().unwrap_or_default() != h {
                report
                    .changes
                    .push((started.elapsed().as_millis(), n.clone(), h));
            }
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::hostnames;

    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        assert_eq!(hostnames("k1"), vec!["k1"]);
        assert_eq!(hostnames("k[1-3]"), vec!["k1", "k2", "k3"]);
        assert_eq!(
            hostnames("gpu-[07,09-10],cpu1"),
            vec!["gpu-07", "gpu-09", "gpu-10", "cpu1"]
        );
        assert!(hostnames("").is_empty());
    }
}
