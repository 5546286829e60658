//! The whole story as one test (the same code as the `tandem-demo` binary, in
//! `tandem_e2e::story`): install Tandem on the harness (the `tandem-crds`,
//! `tandem-operator` and `tandem-bridge` charts rendered by real Helm and applied, the
//! operator and bridge containers' command lines run as processes; a `TandemCluster` with two
//! teams, a worker set of four 2-GPU nodes, a login set), then:
//! - the serving team's inference Deployment (`schedulerName: tandem`) is bound by the
//!   bridge to pool nodes, which turn to `kube` mode;
//! - a researcher in the login pod submits the 2-node all-reduce example and the sweep
//!   array; the ranks meet over TCP on two nodes, every task COMPLETES;
//! - scaled to zero, the serving nodes return to `batch` under a job on every node;
//! - `sshare` shows both teams' usage; deleting the objects leaves no pod behind, and
//!   `helm uninstall` (every release object, last first) leaves none of them.
//!
//! Needs the binaries (`cargo build --bins -p tandem-cli -p tandem-operator -p
//! tandem-bridge`) and root (the process kubelet's mount namespaces). With `KUBECONFIG` set
//! it prints SKIP and why: every step after the install needs the process kubelet (`kubectl
//! exec` into the login pod, the bridge reaching the controller's cluster IP from this
//! machine).

use tandem_e2e::story::{self, Bins};
use tandem_e2e::testkit::{TestCluster, skip, tandem_bin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_jobs_and_an_inference_deployment_share_one_pool_through_the_operator_and_the_bridge()
{
    let test = "the_whole_story";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
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
