//! Job isolation through a fake controller and a real worker with real cgroups: the memory
//! limit ends a job `OUT_OF_MEMORY` while its neighbour completes, a cancel and the time
//! limit kill a process that left the job's session, GPUs not given to a job are hidden by the
//! devices controller (v1) or an eBPF device program (v2), and jobs run with their user's
//! supplementary groups.
//!
//! These need root and writable cgroups; where the machine has neither, each test prints
//! `SKIP <name>: <why>` and returns.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{Harness, WAIT};
use tandem_worker::cgroup::{Isolation, Mode, Settings};

/// The isolation a worker with `mode` gets on this machine, probed in a throw-away subtree.
fn probe(mode: Mode) -> Isolation {
    let settings = Settings {
        mode,
        subtree: Some(format!("probe-{}", std::process::id())),
        ..Default::default()
    };
    let iso = Isolation::setup(&settings, "probe", 1);
    iso.remove_node_dirs();
    iso
}

/// `None` (after printing SKIP) unless root with cgroups that can do what `need` says.
fn isolation_or_skip(name: &str, mode: Mode, need: fn(&Isolation) -> bool) -> Option<Isolation> {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups and switch users");
        return None;
    }
    let iso = probe(mode);
    if !iso.enabled() || !need(&iso) {
        eprintln!(
            "SKIP {name}: cgroups ({mode:?}) not usable here for this test (found {})",
            iso.version()
        );
        return None;
    }
    Some(iso)
}

/// Alive and not a zombie (an orphan may wait for init to reap it).
fn alive(pid: i32) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()));
    !matches!(state, None | Some('Z') | Some('X'))
}

async fn wait_for_pid(path: &Path) -> i32 {
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

/// The session id of `pid` (field 6 of /proc/PID/stat).
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// The job's cgroup directories under every hierarchy this worker uses.
fn job_cgroup_dirs(subtree: &str, job_id: u64) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if p.ends_with(format!("tandem/{subtree}/job_{job_id}")) {
                found.push(p);
            } else if p.components().count() < 12 {
                stack.push(p);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_its_memory_ends_out_of_memory_and_its_neighbour_completes() {
    let name = "a_job_over_its_memory_ends_out_of_memory_and_its_neighbour_completes";
    if isolation_or_skip(name, Mode::Auto, Isolation::limits_memory).is_none() {
        return;
    }
    let mut h = Harness::start().await;
    // `tail` keeps a newline-free input in memory (it waits for 10 lines): 128 MiB against a 32 MiB limit.
    let mut hog = h.job(
        60,
        "#!/bin/sh\necho start\nhead -c 134217728 /dev/zero | tail >/dev/null\necho after $?\n",
        &h.path("hog.txt"),
    );
    hog.mem_mb = 32;
    let mut neighbour = h.job(
        61,
        "#!/bin/sh\nhead -c 16777216 /dev/zero | tail >/dev/null\nsleep 1\necho done\n",
        &h.path("neighbour.txt"),
    );
    neighbour.mem_mb = 64;
    h.controller.launch(neighbour).await;
    h.controller.launch(hog).await;
    let mut ends = std::collections::BTreeMap::new();
    while ends.len() < 2 {
        let e = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(tandem_proto::v1::worker_message::Msg::JobEnded(e)) =
                    h.controller.recv().await.msg
                {
                    return e;
                }
            }
        })
        .await
        .expect("both jobs end");
        ends.insert(e.job_id, e);
    }
    let hog = &ends[&60];
    assert!(hog.out_of_memory, "the hog was OOM-killed: {hog:?}");
    assert!(!hog.cancelled && !hog.timed_out, "{hog:?}");
    // The kernel killed the allocating process inside the job; the script saw it die.
    // (Some shells also print "Killed" in between.)
    let text = std::fs::read_to_string(h.path("hog.txt")).unwrap();
    assert!(
        text.starts_with("start\n") && text.ends_with("after 137\n"),
        "{text:?}"
    );
    let neighbour = &ends[&61];
    assert!(!neighbour.out_of_memory, "{neighbour:?}");
    assert_eq!(neighbour.exit_code, 0, "{neighbour:?}");
    assert_eq!(
        std::fs::read_to_string(h.path("neighbour.txt")).unwrap(),
        "done\n"
    );
    let subtree = h.config.cgroup.subtree.clone().unwrap();
    assert!(
        job_cgroup_dirs(&subtree, 60).is_empty(),
        "the job's cgroups are removed after it"
    );
    h.stop().await;
}

async fn setsid_child_is_killed_on_cancel(name: &str, mode: Mode) {
    if isolation_or_skip(name, mode, |_| true).is_none() {
        return;
    }
    let mut h = Harness::start_with(|c| c.cgroup.mode = mode).await;
    let pid_file = h.path("escaped.pid");
    // The child leaves the job's process group and session, as a daemonizing tool does.
    let script = format!(
        "#!/bin/sh\nsetsid sh -c 'echo $$ > {}; exec sleep 300' &\nwait\n",
        pid_file.display()
    );
    h.controller
        .launch(h.job(62, &script, &h.path("s.txt")))
        .await;
    let batch_pid = i32::try_from(h.controller.started(62).await).unwrap();
    let escaped = wait_for_pid(&pid_file).await;
    assert_ne!(
        session_of(escaped),
        session_of(batch_pid),
        "the child runs in a session of its own"
    );
    let subtree = h.config.cgroup.subtree.clone().unwrap();
    assert!(
        !job_cgroup_dirs(&subtree, 62).is_empty(),
        "the job has a cgroup"
    );
    h.controller.end_job(62, "cancel", 0).await;
    let ended = h.controller.ended(62).await;
    assert!(ended.cancelled, "{ended:?}");
    // The end is reported after the cgroup was emptied: the child is gone already.
    assert!(!alive(escaped), "pid {escaped} escaped the cancel");
    assert!(job_cgroup_dirs(&subtree, 62).is_empty(), "cgroup removed");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_a_setsid_child_cgroup_auto() {
    setsid_child_is_killed_on_cancel("cancel_kills_a_setsid_child_cgroup_auto", Mode::Auto).await;
}

/// The unified hierarchy: `cgroup.kill`, even where it offers no controllers to limit with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_a_setsid_child_cgroup_v2() {
    setsid_child_is_killed_on_cancel("cancel_kills_a_setsid_child_cgroup_v2", Mode::V2).await;
}

/// A job over its time limit ends TIMEOUT with every process of its cgroup, a child that
/// left its session included. Both ignore SIGTERM, so only the worker's final kill of the
/// whole cgroup (after KillWait) ends them: the escalation path, not the polite one.
async fn setsid_child_is_killed_at_the_time_limit(name: &str, mode: Mode, version: &str) {
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups");
        return;
    }
    let found = probe(mode);
    if found.version() != version {
        eprintln!(
            "SKIP {name}: no usable cgroup {version} hierarchy on this host (found {})",
            found.version()
        );
        return;
    }
    let mut h = Harness::start_with(|c| c.cgroup.mode = mode).await;
    let pid_file = h.path("escaped.pid");
    let script = format!(
        "#!/bin/sh\ntrap '' TERM\nsetsid sh -c 'echo $$ > {}; exec sleep 300' &\nwait\n",
        pid_file.display()
    );
    let mut job = h.job(66, &script, &h.path("t.txt"));
    job.time_limit_s = 2;
    job.kill_wait_s = 1;
    h.controller.launch(job).await;
    let batch_pid = i32::try_from(h.controller.started(66).await).unwrap();
    let started = Instant::now();
    let escaped = wait_for_pid(&pid_file).await;
    assert!(alive(escaped), "the child runs before the limit");
    assert_ne!(
        session_of(escaped),
        session_of(batch_pid),
        "the child runs in a session of its own"
    );
    let subtree = h.config.cgroup.subtree.clone().unwrap();
    assert!(
        !job_cgroup_dirs(&subtree, 66).is_empty(),
        "the job has a cgroup"
    );
    let ended = h.controller.ended(66).await;
    assert!(ended.timed_out && !ended.cancelled, "{ended:?}");
    // SIGTERM was ignored: the batch shell died of the SIGKILL after KillWait.
    assert_eq!(ended.signal, 9, "{ended:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "ended before its time limit and KillWait: {:?}",
        started.elapsed()
    );
    // The end is reported after the cgroup was emptied: the child is gone already.
    assert!(!alive(escaped), "pid {escaped} escaped the time limit");
    assert!(job_cgroup_dirs(&subtree, 66).is_empty(), "cgroup removed");
    h.stop().await;
}

/// cgroup v1: the job's processes are frozen and killed through every hierarchy it is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_kills_a_setsid_child_cgroup_v1() {
    setsid_child_is_killed_at_the_time_limit(
        "time_limit_kills_a_setsid_child_cgroup_v1",
        Mode::V1,
        "v1",
    )
    .await;
}

/// The unified hierarchy: `cgroup.kill`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_limit_kills_a_setsid_child_cgroup_v2() {
    setsid_child_is_killed_at_the_time_limit(
        "time_limit_kills_a_setsid_child_cgroup_v2",
        Mode::V2,
        "v2",
    )
    .await;
}

/// GPU device files stand in as `nvidia0`/`nvidia1` nodes of `/dev/zero` (1:5) and
/// `/dev/urandom` (1:9): the job given GPU 0 reads the first and is refused the second, and
/// may not make itself another node of it either (v1's `rwm`).
async fn gpus_not_allocated_are_hidden(name: &str, mode: Mode, job_id: u64) {
    use nix::sys::stat::{Mode as FileMode, SFlag, makedev, mknod};
    let devs = tempfile::tempdir().unwrap();
    let file_mode = FileMode::from_bits_truncate(0o666);
    for (file, minor) in [("nvidia0", 5), ("nvidia1", 9), ("nvidiactl", 3)] {
        if let Err(e) = mknod(
            &devs.path().join(file),
            SFlag::S_IFCHR,
            file_mode,
            makedev(1, minor),
        ) {
            eprintln!("SKIP {name}: cannot create a fake device file: {e}");
            return;
        }
    }
    let dev_dir = devs.path().to_owned();
    let mut h = Harness::start_with(|c| {
        c.cgroup.dev_dir = dev_dir;
        c.cgroup.mode = mode;
    })
    .await;
    let d = devs.path().display();
    let script = format!(
        "#!/bin/sh\n\
         head -c 1 {d}/nvidia0 >/dev/null && echo gpu0 open || echo gpu0 denied\n\
         head -c 1 {d}/nvidia1 >/dev/null 2>&1 && echo gpu1 open || echo gpu1 denied\n\
         head -c 1 /dev/zero >/dev/null && echo control open\n\
         mknod {d}/again c 1 9 2>/dev/null && echo mknod gpu1 done || echo mknod gpu1 denied\n\
         echo visible $CUDA_VISIBLE_DEVICES\n"
    );
    let mut job = h.job(job_id, &script, &h.path("gpu.txt"));
    job.gpus = vec![0];
    h.controller.launch(job).await;
    let ended = h.controller.ended(job_id).await;
    assert_eq!(ended.exit_code, 0, "{ended:?}");
    assert_eq!(
        std::fs::read_to_string(h.path("gpu.txt")).unwrap(),
        "gpu0 open\ngpu1 denied\ncontrol open\nmknod gpu1 denied\nvisible 0\n"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_not_allocated_are_hidden_by_the_devices_controller() {
    let name = "gpus_not_allocated_are_hidden_by_the_devices_controller";
    if isolation_or_skip(name, Mode::Auto, Isolation::filters_devices).is_none() {
        return;
    }
    gpus_not_allocated_are_hidden(name, Mode::Auto, 63).await;
}

/// cgroup v2: the same, through the eBPF device program attached to the job's cgroup
/// (the job's processes are in the unified hierarchy only, even on a hybrid host).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_not_allocated_are_hidden_by_a_cgroup_v2_device_program() {
    let name = "gpus_not_allocated_are_hidden_by_a_cgroup_v2_device_program";
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups and load BPF programs");
        return;
    }
    let found = probe(Mode::V2);
    if found.version() != "v2" {
        eprintln!(
            "SKIP {name}: no usable cgroup v2 hierarchy on this host (found {})",
            found.version()
        );
        return;
    }
    if let Some(why) = found.device_filter_problem() {
        eprintln!(
            "SKIP {name}: cgroup v2 is here but a BPF device program cannot be attached: {why}"
        );
        return;
    }
    assert!(found.filters_devices());
    gpus_not_allocated_are_hidden(name, Mode::V2, 67).await;
}

/// A user in a supplementary group (created here, as root) sees it in `id -G`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_with_the_users_supplementary_groups() {
    let name = "jobs_run_with_the_users_supplementary_groups";
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create a test user and switch to it");
        return;
    }
    let (user, group) = ("tandemjob", "tandemsupp");
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| o.status.success() || String::from_utf8_lossy(&o.stderr).contains("exists"))
    };
    match (
        run("groupadd", &[group]),
        run("useradd", &["-M", "-N", "-G", group, user]),
    ) {
        (Ok(true), Ok(true)) => {}
        other => {
            eprintln!("SKIP {name}: cannot create the test user and group: {other:?}");
            return;
        }
    }
    let pw = nix::unistd::User::from_name(user).unwrap().unwrap();
    let gr = nix::unistd::Group::from_name(group).unwrap().unwrap();
    let mut h = Harness::start().await;
    let home = h.path("job-home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(pw.uid.as_raw()), Some(pw.gid.as_raw())).unwrap();
    let out = home.join("groups.txt");
    let mut job = h.job(64, "#!/bin/sh\nid -u\nid -G\n", &out);
    job.uid = pw.uid.as_raw();
    job.gid = pw.gid.as_raw();
    job.workdir = home.to_string_lossy().into_owned();
    h.controller.launch(job).await;
    let ended = h.controller.ended(64).await;
    assert_eq!(ended.exit_code, 0, "{ended:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(pw.uid.as_raw().to_string().as_str()));
    let groups: Vec<u32> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    assert!(
        groups.contains(&gr.gid.as_raw()),
        "supplementary group {} in `id -G`: {groups:?}",
        gr.gid
    );
    assert!(groups.contains(&pw.gid.as_raw()), "{groups:?}");
    assert!(!groups.contains(&0), "root's groups are gone: {groups:?}");
    h.stop().await;
}

/// The job's own cgroup carries its limits: memory from `mem_mb`, a CFS quota of its CPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_sees_its_memory_and_cpu_limits_in_its_cgroup() {
    let name = "a_job_sees_its_memory_and_cpu_limits_in_its_cgroup";
    // The v1 file names; the v2 writer's are covered by its unit tests.
    let Some(iso) = isolation_or_skip(name, Mode::Auto, Isolation::limits_memory) else {
        return;
    };
    if iso.version() != "v1" {
        eprintln!(
            "SKIP {name}: reads v1 limit files, this node uses {}",
            iso.version()
        );
        return;
    }
    let mut h = Harness::start().await;
    // The step's cgroup from /proc/self/cgroup; its parent (the job's) holds the limits.
    // In the cpu hierarchy the step has a directory of its own only where cpuacct counts
    // its time there; elsewhere it sits in the job's.
    let script = "#!/bin/sh\n\
        mem=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)\n\
        cpu=$(awk -F: '$2==\"cpu\"||$2==\"cpu,cpuacct\"{print $3}' /proc/self/cgroup)\n\
        echo $mem\n\
        echo $cpu\n\
        case $cpu in */step_batch) cpu=$cpu/.. ;; esac\n\
        cat /sys/fs/cgroup/memory$mem/../memory.limit_in_bytes\n\
        cat /sys/fs/cgroup/cpu$cpu/cpu.cfs_quota_us\n\
        cat /sys/fs/cgroup/cpu$cpu/cpu.cfs_period_us\n";
    let mut job = h.job(65, script, &h.path("limits.txt"));
    job.mem_mb = 48;
    job.cpus = 1;
    h.controller.launch(job).await;
    let ended = h.controller.ended(65).await;
    assert_eq!(ended.exit_code, 0, "{ended:?}");
    let text = std::fs::read_to_string(h.path("limits.txt")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let subtree = h.config.cgroup.subtree.clone().unwrap();
    assert!(
        lines[0].ends_with(&format!("tandem/{subtree}/job_65/step_batch")),
        "{text}"
    );
    let cpu_counts = std::path::Path::new("/sys/fs/cgroup/cpu/cpuacct.stat").exists();
    let cpu_dir = if cpu_counts {
        format!("tandem/{subtree}/job_65/step_batch")
    } else {
        format!("tandem/{subtree}/job_65")
    };
    assert!(lines[1].ends_with(&cpu_dir), "{text}");
    assert_eq!(&lines[2..], ["50331648", "100000", "100000"], "{text}");
    h.stop().await;
}
