//! Operator scale benchmark (not a test, issue #9): a worker set scaled from 0 to N replicas
//! on the in-repo harness, with the real controller, workers and login pod. Prints JSON lines.
//!
//! The in-repo API server and the process kubelet run in this process, with N Kubernetes
//! nodes `kn-0` .. `kn-{N-1}` (N = `TANDEM_BENCH_REPLICAS`, default 500; 2 CPUs, 4 GiB each,
//! declared only: every pod is a local process). The operator runs in-process with a client
//! of its own, so only its API requests are counted. A `TandemCluster`, a one-pod `LoginSet`
//! and a `WorkerSet` with 0 replicas are applied and left to settle; then the set is scaled
//! to N through the scale subresource (as `kubectl scale`, HPA or KEDA do) and the bench
//! reports, from that moment:
//!
//! - `pods_exist_s`: until all N worker pods exist;
//! - `pods_running_s`: until all N are `Running`;
//! - `sinfo_idle_s`: until `sinfo` run in the login pod (through the harness's
//!   `kubectl exec`, as a user would) lists N nodes `idle`;
//! - `workerset_ready_s`: until the set's status says N ready workers and `Ready`;
//! - `scale_out_requests` and `requests_per_pod_created` (target: at most 3), from the scale
//!   patch to the start of the quiet window (after a settle of `TANDEM_BENCH_SETTLE_SECS`,
//!   default 10), with a breakdown by verb and resource;
//! - then nothing changes for `TANDEM_BENCH_QUIET_SECS` (default 60): `quiet_requests_per_s`
//!   (target: under 1) and `quiet_requests_max_1s`, with their breakdown;
//! - `memory_used_gib`: how far the host's `MemAvailable` fell during the run (the pods are
//!   real processes: N workers, a controller, a login pod).
//!
//! The harness's kubelet renews each node's Lease and posts its status every
//! `TANDEM_BENCH_HEARTBEAT_SECS` (default 60; the harness's own default is 10). A real kubelet
//! renews its Lease every 10 s but posts an unchanged node status only every 5 minutes; here
//! both go together, and at 500 nodes and 10 s that is 100 writes a second, each followed
//! by a garbage-collection pass over the in-repo server's whole store: in a dev build that
//! saturated a core and the harness, not the operator, set the pace. The operator watches Nodes, so a
//! heartbeat reaches it as a watch event, never as a request of its own.
//!
//! Each figure is one line `{"bench", "name", "value", "unit", "target", "met"}` (`target`
//! and `met` null where the issue sets none). Progress goes to stderr. A wait that runs past
//! `TANDEM_BENCH_TIMEOUT_SECS` (default 1800) reports its figure as `null`, not met.
//! Ctrl-C or SIGTERM ends the run and still kills every pod's process.
//!
//! Run (root, for the pods' mount namespaces; `KUBECONFIG` unset, this needs the harness):
//!
//! ```text
//! cargo build --release --bins
//! cargo bench -p tandem-e2e --bench operator_scale
//! ```
//!
//! The pods' image is the build directory next to the bench binary (`target/release/`, for
//! `cargo bench`), so the release binaries must be built first. To use binaries already built
//! elsewhere (the debug build, say), point `CARGO_BIN_EXE_tandem` at that `tandem`: its
//! directory becomes the image. Or build and run the bench itself in the dev profile:
//! `cargo bench -p tandem-e2e --bench operator_scale --profile dev` (image `target/debug/`).
//! A quick try: `TANDEM_BENCH_REPLICAS=50 TANDEM_BENCH_QUIET_SECS=10`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;
use tandem_e2e::testkit::{
    Options, RequestLog, RequestRecord, TestCluster, create_all, max_in_one_second,
    objects_from_yaml, phase,
};
use tandem_operator::crd::{LoginSet, TandemCluster, WorkerSet};
use tandem_operator::labels::WORKER_SET;

const BENCH: &str = "operator_scale";
/// The worker set's name.
const SET: &str = "cpu";
/// Waits before the scale-out (the cluster coming up).
const SETUP: Duration = Duration::from_secs(300);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One figure as a JSON line on stdout.
fn figure(
    name: &str,
    value: serde_json::Value,
    unit: &str,
    target: Option<&str>,
    met: Option<bool>,
) {
    println!(
        "{}",
        json!({"bench": BENCH, "name": name, "value": value, "unit": unit,
               "target": target, "met": met})
    );
}

fn secs(d: Option<Duration>) -> serde_json::Value {
    d.map_or(serde_json::Value::Null, |d| {
        json!((d.as_secs_f64() * 1000.0).round() / 1000.0)
    })
}

fn progress(msg: impl std::fmt::Display) {
    eprintln!("{BENCH}: {msg}");
}

/// `MemAvailable` from `/proc/meminfo`, in KiB.
fn mem_available_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A request as "verb resource[/subresource]" (`get tandemclusters`, `patch
/// workersets/status`, `watch pods`), from its method and path.
fn kind_of(r: &RequestRecord) -> String {
    let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: &[&str] = match segs.first() {
        Some(&"api") => segs.get(2..).unwrap_or(&[]),
        Some(&"apis") => segs.get(3..).unwrap_or(&[]),
        _ => &segs,
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [res] | [res, _] => (*res).to_owned(),
        [res, _, sub, ..] => format!("{res}/{sub}"),
        [] => path.to_owned(),
    };
    let named = rest.len() >= 2;
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match r.method.as_str() {
        "GET" if watch => "watch",
        "GET" if named => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => other,
    };
    format!("{verb} {resource}")
}

/// `[[kind, count], ...]`, the most frequent first.
fn breakdown(reqs: &[RequestRecord]) -> serde_json::Value {
    let mut by: BTreeMap<String, u64> = BTreeMap::new();
    for r in reqs {
        *by.entry(kind_of(r)).or_default() += 1;
    }
    let mut v: Vec<(String, u64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    json!(v)
}

fn requests_between(log: &RequestLog, from: Instant, to: Instant) -> Vec<RequestRecord> {
    log.since(from).into_iter().filter(|r| r.at < to).collect()
}

/// `sinfo -N -h -o "%N %t"` as node -> compact state.
fn node_states(sinfo: &str) -> BTreeMap<String, String> {
    sinfo
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

const CLUSTER: &str = r#"
apiVersion: tandem.dev/v1alpha1
kind: TandemCluster
metadata: {name: hpc}
spec:
  partitions: [{name: batch, default: true}]
---
apiVersion: tandem.dev/v1alpha1
kind: LoginSet
metadata: {name: login}
spec: {clusterName: hpc, replicas: 1}
---
apiVersion: tandem.dev/v1alpha1
kind: WorkerSet
metadata: {name: cpu}
spec: {clusterName: hpc, replicas: 0, partitions: [batch], cpus: 1, memory: 1G}
"#;

/// Polls `f` every `every` until it returns `Some`, or `deadline` passes.
async fn poll<T, F, Fut>(every: Duration, deadline: Instant, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// What the waits saw last, for the progress lines.
#[derive(Default)]
struct Seen {
    pods: usize,
    running: usize,
    /// Nodes `idle` in the last `sinfo`, or why it did not answer.
    sinfo: String,
    /// The worker set's status: `ready/replicas` and its `Ready` condition.
    set: String,
}

struct Config {
    n: u64,
    quiet: Duration,
    settle: Duration,
    timeout: Duration,
    heartbeat: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = Config {
        n: env_u64("TANDEM_BENCH_REPLICAS", 500),
        quiet: Duration::from_secs(env_u64("TANDEM_BENCH_QUIET_SECS", 60)),
        settle: Duration::from_secs(env_u64("TANDEM_BENCH_SETTLE_SECS", 10)),
        timeout: Duration::from_secs(env_u64("TANDEM_BENCH_TIMEOUT_SECS", 1800)),
        heartbeat: Duration::from_secs(env_u64("TANDEM_BENCH_HEARTBEAT_SECS", 60)),
    };
    if std::env::var_os("KUBECONFIG").is_some() {
        progress("skipped: it needs the in-repo harness (unset KUBECONFIG)");
        return Ok(());
    }
    let Some(bin) = tandem_e2e::testkit::tandem_bin() else {
        progress(
            "skipped: no tandem binary next to the bench (cargo build --release --bins, \
             or CARGO_BIN_EXE_tandem=<dir>/tandem)",
        );
        return Ok(());
    };
    if !nix::unistd::geteuid().is_root() {
        progress("skipped: the pods' mount namespaces need root");
        return Ok(());
    }
    progress(format!(
        "{} replicas, image {}, quiet window {:?}, node heartbeat {:?}",
        cfg.n,
        bin.parent().unwrap_or(&bin).display(),
        cfg.quiet,
        cfg.heartbeat
    ));
    let mut options = Options::default();
    options.kubelet.heartbeat = cfg.heartbeat;
    let cluster = TestCluster::start_with(options).await?;
    // Interrupted (Ctrl-C, SIGTERM) or not, the cluster is dropped before exiting: that
    // kills every pod's process.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let result = tokio::select! {
        r = bench(&cluster, &cfg) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    drop(cluster);
    result
}

async fn bench(cluster: &TestCluster, cfg: &Config) -> anyhow::Result<()> {
    let n = cfg.n;
    let want = usize::try_from(n)?;
    // Memory: the lowest MemAvailable seen during the run.
    let mem_start = mem_available_kib().unwrap_or(0);
    let mem_min = Arc::new(AtomicU64::new(mem_start));
    let sampler = {
        let mem_min = mem_min.clone();
        tokio::spawn(async move {
            loop {
                if let Some(kib) = mem_available_kib() {
                    mem_min.fetch_min(kib, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let client = cluster.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tandem_operator::crd::all() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let began = Instant::now();
    cluster.declare_nodes("kn", want, "2", "4Gi", 0).await?;
    progress(format!(
        "declared {want} nodes in {:.1} s",
        began.elapsed().as_secs_f64()
    ));
    let ns = cluster.namespace("bench").await?;

    // The operator, in-process, with a client of its own: its requests alone are counted.
    let (op_client, op_log) = cluster.counted_client()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let op = tokio::spawn(tandem_operator::reconcile::run_with_client(
        op_client,
        tandem_operator::reconcile::Args {
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    create_all(&client, &ns, &objects_from_yaml(CLUSTER)?).await?;

    // The cluster comes up: controller, login pod, an empty worker set.
    let clusters: Api<TandemCluster> = Api::namespaced(client.clone(), &ns);
    let logins: Api<LoginSet> = Api::namespaced(client.clone(), &ns);
    let sets: Api<WorkerSet> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + SETUP;
    let ready = |conds: &[Condition]| {
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    let mut last_note = Instant::now();
    let up = poll(Duration::from_millis(500), deadline, || {
        let note = last_note.elapsed() > Duration::from_secs(10);
        if note {
            last_note = Instant::now();
        }
        let (clusters, logins, sets) = (&clusters, &logins, &sets);
        async move {
            let tc = clusters.get("hpc").await.ok()?;
            let ls = logins.get("login").await.ok()?;
            let ws = sets.get(SET).await.ok()?;
            let tc_ok = tc.status.as_ref().is_some_and(|s| ready(&s.conditions));
            let ls_ok = ls.status.as_ref().is_some_and(|s| s.ready_replicas == 1);
            let ws_ok = ws
                .status
                .as_ref()
                .is_some_and(|s| s.replicas == 0 && ready(&s.conditions));
            if note {
                let conds = |c: Option<&Vec<Condition>>| {
                    c.into_iter()
                        .flatten()
                        .map(|c| format!("{}={} {}", c.type_, c.status, c.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                progress(format!(
                    "setup: cluster ready {tc_ok} [{}], login ready {ls_ok}, worker set ready {ws_ok} [{}]",
                    conds(tc.status.as_ref().map(|s| &s.conditions)),
                    conds(ws.status.as_ref().map(|s| &s.conditions)),
                ));
            }
            (tc_ok && ls_ok && ws_ok).then_some(())
        }
    })
    .await;
    if up.is_none() {
        anyhow::bail!("the cluster did not come up within {SETUP:?}");
    }
    let sinfo = || async {
        let out = cluster
            .exec(&ns, "login-0", None, &["sinfo", "-N", "-h", "-o", "%N %t"])
            .await
            .map_err(|e| format!("exec: {e}"))?;
        if out.status.success() {
            Ok(node_states(&String::from_utf8_lossy(&out.stdout)))
        } else {
            Err(format!(
                "sinfo failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    if poll(Duration::from_millis(500), deadline, || async {
        sinfo().await.ok()
    })
    .await
    .is_none()
    {
        anyhow::bail!("sinfo in the login pod did not answer within {SETUP:?}");
    }
    progress(format!(
        "cluster up after {:.1} s; operator requests so far: {}",
        began.elapsed().as_secs_f64(),
        op_log.len()
    ));

    // The worker pods, as a reflector sees them (the bench's client, not the operator's).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (store, writer) = reflector::store::<Pod>();
    let watch = watcher::watcher(
        pods,
        watcher::Config::default().labels(&format!("{WORKER_SET}={SET}")),
    );
    let pod_reflector = tokio::spawn(
        reflector::reflector(writer, watch)
            .applied_objects()
            .for_each(|_| async {}),
    );
    store.wait_until_ready().await?;

    // Scale out, through the scale subresource.
    let t0 = Instant::now();
    let deadline = t0 + cfg.timeout;
    sets.patch_scale(
        SET,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": n}})),
    )
    .await?;
    let seen = std::sync::Mutex::new(Seen::default());
    let note = |f: &dyn Fn(&mut Seen)| f(&mut seen.lock().unwrap_or_else(|e| e.into_inner()));
    let pods_loop = async {
        let mut exist = None;
        let running = poll(Duration::from_millis(50), deadline, || {
            let live: Vec<Arc<Pod>> = store
                .state()
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let running = live.iter().filter(|p| phase(p) == "Running").count();
            note(&|s| {
                s.pods = live.len();
                s.running = running;
            });
            if exist.is_none() && live.len() >= want {
                exist = Some(t0.elapsed());
            }
            let done = running >= want;
            async move { done.then(|| t0.elapsed()) }
        })
        .await;
        (exist, running)
    };
    let sinfo_loop = poll(Duration::from_millis(1000), deadline, || async {
        let idle = match sinfo().await {
            Ok(states) => {
                let idle = states.values().filter(|s| *s == "idle").count();
                note(&|s| s.sinfo = format!("{idle} idle of {}", states.len()));
                idle
            }
            Err(e) => {
                note(&|s| s.sinfo = e.clone());
                0
            }
        };
        (idle >= want).then(|| t0.elapsed())
    });
    let set_loop = poll(Duration::from_millis(500), deadline, || async {
        let s = sets.get(SET).await.ok()?.status?;
        let ok = ready(&s.conditions);
        note(&|x| x.set = format!("{}/{} ready, Ready={ok}", s.ready_replicas, s.replicas));
        (s.ready_replicas == i32::try_from(want).ok()? && ok).then(|| t0.elapsed())
    });
    let all = async {
        let r = tokio::join!(pods_loop, sinfo_loop, set_loop);
        progress(format!(
            "pods exist {:?}, running {:?}, sinfo idle {:?}, set ready {:?}",
            r.0.0, r.0.1, r.1, r.2
        ));
        r
    };
    let report = async {
        loop {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let line = {
                let s = seen.lock().unwrap_or_else(|e| e.into_inner());
                format!(
                    "t={:.0}s pods={} running={} sinfo: {}; set: {}; operator requests={}; MemAvailable={:.1} GiB",
                    t0.elapsed().as_secs_f64(),
                    s.pods,
                    s.running,
                    s.sinfo,
                    s.set,
                    op_log.since(t0).len(),
                    mem_available_kib().unwrap_or(0) as f64 / 1_048_576.0
                )
            };
            progress(line);
        }
    };
    let ((pods_exist, pods_running), sinfo_idle, set_ready) = tokio::select! {
        r = all => r,
        _ = report => unreachable!("the progress loop never ends"),
    };
    tokio::time::sleep(cfg.settle).await;

    // Quiet: nothing changes; the operator should have (almost) nothing to say.
    let q0 = Instant::now();
    progress(format!("quiet window of {:?}", cfg.quiet));
    tokio::time::sleep(cfg.quiet).await;
    let q1 = Instant::now();
    let scale_reqs = requests_between(&op_log, t0, q0);
    let quiet_reqs = requests_between(&op_log, q0, q1);
    let mem_min = mem_min.load(Ordering::Relaxed);
    sampler.abort();
    // The figures.
    let met = |d: Option<Duration>| Some(d.is_some());
    figure("replicas", json!(n), "pods", None, None);
    figure("pods_exist_s", secs(pods_exist), "s", None, met(pods_exist));
    figure(
        "pods_running_s",
        secs(pods_running),
        "s",
        None,
        met(pods_running),
    );
    figure("sinfo_idle_s", secs(sinfo_idle), "s", None, met(sinfo_idle));
    figure(
        "workerset_ready_s",
        secs(set_ready),
        "s",
        None,
        met(set_ready),
    );
    figure(
        "scale_out_requests",
        json!(scale_reqs.len()),
        "requests",
        None,
        None,
    );
    let per_pod = scale_reqs.len() as f64 / n.max(1) as f64;
    figure(
        "requests_per_pod_created",
        json!((per_pod * 100.0).round() / 100.0),
        "requests/pod",
        Some("<= 3"),
        Some(per_pod <= 3.0 && pods_exist.is_some()),
    );
    figure(
        "scale_out_requests_by_kind",
        breakdown(&scale_reqs),
        "requests",
        None,
        None,
    );
    let rate = quiet_reqs.len() as f64 / cfg.quiet.as_secs_f64().max(1.0);
    figure(
        "quiet_requests_per_s",
        json!((rate * 1000.0).round() / 1000.0),
        "requests/s",
        Some("< 1"),
        Some(rate < 1.0),
    );
    figure(
        "quiet_requests_max_1s",
        json!(max_in_one_second(&quiet_reqs)),
        "requests",
        None,
        None,
    );
    figure(
        "quiet_requests_by_kind",
        breakdown(&quiet_reqs),
        "requests",
        None,
        None,
    );
    figure(
        "memory_used_gib",
        json!(((mem_start.saturating_sub(mem_min)) as f64 / 1_048_576.0 * 100.0).round() / 100.0),
        "GiB",
        None,
        None,
    );

    // Clean up: stop the operator; the caller drops the cluster, killing every pod's process.
    pod_reflector.abort();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
    Ok(())
}
