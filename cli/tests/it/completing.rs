//! COMPLETING with real processes (issue 29): a 2-node job whose step on the second node
//! ignores SIGTERM and then cannot die (it froze itself in a cgroup v1 freezer, the kernel's
//! way of holding SIGKILL back). After `scancel` the batch node is free at once; the job shows
//! `CG` and the second node stays held (`comp`, then drained "Kill task failed" past
//! UnkillableStepTimeout) until its processes are really gone.
//!
//! Needs root and a writable cgroup v1 freezer; elsewhere it prints `SKIP` and returns.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::Cluster;

const FREEZER: &str = "/sys/fs/cgroup/freezer";

fn poll(what: &str, c: &Cluster, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}\n{}",
            c.controller_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Thaws a freezer cgroup when dropped.
struct Thaw(std::path::PathBuf);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "THAWED");
    }
}

fn node_state(c: &Cluster, node: &str) -> String {
    c.ok(&["sinfo", "-h", "-N", "-n", node, "-o", "%t"])
        .trim()
        .to_string()
}

#[test]
fn a_step_that_survives_the_kill_holds_its_node_and_the_job_completing() {
    let root = nix::unistd::getuid().is_root();
    if !root || !Path::new(FREEZER).join("tasks").exists() {
        eprintln!("SKIP completing: needs root and a cgroup v1 freezer at {FREEZER}");
        return;
    }
    let c = Cluster::start_with(2, &["--unkillable-step-timeout", "4s"]);
    let held = c.work.join("held.cg");
    // Task 1 (node-2) ignores SIGTERM, then freezes itself in a child of its own freezer
    // cgroup: still in the job's cgroup, deaf to SIGKILL until thawed.
    let script = c.script(
        "hold.sh",
        &format!(
            r#"#!/bin/sh
"$TANDEM_BIN" srun -N2 -n2 sh -c '
if [ "$SLURM_NODEID" = 1 ]; then
  trap "" TERM
  cg=$(grep -E "^[0-9]+:freezer:" /proc/self/cgroup | cut -d: -f3)
  hold="{FREEZER}$cg/hold"
  mkdir "$hold" && echo $$ > "$hold/tasks" && echo "$hold" > {held}.tmp && mv {held}.tmp {held}
  echo FROZEN > "$hold/freezer.state"
fi
sleep 300'
"#,
            held = held.display()
        ),
    );
    let out = c.work.join("hold.out");
    let id = c.sbatch(&["-N2", "-o", out.to_str().unwrap(), &script]);
    let ids = id.to_string();
    c.wait_squeue(id, "%t", "R", Duration::from_secs(20));
    poll("task 1 froze itself", &c, Duration::from_secs(20), || {
        held.exists()
    });
    let hold = std::fs::read_to_string(&held).unwrap().trim().to_string();
    // Whatever happens below, the frozen task is let go (and dies) when the test ends.
    let _thaw = Thaw(Path::new(&hold).join("freezer.state"));
    poll(
        "the freezer holds task 1",
        &c,
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(Path::new(&hold).join("freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
        },
    );

    c.ok(&["scancel", &ids]);
    // The batch node reported its processes gone with the end: free at once. The job is
    // CANCELLED for accounting but COMPLETING in the queue while node-2 is held.
    c.wait_squeue(id, "%t", "CG", Duration::from_secs(20));
    poll("node-1 is idle again", &c, Duration::from_secs(10), || {
        node_state(&c, "node-1") == "idle"
    });
    let shown = c.ok(&["scontrol", "show", "job", &ids]);
    assert!(shown.contains("JobState=COMPLETING"), "{shown}");
    assert!(
        matches!(node_state(&c, "node-2").as_str(), "comp" | "drng"),
        "node-2 held: {}",
        node_state(&c, "node-2")
    );
    let state = c.sacct_job(id, "State");
    assert!(
        state
            .lines()
            .next()
            .is_some_and(|s| s.starts_with("CANCELLED")),
        "accounting keeps the final state: {state}"
    );
    // A 2-node job cannot start while node-2 still holds the first job's processes.
    let next = c.sbatch(&["-N2", "-o", "/dev/null", "--wrap", "true"]);

    // Past kill wait + UnkillableStepTimeout: drained as Slurm does, job still held.
    poll("node-2 drains", &c, Duration::from_secs(30), || {
        node_state(&c, "node-2") == "drng"
    });
    let reasons = c.ok(&["sinfo", "-h", "-R", "-o", "%E|%N"]);
    assert!(
        reasons.contains("Kill task failed|node-2"),
        "sinfo -R: {reasons}"
    );
    assert_eq!(c.squeue_job(id, "%t"), "CG");
    assert_eq!(c.squeue_job(next, "%t"), "PD");

    // Thawed, the pending SIGKILL lands: the worker sees the job's cgroup empty, reports,
    // and the job leaves the queue. The node stays drained until resumed.
    std::fs::write(Path::new(&hold).join("freezer.state"), "THAWED").unwrap();
    c.wait_squeue(id, "%t", "", Duration::from_secs(20));
    assert_eq!(node_state(&c, "node-2"), "drain");
    assert_eq!(c.squeue_job(next, "%t"), "PD");
    let _ = std::fs::remove_dir(&hold);
    c.ok(&["scontrol", "update", "nodename=node-2", "state=resume"]);
    let end = c.wait_end(next, Duration::from_secs(30));
    assert_eq!(end["state"]["current"], "COMPLETED", "{end}");
}
