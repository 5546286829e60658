//! Slurm-compatible surface beyond the basics: arrays, dependencies, `--wait`, holds,
//! `scontrol update`, `--export`. One cluster per test.

mod util;

use std::time::{Duration, Instant};

use util::Cluster;

const T: Duration = Duration::from_secs(30);

/// Polls `f` until it returns a value or the deadline passes.
fn poll<F: FnMut() -> Option<String>>(what: &str, mut f: F) -> String {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if let Some(v) = f() {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {T:?} waiting for {what}");
}

#[test]
fn array_tasks_fold_in_squeue_and_write_per_task_files() {
    let c = Cluster::start(3);
    let script = c.script(
        "sweep.sh",
        "#!/bin/sh\n#SBATCH --array=0-5%2\n#SBATCH -o sweep-%A_%a.out\n\
         echo \"task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID count=$SLURM_ARRAY_TASK_COUNT\"\nsleep 1\n",
    );
    let id = c.sbatch(&[&script]);
    // While tasks pend, squeue folds them into one line.
    let folded = poll("a folded array line", || {
        let out = c.ok(&["squeue", "-h", "-o", "%i %t"]);
        out.lines()
            .find(|l| l.starts_with(&format!("{id}_[")) && l.ends_with(" PD"))
            .map(str::to_string)
    });
    assert!(folded.contains("%2]"), "throttle shown: {folded}");
    for task in 0..6 {
        let path = c.work.join(format!("sweep-{id}_{task}.out"));
        let text = c.wait_file(&path, "count=6", T);
        assert_eq!(
            text.lines().next().unwrap(),
            format!("task {task} of {id} count=6")
        );
    }
    // sacct lists every task under its JOBID_TASK id.
    let sacct = c.ok(&[
        "sacct",
        "-X",
        "-j",
        &id.to_string(),
        "-n",
        "-P",
        "--format",
        "JobID,State",
    ]);
    for task in 0..6 {
        assert!(sacct.contains(&format!("{id}_{task}|")), "{sacct}");
    }
}

#[test]
fn dependency_waits_then_runs_and_wait_returns_the_exit_code() {
    let c = Cluster::start(3);
    let first = c.sbatch(&["--wrap", "sleep 2"]);
    let second = c.sbatch(&["-d", &format!("afterok:{first}"), "--wrap", "true"]);
    let reason = c.ok(&["squeue", "-h", "-j", &second.to_string(), "-o", "%T %r"]);
    assert_eq!(reason.trim(), "PENDING Dependency");
    c.wait_state(second, "COMPLETED", T);

    let out = c.run(&["sbatch", "--wait", "--wrap", "exit 3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Submitted batch job "));
}

#[test]
fn hold_release_and_update() {
    let c = Cluster::start(3);
    let id = c.sbatch(&["--hold", "-t", "5", "--wrap", "echo released > held.out"]);
    let sid = id.to_string();
    assert_eq!(
        c.ok(&["squeue", "-h", "-j", &sid, "-o", "%t %l"]).trim(),
        "PD 5:00"
    );
    c.ok(&["scontrol", "update", &format!("JobId={id}"), "TimeLimit=10"]);
    assert_eq!(
        c.ok(&["squeue", "-h", "-j", &sid, "-o", "%t %l"]).trim(),
        "PD 10:00"
    );
    let show = c.ok(&["scontrol", "show", "job", &sid]);
    assert!(show.starts_with(&format!("JobId={id} ")), "{show}");
    assert!(show.contains(" JobState=PENDING "), "{show}");
    c.ok(&["scontrol", "release", &sid]);
    c.wait_state(id, "COMPLETED", T);
    c.wait_file(&c.work.join("held.out"), "released", T);
}

#[test]
fn export_none_hides_the_submitters_variables() {
    let c = Cluster::start(3);
    let out = c
        .cmd(&[
            "sbatch",
            "--parsable",
            "--export=NONE",
            "-o",
            "env.out",
            "--wrap",
            "echo secret=${SECRET:-unset} path=$PATH",
        ])
        .env("SECRET", "s3cr3t")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    c.wait_state(id, "COMPLETED", T);
    let text = c.wait_file(&c.work.join("env.out"), "secret=", T);
    assert!(text.contains("secret=unset"), "{text}");

    let out = c
        .cmd(&[
            "sbatch",
            "--parsable",
            "-o",
            "env2.out",
            "--export=ALL,EXTRA=1",
            "--wrap",
            "echo secret=$SECRET extra=$EXTRA",
        ])
        .env("SECRET", "s3cr3t")
        .output()
        .unwrap();
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    c.wait_state(id, "COMPLETED", T);
    let text = c.wait_file(&c.work.join("env2.out"), "secret=", T);
    assert!(text.contains("secret=s3cr3t extra=1"), "{text}");
}

#[test]
fn scancel_by_name_and_user_and_srun_outside_an_allocation() {
    let c = Cluster::start(3);
    let a = c.sbatch(&["-J", "sweep-a", "--hold", "--wrap", "true"]);
    let b = c.sbatch(&["-J", "sweep-b", "--hold", "--wrap", "true"]);
    let keep = c.sbatch(&["-J", "keeper", "--hold", "--wrap", "true"]);
    c.ok(&["scancel", "-n", "sweep-a"]);
    assert_eq!(c.wait_end(a, T)["state"]["current"], "CANCELLED");
    assert_eq!(c.job(b).unwrap()["state"]["current"], "PENDING");
    let me = tandem_cli::client::user_name();
    c.ok(&["scancel", "-u", &me, "-n", "sweep-b"]);
    assert_eq!(c.wait_end(b, T)["state"]["current"], "CANCELLED");
    assert_eq!(c.job(keep).unwrap()["state"]["current"], "PENDING");
    c.ok(&["scancel", "-u", &me]);
    assert_eq!(c.wait_end(keep, T)["state"]["current"], "CANCELLED");

    // srun without an allocation makes one, runs the tasks on it, and relays their output.
    let out = c.run(&[
        "srun",
        "-N",
        "2",
        "--ntasks-per-node=1",
        "-l",
        "sh",
        "-c",
        "echo rank=$SLURM_PROCID",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["0: rank=0", "1: rank=1"]);
    let out = c.run(&["srun", "-J", "srun-fail", "sh", "-c", "exit 5"]);
    assert_eq!(out.status.code(), Some(5));
    // The allocations srun made end as their steps did.
    let all = c.all_jobs();
    let state_of = |name: &str| {
        all.iter().find(|j| j["name"] == name).map(|j| {
            j["state"]["current"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    };
    assert_eq!(state_of("sh").as_deref(), Some("COMPLETED"), "{all:?}");
    assert_eq!(state_of("srun-fail").as_deref(), Some("FAILED"), "{all:?}");
}

#[test]
fn sbatch_reads_the_script_from_stdin() {
    use std::io::Write as _;
    let c = Cluster::start(3);
    let mut child = c
        .cmd(&["sbatch", "--parsable", "-o", "stdin.out"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"#!/bin/sh\n#SBATCH -J from-stdin\necho name=$SLURM_JOB_NAME\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    c.wait_state(id, "COMPLETED", T);
    c.wait_file(&c.work.join("stdin.out"), "name=from-stdin", T);
}

#[test]
fn scancel_signal_reaches_the_batch_script() {
    let c = Cluster::start(3);
    let script = c.script(
        "trap.sh",
        "#!/bin/bash\n#SBATCH -o trap.out\ntrap 'echo got USR1; exit 0' USR1\necho ready\nwhile :; do sleep 1 & wait $!; done\n",
    );
    let id = c.sbatch(&[&script]);
    c.wait_file(&c.work.join("trap.out"), "ready", T);
    c.ok(&["scancel", "--signal=USR1", "--batch", &id.to_string()]);
    c.wait_file(&c.work.join("trap.out"), "got USR1", T);
    let rec = c.wait_end(id, T);
    assert_eq!(rec["state"]["current"], "COMPLETED", "{rec}");
}
