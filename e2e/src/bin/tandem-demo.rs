//! `tandem-demo`: the README's one command for the whole story. On the in-repo Kubernetes
//! API server with a process kubelet, it installs Tandem (the four Helm charts: CRDs,
//! operator, a cluster, the bridge), runs a researcher's batch jobs and a serving team's
//! inference Deployment on one pool (its worker set scaled up on the pending demand),
//! prints `kubectl get pods -o wide`, `squeue`, `sinfo` with node modes and `sshare` as it
//! goes, and exits non-zero if any of it failed.
//!
//! `cargo run --release -p tandem-e2e --bin tandem-demo`; it builds the `tandem`,
//! `tandem-operator` and `tandem-bridge` binaries it runs first (cargo does nothing when
//! they are current), so a binary left from an older checkout is never run against the new
//! charts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use tandem_e2e::story::{self, Bins};
use tandem_e2e::testkit::TestCluster;

/// Batch jobs and an inference Deployment sharing one GPU pool, through the operator and
/// the bridge, on the in-repo Kubernetes harness.
#[derive(Parser)]
#[command(name = "tandem-demo", version)]
struct Args {
    /// Never build: run the binaries beside this one as they are (fail if one is missing).
    #[arg(long)]
    no_build: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    if std::env::var_os("KUBECONFIG").is_some() {
        bail!(
            "KUBECONFIG is set: this demo runs on the in-repo harness (unset it); on a real cluster \
             follow the README's Kubernetes quick start, or run `cargo test -p tandem-e2e --test story`"
        );
    }
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "this demo needs root: the harness's process kubelet gives each pod container its own \
             mount namespace (unshare/nsenter) for its volumes. Run it as root (or in a container), \
             or run `tandem demo` for the batch side alone"
        );
    }
    let exe = std::env::current_exe().context("finding this binary")?;
    let dir = exe.parent().context("this binary has no directory")?;
    let bins = Bins::in_dir(dir);
    if !args.no_build {
        build(dir)?;
    }
    let missing = bins.missing();
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|p| p.display().to_string()).collect();
        bail!("missing: {}", names.join(", "));
    }
    let cluster = TestCluster::start()
        .await
        .context("starting the in-repo API server and the process kubelet")?;
    let outcome = story::run(&cluster, &bins).await?;
    println!(
        "\n== done in {:.0}s: inference on {}; all-reduce across {}; {} array tasks; workers {} -> {} on pending demand; {} back to batch; usage {:?}",
        outcome.elapsed.as_secs_f64(),
        outcome.inference_nodes.join(","),
        outcome.allreduce_nodes.join(","),
        outcome.array_tasks,
        outcome.scaled.0,
        outcome.scaled.1,
        outcome.flipped.join(","),
        outcome.usage,
    );
    Ok(())
}

/// Builds the binaries into `dir` (`target/<profile>`) with cargo, saying so.
fn build(dir: &Path) -> anyhow::Result<()> {
    let release = dir.file_name().is_some_and(|n| n == "release");
    let mut argv = vec!["build"];
    if release {
        argv.push("--release");
    }
    argv.extend([
        "--bins",
        "-p",
        "tandem-cli",
        "-p",
        "tandem-operator",
        "-p",
        "tandem-bridge",
    ]);
    println!("== building what the demo runs: cargo {}", argv.join(" "));
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = std::process::Command::new(cargo)
        .args(&argv)
        .current_dir(&workspace)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed", argv.join(" "));
    }
    Ok(())
}
