//! The whole story on the harness, printed as it goes: a platform team installs Tandem, a
//! researcher submits batch work from a login pod, a serving team deploys inference through
//! the bridge, and both share one pool of GPU nodes under one fair-share tree.
//!
//! Shared by the `tandem-demo` binary (the README's one command) and `tests/story.rs`.
//!
//! # Steps
//! 1. Nodes: `sys-0` for the controller and login pods, `gpu-0..` the GPU pool.
//! 2. Install: `tandem-crds`, `tandem-operator` and `tandem-bridge` rendered by real Helm
//!    ([`helm`]) and every object created on the harness; the `tandem-cluster` objects from
//!    [`manifests`]. The harness serves plain HTTP and mounts no service-account token, so
//!    the operator and bridge Deployments are installed at 0 replicas and their containers'
//!    command lines (from the rendered charts) run here as processes with a kubeconfig.
//! 3. Serving: an inference Deployment with `schedulerName: tandem`; the bridge binds its
//!    pods to pool nodes that turn to `kube` mode.
//! 4. Research: from the login pod (`kubectl exec` equivalent), the 2-node all-reduce
//!    example and the sweep array; `squeue`, `sinfo` with modes while they run.
//! 5. The pool flips: the Deployment scales to zero and a 4-node job takes every node,
//!    so the `kube` nodes turn `batch`.
//! 6. `sshare`: both teams' usage moved. Cleanup: the objects deleted, nothing left; then
//!    `helm uninstall`: every object the releases made deleted last first, none left.
//!
//! Every wait has a deadline and fails with the last thing it saw and the components' logs.

pub mod helm;
pub mod manifests;
pub mod procs;
pub mod table;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::kubelet::NodeSpec;
use crate::testkit::{TestCluster, TestkitError, create_all, objects_from_yaml};
use manifests::{CLUSTER, Pool, RESEARCH, SERVING};
pub use procs::Bins;
use procs::Proc;

/// How long any one condition may take (real processes on a loaded 2-core machine).
const LONG: Duration = Duration::from_secs(90);

/// The pool: four nodes of two GPUs.
const POOL: Pool = Pool {
    nodes: 4,
    cpus: 8,
    mem_gib: 16,
    gpus: 2,
};

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
    /// Nodes seen in `kube` mode, then `batch` again once the 4-node job ran.
    pub flipped: Vec<String>,
    /// RawUsage per account from `sshare` at the end.
    pub usage: BTreeMap<String, u64>,
    pub elapsed: Duration,
}

/// Runs the story on `cluster` (the harness, with the process kubelet) with `bins`.
pub async fn run(cluster: &TestCluster, bins: &Bins) -> Result<Outcome, StoryError> {
    let began = Instant::now();
    let mut s = Story::new(cluster, bins)?;
    let result = s.play(began).await;
    if result.is_err() {
        s.dump().await;
    }
    s.cleanup(result.is_ok()).await?;
    result
}

struct Story<'a> {
    cluster: &'a TestCluster,
    client: kube::Client,
    bins: &'a Bins,
    /// Logs, kubeconfig, key files and the jobs' working directory.
    dir: tempfile::TempDir,
    /// The namespace Tandem is installed in, and the serving team's.
    ns: String,
    serving: String,
    operator: Option<Proc>,
    bridge: Option<Proc>,
    /// The chart venv's python, once made.
    python: Option<PathBuf>,
    /// What the Helm releases made, in creation order (uninstall deletes it in reverse).
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
    fn new(cluster: &'a TestCluster, bins: &'a Bins) -> Result<Self, StoryError> {
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
            made: Vec::new(),
        })
    }

    async fn play(&mut self, began: Instant) -> Result<Outcome, StoryError> {
        self.nodes().await?;
        self.install().await?;
        let inference_nodes = self.serve().await?;
        let (allreduce_nodes, array_tasks) = self.research().await?;
        let flipped = self.flip(&inference_nodes).await?;
        let usage = self.sshare().await?;
        Ok(Outcome {
            inference_nodes,
            allreduce_nodes,
            array_tasks,
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

        self.python = Some(helm::python().map_err(|e| failed("helm", format!("{e:#}")))?);
        say("helm install tandem-crds charts/tandem-crds");
        self.helm_install("tandem-crds", "tandem-crds", json!({}))
            .await?;
        say(&format!(
            "helm install tandem-operator charts/tandem-operator -n {} (watchNamespace {0})",
            self.ns
        ));
        let rendered = self
            .helm_install(
                "tandem-operator",
                "tandem-operator",
                json!({"image": image_values(), "replicas": 0, "watchNamespace": self.ns}),
            )
            .await?;
        // The harness serves plain HTTP and mounts no service-account token, so an
        // in-cluster client cannot reach it: the Deployment is installed at 0 replicas and
        // its container runs here as a process, with the chart's own command line.
        let argv = deployment_argv(&rendered, "tandem-operator")?;
        println!("running the chart's container here: {}", argv.join(" "));
        let kubeconfig = self.kubeconfig();
        let args: Vec<&str> = argv.iter().skip(1).map(String::as_str).collect();
        self.operator = Some(
            Proc::spawn(
                &self.bins.operator,
                &args,
                &[("KUBECONFIG", &kubeconfig)],
                self.dir.path().join("operator.log"),
            )
            .map_err(io_err("starting tandem-operator"))?,
        );

        say(&format!(
            "install tandem-cluster: TandemCluster {CLUSTER} (accounts {RESEARCH} 60, {SERVING} 40; \
             namespace {} -> {SERVING}), WorkerSet gpu x{}, LoginSet login",
            self.serving, POOL.nodes
        ));
        let researcher = crate_user();
        let objs = objects_from_yaml(&manifests::tandem_cluster(POOL, &self.serving, &researcher))
            .map_err(kit_err("the tandem-cluster objects"))?;
        create_all(&self.client, &self.ns, &objs)
            .await
            .map_err(kit_err("creating the tandem-cluster objects"))?;
        self.wait_ready("WorkerSet", "workersets", "gpu", POOL.nodes)
            .await?;
        self.wait_ready("LoginSet", "loginsets", "login", 1).await?;
        say(&format!("kubectl -n {} get pods -o wide", self.ns));
        show(&self.pods_table(&self.ns).await?);

        self.start_bridge().await?;
        say("kubectl exec login-0 -- sinfo -N -o '%N %P %t %k'");
        show(&self.login(&["sinfo", "-N", "-o", "%N %P %t %k"]).await?);
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
        say(&format!(
            "helm install tandem-bridge charts/tandem-bridge -n {} (cluster.name {CLUSTER})",
            self.ns
        ));
        let rendered = self
            .helm_install(
                "tandem-bridge",
                "tandem-bridge",
                json!({"image": image_values(), "replicas": 0, "cluster": {"name": CLUSTER},
                       "webhook": {"enabled": false}, "leaderElection": {"enabled": false}}),
            )
            .await?;
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
        self.bridge = Some(
            Proc::spawn(
                &self.bins.bridge,
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
        for obj in rendered.objects.iter().chain(&rendered.hooks) {
            let made = helm::create(&self.client, &self.ns, obj)
                .await
                .map_err(kube_err(&step))?;
            println!("{} created", made.describe());
            // CRDs in a chart's crds/ folder stay after `helm uninstall` (Helm's rule).
            if made.resource.kind != "CustomResourceDefinition" {
                self.made.push(made);
            }
        }
        Ok(rendered)
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

    async fn research(&mut self) -> Result<(Vec<String>, usize), StoryError> {
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
        Ok((nodes, array_tasks))
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

    /// Runs `argv` in the login pod, as `kubectl exec login-0 -- argv`.
    async fn login(&self, argv: &[&str]) -> Result<String, StoryError> {
        let out = self
            .cluster
            .exec(&self.ns, "login-0", None, argv)
            .await
            .map_err(|e| {
                failed(
                    format!("kubectl exec login-0 -- {}", argv.join(" ")),
                    format!("{e:#}"),
                )
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(failed(
                format!("kubectl exec login-0 -- {}", argv.join(" ")),
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

    /// `helm uninstall`, in reverse: the Deployment, the cluster's objects (the operator
    /// drains and removes its pods), then the operator and the bridge. `check`: fail unless
    /// nothing is left in the namespaces.
    async fn cleanup(&mut self, check: bool) -> Result<(), StoryError> {
        if self.ns.is_empty() {
            return Ok(());
        }
        say(
            "cleanup: kubectl delete the Deployment, the LoginSet, the WorkerSet and the TandemCluster",
        );
        let dp = DeleteParams::default();
        let deploys: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.serving);
        let _ = deploys.delete("infer", &dp).await;
        for (kind, plural, name) in [
            ("LoginSet", "loginsets", "login"),
            ("WorkerSet", "workersets", "gpu"),
            ("TandemCluster", "tandemclusters", CLUSTER),
        ] {
            let _ = self.api(kind, plural).delete(name, &dp).await;
        }
        let result = if check {
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
                let tcs = self.api("TandemCluster", "tandemclusters");
                if tcs
                    .get_opt(CLUSTER)
                    .await
                    .map_err(kube_err("read TandemCluster"))?
                    .is_some()
                {
                    left.push(format!("TandemCluster {CLUSTER}"));
                }
                Ok(left
                    .is_empty()
                    .then_some(())
                    .ok_or(format!("left: {left:?}")))
            })
            .await
            .map(|()| println!("nothing left in {ns} or {serving}"))
        } else {
            Ok(())
        };
        self.bridge = None;
        self.operator = None;
        result?;
        say(
            "helm uninstall tandem-bridge tandem-operator tandem-crds: every object they made, last first",
        );
        let failures = helm::delete_all(&self.client, &self.made).await;
        if check {
            if !failures.is_empty() {
                return Err(failed("helm uninstall", failures.join("; ")));
            }
            let made = self.made.clone();
            self.poll("every object the releases made to go", || async {
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
            println!(
                "nothing the releases made is left ({} objects; the CRDs stay, as Helm keeps crds/)",
                made.len()
            );
        }
        Ok(())
    }
}

/// The charts' `image` values: the harness's Tandem image.
fn image_values() -> serde_json::Value {
    let image = crate::testkit::tandem_image();
    let (repository, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
    json!({"repository": repository, "tag": tag})
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
