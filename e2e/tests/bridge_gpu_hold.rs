//! The GPU holder (`bridge/src/holder.rs`), end to end on the harness: the real controller,
//! workers and bridge, the process kubelet accounting `nvidia.com/gpu` at admission.
//!
//! - While a pool node with GPUs is in `batch` mode, the bridge's holder pod holds all of
//!   them: a pod that reaches the node around the bridge (here `spec.nodeName` from a
//!   namespace no webhook guards) is refused by the kubelet, `OutOfnvidia.com/gpu`.
//! - A bridged GPU pod that the controller places there is admitted: the holder was deleted
//!   and its container reported stopped before the node was written to `kube` mode and the
//!   pod bound.
//! - When a batch job takes the node back, the holder returns.
//! - A holder the kubelet refuses (something else already holds the node's GPUs) drains
//!   the node in the controller, with the reason, and a Warning Event says so.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use tandem_e2e::bridgekit::{BridgeEnv, Setup, deployment, node_of, running, scale};
use tandem_e2e::testkit::TestCluster;

/// The holder of node `k1` of the cluster `pool` (`<cluster>-gpu-hold-<node>`).
const HOLDER: &str = "pool-gpu-hold-k1";

/// The bridge's flags: holders run `sleep infinity` from an image the harness runs.
const BRIDGE_ARGS: &[&str] = &["--gpu-holder-image", "busybox"];

/// A pod pinned to `node` by `spec.nodeName` (no scheduler), asking for `gpus` GPUs.
fn pinned(name: &str, node: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "sleep 300"],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
        },
    }))
    .unwrap()
}

fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn reason(p: &Pod) -> Option<&str> {
    p.status.as_ref().and_then(|s| s.reason.as_deref())
}

fn gpu_limit(p: &Pod) -> Option<String> {
    p.spec
        .as_ref()?
        .containers
        .first()?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("nvidia.com/gpu")
        .map(|q| q.0.clone())
}

/// Waits until pod `name` satisfies `cond` (`None`: absent); the pod last seen.
async fn wait_pod(
    env: &BridgeEnv,
    api: &Api<Pod>,
    name: &str,
    what: &str,
    cond: impl Fn(Option<&Pod>) -> bool,
) -> Option<Pod> {
    let deadline = tokio::time::Instant::now() + tandem_e2e::bridgekit::T;
    loop {
        let p = api.get_opt(name).await.ok().flatten();
        if cond(p.as_ref()) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last seen: {:?}\n{}",
            p.as_ref().map(|p| (phase(p), reason(p), node_of(p))),
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_node_s_gpus_are_held_until_the_node_turns_kube() {
    let test = "a_batch_node_s_gpus_are_held_until_the_node_turns_kube";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("k1", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let ns = env.ns("serving").to_owned();
    let holders: Api<Pod> = Api::namespaced(client.clone(), env.cluster_namespace());
    let other = cluster.namespace("other").await.unwrap();
    let strays: Api<Pod> = Api::namespaced(client.clone(), &other);
    let _bridge = env.spawn_bridge(BRIDGE_ARGS);

    // (a) An idle pool node is a batch node: its holder runs there, holding both GPUs.
    let h = wait_pod(&env, &holders, HOLDER, "the holder running on k1", |p| {
        p.is_some_and(|p| running(p) && node_of(p) == Some("k1"))
    })
    .await
    .unwrap();
    assert_eq!(gpu_limit(&h).as_deref(), Some("2"), "every GPU of k1");
    env.assert_mode("k1", "batch");
    // A pod pinned to k1 around the bridge, asking for a GPU: the kubelet has none left.
    strays
        .create(&PostParams::default(), &pinned("stray", "k1", 1))
        .await
        .unwrap();
    let s = wait_pod(&env, &strays, "stray", "the stray pod refused", |p| {
        p.is_some_and(|p| matches!(phase(p), Some("Failed" | "Running")))
    })
    .await
    .unwrap();
    assert_eq!(
        (phase(&s), reason(&s)),
        (Some("Failed"), Some("OutOfnvidia.com/gpu")),
        "a pod reaching a batch node around the bridge gets no GPU"
    );
    strays
        .delete("stray", &DeleteParams::default())
        .await
        .unwrap();

    // (b) A bridged GPU pod: the controller turns k1 kube; the holder goes first, and the
    // pod is admitted with its GPU.
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", 1, 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels("app=web");
    let up = env
        .wait_pods(&pods, &lp, "the web pod running on k1", |ps| {
            ps.iter().any(|p| phase(p) == Some("Failed"))
                || (ps.len() == 1 && ps.iter().all(|p| running(p) && node_of(p) == Some("k1")))
        })
        .await;
    assert!(
        up.iter().all(|p| phase(p) != Some("Failed")),
        "the bridged pod was refused: {:?}",
        up.iter().map(|p| (phase(p), reason(p))).collect::<Vec<_>>()
    );
    assert!(
        holders.get_opt(HOLDER).await.unwrap().is_none(),
        "the holder is gone while the node serves pods"
    );
    env.assert_mode("k1", "kube");

    // (c) The pod goes and a batch job takes the node: batch mode, and the holder is back.
    scale(&deploys, "web", 0).await;
    env.wait_pods(&pods, &lp, "the web pod gone", |ps| ps.is_empty())
        .await;
    let job = env.sbatch(&["-N1", "--gpus-per-node=2"], "sleep 1");
    env.wait_until("the batch job to complete", || {
        let st = env.cli(&["sacct", "-X", "-n", "-j", &job, "-o", "State"]);
        st.trim() == "COMPLETED"
    })
    .await;
    let h = wait_pod(&env, &holders, HOLDER, "the holder back on k1", |p| {
        p.is_some_and(|p| running(p) && node_of(p) == Some("k1"))
    })
    .await
    .unwrap();
    assert_eq!(gpu_limit(&h).as_deref(), Some("2"));
    env.assert_mode("k1", "batch");
    strays
        .create(&PostParams::default(), &pinned("stray-2", "k1", 1))
        .await
        .unwrap();
    let s = wait_pod(&env, &strays, "stray-2", "the second stray refused", |p| {
        p.is_some_and(|p| matches!(phase(p), Some("Failed" | "Running")))
    })
    .await
    .unwrap();
    assert_eq!(reason(&s), Some("OutOfnvidia.com/gpu"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_holder_drains_its_node() {
    let test = "a_refused_holder_drains_its_node";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("k1", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    // Before any bridge: something takes k1's GPUs.
    let other = cluster.namespace("other").await.unwrap();
    let strays: Api<Pod> = Api::namespaced(client.clone(), &other);
    strays
        .create(&PostParams::default(), &pinned("squatter", "k1", 2))
        .await
        .unwrap();
    wait_pod(&env, &strays, "squatter", "the squatter running", |p| {
        p.is_some_and(running)
    })
    .await;

    let _bridge = env.spawn_bridge(BRIDGE_ARGS);
    let holders: Api<Pod> = Api::namespaced(client.clone(), env.cluster_namespace());
    let h = wait_pod(&env, &holders, HOLDER, "the holder refused", |p| {
        p.is_some_and(|p| phase(p) == Some("Failed"))
    })
    .await
    .unwrap();
    assert_eq!(reason(&h), Some("OutOfnvidia.com/gpu"));
    let out = env
        .wait_cli(
            &["sinfo", "-R", "-h", "-o", "%N|%E"],
            "k1 drained by the bridge",
            |out| out.contains("k1|tandem-bridge: GPU holder refused"),
        )
        .await;
    assert!(out.contains("OutOfnvidia.com/gpu"), "{out}");
    let events: Api<KubeEvent> = Api::all(client.clone());
    env.wait_event(&events, "a GPUHolderRefused Event on k1", |e| {
        e.reason.as_deref() == Some("GPUHolderRefused")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("k1")
    })
    .await;
    // The failed holder stays, as the record; no new one is made meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let h2 = holders.get(HOLDER).await.unwrap();
    assert_eq!(h2.metadata.uid, h.metadata.uid, "the refused holder stays");
}
