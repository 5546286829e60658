//! Gangs through the bridge: a 4-pod scheduler-plugins PodGroup (`minMember: 4`) and a
//! JobSet of two replicated jobs are each one placeholder job, bound all at once or not at
//! all. With room for only three pods none is bound (each waits `Unschedulable`, saying
//! why); when room appears every pod is bound, by the same job.
//!
//! The harness runs no PodGroup or JobSet controller: the test creates their objects (the
//! bridge reads `minMember` and the replicated jobs from them) and the pods with the labels
//! those controllers put on them.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tandem_e2e::bridgekit::{BridgeEnv, Setup, describe, held, job_id, node_of, unschedulable};
use tandem_e2e::testkit::TestCluster;

/// A namespaced CRD that keeps whatever its objects say.
fn crd(group: &str, version: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                      "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap()
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A one-GPU pod with `labels`, scheduled by Tandem.
fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": "busybox",
                     "command": ["sh", "-c", "sleep 300"],
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                   "limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap()
}

/// Every pod of a gang: none bound while room is short (and each says why), then all bound
/// by one job once `make_room` ran.
async fn all_or_nothing(
    env: &BridgeEnv,
    pods: &Api<Pod>,
    lp: &ListParams,
    n: usize,
    make_room: impl std::future::Future<Output = ()>,
) {
    let waiting = env
        .wait_pods(pods, lp, "every gang pod Unschedulable", |ps| {
            ps.len() == n && ps.iter().all(|p| unschedulable(p).is_some())
        })
        .await;
    for p in &waiting {
        let why = unschedulable(p).unwrap();
        assert!(
            !why.is_empty(),
            "the reason is in the message: {}",
            describe(p)
        );
    }
    // The placeholder waits in the queue: give the controller several cycles to (wrongly)
    // place part of the gang, then check that nothing was bound.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = pods.list(lp).await.unwrap().items;
    let bound: Vec<String> = still
        .iter()
        .filter(|p| node_of(p).is_some())
        .map(describe)
        .collect();
    assert!(
        bound.is_empty(),
        "no pod of a gang without room is bound: {bound:?}"
    );

    make_room.await;
    let up = env
        .wait_pods(pods, lp, "every gang pod bound", |ps| {
            ps.len() == n
                && ps
                    .iter()
                    .all(|p| node_of(p).is_some() && job_id(p).is_some())
        })
        .await;
    let jobs: BTreeSet<&str> = up.iter().filter_map(job_id).collect();
    assert_eq!(
        jobs.len(),
        1,
        "one placeholder job binds the whole gang: {jobs:?}"
    );
    let mut per_node = BTreeMap::<&str, usize>::new();
    for p in &up {
        *per_node.entry(node_of(p).unwrap()).or_default() += 1;
    }
    assert!(per_node.values().all(|c| *c <= 2), "{per_node:?}");
}

/// Two pool nodes of 2 GPUs, g1 and g2, the namespace `ml`, and `crds`.
async fn two_nodes(cluster: &TestCluster, crds: Vec<CustomResourceDefinition>) -> BridgeEnv {
    BridgeEnv::start(
        cluster,
        Setup::new(crds)
            .node("g1", 8, 16, 2)
            .node("g2", 8, 16, 2)
            .namespace("ml", "root", json!({})),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_group_and_a_jobset_are_each_bound_all_at_once_or_not_at_all() {
    let test = "a_pod_group_and_a_jobset_are_each_bound_all_at_once_or_not_at_all";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut crds = tandem_operator::crd::all();
    crds.push(crd(
        "scheduling.x-k8s.io",
        "v1alpha1",
        "PodGroup",
        "podgroups",
    ));
    crds.push(crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"));
    let mut env = two_nodes(&cluster, crds).await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("ml").to_owned();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // One GPU of the pool's four is held by a bridged pod: room for three one-GPU pods,
    // on kube-mode nodes.
    pods.create(
        &PostParams::default(),
        &pod("blocker", json!({"role": "blocker"})),
    )
    .await
    .unwrap();
    env.wait_pods(
        &pods,
        &ListParams::default().labels("role=blocker"),
        "the blocker pod bound",
        |ps| ps.len() == 1 && node_of(&ps[0]).is_some(),
    )
    .await;

    // A PodGroup of four.
    let groups: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &resource("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
    );
    let pg: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "gang"}, "spec": {"minMember": 4},
    }))
    .unwrap();
    groups.create(&PostParams::default(), &pg).await.unwrap();
    for i in 0..4 {
        let p = pod(
            &format!("gang-{i}"),
            json!({"scheduling.x-k8s.io/pod-group": "gang", "gang": "yes"}),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let gang = ListParams::default().labels("gang=yes");
    let blocker_gone = async {
        pods.delete("blocker", &Default::default()).await.unwrap();
    };
    all_or_nothing(&env, &pods, &gang, 4, blocker_gone).await;
    let q = env.cli(&["squeue", "-h", "-o", "%j|%T"]);
    assert!(
        q.lines().any(|l| l == format!("{ns}/gang|RUNNING")),
        "squeue shows the group as one job: {q}"
    );
    pods.delete_collection(&Default::default(), &gang)
        .await
        .unwrap();
    env.wait_cli(
        &["squeue", "-h", "-o", "%j"],
        "the gang's job to end",
        |o| !o.contains("/gang"),
    )
    .await;

    // A JobSet of two replicated jobs (a leader of one pod, workers of three): four pods,
    // while a batch job holds one GPU (and so its node, in batch mode).
    let release2 = env.dir().join("release-2");
    let blocker2 = env.sbatch(&["--gpus=1"], &held(&release2));
    env.wait_cli(
        &["squeue", "-h", "-j", &blocker2, "-o", "%T"],
        "the second blocker running",
        |o| o.trim() == "RUNNING",
    )
    .await;
    let jobsets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    );
    let template = json!({"spec": {"parallelism": 1, "completions": 1,
        "template": {"spec": {"containers": []}}}});
    let mut workers = template.clone();
    workers["spec"]["parallelism"] = json!(3);
    workers["spec"]["completions"] = json!(3);
    let js: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train"},
        "spec": {"replicatedJobs": [
            {"name": "leader", "replicas": 1, "template": template},
            {"name": "workers", "replicas": 1, "template": workers},
        ]},
    }))
    .unwrap();
    let js = jobsets.create(&PostParams::default(), &js).await.unwrap();
    let uid = js.metadata.uid.clone().unwrap();
    let members = [
        ("leader", 0),
        ("workers", 0),
        ("workers", 1),
        ("workers", 2),
    ];
    for (rj, index) in members {
        let job = format!("train-{rj}-0");
        let p = pod(
            &format!("{job}-{index}"),
            json!({
                "jobset.sigs.k8s.io/jobset-name": "train",
                "jobset.sigs.k8s.io/jobset-uid": uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rj,
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
                "batch.kubernetes.io/job-completion-index": index.to_string(),
                "set": "train",
            }),
        );
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let set = ListParams::default().labels("set=train");
    let release = async { std::fs::write(&release2, "").unwrap() };
    all_or_nothing(&env, &pods, &set, 4, release).await;
    let q = env.cli(&["squeue", "-h", "-o", "%j|%T"]);
    assert_eq!(
        q.lines()
            .filter(|l| l.starts_with(&format!("{ns}/train|")))
            .count(),
        1,
        "the whole JobSet is one job: {q}"
    );

    watch.finish().assert_no_overlap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_started_in_order_reserves_its_whole_gang_and_binds_each_stage_as_it_comes() {
    let test = "a_jobset_started_in_order_reserves_its_whole_gang_and_binds_each_stage_as_it_comes";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut crds = tandem_operator::crd::all();
    crds.push(crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"));
    let mut env = two_nodes(&cluster, crds).await;
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("ml").to_owned();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let jobsets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    );
    // JobSet's InOrder startup: the workers' Job is created only once the leader runs, so
    // a gang that waited for all four pods before asking for nodes would wait forever.
    let template = |n: u32| {
        json!({"spec": {"parallelism": n, "completions": n,
            "template": {"spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "1"}}}]}}}})
    };
    let js: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "ordered"},
        "spec": {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
            {"name": "leader", "replicas": 1, "template": template(1)},
            {"name": "workers", "replicas": 1, "template": template(3)},
        ]},
    }))
    .unwrap();
    jobsets.create(&PostParams::default(), &js).await.unwrap();
    let member = |rj: &str, index: u32| {
        let job = format!("ordered-{rj}-0");
        pod(
            &format!("{job}-{index}"),
            json!({
                "jobset.sigs.k8s.io/jobset-name": "ordered",
                "jobset.sigs.k8s.io/replicatedjob-name": rj,
                "batch.kubernetes.io/job-name": job,
                "batch.kubernetes.io/job-completion-index": index.to_string(),
                "set": "ordered",
            }),
        )
    };
    let set = ListParams::default().labels("set=ordered");
    pods.create(&PostParams::default(), &member("leader", 0))
        .await
        .unwrap();
    let leader = env
        .wait_pods(&pods, &set, "the leader bound alone", |ps| {
            ps.len() == 1 && ps.iter().all(|p| node_of(p).is_some())
        })
        .await;
    let job = job_id(&leader[0]).unwrap().to_owned();
    // The placeholder holds the whole gang's four GPUs from the start.
    let held = env.cli(&["squeue", "-h", "-j", &job, "-o", "%D|%b"]);
    assert!(
        held.trim().starts_with("2|"),
        "two nodes held for four pods: {held}"
    );
    for i in 0..3 {
        pods.create(&PostParams::default(), &member("workers", i))
            .await
            .unwrap();
    }
    let up = env
        .wait_pods(&pods, &set, "the workers bound to the same job", |ps| {
            ps.len() == 4 && ps.iter().all(|p| node_of(p).is_some())
        })
        .await;
    let jobs: BTreeSet<&str> = up.iter().filter_map(job_id).collect();
    assert_eq!(
        jobs,
        BTreeSet::from([job.as_str()]),
        "one job for every stage"
    );
    let mut per_node = BTreeMap::<&str, usize>::new();
    for p in &up {
        *per_node.entry(node_of(p).unwrap()).or_default() += 1;
    }
    assert!(per_node.values().all(|c| *c <= 2), "{per_node:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_ready_leaderworkerset_binds_its_leader_first_on_the_whole_gangs_nodes() {
    let test = "a_leader_ready_leaderworkerset_binds_its_leader_first_on_the_whole_gangs_nodes";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let mut crds = tandem_operator::crd::all();
    crds.push(crd(
        "leaderworkerset.x-k8s.io",
        "v1",
        "LeaderWorkerSet",
        "leaderworkersets",
    ));
    let mut env = two_nodes(&cluster, crds).await;
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("ml").to_owned();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &resource(
            "leaderworkerset.x-k8s.io",
            "v1",
            "LeaderWorkerSet",
            "leaderworkersets",
        ),
    );
    // LeaderReady: the workers' StatefulSet is made only once the leader is Ready.
    let template = json!({"spec": {"containers": [{"name": "c", "image": "busybox",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                      "limits": {"nvidia.com/gpu": "1"}}}]}});
    let lws: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "infer"},
        "spec": {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {
            "size": 4, "workerTemplate": template}},
    }))
    .unwrap();
    sets.create(&PostParams::default(), &lws).await.unwrap();
    let member = |name: &str, index: u32| {
        let mut p = pod(
            name,
            json!({
                "leaderworkerset.sigs.k8s.io/name": "infer",
                "leaderworkerset.sigs.k8s.io/group-key": "5f1e2d3c",
                "leaderworkerset.sigs.k8s.io/worker-index": index.to_string(),
                "set": "infer",
            }),
        );
        p.metadata.annotations = Some(
            [(
                "leaderworkerset.sigs.k8s.io/size".to_owned(),
                "4".to_owned(),
            )]
            .into(),
        );
        p
    };
    let set = ListParams::default().labels("set=infer");
    pods.create(&PostParams::default(), &member("infer-0", 0))
        .await
        .unwrap();
    let leader = env
        .wait_pods(&pods, &set, "the leader bound alone", |ps| {
            ps.len() == 1 && ps.iter().all(|p| node_of(p).is_some())
        })
        .await;
    let job = job_id(&leader[0]).unwrap().to_owned();
    for i in 1..4 {
        pods.create(&PostParams::default(), &member(&format!("infer-0-{i}"), i))
            .await
            .unwrap();
    }
    let up = env
        .wait_pods(&pods, &set, "the workers bound to the leader's job", |ps| {
            ps.len() == 4 && ps.iter().all(|p| node_of(p).is_some())
        })
        .await;
    let jobs: BTreeSet<&str> = up.iter().filter_map(job_id).collect();
    assert_eq!(
        jobs,
        BTreeSet::from([job.as_str()]),
        "one job for the whole group"
    );
}
