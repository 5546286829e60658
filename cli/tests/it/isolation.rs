//! Job isolation seen through the real CLI on a real cluster (`tandem up`): a job over its
//! `--mem` ends `OUT_OF_MEMORY` in sacct and squeue's view while its neighbour on the same
//! node completes, and `scancel` kills a child that left the job's session.
//!
//! These need root and writable cgroups (the worker's `tandem __job-exec` launcher puts each
//! job in its cgroup); elsewhere each test prints `SKIP <name>: <why>` and returns.

use crate::support;

use std::time::{Duration, Instant};

use support::Cluster;
use tandem_worker::cgroup::{Isolation, Mode, Settings};

const T: Duration = Duration::from_secs(30);

fn cgroups_or_skip(name: &str) -> bool {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups");
        return false;
    }
    let iso = Isolation::setup(
        &Settings {
            mode: Mode::Auto,
            subtree: Some(format!("cli-probe-{}", std::process::id())),
            ..Default::default()
        },
        "probe",
        1,
    );
    iso.remove_node_dirs();
    if !iso.limits_memory() {
        eprintln!(
            "SKIP {name}: no writable cgroup memory controller here (found {})",
            iso.version()
        );
        return false;
    }
    true
}

#[test]
fn job_over_its_mem_ends_out_of_memory_and_its_neighbour_completes() {
    if !cgroups_or_skip("job_over_its_mem_ends_out_of_memory_and_its_neighbour_completes") {
        return;
    }
    // One node: both jobs share it.
    let c = Cluster::start(1);
    let neighbour = c.sbatch(&[
        "-J",
        "neighbour",
        "--mem=64M",
        "--wrap",
        "head -c 16777216 /dev/zero | tail >/dev/null; sleep 2; echo fine",
    ]);
    // `tail` holds a newline-free input in memory: 128 MiB against 32 MiB.
    let hog = c.sbatch(&[
        "-J",
        "hog",
        "--mem=32M",
        "--wrap",
        "head -c 134217728 /dev/zero | tail >/dev/null",
    ]);
    let rec = c.wait_end(hog, T);
    assert_eq!(rec["state"]["current"], "OUT_OF_MEMORY", "{rec}");
    let rec = c.wait_state(neighbour, "COMPLETED", T);
    assert_eq!(support::exit_code(&rec), "0:0");
    let sacct = c.ok(&[
        "sacct",
        "-X",
        "-n",
        "-P",
        "-j",
        &format!("{hog},{neighbour}"),
        "--format",
        "JobID,JobName,State",
    ]);
    assert_eq!(
        sacct,
        format!("{neighbour}|neighbour|COMPLETED\n{hog}|hog|OUT_OF_MEMORY\n"),
    );
    // squeue's %R names why it failed, as Slurm's `(OutOfMemory)`.
    let queue = c.ok(&[
        "squeue",
        "-h",
        "-t",
        "all",
        "-j",
        &hog.to_string(),
        "-o",
        "%T %R",
    ]);
    assert_eq!(queue, "OUT_OF_MEMORY (OutOfMemory)\n");
}

fn alive(pid: i32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()));
    !matches!(state, None | Some('Z') | Some('X'))
}

#[test]
fn scancel_kills_a_child_that_called_setsid() {
    if !cgroups_or_skip("scancel_kills_a_child_that_called_setsid") {
        return;
    }
    let c = Cluster::start(1);
    let pid_file = c.work.join("escaped.pid");
    let wrap = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' & wait",
        pid_file.display()
    );
    let id = c.sbatch(&["-J", "escaper", "--wrap", &wrap]);
    c.wait_state(id, "RUNNING", T);
    let deadline = Instant::now() + T;
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(Instant::now() < deadline, "the child never wrote its pid");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(alive(pid));
    c.ok(&["scancel", &id.to_string()]);
    let rec = c.wait_end(id, T);
    assert_eq!(rec["state"]["current"], "CANCELLED", "{rec}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} outlived scancel");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// sacct's CPU and memory figures come from the job's cgroup as it ended: the allocation
/// line's TotalCPU is the whole job's, the `.batch` line's TotalCPU and MaxRSS the batch
/// script's (Slurm 22.05 with cgroup accounting leaves MaxRSS blank on the allocation line).
#[test]
fn sacct_reports_the_cpu_and_peak_memory_the_cgroup_measured() {
    if !cgroups_or_skip("sacct_reports_the_cpu_and_peak_memory_the_cgroup_measured") {
        return;
    }
    let c = Cluster::start(1);
    // `tail` holds a newline-free 32 MiB in memory; the loop burns a little CPU.
    let id = c.sbatch(&[
        "--wrap",
        "head -c 33554432 /dev/zero | tail >/dev/null; \
         i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
    ]);
    c.wait_end(id, T);
    let out = c.sacct_job(id, "JobID,TotalCPU,MaxRSS,UserCPU");
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), 2, "{out}");
    let (job, batch) = (&rows[0], &rows[1]);
    assert_eq!(batch[0], format!("{id}.batch"), "{out}");
    assert_ne!(job[1], "00:00:00", "the job used CPU: {out}");
    assert_ne!(batch[3], "00:00:00", "the script used user CPU: {out}");
    assert_eq!(job[2], "", "no MaxRSS on the allocation line: {out}");
    let kib = |v: &str| -> u64 {
        let (n, unit) = v.split_at(v.len().saturating_sub(1));
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("MaxRSS {v:?}"));
        n * match unit {
            "K" => 1,
            "M" => 1024,
            "G" => 1024 * 1024,
            _ => panic!("MaxRSS unit {v:?}"),
        }
    };
    assert!(kib(batch[2]) >= 32 * 1024, "peak under 32 MiB: {out}");
}
