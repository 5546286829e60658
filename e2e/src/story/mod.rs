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
//!
//! # Layout
//! This file is the outline: the public types, the entry points [`run`] and [`run_real`],
//! the story's state and the order of its steps. Each step is a file: `nodes` (1), `install`
//! (2), `serving` (3 and 5), `research` (4) with `hpa` (4b), `sshare` (6), `uninstall`
//! (the end) and `real` (the `KUBELET_STEPS` skipped on a real cluster); `login` (commands
//! in the login pod), `wait` (deadlines) and `print` (what it prints) serve them all.

pub mod autoscale;
pub mod helm;
pub mod manifests;
pub mod procs;
pub mod table;
pub mod values;

mod hpa;
mod install;
mod login;
mod nodes;
mod print;
mod real;
mod research;
mod serving;
mod sshare;
mod uninstall;
mod wait;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject};

use crate::testkit::{TestCluster, TestkitError};
use manifests::Pool;
pub use procs::Bins;
use procs::Proc;
pub use research::examples_dir;

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

/// On a real cluster (`KUBECONFIG`): the four charts installed (rendered and applied, the
/// operator and bridge at 0 replicas, so nothing runs), every object they made checked to
/// exist, then uninstalled and checked gone, and the story's namespaces deleted. Prints
/// `SKIP <step>: <why>` for the steps that need the process kubelet. The number of objects
/// the releases made.
pub async fn run_real(cluster: &TestCluster) -> Result<usize, StoryError> {
    let mut s = Story::new(cluster, None)?;
    s.play_real().await
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

    /// The `tandem.dev/v1alpha1` kind `kind` (plural `plural`) in Tandem's namespace.
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
}
