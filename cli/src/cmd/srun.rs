//! `srun`: run a parallel job step.
//!
//! Inside an allocation (`SLURM_JOB_ID` set) it creates a step with `CreateStep`, launches
//! the tasks on each node's worker through `StepLauncher`, streams their output (with
//! `-l`, prefixed by the task id) and exits with the worst task's status. Outside an
//! allocation it submits a job for the command, waits for it to start, and then runs the
//! step inside it, as Slurm's srun does.

use std::collections::HashMap;

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt as _;
use std::io::Write as _;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::task_output::Event;
use tandem_proto::v1::{
    CancelRequest, CompleteStepRequest, CreateStepRequest, JobRef, JobState, LaunchTasksRequest,
    ListJobsRequest, StepTarget, SubmitRequest,
};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::opts::JobOpts;

/// Run a parallel job step.
#[derive(Debug, Parser)]
#[command(name = "srun", infer_long_args = true)]
pub struct Args {
    #[command(flatten)]
    pub opts: JobOpts,
    /// Prefix each output line with the task id.
    #[arg(short = 'l', long)]
    pub label: bool,
    /// The command and its arguments.
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

pub async fn run(args: Args) -> Exit {
    refuse_batch_only(&args.opts)?;
    let mut client = Client::connect().await?;
    let inside = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    match inside {
        Some(job_id) => run_step(&mut client, job_id, &args).await,
        None => run_with_allocation(&mut client, &args).await,
    }
}

/// Options srun shares with sbatch through [`JobOpts`] but does not carry out for a step
/// (Slurm's srun gives `-i`, `--signal` and `--open-mode` per-task meanings Tandem's steps do
/// not have yet): refused before any RPC rather than silently ignored.
fn refuse_batch_only(opts: &JobOpts) -> anyhow::Result<()> {
    let given = [
        ("--signal", opts.signal.is_some()),
        ("--open-mode", opts.open_mode.is_some()),
        ("--input", opts.input.is_some()),
    ];
    if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
        bail!("{name} is not supported by srun (it applies to sbatch batch jobs)");
    }
    Ok(())
}

/// The batch script of an allocation made by srun: it holds the nodes until srun signals
/// it, then ends COMPLETED (USR1: the step succeeded) or FAILED (USR2: it did not), so sacct
/// tells the two apart as Slurm's does.
const HOLDER_SCRIPT: &str = "#!/bin/sh\n\
# Holds the allocation for srun's step; srun signals the end.\n\
trap 'kill $! 2>/dev/null; exit 0' USR1\n\
trap 'kill $! 2>/dev/null; exit 1' USR2\n\
while :; do sleep 3600 & wait $!; done\n";

/// Outside an allocation: a job whose batch script holds the allocation while the step
/// runs, ended through a signal when the step is over.
async fn run_with_allocation(client: &mut Client, args: &Args) -> Exit {
    let ctx = crate::cmd::sbatch::submit_context()?;
    let name = args
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
        .unwrap_or_else(|| "srun".to_string());
    let spec = args
        .opts
        .to_spec(HOLDER_SCRIPT.to_string(), Vec::new(), &name, &ctx)?;
    let resp = client
        .jobs
        .submit(SubmitRequest { spec: Some(spec) })
        .await
        .rpc()?;
    let job_id = resp.job_id;
    let result = async {
        if wait_running(client, job_id).await? {
            eprintln!("srun: job {job_id} has been allocated resources");
        }
        run_step(client, job_id, args).await
    }
    .await;
    release_allocation(client, job_id, matches!(result, Ok(0))).await;
    result
}

/// Ends the holder job: a signal to its script, then a plain cancel if it lingers.
async fn release_allocation(client: &mut Client, job_id: u64, success: bool) {
    let job = || JobRef {
        job_id,
        array_tasks: String::new(),
    };
    let signal = if success {
        nix::sys::signal::Signal::SIGUSR1
    } else {
        nix::sys::signal::Signal::SIGUSR2
    };
    let _ = client
        .jobs
        .cancel(CancelRequest {
            jobs: vec![job()],
            signal: signal as i32,
            batch_only: true,
            ..CancelRequest::default()
        })
        .await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        let done = client
            .jobs
            .list_jobs(ListJobsRequest {
                jobs: vec![job()],
                include_finished: true,
                ..ListJobsRequest::default()
            })
            .await
            .map(|r| {
                r.into_inner()
                    .jobs
                    .first()
                    .is_none_or(|j| !matches!(j.state(), JobState::Pending | JobState::Running))
            })
            .unwrap_or(false);
        if done {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = client
        .jobs
        .cancel(CancelRequest {
            jobs: vec![job()],
            ..CancelRequest::default()
        })
        .await;
}

/// Waits until the job runs; true if it had to wait (so srun says when it got its nodes).
async fn wait_running(client: &mut Client, job_id: u64) -> anyhow::Result<bool> {
    let mut said = false;
    loop {
        let resp = client
            .jobs
            .list_jobs(ListJobsRequest {
                jobs: vec![JobRef {
                    job_id,
                    array_tasks: String::new(),
                }],
                include_finished: true,
                ..ListJobsRequest::default()
            })
            .await
            .rpc()?;
        let Some(job) = resp.jobs.first() else {
            bail!("job {job_id} vanished");
        };
        match job.state() {
            JobState::Running => return Ok(said),
            JobState::Pending => {
                if !said {
                    eprintln!("srun: job {job_id} queued and waiting for resources");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => bail!(
                "job {job_id} ended before it started: {}",
                crate::format::view::state_name(other)
            ),
        }
    }
}

async fn run_step(client: &mut Client, job_id: u64, args: &Args) -> Exit {
    let opts = &args.opts;
    let step = client
        .jobs
        .create_step(CreateStepRequest {
            job_id,
            name: args.command.first().cloned().unwrap_or_default(),
            nodes: opts.nodes.map_or(0, |n| n.min),
            ntasks: opts.ntasks.unwrap_or(0),
            ntasks_per_node: opts.ntasks_per_node.unwrap_or(0),
            cpus_per_task: opts.cpus_per_task.unwrap_or(0),
            gpus_per_task: opts.gpus_per_task.as_ref().map_or(0, |g| g.count),
            nodelist: opts.nodelist.clone().unwrap_or_default(),
            argv: args.command.clone(),
        })
        .await
        .rpc()
        .context("cannot create the step")?;
    crate::timing::mark("step-created");
    let ctx = crate::cmd::sbatch::submit_context()?;
    let export = opts
        .export
        .clone()
        .unwrap_or(crate::opts::Export::All(Vec::new()));
    let mut env: HashMap<String, String> = crate::opts::build_environment(&export, &ctx.env)
        .into_iter()
        .collect();
    env.insert("SLURM_STEP_ID".into(), step.step_id.to_string());
    env.insert("SLURM_STEPID".into(), step.step_id.to_string());
    env.insert("SLURM_STEP_NODELIST".into(), step.nodelist.clone());
    env.insert("SLURM_STEP_NUM_TASKS".into(), step.ntasks.to_string());
    env.insert("SLURM_NTASKS".into(), step.ntasks.to_string());
    env.insert("SLURM_NPROCS".into(), step.ntasks.to_string());
    let workdir = ctx.cwd.to_string_lossy().into_owned();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u32, Event)>(256);
    let mut launches = Vec::new();
    for target in &step.targets {
        let address = if target.address.contains("://") {
            target.address.clone()
        } else {
            format!("http://{}", target.address)
        };
        let req = LaunchTasksRequest {
            job_id,
            step_id: step.step_id,
            argv: args.command.clone(),
            workdir: workdir.clone(),
            environment: target_env(&env, target),
            task_ids: target.task_ids.clone(),
            gpus: target.gpus.clone(),
            node_index: target.node_index,
            launch_token: step.launch_token.clone(),
            uid: client.identity.uid,
            gid: client.identity.gid,
            ntasks_total: step.ntasks,
        };
        let tx = tx.clone();
        let node = target.node.clone();
        let auth = client.auth.clone();
        let security = client.security.clone();
        // Each node is connected to and launched on in its own task: the step starts on all
        // of them after one connection time, not one per node in turn.
        launches.push(tokio::spawn(async move {
            let channel = tandem_proto::endpoint::connect_with(&address, &security, auth)
                .await
                .with_context(|| format!("cannot reach node {node}"))?;
            let mut launcher = StepLauncherClient::new(channel);
            let mut stream = launcher
                .launch_tasks(req)
                .await
                .map_err(|s| anyhow::anyhow!("node {node}: {}", s.message()))?
                .into_inner();
            while let Some(msg) = stream.next().await {
                let msg = msg.map_err(|s| anyhow::anyhow!("node {node}: {}", s.message()))?;
                if let Some(ev) = msg.event
                    && tx.send((msg.task_id, ev)).await.is_err()
                {
                    break;
                }
            }
            anyhow::Ok(())
        }));
    }
    drop(tx);
    crate::timing::mark("launches-started");
    // Blocking writes to the terminal are fine here: this task does nothing else.
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let mut worst: (i32, i32) = (0, 0);
    let mut partial: HashMap<(u32, bool), Vec<u8>> = HashMap::new();
    while let Some((task, ev)) = rx.recv().await {
        match ev {
            Event::Stdout(bytes) => {
                write_labelled(&mut stdout, &mut partial, task, false, &bytes, args.label)?
            }
            Event::Stderr(bytes) => {
                write_labelled(&mut stderr, &mut partial, task, true, &bytes, args.label)?
            }
            Event::Exit(e) => {
                if e.signal != 0 && worst.1 == 0 {
                    worst.1 = e.signal;
                }
                worst.0 = worst.0.max(e.exit_code);
            }
        }
    }
    // Output without a final newline is still shown.
    for ((task, is_err), rest) in partial {
        if !rest.is_empty() {
            let line = label_line(task, &rest, args.label);
            if is_err {
                stderr.write_all(&line)?;
            } else {
                stdout.write_all(&line)?;
            }
        }
    }
    stdout.flush()?;
    stderr.flush()?;
    drop((stdout, stderr));
    crate::timing::mark("tasks-ended");
    let mut launch_error = None;
    for l in launches {
        if let Err(e) = l.await.map_err(anyhow::Error::from).and_then(|r| r) {
            launch_error = Some(e);
        }
    }
    // A node that could not run its tasks fails the step even if every task that ran
    // succeeded.
    if launch_error.is_some() && worst == (0, 0) {
        worst.0 = 1;
    }
    let _ = client
        .jobs
        .complete_step(CompleteStepRequest {
            job_id,
            step_id: step.step_id,
            exit_code: worst.0,
            signal: worst.1,
        })
        .await;
    crate::timing::mark("step-completed");
    if let Some(e) = launch_error {
        return Err(e);
    }
    Ok(match worst {
        (0, 0) => 0,
        (code, _) if code > 0 => u8::try_from(code.min(255)).unwrap_or(1),
        (_, sig) => u8::try_from((128 + sig).min(255)).unwrap_or(1),
    })
}

/// The step environment for one node: `SLURM_CPUS_ON_NODE` is the job's CPUs there, not the
/// batch node's value inherited from the batch script.
fn target_env(env: &HashMap<String, String>, target: &StepTarget) -> HashMap<String, String> {
    let mut env = env.clone();
    if target.cpus > 0 {
        env.insert("SLURM_CPUS_ON_NODE".into(), target.cpus.to_string());
    }
    env
}

fn label_line(task: u32, line: &[u8], label: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + 8);
    if label {
        out.extend_from_slice(format!("{task}: ").as_bytes());
    }
    out.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

/// Writes complete lines (labelled when asked) and keeps a task's unfinished line for later,
/// so labels never land in the middle of a line.
fn write_labelled<W: std::io::Write>(
    out: &mut W,
    partial: &mut HashMap<(u32, bool), Vec<u8>>,
    task: u32,
    is_err: bool,
    bytes: &[u8],
    label: bool,
) -> anyhow::Result<()> {
    let buf = partial.entry((task, is_err)).or_default();
    buf.extend_from_slice(bytes);
    while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = buf.drain(..=pos).collect();
        out.write_all(&label_line(task, &line, label))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_only_options_are_refused_not_ignored() {
        for flag in ["--signal=USR1@30", "--open-mode=append", "--input=in.txt"] {
            let args = Args::try_parse_from(["srun", flag, "true"]).unwrap();
            let err = refuse_batch_only(&args.opts).unwrap_err().to_string();
            assert!(err.contains("not supported by srun"), "{flag}: {err}");
        }
        let plain = Args::try_parse_from(["srun", "-N2", "true"]).unwrap();
        assert!(refuse_batch_only(&plain.opts).is_ok());
    }

    #[test]
    fn each_node_gets_its_own_cpu_count() {
        let env: HashMap<String, String> = [
            ("SLURM_CPUS_ON_NODE".to_owned(), "8".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ]
        .into();
        let target = |cpus| StepTarget {
            node: "n2".into(),
            cpus,
            ..StepTarget::default()
        };
        let got = target_env(&env, &target(3));
        assert_eq!(got["SLURM_CPUS_ON_NODE"], "3", "the job's share on n2");
        assert_eq!(got["PATH"], "/bin");
        // A controller that does not say keeps the inherited value.
        assert_eq!(target_env(&env, &target(0))["SLURM_CPUS_ON_NODE"], "8");
    }
}
