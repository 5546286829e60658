//! Group commit: one thread owns the write connection, merges every batch queued while the
//! previous transaction was being fsynced into the next transaction, and after each commit
//! runs the batches' effects in queue order.
//!
//! ```text
//!   state actor ──(Batch, effects)──▶ queue ──▶ committer thread
//!                                              BEGIN; apply b1; apply b2; ...; COMMIT (1 fsync)
//!                                              then effects of b1, b2, ...: replies, launches
//! ```
//!
//! The actor never waits for the disk: it keeps applying commands while a transaction is in
//! flight, and those changes form the next transaction. A caller hears back only from an
//! effect, that is only after its writes are durable.
//!
//! # Gathering the callers just answered
//!
//! Clients that wait for each acknowledgement send their next request right after a commit's
//! replies. Committing at once whatever is queued then splits them into two cohorts that
//! alternate: one commits while the other is still on its way back, and each fsync carries
//! half of the waiting clients. So after a commit that ran `E` effects, the committer waits
//! for about `E` new effects to arrive, but never longer than that commit took (a slow fsync
//! is worth waiting for, a fast one is not) nor than [`MAX_GATHER`]. With nothing queued it
//! simply blocks as before, and a lone sequential client is never delayed: a group with one
//! effect sets no wait. Effects that are not replies (launches, watch updates) count too, so
//! after a pass that launched many jobs the wait may run to its deadline: bounded, as above.
//!
//! # Holding back what nobody waits for
//!
//! A batch without effects has nobody waiting on it: the starts and ends workers report,
//! heartbeats, usage charged by a tick. Committed at once, such a batch occupies the disk
//! just when a caller's batch arrives, and the caller waits for two fsyncs, the other's and
//! its own: with jobs running, a `sbatch` loop queued behind every job's end this way. So a
//! group made only of such batches waits up to [`MAX_DEFER`] for a batch somebody waits on
//! and goes out with it, one fsync for both; the caller's batch is never held. Holding a
//! worker's report loses nothing: the worker keeps each end until the stream that carried
//! it has stayed up far longer than this (`worker::outbox`), and a controller that dies
//! meanwhile breaks that stream, so the end is sent again.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tracing::{debug, error, warn};

use super::checkpoint::{Checkpoints, Policy};
use super::sqlite::{Batch, Durability, Store, StoreError};

/// Runs once its batch's transaction has committed (`Ok`) or failed (`Err`). It may read
/// from the store, which is how launches fetch payloads.
pub type Effect = Box<dyn FnOnce(&Store, Result<(), &StoreError>) + Send>;

/// Upper bound on batches merged into one transaction, so one commit's latency stays
/// bounded under an unbounded burst.
const MAX_BATCHES_PER_TX: usize = 4096;

/// Longest the committer holds queued batches back to let answered callers rejoin them.
const MAX_GATHER: Duration = Duration::from_millis(2);

/// Longest a group that nobody waits on is held for one that somebody does (see the module
/// docs): a few of a sequential client's round trips, far below anything a reader notices.
const MAX_DEFER: Duration = Duration::from_millis(5);

struct Queued {
    batch: Batch,
    effects: Vec<Effect>,
}

/// Handle to the committer thread. Cloning shares the queue.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Queued>,
    /// Transactions committed so far (`tandem_store_commits_total`).
    commits: Counter,
}

impl Committer {
    /// Starts the committer thread; it ends when every handle is dropped (after draining
    /// the queue) or after a failed commit.
    pub fn spawn(
        store: Store,
        commits: Counter,
    ) -> std::io::Result<(Self, JoinHandle<Result<(), StoreError>>)> {
        let (tx, rx) = mpsc::channel();
        let counter = commits.clone();
        let handle = std::thread::Builder::new()
            .name("tandem-commit".into())
            .spawn(move || commit_loop(store, rx, &counter))?;
        Ok((Self { tx, commits }, handle))
    }

    /// Queues a batch; its effects run after it is durable. An empty batch still runs its
    /// effects in order (after every earlier batch is durable).
    pub fn submit(&self, batch: Batch, effects: Vec<Effect>) -> Result<(), StoreError> {
        self.tx
            .send(Queued { batch, effects })
            .map_err(|_| StoreError::Closed)
    }

    pub fn transactions(&self) -> u64 {
        self.commits.get()
    }
}

/// How long to keep gathering before the next commit (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gather {
    /// Effects expected back: those the last group ran.
    expect: usize,
    /// When to commit anyway.
    deadline: Instant,
}

impl Gather {
    /// After a group that ran `effects` effects and whose commit took `took`, ending `now`.
    fn after(effects: usize, took: Duration, now: Instant) -> Self {
        Self {
            expect: effects,
            deadline: now + took.min(MAX_GATHER),
        }
    }

    /// Whether to stop gathering, given the effects that arrived since the last group ended.
    fn done(&self, arrived: usize, now: Instant) -> bool {
        arrived >= self.expect || now >= self.deadline
    }
}

/// Fills `group` for the next transaction: everything queued now, then (while `gather` is
/// not done) what arrives before its deadline, then, while nobody waits on any of it, what
/// arrives within `defer`. False when every sender is gone and nothing is left.
fn next_group(
    rx: &mpsc::Receiver<Queued>,
    group: &mut Vec<Queued>,
    gather: Option<Gather>,
    defer: Duration,
) -> bool {
    let drain = |group: &mut Vec<Queued>| -> usize {
        let mut effects = 0;
        while group.len() < MAX_BATCHES_PER_TX {
            match rx.try_recv() {
                Ok(q) => {
                    effects += q.effects.len();
                    group.push(q);
                }
                Err(_) => break,
            }
        }
        effects
    };
    // What was queued while the last commit ran came from others, not from its callers.
    drain(group);
    if let Some(g) = gather {
        let mut arrived = 0;
        while group.len() < MAX_BATCHES_PER_TX && !g.done(arrived, Instant::now()) {
            // With nothing queued, waiting holds nothing back: block for the first arrival.
            let next = if group.is_empty() {
                rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
            } else {
                rx.recv_timeout(g.deadline.saturating_duration_since(Instant::now()))
            };
            let Ok(q) = next else { break };
            arrived += q.effects.len();
            group.push(q);
            arrived += drain(group);
        }
    }
    if group.is_empty() {
        let Ok(first) = rx.recv() else {
            return false;
        };
        group.push(first);
        drain(group);
    }
    let deadline = Instant::now() + defer;
    let mut waited_on = group.iter().any(|q| !q.effects.is_empty());
    while !waited_on && group.len() < MAX_BATCHES_PER_TX {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(q) => {
                waited_on = !q.effects.is_empty();
                group.push(q);
                waited_on |= drain(group) > 0;
            }
            // The deadline, or every sender gone: commit what there is.
            Err(_) => break,
        }
    }
    true
}

fn commit_loop(
    mut store: Store,
    rx: mpsc::Receiver<Queued>,
    transactions: &Counter,
) -> Result<(), StoreError> {
    // Checkpoints leave the commit path only where commits do not fsync. With `--durability
    // full` every commit waits for the disk anyway, and a checkpoint's fsyncs on another
    // thread slow those down (measured under a submit flood: no better tail, a slower
    // median), so SQLite's own checkpoint inside a commit stays. If the thread cannot start,
    // those keep the WAL bounded too: a slower tail, nothing lost.
    let checkpoints = match store.durability() {
        Durability::Full => None,
        Durability::Process => match Checkpoints::spawn(&mut store, Policy::default()) {
            Ok(c) => Some(c),
            Err(e) => {
                warn!(error = %e, "WAL checkpoints run inside commits");
                None
            }
        },
    };
    let result = commit_groups(&mut store, &rx, transactions, checkpoints.as_ref());
    // The checkpoint thread ends when the writer, which holds its wake-up sender, is gone.
    drop(store);
    if let Some(c) = checkpoints {
        c.join();
    }
    result
}

fn commit_groups(
    store: &mut Store,
    rx: &mpsc::Receiver<Queued>,
    transactions: &Counter,
    checkpoints: Option<&Checkpoints>,
) -> Result<(), StoreError> {
    let mut group: Vec<Queued> = Vec::new();
    let mut gather: Option<Gather> = None;
    while next_group(rx, &mut group, gather.take(), MAX_DEFER) {
        let writes: Vec<&Batch> = group
            .iter()
            .map(|q| &q.batch)
            .filter(|b| !b.is_empty())
            .collect();
        let rows: usize = writes.iter().map(|b| b.rows()).sum();
        let started = Instant::now();
        let result = if writes.is_empty() {
            Ok(())
        } else {
            transactions.inc();
            store.commit(&writes)
        };
        let took = started.elapsed();
        let commit_us = took.as_micros() as u64;
        let batches = group.len();
        let effects_started = Instant::now();
        let mut effects = 0;
        for q in group.drain(..) {
            for effect in q.effects {
                effect(store, result.as_ref().map(|_| ()));
                effects += 1;
            }
        }
        if effects > 1 {
            gather = Some(Gather::after(effects, took, Instant::now()));
        }
        debug!(
            batches,
            rows,
            effects,
            commit_us,
            effects_us = effects_started.elapsed().as_micros() as u64,
            "group commit"
        );
        if let Err(e) = result {
            // Memory and disk have diverged; stop accepting writes so the controller shuts
            // down and a restart recovers from what is durable.
            error!(error = %e, "commit failed; the controller must restart");
            return Err(e);
        }
        // After this group's callers heard back, before the next group gathers.
        if let Some(c) = checkpoints {
            c.restart_if_over(store);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn concurrent_batches_share_transactions_and_all_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (c, handle) =
            Committer::spawn(Store::open(dir.path()).unwrap(), Counter::default()).unwrap();
        // Hold the committer in its first effect so that what the threads queue meanwhile
        // must go out together.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        c.submit(
            Batch::default(),
            vec![Box::new(move |_: &Store, _: Result<(), &StoreError>| {
                let _ = gate_rx.recv();
            })],
        )
        .unwrap();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        let id = t * 1000 + i + 1;
                        let b = Batch {
                            jobs: vec![(id, vec![1])],
                            payloads: vec![(id, vec![2])],
                            ..Batch::default()
                        };
                        c.submit(b, Vec::new()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        gate_tx.send(()).unwrap();
        let counter = c.commits.clone();
        drop(c);
        handle.join().unwrap().unwrap();
        let tx_count = counter.get();
        // 800 batches in far fewer transactions (one, as they were all queued).
        assert!(tx_count <= 2, "{tx_count} transactions for 800 batches");
        let loaded = Store::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(loaded.jobs.len(), 800);
    }

    fn queued(effects: usize) -> Queued {
        Queued {
            batch: Batch::default(),
            effects: (0..effects)
                .map(|_| Box::new(|_: &Store, _: Result<(), &StoreError>| {}) as Effect)
                .collect(),
        }
    }

    #[test]
    fn gathering_ends_when_the_answered_return_or_at_the_deadline() {
        let now = Instant::now();
        let g = Gather::after(3, Duration::from_millis(1), now);
        assert!(!g.done(2, now));
        assert!(g.done(3, now));
        assert!(g.done(0, now + Duration::from_millis(1)));
        // A slow commit is worth waiting for only up to the cap.
        let g = Gather::after(3, Duration::from_secs(5), now);
        assert!(g.done(0, now + MAX_GATHER));
    }

    #[test]
    fn answered_callers_join_the_batches_queued_before_them() {
        let (tx, rx) = mpsc::channel();
        // Queued while the last commit ran: another cohort.
        tx.send(queued(1)).unwrap();
        tx.send(queued(1)).unwrap();
        let late = tx.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(5));
                late.send(queued(1)).unwrap();
            }
        });
        let g = Gather {
            expect: 2,
            deadline: Instant::now() + Duration::from_secs(60),
        };
        let mut group = Vec::new();
        assert!(next_group(&rx, &mut group, Some(g), MAX_DEFER));
        t.join().unwrap();
        // Both returning callers made it into the same transaction as the queued ones.
        assert_eq!(group.len(), 4);
    }

    #[test]
    fn gathering_holds_queued_batches_no_longer_than_the_deadline() {
        let (tx, rx) = mpsc::channel();
        tx.send(queued(1)).unwrap();
        let started = Instant::now();
        let g = Gather {
            expect: 5,
            deadline: started + Duration::from_millis(20),
        };
        let mut group = Vec::new();
        assert!(next_group(&rx, &mut group, Some(g), MAX_DEFER));
        assert_eq!(group.len(), 1);
        assert!(started.elapsed() >= Duration::from_millis(20));
        // Without a gather, what is queued goes at once; with nothing and no sender, stop.
        group.clear();
        tx.send(queued(0)).unwrap();
        drop(tx);
        assert!(next_group(&rx, &mut group, None, MAX_DEFER));
        assert_eq!(group.len(), 1);
        group.clear();
        assert!(!next_group(&rx, &mut group, None, MAX_DEFER));
    }

    #[test]
    fn a_batch_nobody_waits_on_goes_out_with_the_next_one_somebody_does() {
        let (tx, rx) = mpsc::channel();
        // A worker's report, then (later) a caller's submit.
        tx.send(queued(0)).unwrap();
        let late = tx.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            late.send(queued(1)).unwrap();
        });
        let started = Instant::now();
        let mut group = Vec::new();
        assert!(next_group(&rx, &mut group, None, Duration::from_secs(60)));
        t.join().unwrap();
        assert_eq!(group.len(), 2, "one transaction for both");
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not held past the caller"
        );
    }

    #[test]
    fn a_batch_nobody_waits_on_is_held_no_longer_than_the_deferral() {
        let (tx, rx) = mpsc::channel();
        tx.send(queued(0)).unwrap();
        tx.send(queued(0)).unwrap();
        let started = Instant::now();
        let mut group = Vec::new();
        assert!(next_group(&rx, &mut group, None, Duration::from_millis(20)));
        assert_eq!(group.len(), 2);
        assert!(started.elapsed() >= Duration::from_millis(20));
        // A group somebody waits on is never held for more.
        tx.send(queued(1)).unwrap();
        let started = Instant::now();
        group.clear();
        assert!(next_group(&rx, &mut group, None, Duration::from_secs(60)));
        assert_eq!(group.len(), 1);
        assert!(started.elapsed() < Duration::from_secs(30));
        drop(tx);
    }

    #[test]
    fn effects_run_after_commit_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (c, handle) = Committer::spawn(store, Counter::default()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 1..=50u64 {
            let seen = seen.clone();
            let b = Batch {
                payloads: vec![(i, vec![i as u8])],
                ..Batch::default()
            };
            c.submit(
                b,
                vec![Box::new(
                    move |store: &Store, r: Result<(), &StoreError>| {
                        assert!(r.is_ok());
                        // The effect sees its own write.
                        let p = store.load_payload(i).unwrap();
                        seen.lock().unwrap().push((i, p));
                    },
                )],
            )
            .unwrap();
        }
        drop(c);
        handle.join().unwrap().unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 50);
        for (n, (i, p)) in seen.iter().enumerate() {
            assert_eq!(*i, n as u64 + 1);
            assert_eq!(p.as_deref(), Some(&[*i as u8][..]));
        }
    }
}
