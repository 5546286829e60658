//! The bridge end to end on the harness: the real `tandem controller`, real `tandem worker`
//! processes named after the harness's Kubernetes nodes (as the operator names them), the
//! real `tandem-bridge`, and an inference Deployment with `schedulerName: tandem`.
//!
//! Shows: pods are bound by the bridge to nodes the controller allocated (kube mode), several
//! small pods share one node up to its GPUs, a batch job waits while the pool serves pods and
//! runs once the Deployment scales to zero, invalid annotations leave a pod `Unschedulable`
//! with the reason, `squeue` lists the bridged groups as `namespace/owner`, and the pool
//! nodes carry the pool taint and a `tandem.dev/mode` label that follows the controller
//! (`kube` under pods, `batch` again once a batch job took the node, with a `ModeChanged`
//! Event).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::time::Duration;
use tandem_e2e::bridgekit::{
    BridgeEnv, Setup, T, deployment, job_id, node_of, running, scale, unschedulable,
};
use tandem_e2e::testkit::{TestCluster, wait_for};

#[tokio::test]
async fn an_inference_deployment_and_batch_jobs_take_turns_on_one_pool() {
    let test = "an_inference_deployment_and_batch_jobs_take_turns_on_one_pool";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    let env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("k1", 8, 16, 2)
            .node("k2", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let ns = env.ns("serving").to_owned();
    let mut env = env;
    let _bridge = env.spawn_bridge(&[]);

    // Three one-GPU replicas on two 2-GPU nodes: two share a node, all bound by the bridge.
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", 3, 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels("app=web");
    let up = env
        .wait_pods(&pods, &lp, "3 running pods", |ps| {
            ps.len() == 3 && ps.iter().all(running)
        })
        .await;
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &up {
        *per_node.entry(node_of(p).unwrap().to_owned()).or_default() += 1;
        assert!(job_id(p).is_some(), "bound pods carry their job id");
    }
    assert_eq!(
        per_node
            .values()
            .copied()
            .collect::<Vec<_>>()
            .iter()
            .sum::<usize>(),
        3
    );
    assert!(per_node.values().all(|n| *n <= 2), "{per_node:?}");
    let q = env.cli(&["squeue", "-h", "-o", "%j %T"]);
    assert_eq!(
        q.lines()
            .filter(|l| l.starts_with(&format!("{ns}/web-")))
            .count(),
        3,
        "{q}"
    );
    let s = env.cli(&["sinfo", "-N", "-h", "-o", "%N %t"]);
    assert_eq!(s.lines().count(), 2, "{s}");
    // The time partition shows in Kubernetes: nodes hosting pods are labelled `kube` and
    // carry the pool taint; sinfo shows the same mode.
    let node_api: Api<Node> = Api::all(client.clone());
    for node in per_node.keys() {
        wait_for(
            &node_api,
            node,
            "tandem.dev/mode=kube and the pool taint",
            T,
            |n: &Node| mode_of(n) == Some("kube") && has_pool_taint(n),
        )
        .await
        .unwrap();
        env.assert_mode(node, "kube");
    }

    // A pod with an invalid annotation waits, saying why.
    let bad: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "typo", "annotations": {"tandem.dev/partiton": "gpu"}},
        "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &bad).await.unwrap();
    wait_for(
        &pods,
        "typo",
        "Unschedulable with the annotation named",
        T,
        |p: &Pod| unschedulable(p).is_some_and(|m| m.contains("tandem.dev/partiton")),
    )
    .await
    .unwrap();

    // A batch job needing a whole node waits while both nodes serve pods, and runs once the
    // Deployment scales to zero and its placeholders end.
    let batch = env.sbatch(&["-N1", "--gpus-per-node=2"], "true");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = env.cli(&["squeue", "-h", "-j", &batch, "-o", "%T"]);
    assert_eq!(
        st.trim(),
        "PENDING",
        "the pool serves pods; the batch job must wait"
    );
    scale(&deploys, "web", 0).await;
    env.wait_until("the batch job to run once the pods are gone", || {
        let st = env.cli(&["sacct", "-X", "-n", "-j", &batch, "-o", "State"]);
        st.trim() == "COMPLETED"
    })
    .await;
    // The node the batch job ran on is back in `batch` mode, still tainted, with an Event
    // for the flip.
    let ran_on = env
        .cli(&["sacct", "-X", "-n", "-j", &batch, "-o", "NodeList%40"])
        .trim()
        .to_owned();
    assert!(per_node.contains_key(&ran_on), "{ran_on:?} {per_node:?}");
    wait_for(
        &node_api,
        &ran_on,
        "tandem.dev/mode=batch and the pool taint",
        T,
        |n: &Node| mode_of(n) == Some("batch") && has_pool_taint(n),
    )
    .await
    .unwrap();
    let events: Api<KubeEvent> = Api::all(client.clone());
    env.wait_event(&events, &format!("a ModeChanged Event on {ran_on}"), |e| {
        e.reason.as_deref() == Some("ModeChanged")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&ran_on)
    })
    .await;
}

fn mode_of(n: &Node) -> Option<&str> {
    n.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("tandem.dev/mode"))
        .map(String::as_str)
}

fn has_pool_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == "tandem.dev/pool"
                    && t.value.as_deref() == Some("pool")
                    && t.effect == "NoSchedule"
            })
        })
}
