//! The time partition under the faults a platform team causes every week: a pod
//! force-deleted while its containers still run, a pod whose object vanishes without the
//! bridge's finalizer, a bridge started while the controller is away, and a
//! PodDisruptionBudget that refuses every eviction of a cancelled job's pod.
//!
//! Each pod here writes a heartbeat (nanoseconds since the epoch) every 50 ms while it
//! runs; the batch job waiting for its node writes the moment it starts. The node may turn
//! `batch` only after the pod's last heartbeat: a batch job starting while the pod still
//! beats is the bug these tests exist to catch.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_e2e::bridgekit::{
    BridgeEnv, Proc, Setup, deployment, gpu_pod, job_id, node_of, running,
};
use tandem_e2e::testkit::TestCluster;

const FINALIZER: &str = "tandem.dev/slot-protection";

/// A one-GPU pod that ignores SIGTERM (it stops only at SIGKILL, after its 8 s grace)
/// and beats into `beat` while it runs.
fn stubborn_pod(name: &str, beat: &Path) -> Pod {
    let b = beat.display();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tandem",
            "terminationGracePeriodSeconds": 8,
            "containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", format!(
                    "trap '' TERM; while :; do date +%s%N > {b}.tmp && mv {b}.tmp {b}; sleep 0.05; done")],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "1"}}}],
        },
    }))
    .unwrap_or_else(|e| panic!("pod {name}: {e}"))
}

fn stamp(file: &Path) -> u128 {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {text:?}: {e}", file.display()))
}

/// One pool node, p1, with 2 GPUs, and a serving namespace.
async fn one_node(cluster: &TestCluster) -> BridgeEnv {
    BridgeEnv::start(
        cluster,
        Setup::new(tandem_operator::crd::all())
            .node("p1", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await
}

/// One pool node with 2 GPUs and a serving namespace; the stubborn pod running on it.
async fn pod_on_the_only_node(
    cluster: &TestCluster,
    bridge_flags: &[&str],
) -> (BridgeEnv, Proc, Api<Pod>, std::path::PathBuf) {
    let mut env = one_node(cluster).await;
    let bridge = env.spawn_bridge(bridge_flags);
    let ns = env.ns("serving").to_owned();
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    let beat = env.dir().join("beat");
    pods.create(&PostParams::default(), &stubborn_pod("hold", &beat))
        .await
        .unwrap();
    env.wait_pods(
        &pods,
        &ListParams::default().fields("metadata.name=hold"),
        "the stubborn pod running on p1",
        |ps| ps.len() == 1 && ps.iter().all(running) && node_of(&ps[0]) == Some("p1"),
    )
    .await;
    env.wait_until("a first heartbeat", || beat.is_file()).await;
    env.assert_mode("p1", "kube");
    (env, bridge, pods, beat)
}

/// Submits a whole-node batch job that records when it started; asserts it waits.
async fn queue_batch_job(env: &BridgeEnv) -> std::path::PathBuf {
    let started = env.dir().join("started");
    let id = env.sbatch(
        &["-N1", "--gpus-per-node=2"],
        &format!("date +%s%N > {}", started.display()),
    );
    env.wait_cli(
        &["squeue", "-h", "-j", id.trim(), "-o", "%T"],
        "the batch job pending",
        |out| out.trim() == "PENDING",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!started.exists(), "the batch job started next to the pod");
    started
}

/// A PodDisruptionBudget `app` in `ns` that refuses every eviction of the pods `app=<app>`.
async fn refusing_budget(client: &kube::Client, ns: &str, app: &str) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    pdbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": app},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
}

/// Pod `name`, whose eviction a budget refuses, still runs a second after the bridge asked
/// for it; at the eviction timeout it is deleted, with an `EvictionDeadlineExceeded` Event.
async fn refused_until_the_deadline(
    env: &BridgeEnv,
    client: &kube::Client,
    ns: &str,
    lp: &ListParams,
    name: &str,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let still = pods.get(name).await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_none(),
        "deleted before the eviction timeout"
    );
    let events: Api<KubeEvent> = Api::namespaced(client.clone(), ns);
    env.wait_event(&events, "an EvictionDeadlineExceeded Event", |e| {
        e.reason.as_deref() == Some("EvictionDeadlineExceeded")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
    })
    .await;
    env.wait_pods(&pods, lp, "the overdue pod gone", |ps| {
        ps.iter().all(|p| p.metadata.name.as_deref() != Some(name))
    })
    .await;
}

fn force() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_holds_its_node_until_the_kubelet_reports_it_stopped() {
    let test = "a_force_deleted_pod_holds_its_node_until_the_kubelet_reports_it_stopped";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let (env, _bridge, pods, beat) = pod_on_the_only_node(&cluster, &[]).await;
    let bound = pods.get("hold").await.unwrap();
    assert!(
        bound
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER),
        "a bound pod carries the slot finalizer: {:?}",
        bound.metadata.finalizers
    );
    let started = queue_batch_job(&env).await;

    // `kubectl delete pod --grace-period=0 --force`: the object stays, marked for
    // deletion, until the kubelet has stopped the containers and the bridge released it.
    pods.delete("hold", &force()).await.unwrap();
    env.wait_until("the batch job to start once the pod stopped", || {
        started.is_file()
    })
    .await;
    let (last_beat, start) = (stamp(&beat), stamp(&started));
    assert!(
        start > last_beat,
        "the batch job started {} ms before the pod's last heartbeat",
        (last_beat - start) / 1_000_000
    );
    env.wait_pods(
        &pods,
        &ListParams::default().fields("metadata.name=hold"),
        "the pod object gone once its slot was released",
        |ps| ps.is_empty(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_vanishes_while_running_holds_its_node_for_its_grace_period() {
    let test = "a_pod_that_vanishes_while_running_holds_its_node_for_its_grace_period";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let (env, _bridge, pods, beat) =
        pod_on_the_only_node(&cluster, &["--vanish-margin-seconds", "2"]).await;
    let started = queue_batch_job(&env).await;

    // An administrator strips the finalizer, then force-deletes: the object is gone at
    // once while the kubelet gives the container its 8 s grace (it ignores SIGTERM).
    pods.patch(
        "hold",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    pods.delete("hold", &force()).await.unwrap();
    env.wait_until(
        "the batch job to start after the pod's grace period",
        || started.is_file(),
    )
    .await;
    let (last_beat, start) = (stamp(&beat), stamp(&started));
    assert!(
        start > last_beat,
        "the batch job started {} ms before the vanished pod's last heartbeat",
        (last_beat - start) / 1_000_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_started_while_the_controller_is_away_waits_for_it() {
    let test = "a_bridge_started_while_the_controller_is_away_waits_for_it";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = one_node(&cluster).await;
    env.kill_controller();
    let mut bridge = env.spawn_bridge(&[]);
    let ns = env.ns("serving").to_owned();
    let deploys: Api<Deployment> = Api::namespaced(cluster.client(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", 1, 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !bridge.exited(),
        "the bridge exited while the controller was away:\n{}",
        env.logs()
    );
    env.restart_controller().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns);
    env.wait_pods(
        &pods,
        &ListParams::default().labels("app=web"),
        "the web pod bound once the controller is back",
        |ps| ps.len() == 1 && ps.iter().all(running),
    )
    .await;
    assert!(!bridge.exited(), "the bridge is still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disruption_budget_delays_a_cancel_only_until_the_eviction_timeout() {
    let test = "a_disruption_budget_delays_a_cancel_only_until_the_eviction_timeout";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = one_node(&cluster).await;
    let _bridge = env.spawn_bridge(&["--eviction-timeout", "3"]);
    let ns = env.ns("serving").to_owned();
    let client = cluster.client();
    refusing_budget(&client, &ns, "web").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let web = ListParams::default().labels("app=web");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", 1, 1))
        .await
        .unwrap();
    let up = env
        .wait_pods(&pods, &web, "the web pod running", |ps| {
            ps.len() == 1 && ps.iter().all(running)
        })
        .await;
    let name = up[0].metadata.name.clone().unwrap();
    let job = job_id(&up[0]).unwrap().to_owned();

    // scancel: the bridge evicts, the budget refuses (429), the pod runs on for now ...
    env.cli(&["scancel", &job]);
    // ... until the timeout: then it is deleted, and an Event on it says why.
    refused_until_the_deadline(&env, &client, &ns, &web, &name).await;
    env.wait_cli(
        &["sacct", "-n", "-X", "-P", "-j", &job, "-o", "State"],
        "the placeholder CANCELLED",
        |out| out.trim().starts_with("CANCELLED"),
    )
    .await;
}

/// A one-GPU pod of LeaderWorkerSet group `key` (size 1), as the LWS controller labels it.
fn lws_pod(name: &str, key: &str) -> Pod {
    gpu_pod(
        name,
        json!({"metadata": {
            "labels": {"leaderworkerset.sigs.k8s.io/group-key": key,
                       "leaderworkerset.sigs.k8s.io/name": "infer"},
            "annotations": {"leaderworkerset.sigs.k8s.io/size": "1"}}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_copying_another_namespaces_group_labels_is_a_group_of_its_own() {
    let test = "a_pod_copying_another_namespaces_group_labels_is_a_group_of_its_own";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("p1", 8, 16, 2)
            .node("p2", 8, 16, 2)
            .namespace("serving", "root", json!({}))
            .namespace("other", "root", json!({})),
    )
    .await;
    let _bridge = env.spawn_bridge(&[]);
    let (serving, other) = (env.ns("serving").to_owned(), env.ns("other").to_owned());
    let client = cluster.client();
    let victims: Api<Pod> = Api::namespaced(client.clone(), &serving);
    let forgers: Api<Pod> = Api::namespaced(client.clone(), &other);
    let one = |n: &str| ListParams::default().fields(&format!("metadata.name={n}"));

    victims
        .create(&PostParams::default(), &lws_pod("leader", "0123abcd"))
        .await
        .unwrap();
    let up = env
        .wait_pods(&victims, &one("leader"), "the victim's pod running", |ps| {
            ps.len() == 1 && ps.iter().all(running)
        })
        .await;
    let victim_job = job_id(&up[0]).unwrap().to_owned();

    // The same group key (a hash anyone can compute) from another namespace: a group of its
    // own, with its own job charged to its own namespace.
    forgers
        .create(&PostParams::default(), &lws_pod("copycat", "0123abcd"))
        .await
        .unwrap();
    let up = env
        .wait_pods(
            &forgers,
            &one("copycat"),
            "the copycat running on its own job",
            |ps| ps.len() == 1 && ps.iter().all(running),
        )
        .await;
    let forged_job = job_id(&up[0]).unwrap().to_owned();
    assert_ne!(victim_job, forged_job, "bound onto the victim's job");
    let users = env.cli(&["squeue", "-h", "-o", "%i|%u"]);
    assert!(
        users
            .lines()
            .any(|l| l == format!("{victim_job}|{serving}"))
            && users.lines().any(|l| l == format!("{forged_job}|{other}")),
        "each job charged to its own namespace: {users}"
    );

    // Deleting the copycat ends its own job, never the victim's.
    forgers
        .delete("copycat", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_cli(
        &["sacct", "-n", "-X", "-P", "-j", &forged_job, "-o", "State"],
        "the copycat's job over",
        |out| out.trim() == "COMPLETED",
    )
    .await;
    let state = env.cli(&["squeue", "-h", "-j", &victim_job, "-o", "%T"]);
    assert_eq!(state.trim(), "RUNNING", "the victim's job still runs");
}

/// Pod `index` of LeaderWorkerSet group `serve2` (size 2), two GPUs: one pod fills a node.
fn wide_lws_pod(index: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("infer-{index}"),
            "labels": {"app": "infer",
                       "leaderworkerset.sigs.k8s.io/group-key": "serve2",
                       "leaderworkerset.sigs.k8s.io/name": "infer",
                       "leaderworkerset.sigs.k8s.io/worker-index": index.to_string()},
            "annotations": {"leaderworkerset.sigs.k8s.io/size": "2"},
        },
        "spec": {
            "schedulerName": "tandem",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", "sleep 300"],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "2"}}}],
        },
    }))
    .unwrap()
}

/// A drain (a worker-set rollout, an administrator's maintenance) of one node of a serving
/// group spread over two: only that node's pod is evicted (its PodDisruptionBudget honoured
/// until the eviction timeout), the placeholder hands back that node alone and serves on
/// from the other, whose pod is never touched; resumed, the node takes batch work beside
/// the group. The old controller ended the whole group at the drain's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_of_a_serving_group_is_handed_back_alone() {
    let test = "a_drained_node_of_a_serving_group_is_handed_back_alone";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("s1", 8, 16, 2)
            .node("s2", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&["--eviction-timeout", "3"]);
    let ns = env.ns("serving").to_owned();
    let client = cluster.client();
    refusing_budget(&client, &ns, "infer").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..2 {
        pods.create(&PostParams::default(), &wide_lws_pod(i))
            .await
            .unwrap();
    }
    let infer = ListParams::default().labels("app=infer");
    let up = env
        .wait_pods(&pods, &infer, "both pods of the group running", |ps| {
            ps.len() == 2 && ps.iter().all(running)
        })
        .await;
    let job = job_id(&up[0]).unwrap().to_owned();
    assert_eq!(job_id(&up[1]), Some(job.as_str()), "one placeholder");
    let (gone, kept) = (&up[0], &up[1]);
    let drained = node_of(gone).unwrap().to_owned();
    let serving = node_of(kept).unwrap().to_owned();
    assert_ne!(drained, serving);
    let kept_uid = kept.metadata.uid.clone().unwrap();
    let gone_name = gone.metadata.name.clone().unwrap();

    env.cli(&[
        "scontrol",
        "update",
        &format!("NodeName={drained}"),
        "State=DRAIN",
        "Reason=rollout",
    ]);
    // The budget refuses the eviction: the pod runs on for now, until the timeout; then
    // only the drained node's pod is deleted.
    refused_until_the_deadline(&env, &client, &ns, &infer, &gone_name).await;
    env.wait_cli(
        &["squeue", "-h", "-j", &job, "-o", "%T|%N"],
        "the placeholder on the serving node alone",
        |o| o.trim() == format!("RUNNING|{serving}"),
    )
    .await;
    env.wait_cli(
        &["sinfo", "-h", "-n", &drained, "-o", "%T"],
        "the drained node idle and drained",
        |o| o.trim() == "drained",
    )
    .await;
    let kept_now = pods
        .get(kept.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(kept_now.metadata.uid.as_deref(), Some(kept_uid.as_str()));
    assert!(running(&kept_now), "{:?}", kept_now.status);

    // Resumed, the node takes a batch job while the group serves on from the other.
    env.cli(&[
        "scontrol",
        "update",
        &format!("NodeName={drained}"),
        "State=RESUME",
    ]);
    let release = env.dir().join("release-batch");
    let batch = env.sbatch(
        &["-w", &drained, "--gpus-per-node=2"],
        &tandem_e2e::bridgekit::held(&release),
    );
    env.wait_cli(
        &["squeue", "-h", "-j", batch.trim(), "-o", "%T"],
        "the batch job running on the handed-back node",
        |o| o.trim() == "RUNNING",
    )
    .await;
    let kept_now = pods
        .get(kept.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(kept_now.metadata.uid.as_deref(), Some(kept_uid.as_str()));
    assert!(running(&kept_now));
    std::fs::write(&release, "").unwrap();
    watch.finish().assert_no_overlap();
}
