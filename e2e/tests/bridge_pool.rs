//! One pool, two kinds of work at once: an inference Deployment's pods run on `kube`-mode
//! nodes while a batch array fills the other nodes, small pods share a node up to its GPUs,
//! and when the pods go the batch side takes their nodes. A watcher checks every state change
//! it observes: no node ever runs a batch job and a bridged pod at the same moment.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use tandem_e2e::bridgekit::{BridgeEnv, Setup, deployment, held, job_id, node_of, running, scale};
use tandem_e2e::testkit::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_pods_run_on_kube_nodes_while_a_batch_array_fills_the_rest() {
    let test = "inference_pods_run_on_kube_nodes_while_a_batch_array_fills_the_rest";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("p1", 8, 16, 2)
            .node("p2", 8, 16, 2)
            .node("p3", 8, 16, 2)
            .node("p4", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("serving").to_owned();
    let client = cluster.client();
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let web = ListParams::default().labels("app=web");

    // Three one-GPU replicas: bound by the bridge to kube-mode nodes, two sharing a node.
    deploys
        .create(&PostParams::default(), &deployment("web", 3, 1))
        .await
        .unwrap();
    let up = env
        .wait_pods(&pods, &web, "3 running web pods", |ps| {
            ps.len() == 3 && ps.iter().all(running)
        })
        .await;
    let mut per_node = BTreeMap::<String, usize>::new();
    for p in &up {
        *per_node.entry(node_of(p).unwrap().to_owned()).or_default() += 1;
        assert!(job_id(p).is_some(), "a bound pod carries its job id");
    }
    let mut counts: Vec<usize> = per_node.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![1, 2], "packed onto two nodes: {per_node:?}");
    for node in per_node.keys() {
        env.assert_mode(node, "kube");
    }
    let kube_nodes: BTreeSet<String> = per_node.keys().cloned().collect();

    // A batch array of whole-node tasks, held until the test releases them: two run on the
    // two batch nodes, the rest wait (the kube nodes are not theirs while pods run).
    let release = env.dir().join("release");
    let array = env.sbatch(
        &["--array=0-3", "-N1", "--gpus-per-node=2"],
        &held(&release),
    );
    let q = env
        .wait_cli(
            &["squeue", "-h", "-t", "R", "-o", "%j|%N"],
            "two array tasks running",
            |out| out.lines().filter(|l| l.starts_with("wrap|")).count() == 2,
        )
        .await;
    let batch_nodes: BTreeSet<String> = q
        .lines()
        .filter_map(|l| l.strip_prefix("wrap|"))
        .map(str::to_owned)
        .collect();
    assert!(
        batch_nodes.is_disjoint(&kube_nodes),
        "batch {batch_nodes:?} on pod nodes {kube_nodes:?}"
    );
    let pending = env.cli(&["squeue", "-h", "-j", &array, "-t", "PD", "-o", "%i"]);
    assert!(
        !pending.trim().is_empty(),
        "the rest of the array waits: {pending}"
    );
    for node in &batch_nodes {
        env.assert_mode(node, "batch");
    }
    // The pods kept running throughout, where they were.
    let still = pods.list(&web).await.unwrap().items;
    assert!(still.len() == 3 && still.iter().all(running));
    for p in &still {
        assert!(kube_nodes.contains(node_of(p).unwrap()));
    }

    // The pods go; the whole array runs, the last tasks on the former kube nodes too, and
    // then a job needing every node.
    scale(&deploys, "web", 0).await;
    std::fs::write(&release, "").unwrap();
    env.wait_cli(
        &["sacct", "-n", "-X", "-j", &array, "-o", "State"],
        "every array task COMPLETED",
        |out| out.lines().count() == 4 && out.lines().all(|l| l.trim() == "COMPLETED"),
    )
    .await;
    let all = env.sbatch(&["-N4", "--gpus-per-node=2"], "sleep 0.5");
    env.wait_cli(
        &["sacct", "-n", "-X", "-j", &all, "-o", "State"],
        "the whole-pool job COMPLETED",
        |out| out.trim() == "COMPLETED",
    )
    .await;

    let report = watch.finish();
    report.assert_no_overlap();
    // Not vacuous: the pod nodes later ran batch work, seen by the watcher.
    for n in &kube_nodes {
        assert!(
            report.pod_nodes.contains(n) && report.batch_nodes.contains(n),
            "{n} was seen hosting pods and later batch work ({} samples):\n{}",
            report.samples,
            report.timeline()
        );
    }
    // The same, judged from the processes: the checker placed the real workers' held job
    // processes and the pods' containers on their nodes (the later batch work on the pod
    // nodes lasts milliseconds, shorter than a sample), and never both on one at once.
    if let Some(checker) = cluster.invariant() {
        let seen = checker.report();
        assert!(
            seen.pod_nodes.is_superset(&kube_nodes) && seen.batch_nodes.is_superset(&batch_nodes),
            "the process checker saw the pods on {kube_nodes:?} and the held jobs on \
             {batch_nodes:?}: {seen:?}"
        );
        cluster.assert_invariant();
    }
}
