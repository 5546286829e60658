//! `tandem links DIR`: install the Slurm command names as symlinks to `tandem-slurm` beside
//! this binary (the same commands without the daemons, quicker to start), or to this binary
//! where there is none.

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::{Exit, SLURM_COMMANDS};

/// Create sbatch, squeue, scancel, sinfo, sacct, scontrol, srun, sacctmgr, sshare and sprio
/// links in DIR, to tandem-slurm beside this binary (or to this binary without it).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory for the links (created if missing), e.g. ~/.local/bin.
    pub dir: PathBuf,
    /// Replace existing files of those names.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> Exit {
    let this = std::env::current_exe().context("cannot find this binary's path")?;
    let slim = this.with_file_name(tandem_worker::launch::exec::SLIM_BINARY);
    let exe = if slim.is_file() { slim } else { this };
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    for name in SLURM_COMMANDS {
        let link = args.dir.join(name);
        if link.symlink_metadata().is_ok() {
            if !args.force {
                bail!("{} exists (use --force to replace it)", link.display());
            }
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot remove {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&exe, &link)
            .with_context(|| format!("cannot create {}", link.display()))?;
    }
    println!(
        "linked {} in {} to {}",
        SLURM_COMMANDS.join(", "),
        args.dir.display(),
        exe.display()
    );
    Ok(0)
}
