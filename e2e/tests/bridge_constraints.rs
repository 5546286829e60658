//! A pod's own constraints hold through the bridge: its `nodeSelector` and required node
//! affinity become nodes its placeholder may not use, a pod no pool node fits waits told
//! why, and a pod asking for a host port is told the bridge cannot place it. Nothing is
//! bound where the kubelet would reject it (the process kubelet checks `nodeSelector` as a
//! real one does).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_e2e::bridgekit::{BridgeEnv, Setup, gpu_pod, node_of, running, unschedulable};
use tandem_e2e::testkit::TestCluster;

fn pod(name: &str, spec: serde_json::Value) -> Pod {
    gpu_pod(name, json!({"spec": spec}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_node_selector_and_affinity_choose_among_the_pools_nodes() {
    let test = "a_pods_node_selector_and_affinity_choose_among_the_pools_nodes";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("p1", 8, 16, 2)
            .node("p2", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, gpu) in [("p1", "l4"), ("p2", "a100")] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"example.com/gpu": gpu}}})),
            )
            .await
            .unwrap();
    }
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("serving").to_owned();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let one = |n: &str| ListParams::default().fields(&format!("metadata.name={n}"));

    // p1 comes first in every order the controller has: only the pod's selector sends
    // these to p2.
    pods.create(
        &PostParams::default(),
        &pod(
            "picky",
            json!({"nodeSelector": {"example.com/gpu": "a100"}}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "affine",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "example.com/gpu", "operator": "In", "values": ["a100", "h100"]}]}]}}}}),
        ),
    )
    .await
    .unwrap();
    for name in ["picky", "affine"] {
        let up = env
            .wait_pods(&pods, &one(name), &format!("{name} running"), |ps| {
                ps.len() == 1 && ps.iter().all(running)
            })
            .await;
        assert_eq!(
            node_of(&up[0]),
            Some("p2"),
            "{name} placed off its selector"
        );
    }

    // No pool node has an h100: the pod waits, told why; nothing is bound.
    pods.create(
        &PostParams::default(),
        &pod(
            "nowhere",
            json!({"nodeSelector": {"example.com/gpu": "h100"}}),
        ),
    )
    .await
    .unwrap();
    let told = env
        .wait_pods(&pods, &one("nowhere"), "nowhere told why it waits", |ps| {
            ps.len() == 1 && unschedulable(&ps[0]).is_some()
        })
        .await;
    let why = unschedulable(&told[0]).unwrap_or_default().to_owned();
    assert!(why.starts_with("no pool node fits the pod"), "{why}");
    assert_eq!(node_of(&told[0]), None);

    // A host port cannot be reserved by a placeholder: told, never bound.
    pods.create(
        &PostParams::default(),
        &pod(
            "porty",
            json!({"containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", "sleep 300"],
                "ports": [{"containerPort": 8080, "hostPort": 8080}]}]}),
        ),
    )
    .await
    .unwrap();
    let told = env
        .wait_pods(&pods, &one("porty"), "porty told why it waits", |ps| {
            ps.len() == 1 && unschedulable(&ps[0]).is_some()
        })
        .await;
    let why = unschedulable(&told[0]).unwrap_or_default().to_owned();
    assert!(why.starts_with("hostPort 8080:"), "{why}");
    assert_eq!(node_of(&told[0]), None);
}
