//! `kube-sim`: the in-memory Kubernetes API server as a process.
//!
//! `kube-sim --listen 127.0.0.1:PORT --kubeconfig PATH` serves until SIGINT/SIGTERM and
//! writes a kubeconfig for `kube`, `kubectl` and the Python client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tandem_e2e::apiserver::{Config, Server, write_kubeconfig};

/// In-memory Kubernetes API server for tests (not a product).
#[derive(Debug, Parser)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the kubeconfig names the real one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at this server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Events kept per resource type for watches; older versions get 410 Gone.
    #[arg(long, default_value_t = 1000)]
    watch_window: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let url = format!("http://{addr}");
    if let Some(path) = &args.kubeconfig {
        write_kubeconfig(&url, path).with_context(|| format!("writing {}", path.display()))?;
    }
    eprintln!("kube-sim serving on {url}");
    let config = Config {
        listen: addr,
        watch_window: args.watch_window,
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        ..Config::default()
    };
    Server::serve(config, listener, shutdown_signal())
        .await
        .context("serving")?;
    Ok(())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
