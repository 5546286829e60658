//! Batch-system benchmark: real controller and workers as processes on loopback, driven through
//! the gRPC API and the real CLI. Not a test: it prints one JSON object per figure on stdout
//! (`{"bench": ..., "value": ..., "unit": ..., ...}`) and compares against the targets of
//! issue #2 and #5. Absolute times on a shared 2-core machine are noisy; ratios between figures
//! measured in one run are the stable part.
//!
//! Run: `cargo bench -p tandem-cli --bench batch` (add `-- --quick` for a smaller run, and
//! `-- --durability process` to acknowledge submits before fsync, `-- --submit-only` for the
//! two submit figures alone, e.g. while profiling the controller, `-- --runnable` to submit
//! jobs that wait for resources instead of held ones, see [`SubmitKind`]).
//!
//! Figures:
//! - `submit_grpc_16_clients`: durable submissions per second, 16 client connections each
//!   submitting sequentially (one request in flight per client), held jobs so the scheduler
//!   does not run them.
//! - `submit_grpc_16_clients_pipelined`: the same 16 connections with 32 requests in flight
//!   each (HTTP/2 multiplexing); group commit turns concurrency into bigger transactions.
//!   Both submit figures carry `controller_cpu_us_per_job` and `client_cpu_us_per_job`: CPU
//!   time (user + system) each side spent per job. Clients and controller share the cores,
//!   so `1e6 * cores / (sum)` bounds the rate; on a shared machine these are steadier than
//!   the rate itself.
//! - `mem_per_pending_job_bytes`: controller RSS growth divided by the pending jobs added.
//! - `squeue_100k_ms`: `tandem squeue` printing every one of the pending jobs.
//! - `array_1m_accept_ms` / `array_1m_rss_growth_mb`: one 1,000,000-task array.
//! - `sbatch_cli_ms`: sequential `tandem sbatch --wrap` round trips (process start included).
//! - `submit_to_running_ms`: submit a job on an idle cluster, time until RUNNING.
//!
//! Latency figures give the mean as `value` and `mean`, `p50`, `p99` and `max` beside it: a
//! tail that a third of the calls pay hides under a good median.
//! - `trivial_jobs_per_s`: 10,000 `/bin/true` jobs through 8 local workers.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tandem_net::auth::Identity;
use tandem_net::endpoint::{AuthChannel, ClusterFile, connect};
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::{
    CancelRequest, JobInfo, JobRef, JobSpec, JobState, ListJobsRequest, SubmitRequest,
};

/// The binary under test: this build's, or `TANDEM_BENCH_BIN` (to compare two builds with
/// the same client side, e.g. a saved baseline against the working tree).
fn tandem() -> String {
    std::env::var("TANDEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tandem").to_owned())
}

struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(nodes: u32, extra: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let status = Command::new(tandem())
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
        let key = tandem_net::auth::ClusterKey::load(&file.key_file)?;
        Ok(connect(&file.controller, &key, &me()).await?)
    }

    fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(tandem());
        cmd.args(args)
            .env("TANDEM_CONFIG", self.cluster_file())
            .current_dir(self.dir.path());
        cmd
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(tandem())
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

/// CPU seconds (user + system) a process has used so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("malformed /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow::anyhow!("short /proc/{pid}/stat"))?
            .parse::<f64>()?)
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    // `rest` starts at field 3 (state), so field N is index N - 3.
    Ok((ticks(11)? + ticks(12)?) / hz)
}

/// Throughput of one submit run, and the CPU it cost per job on each side: with clients and
/// controller on the same cores, the sum bounds the reachable rate (cores / CPU per job).
struct SubmitRun {
    /// Jobs submitted (the requested total rounded down to whole lanes).
    jobs: usize,
    jobs_per_s: f64,
    controller_cpu_us: f64,
    client_cpu_us: f64,
}

impl SubmitRun {
    fn extra(&self) -> serde_json::Value {
        json!({
            "controller_cpu_us_per_job": (self.controller_cpu_us * 10.0).round() / 10.0,
            "client_cpu_us_per_job": (self.client_cpu_us * 10.0).round() / 10.0,
        })
    }
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

fn merge(into: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(o), Some(e)) = (into.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            o.insert(k.clone(), v.clone());
        }
    }
}

fn emit(bench: &str, value: f64, unit: &str, extra: serde_json::Value) {
    let mut obj = json!({"bench": bench, "value": (value * 1000.0).round() / 1000.0, "unit": unit});
    merge(&mut obj, extra);
    println!("{obj}");
}

/// Mean, p50, p99 and max of latency samples (ms), the mean first.
fn latency(v: &mut [f64]) -> (f64, serde_json::Value) {
    v.sort_by(|a, b| a.total_cmp(b));
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (
        mean,
        json!({"mean": round(mean), "p50": round(at(0.5)), "p99": round(at(0.99)), "max": round(at(1.0))}),
    )
}

/// What the submit figures submit: held jobs (no scheduling at all), or with `--runnable`
/// whole-node jobs the scheduler takes up, of which the first fill every node and the rest
/// wait for resources (the submit path with scheduling passes, as on a busy cluster).
#[derive(Clone, Copy)]
enum SubmitKind {
    Held,
    Runnable,
}

impl SubmitKind {
    fn spec(self, workdir: &Path) -> JobSpec {
        match self {
            Self::Held => spec("#!/bin/sh\ntrue\n", true, workdir),
            Self::Runnable => JobSpec {
                cpus_per_task: 64,
                ..spec("#!/bin/sh\nsleep 600\n", false, workdir)
            },
        }
    }
}

/// Submits `total` jobs from `clients` connections, each keeping `depth` requests in flight.
async fn submit_many(
    cluster: &Cluster,
    kind: SubmitKind,
    clients: usize,
    depth: usize,
    total: usize,
) -> anyhow::Result<SubmitRun> {
    let workdir = cluster.dir.path().to_owned();
    let per_client = total / clients;
    let mut channels = Vec::new();
    for _ in 0..clients {
        channels.push(cluster.channel().await?);
    }
    let controller = cluster.controller_pid()?.to_string();
    let (ctl0, me0) = (cpu_seconds(&controller)?, cpu_seconds("self")?);
    // Each connection carries `depth` lanes; a lane submits sequentially, so a connection
    // has exactly `depth` requests in flight. One long-lived task per lane keeps the client's
    // own cost per request to one task wake-up (no task spawned per request).
    let per_lane = per_client / depth;
    let start = Instant::now();
    let mut lanes = tokio::task::JoinSet::new();
    for ch in channels {
        for _ in 0..depth {
            let mut client = JobsClient::new(ch.clone());
            let spec = kind.spec(&workdir);
            lanes.spawn(async move {
                for i in 0..per_lane {
                    client
                        .submit(SubmitRequest {
                            spec: Some(spec.clone()),
                        })
                        .await
                        .map_err(|s| anyhow::anyhow!("submit {i}: {s}"))?;
                }
                anyhow::Ok(())
            });
        }
    }
    while let Some(r) = lanes.join_next().await {
        r??;
    }
    let secs = start.elapsed().as_secs_f64();
    let jobs = per_lane * depth * clients;
    let n = jobs as f64;
    Ok(SubmitRun {
        jobs,
        jobs_per_s: n / secs,
        controller_cpu_us: (cpu_seconds(&controller)? - ctl0) * 1e6 / n,
        client_cpu_us: (cpu_seconds("self")? - me0) * 1e6 / n,
    })
}

async fn pending_throughput_memory_squeue(
    quick: bool,
    durability: &str,
    submit_only: bool,
    kind: SubmitKind,
) -> anyhow::Result<()> {
    let cluster = Cluster::start(8, &["--durability", durability])?;
    let pending: usize = if quick { 20_000 } else { 100_000 };
    // Warm up connections and the store.
    submit_many(&cluster, kind, 16, 1, 1_600).await?;
    let rss0 = cluster.rss_bytes()?;

    let seq = submit_many(&cluster, kind, 16, 1, pending / 4).await?;
    let mut extra = json!({"in_flight_per_client": 1, "durability": durability, "held": matches!(kind, SubmitKind::Held), "target": 20000});
    merge(&mut extra, seq.extra());
    emit("submit_grpc_16_clients", seq.jobs_per_s, "jobs/s", extra);
    let piped = submit_many(&cluster, kind, 16, 32, pending - pending / 4).await?;
    let mut extra = json!({"in_flight_per_client": 32, "durability": durability, "held": matches!(kind, SubmitKind::Held), "target": 20000});
    merge(&mut extra, piped.extra());
    emit(
        "submit_grpc_16_clients_pipelined",
        piped.jobs_per_s,
        "jobs/s",
        extra,
    );
    if submit_only {
        return Ok(());
    }
    let added = seq.jobs + piped.jobs;
    let rss1 = cluster.rss_bytes()?;
    emit(
        "mem_per_pending_job_bytes",
        (rss1.saturating_sub(rss0)) as f64 / added as f64,
        "bytes",
        json!({"pending": added, "rss_mb": rss1 / (1 << 20), "target": 2048}),
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
        .max_decoding_message_size(tandem_net::endpoint::MAX_RESPONSE_BYTES);
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
    let (mean, mut stats) = latency(&mut ms);
    merge(&mut stats, json!({"samples": n, "target": 5}));
    emit("sbatch_cli_ms", mean, "ms", stats);
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
    let samples = ms.len();
    let (mean, mut stats) = latency(&mut ms);
    merge(&mut stats, json!({"samples": samples, "target": 20}));
    emit("submit_to_running_ms", mean, "ms", stats);
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
    let submit_only = args.iter().any(|a| a == "--submit-only");
    // `--durability process` measures submits acknowledged before fsync (see the
    // controller's --durability); the default is full, an fsync per group commit.
    let durability = args
        .iter()
        .position(|a| a == "--durability")
        .and_then(|i| args.get(i + 1))
        .map_or("full", String::as_str)
        .to_owned();
    let kind = if args.iter().any(|a| a == "--runnable") {
        SubmitKind::Runnable
    } else {
        SubmitKind::Held
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    rt.block_on(async {
        pending_throughput_memory_squeue(quick, &durability, submit_only, kind).await?;
        if submit_only {
            return Ok(());
        }
        latency_and_completion(quick).await
    })
}
