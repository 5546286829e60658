//! A small on-disk journal, so a worker that restarts neither loses job ends nor leaves jobs
//! running that nobody watches.
//!
//! ```text
//! STATE_DIR/journal/running/<job>   "pid starttime": written when a script starts
//! STATE_DIR/journal/ended/<job>     the JobEnded (protobuf): written before it is reported,
//!                                   removed when the controller surely has it
//! ```
//!
//! On start, [`Journal::recover`] returns every recorded end for the first `Register`, and
//! for each job still marked running it kills the process group (a worker cannot re-adopt
//! processes that are not its children, so it could never report their real exit) and
//! reports the job as killed by SIGKILL. The recorded start time guards against killing an
//! unrelated process that reuses the pid.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use prost::Message;
use tandem_proto::v1::JobEnded;
use tracing::{info, warn};

use crate::unix_now;

#[derive(Debug, Clone)]
pub struct Journal {
    running: PathBuf,
    ended: PathBuf,
}

impl Journal {
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        let root = state_dir.join("journal");
        let running = root.join("running");
        let ended = root.join("ended");
        for d in [&root, &running, &ended] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)?;
        }
        Ok(Self { running, ended })
    }

    /// Notes a started batch script.
    pub fn record_running(&self, job_id: u64, pid: u32) {
        let Some(start) = process_start_time(pid) else {
            return;
        };
        let path = self.running.join(job_id.to_string());
        if let Err(e) = write_atomic(&path, format!("{pid} {start}\n").as_bytes()) {
            warn!(job_id, error = %e, "cannot journal a running job");
        }
    }

    /// Stores an end before it is reported; the job is no longer running.
    pub fn record_ended(&self, ended: &JobEnded) {
        let path = self.ended.join(ended.job_id.to_string());
        if let Err(e) = write_atomic(&path, &ended.encode_to_vec()) {
            warn!(job_id = ended.job_id, error = %e, "cannot journal a job end");
        }
        let _ = fs::remove_file(self.running.join(ended.job_id.to_string()));
    }

    /// The controller has this end.
    pub fn forget_ended(&self, job_id: u64) {
        let _ = fs::remove_file(self.ended.join(job_id.to_string()));
    }

    /// Ends to report after a restart: recorded ones, plus jobs of the previous worker life
    /// killed now.
    pub fn recover(&self) -> Vec<JobEnded> {
        let mut out = Vec::new();
        for (job_id, path) in entries(&self.ended) {
            match fs::read(&path).map(|b| JobEnded::decode(b.as_slice())) {
                Ok(Ok(e)) if e.job_id == job_id => out.push(e),
                _ => {
                    warn!(path = %path.display(), "unreadable journal entry dropped");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        for (job_id, path) in entries(&self.running) {
            let text = fs::read_to_string(&path).unwrap_or_default();
            if let Some((pid, start)) = parse_running(&text)
                && process_start_time(pid) == Some(start)
                && let Ok(pgid) = i32::try_from(pid)
            {
                info!(
                    job_id,
                    pid, "killing a job left running by a previous worker"
                );
                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            }
            let ended = JobEnded {
                job_id,
                signal: Signal::SIGKILL as i32,
                end_time: unix_now(),
                ..Default::default()
            };
            self.record_ended(&ended);
            out.push(ended);
        }
        out.sort_by_key(|e| e.job_id);
        out
    }
}

fn entries(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            let id = e.file_name().to_str()?.parse().ok()?;
            Some((id, e.path()))
        })
        .collect()
}

fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)
}

fn parse_running(text: &str) -> Option<(u32, u64)> {
    let mut it = text.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Field 22 of `/proc/PID/stat` (start time in clock ticks since boot).
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// The command name (field 2) may hold spaces and parentheses; fields after the last `)`
/// start at field 3.
fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_odd_command_names() {
        let stat =
            "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("garbage"), None);
        assert!(process_start_time(std::process::id()).is_some());
    }

    #[test]
    fn ends_survive_until_forgotten_and_leftover_jobs_are_killed() {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let ended = JobEnded {
            job_id: 3,
            exit_code: 7,
            ..Default::default()
        };
        j.record_running(3, std::process::id());
        j.record_ended(&ended);

        // A job of a previous life still running: a real process in its own group.
        let mut orphan = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        j.record_running(4, orphan.id());
        // A stale entry whose pid now belongs to someone else (start time differs).
        fs::write(j.running.join("5"), format!("{} 1\n", std::process::id())).unwrap();

        let j = Journal::open(dir.path()).unwrap();
        let got = j.recover();
        let summary: Vec<_> = got
            .iter()
            .map(|e| (e.job_id, e.exit_code, e.signal))
            .collect();
        assert_eq!(summary, [(3, 7, 0), (4, 0, 9), (5, 0, 9)]);
        let status = orphan.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "the leftover job was killed"
        );
        // Still recorded until the controller has them; not killed twice.
        assert_eq!(j.recover().len(), 3);
        for e in &got {
            j.forget_ended(e.job_id);
        }
        assert!(j.recover().is_empty());
    }
}
