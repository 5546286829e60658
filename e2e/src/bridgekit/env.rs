//! The [`BridgeEnv`] of one test: sets up the batch side, the namespaces, the CRDs, the
//! `TandemCluster` and a kubeconfig; runs the CLI against the controller; gathers the logs;
//! and on drop cancels the jobs before its processes are killed. Starting and restarting
//! those processes is in `daemons.rs`.

mod daemons;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;

use super::{CLUSTER, NodeShape, Proc, Setup, T};
use crate::bounded::{CALL_LIMIT, output_within};
use crate::testkit::{TestCluster, tandem_bin};

/// The batch side, the cluster resource and the bridges of one test.
pub struct BridgeEnv {
    /// The `tandem` binary (the partition watcher runs its `squeue`).
    pub(super) tandem: PathBuf,
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
