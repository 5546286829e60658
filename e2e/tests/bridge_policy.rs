//! One policy for pods and batch jobs, end to end through the bridge:
//! - a high-QOS batch job preempts a low-QOS serving pod's placeholder; the bridge evicts the
//!   pod (Eviction API: the API server marks it `DisruptionTarget`, a delete would not), and the Deployment's replacement waits `PodScheduled=False`,
//!   `Unschedulable`, with the controller's reason in the message and a `FailedScheduling`
//!   Event, until the batch job ends;
//! - fair share across kinds: an account that used more (inference pods plus a training job)
//!   ranks after the other account for both a pending batch job and a pending pod.
//!
//! Both also run the partition watcher: no node runs a batch job and a pod at once.

use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tandem_e2e::bridgekit::{
    BridgeEnv, Setup, deployment, describe, held, job_id, node_of, running, unschedulable,
};
use tandem_e2e::testkit::TestCluster;

/// Names of the pods seen with `DisruptionTarget=True` (reason `EvictionByEvictionAPI`),
/// collected by a watch from now on.
fn evictions_seen(pods: Api<Pod>) -> Arc<Mutex<BTreeSet<String>>> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(ev) = events.next().await {
            let Ok(p) = ev else { continue };
            let marked = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| {
                    c.type_ == "DisruptionTarget"
                        && c.status == "True"
                        && c.reason.as_deref() == Some("EvictionByEvictionAPI")
                });
            if marked && let Some(name) = p.metadata.name {
                out.lock().unwrap().insert(name);
            }
        }
    });
    seen
}

fn config(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_qos_batch_job_preempts_a_low_qos_serving_pod_which_then_waits_unschedulable() {
    let test = "a_high_qos_batch_job_preempts_a_low_qos_serving_pod_which_then_waits_unschedulable";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = config(
        cfg_dir.path(),
        r#"
        [[account]]
        name = "serve"
        [[account]]
        name = "train"
        [[qos]]
        name = "low"
        preempt_mode = "cancel"
        grace_time = 1
        [[qos]]
        name = "high"
        priority = 100
        preempt = ["low"]
        "#,
    );
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("q1", 8, 16, 2)
            .node("q2", 8, 16, 2)
            .namespace("serving", "serve", json!({"qos": "low"}))
            .controller_arg("--config")
            .controller_arg(&cfg),
    )
    .await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&[]);
    let ns = env.ns("serving").to_owned();
    let client = cluster.client();
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let web = ListParams::default().labels("app=web");

    // Two whole-node replicas fill the pool.
    deploys
        .create(&PostParams::default(), &deployment("web", 2, 2))
        .await
        .unwrap();
    let before = env
        .wait_pods(&pods, &web, "2 running web pods", |ps| {
            ps.len() == 2 && ps.iter().all(running)
        })
        .await;
    let q = env.cli(&["squeue", "-h", "-o", "%i|%j|%q"]);
    assert_eq!(
        q.lines().filter(|l| l.ends_with("|low")).count(),
        2,
        "the namespace's QOS applies to its placeholders: {q}"
    );

    // Pods the API server marks as evicted (`DisruptionTarget`, reason
    // `EvictionByEvictionAPI`): a plain delete would not mark them.
    let evicted = evictions_seen(pods.clone());

    // A high-QOS batch job needing a whole node preempts one placeholder.
    let release = env.dir().join("release");
    let high = env.sbatch(
        &["-A", "train", "--qos", "high", "-N1", "--gpus-per-node=2"],
        &held(&release),
    );
    env.wait_cli(
        &["squeue", "-h", "-j", &high, "-o", "%T"],
        "the high-QOS job running",
        |o| o.trim() == "RUNNING",
    )
    .await;
    let high_node = env
        .cli(&["squeue", "-h", "-j", &high, "-o", "%N"])
        .trim()
        .to_owned();
    // Its victim's pod was evicted (gone, replaced by the ReplicaSet); the other still runs.
    let victim: Vec<&Pod> = before
        .iter()
        .filter(|p| node_of(p) == Some(high_node.as_str()))
        .collect();
    assert_eq!(
        victim.len(),
        1,
        "{high_node}: {:?}",
        before.iter().map(describe).collect::<Vec<_>>()
    );
    let victim_name = victim[0].metadata.name.clone().unwrap();
    let after = env
        .wait_pods(
            &pods,
            &web,
            "the victim gone and its replacement Unschedulable",
            |ps| {
                ps.len() == 2
                    && ps
                        .iter()
                        .all(|p| p.metadata.name.as_ref() != Some(&victim_name))
                    && ps
                        .iter()
                        .any(|p| node_of(p).is_none() && unschedulable(p).is_some())
            },
        )
        .await;
    let replacement = after.iter().find(|p| node_of(p).is_none()).unwrap();
    let survivor = after.iter().find(|p| node_of(p).is_some()).unwrap();
    assert!(running(survivor), "{}", describe(survivor));
    let message = unschedulable(replacement).unwrap().to_owned();
    assert!(
        ["Resources", "Priority"]
            .iter()
            .any(|r| message.contains(r)),
        "the controller's reason is in the message: {message:?}"
    );
    let victim_job = job_id(victim[0]).unwrap();
    let st = env.cli(&["sacct", "-n", "-X", "-j", victim_job, "-o", "State"]);
    assert_eq!(st.trim(), "PREEMPTED", "the victim's placeholder: {st}");
    let seen = evicted.lock().unwrap().clone();
    assert!(
        seen.contains(&victim_name),
        "the victim was evicted through the Eviction API (DisruptionTarget), not deleted; \
         pods seen evicted: {seen:?}"
    );
    assert_eq!(seen.len(), 1, "only the victim was evicted: {seen:?}");
    // The FailedScheduling Event, as kube-scheduler writes it.
    let events: Api<KubeEvent> = Api::namespaced(client.clone(), &ns);
    let rep_name = replacement.metadata.name.clone().unwrap();
    let what = format!("a FailedScheduling Event for {rep_name} saying {message:?}");
    env.wait_event(&events, &what, |e| {
        e.reason.as_deref() == Some("FailedScheduling")
            && e.type_.as_deref() == Some("Warning")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&rep_name)
            // The reason may move (Priority, then Resources); the Event series keeps
            // the first words it recorded.
            && e.note
                .as_deref()
                .is_some_and(|n| n.starts_with("waiting in Tandem's queue: "))
    })
    .await;

    // The batch job ends: the replacement is bound to the node it had.
    std::fs::write(&release, "").unwrap();
    let back = env
        .wait_pods(&pods, &web, "both web pods running again", |ps| {
            ps.len() == 2 && ps.iter().all(running)
        })
        .await;
    assert!(back.iter().any(|p| node_of(p) == Some(high_node.as_str())));
    watch.finish().assert_no_overlap();
}

/// Rows of `tandem sshare -a -P`, keyed by (account, user).
fn sshare(env: &BridgeEnv) -> BTreeMap<(String, String), BTreeMap<String, String>> {
    let out = env.cli(&["sshare", "-a", "-P"]);
    let mut lines = out.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split('|')
        .map(|h| h.trim().to_owned())
        .collect();
    let mut rows = BTreeMap::new();
    for l in lines {
        let row: BTreeMap<String, String> = header
            .iter()
            .cloned()
            .zip(l.split('|').map(|v| v.trim().to_owned()))
            .collect();
        let key = (
            row.get("Account").cloned().unwrap_or_default(),
            row.get("User").cloned().unwrap_or_default(),
        );
        rows.insert(key, row);
    }
    rows
}

/// An account's own row (no user).
fn raw_usage(env: &BridgeEnv, account: &str) -> f64 {
    let rows = sshare(env);
    let row = rows
        .get(&(account.to_owned(), String::new()))
        .unwrap_or_else(|| panic!("no sshare row for {account}: {rows:?}"));
    row.get("RawUsage")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("RawUsage of {account}: {row:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_that_used_more_ranks_after_for_both_pods_and_batch_jobs() {
    let test = "an_account_that_used_more_ranks_after_for_both_pods_and_batch_jobs";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let cfg_dir = tempfile::tempdir().unwrap();
    // Fair share is the only factor that differs between the accounts' jobs.
    let cfg = config(
        cfg_dir.path(),
        r#"
        [priority_weights]
        age = 0
        job_size = 0
        fairshare = 10000
        [billing_weights]
        cpu = 0
        mem_gb = 0
        gpu = 1
        [[account]]
        name = "heavy"
        shares = 50
        [[account]]
        name = "light"
        shares = 50
        [[account]]
        name = "filler"
        shares = 50
        "#,
    );
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("f1", 8, 16, 2)
            .node("f2", 8, 16, 2)
            .namespace("heavy", "heavy", json!({}))
            .namespace("light", "light", json!({}))
            .controller_arg("--config")
            .controller_arg(&cfg),
    )
    .await;
    let watch = env.watch_partition(&cluster.server().unwrap().url());
    let _bridge = env.spawn_bridge(&[]);
    let client = cluster.client();
    let heavy_ns = env.ns("heavy").to_owned();
    let light_ns = env.ns("light").to_owned();
    let heavy_pods: Api<Pod> = Api::namespaced(client.clone(), &heavy_ns);
    let light_pods: Api<Pod> = Api::namespaced(client.clone(), &light_ns);
    let heavy_deploys: Api<Deployment> = Api::namespaced(client.clone(), &heavy_ns);

    // `heavy` serves: an inference pod holds a node for a while, then goes.
    assert_eq!(raw_usage(&env, "heavy"), 0.0);
    heavy_deploys
        .create(&PostParams::default(), &deployment("infer", 1, 2))
        .await
        .unwrap();
    let infer = ListParams::default().labels("app=infer");
    env.wait_pods(&heavy_pods, &infer, "the inference pod running", |ps| {
        ps.len() == 1 && ps.iter().all(running)
    })
    .await;
    // Usage is charged while the placeholder holds its node (the controller charges
    // running jobs every scheduling interval, 5 s), not only once it ended.
    env.wait_cli(
        &["sshare", "-a", "-P"],
        "heavy's usage to grow from its pod",
        |_| raw_usage(&env, "heavy") > 0.0,
    )
    .await;
    heavy_deploys
        .delete("infer", &Default::default())
        .await
        .unwrap();
    env.wait_cli(
        &["squeue", "-h", "-o", "%j"],
        "the inference placeholder to end",
        |o| !o.contains("/infer"),
    )
    .await;
    let inference_only = raw_usage(&env, "heavy");
    assert!(inference_only > 0.0);
    assert_eq!(raw_usage(&env, "light"), 0.0, "light used nothing yet");

    // And trains: a batch job's usage adds to the same account.
    let train = env.sbatch(&["-A", "heavy", "-N1", "--gpus-per-node=2"], "sleep 2");
    env.wait_cli(
        &["sacct", "-n", "-X", "-j", &train, "-o", "State"],
        "the training job COMPLETED",
        |o| o.trim() == "COMPLETED",
    )
    .await;
    let both = raw_usage(&env, "heavy");
    assert!(
        both > inference_only,
        "training adds to the account inference charged: {inference_only} -> {both}"
    );

    // The pool is full (a third account holds it); each account queues a batch job and a pod.
    let release = env.dir().join("release");
    let filler = env.sbatch(
        &["-A", "filler", "-N2", "--gpus-per-node=2"],
        &held(&release),
    );
    env.wait_cli(
        &["squeue", "-h", "-j", &filler, "-o", "%T"],
        "the filler running",
        |o| o.trim() == "RUNNING",
    )
    .await;
    let batch_of = |account: &str| env.sbatch(&["-A", account, "-N1", "--gpus-per-node=2"], "true");
    // `heavy` submits first: any order effect would favour it.
    let heavy_batch = batch_of("heavy");
    let light_batch = batch_of("light");
    let waiting_pod = |name: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep 300"],
                    "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        }))
        .unwrap()
    };
    heavy_pods
        .create(&PostParams::default(), &waiting_pod("serve"))
        .await
        .unwrap();
    light_pods
        .create(&PostParams::default(), &waiting_pod("serve"))
        .await
        .unwrap();
    let pending = env
        .wait_cli(
            &["squeue", "-h", "-t", "PD", "-o", "%i|%j|%a"],
            "four pending jobs: two batch, two placeholders",
            |o| o.lines().count() == 4,
        )
        .await;
    let id_of = |name: &str| {
        pending
            .lines()
            .find(|l| l.split('|').nth(1) == Some(name))
            .and_then(|l| l.split('|').next())
            .unwrap_or_else(|| panic!("no pending {name}: {pending}"))
            .to_owned()
    };
    let heavy_pg = id_of(&format!("{heavy_ns}/serve"));
    let light_pg = id_of(&format!("{light_ns}/serve"));

    // sprio: the fair-share factor, and so the priority, of heavy's jobs is lower, for
    // both kinds.
    let sprio: Value = serde_json::from_str(&env.cli(&["sprio", "--json"])).unwrap();
    let prio = |id: &str| -> (f64, f64) {
        let jobs = sprio
            .get("jobs")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("sprio --json: {sprio}"));
        let j = jobs
            .iter()
            .find(|j| {
                j.get("job_id")
                    .map(|v| v.to_string().trim_matches('"').to_owned())
                    == Some(id.to_owned())
            })
            .unwrap_or_else(|| panic!("job {id} in sprio: {sprio}"));
        let num = |ptr: &str| {
            j.pointer(ptr)
                .and_then(Value::as_f64)
                .unwrap_or_else(|| panic!("{ptr} of job {id}: {j}"))
        };
        (num("/priority"), num("/normalized/fairshare"))
    };
    for (heavy, light, kind) in [
        (&heavy_batch, &light_batch, "batch jobs"),
        (&heavy_pg, &light_pg, "pod groups"),
    ] {
        let (hp, hf) = prio(heavy);
        let (lp, lf) = prio(light);
        assert!(
            hf < lf && hp < lp,
            "{kind}: heavy's job {heavy} (priority {hp}, fair share {hf}) ranks after light's {light} ({lp}, {lf}): {sprio}"
        );
    }
    // The pods say why they wait.
    for api in [&heavy_pods, &light_pods] {
        let p = env
            .wait_pods(
                api,
                &ListParams::default(),
                "the waiting pod Unschedulable",
                |ps| ps.len() == 1 && unschedulable(&ps[0]).is_some(),
            )
            .await;
        assert!(node_of(&p[0]).is_none());
    }
    std::fs::write(&release, "").unwrap();
    watch.finish().assert_no_overlap();
}
