//! The in-tree Workload API (`scheduling.k8s.io/v1alpha1`, Kubernetes 1.35) through the
//! bridge: pods name a Workload's pod group in `spec.workloadRef`.
//!
//! - Pods whose Workload does not exist yet wait `Unschedulable`, saying so (never placed
//!   one by one).
//! - A `gang` pod group of `minCount: 4` is one placeholder job: with three pods none is
//!   bound (each waits `Unschedulable`, saying how many are missing); the fourth pod makes
//!   all four bound at once, by the same job.
//! - A `basic` pod group is no gang: each of its pods is bound on its own, by its own job.
//!
//! The harness serves `workloads` as the built-in kind it is; no controller creates the
//! pods, so the test creates them with the `workloadRef` a Job would carry.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1alpha1::Workload;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;
use tandem_e2e::bridgekit::{BridgeEnv, Setup, describe, job_id, node_of, unschedulable};
use tandem_e2e::testkit::TestCluster;

/// A one-GPU pod of `pod_group` in Workload `train`, scheduled by Tandem.
fn pod(name: &str, pod_group: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"group": pod_group}},
        "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1,
                 "workloadRef": {"name": "train", "podGroup": pod_group},
                 "containers": [{"name": "c", "image": "busybox",
                     "command": ["sh", "-c", "sleep 300"],
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                   "limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap()
}

/// Whether every pod is `Unschedulable` with a message containing `part`.
fn all_told(ps: &[Pod], n: usize, part: &str) -> bool {
    ps.len() == n
        && ps
            .iter()
            .all(|p| node_of(p).is_none() && unschedulable(p).is_some_and(|m| m.contains(part)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_gang_is_bound_all_at_once_and_a_basic_group_pod_by_pod() {
    let test = "a_workload_gang_is_bound_all_at_once_and_a_basic_group_pod_by_pod";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("g1", 8, 16, 2)
            .node("g2", 8, 16, 2)
            .namespace("ml", "root", json!({})),
    )
    .await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("ml").to_owned();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
    let gang = ListParams::default().labels("group=workers");

    // Three pods of a Workload that does not exist yet: they wait, told so.
    for i in 0..3 {
        pods.create(&PostParams::default(), &pod(&format!("w-{i}"), "workers"))
            .await
            .unwrap();
    }
    env.wait_pods(
        &pods,
        &gang,
        "the pods told their Workload is missing",
        |ps| all_told(ps, 3, "Workload"),
    )
    .await;
    let told = pods.list(&gang).await.unwrap().items;
    let why = unschedulable(&told[0]).unwrap();
    assert!(
        why.contains(&format!("{ns}/train")) && why.contains("not found"),
        "the message names the missing Workload: {why}"
    );

    // The Workload: a gang of four workers, and a basic driver group.
    let w: Workload = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
        "metadata": {"name": "train"},
        "spec": {"podGroups": [
            {"name": "workers", "policy": {"gang": {"minCount": 4}}},
            {"name": "driver", "policy": {"basic": {}}},
        ]},
    }))
    .unwrap();
    workloads.create(&PostParams::default(), &w).await.unwrap();
    env.wait_pods(
        &pods,
        &gang,
        "the three pods waiting for the fourth",
        |ps| all_told(ps, 3, "3 of 4"),
    )
    .await;
    // Room for all four is there: give the controller and the bridge several cycles to
    // (wrongly) place part of the gang, then check that nothing was bound.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = pods.list(&gang).await.unwrap().items;
    let bound: Vec<String> = still
        .iter()
        .filter(|p| node_of(p).is_some())
        .map(describe)
        .collect();
    assert!(
        bound.is_empty(),
        "no pod of a short gang is bound: {bound:?}"
    );
    let q = env.cli(&["squeue", "-h", "-o", "%j|%T"]);
    assert!(
        !q.contains(&format!("{ns}/train")),
        "no job is submitted for a short gang: {q}"
    );

    // The fourth pod: all four bound, by one job.
    pods.create(&PostParams::default(), &pod("w-3", "workers"))
        .await
        .unwrap();
    let up = env
        .wait_pods(&pods, &gang, "every gang pod bound", |ps| {
            ps.len() == 4
                && ps
                    .iter()
                    .all(|p| node_of(p).is_some() && job_id(p).is_some())
        })
        .await;
    let jobs: BTreeSet<&str> = up.iter().filter_map(job_id).collect();
    assert_eq!(
        jobs.len(),
        1,
        "one placeholder job binds the gang: {jobs:?}"
    );
    let q = env.cli(&["squeue", "-h", "-o", "%j|%T"]);
    assert_eq!(
        q.lines()
            .filter(|l| *l == format!("{ns}/train|RUNNING"))
            .count(),
        1,
        "squeue shows the gang as one job named after its Workload: {q}"
    );
    pods.delete_collection(&Default::default(), &gang)
        .await
        .unwrap();
    env.wait_cli(
        &["squeue", "-h", "-o", "%j"],
        "the gang's job to end",
        |o| !o.contains("/train"),
    )
    .await;

    // Two pods of the basic group: each placed on its own, by its own job.
    for i in 0..2 {
        pods.create(&PostParams::default(), &pod(&format!("d-{i}"), "driver"))
            .await
            .unwrap();
    }
    let driver = ListParams::default().labels("group=driver");
    let up = env
        .wait_pods(&pods, &driver, "both basic pods bound", |ps| {
            ps.len() == 2
                && ps
                    .iter()
                    .all(|p| node_of(p).is_some() && job_id(p).is_some())
        })
        .await;
    let jobs: BTreeSet<&str> = up.iter().filter_map(job_id).collect();
    assert_eq!(jobs.len(), 2, "a basic pod group is no gang: {jobs:?}");

    watch.finish().assert_no_overlap();
}
