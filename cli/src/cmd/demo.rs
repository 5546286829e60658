//! `tandem demo`: the README's "run the main job". Starts a local cluster in a temporary
//! state dir, submits the example batch scripts through the real `sbatch`, shows `squeue`
//! while they run and `sacct` when they end, prints one output file, and stops the cluster.
//! Exits non-zero if any example job did not complete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::{JobRef, JobState, ListJobRecordsRequest};

use crate::Exit;

/// Run the example workload on a fresh local cluster.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of worker nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// GPUs each node declares.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Directory of the example scripts. Default: examples/batch here or in the source tree.
    #[arg(long)]
    pub examples: Option<PathBuf>,
    /// Give up waiting for the jobs after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Leave the cluster running at the end (stop it with `tandem down --state-dir ...`).
    #[arg(long)]
    pub keep: bool,
}

fn find_examples(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        return Ok(dir);
    }
    let candidates = [
        PathBuf::from("examples/batch"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/batch"),
    ];
    candidates
        .into_iter()
        .find(|d| d.is_dir())
        .context("cannot find examples/batch; run from the repository root or pass --examples")
}

pub async fn run(args: Args) -> Exit {
    let examples = find_examples(args.examples.clone())?;
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(&examples)
        .with_context(|| format!("cannot read {}", examples.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sbatch"))
        .collect();
    scripts.sort();
    if scripts.is_empty() {
        bail!("no *.sbatch scripts in {}", examples.display());
    }
    let scripts: Vec<PathBuf> = scripts
        .into_iter()
        .map(std::path::absolute)
        .collect::<Result<_, _>>()?;

    let base = std::env::temp_dir().join(format!("tandem-demo-{}", std::process::id()));
    let state_dir = base.join("state");
    let work = base.join("work");
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let up = super::up::Args {
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        detect_gpus: false,
        cpus_per_node: Some(8),
        mem_per_node: Some("16G".into()),
        gpu_type: None,
        state_dir: Some(state_dir.clone()),
        listen: "127.0.0.1:0".parse()?,
        no_default_config: true,
        config: None,
        kill_wait: Some("2s".into()),
        unkillable_step_timeout: None,
        heartbeat_interval: None,
        node_timeout: None,
        durability: None,
        admins: Vec::new(),
        timeout: 60,
        insecure_plaintext: false,
    };
    println!(
        "== tandem up --nodes {} --gpus-per-node {} --state-dir {}",
        args.nodes,
        args.gpus_per_node,
        state_dir.display()
    );
    let started = super::up::start(&up).await?;
    // Jobs call scontrol and srun by name, as on a login node: put the links on their PATH.
    let bin = base.join("bin");
    super::links::run(super::links::Args {
        dir: bin.clone(),
        force: true,
    })?;
    let path = match std::env::var_os("PATH") {
        Some(p) => {
            let mut dirs = vec![bin];
            dirs.extend(std::env::split_paths(&p));
            std::env::join_paths(dirs)?
        }
        None => bin.into_os_string(),
    };
    let env = Env {
        cluster_file: started.cluster_file.clone(),
        work: work.clone(),
        path,
    };
    let result = drive(&args, &scripts, &env).await;
    if args.keep {
        println!(
            "== cluster left running: TANDEM_CONFIG={} ; stop with tandem down --state-dir {}",
            started.cluster_file.display(),
            state_dir.display()
        );
    } else {
        println!("== tandem down");
        super::local_cluster::stop(&state_dir, Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}

/// Where the demo's commands run.
struct Env {
    cluster_file: PathBuf,
    work: PathBuf,
    path: std::ffi::OsString,
}

/// Runs a CLI command of this binary against the demo cluster.
fn cli(env: &Env, args: &[&str]) -> anyhow::Result<Output> {
    let exe = std::env::current_exe()?;
    Command::new(exe)
        .args(args)
        .env("TANDEM_CONFIG", &env.cluster_file)
        .env("PATH", &env.path)
        .current_dir(&env.work)
        .output()
        .with_context(|| format!("cannot run tandem {}", args.join(" ")))
}

fn show(out: &Output) {
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
}

async fn drive(args: &Args, scripts: &[PathBuf], env: &Env) -> Exit {
    let (cluster_file, work) = (env.cluster_file.as_path(), env.work.as_path());
    let mut ids = Vec::new();
    for s in scripts {
        let path = s.to_string_lossy();
        println!(
            "== sbatch {}",
            s.file_name().map_or(path.clone(), |n| n.to_string_lossy())
        );
        let out = cli(env, &["sbatch", &path])?;
        show(&out);
        if !out.status.success() {
            bail!("sbatch {} failed", s.display());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let id: u64 = text
            .split_whitespace()
            .last()
            .and_then(|w| w.parse().ok())
            .with_context(|| format!("unexpected sbatch output {text:?}"))?;
        ids.push(id);
    }
    let id_list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");

    let ep = tandem_net::endpoint::ClusterFile::read(cluster_file)?;
    let key = tandem_net::auth::ClusterKey::load(&ep.key_file)?;
    let security = tandem_net::endpoint::security_for(&ep.controller, ep.ca_file.as_deref())?;
    let channel = tandem_net::endpoint::connect_as(
        &ep.controller,
        &security,
        &key,
        &crate::client::current_identity(),
    )
    .await?;
    let mut acct = AccountingClient::new(channel);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let records = loop {
        let out = cli(env, &["squeue", "-j", &id_list])?;
        println!("== squeue");
        show(&out);
        let resp = acct
            .list_job_records(ListJobRecordsRequest {
                jobs: ids
                    .iter()
                    .map(|id| JobRef {
                        job_id: *id,
                        array_tasks: String::new(),
                    })
                    .collect(),
                include_active: true,
                ..ListJobRecordsRequest::default()
            })
            .await
            .map_err(crate::client::status_error)?
            .into_inner();
        let active = resp.jobs.iter().any(|j| {
            matches!(
                j.state(),
                JobState::Pending | JobState::Running | JobState::Completing
            ) || !j.array_pending.is_empty()
        });
        if !active && !resp.jobs.is_empty() {
            break resp.jobs;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the example jobs did not finish within {}s", args.timeout);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    println!("== sacct -j {id_list}");
    show(&cli(
        env,
        &[
            "sacct",
            "-j",
            &id_list,
            "--format",
            "JobID,JobName%20,State,ExitCode,Elapsed,NodeList%20",
        ],
    )?);
    let mut outputs: Vec<PathBuf> = std::fs::read_dir(work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    outputs.sort();
    // One output file per example (its name up to the first '-').
    let mut shown = Vec::new();
    for f in &outputs {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let prefix = name.split('-').next().unwrap_or_default().to_string();
        if shown.contains(&prefix) {
            continue;
        }
        shown.push(prefix);
        println!("== cat {}", f.display());
        print!("{}", std::fs::read_to_string(f).unwrap_or_default());
    }
    let failed: Vec<String> = records
        .iter()
        .filter(|j| j.state() != JobState::Completed)
        .map(|j| {
            let v = crate::format::view::JobView::from_job(j, 0);
            format!("{} {}", v.job_id, v.state)
        })
        .collect();
    if !failed.is_empty() {
        bail!("example jobs did not complete: {}", failed.join(", "));
    }
    println!("== all {} example jobs COMPLETED", records.len());
    Ok(0)
}
