//! The `tandem-slurm` binary: the Slurm commands and the job launcher without the daemons
//! (see `tandem_cli::slurm_main_from_env`).
fn main() -> std::process::ExitCode {
    tandem_cli::slurm_main_from_env()
}
