//! `tandem links DIR`: install the Slurm command names as symlinks to this binary.

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::{Exit, SLURM_COMMANDS};

/// Create sbatch, squeue, scancel, sinfo, sacct, scontrol, srun, sacctmgr, sshare and sprio
/// links in DIR.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory for the links (created if missing), e.g. ~/.local/bin.
    pub dir: PathBuf,
    /// Replace existing files of those names.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> Exit {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
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
