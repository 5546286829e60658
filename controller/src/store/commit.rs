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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

use tracing::{debug, error};

use super::sqlite::{Batch, Store, StoreError};

/// Runs once its batch's transaction has committed (`Ok`) or failed (`Err`). It may read
/// from the store, which is how launches fetch payloads.
pub type Effect = Box<dyn FnOnce(&Store, Result<(), &StoreError>) + Send>;

/// Upper bound on batches merged into one transaction, so one commit's latency stays
/// bounded under an unbounded burst.
const MAX_BATCHES_PER_TX: usize = 4096;

struct Queued {
    batch: Batch,
    effects: Vec<Effect>,
}

/// Handle to the committer thread. Cloning shares the queue.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Queued>,
    /// Transactions committed so far (for metrics and to show grouping in tests).
    transactions: Arc<AtomicU64>,
}

impl Committer {
    /// Starts the committer thread; it ends when every handle is dropped (after draining
    /// the queue) or after a failed commit.
    pub fn spawn(store: Store) -> std::io::Result<(Self, JoinHandle<Result<(), StoreError>>)> {
        let (tx, rx) = mpsc::channel();
        let transactions = Arc::new(AtomicU64::new(0));
        let counter = transactions.clone();
        let handle = std::thread::Builder::new()
            .name("tandem-commit".into())
            .spawn(move || commit_loop(store, rx, &counter))?;
        Ok((Self { tx, transactions }, handle))
    }

    /// Queues a batch; its effects run after it is durable. An empty batch still runs its
    /// effects in order (after every earlier batch is durable).
    pub fn submit(&self, batch: Batch, effects: Vec<Effect>) -> Result<(), StoreError> {
        self.tx
            .send(Queued { batch, effects })
            .map_err(|_| StoreError::Closed)
    }

    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }
}

fn commit_loop(
    mut store: Store,
    rx: mpsc::Receiver<Queued>,
    transactions: &AtomicU64,
) -> Result<(), StoreError> {
    let mut group: Vec<Queued> = Vec::new();
    while let Ok(first) = rx.recv() {
        group.push(first);
        while group.len() < MAX_BATCHES_PER_TX {
            match rx.try_recv() {
                Ok(q) => group.push(q),
                Err(_) => break,
            }
        }
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
            transactions.fetch_add(1, Ordering::Relaxed);
            store.commit(&writes)
        };
        let commit_us = started.elapsed().as_micros() as u64;
        let batches = group.len();
        let effects_started = Instant::now();
        for q in group.drain(..) {
            for effect in q.effects {
                effect(&store, result.as_ref().map(|_| ()));
            }
        }
        debug!(
            batches,
            rows,
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
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn concurrent_batches_share_transactions_and_all_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (c, handle) = Committer::spawn(Store::open(dir.path()).unwrap()).unwrap();
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
        let counter = c.transactions.clone();
        drop(c);
        handle.join().unwrap().unwrap();
        let tx_count = counter.load(Ordering::Relaxed);
        // 800 batches in far fewer transactions (one, as they were all queued).
        assert!(tx_count <= 2, "{tx_count} transactions for 800 batches");
        let loaded = Store::open(dir.path()).unwrap().load().unwrap();
        assert_eq!(loaded.jobs.len(), 800);
    }

    #[test]
    fn effects_run_after_commit_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (c, handle) = Committer::spawn(store).unwrap();
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
