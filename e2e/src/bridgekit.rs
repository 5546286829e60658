//! What the bridge's e2e tests share: a batch side (the real `tandem controller` and one real
//! `tandem worker` per harness node, named after it, as the operator names them), the CRDs and
//! a `TandemCluster` whose bridge namespace map names the test's namespaces, a kubeconfig for
//! the harness, and `tandem-bridge run` processes (one or several, to test two replicas).
//!
//! When the [`BridgeEnv`] drops, its jobs are cancelled first (a killed worker would leave
//! them running), then every process is killed (as is a [`Proc`] dropped alone); their logs
//! stay in [`BridgeEnv::dir`] until then, and [`BridgeEnv::logs`] puts their tails in failure
//! messages.
//!
//! # Layout
//! - this file: the shared limits ([`T`], [`CLUSTER`]) and small helpers ([`wait_until`],
//!   [`held`]).
//! - `process.rs`: child processes killed on drop ([`Proc`], [`spawn`], [`free_port`]).
//! - `setup.rs`: what a test asks for ([`Setup`], [`NodeShape`]).
//! - `env.rs`: the [`BridgeEnv`] itself: start, the CLI, logs, and the clean-up on drop;
//!   `env/daemons.rs` starts, kills and restarts its controller, workers and bridges.
//! - `waits.rs`: [`BridgeEnv`]'s waits on pods, the CLI and Events.
//! - `pods.rs`: pod and Deployment builders and predicates ([`gpu_pod`], [`describe`]).
//! - `partition.rs`: the [`PartitionWatch`] sampler of the time partition.

mod env;
mod partition;
mod pods;
mod process;
mod setup;
mod waits;

pub use env::BridgeEnv;
pub use partition::{NodeHolds, PartitionReport, PartitionWatch, hostnames};
pub use pods::{
    deployment, describe, gpu_pod, job_id, node_of, running, scale, scheduled, unschedulable,
};
pub use process::{Proc, free_port, spawn};
pub use setup::{NodeShape, Setup};

use std::path::Path;
use std::time::Duration;

use kube::api::{Api, ListParams};

use crate::bounded::{CALL_LIMIT, within};

/// How long a bridge test waits for any one condition.
pub const T: Duration = Duration::from_secs(60);

/// The name of the `TandemCluster` the bridges read (and the pool taint's value).
pub const CLUSTER: &str = "pool";

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

/// A `--wrap` that runs until `file` exists, so the test decides when the job ends.
pub fn held(file: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.1; done", file.display())
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
