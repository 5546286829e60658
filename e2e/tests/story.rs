//! The whole story as one test (the same code as the `tandem-demo` binary, in
//! `tandem_e2e::story`): install Tandem on the harness (the four charts `tandem-crds`,
//! `tandem-operator`, `tandem-cluster` and `tandem-bridge` rendered by real Helm and
//! applied; the operator and bridge containers' command lines run as processes; the
//! cluster chart makes a `TandemCluster` with two teams, a worker set of 2 of the pool's four
//! 2-GPU nodes with an HPA, a login set), then:
//! - the serving team's inference Deployment (`schedulerName: tandem`) is bound by the
//!   bridge to pool nodes, which turn to `kube` mode;
//! - a researcher in the login pod submits the 2-node all-reduce example and the sweep
//!   array; they wait, and the story, playing the chart's HPA, scales the worker set from 2
//!   to 4 on the controller's pending-nodes gauge through the scale subresource; the ranks
//!   meet over TCP on two nodes, every task COMPLETES;
//! - scaled to zero, the serving nodes return to `batch` under a job on every node;
//! - `sshare` shows both teams' usage; `helm uninstall` of each release (every object it
//!   made, last first) leaves none of them and no pod.
//!
//! Needs the binaries (`cargo build --bins -p tandem-cli -p tandem-operator -p
//! tandem-bridge`) and root (the process kubelet's mount namespaces).
//!
//! With `KUBECONFIG` set it runs against that cluster what needs no process kubelet: the
//! four charts rendered and applied (the operator and bridge at 0 replicas, so nothing
//! runs and no image is pulled), the check that every object they made exists, the
//! uninstalls, the check that none is left, and the deletion of its two namespaces. The
//! CRDs stay (as Helm keeps `crds/`); ones already there are used. Every later step prints
//! `SKIP <step>: <why>`: they need the process kubelet (`kubectl exec` into the login pod
//! runs here; the bridge and the story reach the controller's cluster IP from this
//! machine). Neither the binaries nor root are needed then.

use tandem_e2e::story::{self, Bins};
use tandem_e2e::testkit::{TestCluster, skip, tandem_bin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_jobs_and_an_inference_deployment_share_one_pool_through_the_operator_and_the_bridge()
{
    let test = "the_whole_story";
    let cluster = TestCluster::start().await.unwrap();
    if cluster.is_real() {
        let made = story::run_real(&cluster).await.unwrap_or_else(|e| {
            panic!(
                "the install on KUBECONFIG's cluster failed: {:#}",
                anyhow::Error::from(e)
            )
        });
        assert!(made > 0, "the releases made no object");
        return;
    }
    let Some(tandem) = tandem_bin() else {
        panic!(
            "target/<profile>/tandem is missing: cargo build --bins -p tandem-cli -p tandem-operator -p tandem-bridge"
        );
    };
    if !nix::unistd::geteuid().is_root() {
        skip(
            test,
            "the pods' volume mounts need root (a mount namespace per container)",
        );
        return;
    }
    let bins = Bins::in_dir(tandem.parent().unwrap());
    assert!(
        bins.missing().is_empty(),
        "missing {:?}: cargo build --bins -p tandem-cli -p tandem-operator -p tandem-bridge",
        bins.missing()
    );
    let outcome = story::run(&cluster, &bins)
        .await
        .unwrap_or_else(|e| panic!("the story failed: {:#}", anyhow::Error::from(e)));

    assert_eq!(outcome.allreduce_nodes.len(), 2, "{outcome:?}");
    assert_ne!(outcome.allreduce_nodes[0], outcome.allreduce_nodes[1]);
    assert_eq!(outcome.array_tasks, 8, "{outcome:?}");
    assert_eq!(
        outcome.scaled,
        (2, 4),
        "the worker set grows from 2 to the whole pool: {outcome:?}"
    );
    assert!(!outcome.inference_nodes.is_empty(), "{outcome:?}");
    assert!(
        outcome
            .inference_nodes
            .iter()
            .all(|n| n.starts_with("gpu-")),
        "inference runs on the pool: {outcome:?}"
    );
    assert_eq!(outcome.flipped, outcome.inference_nodes);
    for account in ["research", "serving"] {
        assert!(
            outcome.usage.get(account).is_some_and(|u| *u > 0),
            "{account} has usage: {outcome:?}"
        );
    }
}
