//! Serving listings from the state actor's published read view, off the actor and off the
//! async workers: each listing runs on a pool of its own, at most [`max_listings`] at once
//! and at a lower CPU priority ([`LISTING_NICE`]), so a crowd looping `squeue` over a long
//! queue shares those threads and, when the cores are busy, yields them to scheduling,
//! commits and the tasks that answer everything else.

use std::sync::{Mutex, OnceLock, mpsc};

use tonic::Status;
use tracing::warn;

use crate::state::{Handle, ReadView};

/// The nice value of listing threads (Linux keeps one per thread): the lowest, so a listing
/// gets next to nothing of a core the actor or the committer also wants, and all of an idle
/// one (`benches/squeue_load.rs` measures what a squeue crowd still costs; README).
pub const LISTING_NICE: i32 = 19;

/// Listings that may run at once (the rest wait their turn): half the machine's cores, at
/// least one, so listings never take the cores the actor and the committer need.
pub fn max_listings() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

type Work = Box<dyn FnOnce() + Send>;

/// The pool's queue. Its threads start on first use and live as long as the process: a
/// blocking-pool thread cannot be given back its priority once lowered (raising it needs
/// privilege), so listings get threads of their own.
fn pool() -> &'static Mutex<mpsc::Sender<Work>> {
    static POOL: OnceLock<Mutex<mpsc::Sender<Work>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Work>();
        let rx = std::sync::Arc::new(Mutex::new(rx));
        for i in 0..max_listings() {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tandem-list-{i}"))
                .spawn(move || {
                    // Per thread on Linux: setpriority(PRIO_PROCESS, 0) names the caller.
                    if let Err(e) = rustix::process::setpriority_process(None, LISTING_NICE) {
                        warn!(error = %e, "listing thread keeps its priority");
                    }
                    loop {
                        let next = rx
                            .lock()
                            .map_err(|_| ())
                            .and_then(|r| r.recv().map_err(|_| ()));
                        match next {
                            // A listing that panics answers nothing (its caller gets
                            // INTERNAL) but does not take its thread with it.
                            Ok(work) => {
                                let _ =
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                            }
                            Err(()) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                warn!(error = %e, "cannot start a listing thread");
            }
        }
        Mutex::new(tx)
    })
}

/// Runs `f` over the latest view on the listing pool.
pub async fn on_view<T: Send + 'static>(
    handle: &Handle,
    f: impl FnOnce(&ReadView) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let handle = handle.clone();
    // Loaded when a thread takes the work: a listing that waited still reads the newest view.
    run(move || f(&handle.view())).await
}

/// Runs `f` on the listing pool (a listing's CPU-heavy tail: redaction, encoding).
pub async fn run<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work: Work = Box::new(move || {
        let _ = tx.send(f());
    });
    pool()
        .lock()
        .map_err(|_| Status::internal("listing pool poisoned"))?
        .send(work)
        .map_err(|_| Status::unavailable("controller is shutting down"))?;
    rx.await
        .map_err(|_| Status::internal("listing failed before answering"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_threads_run_at_a_lower_priority() {
        let (tx, rx) = mpsc::channel();
        pool()
            .lock()
            .unwrap()
            .send(Box::new(move || {
                let _ = tx.send(rustix::process::getpriority_process(None));
            }))
            .unwrap();
        let nice = rx.recv().unwrap().unwrap();
        // Root may start anywhere; nobody ends above the listing value unless it began there.
        assert!(nice >= LISTING_NICE, "listing thread nice {nice}");
    }
}
