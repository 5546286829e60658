//! The trace simulator behind `tandem sim`: replays a Standard Workload Format
//! trace under FCFS, EASY backfilling or Tandem's policy, in simulated time.
//!
//! # Layout
//!
//! ```text
//!   swf.rs     read + parse SWF (.swf / .swf.gz), clean records into SimJobs
//!   replay.rs  discrete-event loop, processor-count machine, FCFS and EASY
//!   tandem.rs  Tandem's policy: drives the core's State (submit, schedule,
//!              job_ended), i.e. Fair Tree + multifactor priority + backfill
//!   report.rs  waits, bounded slowdown, utilization, pass cost
//!   rng.rs     SplitMix64 for window draws
//! ```
//!
//! [`run`] is the entry point. With `windows` set it follows RLScheduler's
//! protocol by default: `K` windows of `L` consecutive jobs, each window's
//! first job drawn uniformly from `[L, n - L - 1)` of the cleaned trace, each
//! replayed from an empty machine, metrics averaged over windows.
//!
//! # Invariants
//!
//! - Deterministic: the same options give the same schedule and metrics
//!   (only the pass timings differ between runs). Simulated time drives every
//!   decision; the wall clock (`Instant`) is read only to report how long the
//!   passes took.
//! - The only I/O is reading the trace file named in the options.

pub mod replay;
pub mod report;
pub mod rng;
pub mod swf;
pub(crate) mod tandem;

use std::path::PathBuf;

use serde::Serialize;

pub use replay::{BackfillRule, Policy, ReplayConfig, Replayed, replay};
pub use report::{Report, WindowReport};
pub use swf::{Cleaning, Estimates, SimJob};

/// Errors from [`run`]. Each names the trace or the option at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read trace {path}")]
    ReadTrace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("trace {path}, line {line}: {reason}")]
    ParseTrace {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("trace {0} has no MaxProcs or MaxNodes header; pass --procs")]
    NoMachineSize(PathBuf),
    #[error("--procs must be at least 1")]
    ZeroProcs,
    #[error(
        "trace {path} has {jobs} usable jobs, too few for windows of {len} (need more than {need})"
    )]
    TraceTooShort {
        path: PathBuf,
        jobs: usize,
        len: usize,
        need: usize,
    },
    #[error("--windows and --window-len must be at least 1")]
    EmptyWindows,
    #[error("scheduling core: {0}")]
    Core(String),
}

/// How a trace is turned into jobs and measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Standard cleaning, requested times as estimates, classic EASY.
    Standard,
    /// RLScheduler's: its loader's cleaning, run times as estimates,
    /// EASY backfilling only of jobs that end before the shadow time.
    RlScheduler,
}

impl Protocol {
    fn cleaning(self) -> Cleaning {
        match self {
            Self::Standard => Cleaning::Standard,
            Self::RlScheduler => Cleaning::RlScheduler,
        }
    }

    fn estimates(self) -> Estimates {
        match self {
            Self::Standard => Estimates::Requested,
            Self::RlScheduler => Estimates::Exact,
        }
    }

    fn backfill(self) -> BackfillRule {
        match self {
            Self::Standard => BackfillRule::Easy,
            Self::RlScheduler => BackfillRule::ShadowOnly,
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "standard" => Ok(Self::Standard),
            "rlscheduler" => Ok(Self::RlScheduler),
            other => Err(format!(
                "unknown protocol {other:?} (expected standard or rlscheduler)"
            )),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Standard => "standard",
            Self::RlScheduler => "rlscheduler",
        })
    }
}

/// Windows to replay instead of the whole trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// `K`: how many windows.
    pub count: usize,
    /// `L`: jobs per window.
    pub len: usize,
    /// `S`: seed of the window draws.
    pub seed: u64,
}

/// Options of `tandem sim`.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// The SWF trace (`.swf` or `.swf.gz`).
    pub trace: PathBuf,
    pub policy: Policy,
    /// Machine size; default: the trace header's `MaxProcs` (or `MaxNodes`).
    pub procs: Option<u64>,
    /// Replay windows instead of the whole trace.
    pub windows: Option<Windows>,
    /// Default: RLScheduler's protocol with windows, standard without.
    pub protocol: Option<Protocol>,
}

impl SimOptions {
    /// Options for a whole-trace replay under `policy`.
    pub fn new(trace: impl Into<PathBuf>, policy: Policy) -> Self {
        Self {
            trace: trace.into(),
            policy,
            procs: None,
            windows: None,
            protocol: None,
        }
    }

    /// The protocol in effect.
    pub fn protocol(&self) -> Protocol {
        self.protocol.unwrap_or(if self.windows.is_some() {
            Protocol::RlScheduler
        } else {
            Protocol::Standard
        })
    }
}

/// Read the trace, replay it, and measure.
pub fn run(opts: &SimOptions) -> Result<Report, SimError> {
    if opts.procs == Some(0) {
        return Err(SimError::ZeroProcs);
    }
    let trace = swf::read(&opts.trace)?;
    let procs = match opts.procs {
        Some(p) => p,
        None => trace
            .header
            .machine_procs()
            .ok_or_else(|| SimError::NoMachineSize(opts.trace.clone()))?,
    };
    let node_cpus = tandem::node_cpus(procs, trace.header.max_nodes);
    run_records(
        &trace.records,
        procs,
        node_cpus,
        opts,
        &opts.trace.display().to_string(),
    )
}

/// [`run`] on records already parsed (tests and benches use it).
pub fn run_records(
    records: &[swf::SwfRecord],
    procs: u64,
    node_cpus: u64,
    opts: &SimOptions,
    trace_name: &str,
) -> Result<Report, SimError> {
    let protocol = opts.protocol();
    let (jobs, dropped) = swf::clean(records, procs, protocol.cleaning(), protocol.estimates());
    let ranges = window_ranges(jobs.len(), opts)?;
    let cfg = ReplayConfig {
        procs,
        policy: opts.policy,
        backfill: protocol.backfill(),
        node_cpus,
    };

    let mut per_window = Vec::with_capacity(ranges.len());
    let mut waits = Vec::new();
    let (mut passes, mut pass_time, mut max_pass) = (0u64, 0.0_f64, 0.0_f64);
    for (start, end) in ranges {
        let slice = &jobs[start..end];
        let done = replay(slice, &cfg)?;
        let (w, mut wt) = report::window(slice, &done.start, procs, start);
        per_window.push(w);
        waits.append(&mut wt);
        passes += done.passes;
        pass_time += done.pass_time.as_secs_f64();
        max_pass = max_pass.max(done.max_pass.as_secs_f64());
    }
    waits.sort_unstable();

    Ok(Report {
        trace: trace_name.to_string(),
        policy: opts.policy.to_string(),
        protocol: protocol.to_string(),
        procs,
        jobs: waits.len(),
        windows: per_window.len(),
        mean_wait_s: report::mean_over(&per_window, |w| w.mean_wait_s),
        p50_wait_s: report::percentile(&waits, 50.0),
        p90_wait_s: report::percentile(&waits, 90.0),
        p99_wait_s: report::percentile(&waits, 99.0),
        max_wait_s: waits.last().copied().unwrap_or(0) as f64,
        mean_bsld: report::mean_over(&per_window, |w| w.mean_bsld),
        utilization: report::mean_over(&per_window, |w| w.utilization),
        utilization_to_last_start: report::mean_over(&per_window, |w| w.utilization_to_last_start),
        recorded_mean_wait_s: report::mean_over_opt(&per_window, |w| w.recorded_mean_wait_s),
        recorded_mean_bsld: report::mean_over_opt(&per_window, |w| w.recorded_mean_bsld),
        passes,
        mean_pass_us: if passes > 0 {
            pass_time * 1e6 / passes as f64
        } else {
            0.0
        },
        max_pass_us: max_pass * 1e6,
        dropped,
        per_window,
    })
}

/// Index ranges of the windows to replay: the whole trace, or RLScheduler's
/// draws (first job uniform in `[L, n - L - 1)`).
fn window_ranges(n: usize, opts: &SimOptions) -> Result<Vec<(usize, usize)>, SimError> {
    let Some(w) = opts.windows else {
        return Ok(vec![(0, n)]);
    };
    if w.count == 0 || w.len == 0 {
        return Err(SimError::EmptyWindows);
    }
    let need = 2 * w.len + 1;
    if n <= need {
        return Err(SimError::TraceTooShort {
            path: opts.trace.clone(),
            jobs: n,
            len: w.len,
            need,
        });
    }
    let mut rng = rng::SplitMix64::new(w.seed);
    Ok((0..w.count)
        .map(|_| {
            let start = rng.range(w.len as u64, (n - w.len - 1) as u64) as usize;
            (start, start + w.len)
        })
        .collect())
}

/// Render a report as `tandem sim` prints it: one JSON object, or text.
pub fn render(report: &Report, json: bool) -> String {
    if json {
        // A report holds only numbers and strings; serialization cannot fail.
        serde_json::to_string(report).unwrap_or_default()
    } else {
        report.to_string()
    }
}

#[cfg(test)]
mod tests;
