//! Serving listings from the state actor's published read view, off the actor and off the
//! async workers: each listing runs on the blocking pool, at most [`max_listings`] at once,
//! so a crowd looping `squeue` over a long queue shares those threads and never holds up
//! scheduling, commits, or the tasks that answer everything else.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;
use tonic::Status;

use crate::state::{Handle, ReadView};

/// Listings that may run at once (the rest wait their turn): half the machine's cores, at
/// least one, so listings never take the cores the actor and the committer need.
pub fn max_listings() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

fn permits() -> &'static Arc<Semaphore> {
    static PERMITS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    PERMITS.get_or_init(|| Arc::new(Semaphore::new(max_listings())))
}

/// Runs `f` over the latest view on the blocking pool.
pub async fn on_view<T: Send + 'static>(
    handle: &Handle,
    f: impl FnOnce(&ReadView) -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let _permit = permits()
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Status::unavailable("controller is shutting down"))?;
    // Loaded after the permit: a listing that waited still reads the newest view.
    let view = handle.view();
    tokio::task::spawn_blocking(move || f(&view))
        .await
        .map_err(|e| Status::internal(format!("listing failed: {e}")))?
}
