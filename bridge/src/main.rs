//! `tandem-bridge`: the Tandem controller as a Kubernetes scheduler.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tandem_bridge::batch::GrpcBatch;
use tandem_bridge::scheduler::{self, Config};
use tandem_proto::auth::ClusterKey;

#[derive(Parser)]
#[command(name = "tandem-bridge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Schedule pods that name `schedulerName: tandem` through the controller's queue.
    Run(RunArgs),
}

#[derive(Parser)]
struct RunArgs {
    /// The controller's address (`http://HOST:PORT`).
    #[arg(long)]
    controller: String,
    /// The cluster key, mounted from its Secret; signs the bridge's role credential.
    #[arg(long)]
    key_file: PathBuf,
    /// The cluster CA the controller's certificate chains to. Without it the bridge speaks
    /// plain text, and only to a loopback address.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// The `TandemCluster` whose namespace map (spec.bridge.namespaces) applies.
    #[arg(long)]
    cluster: String,
    /// Its namespace.
    #[arg(long, default_value = "default")]
    cluster_namespace: String,
    /// Seconds a pod whose node vanished keeps its slot before it counts as gone.
    #[arg(long, default_value_t = 30)]
    node_grace_seconds: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(a) => run(a).await,
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    let key = ClusterKey::load(&a.key_file)
        .with_context(|| format!("reading the cluster key {}", a.key_file.display()))?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let batch = GrpcBatch::connect(&a.controller, a.ca_file.as_deref(), &key).await?;
    let cfg = Config {
        cluster_namespace: a.cluster_namespace,
        cluster_name: a.cluster,
        node_grace_s: i64::from(a.node_grace_seconds),
    };
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    scheduler::run(client, batch, cfg, shutdown).await?;
    Ok(())
}
