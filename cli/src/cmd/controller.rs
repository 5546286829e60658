//! `tandem controller`: the batch controller daemon.

use anyhow::Context as _;

use crate::Exit;

/// The controller's own flags (`tandem_controller::config::Args`).
pub type Args = tandem_controller::config::Args;

pub async fn run(args: Args) -> Exit {
    crate::init_tracing();
    let listen = args.listen;
    let config = args.into_config()?;
    let listener = tandem_net::net::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(addr = %listener.local_addr().map_or(listen, |a| a), "controller listening");
    tandem_controller::run(config, listener, crate::shutdown_signal()).await?;
    Ok(0)
}
