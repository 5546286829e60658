//! Serving listings from the state actor's published read view, off the actor and off the
//! async workers: each listing runs on a pool of its own, at most [`max_listings`] at once
//! and at the lowest CPU priority (`SCHED_IDLE`, see [`crate::idle`]), so a crowd looping
//! `squeue` over a long queue shares those threads and, when the cores are busy, yields them
//! at once to scheduling, commits and the tasks that answer everything else. Over time they
//! spend from a CPU budget ([`super::budget`], `--listing-cpu-share`), so a crowd that
//! never stops cannot take the whole machine either.

use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use tonic::Status;
use tracing::warn;

use super::budget::CpuBudget;
use crate::config::DEFAULT_LISTING_CPU_SHARE;
use crate::state::{Handle, ReadView};

/// CPU time listings may spend at once before the share applies: about a dozen `squeue`
/// over 100,000 jobs back to back.
pub const CPU_BURST: Duration = Duration::from_secs(2);

/// The listing threads' shared allowance; `None` until [`limit_cpu`] (then
/// [`DEFAULT_LISTING_CPU_SHARE`]).
static BUDGET: Mutex<Option<CpuBudget>> = Mutex::new(None);

/// Sets the listings' CPU allowance to `share` of the machine's cores (0 < share <= 1),
/// starting full. Process-wide, like the pool.
pub fn limit_cpu(share: f64) {
    if let Ok(mut b) = BUDGET.lock() {
        *b = Some(full_budget(share));
    }
}

fn full_budget(share: f64) -> CpuBudget {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    CpuBudget::new(share * cores, CPU_BURST, Instant::now())
}

/// Waits until the budget allows another listing.
fn wait_for_budget() {
    loop {
        let wait = match BUDGET.lock() {
            Ok(mut b) => b
                .get_or_insert_with(|| full_budget(DEFAULT_LISTING_CPU_SHARE))
                .wait(Instant::now()),
            // A poisoned budget limits nothing rather than stopping every listing.
            Err(_) => Duration::ZERO,
        };
        if wait.is_zero() {
            return;
        }
        std::thread::sleep(wait);
    }
}

fn charge_budget(used: Duration) {
    if let Ok(mut b) = BUDGET.lock()
        && let Some(b) = b.as_mut()
    {
        b.charge(used, Instant::now());
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

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
                    // A listing gets next to nothing of a core the actor or the committer
                    // also wants, and all of an idle one (`benches/squeue_load.rs` measures
                    // what a squeue crowd still costs; docs/benchmarks.md).
                    if let Err(e) = crate::idle::lower_this_thread() {
                        warn!(error = %e, "listing thread keeps a higher priority");
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
                                wait_for_budget();
                                let cpu = thread_cpu();
                                let _ =
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                                charge_budget(thread_cpu().saturating_sub(cpu));
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
    fn listing_threads_run_at_the_lowest_priority() {
        let (tx, rx) = mpsc::channel();
        pool()
            .lock()
            .unwrap()
            .send(Box::new(move || {
                let _ = tx.send(crate::idle::this_thread_is_idle());
            }))
            .unwrap();
        assert!(rx.recv().unwrap(), "listing thread not under SCHED_IDLE");
    }
}
