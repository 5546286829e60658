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

// === Differences found by a differential run against Slurm 22.05 (slurm-wlm 22.05.8, the
// reference cluster in ../shared/slurm-reference); each test quotes what Slurm printed. ===

/// `sbatch --wrap='env | grep ...'` on Slurm 22.05 printed, without a task count,
/// `SLURM_TASKS_PER_NODE=1` and no SLURM_NTASKS, SLURM_NPROCS, SLURM_NTASKS_PER_NODE or
/// SLURM_CPUS_PER_TASK; with `-N2 -n3`: `SLURM_NTASKS=3 SLURM_NPROCS=3
/// SLURM_TASKS_PER_NODE=2,1`; with `-N2 --ntasks-per-node=2 -c2`: `SLURM_NTASKS=4
/// SLURM_NTASKS_PER_NODE=2 SLURM_TASKS_PER_NODE=2(x2) SLURM_CPUS_PER_TASK=2`.
#[test]
fn task_variables_are_set_only_when_the_job_asked_for_tasks() {
    let c = Cluster::start(3);
    let probe = "for v in SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE \
                 SLURM_CPUS_PER_TASK; do eval \"echo $v=\\${$v--}\"; done; echo end";
    let cases: [(&[&str], &str); 3] = [
        (
            &[],
            "SLURM_NTASKS=- SLURM_NPROCS=- SLURM_NTASKS_PER_NODE=- SLURM_TASKS_PER_NODE=1 \
             SLURM_CPUS_PER_TASK=-",
        ),
        (
            &["-N2", "-n3"],
            "SLURM_NTASKS=3 SLURM_NPROCS=3 SLURM_NTASKS_PER_NODE=- SLURM_TASKS_PER_NODE=2,1 \
             SLURM_CPUS_PER_TASK=-",
        ),
        (
            &["-N2", "--ntasks-per-node=2", "-c2"],
            "SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_NTASKS_PER_NODE=2 \
             SLURM_TASKS_PER_NODE=2(x2) SLURM_CPUS_PER_TASK=2",
        ),
    ];
    for (i, (opts, want)) in cases.iter().enumerate() {
        let out = format!("tasks-{i}.out");
        let mut args = vec!["-o", &out, "--wrap", probe];
        args.splice(0..0, opts.iter().copied());
        // The submitting shell's own counts (sbatch from inside an allocation) must not leak.
        let id = c
            .cmd(&["sbatch", "--parsable"])
            .args(&args)
            .env("SLURM_NTASKS", "99")
            .env("SLURM_CPUS_PER_TASK", "99")
            .output()
            .unwrap();
        assert!(
            id.status.success(),
            "{}",
            String::from_utf8_lossy(&id.stderr)
        );
        let text = c.wait_file(&c.work.join(&out), "end", T);
        let got = text
            .lines()
            .filter(|l| *l != "end")
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(got, *want, "sbatch {opts:?}");
    }
}

/// Slurm 22.05, `sacct -P -o JobID,State,ExitCode,DerivedExitCode`:
///
/// ```text
/// 10|CANCELLED by 0|0:0|0:0        scancel of `sleep 300`
/// 10.batch|CANCELLED|0:15|
/// 11|TIMEOUT|0:0|0:0               -t 1, `sleep 300`
/// 11.batch|CANCELLED|0:15|
/// 13|FAILED|0:9|0:0                `kill -9 $$`
/// 13.batch|CANCELLED|0:9|
/// 14|COMPLETED|0:0|0:15            `srun sh -c 'kill -TERM $$'; exit 0`
/// 14.batch|COMPLETED|0:0|
/// 14.0|CANCELLED|0:15|
/// ```
///
/// Tandem records no canceller, so its allocation line says `CANCELLED` without `by UID`.
#[test]
fn sacct_puts_the_signal_on_the_batch_line_and_derives_the_steps_exit() {
    let c = Cluster::start(3);
    let rows = |id: u64, extra: &[&str]| -> String {
        let mut args = vec![
            "sacct",
            "-P",
            "-n",
            "-o",
            "JobID,State,ExitCode,DerivedExitCode",
        ];
        args.extend_from_slice(extra);
        let ids = id.to_string();
        args.extend(["-j", ids.as_str()]);
        let out = c.ok(&args);
        out.lines()
            .map(|l| match l.strip_prefix(&ids) {
                Some(rest) => format!("J{rest}\n"),
                None => format!("{l}\n"),
            })
            .collect::<String>()
    };
    let cancelled = c.sbatch(&["-o", "/dev/null", "--wrap", "sleep 300"]);
    let timeout = c.sbatch(&["-t", "0:02", "-o", "/dev/null", "--wrap", "sleep 300"]);
    let killed = c.sbatch(&["-o", "/dev/null", "--wrap", "kill -9 $$"]);
    let tandem = util::TANDEM;
    let srun = c.sbatch(&[
        "-o",
        "/dev/null",
        "--wrap",
        &format!("{tandem} srun sh -c 'kill -TERM $$'; exit 0"),
    ]);
    c.wait_state(cancelled, "RUNNING", T);
    c.ok(&["scancel", &cancelled.to_string()]);
    c.wait_state(cancelled, "CANCELLED", T);
    c.wait_state(timeout, "TIMEOUT", T);
    c.wait_state(killed, "FAILED", T);
    c.wait_state(srun, "COMPLETED", T);
    // The job record may reach accounting a moment after the state changes.
    let settled = |id: u64, want: &str| {
        let deadline = Instant::now() + T;
        let mut got = rows(id, &[]);
        while got != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            got = rows(id, &[]);
        }
        assert_eq!(got, want, "sacct of job {id}");
    };
    settled(cancelled, "J|CANCELLED|0:0|0:0\nJ.batch|CANCELLED|0:15|\n");
    settled(timeout, "J|TIMEOUT|0:0|0:0\nJ.batch|CANCELLED|0:15|\n");
    settled(killed, "J|FAILED|0:9|0:0\nJ.batch|CANCELLED|0:9|\n");
    settled(
        srun,
        "J|COMPLETED|0:0|0:15\nJ.batch|COMPLETED|0:0|\nJ.0|CANCELLED|0:15|\n",
    );
    assert_eq!(rows(srun, &["-X"]), "J|COMPLETED|0:0|0:15\n", "-X");
    // JSON: Slurm 22.05 printed "derived_exit_code": {"status": "SIGNALED", "return_code":
    // null, "signal": {"signal_id": 15, "name": "Terminated"}} and step ids "batch" and 0.
    let doc: serde_json::Value =
        serde_json::from_str(&c.ok(&["sacct", "--json", "-j", &srun.to_string()])).unwrap();
    let job = &doc["jobs"][0];
    assert_eq!(job["derived_exit_code"]["status"], "SIGNALED", "{job}");
    assert_eq!(job["derived_exit_code"]["signal"]["signal_id"], 15, "{job}");
    assert_eq!(job["steps"][0]["step"]["id"], "batch", "{job}");
    assert_eq!(job["steps"][1]["step"]["id"], 0, "{job}");
}

/// Slurm's commands parse with getopt: an option given twice is taken, the last value wins
/// for single values and for the lists squeue, sinfo and scancel filter by, while sacct
/// adds its lists up. What Slurm 22.05 did: `squeue -h --noheader` printed no header;
/// `sbatch -p nope -p batch` was accepted, `sbatch -p batch -p nope` refused ("invalid
/// partition specified: nope"); `sbatch -J a -J b` named the job b; `-t 5 -t 10` gave
/// 10:00; `A=1 B=2 sbatch --export=A --export=B` ran with `A= B=2`; `squeue -u nobody -u
/// root` listed root's jobs and `-u root -u nobody` none; `sacct -o JobID -o State` printed
/// both columns and `sacct -j 10 -j 11` both jobs.
#[test]
fn repeated_options_are_taken_as_slurms_getopt_takes_them() {
    let c = Cluster::start(2);
    let held = c.sbatch(&[
        "--hold", "-p", "nope", "-p", "batch", "-J", "a", "-J", "b", "-t", "5", "-t", "10",
        "--wrap", "true",
    ]);
    let sid = held.to_string();
    assert_eq!(
        c.ok(&["squeue", "-h", "--noheader", "-j", &sid, "-o", "%j %l %P"])
            .trim(),
        "b 10:00 batch"
    );
    let refused = c.run(&["sbatch", "-p", "batch", "-p", "nope", "--wrap", "true"]);
    assert!(!refused.status.success(), "the last -p (nope) must win");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !stderr.contains("cannot be used multiple times"),
        "{stderr}"
    );
    assert!(stderr.contains("nope"), "{stderr}");

    let exported = c
        .cmd(&[
            "sbatch",
            "--parsable",
            "--export=A",
            "--export=B",
            "-o",
            "export.out",
        ])
        .args(["--wrap", "echo \"A=$A B=$B\""])
        .env("A", "1")
        .env("B", "2")
        .output()
        .unwrap();
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let text = c.wait_file(&c.work.join("export.out"), "B=", T);
    assert_eq!(text.trim(), "A= B=2");

    let me = c.squeue_job(held, "%u");
    assert_eq!(
        c.ok(&["squeue", "-h", "-u", "nobody", "-u", &me, "-o", "%i"])
            .trim(),
        sid
    );
    assert_eq!(
        c.ok(&["squeue", "-h", "-u", &me, "-u", "nobody", "-o", "%i"])
            .trim(),
        ""
    );
    assert_eq!(
        c.ok(&["squeue", "-h", "-t", "R", "-t", "PD", "-o", "%i"])
            .trim(),
        sid
    );

    let second = c.sbatch(&["--hold", "--wrap", "true"]);
    let out = c.ok(&[
        "sacct",
        "-X",
        "-n",
        "-P",
        "-o",
        "JobID",
        "-o",
        "State",
        "-j",
        &sid,
        "-j",
        &second.to_string(),
    ]);
    assert_eq!(out, format!("{held}|PENDING\n{second}|PENDING\n"));

    // scancel -n: the last name wins (Slurm's `scancel -n nope -n b` cancelled job b).
    c.ok(&["scancel", "-n", "nope", "-n", "b"]);
    c.wait_state(held, "CANCELLED", T);
    assert_eq!(c.squeue_job(second, "%t").trim(), "PD");
}
