//! Batch-system benchmark: real controller and workers as processes on loopback, driven through
//! the gRPC API and the real CLI. Not a test: it prints one JSON object per figure on stdout
//! (`{"bench": ..., "value": ..., "unit": ..., ...}`) and compares against the targets of
//! issue #2 and #5. Absolute times on a shared 2-core machine are noisy; ratios between figures
//! measured in one run are the stable part.
//!
//! Run: `cargo bench -p tandem-cli --bench batch` (add `-- --quick` for a smaller run, and
//! `-- --durability process` to acknowledge submits before fsync).
//!
//! Figures:
//! - `submit_grpc_16_clients`: durable submissions per second, 16 client connections each
//!   submitting sequentially (one request in flight per client), held jobs so the scheduler
//!   does not run them.
//! - `submit_grpc_16_clients_pipelined`: the same 16 connections with 32 requests in flight
//!   each (HTTP/2 multiplexing); group commit turns concurrency into bigger transactions.
//! - `mem_per_pending_job_bytes`: controller RSS growth divided by the pending jobs added.
//! - `squeue_100k_ms`: `tandem squeue` printing every one of the pending jobs.
//! - `array_1m_accept_ms` / `array_1m_rss_growth_mb`: one 1,000,000-task array.
//! - `sbatch_cli_median_ms`: sequential `tandem sbatch --wrap` round trips (process start included).
//! - `submit_to_running_median_ms`: submit a job on an idle cluster, time until RUNNING.
//! - `trivial_jobs_per_s`: 10,000 `/bin/true` jobs through 8 local workers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tandem_proto::auth::Identity;
use tandem_proto::endpoint::{AuthChannel, ClusterFile, connect};
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::{
    CancelRequest, JobInfo, JobRef, JobSpec, JobState, ListJobsRequest, SubmitRequest,
};

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(nodes: u32, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let status = Command::new(TANDEM)
            .args(["up", "--nodes", &nodes.to_string(), "--gpus-per-node", "8"])
            .args(["--cpus-per-node", "64", "--mem-per-node", "512G"])
            .arg("--state-dir")
            .arg(dir.path())
            .args(["--no-default-config", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "tandem up failed");
        Ok(Self { dir })
    }

    fn cluster_file(&self) -> PathBuf {
        self.dir.path().join("cluster.json")
    }

    fn controller_pid(&self) -> anyhow::Result<u32> {
        let text = std::fs::read_to_string(self.dir.path().join("controller.pid"))?;
        Ok(text.trim().parse()?)
    }

    fn rss_bytes(&self) -> anyhow::Result<u64> {
        rss_of(self.controller_pid()?)
    }

    async fn channel(&self) -> anyhow::Result<AuthChannel> {
        let file = ClusterFile::read(&self.cluster_file())?;
        let key = tandem_proto::auth::ClusterKey::load(&file.key_file)?;
        Ok(connect(&file.controller, &key, &me()).await?)
    }

    fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(TANDEM);
        cmd.args(args)
            .env("TANDEM_CONFIG", self.cluster_file())
            .current_dir(self.dir.path());
        cmd
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(TANDEM)
            .arg("down")
            .arg("--state-dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn me() -> Identity {
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let user = nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string());
    Identity::user(user, uid, gid)
}

fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for pid {pid}"))?;
    Ok(kb * 1024)
}

fn spec(script: &str, hold: bool, workdir: &Path) -> JobSpec {
    JobSpec {
        name: "bench".into(),
        script: script.into(),
        workdir: workdir.display().to_string(),
        ntasks: 1,
        cpus_per_task: 1,
        time_limit_s: 600,
        hold,
        stdout: "/dev/null".into(),
        ..Default::default()
    }
}

fn emit(bench: &str, value: f64, unit: &str, extra: serde_json::Value) {
    let mut obj = json!({"bench": bench, "value": (value * 1000.0).round() / 1000.0, "unit": unit});
    if let (Some(o), Some(e)) = (obj.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
    println!("{obj}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Submits `total` held jobs from `clients` connections, each keeping `depth` requests in flight.
async fn submit_many(
    cluster: &Cluster,
    clients: usize,
    depth: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let workdir = cluster.dir.path().to_owned();
    let per_client = total / clients;
    let mut channels = Vec::new();
    for _ in 0..clients {
        channels.push(cluster.channel().await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for ch in channels {
        let workdir = workdir.clone();
        tasks.push(tokio::spawn(async move {
            let mut inflight = tokio::task::JoinSet::new();
            for i in 0..per_client {
                if inflight.len() >= depth
                    && let Some(r) = inflight.join_next().await
                {
                    r??;
                }
                let mut client = JobsClient::new(ch.clone());
                let spec = spec("#!/bin/sh\ntrue\n", true, &workdir);
                inflight.spawn(async move {
                    client
                        .submit(SubmitRequest { spec: Some(spec) })
                        .await
                        .map(|_| ())
                        .map_err(|s| anyhow::anyhow!("submit {i}: {s}"))
                });
            }
            while let Some(r) = inflight.join_next().await {
                r??;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((per_client * clients) as f64 / start.elapsed().as_secs_f64())
}

async fn pending_throughput_memory_squeue(quick: bool, durability: &str) -> anyhow::Result<()> {
    let cluster = Cluster::start(8, &["--durability", durability])?;
    let pending: usize = if quick { 20_000 } else { 100_000 };
    // Warm up connections and the store.
    submit_many(&cluster, 16, 1, 1_600).await?;
    let rss0 = cluster.rss_bytes()?;

    let seq = submit_many(&cluster, 16, 1, pending / 4).await?;
    emit(
        "submit_grpc_16_clients",
        seq,
        "jobs/s",
        json!({"in_flight_per_client": 1, "durability": durability, "target": 20000}),
    );
    let piped = submit_many(&cluster, 16, 32, pending - pending / 4).await?;
    emit(
        "submit_grpc_16_clients_pipelined",
        piped,
        "jobs/s",
        json!({"in_flight_per_client": 32, "durability": durability, "target": 20000}),
    );
    let rss1 = cluster.rss_bytes()?;
    emit(
        "mem_per_pending_job_bytes",
        (rss1.saturating_sub(rss0)) as f64 / pending as f64,
        "bytes",
        json!({"pending": pending, "rss_mb": rss1 / (1 << 20), "target": 2048}),
    );

    let t = Instant::now();
    let out = cluster.cli(&["squeue"]).stdout(Stdio::piped()).output()?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
    anyhow::ensure!(out.status.success(), "squeue failed");
    emit(
        "squeue_pending_ms",
        ms,
        "ms",
        json!({"jobs_printed": lines.saturating_sub(1), "target_ms_at_100k": 300}),
    );

    let mut ch = JobsClient::new(cluster.channel().await?)
        .max_decoding_message_size(tandem_proto::endpoint::MAX_RESPONSE_BYTES);
    let rss_a = cluster.rss_bytes()?;
    let mut s = spec("#!/bin/sh\ntrue\n", true, cluster.dir.path());
    s.array = "0-999999".into();
    let t = Instant::now();
    ch.submit(SubmitRequest { spec: Some(s) }).await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let rss_b = cluster.rss_bytes()?;
    emit("array_1m_accept_ms", ms, "ms", json!({"target": 100}));
    emit(
        "array_1m_rss_growth_mb",
        rss_b.saturating_sub(rss_a) as f64 / (1 << 20) as f64,
        "MiB",
        json!({"target": 10}),
    );
    Ok(())
}

/// The records of job `id` (an array's tasks included) the controller holds in memory.
async fn job_records(
    jobs: &mut JobsClient<AuthChannel>,
    id: u64,
    include_finished: bool,
) -> anyhow::Result<Vec<JobInfo>> {
    let request = ListJobsRequest {
        jobs: vec![JobRef {
            job_id: id,
            array_tasks: String::new(),
        }],
        include_finished,
        ..Default::default()
    };
    Ok(jobs.list_jobs(request).await?.into_inner().jobs)
}

async fn latency_and_completion(quick: bool) -> anyhow::Result<()> {
    let cluster = Cluster::start(8, &["--kill-wait", "1"])?;

    let n = if quick { 20 } else { 100 };
    let mut ms = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let out = cluster
            .cli(&[
                "sbatch",
                "--parsable",
                "--hold",
                "-o",
                "/dev/null",
                "--wrap",
                "true",
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    emit(
        "sbatch_cli_median_ms",
        median(&mut ms),
        "ms",
        json!({"samples": n, "target": 5}),
    );
    // Clear the held jobs so the next figure runs on an idle cluster.
    let mut jobs = JobsClient::new(cluster.channel().await?);
    jobs.cancel(CancelRequest {
        user: me().user,
        ..Default::default()
    })
    .await?;

    let mut ms = Vec::new();
    for _ in 0..(if quick { 10 } else { 50 }) {
        let s = spec("#!/bin/sh\nsleep 30\n", false, cluster.dir.path());
        let t = Instant::now();
        let id = jobs
            .submit(SubmitRequest { spec: Some(s) })
            .await?
            .into_inner()
            .job_id;
        loop {
            let list = job_records(&mut jobs, id, true).await?;
            if list.iter().any(|j| j.state == JobState::Running as i32) {
                break;
            }
            anyhow::ensure!(t.elapsed() < Duration::from_secs(30), "job {id} never ran");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
        jobs.cancel(CancelRequest {
            jobs: vec![JobRef {
                job_id: id,
                array_tasks: String::new(),
            }],
            ..Default::default()
        })
        .await?;
    }
    emit(
        "submit_to_running_median_ms",
        median(&mut ms),
        "ms",
        json!({"samples": ms.len(), "target": 20}),
    );
    // Let the cancelled sleeps drain.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let total: usize = if quick { 1_000 } else { 10_000 };
    let t = Instant::now();
    let mut s = spec("#!/bin/sh\ntrue\n", false, cluster.dir.path());
    s.array = format!("0-{}", total - 1);
    // One array, like a sweep; every task becomes its own job when it starts.
    let id = jobs
        .submit(SubmitRequest { spec: Some(s) })
        .await?
        .into_inner()
        .job_id;
    loop {
        if job_records(&mut jobs, id, false).await?.is_empty() {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "trivial jobs did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    emit(
        "trivial_jobs_per_s",
        total as f64 / secs,
        "jobs/s",
        json!({"jobs": total, "workers": 8, "target": 500}),
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--durability process` measures submits acknowledged before fsync (see the
    // controller's --durability); the default is full, an fsync per group commit.
    let durability = args
        .iter()
        .position(|a| a == "--durability")
        .and_then(|i| args.get(i + 1))
        .map_or("full", String::as_str)
        .to_owned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(async {
        pending_throughput_memory_squeue(quick, &durability).await?;
        latency_and_completion(quick).await
    })
}
