//! Every TCP connection between Tandem's processes has `TCP_NODELAY` on both ends.
//!
//! Without it a gRPC call's small frames meet Nagle's algorithm and the peer's delayed ACK:
//! a third of `sbatch` calls used to wait 40 ms. This test starts a real cluster (controller
//! and worker processes), holds an `srun` step open (srun talks to the controller and to the
//! worker's step service), then reads `TCP_NODELAY` on every established TCP socket of each
//! of those processes: the controller's accepted sockets, the worker's connection to the
//! controller and its accepted step connection, and srun's connections. Sockets of other
//! processes are duplicated with `pidfd_getfd(2)` (same user, so no privilege is needed).

use crate::support;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::Cluster;

/// One established TCP socket of a process: its descriptor number and the two ports.
#[derive(Debug, Clone)]
struct Conn {
    fd: i32,
    local_port: u16,
    remote_port: u16,
}

/// Established TCP sockets of `pid`, from `/proc/PID/fd` and `/proc/PID/net/tcp{,6}`.
fn established(pid: i32) -> Vec<Conn> {
    // inode -> (local port, remote port) for ESTABLISHED (state 01) sockets.
    let mut by_inode = BTreeMap::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() < 10 || cols[3] != "01" {
                continue;
            }
            let port = |addr: &str| {
                addr.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            if let (Some(l), Some(r)) = (port(cols[1]), port(cols[2])) {
                by_inode.insert(cols[9].to_owned(), (l, r));
            }
        }
    }
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        else {
            continue;
        };
        let Some(&(local_port, remote_port)) = by_inode.get(inode) else {
            continue;
        };
        if let Ok(fd) = entry.file_name().to_string_lossy().parse() {
            out.push(Conn {
                fd,
                local_port,
                remote_port,
            });
        }
    }
    out
}

/// `TCP_NODELAY` of descriptor `fd` in process `pid`; `None` if the socket is gone.
fn nodelay(pid: i32, fd: i32) -> Result<Option<bool>, String> {
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let p = Pid::from_raw(pid).ok_or("bad pid")?;
    let pidfd = pidfd_open(p, PidfdFlags::empty()).map_err(|e| format!("pidfd_open: {e}"))?;
    let dup: OwnedFd = match pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) {
        Ok(d) => d,
        // EBADF: closed since it was listed.
        Err(rustix::io::Errno::BADF) => return Ok(None),
        Err(e) => return Err(format!("pidfd_getfd({pid}, {fd}): {e}")),
    };
    rustix::net::sockopt::tcp_nodelay(&dup)
        .map(Some)
        .map_err(|e| format!("getsockopt(TCP_NODELAY): {e}"))
}

fn pid_file(path: &std::path::Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn every_connection_between_tandem_processes_has_nodelay() {
    // pidfd_getfd needs Linux 5.6 and ptrace access to the daemons (same user); say so
    // rather than pass quietly where the kernel or a sandbox refuses it.
    if let Err(e) = nodelay(std::process::id() as i32, 0)
        && !e.contains("getsockopt")
    {
        eprintln!("SKIP every_connection_between_tandem_processes_has_nodelay: {e}");
        return;
    }
    let c = Cluster::start(1);
    let controller = pid_file(&c.state_dir().join("controller.pid"));
    let worker = pid_file(&c.state_dir().join("workers").join("node-1.pid"));
    let cluster: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.cluster_file()).unwrap()).unwrap();
    let controller_port: u16 = cluster["controller"]
        .as_str()
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("controller address in cluster.json");

    let mut srun = c
        .cmd(&["srun", "-J", "nodelay", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let srun_pid = srun.id() as i32;

    // Wait until srun holds its step connection to the worker (and so its allocation).
    let deadline = Instant::now() + Duration::from_secs(60);
    let (ctl, wrk, run) = loop {
        let ctl = established(controller);
        let wrk = established(worker);
        let run = established(srun_pid);
        let worker_step_ports: Vec<u16> = wrk
            .iter()
            .filter(|w| w.remote_port != controller_port)
            .map(|w| w.local_port)
            .collect();
        let srun_to_worker = run
            .iter()
            .any(|r| worker_step_ports.contains(&r.remote_port));
        if srun_to_worker {
            break (ctl, wrk, run);
        }
        if let Ok(Some(status)) = srun.try_wait() {
            panic!("srun ended early ({status}){}", c.controller_log());
        }
        assert!(
            Instant::now() < deadline,
            "srun never connected to the worker; controller {ctl:?} worker {wrk:?} srun {run:?}{}",
            c.controller_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // The controller accepted the worker's link (and srun's); the worker connected to the
    // controller and accepted srun's step connection; srun connected to both.
    assert!(
        ctl.iter().any(|s| s.local_port == controller_port),
        "controller has no accepted connection: {ctl:?}"
    );
    assert!(
        wrk.iter().any(|s| s.remote_port == controller_port),
        "worker has no connection to the controller: {wrk:?}"
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for (role, pid, conns) in [
        ("controller", controller, &ctl),
        ("worker", worker, &wrk),
        ("srun", srun_pid, &run),
    ] {
        for conn in conns {
            // The option is set right after accept/connect returns; allow that instant.
            let mut last = None;
            for _ in 0..20 {
                last = nodelay(pid, conn.fd).unwrap();
                if last != Some(false) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            match last {
                Some(true) => checked += 1,
                Some(false) => missing.push(format!("{role} {conn:?}")),
                None => {}
            }
        }
    }
    let _ = srun.kill();
    let _ = srun.wait();
    assert!(
        missing.is_empty(),
        "sockets without TCP_NODELAY: {missing:?}"
    );
    assert!(checked >= 4, "only {checked} sockets checked");
}
