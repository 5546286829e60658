//! `tandem-operator`: `crds` prints the CRDs, `rbac` the RBAC rules, `run` runs the
//! reconcilers against the cluster from the kubeconfig or the in-cluster config.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tandem-operator",
    version,
    about = "Runs Tandem clusters on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the CustomResourceDefinitions as YAML (what `charts/tandem-crds` carries).
    Crds {
        /// Write one file per CRD into this directory instead (`charts/tandem-crds/crds`).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
    },
    /// Print the operator's RBAC rules as YAML (what `charts/tandem-operator/files/rbac.yaml`
    /// holds): exactly the API calls it makes, cluster-scoped and namespaced apart.
    Rbac,
    /// Run the reconcilers.
    Run(tandem_operator::reconcile::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Crds { out_dir: None } => tandem_operator::crd::all_yaml()
            .map(|y| print!("{y}"))
            .map_err(anyhow::Error::from),
        Cmd::Crds { out_dir: Some(dir) } => write_crds(&dir),
        Cmd::Rbac => tandem_operator::rbac::rules_yaml()
            .map(|y| print!("{y}"))
            .map_err(anyhow::Error::from),
        Cmd::Run(args) => run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tandem-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn write_crds(dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for crd in tandem_operator::crd::all() {
        let path = dir.join(tandem_operator::crd::file_name(&crd));
        std::fs::write(&path, tandem_operator::crd::to_yaml(&crd)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}

fn run(args: tandem_operator::reconcile::Args) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        // SIGTERM (pod deletion) or Ctrl-C.
        let shutdown = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        };
        tandem_operator::reconcile::run(args, shutdown).await
    })
}
