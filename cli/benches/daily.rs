//! The daily commands, timed as a researcher's shell runs them, beside the reference Slurm.
//!
//! Each figure is one shell-style loop of a real command (process start included), run first
//! against Slurm 22.05 when it is running here, then against a Tandem cluster of the same
//! size (8 nodes x 64 CPUs x 8 GPUs), one after the other in the same run. Not a test: it
//! prints one JSON object per system and figure (`mean_ms`, `p50_ms`, `p99_ms`, `max_ms`),
//! then one per figure with both means and `speedup` = Slurm's mean / Tandem's, and the
//! issue's target for it. Each system's turn starts on a quiet machine (under 15 % busy
//! for a second) and ends with a `steal_pct` line: the CPU time the hypervisor took
//! meanwhile, which on a shared VM moves a loop's tail more than any code change.
//!
//! Run: `cargo bench -p tandem-cli --bench daily` (`-- --quick` for fewer samples).
//!
//! The reference Slurm (a Slurm 22.05 cluster set up outside this repository) is used when
//! `scontrol ping` reports a controller UP; `TANDEM_BENCH_SLURM=0` skips it, `=1` makes its
//! absence an error. Its commands are found on `PATH` (`/usr/bin/sbatch`); Tandem's are
//! links named `sbatch`, `squeue`, ... to this build's binary (argv[0] dispatch, as a user
//! installs them). Every Slurm job the bench submitted is cancelled before Tandem's turn so
//! that slurmctld's scheduling of them does not take CPU from Tandem's loops.
//!
//! Figures:
//! - `sbatch_to_output`: on an idle cluster, one job at a time, from `sbatch`'s return to the
//!   job's first line in its output file: how long a researcher waits to see a job start.
//! - `sbatch_running`: sequential `sbatch --wrap=true -o /dev/null`; the jobs run meanwhile.
//! - `sbatch_held`: the same with `--hold` (the submit path alone).
//! - `sbatch_held_tcp` (Tandem only, compared with Slurm's `sbatch_held`): the same over
//!   TCP with TLS and a credential from the identity agent, as from a login node that is
//!   not the controller's host (`TANDEM_LOCAL_SOCKET=` turns the local socket off).
//! - `squeue_held`: `squeue` printing 5,000 held jobs (1,000 with `--quick`; `held_jobs`).
//! - `sacct_job`: `sacct -j ID` of a finished job.
//! - `scontrol_show_job`: `scontrol show job ID` of a held job.
//! - `srun_n2_in_allocation`: `srun -N2 true` inside a `sbatch -N2` job, timed by the job
//!   itself (`date +%s%N` around each srun; the same fork costs on both sides).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

/// 8 nodes x 64 CPUs x 8 GPUs, as the reference Slurm's `NODES=8` cluster.
const NODES: u32 = 8;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum System {
    Slurm,
    Tandem,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Slurm => "slurm",
            System::Tandem => "tandem",
        }
    }
}

/// Where one system's commands come from.
#[derive(Clone)]
struct Target {
    system: System,
    /// Prepended to PATH (Tandem's links); `None` = the commands already on PATH.
    bin_dir: Option<PathBuf>,
    env: Vec<(String, String)>,
    work: PathBuf,
}

impl Target {
    fn cmd(&self, name: &str) -> Command {
        let mut c = match &self.bin_dir {
            Some(d) => Command::new(d.join(name)),
            None => Command::new(name),
        };
        c.current_dir(&self.work)
            .stdin(Stdio::null())
            .env_remove("SLURM_JOB_ID");
        if let Some(d) = &self.bin_dir {
            let path = std::env::var("PATH").unwrap_or_default();
            c.env("PATH", format!("{}:{path}", d.display()));
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs `name args`, requires success, returns stdout.
    fn ok(&self, name: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self.cmd(name).args(args).stderr(Stdio::piped()).output()?;
        anyhow::ensure!(
            out.status.success(),
            "{} {name} {args:?}: {}",
            self.system.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Times `samples` sequential runs of `name args` (stdout discarded), in ms.
    fn time(&self, name: &str, args: &[&str], samples: usize) -> anyhow::Result<Vec<f64>> {
        let mut ms = Vec::with_capacity(samples);
        for _ in 0..samples {
            let t = Instant::now();
            let out = self
                .cmd(name)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(
                out.status.success(),
                "{} {name} {args:?}: {}",
                self.system.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(ms)
    }

    fn sbatch_id(&self, args: &[&str]) -> anyhow::Result<u64> {
        let mut a = vec!["--parsable"];
        a.extend_from_slice(args);
        let out = self.ok("sbatch", &a)?;
        let id = out.trim().split(';').next().unwrap_or_default();
        Ok(id.parse()?)
    }
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    mean: f64,
    p50: f64,
    p99: f64,
    max: f64,
    n: usize,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let at = |q: f64| v[((n as f64 * q).ceil() as usize).clamp(1, n) - 1];
    Stats {
        mean: v.iter().sum::<f64>() / n as f64,
        p50: at(0.50),
        p99: at(0.99),
        max: v[n - 1],
        n,
    }
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The figures of one system, by name.
type Figures = BTreeMap<&'static str, Stats>;

fn record(figs: &mut Figures, system: System, bench: &'static str, ms: Vec<f64>) {
    let s = stats(ms);
    println!(
        "{}",
        json!({"bench": bench, "system": system.name(), "unit": "ms", "samples": s.n,
               "mean_ms": r3(s.mean), "p50_ms": r3(s.p50), "p99_ms": r3(s.p99),
               "max_ms": r3(s.max)})
    );
    figs.insert(bench, s);
}

struct Samples {
    first_output: usize,
    held_jobs: usize,
    sbatch: usize,
    reads: usize,
    squeue: usize,
    srun: usize,
}

/// Runs every figure against one system.
fn run_figures(t: &Target, n: &Samples) -> anyhow::Result<Figures> {
    let mut figs = Figures::new();
    let sys = t.system;
    // Warm-up: page cache, connections, the controller's first-call paths.
    t.time("sbatch", &["--hold", "-o", "/dev/null", "--wrap=true"], 5)?;
    // What starting the system wrote (a fresh cluster's database, certificates, spools;
    // the warm-up's commits) is flushed before the first timed loop, not during it.
    settle(Duration::from_secs(30));

    let ms = sbatch_to_output(t, n.first_output)?;
    record(&mut figs, sys, "sbatch_to_output", ms);

    let first_done = t.sbatch_id(&["-o", "/dev/null", "--wrap=true"])?;
    let ms = t.time("sbatch", &["-o", "/dev/null", "--wrap=true"], n.sbatch)?;
    record(&mut figs, sys, "sbatch_running", ms);

    let ms = t.time(
        "sbatch",
        &["--hold", "-o", "/dev/null", "--wrap=true"],
        n.sbatch,
    )?;
    record(&mut figs, sys, "sbatch_held", ms);

    if sys == System::Tandem {
        let mut remote = t.clone();
        remote
            .env
            .push(("TANDEM_LOCAL_SOCKET".into(), String::new()));
        let ms = remote.time(
            "sbatch",
            &["--hold", "-o", "/dev/null", "--wrap=true"],
            n.sbatch,
        )?;
        record(&mut figs, sys, "sbatch_held_tcp", ms);
    }

    // Top up to HELD_JOBS held jobs from 4 parallel shells (not timed).
    let have = n.sbatch + 5;
    let lanes = 4;
    let per_lane = n.held_jobs.saturating_sub(have).div_ceil(lanes);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..lanes)
            .map(|_| {
                s.spawn(|| {
                    t.time(
                        "sbatch",
                        &["--hold", "-o", "/dev/null", "--wrap=true"],
                        per_lane,
                    )
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("submit lane panicked"))??;
        }
        Ok(())
    })?;
    let held = t.ok("squeue", &["-h", "-t", "PD", "-o", "%i"])?;
    let held_count = held.lines().count();
    let held_id = held
        .lines()
        .next()
        .ok_or_else(|| anyhow::anyhow!("no held job"))?
        .trim()
        .to_owned();
    anyhow::ensure!(
        held_count >= n.held_jobs,
        "{} held jobs only: {held_count}",
        sys.name()
    );
    let ms = t.time("squeue", &[], n.squeue)?;
    record(&mut figs, sys, "squeue_held", ms);

    wait_done(t, first_done)?;
    let id = first_done.to_string();
    let ms = t.time("sacct", &["-j", &id], n.reads)?;
    record(&mut figs, sys, "sacct_job", ms);

    let ms = t.time("scontrol", &["show", "job", &held_id], n.reads)?;
    record(&mut figs, sys, "scontrol_show_job", ms);

    let ms = srun_in_allocation(t, n.srun)?;
    record(&mut figs, sys, "srun_n2_in_allocation", ms);
    Ok(figs)
}

/// `samples` jobs, one at a time on an otherwise idle cluster: ms from `sbatch`'s return to
/// the job's line in its output file.
fn sbatch_to_output(t: &Target, samples: usize) -> anyhow::Result<Vec<f64>> {
    let mut ms = Vec::with_capacity(samples);
    for i in 0..samples {
        let out = t.work.join(format!("first-output-{i}.txt"));
        let _ = std::fs::remove_file(&out);
        t.ok(
            "sbatch",
            &["-o", &out.to_string_lossy(), "--wrap=echo started"],
        )?;
        let returned = Instant::now();
        while std::fs::metadata(&out).map_or(true, |m| m.len() == 0) {
            anyhow::ensure!(
                returned.elapsed() < Duration::from_secs(120),
                "{}: job {i} wrote no output in 120 s",
                t.system.name()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        ms.push(returned.elapsed().as_secs_f64() * 1000.0);
        // Idle between jobs, as when a researcher submits by hand: nothing the previous
        // start set in motion is still warm.
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(ms)
}

/// Until sacct records job `id` as COMPLETED.
fn wait_done(t: &Target, id: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let ids = id.to_string();
    loop {
        let out = t.ok("sacct", &["-X", "-n", "-P", "-o", "State", "-j", &ids])?;
        if out.trim() == "COMPLETED" {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "job {id} did not complete: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A `sbatch -N2` job that times `samples` runs of `srun -N2 true` itself (microseconds per
/// line), returned in ms.
fn srun_in_allocation(t: &Target, samples: usize) -> anyhow::Result<Vec<f64>> {
    let out = t.work.join(format!("srun-{}.txt", t.system.name()));
    let _ = std::fs::remove_file(&out);
    let script = format!(
        "#!/bin/bash\nsrun -N2 true\nfor i in $(seq {samples}); do s=$(date +%s%N); \
         srun -N2 true || exit 1; e=$(date +%s%N); echo $(( (e - s) / 1000 )); done > {p}.part\n\
         mv {p}.part {p}\n",
        p = out.display()
    );
    let path = t.work.join("srun-bench.sh");
    std::fs::write(&path, script)?;
    let id = t.sbatch_id(&["-N2", "-o", "/dev/null", &path.to_string_lossy()])?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while !out.exists() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} srun job {id} wrote nothing",
            t.system.name()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&out)?;
    let ms: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|us| us / 1000.0)
        .collect();
    anyhow::ensure!(
        ms.len() == samples,
        "{} srun job {id}: {text}",
        t.system.name()
    );
    Ok(ms)
}

/// Whether the reference Slurm answers here (or `TANDEM_BENCH_SLURM` says so).
fn slurm_wanted() -> anyhow::Result<bool> {
    let env = std::env::var("TANDEM_BENCH_SLURM").ok();
    if env.as_deref() == Some("0") {
        return Ok(false);
    }
    let up = Command::new("scontrol")
        .arg("ping")
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("UP"));
    anyhow::ensure!(
        up || env.as_deref() != Some("1"),
        "TANDEM_BENCH_SLURM=1 but `scontrol ping` finds no Slurm controller"
    );
    Ok(up)
}

/// A Tandem cluster of the reference's size; `tandem down` when dropped.
struct Tandem {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Tandem {
    fn start() -> anyhow::Result<Tandem> {
        let dir = tempfile::tempdir()?;
        let bin = PathBuf::from(
            std::env::var("TANDEM_BENCH_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_tandem").to_owned()),
        );
        let status = Command::new(&bin)
            .args(["up", "--nodes", &NODES.to_string(), "--cpus-per-node", "64"])
            .args(["--gpus-per-node", "8", "--mem-per-node", "512G"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--no-default-config", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "tandem up failed");
        let links = dir.path().join("bin");
        let status = Command::new(&bin)
            .arg("links")
            .arg(&links)
            .stdout(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "tandem links failed");
        Ok(Tandem { dir, bin })
    }

    fn target(&self) -> anyhow::Result<Target> {
        let work = self.dir.path().join("work");
        std::fs::create_dir_all(&work)?;
        Ok(Target {
            system: System::Tandem,
            bin_dir: Some(self.dir.path().join("bin")),
            env: vec![(
                "TANDEM_CONFIG".into(),
                self.dir
                    .path()
                    .join("state/cluster.json")
                    .to_string_lossy()
                    .into_owned(),
            )],
            work,
        })
    }
}

impl Drop for Tandem {
    fn drop(&mut self) {
        let _ = Command::new(&self.bin)
            .arg("down")
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The machine's CPU time so far, in clock ticks, from the first line of `/proc/stat`.
struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal
    total: u64,
    /// idle + iowait
    idle: u64,
    steal: u64,
}

impl CpuTimes {
    fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        Some(Self {
            total: cpu.iter().take(8).sum(),
            idle: cpu.get(3)? + cpu.get(4)?,
            steal: *cpu.get(7)?,
        })
    }
}

/// Runs `f` and prints the share of the machine's CPU time the hypervisor took meanwhile
/// (`steal` in `/proc/stat`): on a shared VM a few percent doubles a loop's tail, so a
/// figure is read with it.
fn with_steal<T>(system: System, f: impl FnOnce() -> T) -> T {
    let before = CpuTimes::now();
    let out = f();
    if let (Some(b), Some(a)) = (before, CpuTimes::now()) {
        let pct = 100.0 * (a.steal - b.steal) as f64 / (a.total - b.total).max(1) as f64;
        println!(
            "{}",
            json!({"system": system.name(), "steal_pct": (pct * 10.0).round() / 10.0})
        );
    }
    out
}

/// Flushes dirty pages, then waits until the machine is quiet (under 15 % of its CPU time
/// busy over a second), at most `limit`, and says on stderr how long that took.
fn settle(limit: Duration) {
    let started = Instant::now();
    // Dirty pages a build (or the other system's run) left would be written back while
    // the loops fsync: flushed first, so each system's commits pay only for their own.
    nix::unistd::sync();
    while started.elapsed() < limit {
        let Some(b) = CpuTimes::now() else { return };
        std::thread::sleep(Duration::from_secs(1));
        let Some(a) = CpuTimes::now() else { return };
        let (total, idle) = (a.total - b.total, a.idle - b.idle);
        if (total - idle) * 100 < total * 15 {
            eprintln!(
                "daily bench: machine quiet after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return;
        }
    }
    eprintln!(
        "daily bench: machine still busy after {} s; going on",
        limit.as_secs()
    );
}

/// The target for a figure: (Slurm's mean / Tandem's mean at least, p99 below ms).
fn target_of(bench: &str) -> (f64, Option<f64>) {
    match bench {
        "sbatch_running" | "sbatch_held" | "sbatch_held_tcp" => (2.0, Some(10.0)),
        _ => (1.0, None),
    }
}

/// The Slurm figure a Tandem figure is compared with (Slurm has one path for both).
fn slurm_counterpart(bench: &'static str) -> &'static str {
    match bench {
        "sbatch_held_tcp" => "sbatch_held",
        b => b,
    }
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick {
        Samples {
            first_output: 5,
            held_jobs: 1_000,
            sbatch: 60,
            reads: 20,
            squeue: 10,
            srun: 10,
        }
    } else {
        Samples {
            first_output: 20,
            held_jobs: 5_000,
            sbatch: 400,
            reads: 100,
            squeue: 30,
            srun: 30,
        }
    };
    let mut all: BTreeMap<System, Figures> = BTreeMap::new();
    // A build or a previous run still writing back would fall on the first loops.
    settle(Duration::from_secs(60));
    if slurm_wanted()? {
        let work = tempfile::tempdir()?;
        let slurm = Target {
            system: System::Slurm,
            bin_dir: None,
            env: Vec::new(),
            work: work.path().to_owned(),
        };
        let result = with_steal(System::Slurm, || run_figures(&slurm, &n));
        // Whatever happened, leave no job of ours in Slurm's queue.
        let me = nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name);
        let _ = slurm.ok("scancel", &["-u", &me]);
        all.insert(System::Slurm, result?);
        // Let slurmctld finish the cancellations (and slurmdbd its accounting) before
        // Tandem's turn: on two cores their catching up would land on Tandem's loops.
        std::thread::sleep(Duration::from_secs(5));
        settle(Duration::from_secs(90));
    } else {
        eprintln!("daily bench: no reference Slurm (scontrol ping); Tandem's figures only");
    }
    let tandem = Tandem::start()?;
    let target = tandem.target()?;
    all.insert(
        System::Tandem,
        with_steal(System::Tandem, || run_figures(&target, &n))?,
    );

    if let (Some(s), Some(t)) = (all.get(&System::Slurm), all.get(&System::Tandem)) {
        for (bench, ts) in t {
            let Some(ss) = s.get(slurm_counterpart(bench)) else {
                continue;
            };
            let (speedup_target, p99_target) = target_of(bench);
            let speedup = ss.mean / ts.mean;
            let met = speedup >= speedup_target && p99_target.is_none_or(|p| ts.p99 < p);
            println!(
                "{}",
                json!({"bench": bench, "slurm_mean_ms": r3(ss.mean), "tandem_mean_ms": r3(ts.mean),
                       "slurm_p99_ms": r3(ss.p99), "tandem_p99_ms": r3(ts.p99),
                       "speedup": r3(speedup), "target_speedup": speedup_target,
                       "target_p99_ms": p99_target, "met": met})
            );
        }
    }
    Ok(())
}
