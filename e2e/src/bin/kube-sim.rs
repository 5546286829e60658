//! `kube-sim`: the in-memory Kubernetes API server as a process, optionally with the
//! process kubelet serving declared nodes, the stand-in default scheduler and the service
//! proxy, so the whole harness can be tried by hand with kubectl or any client.
//!
//! `kube-sim --listen 127.0.0.1:0 --kubeconfig FILE --node NAME:cpu=64,memory=256Gi,nvidia.com/gpu=8
//! --image REF=DIR` serves until SIGINT/SIGTERM, then ends every pod's processes and exits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tandem_e2e::apiserver::{Config, Server};
use tandem_e2e::kubelet::{Image, ImageTable, Kubelet, KubeletConfig, NodeSpec};
use tandem_e2e::proxy::ServiceProxy;
use tandem_e2e::scheduler::Scheduler;

/// In-memory Kubernetes API server and process kubelet for tests (not a product).
#[derive(Debug, Parser)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the kubeconfig names the real one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at this server (its path is printed).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A node the process kubelet serves: `NAME:cpu=64,memory=256Gi,nvidia.com/gpu=8`
    /// (repeatable; resources default to cpu=4, memory=8Gi, no GPUs). With at least one,
    /// the stand-in default scheduler and the service proxy run too.
    #[arg(long = "node", value_parser = parse_node)]
    nodes: Vec<NodeSpec>,
    /// An image: `REF=DIR` (repeatable). Every executable in DIR is in the image under its
    /// file name; if DIR holds `tandem`, the CLI names (`sbatch`, `squeue`, ...) are names
    /// of it, as in Tandem's image. `busybox`, `alpine`, ... are the host's tools.
    #[arg(long = "image", value_parser = parse_image)]
    images: Vec<(String, PathBuf)>,
    /// Where pod sandboxes, volumes and logs go (default: a temporary directory).
    #[arg(long)]
    kubelet_root: Option<PathBuf>,
    /// Events kept per resource type for watches; older versions get 410 Gone.
    #[arg(long, default_value_t = 1000)]
    watch_window: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_seconds: u64,
}

fn parse_node(s: &str) -> Result<NodeSpec, String> {
    NodeSpec::parse(s)
}

fn parse_image(s: &str) -> Result<(String, PathBuf), String> {
    let (reference, dir) = s
        .split_once('=')
        .filter(|(r, d)| !r.is_empty() && !d.is_empty())
        .ok_or_else(|| format!("{s:?}: expected REF=DIR"))?;
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        return Err(format!("{s:?}: {} is not a directory", dir.display()));
    }
    Ok((reference.to_owned(), dir))
}

/// The image table: the host-tool images plus each `--image`.
fn images(list: &[(String, PathBuf)]) -> ImageTable {
    let mut table = ImageTable::standard(None);
    for (reference, dir) in list {
        let image = if dir.join("tandem").is_file() {
            Image::tandem(dir)
        } else {
            Image::directory(dir)
        };
        table = table.with(reference.clone(), image);
    }
    table
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = Config {
        listen: args.listen,
        watch_window: args.watch_window,
        bookmark_interval: Duration::from_secs(args.bookmark_seconds.max(1)),
        ..Config::default()
    };
    let server = Server::start(config)
        .await
        .with_context(|| format!("serving on {}", args.listen))?;
    let url = server.url();
    eprintln!("kube-sim serving on {url}");
    if let Some(path) = &args.kubeconfig {
        server
            .kubeconfig(path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    let mut local = None;
    if !args.nodes.is_empty() {
        let client = server.client().context("a client for the kubelet")?;
        let mut kc = KubeletConfig::new(images(&args.images));
        kc.root_dir = args.kubelet_root.clone();
        let kubelet = Kubelet::start(client.clone(), kc)
            .await
            .context("starting the process kubelet")?;
        for node in &args.nodes {
            kubelet
                .add_node(node.clone())
                .await
                .with_context(|| format!("declaring node {}", node.name))?;
            eprintln!("kube-sim: node {} ready", node.name);
        }
        local = Some((
            kubelet,
            Scheduler::start(client.clone()),
            ServiceProxy::start(client),
        ));
    }
    shutdown_signal().await;
    eprintln!("kube-sim: stopping");
    if let Some((kubelet, scheduler, proxy)) = local.take() {
        // Every pod's processes end first (SIGKILL to each process group), then the rest.
        kubelet.shutdown();
        drop((scheduler, proxy, kubelet));
    }
    server.shutdown().await;
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
