//! `tandem worker`: the node agent daemon.

use crate::Exit;

/// The worker's own flags (`tandem_worker::Args`).
pub type Args = tandem_worker::Args;

pub async fn run(args: Args) -> Exit {
    crate::init_tracing();
    let config = args.into_config()?;
    tandem_worker::run(config, crate::shutdown_signal()).await?;
    Ok(0)
}
