//! The check a worker makes before it tells the controller that an ended job's processes
//! are gone from its node (COMPLETING ends there): the job's cgroup (v1 here) must list no
//! process and no step task of the job may be unreaped. A process that ignores SIGTERM keeps
//! the node held until SIGKILL has taken it.
//!
//! Needs root and writable cgroups; without them the test prints `SKIP <name>: <why>`.

use std::io::Write;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tandem_worker::cgroup::plan::Allocation;
use tandem_worker::cgroup::{Isolation, Mode, Settings};
use tandem_worker::processes_gone;
use tandem_worker::step::registry::StepRegistry;

const JOB: u64 = 4_242;

fn isolation_or_skip(name: &str) -> Option<(Isolation, String)> {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups");
        return None;
    }
    let subtree = format!("gone-{}", std::process::id());
    let settings = Settings {
        mode: Mode::V1,
        subtree: Some(subtree.clone()),
        ..Default::default()
    };
    let iso = Isolation::setup(&settings, "gone", 1);
    if iso.version() != "v1" {
        eprintln!(
            "SKIP {name}: cgroup v1 not usable here (found {})",
            iso.version()
        );
        iso.remove_node_dirs();
        return None;
    }
    Some((iso, subtree))
}

/// Polls `cond` for up to 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn processes_are_gone_only_once_the_job_cgroup_is_empty() {
    let Some((iso, _subtree)) = isolation_or_skip("processes_gone_v1") else {
        return;
    };
    let steps = StepRegistry::default();
    // No cgroup at all (a node where the job never ran anything): nothing to wait for.
    assert!(processes_gone(&iso, &steps, JOB));

    let job = iso
        .create_job(JOB, &Allocation::default())
        .unwrap()
        .expect("a v1 job cgroup");
    let tasks = job.add_step(Some(0)).unwrap();
    // A step task that ignores SIGTERM, moved into the job's cgroup (a shell and its
    // `sleep`s, single-threaded: its thread is its whole process).
    let mut child = std::process::Command::new("sh")
        .args(["-c", "trap '' TERM; while :; do sleep 1; done"])
        .spawn()
        .unwrap();
    for t in &tasks {
        std::fs::OpenOptions::new()
            .write(true)
            .open(t)
            .unwrap()
            .write_all(child.id().to_string().as_bytes())
            .unwrap();
    }
    let pid = i32::try_from(child.id()).unwrap();
    eventually("the task is in the job's cgroup", || {
        job.pids().contains(&pid)
    })
    .await;
    assert!(
        !processes_gone(&iso, &steps, JOB),
        "a live process in the job's cgroup"
    );

    // SIGTERM is ignored: still there, still not gone.
    job.signal(Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(job.pids().contains(&pid), "the task ignores SIGTERM");
    assert!(!processes_gone(&iso, &steps, JOB));

    // SIGKILL takes it; once reaped, the cgroup lists nobody.
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    eventually("the job's cgroup is empty", || {
        processes_gone(&iso, &steps, JOB)
    })
    .await;

    // A step task the step service has not reaped yet still counts.
    steps.add_task((JOB, 0), 0, 0, i32::MAX - 7);
    assert!(!processes_gone(&iso, &steps, JOB));
    steps.remove_task((JOB, 0), 0);
    assert!(processes_gone(&iso, &steps, JOB));

    // Empty, the cgroup is removed; gone stays gone.
    assert!(job.destroy().await, "an empty cgroup is removed");
    assert!(iso.existing_job(JOB).is_none());
    assert!(processes_gone(&iso, &steps, JOB));
    iso.remove_node_dirs();
}
