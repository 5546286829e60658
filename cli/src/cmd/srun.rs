//! `srun`: run a parallel job step.
//!
//! Inside an allocation (`SLURM_JOB_ID` set) it creates a step with `CreateStep`, launches
//! the tasks on each node's worker through `StepLauncher`, streams their output (with
//! `-l`, prefixed by the task id) and exits with the worst task's status. Outside an
//! allocation it submits a job for the command, waits for it to start, and then runs the
//! step inside it, as Slurm's srun does.
//!
//! This file holds the command line, the entry point and the step itself (create it, launch
//! the tasks, stream their output, record the end). The rest lives beside it, by
//! responsibility: `layout.rs` settles `-N`/`-n`/`--ntasks-per-node` as Slurm's srun does,
//! `allocation.rs` makes and releases the job srun runs in outside an allocation,
//! `environment.rs` builds the tasks' environment, `output.rs` tracks the tasks and writes
//! their (labelled) lines.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt as _;
use std::io::Write as _;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::task_output::Event;
use tandem_proto::v1::{CompleteStepRequest, CreateStepRequest, LaunchTasksRequest};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::task_exits::{TaskEnd, failure_lines};
use crate::opts::JobOpts;

mod allocation;
mod environment;
mod layout;
mod output;

use allocation::run_with_allocation;
use environment::{inherited_export, step_environment, step_node_id, target_env, task_umask};
use layout::{refuse_batch_only, resolve_layout};
use output::{Running, label_line, write_labelled};

/// Run a parallel job step.
#[derive(Debug, Parser)]
#[command(name = "srun", version, infer_long_args = true)]
pub struct Args {
    #[command(flatten)]
    pub opts: JobOpts,
    /// Prefix each output line with the task id.
    #[arg(short = 'l', long)]
    pub label: bool,
    /// Run task 0 in a pseudo-terminal. Not built yet: refused from a terminal; with
    /// input that is not a terminal ignored, as Slurm ignores it there.
    #[arg(long)]
    pub pty: bool,
    /// The command and its arguments.
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

pub async fn run(mut args: Args) -> Exit {
    refuse_batch_only(&args.opts)?;
    if args.pty {
        use std::io::IsTerminal as _;
        if std::io::stdin().is_terminal() {
            bail!(
                "--pty: interactive terminals are not supported yet (run the command \
                 without --pty, or use sbatch)"
            );
        }
        // Slurm 22.05's words for the same case.
        eprintln!("srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device");
        eprintln!("srun: error: Not using a pseudo-terminal, disregarding --pty option");
    }
    // Inside an allocation as outside: `srun -N1 -w n1,n2` says Slurm's error line and runs
    // on n1; `srun -n1 -w n1,n2` warns and runs on n1.
    for line in args
        .opts
        .settle_node_count(crate::opts::NodelistOverflow::Eliminate)?
    {
        eprintln!("srun: {line}");
    }
    let mut client = Client::connect().await?;
    // A step needs a credential for the workers: fail here, before anything is created.
    client.worker_access()?;
    let inside = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    match inside {
        Some(job_id) => run_step(&mut client, job_id, &args, Allocation::Inherited).await,
        None => run_with_allocation(&mut client, &args).await,
    }
}

/// Where the step's allocation came from, which decides who sets the job-wide variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocation {
    /// srun runs inside a job (a batch script, salloc): the job's variables are inherited.
    Inherited,
    /// srun made the job itself: nobody else sets them, so srun does, as Slurm's does.
    MadeHere,
}

async fn run_step(client: &mut Client, job_id: u64, args: &Args, alloc: Allocation) -> Exit {
    let opts = &args.opts;
    let ctx = crate::cmd::sbatch::submit_context()?;
    let (layout, warnings) = resolve_layout(opts, &ctx.env, alloc);
    for w in &warnings {
        eprintln!("srun: Warning: {w}");
    }
    let step = client
        .jobs
        .create_step(CreateStepRequest {
            job_id,
            name: args.command.first().cloned().unwrap_or_default(),
            nodes: layout.nodes,
            ntasks: layout.ntasks,
            ntasks_per_node: layout.ntasks_per_node,
            cpus_per_task: opts.cpus_per_task.unwrap_or(0),
            gpus_per_task: opts.gpus_per_task.as_ref().map_or(0, |g| g.count),
            nodelist: opts.nodelist.clone().unwrap_or_default(),
            argv: args.command.clone(),
        })
        .await
        .rpc()
        // Slurm's words: `srun: error: Unable to create step for job 7: More processors
        // requested than permitted`.
        .with_context(|| format!("Unable to create step for job {job_id}"))?;
    crate::timing::mark("step-created");
    // Without `--export`, Slurm's srun takes `SLURM_EXPORT_ENV`, which sbatch sets for a
    // job submitted with an `--export` other than ALL: a step inherits the batch script's
    // export mode.
    let export = match (&opts.export, inherited_export(&ctx.env)) {
        (Some(e), _) => e.clone(),
        (None, Some(e)) => e.map_err(|e| anyhow::anyhow!("SLURM_EXPORT_ENV: {e}"))?,
        (None, None) => crate::opts::Export::All(Vec::new()),
    };
    let mut env: HashMap<String, String> = crate::opts::build_environment(&export, &ctx.env)
        .into_iter()
        .collect();
    step_environment(
        &mut env,
        &step,
        alloc,
        (layout.ntasks_per_node > 0).then_some(layout.ntasks_per_node),
    );
    let umask = task_umask(&ctx.env, ctx.umask);
    env.insert("SLURM_UMASK".into(), umask.text);
    let workdir = ctx.cwd.to_string_lossy().into_owned();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u32, Event)>(256);
    let (auth, security) = client.worker_access()?;
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
            node_index: step_node_id(&step.targets, target),
            launch_token: step.launch_token.clone(),
            uid: client.identity().uid,
            gid: client.identity().gid,
            ntasks_total: step.ntasks,
            umask: Some(umask.mask),
        };
        let tx = tx.clone();
        let node = target.node.clone();
        let auth = auth.clone();
        let security = security.clone();
        // Each node is connected to and launched on in its own task: the step starts on all
        // of them after one connection time, not one per node in turn.
        launches.push(tokio::spawn(async move {
            // Dialled at the address the worker advertises (a pod IP on Kubernetes), verified
            // as the node: a worker holding another node's certificate is refused.
            let channel = tandem_net::endpoint::connect_to_node(&address, &node, &security, auth)
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
    let mut running = Running::new(&step.targets);
    let mut ends: BTreeMap<u32, TaskEnd> = BTreeMap::new();
    // Until every task has reported its exit (a worker sends a task's exit after all of its
    // output), or until every stream has ended (a node failed, or a task never reported).
    while !running.all_exited() {
        let Some((task, ev)) = rx.recv().await else {
            break;
        };
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
                ends.insert(
                    task,
                    TaskEnd {
                        exit_code: e.exit_code,
                        signal: e.signal,
                    },
                );
                running.exited(task);
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
    let nodes: Vec<(&str, &[u32])> = step
        .targets
        .iter()
        .map(|t| (t.node.as_str(), t.task_ids.as_slice()))
        .collect();
    for line in failure_lines(&nodes, &ends) {
        writeln!(stderr, "{line}")?;
    }
    stderr.flush()?;
    drop((stdout, stderr));
    crate::timing::mark("tasks-ended");
    let complete = |worst: (i32, i32)| {
        let mut jobs = client.jobs.clone();
        let req = CompleteStepRequest {
            job_id,
            step_id: step.step_id,
            exit_code: worst.0,
            signal: worst.1,
        };
        async move {
            let _ = jobs.complete_step(req).await;
        }
    };
    let drain = async {
        // Nothing but stream ends is left to come; draining keeps the streams' senders from
        // blocking until the workers close them.
        while rx.recv().await.is_some() {}
        let mut launch_error = None;
        for l in launches {
            if let Err(e) = l.await.map_err(anyhow::Error::from).and_then(|r| r) {
                launch_error = Some(e);
            }
        }
        launch_error
    };
    let launch_error = if running.all_exited() {
        // Every task's result is in: the step is over. The controller records its end (a
        // commit) while the workers clean up the step and close their streams, instead of
        // after them. A stream that fails now cannot change any task's result.
        let ((), _late_stream_error) = tokio::join!(complete(worst), drain);
        crate::timing::mark("step-completed");
        None
    } else {
        let launch_error = drain.await;
        // A node that could not run its tasks fails the step even if every task that ran
        // succeeded.
        if launch_error.is_some() && worst == (0, 0) {
            worst.0 = 1;
        }
        complete(worst).await;
        crate::timing::mark("step-completed");
        launch_error
    };
    if let Some(e) = launch_error {
        return Err(e);
    }
    Ok(match worst {
        (0, 0) => 0,
        (code, _) if code > 0 => u8::try_from(code.min(255)).unwrap_or(1),
        (_, sig) => u8::try_from((128 + sig).min(255)).unwrap_or(1),
    })
}
