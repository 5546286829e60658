//! `tandem sim`: replay a workload trace (Standard Workload Format) through the scheduling
//! core with simulated time, and print utilization, waits and bounded slowdown.
//!
//! Everything happens in `tandem_sched::sim`; this module only maps flags to its options.

use std::path::PathBuf;

use anyhow::Context as _;
use tandem_sched::sim::{self, Policy, Protocol, SimOptions, Windows};

use crate::Exit;

/// Replay an SWF trace (`.swf` or `.swf.gz`) under a scheduling policy.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The trace file.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// fcfs (strict order), easy (FCFS with EASY backfilling) or tandem (the full policy:
    /// multifactor priority with Fair Tree over the trace's users and groups, and backfill).
    #[arg(long, default_value = "tandem", value_parser = parse_policy)]
    pub policy: Policy,
    /// Processors of the simulated machine. Default: the trace header's MaxProcs.
    #[arg(long)]
    pub procs: Option<u64>,
    /// Replay K windows of consecutive jobs, each from an empty machine, instead of the whole trace.
    #[arg(long, value_name = "K")]
    pub windows: Option<usize>,
    /// Jobs per window.
    #[arg(long, value_name = "L", default_value_t = 1024, requires = "windows")]
    pub window_len: usize,
    /// Seed of the window draws.
    #[arg(long, value_name = "S", default_value_t = 0, requires = "windows")]
    pub seed: u64,
    /// standard (requested times as estimates) or rlscheduler (RLScheduler's protocol:
    /// estimates equal run times). Default: rlscheduler with --windows, else standard.
    #[arg(long, value_parser = parse_protocol)]
    pub protocol: Option<Protocol>,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse()
}

fn parse_protocol(s: &str) -> Result<Protocol, String> {
    s.parse()
}

pub fn run(args: Args) -> Exit {
    let mut opts = SimOptions::new(args.trace.clone(), args.policy);
    opts.procs = args.procs;
    opts.windows = args.windows.map(|count| Windows {
        count,
        len: args.window_len,
        seed: args.seed,
    });
    if let Some(p) = args.protocol {
        opts.protocol = Some(p);
    }
    let report = sim::run(&opts).with_context(|| format!("replaying {}", args.trace.display()))?;
    let text = sim::render(&report, args.json);
    println!("{}", text.trim_end_matches('\n'));
    Ok(0)
}
