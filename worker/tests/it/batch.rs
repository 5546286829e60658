//! Batch jobs through a fake controller: launch, output, exit codes, time limits, cancel,
//! launch errors, running as another user, and reports across a controller restart.
//!
//! Each test starts its own fake controller and a real worker (`tandem_worker::run`) on
//! 127.0.0.1 and runs real processes; the slowest waits on a 1-second time limit.

use crate::support;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use support::{FakeController, Harness, WAIT};
use tandem_proto::v1::{AbandonJob, SignalJob, controller_message, worker_message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_declared_resources_and_heartbeats() {
    let mut h = Harness::start().await;
    let r = &h.register;
    assert_eq!(r.node_name, "n1");
    let tres = r.resources.clone().unwrap();
    assert_eq!((tres.cpus, tres.mem_mb, tres.gpus), (4, 2048, 2));
    assert_eq!(tres.gpu_type, "a100");
    assert_eq!(r.gpus.len(), 2);
    assert_eq!(r.features, ["ib"]);
    assert!(
        r.step_address.starts_with("127.0.0.1:"),
        "{}",
        r.step_address
    );
    assert!(r.running_jobs.is_empty() && r.ended_while_disconnected.is_empty());
    // Heartbeats follow at the period the controller asked for (200 ms in the fake).
    let t0 = Instant::now();
    let mut beats = 0;
    while beats < 3 {
        if let Some(worker_message::Msg::Heartbeat(hb)) = h.controller.recv().await.msg {
            assert!(hb.running_jobs.is_empty());
            beats += 1;
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_output_environment_and_exit_code() {
    let mut h = Harness::start().await;
    let out = h.path("out-%N.txt");
    let script = "#!/bin/sh\n\
        echo \"job $SLURM_JOB_ID on $SLURMD_NODENAME procid $SLURM_PROCID gpus $CUDA_VISIBLE_DEVICES arg $1\"\n\
        echo oops >&2\n\
        pwd\n\
        echo \"$0\"\n\
        [ \"$SLURM_TASK_PID\" = $$ ] && echo task pid is the script\n\
        exit 3\n";
    let mut job = h.job(7, script, &out);
    job.gpus = vec![1];
    job.argv = vec!["first".into()];
    h.controller.launch(job).await;
    h.controller.started(7).await;
    let ended = h.controller.ended(7).await;
    assert_eq!((ended.exit_code, ended.signal), (3, 0));
    assert!(!ended.timed_out && !ended.cancelled && ended.launch_error.is_empty());
    let text = std::fs::read_to_string(h.path("out-n1.txt")).unwrap();
    // The script runs from the spool (`--spool-dir`), named as Slurm names it.
    let want = format!(
        "job 7 on n1 procid 0 gpus 1 arg first\noops\n{}\n{}\ntask pid is the script\n",
        h.dir.path().display(),
        h.dir.path().join("spool/job7/slurm_script").display()
    );
    assert_eq!(text, want, "stdout and stderr share the file, %N expanded");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_error_file_and_truncation() {
    let mut h = Harness::start().await;
    let out = h.path("o.txt");
    let err = h.path("e.txt");
    std::fs::write(&out, "old content that must disappear\n").unwrap();
    let mut job = h.job(8, "#!/bin/sh\necho to-out\necho to-err >&2\n", &out);
    job.stderr = err.to_string_lossy().into_owned();
    h.controller.launch(job).await;
    assert_eq!(h.controller.ended(8).await.exit_code, 0);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "to-out\n");
    assert_eq!(std::fs::read_to_string(&err).unwrap(), "to-err\n");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_sends_term_then_kill_and_reports_timeout() {
    let mut h = Harness::start().await;
    let out = h.path("t.txt");
    // Ignores SIGTERM, so only the SIGKILL after kill_wait ends it.
    let script = "#!/bin/sh\ntrap 'echo got TERM' TERM\nwhile true; do sleep 0.1; done\n";
    let mut job = h.job(9, script, &out);
    job.time_limit_s = 1;
    job.kill_wait_s = 1;
    let t0 = Instant::now();
    h.controller.launch(job).await;
    let ended = h.controller.ended(9).await;
    let took = t0.elapsed();
    assert!(ended.timed_out, "{ended:?}");
    assert!(!ended.cancelled);
    assert_eq!(
        ended.signal, 9,
        "killed by SIGKILL after the grace: {ended:?}"
    );
    assert!(
        took >= Duration::from_secs(2),
        "SIGKILL came early: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("got TERM"), "SIGTERM came first: {text:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_terminates_the_whole_process_group() {
    let mut h = Harness::start().await;
    let pid_file = h.path("child.pid");
    let script = format!(
        "#!/bin/sh\nsleep 300 &\necho $! > {}\nwait\n",
        pid_file.display()
    );
    let job = h.job(10, &script, &h.path("c.txt"));
    h.controller.launch(job).await;
    h.controller.started(10).await;
    let child_pid = wait_for_pid(&pid_file).await;
    assert!(alive(child_pid), "background child runs before the cancel");
    h.controller.end_job(10, "cancel", 0).await;
    let ended = h.controller.ended(10).await;
    assert!(ended.cancelled && !ended.timed_out, "{ended:?}");
    assert_eq!(ended.signal, 15, "the shell died of SIGTERM: {ended:?}");
    assert!(
        dies_soon(child_pid),
        "the background sleep died with its group"
    );
    h.stop().await;
}

/// A preemption with a QOS GraceTime: SIGTERM at once as notice, the job keeps running
/// through the grace, then SIGTERM again and SIGKILL after KillWait (Slurm's sequence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_grace_keeps_the_job_running_before_the_usual_end() {
    let mut h = Harness::start().await;
    let out = h.path("grace.txt");
    let script =
        "#!/bin/sh\ntrap 'echo got TERM' TERM\necho ready\nwhile true; do sleep 0.1; done\n";
    let mut job = h.job(20, script, &out);
    job.kill_wait_s = 1;
    h.controller.launch(job).await;
    h.controller.started(20).await;
    wait_for_text(&out, "ready").await;
    let t0 = Instant::now();
    h.controller.end_job(20, "preempt", 2).await;
    let ended = h.controller.ended(20).await;
    let took = t0.elapsed();
    assert!(ended.cancelled && !ended.timed_out, "{ended:?}");
    assert_eq!(ended.signal, 9, "killed by SIGKILL at the end: {ended:?}");
    assert!(
        took >= Duration::from_secs(3),
        "SIGKILL before grace (2 s) + KillWait (1 s): {took:?}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text.matches("got TERM").count(),
        2,
        "SIGTERM as notice and again when the grace ended: {text:?}"
    );
    h.stop().await;
}

/// The controller's safety net for an overdue job says "timeout": the end must say so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_timeout_signal_is_reported_as_a_timeout() {
    let mut h = Harness::start().await;
    h.controller
        .launch(h.job(19, "#!/bin/sh\nsleep 300\n", &h.path("to.txt")))
        .await;
    h.controller.started(19).await;
    h.controller.end_job(19, "timeout", 0).await;
    let ended = h.controller.ended(19).await;
    assert!(ended.timed_out && !ended.cancelled, "{ended:?}");
    assert_eq!(ended.signal, 15);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_only_signal_reaches_only_the_shell_and_abandon_kills() {
    let mut h = Harness::start().await;
    let out = h.path("b.txt");
    // The shell reports USR1; its foreground sleep would die of USR1 if the group got it.
    let script = "#!/bin/sh\ntrap 'echo shell got USR1' USR1\necho ready\nwhile true; do sleep 0.2 || echo sleep died; done\n";
    h.controller.launch(h.job(11, script, &out)).await;
    h.controller.started(11).await;
    wait_for_text(&out, "ready").await;
    h.controller
        .send(controller_message::Msg::SignalJob(SignalJob {
            job_id: 11,
            signal: 10, // SIGUSR1
            batch_only: true,
            reason: String::new(),
            grace_s: 0,
        }))
        .await;
    wait_for_text(&out, "shell got USR1").await;
    h.controller
        .send(controller_message::Msg::AbandonJob(AbandonJob {
            job_id: 11,
        }))
        .await;
    let ended = h.controller.ended(11).await;
    assert_eq!(ended.signal, 9, "{ended:?}");
    assert!(!ended.cancelled && !ended.timed_out);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        !text.contains("sleep died"),
        "the group did not get USR1: {text:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_errors_are_reported_not_run() {
    let mut h = Harness::start().await;
    let out = h.path("never.txt");
    h.controller
        .launch(h.job(12, "echo no interpreter line\n", &out))
        .await;
    let ended = h.controller.ended(12).await;
    assert!(
        ended
            .launch_error
            .contains("does not look like a batch script"),
        "{ended:?}"
    );
    assert_ne!(ended.exit_code, 0);
    assert!(!out.exists(), "nothing ran, nothing was written");

    let mut job = h.job(13, "#!/bin/sh\ntrue\n", &out);
    job.workdir = "/nonexistent/dir".into();
    h.controller.launch(job).await;
    let ended = h.controller.ended(13).await;
    assert!(
        ended
            .launch_error
            .contains("working directory /nonexistent/dir"),
        "{ended:?}"
    );

    let job = h.job(14, "#!/bin/sh\ntrue\n", &h.path("missing-dir/out.txt"));
    h.controller.launch(job).await;
    let ended = h.controller.ended(14).await;
    assert!(
        ended.launch_error.contains("cannot open output file"),
        "{ended:?}"
    );

    // A FIFO nobody reads would block the worker; it is refused instead.
    let fifo = h.path("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    h.controller
        .launch(h.job(17, "#!/bin/sh\ntrue\n", &fifo))
        .await;
    let ended = h.controller.ended(17).await;
    // ENXIO without a reader, "is a FIFO" with one: either way an error, not a hang.
    assert!(
        ended
            .launch_error
            .starts_with(&format!("cannot open output file {}", fifo.display())),
        "{ended:?}"
    );

    // Character devices are fine: --output=/dev/null is common.
    let devnull = std::path::Path::new("/dev/null");
    h.controller
        .launch(h.job(18, "#!/bin/sh\necho discarded\n", devnull))
        .await;
    let ended = h.controller.ended(18).await;
    assert_eq!((ended.exit_code, ended.launch_error.as_str()), (0, ""));
    h.stop().await;
}

/// Root workers start jobs as the submitting user; other workers refuse foreign uids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_the_submitting_user() {
    const NOBODY: u32 = 65534;
    let mut h = Harness::start().await;
    let home = h.path("nobody-home");
    std::fs::create_dir(&home).unwrap();
    let out = home.join("as-user.txt");
    let script = "#!/bin/sh\nid -u\nid -g\npwd\n[ \"$SLURM_TASK_PID\" = $$ ] && echo pid\n";
    let mut job = h.job(15, script, &out);
    job.uid = NOBODY;
    job.gid = NOBODY;
    job.workdir = home.to_string_lossy().into_owned();
    if nix::unistd::getuid().is_root() {
        std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    h.controller.launch(job).await;
    let ended = h.controller.ended(15).await;
    if !nix::unistd::getuid().is_root() {
        assert!(
            ended
                .launch_error
                .contains("cannot start jobs of uid 65534")
        );
        h.stop().await;
        return;
    }
    assert_eq!(ended.exit_code, 0, "{ended:?}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("{NOBODY}\n{NOBODY}\n{}\npid\n", home.display())
    );
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (NOBODY, NOBODY),
        "file belongs to the user"
    );

    // The user cannot write where root can: the worker must not open it for them.
    let locked = h.path("root-only");
    std::fs::create_dir(&locked).unwrap();
    let mut job = h.job(16, "#!/bin/sh\ntrue\n", &locked.join("out.txt"));
    job.uid = NOBODY;
    job.gid = NOBODY;
    h.controller.launch(job).await;
    let ended = h.controller.ended(16).await;
    assert!(
        ended
            .launch_error
            .contains("cannot open the input or output files as uid 65534"),
        "{ended:?}"
    );
    assert!(!locked.join("out.txt").exists());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_ends_survive_a_controller_restart() {
    let mut h = Harness::start().await;
    // Each job waits for its own go-file, so the test decides when each ends.
    let waits_for = |go: &str, code: i32| {
        format!(
            "#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexit {code}\n",
            go = h.path(go).display()
        )
    };
    let quick = h.job(20, &waits_for("go20", 4), &h.path("q.txt"));
    let slow = h.job(21, &waits_for("go21", 5), &h.path("s.txt"));
    h.controller.launch(quick).await;
    h.controller.launch(slow).await;
    // Both start; their JobStarted may arrive in either order.
    let mut pids = std::collections::BTreeMap::new();
    while pids.len() < 2 {
        if let Some(worker_message::Msg::JobStarted(st)) = h.controller.recv().await.msg {
            pids.insert(st.job_id, i32::try_from(st.pid).unwrap());
        }
    }

    // Crash the controller; job 20 ends while it is away, job 21 keeps running.
    let addr = std::mem::replace(
        &mut h.controller,
        FakeController::start(&h.key, "127.0.0.1:0".parse().unwrap(), &h.tls).await,
    )
    .crash();
    std::fs::write(h.path("go20"), "").unwrap();
    // Gone from /proc means the worker reaped it: its end is queued.
    assert!(dies_soon(pids[&20]), "job 20 did not end");
    let mut restarted = FakeController::start(&h.key, addr, &h.tls).await;
    let reg = restarted.register().await;
    assert_eq!(reg.running_jobs, [21], "job 21 survived the restart");
    let ended: Vec<_> = reg
        .ended_while_disconnected
        .iter()
        .map(|e| (e.job_id, e.exit_code))
        .collect();
    assert_eq!(
        ended,
        [(20, 4)],
        "the end that happened meanwhile is reported"
    );
    std::fs::write(h.path("go21"), "").unwrap();
    let slow_end = restarted.ended(21).await;
    assert_eq!(slow_end.exit_code, 5);
    h.controller = restarted;
    h.stop().await;
}

/// A worker that died without cleaning up kills the jobs it left behind when it comes back
/// (it cannot watch them any more) and reports them, so the controller is not left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_reports_and_kills_what_its_predecessor_left() {
    let mut h = Harness::start().await;
    let script = "#!/bin/sh\nsleep 300\n";
    h.controller
        .launch(h.job(40, script, &h.path("l.txt")))
        .await;
    let pid = i32::try_from(h.controller.started(40).await).unwrap();
    h.controller
        .launch(h.job(41, "#!/bin/sh\nexit 6\n", &h.path("m.txt")))
        .await;
    assert_eq!(h.controller.ended(41).await.exit_code, 6);

    let reg = h.crash_and_restart_worker().await;
    assert!(reg.running_jobs.is_empty(), "{reg:?}");
    let ended: Vec<_> = reg
        .ended_while_disconnected
        .iter()
        .map(|e| (e.job_id, e.exit_code, e.signal))
        .collect();
    // Job 41's end is re-sent too: its stream died before the confirmation window passed.
    assert_eq!(ended, [(40, 0, 9), (41, 6, 0)]);
    assert!(dies_soon(pid), "the orphaned job was killed");
    h.stop().await;
}

/// `--signal=B:`: the batch shell gets the warning ahead of the time limit, its children do
/// not, and the warning does not end the job by itself. Without `B:` only steps get it
/// (`tests/it/step.rs`): a job without steps runs on to its limit untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warning_signal_comes_before_the_time_limit() {
    let mut h = Harness::start().await;
    // A background child that reports USR1 itself, so it shows whether the group got it.
    let script = "#!/bin/sh\n\
        trap 'echo shell got USR1' USR1\n\
        sh -c 'trap \"echo child got USR1; exit 0\" USR1; while true; do sleep 0.1; done' &\n\
        wait\n\
        echo done\n";
    struct Case {
        job_id: u64,
        batch_only: bool,
        time_limit_s: u64,
        want_shell: bool,
        want_timeout: bool,
    }
    let cases = [
        Case {
            job_id: 30,
            batch_only: true,
            time_limit_s: 30,
            want_shell: true,
            want_timeout: false,
        },
        Case {
            job_id: 31,
            batch_only: false,
            time_limit_s: 3,
            want_shell: false,
            want_timeout: true,
        },
    ];
    for case in cases {
        let out = h.path(&format!("warn-{}.txt", case.job_id));
        let mut job = h.job(case.job_id, script, &out);
        job.time_limit_s = case.time_limit_s;
        job.kill_wait_s = 1;
        job.signal_number = 10; // SIGUSR1
        job.signal_before_s = u32::try_from(case.time_limit_s).unwrap() - 1;
        job.signal_batch_only = case.batch_only;
        let t0 = Instant::now();
        h.controller.launch(job).await;
        let ended = h.controller.ended(case.job_id).await;
        let took = t0.elapsed();
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(
            took >= Duration::from_millis(900),
            "job {}: ended {took:?} after the launch, the warning is due at 1 s",
            case.job_id
        );
        assert!(
            took < Duration::from_secs(10),
            "job {}: {took:?}",
            case.job_id
        );
        assert_eq!(
            text.contains("shell got USR1"),
            case.want_shell,
            "job {}: {text:?}",
            case.job_id
        );
        assert!(
            !text.contains("child got USR1"),
            "job {}: {text:?}",
            case.job_id
        );
        assert_eq!(ended.timed_out, case.want_timeout, "{ended:?}");
        if !case.want_timeout {
            assert_eq!((ended.exit_code, ended.signal), (0, 0), "{ended:?}");
            assert!(text.contains("done"), "{text:?}");
        }
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_file_and_append_mode() {
    let mut h = Harness::start().await;
    let out = h.path("io.txt");
    std::fs::write(&out, "from an earlier run\n").unwrap();
    std::fs::write(h.path("in-n1.txt"), "line from the input file\n").unwrap();
    let mut job = h.job(32, "#!/bin/sh\ncat\necho to-err >&2\n", &out);
    job.stdin = h.path("in-%N.txt").to_string_lossy().into_owned();
    job.open_append = true;
    h.controller.launch(job).await;
    assert_eq!(h.controller.ended(32).await.exit_code, 0);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "from an earlier run\nline from the input file\nto-err\n",
        "appended, stdin from the %N-expanded file, stderr with stdout"
    );

    // Without --input the script reads /dev/null, and truncation stays the default.
    let job = h.job(33, "#!/bin/sh\ncat\necho only-this\n", &out);
    h.controller.launch(job).await;
    assert_eq!(h.controller.ended(33).await.exit_code, 0);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "only-this\n");

    let mut job = h.job(34, "#!/bin/sh\ntrue\n", &h.path("never.txt"));
    job.stdin = h.path("missing-input.txt").to_string_lossy().into_owned();
    h.controller.launch(job).await;
    let ended = h.controller.ended(34).await;
    assert!(
        ended.launch_error.contains("cannot open input file"),
        "{ended:?}"
    );

    // A root worker opens them through the shell, as the job's user.
    if nix::unistd::getuid().is_root() {
        const NOBODY: u32 = 65534;
        let home = h.path("io-home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
        let out = home.join("out.txt");
        std::fs::write(&out, "kept\n").unwrap();
        std::os::unix::fs::chown(&out, Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::write(home.join("in-n1.txt"), "as nobody\n").unwrap();
        let as_nobody = |h: &Harness, id: u64, stdin: &str| {
            let mut job = h.job(id, "#!/bin/sh\ncat\n", &out);
            job.uid = NOBODY;
            job.gid = NOBODY;
            job.workdir = home.to_string_lossy().into_owned();
            job.stdin = home.join(stdin).to_string_lossy().into_owned();
            job.open_append = true;
            job
        };
        let job = as_nobody(&h, 35, "in-%N.txt");
        h.controller.launch(job).await;
        assert_eq!(h.controller.ended(35).await.exit_code, 0);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "kept\nas nobody\n");
        let job = as_nobody(&h, 36, "absent.txt");
        h.controller.launch(job).await;
        let ended = h.controller.ended(36).await;
        assert!(
            ended.launch_error.contains("as uid 65534")
                && ended.launch_error.contains("absent.txt"),
            "{ended:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "kept\nas nobody\n",
            "a failed stdin redirection leaves the output alone"
        );
    }
    h.stop().await;
}

async fn wait_for_text(path: &std::path::Path, text: &str) {
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(path)
        .unwrap_or_default()
        .contains(text)
    {
        assert!(
            Instant::now() < deadline,
            "{text:?} never appeared in {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_pid(path: &std::path::Path) -> i32 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Alive and not a zombie (an orphan may wait for init to reap it).
fn alive(pid: i32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()));
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Whether `pid` is gone within a moment (signals take a little while to land).
fn dies_soon(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
