//! The bridge as two replicas and across crashes, end to end on the harness (issue #12):
//!
//! - two `tandem-bridge run` replicas contend for one `coordination.k8s.io` Lease: exactly
//!   one schedules; when the leader is killed (SIGKILL) the standby takes the Lease within
//!   15 s and binds pods created after the kill; a leader stopped with SIGTERM releases the
//!   Lease so a standby takes it at once; a leader that stalls (SIGSTOP) past its renew
//!   deadline loses the Lease and, resumed, exits without scheduling anything;
//! - killing the bridge and the controller mid-way (a gang running, groups pending, one pod
//!   created just before the kill and one while both are down) and starting them again loses
//!   and duplicates no placeholder job: every group ends up with exactly one job, running pods
//!   stay bound and running, pending ones are bound once room appears.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tandem_e2e::bridgekit::{BridgeEnv, Proc, Setup, T, job_id, node_of, running};
use tandem_e2e::testkit::{TestCluster, wait_for};

/// The Lease the bridges contend for (the flag's default).
const LEASE: &str = "tandem-bridge";

fn one_gpu_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tandem", "restartPolicy": "Never",
            "containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", "sleep 600"],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "1"}}}],
        },
    }))
    .unwrap()
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Polls the Lease every 50 ms until `cond` holds; the Lease and how long it took.
async fn lease_until(
    leases: &Api<Lease>,
    env: &BridgeEnv,
    what: &str,
    cond: impl Fn(&Lease) -> bool,
) -> (Lease, Duration) {
    let start = Instant::now();
    loop {
        if let Ok(Some(l)) = leases.get_opt(LEASE).await
            && cond(&l)
        {
            return (l, start.elapsed());
        }
        assert!(
            start.elapsed() < T,
            "timed out waiting for the Lease {what}\n{}",
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_running(pods: &Api<Pod>, env: &BridgeEnv, name: &str) -> Pod {
    match wait_for(pods, name, "bound and Running", T, running).await {
        Ok(p) => p,
        Err(e) => panic!("{e}\n{}", env.logs()),
    }
}

/// Whether the log file `log` (in the env's dir) contains `text`.
fn log_says(env: &BridgeEnv, log: &str, text: &str) -> bool {
    std::fs::read_to_string(env.dir().join(log))
        .unwrap_or_default()
        .contains(text)
}

/// Whether `log` says its bridge became the leader.
fn led(env: &BridgeEnv, log: &str) -> bool {
    log_says(env, log, "leading: this replica now schedules")
}

#[tokio::test]
async fn a_standby_bridge_takes_over_within_15_s_of_the_leaders_death() {
    let test = "a_standby_bridge_takes_over_within_15_s_of_the_leaders_death";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("le1", 8, 16, 2)
            .node("le2", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let ns = env.ns("serving").to_owned();
    let leases: Api<Lease> = Api::namespaced(client.clone(), env.cluster_namespace());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Two replicas (bridge-1.log, bridge-2.log): exactly one leads.
    let mut replicas: BTreeMap<String, (Proc, &str)> = BTreeMap::new();
    replicas.insert(
        "bridge-a".into(),
        (
            env.spawn_bridge(&["--identity", "bridge-a"]),
            "bridge-1.log",
        ),
    );
    replicas.insert(
        "bridge-b".into(),
        (
            env.spawn_bridge(&["--identity", "bridge-b"]),
            "bridge-2.log",
        ),
    );
    let (lease, _) = lease_until(&leases, &env, "held", |l| holder(l).is_some()).await;
    let leader = holder(&lease).unwrap().to_owned();
    assert!(replicas.contains_key(&leader), "{leader:?}");
    let standby = replicas.keys().find(|k| **k != leader).unwrap().to_owned();
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(10));
    assert!(spec.renew_time.is_some() && spec.acquire_time.is_some());

    // The leader binds; the standby stands by (and says so) without scheduling.
    pods.create(&PostParams::default(), &one_gpu_pod("before"))
        .await
        .unwrap();
    wait_running(&pods, &env, "before").await;
    env.wait_until("the standby to report the leader", || {
        log_says(&env, replicas[&standby].1, "standing by")
    })
    .await;
    assert!(led(&env, replicas[&leader].1), "{}", env.logs());
    assert!(!led(&env, replicas[&standby].1), "{}", env.logs());
    // The leader renews: renewTime moves while the holder stays.
    let first_renew = spec.renew_time.clone();
    let (renewed, _) = lease_until(&leases, &env, "renewed", |l| {
        holder(l) == Some(leader.as_str())
            && l.spec.as_ref().and_then(|s| s.renew_time.clone()) != first_renew
    })
    .await;
    let transitions = renewed.spec.as_ref().and_then(|s| s.lease_transitions);

    // SIGKILL the leader: the standby takes the Lease within 15 s.
    replicas.get_mut(&leader).unwrap().0.kill();
    let killed = Instant::now();
    let (taken, _) = lease_until(&leases, &env, "taken by the standby", |l| {
        holder(l) == Some(standby.as_str())
    })
    .await;
    let takeover = killed.elapsed();
    println!("takeover after SIGKILL of the leader: {takeover:?}");
    assert!(
        takeover < Duration::from_secs(15),
        "the standby took {takeover:?}\n{}",
        env.logs()
    );
    assert_eq!(
        taken.spec.as_ref().and_then(|s| s.lease_transitions),
        transitions.map(|t| t + 1),
        "one more transition"
    );

    // A pod created after the kill is bound by the new leader; the old pod stays put.
    pods.create(&PostParams::default(), &one_gpu_pod("after"))
        .await
        .unwrap();
    wait_running(&pods, &env, "after").await;
    assert!(led(&env, replicas[&standby].1), "{}", env.logs());
    let before = pods
        .get("before")
        .await
        .unwrap_or_else(|e| panic!("before: {e}\n{}", env.logs()));
    assert!(running(&before), "{before:?}");

    // A fresh standby, then SIGTERM to the leader: it releases the Lease on the way out
    // and the standby takes it at its next read (one 2 s retry period), not a full term.
    let fresh = env.spawn_bridge(&["--identity", "bridge-c"]);
    env.wait_until("the new standby to report the leader", || {
        log_says(&env, "bridge-3.log", "standing by")
    })
    .await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(replicas[&standby].0.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let termed = Instant::now();
    lease_until(&leases, &env, "taken by bridge-c", |l| {
        holder(l) == Some("bridge-c")
    })
    .await;
    let handover = termed.elapsed();
    println!("takeover after SIGTERM of the leader (Lease released): {handover:?}");
    assert!(
        handover < Duration::from_secs(8),
        "a released Lease is taken within a retry period or so, not a 10 s term: {handover:?}\n{}",
        env.logs()
    );
    env.wait_until("the old leader to exit", || {
        replicas.get_mut(&standby).unwrap().0.exited()
    })
    .await;
    assert!(
        log_says(&env, replicas[&standby].1, "released the Lease"),
        "{}",
        env.logs()
    );
    pods.create(&PostParams::default(), &one_gpu_pod("last"))
        .await
        .unwrap();
    wait_running(&pods, &env, "last").await;

    // A leader that stalls (SIGSTOP) past its renew deadline: a standby takes over, and the
    // stalled one, resumed, stops at once (exits) instead of scheduling beside it.
    let mut fresh = fresh;
    let _d = env.spawn_bridge(&["--identity", "bridge-d"]);
    env.wait_until("bridge-d to stand by", || {
        log_says(&env, "bridge-4.log", "standing by")
    })
    .await;
    let cpid = nix::unistd::Pid::from_raw(i32::try_from(fresh.id()).unwrap());
    nix::sys::signal::kill(cpid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    pods.create(&PostParams::default(), &one_gpu_pod("frozen"))
        .await
        .unwrap();
    lease_until(&leases, &env, "taken by bridge-d", |l| {
        holder(l) == Some("bridge-d")
    })
    .await;
    println!(
        "takeover from a stalled (SIGSTOP) leader: {:?}",
        stopped.elapsed()
    );
    wait_running(&pods, &env, "frozen").await;
    nix::sys::signal::kill(cpid, nix::sys::signal::Signal::SIGCONT).unwrap();
    env.wait_until("the resumed old leader to exit", || fresh.exited())
        .await;
    let old = std::fs::read_to_string(env.dir().join("bridge-3.log")).unwrap_or_default();
    assert!(old.contains("leadership lost"), "{}", env.logs());
    assert!(
        !old.contains("\"frozen\""),
        "the resumed old leader acted on the pod made while it stalled:\n{old}"
    );

    // One placeholder per group through all these changes of leader.
    let by = jobs_by_group(&env, &ns);
    let want: Vec<String> = ["after", "before", "frozen", "last"]
        .iter()
        .map(|g| format!("{ns}/{g}"))
        .collect();
    assert_eq!(by.keys().cloned().collect::<Vec<_>>(), want, "{by:?}");
    assert!(by.values().all(|ids| ids.len() == 1), "{by:?}");
}

/// `sacct` rows of placeholder jobs in `ns`: job name -> job ids (every job ever, any state).
fn jobs_by_group(env: &BridgeEnv, ns: &str) -> BTreeMap<String, Vec<String>> {
    let out = env.cli(&[
        "sacct",
        "-a",
        "-X",
        "-n",
        "-P",
        "-S",
        "2000-01-01",
        "-o",
        "JobID,JobName,State",
    ]);
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split('|').collect();
        if let [id, name, _state] = f[..]
            && name.starts_with(&format!("{ns}/"))
        {
            by.entry(name.to_owned()).or_default().push(id.to_owned());
        }
    }
    by
}

#[tokio::test]
async fn killing_the_bridge_and_the_controller_mid_way_loses_and_duplicates_nothing() {
    let test = "killing_the_bridge_and_the_controller_mid_way_loses_and_duplicates_nothing";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    // cr1 is the only node a 4-GPU batch job fits; the gang then has to go to cr2.
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("cr1", 8, 16, 4)
            .node("cr2", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let ns = env.ns("serving").to_owned();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut bridge = env.spawn_bridge(&[]);

    // A batch job fills cr1, so cr1 serves batch work until it ends.
    let batch = env.sbatch(&["-N1", "--gpus-per-node=4"], "sleep 600");
    env.wait_until("the batch job to run", || {
        env.cli(&["squeue", "-h", "-j", &batch, "-o", "%T"]).trim() == "RUNNING"
    })
    .await;

    // A 2-pod gang (an indexed Job) bound and running on cr2.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let gang: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "gang"},
        "spec": {
            "parallelism": 2, "completions": 2, "completionMode": "Indexed",
            "template": {"spec": {
                "schedulerName": "tandem", "restartPolicy": "Never",
                "containers": [{"name": "w", "image": "busybox",
                    "command": ["sh", "-c", "sleep 600"],
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "limits": {"nvidia.com/gpu": "1"}}}],
            }},
        },
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &gang).await.unwrap();
    let lp = ListParams::default().labels("batch.kubernetes.io/job-name=gang");
    let gang_pods = env
        .wait_pods(&pods, &lp, "the gang to run", |ps| {
            ps.len() == 2 && ps.iter().all(running)
        })
        .await;
    // (uid, node, job id) per gang pod: none of it may change across the crashes.
    let gang_before: BTreeMap<String, (String, String, String)> = gang_pods
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                (
                    p.metadata.uid.clone().unwrap(),
                    node_of(p).unwrap().to_owned(),
                    job_id(p).unwrap().to_owned(),
                ),
            )
        })
        .collect();
    assert!(
        gang_before.values().all(|(_, n, _)| n == "cr2"),
        "{gang_before:?}"
    );

    // A pending group: its placeholder waits in the queue (no GPU free anywhere).
    pods.create(&PostParams::default(), &one_gpu_pod("solo"))
        .await
        .unwrap();
    env.wait_until("solo's placeholder to wait in the queue", || {
        env.cli(&["squeue", "-h", "-o", "%j %T"])
            .lines()
            .any(|l| l == format!("{ns}/solo PENDING"))
    })
    .await;

    // Mid-way: a pod created just before the bridge and then the controller die (its
    // placeholder may or may not have been submitted), and one while both are down.
    pods.create(&PostParams::default(), &one_gpu_pod("mid"))
        .await
        .unwrap();
    bridge.kill();
    env.kill_controller();
    pods.create(&PostParams::default(), &one_gpu_pod("late"))
        .await
        .unwrap();

    env.restart_controller().await;
    let _bridge = env.spawn_bridge(&[]);

    // Every pending group gets exactly one placeholder; the running gang keeps its job.
    env.wait_until("mid and late to wait in the queue", || {
        let q = env.cli(&["squeue", "-h", "-o", "%j %T"]);
        ["mid", "late"]
            .iter()
            .all(|p| q.lines().any(|l| l == format!("{ns}/{p} PENDING")))
    })
    .await;
    let q = env.cli(&["squeue", "-h", "-o", "%i %j %T"]);
    for (pod, (_, _, job)) in &gang_before {
        assert!(
            q.lines().any(|l| l == format!("{job} {ns}/gang RUNNING")),
            "{pod}'s job {job} still runs:\n{q}"
        );
    }
    assert_eq!(
        env.cli(&["squeue", "-h", "-j", &batch, "-o", "%T"]).trim(),
        "RUNNING",
        "the batch job survives the controller's restart"
    );

    // Room appears: the pending pods are bound, all three beside each other on cr1.
    env.cli(&["scancel", &batch]);
    for p in ["solo", "mid", "late"] {
        let bound = wait_running(&pods, &env, p).await;
        assert_eq!(node_of(&bound), Some("cr1"), "{p}");
    }

    // The gang was never touched: same pods, same nodes, same job, still running.
    for (name, (uid, node, job)) in &gang_before {
        let p = pods.get(name).await.unwrap();
        assert!(running(&p), "{name} still runs: {p:?}");
        assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()), "{name}");
        assert_eq!(node_of(&p), Some(node.as_str()), "{name}");
        assert_eq!(job_id(&p), Some(job.as_str()), "{name}");
    }

    // Exactly one job per group, ever, and it is the one each pod names.
    let by = jobs_by_group(&env, &ns);
    let want: Vec<String> = ["gang", "late", "mid", "solo"]
        .iter()
        .map(|g| format!("{ns}/{g}"))
        .collect();
    assert_eq!(by.keys().cloned().collect::<Vec<_>>(), want, "{by:?}");
    for (group, ids) in &by {
        assert_eq!(ids.len(), 1, "{group}: one job, not {ids:?}");
    }
    for p in ["solo", "mid", "late"] {
        let pod = pods.get(p).await.unwrap();
        assert_eq!(
            job_id(&pod),
            Some(by[&format!("{ns}/{p}")][0].as_str()),
            "{p}"
        );
    }
    assert_eq!(
        by[&format!("{ns}/gang")],
        vec![gang_before.values().next().unwrap().2.clone()]
    );
}
