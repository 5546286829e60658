//! Metrics of a replay: waits, bounded slowdown, utilization, pass cost.
//!
//! Definitions (per window, then averaged over windows, as RLScheduler does):
//! - wait = start - submit;
//! - bounded slowdown = `max(1, (wait + run) / max(run, tau))`, tau = 10 s;
//! - utilization = processor-seconds used / (processors x span), where span
//!   runs from the first submit to the last *end*;
//! - `utilization_to_last_start`: the same with the span ending at the last
//!   *start*, which is how RLScheduler's code measures it (its simulation stops
//!   when the last job starts). It reads higher: the tail is left out.

use std::fmt;

use serde::Serialize;

use super::swf::{Dropped, SimJob};

/// Bounded-slowdown threshold: jobs shorter than this count as this long.
pub const BSLD_TAU_S: i64 = 10;

/// `max(1, (wait + run) / max(run, tau))`.
pub fn bounded_slowdown(wait: i64, run: i64) -> f64 {
    let denom = run.max(BSLD_TAU_S) as f64;
    ((wait + run) as f64 / denom).max(1.0)
}

/// Metrics of one replayed window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowReport {
    /// Index of the window's first job in the cleaned trace.
    pub start_index: usize,
    /// Trace job number of the window's first job.
    pub first_job: u64,
    pub jobs: usize,
    pub mean_wait_s: f64,
    pub mean_bsld: f64,
    pub utilization: f64,
    pub utilization_to_last_start: f64,
    /// The original scheduler's waits for the same jobs, where recorded.
    pub recorded_mean_wait_s: Option<f64>,
    pub recorded_mean_bsld: Option<f64>,
}

/// Metrics of one window from its jobs and their simulated start times.
/// Returns the report and the waits (for pooled percentiles).
pub fn window(
    jobs: &[SimJob],
    starts: &[i64],
    procs: u64,
    start_index: usize,
) -> (WindowReport, Vec<i64>) {
    let n = jobs.len().max(1) as f64;
    let mut waits = Vec::with_capacity(jobs.len());
    let (mut bsld, mut busy) = (0.0, 0.0);
    let first_submit = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
    let (mut last_end, mut last_start) = (first_submit, first_submit);
    let (mut rec_wait, mut rec_bsld, mut rec_n) = (0.0, 0.0, 0usize);
    for (j, &s) in jobs.iter().zip(starts) {
        let wait = s - j.submit;
        waits.push(wait);
        bsld += bounded_slowdown(wait, j.run);
        busy += (j.run as f64) * (j.procs as f64);
        last_end = last_end.max(s + j.run);
        last_start = last_start.max(s);
        if let Some(w) = j.recorded_wait {
            rec_wait += w as f64;
            rec_bsld += bounded_slowdown(w, j.run);
            rec_n += 1;
        }
    }
    let util = |end: i64| {
        let span = (end - first_submit) as f64 * procs as f64;
        if span > 0.0 { busy / span } else { 0.0 }
    };
    let report = WindowReport {
        start_index,
        first_job: jobs.first().map_or(0, |j| j.id),
        jobs: jobs.len(),
        mean_wait_s: waits.iter().sum::<i64>() as f64 / n,
        mean_bsld: bsld / n,
        utilization: util(last_end),
        utilization_to_last_start: util(last_start),
        recorded_mean_wait_s: (rec_n > 0).then(|| rec_wait / rec_n as f64),
        recorded_mean_bsld: (rec_n > 0).then(|| rec_bsld / rec_n as f64),
    };
    (report, waits)
}

/// The result of `tandem sim`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub trace: String,
    pub policy: String,
    /// `standard` or `rlscheduler` (see [`super::Protocol`]).
    pub protocol: String,
    pub procs: u64,
    /// Jobs replayed (all windows together).
    pub jobs: usize,
    /// Windows replayed (1 for a whole-trace replay).
    pub windows: usize,
    pub mean_wait_s: f64,
    pub p50_wait_s: f64,
    pub p90_wait_s: f64,
    pub p99_wait_s: f64,
    pub max_wait_s: f64,
    pub mean_bsld: f64,
    pub utilization: f64,
    pub utilization_to_last_start: f64,
    pub recorded_mean_wait_s: Option<f64>,
    pub recorded_mean_bsld: Option<f64>,
    /// Scheduling passes with at least one pending job.
    pub passes: u64,
    pub mean_pass_us: f64,
    pub max_pass_us: f64,
    /// Records the cleaning rules dropped from the whole trace.
    pub dropped: Dropped,
    pub per_window: Vec<WindowReport>,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[i64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

/// Average of `f` over windows (RLScheduler reports the mean of per-window
/// means).
pub fn mean_over(windows: &[WindowReport], f: impl Fn(&WindowReport) -> f64) -> f64 {
    if windows.is_empty() {
        return 0.0;
    }
    windows.iter().map(f).sum::<f64>() / windows.len() as f64
}

/// Like [`mean_over`] for optional values: `None` unless every window has one.
pub fn mean_over_opt(
    windows: &[WindowReport],
    f: impl Fn(&WindowReport) -> Option<f64>,
) -> Option<f64> {
    let vals: Option<Vec<f64>> = windows.iter().map(f).collect();
    let vals = vals?;
    (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "trace        {}", self.trace)?;
        writeln!(
            f,
            "policy       {} ({} protocol, {} processors)",
            self.policy, self.protocol, self.procs
        )?;
        writeln!(
            f,
            "jobs         {} in {} window(s)",
            self.jobs, self.windows
        )?;
        writeln!(
            f,
            "wait (s)     mean {:.0}  p50 {:.0}  p90 {:.0}  p99 {:.0}  max {:.0}",
            self.mean_wait_s, self.p50_wait_s, self.p90_wait_s, self.p99_wait_s, self.max_wait_s
        )?;
        writeln!(
            f,
            "bsld         mean {:.2} (tau {BSLD_TAU_S} s)",
            self.mean_bsld
        )?;
        writeln!(
            f,
            "utilization  {:.3} (to last start: {:.3})",
            self.utilization, self.utilization_to_last_start
        )?;
        if let (Some(w), Some(b)) = (self.recorded_mean_wait_s, self.recorded_mean_bsld) {
            writeln!(f, "as recorded  mean wait {w:.0} s, mean bsld {b:.2}")?;
        }
        write!(
            f,
            "passes       {} (mean {:.1} us, max {:.1} us)",
            self.passes, self.mean_pass_us, self.max_pass_us
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_slowdown_bounds_short_jobs() {
        // A 1 s job waiting 9 s: (9 + 1) / max(1, 10) = 1, not 10.
        assert_eq!(bounded_slowdown(9, 1), 1.0);
        assert_eq!(bounded_slowdown(0, 100), 1.0);
        assert_eq!(bounded_slowdown(300, 100), 4.0);
        assert_eq!(bounded_slowdown(40, 5), 4.5);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 99.0), 10.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
