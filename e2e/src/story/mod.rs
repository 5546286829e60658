//! The whole story on the harness, printed as it goes: a platform team installs Tandem, a
//! researcher submits batch work from a login pod, a serving team deploys inference through
//! the bridge, and both share one pool of GPU nodes under one fair-share tree.
//!
//! Shared by the `tandem-demo` binary (the README's one command) and `tests/story.rs`.
//!
//! # Steps
//! 1. Nodes: `sys-0` for the controller and login pods, `gpu-0..` the GPU pool.
//! 2. Install: the four charts `tandem-crds`, `tandem-operator`, `tandem-cluster` (with
//!    [`values::cluster`]: two teams, the worker set `gpu` at 2 of the 4 pool nodes with an
//!    HPA, a login set) and `tandem-bridge`, rendered by real Helm ([`helm`]) and every
//!    object created on the harness. The harness serves plain HTTP and mounts no
//!    service-account token, so the operator and bridge Deployments are installed at 0
//!    replicas and their containers' command lines (from the rendered charts) run here as
//!    processes with a kubeconfig.
//! 3. Serving: an inference Deployment with `schedulerName: tandem`; the bridge binds its
//!    pods to pool nodes that turn to `kube` mode.
//! 4. Research: from the login pod (`kubectl exec` equivalent), the 2-node all-reduce
//!    example and the sweep array. They wait (the pool has 2 workers, one at least serving);
//!    the story plays the chart's HPA ([`autoscale`]): the controller's pending-nodes gauge
//!    scales the worker set to the whole pool through its scale subresource, and the jobs
//!    run; `squeue`, `sinfo` with modes while they do.
//! 5. The pool flips: the Deployment scales to zero and a 4-node job takes every node,
//!    so the `kube` nodes turn `batch`.
//! 6. `sshare`: both teams' usage moved. Cleanup: the Deployment deleted, then `helm
//!    uninstall` of each release, last installed first (every object it made deleted, last
//!    first): nothing is left, no pod either.
//!
//! Against a real cluster (`KUBECONFIG`), [`run_real`] does what needs no process kubelet:
//! the four installs, the check that their objects exist, the uninstalls and the check that
//! nothing is left; it prints `SKIP <step>: <why>` for every other step.
//!
//! Every wait has a deadline and fails with the last thing it saw and the components' logs.

pub mod autoscale;
pub mod helm;
pub mod manifests;
pub mod procs;
pub mod table;
pub mod values;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::kubelet::NodeSpec;
use crate::testkit::{TestCluster, TestkitError, create_all, objects_from_yaml, skip};
use manifests::{CLUSTER, Pool, RESEARCH, SERVING};
pub use procs::Bins;
use procs::Proc;
use values::{LOGIN_SET, WORKER_SET};

/// How long any one condition may take (real processes on a loaded 2-core machine).
const LONG: Duration = Duration::from_secs(90);

/// The pool: four nodes of two GPUs.
const POOL: Pool = Pool {
    nodes: 4,
    cpus: 8,
    mem_gib: 16,
    gpus: 2,
};

/// Workers the set starts with: fewer than the research jobs need once inference runs.
const START_WORKERS: usize = 2;

/// Why the story stopped. The Kubernetes errors are boxed: `kube::Error` is large, and every
/// step returns this.
#[derive(Debug, thiserror::Error)]
pub enum StoryError {
    #[error("{step}: {detail}")]
    Step { step: String, detail: String },
    #[error("{step}")]
    Kube {
        step: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{step}")]
    Testkit {
        step: String,
        #[source]
        source: Box<TestkitError>,
    },
    #[error("{step}")]
    Io {
        step: String,
        #[source]
        source: std::io::Error,
    },
}

fn failed(step: impl Into<String>, detail: impl Into<String>) -> StoryError {
    StoryError::Step {
        step: step.into(),
        detail: detail.into(),
    }
}

fn kube_err(step: &str) -> impl FnOnce(kube::Error) -> StoryError + '_ {
    move |source| StoryError::Kube {
        step: step.to_owned(),
        source: Box::new(source),
    }
}

fn kit_err(step: &str) -> impl FnOnce(TestkitError) -> StoryError + '_ {
    move |source| StoryError::Testkit {
        step: step.to_owned(),
        source: Box::new(source),
    }
}

fn io_err(step: &str) -> impl FnOnce(std::io::Error) -> StoryError + '_ {
    move |source| StoryError::Io {
        step: step.to_owned(),
        source,
    }
}

/// What the story saw, for a test to check beyond "it finished".
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Nodes the inference pods were bound to.
    pub inference_nodes: Vec<String>,
    /// The nodes the all-reduce ranks reported from.
    pub allreduce_nodes: Vec<String>,
    /// Array tasks COMPLETED.
    pub array_tasks: usize,
    /// The worker set's replicas before and after the autoscaler saw the pending jobs.
    pub scaled: (i64, i64),
    /// Nodes seen in `kube` mode, then `batch` again once the 4-node job ran.
    pub flipped: Vec<String>,
    /// RawUsage per account from `sshare` at the end.
    pub usage: BTreeMap<String, u64>,
    pub elapsed: Duration,
}

/// Runs the story on `cluster` (the harness, with the process kubelet) with `bins`.
pub async fn run(cluster: &TestCluster, bins: &Bins) -> Result<Outcome, StoryError> {
    let began = Instant::now();
    let mut s = Story::new(cluster, Some(bins))?;
    let result = s.play(began).await;
    if result.is_err() {
        s.dump().await;
    }
    s.cleanup(result.is_ok()).await?;
    result
}

/// The steps after the install, each of which needs the process kubelet, and why.
const KUBELET_STEPS: [(&str, &str); 5] = [
    (
        "serving",
        "the bridge runs here as a process and must reach the controller's cluster IP from this machine",
    ),
    (
        "research",
        "`kubectl exec` into the login pod runs the pod's command here (the process kubelet)",
    ),
    (
        "autoscale",
        "the story reads the controller's metrics at its cluster IP from this machine",
    ),
    ("flip", "it needs the serving and research steps"),
    ("sshare", "`kubectl exec` into the login pod"),
];

/// On a real cluster (`KUBECONFIG`): the four charts installed (rendered and applied, the
/// operator and bridge at 0 replicas, so nothing runs), every object they made checked to
/// exist, then uninstalled and checked gone, and the story's namespaces deleted. Prints
/// `SKIP <step>: <why>` for the steps that need the process kubelet. The number of objects
/// the releases made.
pub async fn run_real(cluster: &TestCluster) -> Result<usize, StoryError> {
    let mut s = Story::new(cluster, None)?;
    let result = s.install_charts().await;
    let result = match result {
        Ok(()) => s.check_installed().await,
        Err(e) => Err(e),
    };
    if result.is_ok() {
        for (step, why) in KUBELET_STEPS {
            skip(step, why);
        }
    }
    let made = s.releases.iter().map(|r| r.made.len()).sum();
    let uninstalled = s
        .uninstall(
            &[
                "tandem-bridge",
                "tandem-cluster",
                "tandem-operator",
                "tandem-crds",
            ],
            result.is_ok(),
        )
        .await;
    let deleted = s.delete_namespaces().await;
    result?;
    uninstalled?;
    deleted?;
    Ok(made)
}

struct Story<'a> {
    cluster: &'a TestCluster,
    client: kube::Client,
    /// The binaries the harness runs; none on a real cluster.
    bins: Option<&'a Bins>,
    /// Logs, kubeconfig, key files and the jobs' working directory.
    dir: tempfile::TempDir,
    /// The namespace Tandem is installed in, and the serving team's.
    ns: String,
    serving: String,
    operator: Option<Proc>,
    bridge: Option<Proc>,
    /// The chart venv's python, once made.
    python: Option<PathBuf>,
    /// The Helm releases, in install order.
    releases: Vec<Release>,
}

/// One `helm install`: what it made, in creation order (uninstall deletes it in reverse).
struct Release {
    name: String,
    made: Vec<helm::Made>,
}

fn say(what: &str) {
    println!("\n== {what}");
    let _ = std::io::stdout().flush();
}

fn show(text: &str) {
    print!("{text}");
    if !text.ends_with('\n') {
        println!();
    }
    let _ = std::io::stdout().flush();
}

impl<'a> Story<'a> {
    fn new(cluster: &'a TestCluster, bins: Option<&'a Bins>) -> Result<Self, StoryError> {
        let dir = tempfile::Builder::new()
            .prefix("tandem-story-")
            .tempdir()
            .map_err(io_err("a temp dir"))?;
        Ok(Self {
            cluster,
            client: cluster.client(),
            bins,
            dir,
            ns: String::new(),
            serving: String::new(),
            operator: None,
            bridge: None,
            python: None,
            releases: Vec::new(),
        })
    }

    async fn play(&mut self, began: Instant) -> Result<Outcome, StoryError> {
        self.nodes().await?;
        self.install().await?;
        let inference_nodes = self.serve().await?;
        let (allreduce_nodes, array_tasks, scaled) = self.research().await?;
        let flipped = self.flip(&inference_nodes).await?;
        let usage = self.sshare().await?;
        Ok(Outcome {
            inference_nodes,
            allreduce_nodes,
            array_tasks,
            scaled,
            flipped,
            usage,
            elapsed: began.elapsed(),
        })
    }

    // === 1. nodes ===

    async fn nodes(&self) -> Result<(), StoryError> {
        say(&format!(
            "nodes: sys-0 (controller, login) and a pool gpu-0..gpu-{} of {} CPUs, {} GiB, {} GPUs each",
            POOL.nodes - 1,
            POOL.cpus,
            POOL.mem_gib,
            POOL.gpus
        ));
        let (sk, sv) = manifests::SYSTEM_LABEL;
        self.cluster
            .declare(NodeSpec::new("sys-0", "4", "8Gi", 0).label(sk, sv))
            .await
            .map_err(kit_err("declaring sys-0"))?;
        let (pk, pv) = manifests::POOL_LABEL;
        for i in 0..POOL.nodes {
            let name = format!("gpu-{i}");
            self.cluster
                .declare(
                    NodeSpec::new(
                        &name,
                        &POOL.cpus.to_string(),
                        &format!("{}Gi", POOL.mem_gib),
                        POOL.gpus,
                    )
                    .label(pk, pv),
                )
                .await
                .map_err(kit_err("declaring a pool node"))?;
        }
        Ok(())
    }

    // === 2. install ===

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    async fn install(&mut self) -> Result<(), StoryError> {
        let server = self
            .cluster
            .server()
            .ok_or_else(|| failed("install", "the story needs the in-repo API server"))?
            .url();
        std::fs::write(
            self.kubeconfig(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: harness\n  cluster:\n    server: {server}\n\
                 contexts:\n- name: harness\n  context:\n    cluster: harness\n    user: harness\n\
                 current-context: harness\nusers:\n- name: harness\n  user: {{}}\n"
            ),
        )
        .map_err(io_err("writing the kubeconfig"))?;
        self.namespaces().await?;
        let rendered = self.install_crds_and_operator().await?;
        // The harness serves plain HTTP and mounts no service-account token, so an
        // in-cluster client cannot reach it: the Deployment is installed at 0 replicas and
        // its container runs here as a process, with the chart's own command line.
        let argv = deployment_argv(&rendered, "tandem-operator")?;
        println!("running the chart's container here: {}", argv.join(" "));
        let kubeconfig = self.kubeconfig();
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        let bins = self.bins.ok_or_else(|| failed("install", "no binaries"))?;
        self.operator = Some(
            Proc::spawn(
                &bins.operator,
                &args,
                &[("KUBECONFIG", &kubeconfig)],
                self.dir.path().join("operator.log"),
            )
            .map_err(io_err("starting tandem-operator"))?,
        );

        self.install_cluster().await?;
        self.wait_ready("WorkerSet", "workersets", WORKER_SET, START_WORKERS)
            .await?;
        self.wait_ready("LoginSet", "loginsets", LOGIN_SET, 1)
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.ns));
        show(&self.pods_table(&self.ns).await?);

        self.start_bridge().await?;
        self.check_installed().await?;
        say(&format!(
            "kubectl exec {LOGIN_SET}-0 -- sinfo -N -o '%N %P %t %k'"
        ));
        show(&self.login(&["sinfo", "-N", "-o", "%N %P %t %k"]).await?);
        Ok(())
    }

    /// The namespace Tandem goes in and the serving team's, new ones each run.
    async fn namespaces(&mut self) -> Result<(), StoryError> {
        self.ns = self
            .cluster
            .namespace("tandem")
            .await
            .map_err(kit_err("namespace tandem"))?;
        self.serving = self
            .cluster
            .namespace("serving")
            .await
            .map_err(kit_err("namespace serving"))?;
        println!(
            "namespaces: {} (Tandem), {} (the serving team)",
            self.ns, self.serving
        );
        Ok(())
    }

    /// `helm install` of `tandem-crds` and `tandem-operator`; what the operator chart
    /// rendered.
    async fn install_crds_and_operator(&mut self) -> Result<helm::Rendered, StoryError> {
        self.python = Some(helm::python().map_err(|e| failed("helm", format!("{e:#}")))?);
        say("helm install tandem-crds charts/tandem-crds");
        self.helm_install("tandem-crds", "tandem-crds", json!({}))
            .await?;
        say(&format!(
            "helm install tandem-operator charts/tandem-operator -n {} (watchNamespace {0})",
            self.ns
        ));
        let image = values::image(&crate::testkit::tandem_image());
        self.helm_install(
            "tandem-operator",
            "tandem-operator",
            values::operator(&image, &self.ns),
        )
        .await
    }

    /// `helm install tandem-cluster` with the story's values.
    async fn install_cluster(&mut self) -> Result<(), StoryError> {
        say(&format!(
            "helm install tandem-cluster charts/tandem-cluster -n {}: TandemCluster {CLUSTER} \
             (accounts {RESEARCH} 60, {SERVING} 40; namespace {} -> {SERVING}), WorkerSet \
             {WORKER_SET} x{START_WORKERS} of {} with an HPA up to {2}, LoginSet {LOGIN_SET}",
            self.ns, self.serving, POOL.nodes
        ));
        let v = values::cluster(POOL, START_WORKERS, &self.serving, &crate_user());
        let rendered = self
            .helm_install("tandem-cluster", "tandem-cluster", v)
            .await?;
        show(&rendered.notes);
        Ok(())
    }

    /// `helm install tandem-bridge` for the cluster `CLUSTER`.
    async fn install_bridge(&mut self) -> Result<helm::Rendered, StoryError> {
        say(&format!(
            "helm install tandem-bridge charts/tandem-bridge -n {} (cluster.name {CLUSTER})",
            self.ns
        ));
        let image = values::image(&crate::testkit::tandem_image());
        self.helm_install("tandem-bridge", "tandem-bridge", values::bridge(&image))
            .await
    }

    /// The four installs alone, no process started (a real cluster).
    async fn install_charts(&mut self) -> Result<(), StoryError> {
        self.namespaces().await?;
        self.install_crds_and_operator().await?;
        self.install_cluster().await?;
        self.install_bridge().await?;
        Ok(())
    }

    /// Fails unless every object the releases made exists.
    async fn check_installed(&self) -> Result<(), StoryError> {
        let mut missing = Vec::new();
        let mut n = 0;
        for m in self.releases.iter().flat_map(|r| &r.made) {
            n += 1;
            if m.api(&self.client)
                .get_opt(&m.name)
                .await
                .map_err(kube_err("read a release's object"))?
                .is_none()
            {
                missing.push(m.describe());
            }
        }
        if !missing.is_empty() {
            return Err(failed("helm install", format!("missing: {missing:?}")));
        }
        say(&format!(
            "helm status: all {n} objects of {} releases exist",
            self.releases.len()
        ));
        Ok(())
    }
    fn api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &ApiResource {
                group: "tandem.dev".into(),
                version: "v1alpha1".into(),
                api_version: "tandem.dev/v1alpha1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
        )
    }

    async fn wait_ready(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
        n: usize,
    ) -> Result<(), StoryError> {
        let api = self.api(kind, plural);
        let what = format!("{kind} {name} to have {n} ready pods");
        self.poll(&what, || async {
            let o = api.get(name).await.map_err(kube_err(&what))?;
            let ready = o.data["status"]["readyReplicas"].as_u64().unwrap_or(0);
            Ok((ready == n as u64)
                .then_some(())
                .ok_or(format!("{ready} ready")))
        })
        .await
    }

    /// Polls `f` every half second until it returns `Ok(Ok(v))`; `Ok(Err(last))` is "not
    /// yet" with what it saw, for the failure message.
    async fn poll<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, StoryError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, String>, StoryError>>,
    {
        let began = Instant::now();
        loop {
            let last = match f().await? {
                Ok(v) => return Ok(v),
                Err(last) => last,
            };
            if began.elapsed() > LONG {
                return Err(failed(
                    format!("waiting for {what}"),
                    format!("timed out after {LONG:?}; last: {last}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The bridge, as its chart runs it: the controller endpoint from the cluster's
    /// status, the cluster key and CA from the Secrets the operator made.
    async fn start_bridge(&mut self) -> Result<(), StoryError> {
        let tc = self.api("TandemCluster", "tandemclusters");
        let endpoint = self
            .poll("the TandemCluster's controllerEndpoint", || async {
                let o = tc
                    .get(CLUSTER)
                    .await
                    .map_err(kube_err("read TandemCluster"))?;
                Ok(o.data["status"]["controllerEndpoint"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| "no endpoint yet".to_owned()))
            })
            .await?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        let key = secret_file(&secrets, &format!("{CLUSTER}-key"), "cluster.key").await?;
        let ca = secret_file(&secrets, &format!("{CLUSTER}-ca"), "ca.crt").await?;
        let key_file = self.dir.path().join("cluster.key");
        let ca_file = self.dir.path().join("ca.crt");
        write_private(&key_file, &key)?;
        write_private(&ca_file, &ca)?;
        let rendered = self.install_bridge().await?;
        // As for the operator: the chart's command line, run here. The Secrets' files are
        // written where the mounts would put them, and the controller's Service name
        // becomes the endpoint the cluster's status gives (no cluster DNS here).
        let (k, c) = (
            key_file.to_string_lossy().into_owned(),
            ca_file.to_string_lossy().into_owned(),
        );
        let mut argv = deployment_argv(&rendered, "tandem-bridge")?;
        for a in argv.iter_mut() {
            *a = a
                .replace("/etc/tandem/key/cluster.key", &k)
                .replace("/etc/tandem/ca/ca.crt", &c);
        }
        if let Some(i) = argv.iter().position(|a| a == "--controller")
            && let Some(v) = argv.get_mut(i + 1)
        {
            v.clone_from(&endpoint);
        }
        println!("running the chart's container here: {}", argv.join(" "));
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        let kubeconfig = self.kubeconfig();
        let bins = self.bins.ok_or_else(|| failed("install", "no binaries"))?;
        self.bridge = Some(
            Proc::spawn(
                &bins.bridge,
                &args,
                &[("KUBECONFIG", &kubeconfig)],
                self.dir.path().join("bridge.log"),
            )
            .map_err(io_err("starting tandem-bridge"))?,
        );
        Ok(())
    }

    /// `helm install`: renders `chart` as `release` in the story's namespace and creates
    /// every object (then the post-install hooks), remembering them for uninstall.
    async fn helm_install(
        &mut self,
        chart: &str,
        release: &str,
        values: serde_json::Value,
    ) -> Result<helm::Rendered, StoryError> {
        let python = self
            .python
            .clone()
            .ok_or_else(|| failed("helm", "no venv"))?;
        let rendered = helm::render(&python, chart, release, &self.ns, &values)
            .map_err(|e| failed(format!("helm install {release}"), format!("{e:#}")))?;
        let step = format!("helm install {release}");
        self.releases.push(Release {
            name: release.to_owned(),
            made: Vec::new(),
        });
        let mut crds = Vec::new();
        for obj in rendered.objects.iter().chain(&rendered.hooks) {
            let is_crd = obj
                .types
                .as_ref()
                .is_some_and(|t| t.kind == "CustomResourceDefinition");
            let made = match helm::create(&self.client, &self.ns, obj).await {
                Ok(made) => made,
                // Helm installs crds/ only when they are missing (a real cluster may have
                // them from an earlier install).
                Err(kube::Error::Api(e)) if is_crd && e.code == 409 => {
                    println!(
                        "CustomResourceDefinition/{} exists already",
                        obj.metadata.name.as_deref().unwrap_or_default()
                    );
                    crds.push(obj);
                    continue;
                }
                Err(e) => return Err(kube_err(&step)(e)),
            };
            println!("{} created", made.describe());
            if is_crd {
                // CRDs in a chart's crds/ folder stay after `helm uninstall` (Helm's rule).
                crds.push(obj);
            } else if let Some(r) = self.releases.last_mut() {
                r.made.push(made);
            }
        }
        for crd in crds {
            self.wait_served(crd).await?;
        }
        Ok(rendered)
    }

    /// Waits until discovery serves the kind `crd` defines (a real API server takes a
    /// moment to establish a new CRD).
    async fn wait_served(&self, crd: &DynamicObject) -> Result<(), StoryError> {
        let spec = &crd.data["spec"];
        let version = spec["versions"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["served"] == true))
            .and_then(|v| v["name"].as_str())
            .unwrap_or_default();
        let gvk = kube::api::GroupVersionKind::gvk(
            spec["group"].as_str().unwrap_or_default(),
            version,
            spec["names"]["kind"].as_str().unwrap_or_default(),
        );
        let what = format!("{}/{} to be served", gvk.group, gvk.kind);
        self.poll(&what, || async {
            Ok(kube::discovery::pinned_kind(&self.client, &gvk)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()))
        })
        .await
    }

    // === 3. serving ===

    async fn serve(&mut self) -> Result<Vec<String>, StoryError> {
        say(&format!(
            "the serving team: kubectl -n {} apply -f inference.yaml (2 x 1 GPU, schedulerName: tandem)",
            self.serving
        ));
        let objs = objects_from_yaml(&manifests::inference(2))
            .map_err(kit_err("the inference Deployment"))?;
        create_all(&self.client, &self.serving, &objs)
            .await
            .map_err(kit_err("creating the inference Deployment"))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.serving);
        let nodes = self
            .poll("2 inference pods Running on pool nodes", || async {
                self.alive()?;
                let list = pods
                    .list(&ListParams::default().labels("app=infer"))
                    .await
                    .map_err(kube_err("list inference pods"))?
                    .items;
                let running: Vec<String> = list
                    .iter()
                    .filter(|p| crate::testkit::phase(p) == "Running")
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .collect();
                Ok((running.len() == 2)
                    .then(|| running.clone())
                    .ok_or(format!("running on {running:?} of {} pods", list.len())))
            })
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.serving));
        show(&self.pods_table(&self.serving).await?);
        say("sinfo -N -o '%N %t %k' (the serving nodes are in kube mode)");
        let sinfo = self
            .poll_login(&["sinfo", "-N", "-h", "-o", "%N %t %k"], "kube mode", |o| {
                nodes.iter().all(|n| mode(o, n) == Some("kube"))
            })
            .await?;
        show(&sinfo);
        let mut distinct = nodes.clone();
        distinct.sort();
        distinct.dedup();
        Ok(distinct)
    }

    // === 4. research ===

    async fn research(&mut self) -> Result<(Vec<String>, usize, (i64, i64)), StoryError> {
        let examples = examples_dir();
        let work = self.dir.path().join("work");
        std::fs::create_dir_all(&work).map_err(io_err("the jobs' directory"))?;
        let w = work.to_string_lossy().into_owned();
        let allreduce = examples.join("multinode-allreduce.sbatch");
        let sweep = examples.join("sweep-array.sbatch");
        say(
            "a researcher, in the login pod: sbatch multinode-allreduce.sbatch; sbatch sweep-array.sbatch",
        );
        let a = self
            .sbatch(&["-A", RESEARCH, "--chdir", &w, &allreduce.to_string_lossy()])
            .await?;
        let b = self
            .sbatch(&["-A", RESEARCH, "--chdir", &w, &sweep.to_string_lossy()])
            .await?;
        println!("Submitted batch job {a}\nSubmitted batch job {b}");
        let scaled = self.autoscale(&b).await?;

        // Show the queue and the nodes as they change, until both jobs are done.
        let began = Instant::now();
        let mut last = String::new();
        let ids = format!("{a},{b}");
        loop {
            self.alive()?;
            let q = self
                .login(&["squeue", "-o", "%.10i %.20j %.9P %.8u %.2t %.6D %R"])
                .await?;
            let i = self.login(&["sinfo", "-N", "-o", "%N %t %k"]).await?;
            let snap = format!("{q}{i}");
            if snap != last {
                say(&format!(
                    "squeue; sinfo -N -o '%N %t %k'   (t+{}s)",
                    began.elapsed().as_secs()
                ));
                show(&snap);
                last = snap;
            }
            let active = self
                .login(&["squeue", "-h", "-j", &ids, "-o", "%i"])
                .await?;
            if active.trim().is_empty() {
                break;
            }
            if began.elapsed() > LONG {
                return Err(failed(
                    "the research jobs",
                    format!("still queued after {LONG:?}:\n{active}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        say(&format!(
            "sacct -j {ids} -X -o JobID,JobName,Account,State,NNodes,NodeList"
        ));
        let sacct = self
            .login(&[
                "sacct",
                "-j",
                &ids,
                "-X",
                "-o",
                "JobID,JobName%12,Account,State,NNodes,NodeList%16",
            ])
            .await?;
        show(&sacct);
        // The all-reduce job's own words first: they say why, if it failed.
        let out = work.join(format!("allreduce-{a}.out"));
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        say(&format!("cat allreduce-{a}.out"));
        show(&text);
        let states = self
            .login(&["sacct", "-j", &ids, "-X", "-n", "-P", "-o", "JobID,State"])
            .await?;
        let not_done: Vec<&str> = states
            .lines()
            .filter(|l| !l.ends_with("|COMPLETED"))
            .collect();
        if !not_done.is_empty() || states.lines().count() < 9 {
            return Err(failed(
                "the research jobs",
                format!("not all COMPLETED:\n{states}"),
            ));
        }
        let array_tasks = states
            .lines()
            .filter(|l| l.starts_with(&format!("{b}_")))
            .count();
        if !text.contains("all-reduce over 2 nodes: ok") {
            return Err(failed("the all-reduce job", text));
        }
        let mut nodes: Vec<String> = text
            .lines()
            .filter(|l| l.ends_with("ok") && l.starts_with("rank "))
            .filter_map(|l| l.split_whitespace().nth(3))
            .map(|n| n.trim_end_matches(':').to_owned())
            .collect();
        nodes.sort();
        nodes.dedup();
        if nodes.len() != 2 {
            return Err(failed(
                "the all-reduce job",
                format!("ranks not on two nodes:\n{text}"),
            ));
        }
        Ok((nodes, array_tasks, scaled))
    }

    async fn sbatch(&self, args: &[&str]) -> Result<String, StoryError> {
        let mut argv = vec!["sbatch", "--parsable"];
        argv.extend_from_slice(args);
        let id = self.login(&argv).await?.trim().to_owned();
        if id.parse::<u64>().is_err() {
            return Err(failed("sbatch", format!("printed {id:?}, not a job id")));
        }
        Ok(id)
    }

    // === 4b. the worker set scales on pending demand ===

    /// The story as the HPA controller (and prometheus-adapter) for the HPA the chart made:
    /// once the array `array` waits, the HPA's External metric, read from the controller's
    /// `/metrics`, sets the worker set's replicas through its scale subresource; then the
    /// new workers come up. The replicas before and after.
    async fn autoscale(&self, array: &str) -> Result<(i64, i64), StoryError> {
        let hpas: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("autoscaling", "v2", "HorizontalPodAutoscaler"),
                "horizontalpodautoscalers",
            ),
        );
        let obj = hpas
            .get(WORKER_SET)
            .await
            .map_err(kube_err("read the HorizontalPodAutoscaler"))?;
        let hpa = autoscale::Hpa::from_object(&obj).map_err(|e| failed("the HPA", e))?;
        if hpa.target_kind != "WorkerSet" {
            return Err(failed(
                "the HPA",
                format!("scales a {}, not a WorkerSet", hpa.target_kind),
            ));
        }
        say(&format!(
            "the worker set scales on pending demand: the story plays the HPA {WORKER_SET} (and \
             prometheus-adapter): {} from the controller's /metrics, target averageValue {}, \
             WorkerSet {} within [{}, {}]",
            hpa.series(),
            hpa.average_value,
            hpa.target_name,
            hpa.min,
            hpa.max
        ));
        let addr = self.metrics_addr().await?;
        let sets = self.api("WorkerSet", "workersets");
        let queue = [
            "squeue",
            "-t",
            "PD",
            "-o",
            "%.10i %.20j %.9P %.8u %.2t %.6D %R",
        ];
        let (pending, value, current, desired) = self
            .poll(
                "the array to wait and the HPA to want more workers",
                || async {
                    self.alive()?;
                    let pending = self.login(&queue).await?;
                    let waits = pending.lines().any(|l| {
                        l.split_whitespace()
                            .next()
                            .is_some_and(|id| id == array || id.starts_with(&format!("{array}_")))
                    });
                    let text = match autoscale::scrape(addr).await {
                        Ok(t) => t,
                        Err(e) => return Ok(Err(e)),
                    };
                    let Some(value) = autoscale::sample(&text, &hpa.metric, &hpa.labels) else {
                        return Ok(Err(format!("no {} in /metrics", hpa.series())));
                    };
                    let current = i64::from(
                        sets.get_scale(&hpa.target_name)
                            .await
                            .map_err(kube_err("read the WorkerSet's scale"))?
                            .spec
                            .and_then(|s| s.replicas)
                            .unwrap_or(0),
                    );
                    let desired = hpa.desired(value, current);
                    Ok(if waits && desired > current {
                        Ok((pending, value, current, desired))
                    } else {
                        Err(format!(
                            "{} = {value}: {current} -> {desired} replicas; pending:\n{pending}",
                            hpa.series()
                        ))
                    })
                },
            )
            .await?;
        say(&format!("squeue -t PD (the array {array} waits)"));
        show(&pending);
        println!(
            "{} = {value}; the HPA: ceil({value} / {}) within [{}, {}] = {desired} replicas (now {current})",
            hpa.series(),
            hpa.average_value,
            hpa.min,
            hpa.max
        );
        say(&format!(
            "kubectl -n {} scale workerset {} --replicas={desired}   (the scale subresource, as the HPA does)",
            self.ns, hpa.target_name
        ));
        sets.patch_scale(
            &hpa.target_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": desired}})),
        )
        .await
        .map_err(kube_err("scale the WorkerSet"))?;
        let n = usize::try_from(desired).map_err(|_| failed("the HPA", "negative replicas"))?;
        self.wait_ready("WorkerSet", "workersets", &hpa.target_name, n)
            .await?;
        say(&format!("kubectl -n {} get pods -o wide", self.ns));
        show(&self.pods_table(&self.ns).await?);
        Ok((current, desired))
    }

    /// The controller Service's `metrics` port at its cluster IP (reached from here as a
    /// pod would, through the harness's service proxy).
    async fn metrics_addr(&self) -> Result<std::net::SocketAddr, StoryError> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), &self.ns);
        let name = format!("{CLUSTER}-controller");
        let svc = services
            .get(&name)
            .await
            .map_err(kube_err("read the controller Service"))?;
        let spec = svc.spec.unwrap_or_default();
        let ip = spec
            .cluster_ip
            .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
            .ok_or_else(|| failed(format!("Service {name}"), "no cluster IP"))?;
        let port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .and_then(|p| u16::try_from(p.port).ok())
            .ok_or_else(|| failed(format!("Service {name}"), "no port named metrics"))?;
        Ok(std::net::SocketAddr::new(ip, port))
    }

    // === 5. the pool flips ===

    async fn flip(&mut self, kube_nodes: &[String]) -> Result<Vec<String>, StoryError> {
        say(&format!(
            "the serving team scales to zero: kubectl -n {} scale deployment infer --replicas=0",
            self.serving
        ));
        let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.serving);
        deploys
            .patch(
                "infer",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await
            .map_err(kube_err("scale the Deployment"))?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.serving);
        self.poll("the inference pods to go", || async {
            let n = pods
                .list(&ListParams::default().labels("app=infer"))
                .await
                .map_err(kube_err("list inference pods"))?
                .items
                .len();
            Ok((n == 0).then_some(()).ok_or(format!("{n} pods")))
        })
        .await?;
        say(&format!(
            "sbatch -N {} --wrap hostname: a job on every node; the kube nodes turn batch",
            POOL.nodes
        ));
        let n = POOL.nodes.to_string();
        let id = self
            .sbatch(&[
                "-A",
                RESEARCH,
                "-N",
                &n,
                "-o",
                "/dev/null",
                "--wrap",
                "hostname",
            ])
            .await?;
        self.poll_login(
            &["sacct", "-j", &id, "-X", "-n", "-o", "State"],
            "COMPLETED",
            |o| o.trim() == "COMPLETED",
        )
        .await?;
        let sinfo = self
            .poll_login(
                &["sinfo", "-N", "-h", "-o", "%N %t %k"],
                "batch mode",
                |o| kube_nodes.iter().all(|n| mode(o, n) == Some("batch")),
            )
            .await?;
        say("sinfo -N -o '%N %t %k'");
        show(&sinfo);
        Ok(kube_nodes.to_vec())
    }

    // === 6. sshare ===

    async fn sshare(&self) -> Result<BTreeMap<String, u64>, StoryError> {
        // Bridged pods charge their account when their placeholder job ends; wait until
        // both teams' usage shows.
        let parsed = self
            .poll_login(
                &["tandem", "sshare", "-a", "-P", "-n"],
                "both teams' usage",
                |o| {
                    let u = usage(o);
                    u.get(RESEARCH).is_some_and(|v| *v > 0)
                        && u.get(SERVING).is_some_and(|v| *v > 0)
                },
            )
            .await?;
        say("sshare -a");
        show(&self.login(&["tandem", "sshare", "-a"]).await?);
        Ok(usage(&parsed))
    }

    // === helpers ===

    /// Runs `argv` in the login pod, as `kubectl exec pool-login-0 -- argv`.
    async fn login(&self, argv: &[&str]) -> Result<String, StoryError> {
        let pod = format!("{LOGIN_SET}-0");
        let out = self
            .cluster
            .exec(&self.ns, &pod, None, argv)
            .await
            .map_err(|e| {
                failed(
                    format!("kubectl exec {pod} -- {}", argv.join(" ")),
                    format!("{e:#}"),
                )
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(failed(
                format!("kubectl exec {pod} -- {}", argv.join(" ")),
                format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
            ));
        }
        Ok(stdout)
    }

    /// `login(argv)` every half second until `done(output)`; the output.
    async fn poll_login(
        &self,
        argv: &[&str],
        what: &str,
        done: impl Fn(&str) -> bool,
    ) -> Result<String, StoryError> {
        self.poll(&format!("{} to show {what}", argv.join(" ")), || async {
            let o = self.login(argv).await?;
            Ok(if done(&o) { Ok(o) } else { Err(o) })
        })
        .await
    }

    /// Fails if the operator or the bridge exited.
    fn alive(&self) -> Result<(), StoryError> {
        // Checked through /proc, so a shared borrow of the story will do.
        for (name, p) in [
            ("tandem-operator", &self.operator),
            ("tandem-bridge", &self.bridge),
        ] {
            if let Some(p) = p
                && !pid_alive(p)
            {
                return Err(failed(name, format!("exited:\n{}", p.tail(30))));
            }
        }
        Ok(())
    }

    async fn pods_table(&self, ns: &str) -> Result<String, StoryError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(kube_err("list pods"))?
            .items;
        Ok(table::pods_wide(
            &list,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
        ))
    }

    /// On failure: every pod's state and the components' logs.
    async fn dump(&mut self) {
        for ns in [self.ns.clone(), self.serving.clone()] {
            if ns.is_empty() {
                continue;
            }
            if let Ok(t) = self.pods_table(&ns).await {
                eprintln!("--- pods in {ns}\n{t}");
            }
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            for p in pods
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let name = p.metadata.name.clone().unwrap_or_default();
                let log = pods
                    .logs(
                        &name,
                        &kube::api::LogParams {
                            tail_lines: Some(20),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap_or_else(|e| format!("<no log: {e}>"));
                eprintln!("--- log of {ns}/{name}\n{log}");
            }
        }
        for p in [&self.operator, &self.bridge].into_iter().flatten() {
            eprintln!("--- {}\n{}", p.log.display(), p.tail(30));
        }
    }

    /// The end: the serving team deletes its Deployment, then `helm uninstall
    /// tandem-cluster` (the operator, still running, drains and removes its pods), then the
    /// operator and the bridge stop and `helm uninstall tandem-bridge tandem-operator
    /// tandem-crds`. `check`: fail unless nothing is left, no pod either.
    async fn cleanup(&mut self, check: bool) -> Result<(), StoryError> {
        if self.ns.is_empty() {
            return Ok(());
        }
        say(&format!(
            "the serving team: kubectl -n {} delete deployment infer",
            self.serving
        ));
        let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.serving);
        let _ = deploys.delete("infer", &DeleteParams::default()).await;
        let cluster = self.uninstall(&["tandem-cluster"], check).await;
        let pods = if check && cluster.is_ok() {
            let (ns, serving) = (self.ns.clone(), self.serving.clone());
            self.poll("every pod to go", || async {
                let mut left = Vec::new();
                for n in [&ns, &serving] {
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), n);
                    left.extend(
                        pods.list(&ListParams::default())
                            .await
                            .map_err(kube_err("list pods"))?
                            .items
                            .into_iter()
                            .filter_map(|p| p.metadata.name),
                    );
                }
                Ok(left
                    .is_empty()
                    .then_some(())
                    .ok_or(format!("left: {left:?}")))
            })
            .await
            .map(|()| println!("no pod left in {ns} or {serving}"))
        } else {
            Ok(())
        };
        self.bridge = None;
        self.operator = None;
        let rest = self
            .uninstall(&["tandem-bridge", "tandem-operator", "tandem-crds"], check)
            .await;
        cluster?;
        pods?;
        rest
    }

    /// `helm uninstall` of the releases `names` (those installed), in that order: each
    /// release's objects deleted last first. `check`: fail unless none of them is left.
    async fn uninstall(&mut self, names: &[&str], check: bool) -> Result<(), StoryError> {
        let releases: Vec<&Release> = names
            .iter()
            .filter_map(|n| self.releases.iter().find(|r| r.name == *n))
            .collect();
        if releases.is_empty() {
            return Ok(());
        }
        let listed: Vec<&str> = releases.iter().map(|r| r.name.as_str()).collect();
        let listed = listed.join(" ");
        say(&format!(
            "helm uninstall {listed}: every object each made, last first"
        ));
        let mut failures = Vec::new();
        for r in &releases {
            failures.extend(helm::delete_all(&self.client, &r.made).await);
        }
        if !check {
            return Ok(());
        }
        if !failures.is_empty() {
            return Err(failed("helm uninstall", failures.join("; ")));
        }
        let made: Vec<helm::Made> = releases.iter().flat_map(|r| r.made.clone()).collect();
        self.poll(&format!("every object {listed} made to go"), || async {
            let mut left = Vec::new();
            for m in &made {
                if m.api(&self.client)
                    .get_opt(&m.name)
                    .await
                    .map_err(kube_err("read a release's object"))?
                    .is_some()
                {
                    left.push(m.describe());
                }
            }
            Ok(left
                .is_empty()
                .then_some(())
                .ok_or(format!("left: {left:?}")))
        })
        .await?;
        let crds = if listed.contains("tandem-crds") {
            " (the CRDs stay, as Helm keeps crds/)"
        } else {
            ""
        };
        println!(
            "nothing {listed} made is left ({} objects){crds}",
            made.len()
        );
        Ok(())
    }

    /// Deletes the story's namespaces (a real cluster keeps them otherwise).
    async fn delete_namespaces(&self) -> Result<(), StoryError> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        for ns in [&self.ns, &self.serving] {
            if ns.is_empty() {
                continue;
            }
            match api.delete(ns, &DeleteParams::default()).await {
                Ok(_) => println!("namespace {ns} deleted"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(kube_err("delete a namespace")(e)),
            }
        }
        Ok(())
    }
}

/// The command line of the Deployment `name` in a rendered chart.
fn deployment_argv(rendered: &helm::Rendered, name: &str) -> Result<Vec<String>, StoryError> {
    rendered
        .objects
        .iter()
        .find(|o| {
            o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                && o.metadata.name.as_deref() == Some(name)
        })
        .map(|d| helm::argv(&helm::first_container(d).0))
        .filter(|a| !a.is_empty())
        .ok_or_else(|| failed("helm install", format!("no Deployment {name} rendered")))
}

/// Whether the process behind `p` still runs (a zombie counts as gone).
fn pid_alive(p: &Proc) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.id())).unwrap_or_default();
    // The state is the field after the parenthesised command name.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// The user the login pod's commands run as (exec keeps the harness's uid).
fn crate_user() -> String {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// `examples/batch` of this source tree.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/batch")
}

async fn secret_file(secrets: &Api<Secret>, name: &str, key: &str) -> Result<Vec<u8>, StoryError> {
    let s = secrets
        .get(name)
        .await
        .map_err(kube_err(&format!("read Secret {name}")))?;
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| v.clone().into_bytes())
        })
        .ok_or_else(|| failed(format!("Secret {name}"), format!("has no {key}")))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoryError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("writing a key file"))?;
    f.write_all(bytes).map_err(io_err("writing a key file"))
}

/// A node's mode in `sinfo -N -h -o '%N %t %k'` output.
fn mode<'s>(sinfo: &'s str, node: &str) -> Option<&'s str> {
    sinfo.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&node))
            .then(|| w.get(2).copied())
            .flatten()
    })
}

/// RawUsage per account from `sshare -a -P -n` (account rows have no user).
fn usage(sshare: &str) -> BTreeMap<String, u64> {
    sshare
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            let account = f.first()?.trim();
            let user = f.get(1)?.trim();
            let raw = f.get(4)?.trim().parse().ok()?;
            (user.is_empty() && !account.is_empty()).then(|| (account.to_owned(), raw))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_read_per_node_from_sinfo() {
        let s = "gpu-0 mix kube\ngpu-1 idle batch\n";
        assert_eq!(mode(s, "gpu-0"), Some("kube"));
        assert_eq!(mode(s, "gpu-1"), Some("batch"));
        assert_eq!(mode(s, "gpu-2"), None);
    }

    #[test]
    fn usage_takes_account_rows_only() {
        let s = "root||1|1.000000|90|1.000000|0.5\n research||60|0.6|80|0.8|0.4\n  research|root|1|1.0|80|1.0|0.4\n serving||40|0.4|10|0.1|0.9\n";
        let u = usage(s);
        assert_eq!(u.get("research"), Some(&80));
        assert_eq!(u.get("serving"), Some(&10));
        assert_eq!(u.get("root"), Some(&90));
        assert_eq!(u.len(), 3);
    }
}
