//! Slurm-compatible surface beyond the basics: arrays, dependencies, `--wait`, holds,
//! `scontrol update`, `--export`. One cluster per test.

use crate::support;

use std::time::{Duration, Instant};

use support::Cluster;

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
    let id = c.sbatch_with(
        &[
            "--export=NONE",
            "-o",
            "env.out",
            "--wrap",
            "echo secret=${SECRET:-unset} path=$PATH",
        ],
        &[("SECRET", "s3cr3t")],
        None,
    );
    c.wait_state(id, "COMPLETED", T);
    let text = c.wait_file(&c.work.join("env.out"), "secret=", T);
    assert!(text.contains("secret=unset"), "{text}");

    let id = c.sbatch_with(
        &[
            "-o",
            "env2.out",
            "--export=ALL,EXTRA=1",
            "--wrap",
            "echo secret=$SECRET extra=$EXTRA",
        ],
        &[("SECRET", "s3cr3t")],
        None,
    );
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
    let c = Cluster::start(3);
    let id = c.sbatch_stdin(
        &["-o", "stdin.out"],
        "#!/bin/sh\n#SBATCH -J from-stdin\necho name=$SLURM_JOB_NAME\n",
    );
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
// reference cluster, set up outside this repository); each test quotes what Slurm printed. ===

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
        c.sbatch_with(
            &args,
            &[("SLURM_NTASKS", "99"), ("SLURM_CPUS_PER_TASK", "99")],
            None,
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
/// `by 0` is the uid that ran scancel: this test's own.
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
    let tandem = support::TANDEM;
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
    let by = nix::unistd::getuid();
    settled(
        cancelled,
        &format!("J|CANCELLED by {by}|0:0|0:0\nJ.batch|CANCELLED|0:15|\n"),
    );
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

    c.sbatch_with(
        &[
            "--export=A",
            "--export=B",
            "-o",
            "export.out",
            "--wrap",
            "echo \"A=$A B=$B\"",
        ],
        &[("A", "1"), ("B", "2")],
        None,
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

/// The task variables of the batch script and of an `srun` step in it, for the task options
/// a researcher uses. Slurm 22.05 (`sbatch [opts] probe.sh`, the probe printing each variable
/// or `-` when unset, then `srun` printing them in every task):
///
/// ```text
/// (none)     batch: NTASKS=- NPROCS=- NTASKS_PER_NODE=- TASKS_PER_NODE=1 CPUS_ON_NODE=1
///                   JOB_CPUS_PER_NODE=1 CPUS_PER_TASK=-
///            step (1 task): NTASKS=1 NPROCS=1 NTASKS_PER_NODE=- TASKS_PER_NODE=1
///                   CPUS_ON_NODE=1 JOB_CPUS_PER_NODE=1 CPUS_PER_TASK=-
/// -N2        batch: - - - 1(x2) 1 1(x2) -      steps (2 tasks): 2 2 - 1(x2) 1 1(x2) -
/// -n3        batch: 3 3 - 3 3 3 -              steps (3 tasks): 3 3 - 3 3 3 -
/// -N2 --ntasks-per-node=2
///            batch: 4 4 2 2(x2) 2 2(x2) -      steps (4 tasks): 4 4 2 2(x2) 2 2(x2) -
/// -c4        batch: - - - 1 4 4 4              step (1 task):   1 1 - 1 4 4 4
/// ```
///
/// (Slurm also sets SLURM_STEP_NUM_TASKS in the step, = SLURM_NTASKS there, and
/// SLURM_STEP_TASKS_PER_NODE, = SLURM_TASKS_PER_NODE in these cases.)
#[test]
fn task_variables_of_the_batch_script_and_its_steps_match_slurms() {
    let c = Cluster::start(3);
    let vars = "SLURM_NTASKS SLURM_NPROCS SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE \
                SLURM_CPUS_ON_NODE SLURM_JOB_CPUS_PER_NODE SLURM_CPUS_PER_TASK";
    let line = format!("for v in {vars}; do eval \"printf '%s ' \\${{$v--}}\"; done; echo");
    let tandem = support::TANDEM;
    let probe = c.script(
        "probe.sh",
        &format!(
            "#!/bin/sh\nprintf 'batch: '; {line}\n\
             {tandem} srun sh -c 'printf \"step: \"; {}' | sort\necho end\n",
            line.replace('\'', "'\\''")
        ),
    );
    let cases: [(&[&str], &str, &str, usize); 5] = [
        (&[], "- - - 1 1 1 -", "1 1 - 1 1 1 -", 1),
        (
            &["-N2"],
            "- - - 1(x2) 1 1(x2) -",
            "2 2 - 1(x2) 1 1(x2) -",
            2,
        ),
        (&["-n3"], "3 3 - 3 3 3 -", "3 3 - 3 3 3 -", 3),
        (
            &["-N2", "--ntasks-per-node=2"],
            "4 4 2 2(x2) 2 2(x2) -",
            "4 4 2 2(x2) 2 2(x2) -",
            4,
        ),
        (&["-c4"], "- - - 1 4 4 4", "1 1 - 1 4 4 4", 1),
    ];
    for (i, (opts, batch, step, tasks)) in cases.iter().enumerate() {
        let out = format!("probe-{i}.out");
        let mut args = vec!["-o", out.as_str()];
        args.extend_from_slice(opts);
        args.push(&probe);
        c.sbatch(&args);
        let text = c.wait_file(&c.work.join(&out), "end", T);
        let mut want = vec![format!("batch: {batch}")];
        want.extend(std::iter::repeat_n(format!("step: {step}"), *tasks));
        want.push("end".into());
        let got: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
        assert_eq!(got, want, "sbatch {opts:?}");
    }
}

/// A job waiting for a dependency or a begin time has its priority in squeue (`%Q`, and
/// `%p`/`-O priority` as a fraction of 2^32) while sprio leaves it out; a held job's is 0.
/// Slurm 22.05, `squeue -o "%i %Q %p %r"`: `10814 10000 0.00000232830644 Dependency`,
/// `10815 0 0.00000000000000 JobHeldUser`; `sprio -j` of either: "Unable to find jobs
/// matching user/id(s) specified".
#[test]
fn jobs_not_yet_eligible_show_a_priority_but_not_in_sprio() {
    let c = Cluster::start(1);
    let first = c.sbatch(&["-o", "/dev/null", "--wrap", "sleep 30"]);
    let after = c.sbatch(&[
        "-o",
        "/dev/null",
        &format!("--dependency=afterok:{first}"),
        "--wrap",
        "true",
    ]);
    let later = c.sbatch(&["-o", "/dev/null", "--begin=now+1hour", "--wrap", "true"]);
    let held = c.sbatch(&["-o", "/dev/null", "--hold", "--wrap", "true"]);
    let ids = format!("{after},{later},{held}");
    let rows = poll("reasons set", || {
        let out = c.ok(&["squeue", "-h", "-j", &ids, "-o", "%i %Q %p %r"]);
        (out.contains("Dependency") && out.contains("BeginTime")).then_some(out)
    });
    for line in rows.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let q: u64 = f[1].parse().unwrap();
        assert_eq!(
            f[2],
            format!("{:.14}", q as f64 / 4_294_967_296.0),
            "{line}"
        );
        if f[0] == held.to_string() {
            assert_eq!((q, f[3]), (0, "JobHeldUser"), "{line}");
        } else {
            assert!(q > 0, "{line}");
        }
    }
    let out = c.ok(&[
        "squeue",
        "-h",
        "-j",
        &later.to_string(),
        "-O",
        "priority,prioritylong",
    ]);
    let f: Vec<&str> = out.split_whitespace().collect();
    assert!(
        f[0].starts_with("0.0000") && f[1].parse::<u64>().unwrap() > 0,
        "{out}"
    );
    let out = c.run(&["sprio", "-j", &ids]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Unable to find jobs matching user/id(s) specified"
    );
    c.ok(&["scancel", &first.to_string()]);
}

/// The batch script runs with sbatch's file-creation mask and creates its output file with
/// it; srun's tasks run with srun's, which `SLURM_UMASK` gives in octal. Slurm 22.05:
/// `(umask 027; sbatch -o um.out --wrap 'umask; touch t')`: `0027`, both files
/// `-rw-r-----`; `(umask 077; srun sh -c 'umask; echo $SLURM_UMASK')`: `0077`, `0077`.
#[test]
fn jobs_and_tasks_run_with_the_submitters_umask() {
    use std::os::unix::fs::PermissionsExt as _;
    let c = Cluster::start(1);
    let tandem = support::TANDEM;
    let probe = c.script(
        "um.sh",
        &format!(
            "#!/bin/sh\numask\ntouch made.txt\n\
             (umask 077; {tandem} srun sh -c 'umask; echo $SLURM_UMASK')\necho end\n"
        ),
    );
    // A shell sets the mask: the test's own process keeps its own.
    let out = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            &format!("umask 027; exec {tandem} sbatch -o um.out {probe}"),
        ])
        .env("TANDEM_CONFIG", c.cluster_file())
        .env_remove("SLURM_UMASK")
        .current_dir(&c.work)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = c.wait_file(&c.work.join("um.out"), "end", T);
    assert_eq!(text, "0027\n0077\n0077\nend\n");
    for f in ["um.out", "made.txt"] {
        let mode = std::fs::metadata(c.work.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640, "{f}: {mode:o}");
    }
}

/// The names a batch script and its step's task find in their environment, beside Slurm
/// 22.05's for `sbatch --wrap 'env; srun env'` (one node, one task). Not set by Tandem:
/// `SLURM_CONF` (there is no slurm.conf), `SLURM_WORKING_CLUSTER` (slurmctld's address and
/// protocol version, for federation) and srun's own ports and address for PMI
/// (`SLURM_SRUN_COMM_HOST`, `SLURM_SRUN_COMM_PORT`, `SLURM_STEP_LAUNCHER_PORT`,
/// `SLURM_LAUNCH_NODE_IPADDR`). Set beyond 22.05: `SLURM_JOB_START_TIME` (Slurm 23.02's).
#[test]
fn the_variables_of_a_batch_script_and_a_task_are_slurms() {
    const SLURM_BATCH: &str = "ENVIRONMENT HOSTNAME SLURMD_NODENAME SLURM_CLUSTER_NAME \
        SLURM_CONF SLURM_CPUS_ON_NODE SLURM_GTIDS SLURM_JOBID SLURM_JOB_ACCOUNT \
        SLURM_JOB_CPUS_PER_NODE SLURM_JOB_GID SLURM_JOB_ID SLURM_JOB_NAME SLURM_JOB_NODELIST \
        SLURM_JOB_NUM_NODES SLURM_JOB_PARTITION SLURM_JOB_QOS SLURM_JOB_UID SLURM_JOB_USER \
        SLURM_LOCALID SLURM_NNODES SLURM_NODEID SLURM_NODELIST SLURM_NODE_ALIASES \
        SLURM_PRIO_PROCESS SLURM_PROCID SLURM_SUBMIT_DIR SLURM_SUBMIT_HOST \
        SLURM_TASKS_PER_NODE SLURM_TASK_PID SLURM_TOPOLOGY_ADDR SLURM_TOPOLOGY_ADDR_PATTERN \
        SLURM_WORKING_CLUSTER TMPDIR";
    const SLURM_TASK: &str = "SLURMD_NODENAME SLURM_CLUSTER_NAME SLURM_CONF \
        SLURM_CPUS_ON_NODE SLURM_DISTRIBUTION SLURM_GTIDS SLURM_JOBID SLURM_JOB_ACCOUNT \
        SLURM_JOB_CPUS_PER_NODE SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0 SLURM_JOB_GID \
        SLURM_JOB_ID SLURM_JOB_NAME SLURM_JOB_NODELIST SLURM_JOB_NUM_NODES \
        SLURM_JOB_PARTITION SLURM_JOB_QOS SLURM_JOB_UID SLURM_JOB_USER \
        SLURM_LAUNCH_NODE_IPADDR SLURM_LOCALID SLURM_NNODES SLURM_NODEID SLURM_NODELIST \
        SLURM_NODE_ALIASES SLURM_NPROCS SLURM_NTASKS SLURM_PRIO_PROCESS SLURM_PROCID \
        SLURM_SRUN_COMM_HOST SLURM_SRUN_COMM_PORT SLURM_STEPID SLURM_STEP_ID \
        SLURM_STEP_LAUNCHER_PORT SLURM_STEP_NODELIST SLURM_STEP_NUM_NODES \
        SLURM_STEP_NUM_TASKS SLURM_STEP_TASKS_PER_NODE SLURM_SUBMIT_DIR SLURM_SUBMIT_HOST \
        SLURM_TASKS_PER_NODE SLURM_TASK_PID SLURM_TOPOLOGY_ADDR SLURM_TOPOLOGY_ADDR_PATTERN \
        SLURM_UMASK SLURM_WORKING_CLUSTER";
    const NOT_HERE: [&str; 6] = [
        "SLURM_CONF",
        "SLURM_WORKING_CLUSTER",
        "SLURM_SRUN_COMM_HOST",
        "SLURM_SRUN_COMM_PORT",
        "SLURM_STEP_LAUNCHER_PORT",
        "SLURM_LAUNCH_NODE_IPADDR",
    ];
    let want = |names: &str| {
        let mut v: Vec<&str> = names
            .split_whitespace()
            .filter(|n| !NOT_HERE.contains(n))
            .chain(["SLURM_JOB_START_TIME"])
            .collect();
        v.sort_unstable();
        v.join(" ")
    };
    let c = Cluster::start(1);
    let tandem = support::TANDEM;
    let pick = "env | sed -n 's/^\\(SLURM[A-Z0-9_]*\\|ENVIRONMENT\\|HOSTNAME\\|TMPDIR\\)=.*/\\1/p' \
                | sort | tr '\\n' ' '; echo";
    let probe = c.script(
        "names.sh",
        &format!("#!/bin/sh\n{pick}\n{tandem} srun sh -c \"{pick}\"\necho end\n"),
    );
    // Only what the jobs set: any SLURM_* of the test's own environment stays out.
    let mut cmd = c.cmd(&["sbatch", "-o", "names.out", &probe]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SLURM")) {
        cmd.env_remove(k);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = c.wait_file(&c.work.join("names.out"), "end", T);
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    assert_eq!(lines[0], want(SLURM_BATCH), "batch");
    // (The reference listed only a task's SLURM* names.)
    let task: Vec<&str> = lines[1]
        .split_whitespace()
        .filter(|n| n.starts_with("SLURM"))
        .collect();
    assert_eq!(task.join(" "), want(SLURM_TASK), "task");
}

/// Why a node is out, who said so and when, as 22.05 prints it after `scontrol update
/// nodename=n8 state=drain reason="disk check"` (by root): `sinfo -R`
/// `REASON               USER      TIMESTAMP           NODELIST ` /
/// `disk check           root      2026-12-04T21:22:07 n8`; `scontrol show node n8`
/// `   Reason=disk check [root@2026-12-04T21:22:36]`; `sinfo -o "%E|%u|%H|%N"` of nodes
/// without one `none|Unknown|Unknown|n[1-7]`; after `state=resume`, the header alone.
#[test]
fn node_reasons_name_who_gave_them_and_when() {
    let c = Cluster::start(2);
    let me = nix::unistd::User::from_uid(nix::unistd::getuid())
        .unwrap()
        .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name);
    c.ok(&[
        "scontrol",
        "update",
        "nodename=node-2",
        "state=drain",
        "reason=disk check",
    ]);
    let lines: Vec<String> = c.ok(&["sinfo", "-R"]).lines().map(str::to_owned).collect();
    assert_eq!(
        lines[0],
        "REASON               USER      TIMESTAMP           NODELIST"
    );
    let row = &lines[1];
    assert!(
        row.starts_with(&format!("disk check           {me:<9} ")),
        "{row}"
    );
    assert!(row.ends_with(" node-2"), "{row}");
    let stamp = &row[31..50];
    assert_eq!(stamp.len(), "2026-12-04T21:22:07".len());
    assert_eq!(lines.len(), 2, "{lines:?}");
    let show = c.ok(&["scontrol", "show", "node", "node-2"]);
    assert!(
        show.contains(&format!("   Reason=disk check [{me}@{stamp}]\n")),
        "{show}"
    );
    assert!(
        !c.ok(&["scontrol", "show", "node", "node-1"])
            .contains("Reason=")
    );
    assert_eq!(
        c.ok(&["sinfo", "-h", "-N", "-n", "node-1", "-o", "%E|%u|%H|%N"]),
        "none|Unknown|Unknown|node-1\n"
    );
    c.ok(&["scontrol", "update", "nodename=node-2", "state=resume"]);
    assert_eq!(
        c.ok(&["sinfo", "-R"]),
        "REASON               USER      TIMESTAMP           NODELIST\n"
    );
}

/// `sacct --units` shows memory in one unit (22.05: a 1 MiB ReqMem is `1024K`, `1M`,
/// `0.00G`) and refuses another letter (`Invalid unit type 'X'. Possible options are
/// 'KMGTP'`).
#[test]
fn sacct_units_shows_memory_in_the_unit_asked_for() {
    let c = Cluster::start(1);
    let id = c.sbatch(&["--mem=1G", "-o", "/dev/null", "--wrap", "true"]);
    let ask = |unit: &str| {
        c.ok(&[
            "sacct",
            "-j",
            &id.to_string(),
            "-X",
            "-n",
            "-P",
            "-o",
            "ReqMem",
            &format!("--units={unit}"),
        ])
    };
    poll("the job in sacct", || {
        Some(ask("M")).filter(|o| !o.is_empty())
    });
    assert_eq!(ask("M"), "1024M\n");
    assert_eq!(ask("k"), "1048576K\n");
    assert_eq!(ask("G"), "1G\n");
    assert_eq!(ask("T"), "0.00T\n");
    let out = c.run(&["sacct", "--units=X", "-j", &id.to_string()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Invalid unit type 'X'. Possible options are 'KMGTP'")
    );
}

/// `SLURM_TASK_PID` is the pid of the process that sees it: the batch script's own (`$$`),
/// each task's; one inherited from the submitting shell does not survive. Slurm 22.05,
/// `sbatch -n2` of `echo batch $SLURM_TASK_PID $$; srun -n2 sh -c 'echo task
/// $SLURM_PROCID $SLURM_TASK_PID $$'`: `batch 30320 30320`, `task 0 30336 30336`,
/// `task 1 30337 30337`.
#[test]
fn slurm_task_pid_is_the_pid_of_the_script_and_of_each_task() {
    let c = Cluster::start(2);
    let tandem = support::TANDEM;
    let probe = c.script(
        "pid.sh",
        &format!(
            "#!/bin/sh\n\
             [ \"$SLURM_TASK_PID\" = $$ ] && echo batch ok\n\
             {tandem} srun -n2 sh -c '[ \"$SLURM_TASK_PID\" = $$ ] && echo task $SLURM_PROCID ok' | sort\n\
             echo end\n"
        ),
    );
    c.sbatch_with(
        &["-n2", "-o", "pid.out", &probe],
        &[("SLURM_TASK_PID", "1")],
        None,
    );
    let text = c.wait_file(&c.work.join("pid.out"), "end", T);
    assert_eq!(text, "batch ok\ntask 0 ok\ntask 1 ok\nend\n");
}

/// The allocation and `.batch` lines of each way a job ends, with and without `-X`, and the
/// exit codes of `--json`. Slurm 22.05, `sacct -P -o JobID,State,ExitCode,DerivedExitCode`:
///
/// ```text
/// 6|COMPLETED|0:0|0:0            `true`
/// 6.batch|COMPLETED|0:0|
/// 7|FAILED|3:0|0:0               `exit 3`
/// 7.batch|FAILED|3:0|
/// 8|CANCELLED by 0|0:0|0:0       scancel of a running `sleep 300`
/// 8.batch|CANCELLED|0:15|
/// 9|TIMEOUT|0:0|0:0              -t 1, `sleep 300`
/// 9.batch|CANCELLED|0:15|
/// 10|CANCELLED by 0|0:0|0:0      scancel while pending (--begin=now+1hour): no steps
/// ```
///
/// With `-X`, the first line of each alone. `--json` gave `"exit_code": {"status": "SUCCESS",
/// "return_code": 0}` on the allocation of 6, 8, 9 and 10, and on the batch steps of 6:
/// SUCCESS 0, of 8 and 9: `{"status": "SIGNALED", "return_code": null, "signal":
/// {"signal_id": 15, "name": "Terminated"}}`; 10 had `"steps": []`. (For 7 it printed SUCCESS
/// 0 too, against its own ExitCode 3:0; Tandem keeps `{"status": "FAILED", "return_code":
/// 3}`, what the text says.) `by 0` is the uid that ran scancel: this test's own.
#[test]
fn sacct_exit_codes_of_every_ending_match_slurms() {
    let c = Cluster::start(2);
    let completed = c.sbatch(&["-o", "/dev/null", "--wrap", "true"]);
    let failed = c.sbatch(&["-o", "/dev/null", "--wrap", "exit 3"]);
    let cancelled = c.sbatch(&["-o", "/dev/null", "--wrap", "sleep 300"]);
    let timeout = c.sbatch(&["-t", "0:02", "-o", "/dev/null", "--wrap", "sleep 300"]);
    let pending = c.sbatch(&["--begin=now+1hour", "-o", "/dev/null", "--wrap", "true"]);
    c.wait_state(cancelled, "RUNNING", T);
    c.ok(&["scancel", &cancelled.to_string(), &pending.to_string()]);
    let by = nix::unistd::getuid();
    let cancelled_lines = format!("J|CANCELLED by {by}|0:0|0:0\nJ.batch|CANCELLED|0:15|\n");
    let pending_lines = format!("J|CANCELLED by {by}|0:0|0:0\n");
    let want: [(u64, &str, &str); 5] = [
        (
            completed,
            "COMPLETED",
            "J|COMPLETED|0:0|0:0\nJ.batch|COMPLETED|0:0|\n",
        ),
        (failed, "FAILED", "J|FAILED|3:0|0:0\nJ.batch|FAILED|3:0|\n"),
        (cancelled, "CANCELLED", &cancelled_lines),
        (
            timeout,
            "TIMEOUT",
            "J|TIMEOUT|0:0|0:0\nJ.batch|CANCELLED|0:15|\n",
        ),
        (pending, "CANCELLED", &pending_lines),
    ];
    let rows = |id: u64, extra: &[&str]| -> String {
        let ids = id.to_string();
        let mut args = vec![
            "sacct",
            "-P",
            "-n",
            "-o",
            "JobID,State,ExitCode,DerivedExitCode",
        ];
        args.extend_from_slice(extra);
        args.extend(["-j", ids.as_str()]);
        c.ok(&args)
            .lines()
            .map(|l| format!("{}\n", l.replacen(&ids, "J", 1)))
            .collect()
    };
    for (id, state, lines) in want {
        c.wait_state(id, state, T);
        // The record may reach accounting a moment after the state changes.
        let deadline = Instant::now() + T;
        let mut got = rows(id, &[]);
        while got != lines && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            got = rows(id, &[]);
        }
        assert_eq!(got, lines, "sacct of the {state} job {id}");
        let first = lines.lines().next().unwrap_or_default();
        assert_eq!(
            rows(id, &["-X"]),
            format!("{first}\n"),
            "-X, {state} job {id}"
        );
    }

    let ids = [completed, failed, cancelled, timeout, pending].map(|i| i.to_string());
    let doc: serde_json::Value =
        serde_json::from_str(&c.ok(&["sacct", "--json", "-j", &ids.join(",")])).unwrap();
    let job = |id: u64| -> &serde_json::Value {
        doc["jobs"]
            .as_array()
            .and_then(|js| js.iter().find(|j| j["job_id"] == id))
            .unwrap_or_else(|| panic!("job {id} in {doc}"))
    };
    let success = serde_json::json!({"status": "SUCCESS", "return_code": 0});
    let term = serde_json::json!({"status": "SIGNALED", "return_code": null,
        "signal": {"signal_id": 15, "name": "Terminated"}});
    for (id, batch) in [
        (completed, Some(&success)),
        (cancelled, Some(&term)),
        (timeout, Some(&term)),
        (pending, None),
    ] {
        let j = job(id);
        assert_eq!(j["exit_code"], success, "allocation of {id}: {j}");
        match batch {
            Some(b) => {
                assert_eq!(j["steps"][0]["step"]["id"], "batch", "{j}");
                assert_eq!(&j["steps"][0]["exit_code"], b, "batch of {id}: {j}");
            }
            None => assert_eq!(j["steps"], serde_json::json!([]), "{j}"),
        }
    }
    let j = job(failed);
    let code = serde_json::json!({"status": "FAILED", "return_code": 3});
    assert_eq!(j["exit_code"], code, "{j}");
    assert_eq!(j["steps"][0]["exit_code"], code, "{j}");
}

/// An option given twice to the commands the test above does not reach, end to end (the
/// parsing of every command is in `lib.rs`'s tests). What Slurm 22.05 did, with partitions
/// batch (default) and debug, accounts a1, a2, a3:
///
/// - `sinfo -p batch -p debug` listed debug only, `-n n1 -n n5` n5 only, `-o '%P' -o '%D
///   %t'` printed NODES STATE.
/// - `sshare -A a1 -A a3` showed a1 and a3 with their users (the lists add up).
/// - `sprio -j15 -j16` showed 16 only; `-u root -u nobody` nobody's jobs (none).
/// - `sacctmgr -n -P show account name=a1 name=a3 format=account` printed a1 and a3; `show
///   assoc where user=root account=a2 format=account format=user` printed `a2|root`;
///   `modify account a1 set fairshare=10 fairshare=20` left Share 20.
/// - `scontrol update JobId=15 JobId=16 TimeLimit=7` changed only 16; `TimeLimit=5
///   TimeLimit=10` gave 10:00.
/// - `scancel -A a3 -A a1 -n na3 -n na1` cancelled a1's na1 only; `-t R -t PD` the pending
///   job; `-u root -u nobody` nothing, `-u nobody -u root` root's.
/// - `srun -N2 -N1 -n 3 -n 1 sh -c 'echo $SLURM_NNODES $SLURM_NTASKS'` printed `1 1`.
#[test]
fn every_other_command_takes_an_option_given_twice() {
    let me = tandem_cli::client::user_name();
    let mut config = String::from(
        "[[partition]]\nname = \"batch\"\ndefault = true\n[[partition]]\nname = \"debug\"\n",
    );
    for (account, shares) in [("a1", 50), ("a2", 30), ("a3", 20)] {
        config.push_str(&format!(
            "[[account]]\nname = \"{account}\"\nshares = {shares}\n\
             [[user]]\nuser = \"{me}\"\naccount = \"{account}\"\n"
        ));
    }
    let c = Cluster::start_with_config(2, &config);
    // sinfo: the last -p, -n and -o.
    assert_eq!(
        c.ok(&[
            "sinfo", "-h", "-p", "batch", "-p", "debug", "-o", "%D", "-o", "%P"
        ]),
        "debug\n"
    );
    let nodes = c.ok(&["sinfo", "-h", "-N", "-p", "batch", "-o", "%N"]);
    let nodes: Vec<&str> = nodes.lines().collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_eq!(
        c.ok(&[
            "sinfo", "-h", "-N", "-p", "batch", "-n", nodes[0], "-n", nodes[1], "-o", "%N"
        ]),
        format!("{}\n", nodes[1])
    );

    // sshare: -A adds up.
    let accounts: Vec<String> = c
        .ok(&["sshare", "-n", "-P", "-A", "a1", "-A", "a3"])
        .lines()
        .map(|l| l.split('|').next().unwrap_or_default().trim().to_string())
        .collect();
    assert!(
        accounts.iter().any(|a| a == "a1")
            && accounts.iter().any(|a| a == "a3")
            && !accounts.iter().any(|a| a == "a2"),
        "{accounts:?}"
    );

    // sacctmgr: names, conditions and format fields add up; a setting keeps the last value.
    assert_eq!(
        c.ok(&[
            "sacctmgr",
            "-n",
            "-n",
            "-P",
            "-P",
            "show",
            "account",
            "name=a1",
            "name=a3",
            "format=account"
        ]),
        "a1\na3\n"
    );
    assert_eq!(
        c.ok(&[
            "sacctmgr",
            "-n",
            "-P",
            "show",
            "assoc",
            "where",
            &format!("user={me}"),
            "account=a2",
            "format=account",
            "format=user"
        ]),
        format!("a2|{me}\n")
    );
    c.ok(&[
        "sacctmgr",
        "-i",
        "modify",
        "account",
        "a1",
        "set",
        "fairshare=10",
        "fairshare=20",
    ]);
    let shares = c.ok(&["sshare", "-n", "-P", "-A", "a1"]);
    let line = shares.lines().next().unwrap_or_default();
    assert_eq!(line.split('|').nth(2), Some("20"), "{shares}");

    // Pending jobs behind one that fills both nodes.
    let blocker = c.sbatch(&[
        "-N2",
        "--exclusive",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 300",
    ]);
    c.wait_state(blocker, "RUNNING", T);
    let pend = |account: &str, name: &str| {
        c.sbatch(&[
            "-A",
            account,
            "-J",
            name,
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ])
    };
    let (j1, j2, j3) = (pend("a1", "na1"), pend("a2", "na2"), pend("a3", "na3"));

    // sprio: the last -j and -u.
    let ids = |out: String| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    assert_eq!(
        ids(c.ok(&["sprio", "-h", &format!("-j{j1}"), &format!("-j{j2}")])),
        [j2.to_string()]
    );
    assert_eq!(
        ids(c.ok(&["sprio", "-h", "-u", &me, "-u", "nobody"])),
        Vec::<String>::new()
    );

    // scontrol update: the last JobId and the last TimeLimit.
    c.ok(&[
        "scontrol",
        "update",
        &format!("JobId={j1}"),
        &format!("JobId={j2}"),
        "TimeLimit=5",
        "TimeLimit=10",
    ]);
    assert_eq!(c.squeue_job(j2, "%l").trim(), "10:00");
    assert_ne!(c.squeue_job(j1, "%l").trim(), "10:00");

    // scancel: the last -A and -n, -t, -u.
    c.ok(&["scancel", "-A", "a3", "-A", "a1", "-n", "na3", "-n", "na1"]);
    c.wait_state(j1, "CANCELLED", T);
    c.ok(&["scancel", "-u", &me, "-u", "nobody", "-n", "na2"]);
    c.ok(&["scancel", "-t", "PD", "-t", "R", "-n", "na3"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.squeue_job(j2, "%t").trim(), "PD");
    assert_eq!(c.squeue_job(j3, "%t").trim(), "PD");
    c.ok(&["scancel", "-t", "R", "-t", "PD", "-n", "na3"]);
    c.wait_state(j3, "CANCELLED", T);
    c.ok(&["scancel", &blocker.to_string(), &j2.to_string()]);
    c.wait_state(blocker, "CANCELLED", T);

    // srun: the last -N and -n: one task on one node.
    let out = c.ok(&[
        "srun",
        "-N2",
        "-N1",
        "-n",
        "3",
        "-n",
        "1",
        "sh",
        "-c",
        "echo $SLURM_NTASKS $SLURM_STEP_NODELIST $SLURM_NNODES",
    ]);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 3, "one task: {out}");
    assert_eq!(words[0], "1", "{out}");
    assert!(nodes.contains(&words[1]), "one node: {out}");
    assert_eq!(words[2], "1", "{out}");
}

/// The layout variables of `srun` steps. Slurm 22.05 (8 nodes of 64 CPUs), in a `sbatch -N2
/// --ntasks-per-node=2` job (2 CPUs on each node; the batch script has `SLURM_NTASKS=4
/// SLURM_NNODES=2 SLURM_TASKS_PER_NODE=2(x2) SLURM_NODELIST=n[1-2]`), task 0 of each step:
///
/// ```text
/// srun -n1   SLURM_NNODES=1 SLURM_NTASKS=1 SLURM_NPROCS=1 SLURM_TASKS_PER_NODE=1
///            SLURM_STEP_NUM_NODES=1 SLURM_STEP_NUM_TASKS=1 SLURM_STEP_TASKS_PER_NODE=1
///            SLURM_STEP_NODELIST=n1 SLURM_NODELIST=n[1-2] SLURM_JOB_CPUS_PER_NODE=2(x2)
/// srun -n3   SLURM_NNODES=2 SLURM_NTASKS=3 SLURM_NPROCS=3 SLURM_TASKS_PER_NODE=2,1
///            SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=3 SLURM_STEP_TASKS_PER_NODE=2,1
///            SLURM_STEP_NODELIST=n[1-2] SLURM_NODELIST=n[1-2] SLURM_JOB_CPUS_PER_NODE=2(x2)
/// srun -N1   (4 tasks, from SLURM_NTASKS, on a node where the job has 2 CPUs) exit 1:
///            srun: error: Unable to create step for job 1: More processors requested than permitted
/// ```
///
/// (`srun -n5` and `srun -N1 -n3` are refused the same way; in a plain `-N2` job, with no
/// SLURM_NTASKS, `srun -N1` runs one task.) Outside any job, `srun -N2 --ntasks-per-node=2`
/// makes its own: `SLURM_NNODES=2 SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_TASKS_PER_NODE=2(x2)
/// SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_TASKS_PER_NODE=2(x2)
/// SLURM_STEP_NODELIST=n[1-2] SLURM_NODELIST=n[1-2] SLURM_JOB_CPUS_PER_NODE=2(x2)` (and
/// SLURM_JOB_NODELIST=n[1-2], SLURM_JOB_NUM_NODES=2, SLURM_NTASKS_PER_NODE=2). (`srun -N2
/// -n3` there gives `SLURM_JOB_CPUS_PER_NODE=2,1`, where Tandem's scheduler allocates 2 CPUs
/// on both nodes: an allocation difference, not the step's.)
#[test]
fn step_layout_variables_match_slurms() {
    let c = Cluster::start(3);
    let vars = "SLURM_NNODES SLURM_NTASKS SLURM_NPROCS SLURM_TASKS_PER_NODE \
                SLURM_STEP_NUM_NODES SLURM_STEP_NUM_TASKS SLURM_STEP_TASKS_PER_NODE \
                SLURM_STEP_NODELIST SLURM_NODELIST SLURM_JOB_CPUS_PER_NODE";
    let line = format!(
        "if [ $SLURM_PROCID = 0 ]; then for v in {vars}; do \
         eval \"printf '%s=%s ' $v \\${{$v--}}\"; done; echo; fi"
    );
    let quoted = line.replace('\'', "'\\''");
    let tandem = support::TANDEM;
    let probe = c.script(
        "layout.sh",
        &format!(
            "#!/bin/sh\necho \"batch: $SLURM_NODELIST\"\n\
             for o in -n1 -n3; do printf '%s: ' $o; {tandem} srun $o sh -c '{quoted}' 2>>warn.err; done\n\
             {tandem} srun -N1 true 2>refused.err; echo \"-N1: exit $?\"\necho end\n"
        ),
    );
    let id = c.sbatch(&["-N2", "--ntasks-per-node=2", "-o", "layout.out", &probe]);
    let text = c.wait_file(&c.work.join("layout.out"), "end", T);
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let nodes = lines[0].strip_prefix("batch: ").expect("batch line");
    let first = tandem_sched::hostlist::expand(nodes).unwrap()[0].clone();
    assert_eq!(
        lines[1..],
        [
            format!(
                "-n1: SLURM_NNODES=1 SLURM_NTASKS=1 SLURM_NPROCS=1 SLURM_TASKS_PER_NODE=1 \
                 SLURM_STEP_NUM_NODES=1 SLURM_STEP_NUM_TASKS=1 SLURM_STEP_TASKS_PER_NODE=1 \
                 SLURM_STEP_NODELIST={first} SLURM_NODELIST={nodes} SLURM_JOB_CPUS_PER_NODE=2(x2)"
            ),
            format!(
                "-n3: SLURM_NNODES=2 SLURM_NTASKS=3 SLURM_NPROCS=3 SLURM_TASKS_PER_NODE=2,1 \
                 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=3 SLURM_STEP_TASKS_PER_NODE=2,1 \
                 SLURM_STEP_NODELIST={nodes} SLURM_NODELIST={nodes} SLURM_JOB_CPUS_PER_NODE=2(x2)"
            ),
            "-N1: exit 1".to_owned(),
            "end".to_owned(),
        ],
        "{text}"
    );
    // Slurm 22.05 warns for both, as srun takes SLURM_NNODES=2 and SLURM_NTASKS_PER_NODE=2
    // from the job.
    let warned = std::fs::read_to_string(c.work.join("warn.err")).unwrap();
    assert_eq!(
        warned,
        "srun: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1\n\
         srun: Warning: can't honor --ntasks-per-node set to 2 which doesn't match the \
         requested tasks 3 with the number of requested nodes 2. Ignoring --ntasks-per-node.\n"
    );
    let refused = std::fs::read_to_string(c.work.join("refused.err")).unwrap();
    // Slurm 22.05 warns first: `srun -N1` takes SLURM_NTASKS=4 and SLURM_NTASKS_PER_NODE=2
    // from the job, and 4 tasks on 1 node do not match 2 per node.
    assert!(
        refused.trim_end()
            == format!(
                "srun: Warning: can't honor --ntasks-per-node set to 2 which doesn't match \
                 the requested tasks 4 with the number of requested nodes 1. Ignoring \
                 --ntasks-per-node.\n\
                 srun: error: Unable to create step for job {id}: \
                 More processors requested than permitted"
            ),
        "{refused}"
    );

    // Outside a job srun makes its own, and sets the job's variables as well.
    let out = c.ok(&["srun", "-N2", "--ntasks-per-node=2", "sh", "-c", &line]);
    let got = out.trim_end();
    let words: Vec<&str> = got.split(' ').collect();
    let nodes = words
        .iter()
        .find_map(|w| w.strip_prefix("SLURM_STEP_NODELIST="))
        .unwrap_or_else(|| panic!("{got}"));
    assert_eq!(
        got,
        format!(
            "SLURM_NNODES=2 SLURM_NTASKS=4 SLURM_NPROCS=4 SLURM_TASKS_PER_NODE=2(x2) \
             SLURM_STEP_NUM_NODES=2 SLURM_STEP_NUM_TASKS=4 SLURM_STEP_TASKS_PER_NODE=2(x2) \
             SLURM_STEP_NODELIST={nodes} SLURM_NODELIST={nodes} SLURM_JOB_CPUS_PER_NODE=2(x2)"
        )
    );
    assert_eq!(tandem_sched::hostlist::expand(nodes).unwrap().len(), 2);
    let out = c.ok(&[
        "srun",
        "-N2",
        "--ntasks-per-node=2",
        "sh",
        "-c",
        "[ $SLURM_PROCID = 0 ] && echo $SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES \
         $SLURM_NTASKS_PER_NODE $SLURM_STEP_NODELIST || true",
    ]);
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words.len(), 4, "{out}");
    assert_eq!(words[..3], [words[3], "2", "2"], "{out}");
}

/// Slurm 22.05 (reference, `scontrol show job`, `squeue -o %o`, `squeue --json`): `Command`
/// is the script's path and arguments, the path as typed when it has a `/`, else absolute
/// from the working directory or, failing that, from `PATH`; `(null)` for `--wrap` and a
/// script on stdin (`""` in JSON).
#[test]
fn command_names_the_script_as_slurm_does() {
    let c = Cluster::start(1);
    // sbatch names the directory as getcwd(3) does: symbolic links resolved.
    let work_dir = c.work.canonicalize().unwrap();
    let work = work_dir.display().to_string();
    c.script("job.sh", "#!/bin/sh\ntrue\n");
    let bin = work_dir.join("installed");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("tool.sh"),
        "#!/bin/sh\n#SBATCH -J from-path\ntrue\n",
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let show = |id: u64| {
        let out = c.ok(&["scontrol", "show", "job", &id.to_string()]);
        out.lines()
            .find_map(|l| l.trim().strip_prefix("Command="))
            .unwrap_or_else(|| panic!("no Command= in {out}"))
            .to_owned()
    };
    let listed = |id: u64| c.squeue_job(id, "%o").trim().to_owned();
    let json = |id: u64| {
        let out = c.ok(&["squeue", "--json", "-j", &id.to_string()]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["jobs"][0]["command"].as_str().unwrap_or("?").to_owned()
    };

    let by_name = c.sbatch(&["--hold", "job.sh", "a1", "a2"]);
    let want = format!("{work}/job.sh a1 a2");
    assert_eq!(show(by_name), want);
    assert_eq!(listed(by_name), want);
    assert_eq!(json(by_name), want);

    // `AllocNode:Sid=HOST:SID`: the submitting host and sbatch's session (this test's).
    let full = c.ok(&["scontrol", "show", "job", &by_name.to_string()]);
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let sid = nix::unistd::getsid(None).unwrap().as_raw();
    assert!(
        full.contains(&format!(" AllocNode:Sid={host}:{sid}\n")),
        "{full}"
    );

    let relative = c.sbatch(&["--hold", "./job.sh", "x"]);
    assert_eq!(show(relative), "./job.sh x");

    let from_path = c.sbatch_with(&["--hold", "tool.sh"], &[("PATH", &path)], None);
    assert_eq!(show(from_path), format!("{}/tool.sh", bin.display()));
    assert_eq!(c.squeue_job(from_path, "%j").trim(), "from-path");

    let wrapped = c.sbatch(&["--hold", "--wrap", "true"]);
    assert_eq!(show(wrapped), "(null)");
    assert_eq!(listed(wrapped), "(null)");
    assert_eq!(json(wrapped), "");

    let piped = c.sbatch_stdin(&["--hold"], "#!/bin/sh\ntrue\n");
    assert_eq!(show(piped), "(null)");

    let missing = c.run(&["sbatch", "--hold", "nowhere.sh"]);
    // Slurm 22.05: `sbatch: error: Unable to open file nowhere.sh`, no reason after it.
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "sbatch: error: Unable to open file nowhere.sh\n"
    );
    assert_eq!(missing.status.code(), Some(1));
}

/// The variables a batch script sees about its GPUs, its task ids and how it was submitted,
/// as Slurm 22.05 sets them (reference cluster, nodes with 8 GPUs; here 2, 4 CPUs). The
/// submitting shell has a device list and `FOO=x` exported:
///
/// ```text
/// (no options)          no CUDA/ROCR/GPU_DEVICE_ORDINAL, no SLURM_GPUS_ON_NODE, SLURM_GTIDS=0
/// --gpus=2              CUDA_VISIBLE_DEVICES=0,1 GPU_DEVICE_ORDINAL=0,1 ROCR_VISIBLE_DEVICES=0,1
///                       SLURM_GPUS=2 SLURM_GPUS_ON_NODE=2
/// --gres=gpu:1          SLURM_GPUS_ON_NODE=1, no SLURM_GPUS
/// --gpus-per-node=1 -N2 SLURM_GPUS_PER_NODE=1, no SLURM_GPUS
/// --gpus-per-task=1 -n2 SLURM_GPUS_PER_TASK=1 SLURM_GPUS_ON_NODE=2
/// --exclusive           every GPU of the node listed, no SLURM_GPUS
/// --export=NONE         SLURM_EXPORT_ENV=NONE SLURM_GET_USER_ENV=1, no FOO
/// --export=ALL,FOO=1    SLURM_EXPORT_ENV=ALL,FOO=1 SLURM_GET_USER_ENV=1 FOO=1
/// nice -n 5 sbatch      SLURM_PRIO_PROCESS=5 (0 otherwise, under every --export)
/// ```
#[test]
fn gpu_task_and_export_variables_match_slurms() {
    let c = Cluster::start(2);
    let vars = [
        "CUDA_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ROCR_VISIBLE_DEVICES",
        "SLURM_GPUS_ON_NODE",
        "SLURM_GPUS",
        "SLURM_GPUS_PER_NODE",
        "SLURM_GPUS_PER_TASK",
        "SLURM_GTIDS",
        "SLURM_EXPORT_ENV",
        "SLURM_GET_USER_ENV",
        "SLURM_PRIO_PROCESS",
        "FOO",
    ];
    let probe = format!(
        "for v in {}; do eval \"echo $v=\\${{$v--}}\"; done; echo end",
        vars.join(" ")
    );
    let submitter = [
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("ROCR_VISIBLE_DEVICES", "1"),
        ("FOO", "x"),
    ];
    let none = "CUDA_VISIBLE_DEVICES=- GPU_DEVICE_ORDINAL=- ROCR_VISIBLE_DEVICES=- \
                SLURM_GPUS_ON_NODE=-";
    let request = "SLURM_GPUS=- SLURM_GPUS_PER_NODE=- SLURM_GPUS_PER_TASK=-";
    let plain = "SLURM_GTIDS=0 SLURM_EXPORT_ENV=- SLURM_GET_USER_ENV=- SLURM_PRIO_PROCESS=0 FOO=x";
    let both = "CUDA_VISIBLE_DEVICES=0,1 GPU_DEVICE_ORDINAL=0,1 ROCR_VISIBLE_DEVICES=0,1 \
                SLURM_GPUS_ON_NODE=2";
    let cases: Vec<(&[&str], String)> = vec![
        (&[], format!("{none} {request} {plain}")),
        (
            &["--gpus=2"],
            format!("{both} SLURM_GPUS=2 SLURM_GPUS_PER_NODE=- SLURM_GPUS_PER_TASK=- {plain}"),
        ),
        (
            &["--gres=gpu:1"],
            format!(
                "CUDA_VISIBLE_DEVICES=0 GPU_DEVICE_ORDINAL=0 ROCR_VISIBLE_DEVICES=0 \
                 SLURM_GPUS_ON_NODE=1 {request} {plain}"
            ),
        ),
        (
            &["--gpus-per-node=1", "-N2"],
            format!(
                "CUDA_VISIBLE_DEVICES=0 GPU_DEVICE_ORDINAL=0 ROCR_VISIBLE_DEVICES=0 \
                 SLURM_GPUS_ON_NODE=1 SLURM_GPUS=- SLURM_GPUS_PER_NODE=1 \
                 SLURM_GPUS_PER_TASK=- {plain}"
            ),
        ),
        (
            &["--gpus-per-task=1", "-n2"],
            format!("{both} SLURM_GPUS=- SLURM_GPUS_PER_NODE=- SLURM_GPUS_PER_TASK=1 {plain}"),
        ),
        (&["--exclusive"], format!("{both} {request} {plain}")),
        (
            &["--export=NONE"],
            format!(
                "{none} {request} SLURM_GTIDS=0 SLURM_EXPORT_ENV=NONE SLURM_GET_USER_ENV=1 \
                 SLURM_PRIO_PROCESS=0 FOO=-"
            ),
        ),
        (
            &["--export=ALL,FOO=1"],
            format!(
                "{none} {request} SLURM_GTIDS=0 SLURM_EXPORT_ENV=ALL,FOO=1 \
                 SLURM_GET_USER_ENV=1 SLURM_PRIO_PROCESS=0 FOO=1"
            ),
        ),
    ];
    let read = |out: &str| {
        let text = c.wait_file(&c.work.join(out), "end", T);
        text.lines()
            .filter(|l| *l != "end")
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (i, (opts, want)) in cases.iter().enumerate() {
        let out = format!("vars-{i}.out");
        let mut args = vec!["-o", &out, "--wrap", &probe];
        args.splice(0..0, opts.iter().copied());
        c.sbatch_with(&args, &submitter, None);
        assert_eq!(read(&out), *want, "sbatch {opts:?}");
    }

    // The nice value sbatch ran at travels; the job itself is not reniced.
    let status = std::process::Command::new("nice")
        .args([
            "-n",
            "5",
            support::TANDEM,
            "sbatch",
            "-o",
            "nice.out",
            "--wrap",
        ])
        .arg("echo SLURM_PRIO_PROCESS=$SLURM_PRIO_PROCESS nice=$(nice); echo end")
        .env("TANDEM_CONFIG", c.cluster_file())
        .current_dir(&c.work)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run nice sbatch");
    assert!(status.success());
    assert_eq!(read("nice.out"), "SLURM_PRIO_PROCESS=5 nice=0");

    // Steps: each task's global ids on its node; an `srun` inside a job submitted with a
    // list to export exports that list too (Slurm's `SLURM_EXPORT_ENV`), unless told
    // `--export=ALL`. (The list names the cluster file, which this test's cluster is found
    // by; Slurm's jobs find theirs through `SLURM_CONF`.)
    let script = format!(
        "#!/bin/sh\n\
         FOO=y {t} srun -N1 -n1 /bin/sh -c 'echo inner FOO=${{FOO--}}'\n\
         FOO=y {t} srun -N1 -n1 --export=ALL /bin/sh -c 'echo all FOO=${{FOO--}}'\n\
         {t} srun -N2 -n3 /bin/sh -c 'echo $SLURM_PROCID:$SLURM_GTIDS' | sort | tr '\\n' ' '\n\
         echo; echo end\n",
        t = support::TANDEM
    );
    c.sbatch_with(
        &[
            "-N2",
            "-n3",
            "--export=TANDEM_CONFIG,PATH",
            "-o",
            "steps.out",
        ],
        &submitter,
        Some(&script),
    );
    assert_eq!(read("steps.out"), "inner FOO=- all FOO=y 0:0,1 1:0,1 2:2 ");
}

/// Slurm 22.05's long listings open with the time (`Fri Dec 04 05:26:09 2026`), not under
/// `-h`; with `-o` they are refused: `squeue: fatal: Options -o(--format) and -l(--long)
/// are mutually exclusive. Please remove one and retry.` (sinfo likewise). `sinfo -s`
/// sums a partition's nodes by state.
#[test]
fn long_listings_and_summaries_read_as_slurms() {
    let c = Cluster::start(2);
    c.sbatch(&["--hold", "--wrap", "true"]);
    let is_listing_time = |line: &str| {
        let t: Vec<&str> = line.split(' ').collect();
        t.len() == 5
            && ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].contains(&t[0])
            && t[1].len() == 3
            && t[2].len() == 2
            && t[3].len() == 8
            && t[3]
                .split(':')
                .all(|x| x.len() == 2 && x.parse::<u8>().is_ok())
            && t[4].len() == 4
            && t[4].parse::<u16>().is_ok()
    };
    for cmd in ["squeue", "sinfo"] {
        let long = c.ok(&[cmd, "-l"]);
        let lines: Vec<&str> = long.lines().collect();
        assert!(is_listing_time(lines[0]), "{cmd} -l:\n{long}");
        assert!(lines[1].contains("PARTITION"), "{cmd} -l:\n{long}");
        let bare = c.ok(&[cmd, "-l", "-h"]);
        assert!(
            !bare.lines().any(is_listing_time) && bare.lines().count() == 1,
            "{cmd} -l -h:\n{bare}"
        );
        let out = c.run(&[cmd, "-l", "-o", "%P"]);
        support::assert_one_line_error(
            &out,
            cmd,
            "Options -o(--format) and -l(--long) are mutually exclusive",
        );
    }
    assert_eq!(
        c.ok(&["sinfo", "-s"]),
        "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST\n\
         batch*       up   infinite          0/2/0/2 node-[1-2]\n"
    );
}

/// `squeue --start` and a pending job's `scontrol show job`, as Slurm 22.05 shows a job
/// behind a running one (`-N8 --exclusive -t 10` running, `-N8 -t 5` pending, one held):
///
/// ```text
///              JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           NODELIST(REASON)
///                 42     batch      big     root PD 2026-12-04T05:40:01      8 n[1-8]               (Resources)
///                 44     batch     held     root PD                 N/A      1 (null)               (JobHeldUser)
///    StartTime=2026-12-04T05:40:01 EndTime=2026-12-04T05:45:01 Deadline=N/A
///    NodeList= SchedNodeList=n[1-8]
/// ```
///
/// Pending jobs only, soonest first, the start the backfill plan holds for them (the
/// running job's start plus its limit) and its nodes.
#[test]
fn squeue_start_shows_the_plans_start_and_nodes() {
    let c = Cluster::start(2);
    let running = c.sbatch(&["-N2", "--exclusive", "-t", "10", "--wrap", "sleep 600"]);
    c.wait_state(running, "RUNNING", T);
    let held = c.sbatch(&["--hold", "-J", "held", "--wrap", "true"]);
    let big = c.sbatch(&["-N2", "-t", "5", "-J", "big", "--wrap", "true"]);
    let started = c.squeue_job(running, "%S");
    let at = |t: &str, minutes: i64| {
        let t: jiff::civil::DateTime = t.trim().parse().expect("a squeue time");
        t.checked_add(jiff::Span::new().minutes(minutes))
            .unwrap()
            .strftime("%Y-%m-%dT%H:%M:%S")
            .to_string()
    };
    let text = poll("the plan's start of the pending job", || {
        let out = c.ok(&["squeue", "--start"]);
        (!out.contains(" N/A      2 ")).then_some(out)
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES \
             SCHEDNODES           NODELIST(REASON)",
            &format!(
                "{big:>18}     batch      big     root PD {}      2 node-[1-2]           \
                 (Resources)",
                at(&started, 10)
            ),
            &format!(
                "{held:>18}     batch     held     root PD                 N/A      1 \
                 (null)               (JobHeldUser)"
            ),
        ],
        "{text}"
    );
    let show = c.ok(&["scontrol", "show", "job", &big.to_string()]);
    assert!(
        show.contains(&format!(
            "   StartTime={} EndTime={} Deadline=N/A\n",
            at(&started, 10),
            at(&started, 15)
        )),
        "{show}"
    );
    assert!(
        show.contains("   NodeList= SchedNodeList=node-[1-2]\n"),
        "{show}"
    );
    let held_show = c.ok(&["scontrol", "show", "job", &held.to_string()]);
    assert!(
        held_show.contains("   StartTime=Unknown EndTime=Unknown Deadline=N/A\n")
            && held_show.contains("   NodeList=\n"),
        "{held_show}"
    );
}

/// A job's `.batch` step holds what the job holds on its first node, not the whole
/// allocation. Slurm 22.05, `sbatch -N8 --exclusive` on 64-CPU, 8-GPU nodes,
/// `sacct -P -o JobID,AllocCPUS,AllocTRES,NNodes`:
///
/// ```text
/// 41|512|billing=512,cpu=512,gres/gpu=64,node=8|8
/// 41.batch|64|cpu=64,gres/gpu=8,mem=0,node=1|1
/// ```
#[test]
fn the_batch_step_holds_the_first_nodes_share() {
    let c = Cluster::start(2);
    let id = c.sbatch(&["-N2", "--exclusive", "--wrap", "true"]);
    c.wait_end(id, T);
    let out = c.sacct_job(id, "JobID,AllocCPUS,NNodes");
    assert_eq!(out, format!("{id}|8|2\n{id}.batch|4|1\n"));
    // Sorted by name, billing on the job's line only. (The reference tracks no memory; an
    // exclusive job here holds its nodes' memory, as one does where Slurm tracks it.) The
    // billing is weighted as fair share charges it, by the default weights here: 8 CPUs x 1
    // + 8 GiB x 0.25 + 4 GPUs x 16 = 74 (Slurm without TRESBillingWeights bills CPUs).
    let tres = c.sacct_job(id, "AllocTRES");
    assert_eq!(
        tres,
        "billing=74,cpu=8,gres/gpu=4,mem=8G,node=2\ncpu=4,gres/gpu=2,mem=4G,node=1\n"
    );
}

/// Slurm 22.05's scancel on a job that has ended or does not exist says nothing and exits 0
/// (with `-v` it says why); signalling one is an error (exit 1 here; Slurm exits with its
/// error number):
///
/// ```text
/// $ scancel 49; echo $?                      (49 completed)
/// 0
/// $ scancel -v 99999
/// scancel: Terminating job 99999
/// scancel: error: Kill job error on job id 99999: Invalid job id specified
/// $ scancel -s USR1 99999
/// scancel: error: Kill job error on job id 99999: Invalid job id specified
/// $ scancel -s USR1 50                       (50 held)
/// scancel: error: Kill job error on job id 50: Job can not be altered now, try again later
/// ```
#[test]
fn scancel_of_an_ended_or_unknown_job_is_quiet_as_slurms() {
    let c = Cluster::start(1);
    let done = c.sbatch(&["--wrap", "true"]);
    c.wait_end(done, T);
    let held = c.sbatch(&["--hold", "--wrap", "true"]);
    let run = |args: &[&str]| {
        let out = c.run(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let done = done.to_string();
    let held = held.to_string();
    assert_eq!(run(&["scancel", &done]), (Some(0), String::new()));
    assert_eq!(run(&["scancel", "99999"]), (Some(0), String::new()));
    assert_eq!(
        run(&["scancel", "-v", "99999", &done]),
        (
            Some(0),
            format!(
                "scancel: Terminating job 99999\nscancel: Terminating job {done}\n\
                 scancel: error: Kill job error on job id 99999: Invalid job id specified\n\
                 scancel: error: Kill job error on job id {done}: Job/step already completing \
                 or completed\n"
            )
        )
    );
    assert_eq!(
        run(&["scancel", "-s", "USR1", "99999"]),
        (
            Some(1),
            "scancel: error: Kill job error on job id 99999: Invalid job id specified\n".into()
        )
    );
    assert_eq!(
        run(&["scancel", "-s", "USR1", &held]),
        (
            Some(1),
            format!(
                "scancel: error: Kill job error on job id {held}: Job can not be altered now, \
                 try again later\n"
            )
        )
    );
    // The held job is still there to cancel, quietly.
    assert_eq!(run(&["scancel", &held]), (Some(0), String::new()));
}

/// Slurm 22.05 keeps an ended job for `MinJobAge` (300 s): `squeue` leaves it out, `-t CD`
/// and `-t all` show it, `-j` of it prints the header alone; `-j` of an id it does not
/// know is an error (`slurm_load_jobs error: Invalid job id specified`, exit 1), but not
/// within a list of ids:
///
/// ```text
/// $ squeue -t all
///              JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)
///                 51     batch     wrap     root CD       0:00      1 n1
/// ```
#[test]
fn squeue_shows_ended_jobs_when_asked_and_refuses_an_unknown_id() {
    let c = Cluster::start(1);
    let done = c.sbatch(&["--wrap", "true"]);
    c.wait_end(done, T);
    let id = done.to_string();
    let header = "             JOBID PARTITION     NAME     USER ST       TIME  NODES \
                  NODELIST(REASON)\n";
    assert_eq!(c.ok(&["squeue"]), header);
    for states in ["CD", "all", "COMPLETED,PD"] {
        assert_eq!(
            c.ok(&["squeue", "-h", "-t", states, "-o", "%i %t"]),
            format!("{id} CD\n"),
            "-t {states}"
        );
    }
    assert_eq!(c.ok(&["squeue", "-j", &id]), header);
    support::assert_one_line_error(
        &c.run(&["squeue", "-j", "99999"]),
        "squeue",
        "Invalid job id specified",
    );
    assert_eq!(c.ok(&["squeue", "-j", &format!("{id},99999")]), header);
}

/// Every command answers `-V`/`--version` as Slurm's do (`slurm-wlm 22.05.8` from Debian's
/// packages, `slurm 22.05.8` upstream), with what it really is after; `scontrol ping` says
/// `Slurmctld(primary) at HOST is UP`, or `DOWN` with exit 1 once the controller is gone.
#[test]
fn version_and_ping_answer_as_slurms() {
    let c = Cluster::start(1);
    for cmd in tandem_cli::SLURM_COMMANDS {
        for flag in ["-V", "--version"] {
            assert_eq!(
                c.ok(&[cmd, flag]),
                format!("{}\n", tandem_cli::SLURM_VERSION_LINE),
                "{cmd} {flag}"
            );
        }
    }
    assert!(tandem_cli::SLURM_VERSION_LINE.starts_with("slurm 22.05.8 (tandem "));
    assert_eq!(
        c.ok(&["scontrol", "ping"]),
        "Slurmctld(primary) at 127.0.0.1 is UP\n"
    );
    let pid = std::fs::read_to_string(c.state_dir().join("controller.pid")).unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .expect("kill the controller");
    assert!(killed.success());
    let deadline = Instant::now() + T;
    let out = loop {
        let out = c.run(&["scontrol", "ping"]);
        if out.status.code() != Some(0) || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Slurmctld(primary) at 127.0.0.1 is DOWN\n"
    );
}

/// A `-u` the password database does not know, as Slurm 22.05 answers it: squeue says
/// `squeue: error: Invalid user: X` and lists the other users' jobs (none if it knew none),
/// exiting 0; `sacct: error: Invalid user id: X` and `scancel: error: Invalid user name: X`
/// exit 1. A numeric uid stands for its user.
#[test]
fn unknown_users_are_reported_as_slurms() {
    let c = Cluster::start(1);
    let held = c.sbatch(&["--hold", "--wrap", "true"]).to_string();
    let me = tandem_cli::client::user_name();
    let uid = nix::unistd::getuid().as_raw().to_string();
    let squeue = |users: &str| {
        let out = c.run(&["squeue", "-h", "-o", "%i", "-u", users]);
        assert_eq!(out.status.code(), Some(0), "squeue -u {users}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let invalid = "squeue: error: Invalid user: nosuchuser\n".to_string();
    assert_eq!(squeue("nosuchuser"), (String::new(), invalid.clone()));
    assert_eq!(
        squeue(&format!("nosuchuser,{me}")),
        (format!("{held}\n"), invalid)
    );
    assert_eq!(squeue(&uid), (format!("{held}\n"), String::new()));
    support::assert_one_line_error(
        &c.run(&["sacct", "-u", "nosuchuser"]),
        "sacct",
        "Invalid user id: nosuchuser",
    );
    support::assert_one_line_error(
        &c.run(&["scancel", "-u", "nosuchuser"]),
        "scancel",
        "Invalid user name: nosuchuser",
    );
    assert_eq!(c.squeue_job(held.parse().unwrap(), "%t"), "PD");
}

/// srun reports tasks that failed, per node and outcome, as Slurm 22.05's does:
///
/// ```text
/// $ srun -n2 sh -c 'exit 3'
/// srun: error: n1: tasks 0-1: Exited with exit code 3
/// $ srun -n1 nosuchcmd
/// srun: error: n1: task 0: Exited with exit code 2
/// slurmstepd-n1: error: execve(): nosuchcmd: No such file or directory
/// $ srun --pty -n1 echo hi < /dev/null
/// srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device
/// srun: error: Not using a pseudo-terminal, disregarding --pty option
/// hi
/// ```
#[test]
fn srun_reports_failed_tasks_as_slurms() {
    let c = Cluster::start(1);
    let out = c.run(&["srun", "-n2", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "srun: error: node-1: tasks 0-1: Exited with exit code 3\n"
    );
    let out = c.run(&["srun", "-n1", "nosuchcmd"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: execve(): nosuchcmd: No such file or directory\n")
            && err.contains("srun: error: node-1: task 0: Exited with exit code 2\n"),
        "{err}"
    );
    let ok = c.run(&["srun", "-n2", "true"]);
    assert!(ok.status.success() && ok.stderr.is_empty(), "{ok:?}");
    // `--pty` without a terminal is disregarded, in Slurm's words.
    let pty = c.run(&["srun", "--pty", "-n1", "echo", "hi"]);
    assert!(pty.status.success(), "{pty:?}");
    assert_eq!(String::from_utf8_lossy(&pty.stdout), "hi\n");
    assert_eq!(
        String::from_utf8_lossy(&pty.stderr),
        "srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device\n\
         srun: error: Not using a pseudo-terminal, disregarding --pty option\n"
    );
}

/// sacct's window as Slurm 22.05 takes it: a start after the end (now, when no end is
/// given) is refused, `sacct: error: Start time (2026-12-04T12:00:00) requested is after end
/// time (2026-12-04T06:17:15).`; yearless dates and times of day name the past (unit tests
/// in `tandem_sched::time`).
#[test]
fn sacct_refuses_a_window_that_ends_before_it_starts() {
    let c = Cluster::start(1);
    support::assert_one_line_error(
        &c.run(&["sacct", "-S", "now+1hour"]),
        "sacct",
        "requested is after end time",
    );
    support::assert_one_line_error(
        &c.run(&["sacct", "-S", "2026-01-02", "-E", "2026-01-01"]),
        "sacct",
        "Start time (2026-01-02T00:00:00) requested is after end time (2026-01-01T00:00:00)",
    );
    assert!(c.run(&["sacct", "-S", "midnight"]).status.success());
}

#[test]
fn test_only_says_when_and_where_a_job_would_start_and_submits_nothing() {
    let c = Cluster::start(2);
    let stderr =
        |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).trim().to_owned();
    // An idle cluster: now, on the nodes and CPUs it would get; stdout stays empty.
    let out = c.run(&["sbatch", "--test-only", "-N2", "-c", "2", "--wrap=true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    let said = stderr(&out);
    let (head, tail) = said.split_once(" to start at ").expect(&said);
    assert_eq!(head, "sbatch: Job 1");
    let (when, rest) = tail.split_once(' ').expect(&said);
    assert_eq!(when.len(), "2026-12-04T18:59:23".len(), "{said}");
    assert_eq!(
        rest,
        "using 4 processors on nodes node-[1-2] in partition batch"
    );
    // Also as a directive, given twice; nothing was submitted either time.
    let script = c.script(
        "t.sh",
        "#!/bin/sh\n#SBATCH --test-only\n#SBATCH --test-only\ntrue\n",
    );
    let out = c.run(&["sbatch", &script]);
    assert!(
        stderr(&out).starts_with("sbatch: Job 1 to start at "),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.ok(&["squeue", "-h"]), "");

    // A full cluster: when the running job's time limit ends, on its node.
    let id = c.sbatch(&[
        "-N2",
        "--exclusive",
        "-t",
        "10",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 60",
    ]);
    assert_eq!(id, 1, "the id --test-only announced");
    c.wait_state(id, "RUNNING", T);
    let show = c.ok(&["scontrol", "show", "job", &id.to_string()]);
    let end = show
        .split_whitespace()
        .find_map(|w| w.strip_prefix("EndTime="))
        .expect(&show);
    // A running job's end is its start plus its limit, in scontrol and squeue alike (as
    // in Slurm; it was Unknown and N/A).
    assert_ne!(end, "Unknown");
    assert_eq!(
        c.ok(&["squeue", "-h", "-j", &id.to_string(), "-o", "%e"])
            .trim(),
        end
    );
    let out = c.run(&["sbatch", "--test-only", "-t", "5", "--wrap=true"]);
    let said = stderr(&out);
    assert!(
        said.starts_with(&format!(
            "sbatch: Job 2 to start at {end} using 1 processors on nodes node-"
        )),
        "{said} (the running job ends at {end})"
    );

    // A refusal is an allocation failure, exit 1, and creates nothing.
    let out = c.run(&["sbatch", "--test-only", "-p", "nope", "--wrap=true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("allocation failure: Invalid partition name specified"),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.ok(&["squeue", "-h", "-o", "%i"]).trim(), "1");
    // srun does not carry it out, and says so.
    let out = c.run(&["srun", "--test-only", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--test-only is not supported by srun"),
        "{}",
        stderr(&out)
    );
    c.ok(&["scancel", &id.to_string()]);
}

/// Issue 29: `sacct -j ARRAY_TASK` lists that task and its steps only, `-j ARRAY` every
/// task, as Slurm 22.05 does (`sacct -j 2_0` printed `2_0` and `2_0.batch`). 22.05's sacct
/// takes no `2_[0-1]` list: `sacct: fatal: Bad job array element specified: 2`, exit 1; a
/// task that does not exist lists nothing. squeue and scontrol take `ID_TASK` too.
#[test]
fn sacct_selects_one_array_task() {
    let c = Cluster::start(1);
    let id = c.sbatch(&["--array=0-3", "--wrap", "true"]);
    let sacct = |sel: &str| c.run(&["sacct", "-j", sel, "-P", "-n", "-o", "JobID,State"]);
    let lines = |sel: &str| {
        let out = sacct(sel);
        assert!(out.status.success(), "sacct -j {sel}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Every task ends; sacct -j ID lists them all.
    let all = poll("all four tasks completed", || {
        let out = lines(&id.to_string());
        (out.matches("|COMPLETED\n").count() == 8).then_some(out)
    });
    for task in 0..4 {
        assert!(all.contains(&format!("{id}_{task}|")), "{all}");
        assert!(all.contains(&format!("{id}_{task}.batch|")), "{all}");
    }
    assert_eq!(
        lines(&format!("{id}_2")),
        format!("{id}_2|COMPLETED\n{id}_2.batch|COMPLETED\n")
    );
    // A job id and a task together: each names its own lines.
    let two = lines(&format!("{id}_0,{id}_3"));
    assert_eq!(
        two.lines()
            .map(|l| l.split('|').next().unwrap_or(""))
            .collect::<Vec<_>>(),
        [
            format!("{id}_0"),
            format!("{id}_0.batch"),
            format!("{id}_3"),
            format!("{id}_3.batch")
        ],
        "{two}"
    );
    assert_eq!(lines(&format!("{id}_9")), "");
    let bad = sacct(&format!("{id}_[0-2]"));
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr).trim(),
        format!("sacct: error: Bad job array element specified: {id}")
    );
    assert!(bad.stdout.is_empty(), "{bad:?}");

    // squeue and scontrol already take ID_TASK as Slurm does (22.05, a held array:
    // `8_1 8 PENDING`, `JobId=8 ArrayJobId=8 ArrayTaskId=1`).
    let held = c.sbatch(&["-H", "--array=0-3", "--wrap", "true"]);
    let task = format!("{held}_1");
    assert_eq!(
        c.ok(&["squeue", "-h", "-j", &task, "-o", "%i %A %T"]),
        format!("{held}_1 {held} PENDING\n")
    );
    let show = c.ok(&["scontrol", "show", "job", &task]);
    assert!(
        show.starts_with(&format!("JobId={held} ArrayJobId={held} ArrayTaskId=1 ")),
        "{show}"
    );
    assert_eq!(
        show.lines().filter(|l| l.starts_with("JobId=")).count(),
        1,
        "{show}"
    );
    // A pending task is no accounting line of its own: Slurm lists nothing for it.
    assert_eq!(lines(&task), "");
}
