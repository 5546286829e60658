//! Controller benchmark (not a test): prints one JSON object.
//!
//! - `submit_per_s_1_in_flight`: durable submissions per second through gRPC, 16 clients
//!   (each its own HTTP/2 connection) with one request in flight each: bounded by
//!   16 / fsync latency, since each acknowledgement waits for its commit;
//! - `submit_per_s`: the same with `TANDEM_BENCH_INFLIGHT` (default 64) requests in flight
//!   per client, which is what group commit turns into throughput;
//! - `submit_to_launch_ms_p50`: submit-to-LaunchJob on an idle cluster (a fake worker
//!   receives the launch; the job is RUNNING in the controller at that point);
//! - `rss_bytes_per_pending_job`: growth of this process's resident memory per pending job
//!   with `TANDEM_BENCH_PENDING` (default 100,000) pending (controller and clients share
//!   the process, so this overstates the controller's share);
//! - `list_pending_ms`: one ListJobs over all pending jobs (squeue's RPC).
//!
//! Run: `cargo bench -p tandem-controller --bench controller`.

use std::time::{Duration, Instant};

use tandem_controller::{Config, run};
use tandem_net::auth::{ClusterKey, Identity};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;
use tandem_proto::v1::{self, controller_message, worker_message};
use tokio_stream::wrappers::ReceiverStream;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn spec(i: usize) -> v1::JobSpec {
    v1::JobSpec {
        name: format!("bench-{i}"),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        environment: (0..30)
            .map(|k| (format!("VAR_{k}"), "x".repeat(40)))
            .collect(),
        ..Default::default()
    }
}

async fn start(dir: &std::path::Path) -> (String, ClusterKey, tokio::sync::oneshot::Sender<()>) {
    let config = Config::new(dir);
    let key_file = config.key_file.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(run(config, listener, async {
        let _ = rx.await;
    }));
    loop {
        if let Ok(k) = ClusterKey::load(&key_file) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            return (addr, k, tx);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn client(addr: &str, key: &ClusterKey) -> JobsClient<AuthChannel> {
    let who = Identity::user("bench", 1000, 1000);
    JobsClient::new(endpoint::connect(addr, key, &who).await.unwrap())
}

/// Each client (one HTTP/2 connection) submits `per_client` jobs with `inflight` requests
/// outstanding at a time; returns acknowledged (durable) submissions per second.
async fn submit_round(cs: &[JobsClient<AuthChannel>], per_client: usize, inflight: usize) -> f64 {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (c, cl) in cs.iter().enumerate() {
        for lane in 0..inflight {
            let mut cl = cl.clone();
            let n = per_client / inflight + usize::from(lane < per_client % inflight);
            tasks.push(tokio::spawn(async move {
                for i in 0..n {
                    cl.submit(v1::SubmitRequest {
                        spec: Some(spec(c * per_client + i)),
                    })
                    .await
                    .unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (cs.len() * per_client) as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    // `RUST_LOG=tandem_controller=debug` shows group commits and passes.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let clients = env_usize("TANDEM_BENCH_CLIENTS", 16);
    let per_client = env_usize("TANDEM_BENCH_PER_CLIENT", 2_000);
    let pending = env_usize("TANDEM_BENCH_PENDING", 100_000);
    let inflight = env_usize("TANDEM_BENCH_INFLIGHT", 64);
    let dir = tempfile::tempdir().unwrap();
    let (addr, key, stop) = start(dir.path()).await;

    // 1. Throughput, no workers: every job stays pending.
    let rss0 = rss_bytes();
    let mut cs = Vec::new();
    for _ in 0..clients {
        cs.push(client(&addr, &key).await);
    }
    let submit_per_s_sequential = submit_round(&cs, per_client, 1).await;
    let submit_per_s = submit_round(&cs, per_client, inflight).await;
    let submitted = clients * per_client * 2;

    // 2. Fill up to `pending` and measure memory and the listing.
    let mut cl = client(&addr, &key)
        .await
        .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES);
    let rest = pending.saturating_sub(submitted);
    let mut fill = Vec::new();
    for c in 0..clients {
        let mut cl = client(&addr, &key).await;
        let n = rest / clients;
        fill.push(tokio::spawn(async move {
            for i in 0..n {
                cl.submit(v1::SubmitRequest {
                    spec: Some(spec(c * n + i)),
                })
                .await
                .unwrap();
            }
        }));
    }
    for t in fill {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    let listed = cl
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs
        .len();
    let list_ms = t.elapsed().as_secs_f64() * 1e3;
    let rss1 = rss_bytes();
    let per_job = (rss1.saturating_sub(rss0)) as f64 / listed.max(1) as f64;

    // 3. Latency on an idle cluster: a fresh controller with one fake worker.
    drop(cl);
    let _ = stop.send(());
    let dir2 = tempfile::tempdir().unwrap();
    let (addr, key, stop) = start(dir2.path()).await;
    let ch = endpoint::connect(&addr, &key, &Identity::worker("n1", 0, 0))
        .await
        .unwrap();
    let (wtx, wrx) = tokio::sync::mpsc::channel(16);
    wtx.send(v1::WorkerMessage {
        msg: Some(worker_message::Msg::Register(v1::Register {
            node_name: "n1".into(),
            resources: Some(v1::Tres {
                cpus: 64,
                mem_mb: 1 << 20,
                gpus: 0,
                gpu_type: String::new(),
            }),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut inbound = WorkerLinkClient::new(ch)
        .attach(ReceiverStream::new(wrx))
        .await
        .unwrap()
        .into_inner();
    let _registered = inbound.message().await.unwrap();
    let mut cl = client(&addr, &key).await;
    let mut lat = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        cl.submit(v1::SubmitRequest {
            spec: Some(spec(i)),
        })
        .await
        .unwrap();
        loop {
            let m = inbound.message().await.unwrap().unwrap();
            if let Some(controller_message::Msg::LaunchJob(l)) = m.msg {
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                wtx.send(v1::WorkerMessage {
                    msg: Some(worker_message::Msg::JobEnded(v1::JobEnded {
                        job_id: l.job_id,
                        ..Default::default()
                    })),
                })
                .await
                .unwrap();
                break;
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let p50 = lat[lat.len() / 2];
    let p99 = lat[lat.len() * 99 / 100];
    let _ = stop.send(());
    println!(
        "{{\"clients\":{clients},\"submitted\":{submitted},\
         \"submit_per_s_1_in_flight\":{submit_per_s_sequential:.0},\
         \"in_flight_per_client\":{inflight},\"submit_per_s\":{submit_per_s:.0},\
         \"pending\":{listed},\"list_pending_ms\":{list_ms:.1},\
         \"rss_bytes_per_pending_job\":{per_job:.0},\
         \"submit_to_launch_ms_p50\":{p50:.2},\"submit_to_launch_ms_p99\":{p99:.2}}}"
    );
}
