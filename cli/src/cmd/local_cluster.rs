//! The state dir of a local cluster, shared by `tandem up` (which starts one there), `tandem
//! down` (which stops it) and `tandem demo` (both): where it is by default, which of its
//! daemons still run, and how they are stopped. A module of its own so that `up` and `down`
//! depend on it rather than on each other.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The default state dir, `~/.tandem/local`.
pub fn default_state_dir() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set; pass --state-dir")?;
    Ok(PathBuf::from(home).join(".tandem").join("local"))
}

/// `~/.tandem/cluster.json`, if HOME is set.
pub fn home_cluster_file() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".tandem").join("cluster.json"))
}

/// Reads a pid file.
fn read_pid(path: &Path) -> Option<Pid> {
    let text = std::fs::read_to_string(path).ok()?;
    let n: i32 = text.trim().parse().ok()?;
    (n > 0).then(|| Pid::from_raw(n))
}

/// Whether a process exists and is not a zombie waiting for its parent.
pub fn alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => true,
    }
}

/// The pid of this state dir's controller, if it runs and is ours (its command line names
/// the state dir, so a recycled pid is not mistaken for it).
pub fn running_controller(dir: &Path) -> Option<i32> {
    let pid = read_pid(&dir.join("controller.pid"))?;
    if !alive(pid) {
        return None;
    }
    if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
        let needle = dir.join("controller");
        let text = String::from_utf8_lossy(&cmdline);
        if !text.contains(needle.to_string_lossy().as_ref()) {
            return None;
        }
    }
    Some(pid.as_raw())
}

/// Stops workers, then the controller; removes pid and discovery files. Returns how many
/// processes were running.
pub fn stop(dir: &Path, grace: Duration) -> usize {
    let mut worker_pids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("workers")) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pid") {
                worker_pids.push(p);
            }
        }
    }
    let mut count = terminate(&worker_pids, grace);
    count += terminate(&[dir.join("controller.pid")], grace);
    count += terminate(&[dir.join("authd.pid")], grace);
    // The workers are gone, and their jobs with them.
    super::local_spool::remove(dir);
    let cluster_file = dir.join("cluster.json");
    if let Some(home) = home_cluster_file()
        && let (Ok(a), Ok(b)) = (
            tandem_net::endpoint::ClusterFile::read(&home),
            tandem_net::endpoint::ClusterFile::read(&cluster_file),
        )
        && a == b
    {
        let _ = std::fs::remove_file(&home);
    }
    let _ = std::fs::remove_file(&cluster_file);
    count
}

/// SIGTERM to each live pid, wait up to `grace`, SIGKILL the rest; removes the pid files.
fn terminate(pid_files: &[PathBuf], grace: Duration) -> usize {
    let pids: Vec<Pid> = pid_files
        .iter()
        .filter_map(|f| read_pid(f))
        .filter(|p| alive(*p))
        .collect();
    for p in &pids {
        let _ = kill(*p, Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in &pids {
        if alive(*p) {
            let _ = kill(*p, Signal::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for f in pid_files {
        let _ = std::fs::remove_file(f);
    }
    pids.len()
}
