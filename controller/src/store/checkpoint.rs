//! WAL checkpoints off the commit path.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its threshold, on the
//! committer thread: that commit, and every caller waiting for it, pays for copying the WAL
//! back into the database file and for its fsyncs (the 10-14 ms p99 commit stalls under a
//! submit flood). Here a WAL hook replaces the writer's automatic checkpoint: once per
//! [`Policy::passive_pages`] new frames it wakes a thread with its own connection, which runs
//! a PASSIVE checkpoint. That copies what it can without the writer's lock, so commits go on
//! meanwhile. Used with `--durability process` only (see `commit_loop` for why not with
//! `full`): there a commit does not fsync, so an inline checkpoint (a copy and two fsyncs)
//! was its whole tail; measured under a submit flood, p99 commit fell from about 4 ms to
//! under 1 ms.
//!
//! # Bounded WAL
//!
//! The log starts over from its beginning only when a commit begins with every frame copied
//! back, which a checkpoint on another thread racing a steady stream of commits may never
//! allow: the WAL would grow without bound. So once it holds [`Policy::restart_pages`]
//! frames, the committer runs a RESTART checkpoint itself between two commits
//! ([`Checkpoints::restart_if_over`]): it copies only the frames the background checkpoints
//! have not yet (about [`Policy::passive_pages`] at most), and the next commit writes from
//! the start of the file again. One short stall per `restart_pages` frames instead of one
//! longer one per `passive_pages`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::wal::CheckpointMode;
use tracing::{debug, warn};

use super::sqlite::{Store, StoreError};

/// Longest the committer waits for the log to be free for its RESTART checkpoint.
const RESTART_WAIT: Duration = Duration::from_millis(50);

/// When to checkpoint, in WAL frames (one page each, 4 KiB by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Wake the checkpoint thread once per this many new frames (SQLite's own default).
    pub passive_pages: i32,
    /// From this many frames on, the writer restarts the log (64 MiB of 4 KiB pages).
    pub restart_pages: i32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            passive_pages: 1000,
            restart_pages: 16_384,
        }
    }
}

/// The running checkpoint thread and what the writer's hook saw last.
pub struct Checkpoints {
    handle: JoinHandle<()>,
    /// Frames in the WAL after the last commit.
    pages: Arc<AtomicI32>,
    /// After a RESTART that found a reader in the way: frames the WAL must reach before the
    /// writer tries again, so a long reader does not cost every commit a wait. Shared with
    /// the WAL hook, which does not wake the thread for a commit after which the writer
    /// restarts the log itself.
    retry_at: Arc<AtomicI32>,
    policy: Policy,
}

impl Checkpoints {
    /// Turns off `writer`'s automatic checkpoints and starts the thread that runs them
    /// instead. The thread ends once `writer` is dropped (see [`Checkpoints::join`]).
    pub fn spawn(writer: &mut Store, policy: Policy) -> Result<Self, StoreError> {
        let checkpointer = writer.open_checkpointer()?;
        // One wake-up waiting is enough: the checkpoint it starts covers every commit
        // before it.
        let (tx, rx) = mpsc::sync_channel::<i32>(1);
        let handle = std::thread::Builder::new()
            .name("tandem-checkpoint".into())
            .spawn(move || checkpoint_loop(&checkpointer, &rx))
            .map_err(StoreError::Thread)?;
        let pages = Arc::new(AtomicI32::new(0));
        let seen = pages.clone();
        let retry_at = Arc::new(AtomicI32::new(0));
        let restart_at = retry_at.clone();
        // Frames in the WAL when the thread was last woken: each checkpoint fsyncs, so
        // not after every commit.
        let mut woken_at = 0;
        writer.on_wal_commit(move |now| {
            seen.store(now, Ordering::Relaxed);
            if now < woken_at {
                // The log started over.
                woken_at = 0;
            }
            // The writer runs a RESTART after this commit (`restart_if_over`): a PASSIVE
            // pass started now would hold the log it needs, and on a slow disk outlast
            // its short wait, at every retry, as retries and wake-ups fall on the same
            // commits (one passive interval apart).
            let restarting = now >= policy.restart_pages.max(restart_at.load(Ordering::Relaxed));
            if !restarting && now - woken_at >= policy.passive_pages {
                // Full: a wake-up is pending already. Disconnected: the thread is gone, and
                // `restart_if_over` still bounds the WAL.
                let _ = tx.try_send(now);
                woken_at = now;
            }
        })?;
        Ok(Self {
            handle,
            pages,
            retry_at,
            policy,
        })
    }

    /// Run by the writer between commits: a RESTART checkpoint if the WAL has reached
    /// [`Policy::restart_pages`] (see the module docs). Returns whether one ran.
    pub fn restart_if_over(&self, writer: &Store) -> bool {
        let pages = self.pages.load(Ordering::Relaxed);
        if pages
            < self
                .policy
                .restart_pages
                .max(self.retry_at.load(Ordering::Relaxed))
        {
            return false;
        }
        let started = Instant::now();
        // Every caller waits with the committer: long enough for a background PASSIVE pass
        // (a few ms) to finish, not for a long reader.
        match writer.checkpoint_within(CheckpointMode::RESTART, RESTART_WAIT) {
            Ok((log, copied)) => {
                // Until the next commit says otherwise.
                self.pages.store(0, Ordering::Relaxed);
                self.retry_at.store(0, Ordering::Relaxed);
                debug!(
                    log,
                    copied,
                    checkpoint_us = started.elapsed().as_micros() as u64,
                    "wal restart checkpoint"
                );
                true
            }
            // A reader in the way: commits are durable in the WAL all the same; try again
            // once the log has grown by another passive interval.
            Err(e) => {
                self.retry_at.store(
                    pages.saturating_add(self.policy.passive_pages),
                    Ordering::Relaxed,
                );
                warn!(error = %e, "wal restart checkpoint failed; will retry later");
                false
            }
        }
    }

    /// Waits for the thread, which ends once the writer is dropped.
    pub fn join(self) {
        let _ = self.handle.join();
    }
}

fn checkpoint_loop(conn: &Store, rx: &mpsc::Receiver<i32>) {
    while let Ok(pages) = rx.recv() {
        let started = Instant::now();
        match conn.checkpoint(CheckpointMode::PASSIVE) {
            Ok((log, copied)) => debug!(
                pages,
                log,
                copied,
                checkpoint_us = started.elapsed().as_micros() as u64,
                "wal checkpoint"
            ),
            // An I/O error: commits are durable in the WAL all the same; try again at the
            // next wake-up.
            Err(e) => warn!(error = %e, "wal checkpoint failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Batch;

    const PAGE: u64 = 4096;

    /// With a WAL not filled ahead, so that its size shows where the log restarts (where
    /// this thread runs, `--durability process`, the controller does not fill it).
    fn open(dir: &std::path::Path) -> Store {
        Store::open_unfilled(dir).unwrap()
    }

    fn wal_bytes(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join(format!("{}-wal", Store::FILE)))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    fn db_bytes(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join(Store::FILE))
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Commits `n` jobs of 8 KiB each (3 frames or so), calling `between` after each.
    fn commit_jobs(store: &mut Store, n: u64, mut between: impl FnMut(&Store)) {
        for id in 1..=n {
            let b = Batch {
                jobs: vec![(id, vec![7u8; 8192])],
                ..Batch::default()
            };
            store.commit(&[&b]).unwrap();
            between(store);
        }
    }

    #[test]
    fn the_writer_itself_no_longer_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        store.on_wal_commit(|_| {}).unwrap();
        commit_jobs(&mut store, 600, |_| {});
        // SQLite would have checkpointed at 1000 frames inside a commit and started the log
        // over; with the hook and no one checkpointing, it keeps growing.
        let grown = wal_bytes(dir.path());
        assert!(grown > 1500 * PAGE, "WAL only {grown} bytes");
    }

    #[test]
    fn the_thread_copies_the_log_back_and_the_writer_restarts_it_at_the_bound() {
        let policy = Policy {
            passive_pages: 50,
            restart_pages: 200,
        };
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let ckpt = Checkpoints::spawn(&mut store, policy).unwrap();
        let mut restarts = 0;
        commit_jobs(&mut store, 600, |s| {
            restarts += u32::from(ckpt.restart_if_over(s))
        });
        // About 2,000 frames written: the log went back to its start every 200 or so.
        assert!(restarts >= 5, "{restarts} restarts");
        let wal = wal_bytes(dir.path());
        assert!(wal < 2 * 200 * PAGE, "WAL {wal} bytes");
        // The background checkpoints copied the jobs into the database file.
        assert!(db_bytes(dir.path()) > 500 * 8192);
        drop(store);
        ckpt.join();
        assert_eq!(
            Store::open(dir.path()).unwrap().load().unwrap().jobs.len(),
            600
        );
    }

    /// A reader holding an old snapshot blocks the RESTART: the committer gives up within
    /// `RESTART_WAIT` rather than the 10 s busy timeout, and does not try again on every
    /// commit, only after another passive interval of frames.
    #[test]
    fn a_long_reader_costs_the_writer_one_short_wait_per_interval() {
        let policy = Policy {
            passive_pages: 50,
            restart_pages: 100,
        };
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let ckpt = Checkpoints::spawn(&mut store, policy).unwrap();
        commit_jobs(&mut store, 5, |_| {});
        let reader = rusqlite::Connection::open(dir.path().join(Store::FILE)).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        let mut attempts = 0u32;
        let mut waited = Duration::ZERO;
        commit_jobs(&mut store, 60, |s| {
            let began = Instant::now();
            if ckpt.restart_if_over(s) {
                panic!("RESTART succeeded under a reader's snapshot");
            }
            let took = began.elapsed();
            if took >= RESTART_WAIT / 2 {
                attempts += 1;
            }
            waited += took;
        });
        // About 180 frames past the bound of 100: a try at 100, then one per 50 frames.
        assert!((1..=4).contains(&attempts), "{attempts} waiting attempts");
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        commit_jobs(&mut store, 40, |s| {
            ckpt.restart_if_over(s);
        });
        // The checkpoint thread runs on its own: on a loaded machine the truncating RESTART
        // can land a few commits later, so allow it a bounded number of further intervals.
        // Wait by the clock, not by a count of tries: on two busy cores the checkpoint thread
        // may not run for seconds. One small commit per try keeps asking without growing the
        // log by much.
        let deadline = Instant::now() + Duration::from_secs(20);
        while wal_bytes(dir.path()) >= 2 * 200 * PAGE && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            commit_jobs(&mut store, 1, |s| {
                ckpt.restart_if_over(s);
            });
        }
        assert!(wal_bytes(dir.path()) < 2 * 200 * PAGE);
        drop(store);
        ckpt.join();
    }
}
