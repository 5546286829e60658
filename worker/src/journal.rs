//! A small on-disk journal, so a worker that restarts neither loses job ends nor leaves jobs
//! running that nobody watches.
//!
//! ```text
//! STATE_DIR/journal/log   append-only records, one write(2) each:
//!     running <job> <pid> <start time>   when a script starts
//!     ended   <job> <JobEnded protobuf>   before the end is reported
//!     forget  <job>                       when the controller surely has it
//! ```
//!
//! One file, appended to, rather than a file per job: every job used to create and remove
//! two files here (and two temporaries for atomic renames), and on ext4 without a journal
//! each creation scans past every inode freed in the last seconds, which at a few hundred
//! jobs a second was a tenth of the node's CPU. The live records (running jobs, unreported
//! ends) are few; past [`COMPACT_AT`] bytes the log is rewritten with those alone (a
//! temporary file renamed over it, so a crash leaves the old log or the new one).
//!
//! A record is `len u32 | kind u8 | job u64 | payload | fnv1a-64 of the rest`, little-endian;
//! reading stops at the first record that is short or fails its check (a torn tail after a
//! power loss), and the file is cut there before anything is appended.
//!
//! On start, [`Journal::recover`] returns every recorded end for the first `Register`, and
//! for each job still marked running it kills the process group (a worker cannot re-adopt
//! processes that are not its children, so it could never report their real exit) and
//! reports the job as killed by SIGKILL. The recorded start time guards against killing an
//! unrelated process that reuses the pid. Entries of the older layout (a file per job under
//! `running/` and `ended/`) are taken into the log once and removed.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use prost::Message;
use tandem_net::auth::unix_now;
use tandem_proto::v1::JobEnded;
use tracing::{info, warn};

/// The log is rewritten with its live records once it grows past this.
const COMPACT_AT: u64 = 1 << 20;
/// A record longer than this is corrupt (ends are a few hundred bytes).
const MAX_RECORD: u32 = 16 << 20;

const RUNNING: u8 = 1;
const ENDED: u8 = 2;
const FORGET: u8 = 3;

#[derive(Debug, Clone)]
pub struct Journal {
    inner: Arc<Mutex<Log>>,
}

#[derive(Debug)]
struct Log {
    path: PathBuf,
    file: File,
    size: u64,
    /// job -> (pid, start time)
    running: BTreeMap<u64, (u32, u64)>,
    /// job -> encoded `JobEnded`
    ended: BTreeMap<u64, Vec<u8>>,
}

impl Journal {
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        let root = state_dir.join("journal");
        fs::DirBuilder::new().recursive(true).create(&root)?;
        let path = root.join("log");
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let (records, good) = decode_all(&bytes);
        if good < bytes.len() {
            warn!(
                path = %path.display(),
                dropped = bytes.len() - good,
                "journal tail unreadable (torn write): cut"
            );
        }
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        file.set_len(good as u64)?;
        let mut log = Log {
            path,
            file,
            size: good as u64,
            running: BTreeMap::new(),
            ended: BTreeMap::new(),
        };
        for r in records {
            log.apply(r);
        }
        log.import_legacy(&root)?;
        Ok(Self {
            inner: Arc::new(Mutex::new(log)),
        })
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a started batch script.
    pub fn record_running(&self, job_id: u64, pid: u32) {
        let Some(start) = process_start_time(pid) else {
            return;
        };
        self.note_running(job_id, pid, start);
    }

    fn note_running(&self, job_id: u64, pid: u32, start: u64) {
        if let Err(e) = self.log().append(Record::Running { job_id, pid, start }) {
            warn!(job_id, error = %e, "cannot journal a running job");
        }
    }

    /// Stores an end before it is reported; the job is no longer running.
    pub fn record_ended(&self, ended: &JobEnded) {
        let record = Record::Ended {
            job_id: ended.job_id,
            bytes: ended.encode_to_vec(),
        };
        if let Err(e) = self.log().append(record) {
            warn!(job_id = ended.job_id, error = %e, "cannot journal a job end");
        }
    }

    /// The controller has this end.
    pub fn forget_ended(&self, job_id: u64) {
        let mut log = self.log();
        if !log.ended.contains_key(&job_id) {
            return;
        }
        if let Err(e) = log.append(Record::Forget { job_id }) {
            warn!(job_id, error = %e, "cannot journal a reported end");
        }
    }

    /// Ends to report after a restart: recorded ones, plus jobs of the previous worker life
    /// killed now.
    pub fn recover(&self) -> Vec<JobEnded> {
        let (ended, running) = {
            let log = self.log();
            (log.ended.clone(), log.running.clone())
        };
        let mut out = Vec::new();
        for (job_id, bytes) in ended {
            match JobEnded::decode(bytes.as_slice()) {
                Ok(e) if e.job_id == job_id => out.push(e),
                _ => {
                    warn!(job_id, "unreadable journal entry dropped");
                    let _ = self.log().append(Record::Forget { job_id });
                }
            }
        }
        for (job_id, (pid, start)) in running {
            if process_start_time(pid) == Some(start)
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

#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    Running { job_id: u64, pid: u32, start: u64 },
    Ended { job_id: u64, bytes: Vec<u8> },
    Forget { job_id: u64 },
}

impl Log {
    fn apply(&mut self, r: Record) {
        match r {
            Record::Running { job_id, pid, start } => {
                self.running.insert(job_id, (pid, start));
            }
            Record::Ended { job_id, bytes } => {
                self.running.remove(&job_id);
                self.ended.insert(job_id, bytes);
            }
            Record::Forget { job_id } => {
                self.ended.remove(&job_id);
            }
        }
    }

    fn append(&mut self, r: Record) -> io::Result<()> {
        let bytes = encode(&r);
        // One write(2) of the whole record: a worker that dies mid-way leaves all of it or
        // none in the page cache; only a power loss can tear it, which reading tolerates.
        self.file.write_all(&bytes)?;
        self.size += bytes.len() as u64;
        self.apply(r);
        if self.size > COMPACT_AT {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the log with the live records only.
    fn compact(&mut self) -> io::Result<()> {
        let mut bytes = Vec::new();
        for (job_id, (pid, start)) in &self.running {
            bytes.extend(encode(&Record::Running {
                job_id: *job_id,
                pid: *pid,
                start: *start,
            }));
        }
        for (job_id, ended) in &self.ended {
            bytes.extend(encode(&Record::Ended {
                job_id: *job_id,
                bytes: ended.clone(),
            }));
        }
        let tmp = self.path.with_extension("tmp");
        // Appends go on through this descriptor: it names the new log once renamed, so no
        // failure after the rename can leave them going to the unlinked old one.
        let mut file = OpenOptions::new().create(true).append(true).open(&tmp)?;
        file.set_len(0)?;
        file.write_all(&bytes)?;
        fs::rename(&tmp, &self.path)?;
        self.file = file;
        self.size = bytes.len() as u64;
        Ok(())
    }

    /// Takes in the per-job files of the older layout, then removes them.
    fn import_legacy(&mut self, root: &Path) -> io::Result<()> {
        let (running, ended) = (root.join("running"), root.join("ended"));
        for (job_id, path) in entries(&ended) {
            match fs::read(&path).map(|b| JobEnded::decode(b.as_slice())) {
                Ok(Ok(e)) if e.job_id == job_id => self.append(Record::Ended {
                    job_id,
                    bytes: e.encode_to_vec(),
                })?,
                _ => warn!(path = %path.display(), "unreadable journal entry dropped"),
            }
            let _ = fs::remove_file(&path);
        }
        for (job_id, path) in entries(&running) {
            let text = fs::read_to_string(&path).unwrap_or_default();
            if let Some((pid, start)) = parse_running(&text) {
                self.append(Record::Running { job_id, pid, start })?;
            }
            let _ = fs::remove_file(&path);
        }
        for dir in [running, ended] {
            let _ = fs::remove_dir(dir);
        }
        Ok(())
    }
}

fn encode(r: &Record) -> Vec<u8> {
    let mut body = Vec::with_capacity(32);
    let (kind, job_id) = match r {
        Record::Running { job_id, .. } => (RUNNING, job_id),
        Record::Ended { job_id, .. } => (ENDED, job_id),
        Record::Forget { job_id } => (FORGET, job_id),
    };
    body.push(kind);
    body.extend_from_slice(&job_id.to_le_bytes());
    match r {
        Record::Running { pid, start, .. } => {
            body.extend_from_slice(&pid.to_le_bytes());
            body.extend_from_slice(&start.to_le_bytes());
        }
        Record::Ended { bytes, .. } => body.extend_from_slice(bytes),
        Record::Forget { .. } => {}
    }
    let sum = fnv1a(&body);
    // The body is bounded by a JobEnded's size, far below u32::MAX.
    let len = u32::try_from(body.len() + 8).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Every whole, intact record, and the length of the prefix they fill.
fn decode_all(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((r, used)) = decode_one(&bytes[at..]) {
        out.push(r);
        at += used;
    }
    (out, at)
}

fn decode_one(bytes: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    if !(17..=MAX_RECORD).contains(&len) {
        return None;
    }
    let rec = bytes.get(4..4 + len as usize)?;
    let (body, sum) = rec.split_at(rec.len() - 8);
    if fnv1a(body).to_le_bytes() != sum {
        return None;
    }
    let job_id = u64::from_le_bytes(body.get(1..9)?.try_into().ok()?);
    let payload = &body[9..];
    let r = match body[0] {
        RUNNING if payload.len() == 12 => Record::Running {
            job_id,
            pid: u32::from_le_bytes(payload[..4].try_into().ok()?),
            start: u64::from_le_bytes(payload[4..].try_into().ok()?),
        },
        ENDED => Record::Ended {
            job_id,
            bytes: payload.to_vec(),
        },
        FORGET if payload.is_empty() => Record::Forget { job_id },
        _ => return None,
    };
    Some((r, 4 + len as usize))
}

/// FNV-1a, 64 bits: enough to tell a torn or zeroed tail from a record.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
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
        j.note_running(5, std::process::id(), 1);

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

    #[test]
    fn a_torn_tail_is_cut_and_what_came_before_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        j.record_ended(&JobEnded {
            job_id: 1,
            exit_code: 3,
            ..Default::default()
        });
        drop(j);
        let log = dir.path().join("journal/log");
        let good = fs::metadata(&log).unwrap().len();
        // Half a record, then zeros: what a power loss can leave.
        let mut torn = encode(&Record::Forget { job_id: 1 });
        torn.truncate(10);
        torn.extend([0u8; 64]);
        fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(&torn)
            .unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert_eq!(fs::metadata(&log).unwrap().len(), good, "cut at the tear");
        let got = j.recover();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].job_id, got[0].exit_code), (1, 3));
        // Appends after the cut are read back.
        j.forget_ended(1);
        assert!(Journal::open(dir.path()).unwrap().recover().is_empty());
    }

    #[test]
    fn compaction_keeps_only_live_records() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let big = |job_id| JobEnded {
            job_id,
            launch_error: "x".repeat(4096),
            ..Default::default()
        };
        for id in 1..=400 {
            j.record_ended(&big(id));
            if id != 7 {
                j.forget_ended(id);
            }
        }
        let size = fs::metadata(dir.path().join("journal/log")).unwrap().len();
        assert!(size < COMPACT_AT, "compacted: {size} bytes");
        // Written after the last compaction, through the descriptor it left.
        j.record_ended(&big(401));
        let got = Journal::open(dir.path()).unwrap().recover();
        assert_eq!(got.iter().map(|e| e.job_id).collect::<Vec<_>>(), [7, 401]);
        assert_eq!(got[0], big(7));
    }

    #[test]
    fn entries_of_the_older_layout_are_taken_in_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("journal");
        fs::create_dir_all(root.join("ended")).unwrap();
        fs::create_dir_all(root.join("running")).unwrap();
        let ended = JobEnded {
            job_id: 9,
            exit_code: 2,
            ..Default::default()
        };
        fs::write(root.join("ended/9"), ended.encode_to_vec()).unwrap();
        // A pid whose start time cannot match: reported killed, nothing signalled.
        fs::write(root.join("running/10"), "1 1\n").unwrap();
        let j = Journal::open(dir.path()).unwrap();
        assert!(!root.join("ended").exists() && !root.join("running").exists());
        let got: Vec<_> = j.recover().iter().map(|e| (e.job_id, e.signal)).collect();
        assert_eq!(got, [(9, 0), (10, 9)]);
        assert_eq!(Journal::open(dir.path()).unwrap().recover().len(), 2);
    }

    #[test]
    fn garbage_is_not_a_record() {
        assert_eq!(decode_all(b"").1, 0);
        assert_eq!(decode_all(&[0xff; 40]).1, 0);
        let mut r = encode(&Record::Running {
            job_id: 1,
            pid: 2,
            start: 3,
        });
        assert_eq!(decode_all(&r).0.len(), 1);
        r[6] ^= 1;
        assert_eq!(decode_all(&r).1, 0, "a flipped bit fails the check");
    }
}
