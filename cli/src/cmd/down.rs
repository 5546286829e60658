//! `tandem down`: stop the cluster `tandem up` started.
//!
//! Workers stop first, so they can report the jobs they end to a controller that is still
//! there; then the controller. Each gets SIGTERM, some time, then SIGKILL.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use super::local_cluster::{default_state_dir, stop};
use crate::Exit;

/// Stop the local cluster.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The state dir given to `tandem up`. Default: ~/.tandem/local.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Seconds to wait after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 10)]
    pub grace: u64,
}

pub fn run(args: Args) -> Exit {
    let dir = match &args.state_dir {
        Some(d) => std::path::absolute(d).context("invalid --state-dir")?,
        None => default_state_dir()?,
    };
    let stopped = stop(&dir, Duration::from_secs(args.grace));
    if stopped == 0 {
        println!("tandem: no cluster running in {}", dir.display());
    } else {
        println!("tandem: stopped {stopped} processes in {}", dir.display());
    }
    Ok(0)
}
