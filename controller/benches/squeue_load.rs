//! squeue load benchmark (not a test): does a crowd looping `squeue` slow scheduling or
//! submits? Prints JSON lines.
//!
//! A real controller (in this process, real gRPC on loopback, real SQLite) is filled with
//! `TANDEM_BENCH_PENDING` (default 100,000) pending jobs (no workers: everything stays
//! pending and every pass walks the whole queue; the periodic pass runs every
//! `TANDEM_BENCH_SCHED_INTERVAL_MS`, default 500). Then two kinds of phase, run in the order
//! baseline, load, load, baseline for half of `TANDEM_BENCH_SECONDS` (default 20) each, so the
//! queue's growth under the submitter weighs on both kinds alike:
//!
//! - `baseline`: a submitter (4 connections x 8 requests in flight) submits non-stop;
//! - `squeue_load`: the same submitter plus `TANDEM_BENCH_SQUEUE_CLIENTS` (default 16)
//!   clients, each its own connection, looping `ListJobs` over every job with squeue's
//!   default columns as the read mask.
//!
//! Each kind's line reports the acknowledged (durable) submit rate and the scheduling pass
//! time (mean, p50, p99, max; read from the controller's own `scheduling pass` trace
//! events, `total_us`); the last line gives the ratios squeue_load / baseline (target:
//! within 20 %). The squeue clients stand for users on other machines: they run on a runtime
//! of their own at nice 19, so on a small machine their decoding yields to the controller
//! as it would if they ran elsewhere. The submitter shares the controller's priority. The
//! controller runs with its default listing CPU share (`--listing-cpu-share`; the crowd line
//! shows what it costs the crowd: listings per second and each listing's latency).
//!
//! Run: `cargo bench -p tandem-controller --bench squeue_load`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tandem_controller::{Config, run};
use tandem_net::auth::{ClusterKey, Identity};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_proto::v1::{self, jobs_client::JobsClient};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The squeue clients stand for users on login nodes, other machines than the controller's:
/// on this one they run on a runtime of their own at the lowest priority, so decoding their
/// replies does not count as the controller's load.
const VIEWER_NICE: i32 = 19;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Collects `total_us` of every `scheduling pass` event the controller emits.
#[derive(Clone, Default)]
struct PassTimes(Arc<Mutex<Vec<u64>>>);

impl PassTimes {
    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct TotalUs(Option<u64>);

impl Visit for TotalUs {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "total_us" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for PassTimes {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut v = TotalUs(None);
        event.record(&mut v);
        if let Some(us) = v.0 {
            self.0.lock().unwrap().push(us);
        }
    }
}

fn spec(i: u64) -> v1::JobSpec {
    v1::JobSpec {
        name: format!("load-{i}"),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        environment: (0..10)
            .map(|k| (format!("VAR_{k}"), "x".repeat(40)))
            .collect(),
        ..Default::default()
    }
}

async fn client(addr: &str, key: &ClusterKey, user: &str, uid: u32) -> JobsClient<AuthChannel> {
    let who = Identity::user(user, uid, uid);
    JobsClient::new(endpoint::connect(addr, key, &who).await.unwrap())
        .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES)
}

fn stats(name: &str, mut v: Vec<u64>) -> serde_json::Value {
    v.sort_unstable();
    let pick = |q: f64| {
        if v.is_empty() {
            0.0
        } else {
            let i = ((v.len() as f64 - 1.0) * q).round() as usize;
            v[i] as f64 / 1000.0
        }
    };
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0
    };
    serde_json::json!({
        format!("{name}_n"): v.len(),
        format!("{name}_ms_mean"): mean,
        format!("{name}_ms_p50"): pick(0.5),
        format!("{name}_ms_p99"): pick(0.99),
        format!("{name}_ms_max"): pick(1.0),
    })
}

/// The squeue read mask: its default columns.
fn squeue_fields() -> Vec<String> {
    [
        "job_id",
        "partition",
        "name",
        "user",
        "state",
        "start_time",
        "time_limit_s",
        "num_nodes",
        "nodelist",
        "reason",
    ]
    .map(str::to_owned)
    .to_vec()
}

#[derive(Default)]
struct Phase {
    submits: u64,
    listings: u64,
    list_us: Vec<u64>,
    passes: Vec<u64>,
    secs: f64,
}

impl Phase {
    fn add(&mut self, p: Phase) {
        self.submits += p.submits;
        self.listings += p.listings;
        self.list_us.extend(p.list_us);
        self.passes.extend(p.passes);
        self.secs += p.secs;
    }
}

#[allow(clippy::too_many_arguments)]
async fn phase(
    addr: &str,
    key: &ClusterKey,
    seconds: f64,
    squeue_clients: usize,
    viewers: &tokio::runtime::Handle,
    next_id: &Arc<AtomicU64>,
    passes: &PassTimes,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let submits = Arc::new(AtomicU64::new(0));
    let mut submitters = Vec::new();
    for c in 0..4 {
        let cl = client(addr, key, "submitter", 2000 + c).await;
        for _ in 0..8 {
            let mut cl = cl.clone();
            let (stop, submits, next_id) = (stop.clone(), submits.clone(), next_id.clone());
            submitters.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next_id.fetch_add(1, Ordering::Relaxed);
                    cl.submit(v1::SubmitRequest {
                        spec: Some(spec(i)),
                    })
                    .await
                    .expect("submit");
                    submits.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    let mut listers = Vec::new();
    for c in 0..squeue_clients {
        let (addr, key) = (addr.to_owned(), key.clone());
        let stop = stop.clone();
        listers.push(viewers.spawn(async move {
            let mut cl = client(&addr, &key, &format!("viewer{c}"), 3000 + c as u32).await;
            let mut times = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = cl
                    .list_jobs(v1::ListJobsRequest {
                        fields: squeue_fields(),
                        ..Default::default()
                    })
                    .await
                    .expect("list_jobs");
                assert!(!r.into_inner().jobs.is_empty());
                times.push(t.elapsed().as_micros() as u64);
            }
            times
        }));
    }
    passes.take();
    let t = Instant::now();
    let s0 = submits.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let s1 = submits.load(Ordering::Relaxed);
    let secs = t.elapsed().as_secs_f64();
    let pass_times = passes.take();
    stop.store(true, Ordering::Relaxed);
    for s in submitters {
        s.await.unwrap();
    }
    let mut list_us = Vec::new();
    for l in listers {
        list_us.extend(l.await.unwrap());
    }
    Phase {
        submits: s1 - s0,
        listings: list_us.len() as u64,
        list_us,
        passes: pass_times,
        secs,
    }
}

fn report(name: &str, p: &Phase, jobs: usize) -> serde_json::Value {
    let mut line = serde_json::json!({
        "phase": name,
        "jobs_at_start": jobs,
        "seconds": p.secs,
        "submit_per_s": p.submits as f64 / p.secs,
        "listings_per_s": p.listings as f64 / p.secs,
    });
    let obj = line.as_object_mut().unwrap();
    for (k, v) in stats("pass", p.passes.clone())
        .as_object()
        .unwrap()
        .iter()
        .chain(stats("list", p.list_us.clone()).as_object().unwrap())
    {
        obj.insert(k.clone(), v.clone());
    }
    line
}

#[tokio::main]
async fn main() {
    let passes = PassTimes::default();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::filter::Targets::new()
                .with_target("tandem_controller::state", tracing::Level::DEBUG),
        )
        .with(passes.clone())
        .init();
    let pending = env_usize("TANDEM_BENCH_PENDING", 100_000) as u64;
    let seconds = env_usize("TANDEM_BENCH_SECONDS", 20) as u64;
    let squeue_clients = env_usize("TANDEM_BENCH_SQUEUE_CLIENTS", 16);
    let interval = env_usize("TANDEM_BENCH_SCHED_INTERVAL_MS", 500) as u64;

    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.sched_interval = Duration::from_millis(interval);
    let key_file = config.key_file.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(config, listener, async {
        let _ = stop_rx.await;
    }));
    let key = loop {
        if let Ok(k) = ClusterKey::load(&key_file) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            break k;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    // Fill: 16 connections x 32 in flight.
    let t = Instant::now();
    let next_id = Arc::new(AtomicU64::new(0));
    let mut fill = Vec::new();
    for c in 0..16 {
        let cl = client(&addr, &key, "filler", 1000 + c).await;
        for _ in 0..32 {
            let mut cl = cl.clone();
            let next_id = next_id.clone();
            fill.push(tokio::spawn(async move {
                loop {
                    let i = next_id.fetch_add(1, Ordering::Relaxed);
                    if i >= pending {
                        break;
                    }
                    cl.submit(v1::SubmitRequest {
                        spec: Some(spec(i)),
                    })
                    .await
                    .expect("fill submit");
                }
            }));
        }
    }
    for f in fill {
        f.await.unwrap();
    }
    println!(
        "{}",
        serde_json::json!({"phase": "fill", "jobs": pending, "seconds": t.elapsed().as_secs_f64()})
    );
    next_id.store(pending, Ordering::Relaxed);

    // The queue grows while submits run, and a pass over more jobs takes longer: the phases
    // run baseline, load, load, baseline (half the time each), so both see the same queue
    // lengths on average and the growth cancels out of the ratios.
    let viewers_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("viewer")
        .on_thread_start(|| {
            let _ = rustix::process::setpriority_process(None, VIEWER_NICE);
        })
        .enable_all()
        .build()
        .unwrap();
    let viewers = viewers_rt.handle().clone();
    let half = seconds as f64 / 2.0;
    let mut base = Phase::default();
    let mut load = Phase::default();
    for with_load in [false, true, true, false] {
        let clients = if with_load { squeue_clients } else { 0 };
        let p = phase(&addr, &key, half, clients, &viewers, &next_id, &passes).await;
        if with_load { load.add(p) } else { base.add(p) }
    }
    let jobs = next_id.load(Ordering::Relaxed) as usize;
    let base_line = report("baseline", &base, pending as usize);
    println!("{base_line}");
    let load_line = report("squeue_load", &load, pending as usize);
    println!("{load_line}");
    let ratio = |k: &str| {
        let b = base_line[k].as_f64().unwrap_or(0.0);
        let l = load_line[k].as_f64().unwrap_or(0.0);
        if b > 0.0 { l / b } else { 0.0 }
    };
    println!(
        "{}",
        serde_json::json!({
            "phase": "ratio_squeue_load_over_baseline",
            "squeue_clients": squeue_clients,
            "submit_per_s": ratio("submit_per_s"),
            "pass_ms_mean": ratio("pass_ms_mean"),
            "pass_ms_p50": ratio("pass_ms_p50"),
            "pass_ms_p99": ratio("pass_ms_p99"),
            "pass_ms_max": ratio("pass_ms_max"),
        })
    );
    println!("{}", serde_json::json!({"phase": "end", "jobs": jobs}));
    let _ = stop_tx.send(());
    let _ = server.await;
    viewers_rt.shutdown_background();
}
