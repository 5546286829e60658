//! stub
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}
pub async fn run(
    _args: Args,
    _shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    Ok(())
}
