//! Bridge scale benchmark (not a test, issue #12): how fast the bridge binds pods through the
//! controller's queue, and how soon a node a batch job leaves serves a waiting pod. Prints
//! JSON lines, then a short table.
//!
//! What runs, and what stands in for what:
//!
//! - the in-repo API server (`e2e/src/apiserver`) in this process, with no kubelet nodes,
//!   no stand-in default scheduler and no service proxy: `TANDEM_BENCH_NODES` (default 500)
//!   Node objects are created directly, so bound pods are never started (binding is the
//!   measure, as in kube-scheduler's `scheduler_perf`);
//! - the real `tandem controller` (a process, default durability: every submit fsynced);
//! - the real `tandem-bridge run` (a process, `--leader-elect=false`);
//! - **fake workers** in place of `tandem worker`: one task per node in this process, each
//!   speaking the real `WorkerLink` stream with the node's own worker credential (register,
//!   heartbeats, `JobStarted` on a launch, `JobEnded` when the bench says), 64 CPUs, 512 GiB
//!   and 8 GPUs each. They run nothing: 500 worker processes would not fit beside the rest
//!   on a 2-core machine, and a placeholder job is never launched on a worker anyway.
//!
//! Phases, in order:
//!
//! 1. `flip`: one exclusive one-node batch job per node (a full pool), then
//!    `TANDEM_BENCH_FLIPS` (default 5) times: an 8-GPU pod is created and waits
//!    (`PodScheduled=False`), the batch job of one node ends (its fake worker reports
//!    `JobEnded`), and `mode_flip_ms` is the time from that report to the pod bound to that
//!    node (the controller flips the node to `kube`, allocates, streams the allocation; the
//!    bridge binds). Then every other batch job ends.
//! 2. `singles`: `TANDEM_BENCH_PODS` (default 2,000) one-GPU pods, each its own group,
//!    created as fast as the API server takes them (64 creates in flight).
//! 3. `paced`: `TANDEM_BENCH_PACED` (default 1,000) one-GPU single pods created at a steady
//!    `TANDEM_BENCH_RATE` (default 500) pods/s, below the bridge's throughput: the latency
//!    a pod sees when it is not queued behind a burst.
//! 4. `gangs`: `TANDEM_BENCH_GANGS` (default 50) scheduler-plugins PodGroups of 8 two-GPU
//!    pods (`minMember: 8`), created as a burst.
//!
//! The defaults fill 3,800 of the pool's 4,000 GPUs: nothing waits for capacity.
//!
//! For each of 2, 3 and 4: `pods_per_s` (pods bound over the time from the first create call
//! to the last binding seen; for `paced`, bounded by the pace) and the pending-to-bound
//! latency of each pod (from just before its create call to the watch event that shows its
//! `spec.nodeName`): mean, p50, p99, max. Latencies include the bench's own watch delay, and
//! in a burst they include the queueing of pods created faster than they are bound.
//!
//! Each figure is one line `{"bench", "name", "value", "unit", "target", "met"}`; a first
//! line gives the setup and the load average (the machine may be shared). Progress goes to
//! stderr.
//!
//! Run (`KUBECONFIG` unset; the bench needs the in-repo server):
//!
//! ```text
//! cargo build --release --bins -p tandem-cli -p tandem-bridge
//! cargo bench -p tandem-e2e --bench bridge_scale
//! ```
//!
//! The controller and bridge binaries are taken from the bench binary's build directory
//! (`target/release/`), or from beside `CARGO_BIN_EXE_tandem` when that is set.
//!
//! # Layout
//! - `main.rs`: the settings, the set-up of the pool and the four phases, in order.
//! - `figures.rs`: the figures (JSON lines, the table) and their statistics.
//! - `workers.rs`: the fake workers on the controller's `WorkerLink` stream.
//! - `pods.rs`: the pod watch, the pods, and how they are created (burst or paced).
//! - `setup.rs`: the controller process, the PodGroup CRD, dynamic APIs.

mod figures;
mod pods;
mod setup;
mod workers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use tandem_e2e::bridgekit::spawn;
use tandem_e2e::testkit::{Options, TestCluster, tandem_bin};
use tandem_net::auth::Identity;
use tandem_net::endpoint;
use tandem_proto::v1;
use tandem_proto::v1::jobs_client::JobsClient;
use tokio::sync::mpsc;

use figures::{Figures, loadavg, report_phase, stats};
use pods::{Seen, create_paced, create_pods, pod, until, watch_pods};
use setup::{dynamic_api, podgroup_crd, start_controller};
use workers::{Cmd, Pool, fake_worker};

const BENCH: &str = "bridge_scale";
/// How long any one wait may take before the bench gives up on that figure.
const WAIT: Duration = Duration::from_secs(300);
const NODE_GPUS: u32 = 8;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn progress(msg: impl std::fmt::Display) {
    eprintln!("{BENCH}: {msg}");
}

#[tokio::main]
async fn main() {
    let nodes = env_usize("TANDEM_BENCH_NODES", 500);
    let singles = env_usize("TANDEM_BENCH_PODS", 2000);
    let gangs = env_usize("TANDEM_BENCH_GANGS", 50);
    let paced = env_usize("TANDEM_BENCH_PACED", 1000);
    let pace = env_usize("TANDEM_BENCH_RATE", 500).max(1);
    let flips = env_usize("TANDEM_BENCH_FLIPS", 5).min(nodes);
    let gang_size = 8;
    let Some(tandem) = tandem_bin() else {
        panic!(
            "target/<profile>/tandem is missing: `cargo build --release --bins -p tandem-cli -p tandem-bridge` first"
        );
    };
    let bridge_bin =
        tandem.with_file_name(format!("tandem-bridge{}", std::env::consts::EXE_SUFFIX));
    assert!(bridge_bin.is_file(), "{} is missing", bridge_bin.display());
    let mut figs = Figures(Vec::new());
    println!(
        "{}",
        json!({"bench": BENCH, "name": "setup", "value": {
            "nodes": nodes, "node_shape": "64 cpu, 512 GiB, 8 gpu (fake workers)",
            "singles": singles, "paced": paced, "paced_rate": pace, "gangs": gangs, "gang_size": gang_size, "flips": flips,
            "loadavg_start": loadavg(), "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "tandem": tandem.display().to_string()}, "unit": null, "target": null, "met": null})
    );

    let cluster = TestCluster::start_with(Options {
        scheduler: false,
        service_proxy: false,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("the in-repo API server: {e}"));
    let server_url = cluster
        .server()
        .unwrap_or_else(|| panic!("KUBECONFIG is set: this bench needs the in-repo server"))
        .url();
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temp dir: {e}"));

    // Kubernetes Nodes (no kubelet: bound pods never start).
    let names: Vec<String> = (0..nodes).map(|i| format!("gpu-{i:03}")).collect();
    let node_api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(names.iter().map(|n| {
        let api = node_api.clone();
        async move {
            let node: Node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                "status": {"capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"},
                           "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}},
            }))
            .unwrap_or_else(|e| panic!("a node: {e}"));
            api.create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("creating node {n}: {e}"));
        }
    }))
    .buffer_unordered(32)
    .collect::<Vec<()>>()
    .await;

    // The controller, and one fake worker per node over 8 shared connections.
    let batch = start_controller(&tandem, dir.path()).await;
    let pool = Arc::new(Pool::default());
    let mut channels = Vec::new();
    for _ in 0..8 {
        let ep = tonic::transport::Endpoint::from_shared(batch.url.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        channels.push(
            ep.connect()
                .await
                .unwrap_or_else(|e| panic!("connecting to the controller: {e}")),
        );
    }
    let (reg_tx, mut reg_rx) = mpsc::channel::<()>(nodes.max(1));
    let mut cmd: HashMap<String, mpsc::Sender<Cmd>> = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        let (tx, rx) = mpsc::channel(16);
        cmd.insert(n.clone(), tx);
        tokio::spawn(fake_worker(
            channels[i % channels.len()].clone(),
            batch.key.clone(),
            n.clone(),
            pool.clone(),
            rx,
            reg_tx.clone(),
        ));
    }
    for _ in 0..nodes {
        if tokio::time::timeout(WAIT, reg_rx.recv()).await.is_err() {
            panic!("fake workers did not all register");
        }
    }
    progress(format!("{nodes} fake workers registered"));

    // Namespaces, CRDs, the TandemCluster with the bridge map, the bridge.
    let ns = cluster
        .namespace("bench")
        .await
        .unwrap_or_else(|e| panic!("namespace: {e}"));
    let cluster_ns = cluster
        .namespace("tandem")
        .await
        .unwrap_or_else(|e| panic!("namespace: {e}"));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut all = tandem_operator::crd::all();
    all.push(podgroup_crd());
    for crd in &all {
        crds.create(&PostParams::default(), crd)
            .await
            .unwrap_or_else(|e| panic!("creating CRD {:?}: {e}", crd.metadata.name));
    }
    let tc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": "pool"},
        "spec": {"bridge": {"namespaces": [{"namespace": ns, "account": "root"}]}},
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    dynamic_api(
        &client,
        &cluster_ns,
        "tandem.dev",
        "v1alpha1",
        "TandemCluster",
        "tandemclusters",
    )
    .create(&PostParams::default(), &tc)
    .await
    .unwrap_or_else(|e| panic!("creating the TandemCluster: {e}"));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server_url}\n\
             contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n\
             current-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
        ),
    )
    .unwrap_or_else(|e| panic!("writing the kubeconfig: {e}"));
    let key_s = batch.key_file.to_string_lossy().into_owned();
    let bridge_log = std::env::var("TANDEM_BENCH_BRIDGE_LOG").unwrap_or_else(|_| "warn".into());
    let _bridge = spawn(
        &bridge_bin,
        &[
            "run",
            "--controller",
            &batch.url,
            "--key-file",
            &key_s,
            "--cluster",
            "pool",
            "--cluster-namespace",
            &cluster_ns,
            "--leader-elect=false",
        ],
        &dir.path().join("bridge.log"),
        &[
            ("KUBECONFIG", &kubeconfig.to_string_lossy()),
            ("RUST_LOG", &bridge_log),
        ],
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let seen = Arc::new(Mutex::new(Seen::default()));
    watch_pods(pods.clone(), seen.clone());
    let user = Identity::user("bench", 1000, 1000);
    let jobs = JobsClient::new(
        endpoint::connect(&batch.url, &batch.key, &user)
            .await
            .unwrap_or_else(|e| panic!("connecting as a user: {e}")),
    );

    // === 1. mode flip: a full pool of batch jobs, a waiting pod, one job ends ===
    let submits = (0..nodes).map(|i| {
        let mut jobs = jobs.clone();
        async move {
            let spec = v1::JobSpec {
                name: format!("hold-{i}"),
                script: "#!/bin/sh\nsleep 3600\n".into(),
                workdir: "/tmp".into(),
                nodes_min: 1,
                nodes_max: 1,
                exclusive: true,
                time_limit_s: 3600,
                ..Default::default()
            };
            jobs.submit(v1::SubmitRequest { spec: Some(spec) })
                .await
                .unwrap_or_else(|e| panic!("submitting a batch job: {e}"));
        }
    });
    futures::stream::iter(submits)
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let full = until(|| pool.launched() >= nodes).await;
    assert!(
        full,
        "only {} of {nodes} batch jobs launched",
        pool.launched()
    );
    progress(format!(
        "pool full: {nodes} batch jobs running; loadavg {}",
        loadavg()
    ));
    let mut flip_lat = Vec::new();
    let mut flip_ok = true;
    for (i, node) in names.iter().enumerate().take(flips) {
        let name = format!("flip-{i}");
        pods.create(&PostParams::default(), &pod(&name, NODE_GPUS, json!({})))
            .await
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        let waits = until(|| seen.lock().is_ok_and(|s| s.waiting.contains(&name))).await;
        assert!(waits, "{name} never reported waiting (PodScheduled=False)");
        let job = pool.jobs_on(node);
        let Some(&job) = job.first() else {
            panic!("no batch job on {node}");
        };
        let t0 = Instant::now();
        if let Some(tx) = cmd.get(node) {
            let _ = tx.send(Cmd::End(job)).await;
        }
        let bound = until(|| seen.lock().is_ok_and(|s| s.bound.contains_key(&name))).await;
        let got = seen.lock().ok().and_then(|s| s.bound.get(&name).cloned());
        match got {
            Some((at, on)) if bound => {
                flip_ok &= on == *node;
                if on != *node {
                    progress(format!("{name} bound to {on}, not the freed {node}"));
                }
                flip_lat.push(at.saturating_duration_since(t0));
            }
            _ => flip_ok = false,
        }
    }
    if let Some((mean, p50, _p99, max)) = stats(&mut flip_lat) {
        figs.add("mode_flip_ms_mean", json!(mean), "ms", None, None);
        figs.add("mode_flip_ms_p50", json!(p50), "ms", None, None);
        figs.add(
            "mode_flip_ms_max",
            json!(max),
            "ms",
            Some("< 1000"),
            Some(flip_ok && max < 1000.0),
        );
    }
    // Every other batch job ends: the pool is free (in batch mode) for the bursts.
    for n in &names {
        for job in pool.jobs_on(n) {
            if let Some(tx) = cmd.get(n) {
                let _ = tx.send(Cmd::End(job)).await;
            }
        }
    }
    let drained = until(|| pool.launched() == 0).await;
    assert!(drained, "batch jobs left");
    // Give the controller a moment to commit the ends (it reports them on its own).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // === 2. singles ===
    progress(format!("singles: {singles} pods; loadavg {}", loadavg()));
    let mut created = HashMap::new();
    let list: Vec<Pod> = (0..singles)
        .map(|i| pod(&format!("one-{i}"), 1, json!({"phase": "singles"})))
        .collect();
    create_pods(&pods, list, &mut created).await;
    let ok = until(|| {
        seen.lock()
            .is_ok_and(|s| created.keys().all(|k| s.bound.contains_key(k)))
    })
    .await;
    if let Ok(s) = seen.lock() {
        report_phase(&mut figs, "singles", &created, &s, ok, true);
    }

    // === 3. paced singles ===
    progress(format!(
        "paced: {paced} pods at {pace}/s; loadavg {}",
        loadavg()
    ));
    let mut created = HashMap::new();
    let list: Vec<Pod> = (0..paced)
        .map(|i| pod(&format!("paced-{i}"), 1, json!({"phase": "paced"})))
        .collect();
    create_paced(&pods, list, pace as f64, &mut created).await;
    let ok = until(|| {
        seen.lock()
            .is_ok_and(|s| created.keys().all(|k| s.bound.contains_key(k)))
    })
    .await;
    if let Ok(s) = seen.lock() {
        report_phase(&mut figs, "paced", &created, &s, ok, false);
    }

    // === 4. gangs ===
    progress(format!(
        "gangs: {gangs} x {gang_size}; loadavg {}",
        loadavg()
    ));
    let groups = dynamic_api(
        &client,
        &ns,
        "scheduling.x-k8s.io",
        "v1alpha1",
        "PodGroup",
        "podgroups",
    );
    for g in 0..gangs {
        let pg: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": format!("gang-{g}")}, "spec": {"minMember": gang_size},
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        groups
            .create(&PostParams::default(), &pg)
            .await
            .unwrap_or_else(|e| panic!("creating PodGroup gang-{g}: {e}"));
    }
    let mut created = HashMap::new();
    let list: Vec<Pod> = (0..gangs)
        .flat_map(|g| {
            (0..gang_size).map(move |i| {
                pod(
                    &format!("gang-{g}-{i}"),
                    2,
                    json!({"scheduling.x-k8s.io/pod-group": format!("gang-{g}")}),
                )
            })
        })
        .collect();
    create_pods(&pods, list, &mut created).await;
    let ok = until(|| {
        seen.lock()
            .is_ok_and(|s| created.keys().all(|k| s.bound.contains_key(k)))
    })
    .await;
    if let Ok(s) = seen.lock() {
        report_phase(&mut figs, "gangs", &created, &s, ok, true);
        // All or nothing: each gang's pods bound within one binding round.
        let mut spread = Vec::new();
        for g in 0..gangs {
            let times: Vec<Instant> = (0..gang_size)
                .filter_map(|i| s.bound.get(&format!("gang-{g}-{i}")).map(|b| b.0))
                .collect();
            if let (Some(a), Some(b)) = (times.iter().min(), times.iter().max()) {
                spread.push(b.saturating_duration_since(*a));
            }
        }
        if let Some((_, _, _, max)) = stats(&mut spread) {
            figs.add("gangs_bind_spread_max", json!(max), "ms", None, None);
        }
    }
    println!(
        "{}",
        json!({"bench": BENCH, "name": "loadavg_end", "value": loadavg(), "unit": null,
               "target": null, "met": null})
    );
    figs.table();
    if std::env::var_os("TANDEM_BENCH_KEEP_LOGS").is_some() {
        let kept = dir.keep();
        progress(format!("logs kept in {}", kept.display()));
    }
}
