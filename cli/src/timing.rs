//! `TANDEM_TRACE_TIMING=1`: where one command's time goes, on stderr, one line per phase:
//! `tandem-timing: <phase> +<µs since the previous mark> @<µs since main>`.
//!
//! The phases of a client call are `main` (the process got to `main`; the time before it,
//! exec and dynamic loading, is the wall time measured outside minus the `@` of `main`'s
//! successor), `parsed`, `runtime`, `discovered` (cluster file read), `credential` (identity
//! agent round trip or signing with the key), `connected`, and `done` (RPCs, the
//! controller's commit wait included, and printing). Off, a mark costs one relaxed load.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Option<Instant>> = OnceLock::new();
static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

fn start() -> Option<Instant> {
    *START.get_or_init(|| {
        std::env::var_os("TANDEM_TRACE_TIMING")
            .is_some_and(|v| v != "0" && !v.is_empty())
            .then(Instant::now)
    })
}

/// Records that `phase` has just ended.
pub fn mark(phase: &str) {
    let Some(t0) = start() else {
        return;
    };
    let now = Instant::now();
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let since = last.unwrap_or(t0);
    *last = Some(now);
    eprintln!(
        "tandem-timing: {phase} +{} @{}",
        (now - since).as_micros(),
        (now - t0).as_micros()
    );
}
