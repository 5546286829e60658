//! `srun`: run a parallel job step.
//!
//! Inside an allocation (`SLURM_JOB_ID` set) it creates a step with `CreateStep`, launches
//! the tasks on each node's worker through `StepLauncher`, streams their output (with
//! `-l`, prefixed by the task id) and exits with the worst task's status. Outside an
//! allocation it submits a job for the command, waits for it to start, and then runs the
//! step inside it, as Slurm's srun does.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt as _;
use std::io::Write as _;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::task_output::Event;
use tandem_proto::v1::{
    CancelRequest, CompleteStepRequest, CreateStepRequest, CreateStepResponse, JobRef, JobState,
    LaunchTasksRequest, ListJobsRequest, StepTarget, SubmitRequest,
};

use tandem_controller::launch::compress_counts;

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::task_exits::{TaskEnd, failure_lines};
use crate::opts::JobOpts;

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

/// `SLURM_EXPORT_ENV` of the environment srun runs in, parsed as `--export`.
fn inherited_export(env: &[(String, String)]) -> Option<Result<crate::opts::Export, String>> {
    env.iter()
        .rev()
        .find(|(k, _)| k == "SLURM_EXPORT_ENV")
        .map(|(_, v)| crate::opts::parse_export(v))
}

/// The step's `-N`, `-n` and `--ntasks-per-node` as Slurm's srun settles them; 0 = not
/// given (the controller's defaults apply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Layout {
    nodes: u32,
    ntasks: u32,
    /// `--ntasks-per-node` when honoured: srun drops it when `-n` does not match it.
    ntasks_per_node: u32,
}

/// Settles the step's layout options as Slurm 22.05's srun does, returning its warnings
/// (printed as `srun: Warning: ...`). Inside an allocation srun takes `SLURM_NNODES`,
/// `SLURM_NTASKS` (or `SLURM_NPROCS`) and `SLURM_NTASKS_PER_NODE` from its environment as
/// `-N`, `-n` and `--ntasks-per-node` when they are not on the command line. Then:
/// fewer tasks than nodes lowers the node count to the task count (`can't run 1 processes
/// on 2 nodes`); `--ntasks-per-node` without a task count gives that many tasks per node,
/// and with one that does not match it is ignored (with a warning only when there are more
/// tasks than nodes). Observed in a `-N2 --ntasks-per-node=2` job: `srun -n3` warns and runs
/// `2,1`; `srun -N1` warns (4 tasks, 1 node) and is refused; `srun -n2` runs `1(x2)`
/// silently; in a `-N2` job `srun -w n1` runs on both nodes.
fn resolve_layout(
    opts: &JobOpts,
    env: &[(String, String)],
    alloc: Allocation,
) -> (Layout, Vec<String>) {
    let inherited = |var: &str| {
        if alloc != Allocation::Inherited {
            return None;
        }
        env.iter()
            .find(|(k, _)| k == var)
            .and_then(|(_, v)| v.trim().parse::<u32>().ok())
            .filter(|n| *n > 0)
    };
    let mut nodes = opts
        .nodes
        .map(|n| n.min)
        .or_else(|| inherited("SLURM_NNODES"))
        .unwrap_or(0);
    let mut ntasks = opts
        .ntasks
        .or_else(|| inherited("SLURM_NTASKS"))
        .or_else(|| inherited("SLURM_NPROCS"))
        .unwrap_or(0);
    let mut per_node = opts
        .ntasks_per_node
        .or_else(|| inherited("SLURM_NTASKS_PER_NODE"))
        .unwrap_or(0);
    let mut warnings = Vec::new();
    if ntasks > 0 && nodes > ntasks {
        warnings.push(format!(
            "can't run {ntasks} processes on {nodes} nodes, setting nnodes to {ntasks}"
        ));
        nodes = ntasks;
    }
    if per_node > 0 && nodes > 0 {
        let fit = u64::from(per_node) * u64::from(nodes);
        if ntasks == 0 {
            ntasks = u32::try_from(fit).unwrap_or(u32::MAX);
        } else if u64::from(ntasks) != fit {
            if ntasks > nodes {
                warnings.push(format!(
                    "can't honor --ntasks-per-node set to {per_node} which doesn't match the \
                     requested tasks {ntasks} with the number of requested nodes {nodes}. \
                     Ignoring --ntasks-per-node."
                ));
            }
            per_node = 0;
        }
    }
    (
        Layout {
            nodes,
            ntasks,
            ntasks_per_node: per_node,
        },
        warnings,
    )
}

/// Options srun shares with sbatch through [`JobOpts`] but does not carry out for a step
/// (Slurm's srun gives `-i`, `--signal` and `--open-mode` per-task meanings Tandem's steps do
/// not have yet): refused before any RPC rather than silently ignored.
fn refuse_batch_only(opts: &JobOpts) -> anyhow::Result<()> {
    let given = [
        ("--signal", opts.signal.is_some()),
        ("--open-mode", opts.open_mode.is_some()),
        ("--input", opts.input.is_some()),
        ("--test-only", opts.test_only),
    ];
    if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
        bail!("{name} is not supported by srun (it applies to sbatch batch jobs)");
    }
    Ok(())
}

/// The batch script of an allocation made by srun: it holds the nodes until srun signals
/// it, then ends COMPLETED (URG: the step succeeded) or FAILED (WINCH: it did not), so sacct
/// tells the two apart as Slurm's does. Both signals are ignored by default, so one that
/// arrives before the shell has read its `trap` lines is lost rather than fatal (a
/// `USR1` there ended the job FAILED, killed by the signal); srun sends it again until the
/// job is over.
const HOLDER_SCRIPT: &str = "#!/bin/sh\n\
# Holds the allocation for srun's step; srun signals the end.\n\
trap 'kill $! 2>/dev/null; exit 0' URG\n\
trap 'kill $! 2>/dev/null; exit 1' WINCH\n\
while :; do sleep 3600 & wait $!; done\n";

/// How long srun keeps signalling the holder before it cancels the job outright.
const RELEASE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Outside an allocation: a job whose batch script holds the allocation while the step
/// runs, ended through a signal when the step is over.
async fn run_with_allocation(client: &mut Client, args: &Args) -> Exit {
    let ctx = crate::cmd::sbatch::submit_context()?;
    let name = args
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
        .unwrap_or_else(|| "srun".to_string());
    // The job is shaped by the options as srun settles them: `-N2 -n3 --ntasks-per-node=2`
    // asks Slurm for 3 CPUs (`2,1`), not 2 on each node.
    let (layout, _) = resolve_layout(&args.opts, &ctx.env, Allocation::MadeHere);
    let mut opts = args.opts.clone();
    if let Some(range) = opts.nodes.as_mut()
        && layout.nodes > 0
        && layout.nodes < range.min
    {
        range.min = layout.nodes;
        range.max = layout.nodes;
    }
    if layout.ntasks_per_node == 0 {
        opts.ntasks_per_node = None;
    }
    let mut spec = opts.to_spec(HOLDER_SCRIPT.to_string(), Vec::new(), &name, &ctx)?;
    // Slurm shows the program as the job's `Command` (`srun sleep 3`: `sleep`).
    spec.script_path = args.command.first().cloned().unwrap_or_default();
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
        run_step(client, job_id, args, Allocation::MadeHere).await
    }
    .await;
    release_allocation(client, job_id, matches!(result, Ok(0))).await;
    result
}

/// Ends the holder job: a signal to its script, repeated until the job is over (the first
/// can land before the shell has set its traps), then a plain cancel if it lingers.
async fn release_allocation(client: &mut Client, job_id: u64, success: bool) {
    let job = || JobRef {
        job_id,
        array_tasks: String::new(),
    };
    let signal = if success {
        nix::sys::signal::Signal::SIGURG
    } else {
        nix::sys::signal::Signal::SIGWINCH
    };
    let deadline = tokio::time::Instant::now() + RELEASE_DEADLINE;
    let mut pause = std::time::Duration::from_millis(10);
    while tokio::time::Instant::now() < deadline {
        let _ = client
            .jobs
            .cancel(CancelRequest {
                jobs: vec![job()],
                signal: signal as i32,
                batch_only: true,
                ..CancelRequest::default()
            })
            .await;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_millis(200));
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

/// The step's layout variables over the inherited environment, as Slurm 22.05 sets them in
/// every task (see `cli/tests/compat.rs`): the step's own node and task counts replace the
/// job's `SLURM_NNODES`, `SLURM_NTASKS` and `SLURM_TASKS_PER_NODE`. When srun made the job
/// itself, it also sets the job-wide variables a batch script would have had.
fn step_environment(
    env: &mut HashMap<String, String>,
    step: &CreateStepResponse,
    alloc: Allocation,
    ntasks_per_node: Option<u32>,
) {
    let mut targets: Vec<&StepTarget> = step.targets.iter().collect();
    targets.sort_by_key(|t| t.node_index);
    let nnodes = targets.len().to_string();
    let counts: Vec<u32> = targets
        .iter()
        .map(|t| u32::try_from(t.task_ids.len()).unwrap_or(u32::MAX))
        .collect();
    let tasks_per_node = compress_counts(&counts);
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("SLURM_STEP_ID", step.step_id.to_string());
    set("SLURM_STEPID", step.step_id.to_string());
    set("SLURM_STEP_NODELIST", step.nodelist.clone());
    set("SLURM_STEP_NUM_NODES", nnodes.clone());
    set("SLURM_STEP_NUM_TASKS", step.ntasks.to_string());
    set("SLURM_STEP_TASKS_PER_NODE", tasks_per_node.clone());
    set("SLURM_NNODES", nnodes.clone());
    set("SLURM_NTASKS", step.ntasks.to_string());
    set("SLURM_NPROCS", step.ntasks.to_string());
    set("SLURM_TASKS_PER_NODE", tasks_per_node);
    if alloc == Allocation::MadeHere {
        // The job srun made holds exactly the step's nodes.
        set("SLURM_JOB_NODELIST", step.nodelist.clone());
        set("SLURM_NODELIST", step.nodelist.clone());
        set("SLURM_JOB_NUM_NODES", nnodes);
        let cpus: Vec<u32> = targets.iter().map(|t| t.cpus).collect();
        // A controller that does not report CPUs leaves the variable unset, not wrong.
        if !cpus.is_empty() && cpus.iter().all(|c| *c > 0) {
            set("SLURM_JOB_CPUS_PER_NODE", compress_counts(&cpus));
        }
        set("SLURM_NODE_ALIASES", "(null)".to_owned());
    }
    // Slurm's default task distribution, by name: cyclic while each node gets at most one
    // task, block beyond (Slurm 22.05: `srun -n1` cyclic, `srun -n4` on two nodes block).
    let distribution = if step.ntasks as usize <= targets.len() {
        "cyclic"
    } else {
        "block"
    };
    set("SLURM_DISTRIBUTION", distribution.to_owned());
    // A step's tasks also see the job's CPUs under the heterogeneous-job name.
    if let Some(cpus) = env.get("SLURM_JOB_CPUS_PER_NODE").cloned() {
        env.insert("SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0".to_owned(), cpus);
    }
    // Only an honoured `--ntasks-per-node` is set; an ignored one leaves the job's value.
    if let Some(n) =
        ntasks_per_node.filter(|n| u64::from(*n) * targets.len() as u64 == u64::from(step.ntasks))
    {
        env.insert("SLURM_NTASKS_PER_NODE".to_owned(), n.to_string());
    }
}

/// A node's `SLURM_NODEID`: its place among the step's nodes, not the job's (Slurm 22.05 in
/// a `-N2` job: `srun -N1 -w n2` runs with `SLURM_NODEID=0`).
fn step_node_id(targets: &[StepTarget], target: &StepTarget) -> u32 {
    let before = targets
        .iter()
        .filter(|t| t.node_index < target.node_index)
        .count();
    u32::try_from(before).unwrap_or(u32::MAX)
}

/// The tasks of a step that have not reported their exit yet.
#[derive(Debug)]
struct Running {
    tasks: HashSet<u32>,
}

impl Running {
    /// Every task the step's targets launch.
    fn new(targets: &[StepTarget]) -> Self {
        Self {
            tasks: targets
                .iter()
                .flat_map(|t| t.task_ids.iter().copied())
                .collect(),
        }
    }

    fn exited(&mut self, task: u32) {
        self.tasks.remove(&task);
    }

    /// True once every task has exited.
    fn all_exited(&self) -> bool {
        self.tasks.is_empty()
    }
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

/// The tasks' file-creation mask and its `SLURM_UMASK` text: as Slurm's srun, the
/// variable's value when this srun inherited a valid one (a step of a step), else this
/// process's mask in four octal digits.
struct TaskUmask {
    mask: u32,
    text: String,
}

fn task_umask(env: &[(String, String)], own: u32) -> TaskUmask {
    let inherited = env
        .iter()
        .rev()
        .find(|(k, _)| k == "SLURM_UMASK")
        .and_then(|(_, v)| Some((u32::from_str_radix(v, 8).ok()?, v)))
        .filter(|(m, _)| *m <= 0o777);
    match inherited {
        Some((mask, text)) => TaskUmask {
            mask,
            text: text.clone(),
        },
        None => TaskUmask {
            mask: own,
            text: format!("{own:04o}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts the holder script and signals it at once, before the shell can have read its
    /// traps, then again every few milliseconds as `release_allocation` does: the script
    /// must end with the step's verdict, never killed by the signal.
    fn holder_ends_with(signal: nix::sys::signal::Signal) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(HOLDER_SCRIPT)
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        for _ in 0..500 {
            let _ = nix::sys::signal::kill(pid, signal);
            if let Some(status) = child.try_wait().unwrap() {
                assert_eq!(status.signal(), None, "the holder died of {signal}");
                return status;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        panic!("the holder outlived {signal} sent for 2.5 s");
    }

    #[test]
    fn the_holder_takes_its_verdict_even_before_it_set_its_traps() {
        for _ in 0..5 {
            assert_eq!(
                holder_ends_with(nix::sys::signal::Signal::SIGURG).code(),
                Some(0)
            );
            assert_eq!(
                holder_ends_with(nix::sys::signal::Signal::SIGWINCH).code(),
                Some(1)
            );
        }
    }

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
    fn the_step_is_over_when_the_last_task_of_every_node_exits() {
        let target = |node: &str, ids: &[u32]| StepTarget {
            node: node.into(),
            task_ids: ids.to_vec(),
            ..StepTarget::default()
        };
        let mut running = Running::new(&[target("n1", &[0, 1]), target("n2", &[2])]);
        assert!(!running.all_exited());
        running.exited(2);
        running.exited(2);
        running.exited(7);
        assert!(!running.all_exited(), "tasks 0 and 1 on n1 still run");
        running.exited(0);
        assert!(!running.all_exited(), "task 1 still runs");
        running.exited(1);
        assert!(
            running.all_exited(),
            "no need to wait for the streams to end"
        );
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

    fn step(targets: &[(u32, &[u32], u32)], nodelist: &str) -> CreateStepResponse {
        CreateStepResponse {
            job_id: 1,
            step_id: 2,
            nodelist: nodelist.into(),
            ntasks: targets.iter().map(|t| t.1.len() as u32).sum(),
            targets: targets
                .iter()
                .map(|(index, ids, cpus)| StepTarget {
                    node: format!("n{}", index + 1),
                    node_index: *index,
                    task_ids: ids.to_vec(),
                    cpus: *cpus,
                    ..StepTarget::default()
                })
                .collect(),
            ..CreateStepResponse::default()
        }
    }

    fn job_env() -> HashMap<String, String> {
        // What a `sbatch -N2 --ntasks-per-node=2` batch script holds.
        [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x2)"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Slurm 22.05 in a `-N2 --ntasks-per-node=2` job: `srun -n1` gives `SLURM_NNODES=1
    /// SLURM_NTASKS=1 SLURM_TASKS_PER_NODE=1 SLURM_STEP_NUM_NODES=1
    /// SLURM_STEP_TASKS_PER_NODE=1 SLURM_STEP_NODELIST=n1`, the job's `SLURM_NODELIST=n[1-2]`
    /// and `SLURM_JOB_CPUS_PER_NODE=2(x2)` kept; `srun -n3`: `2,1` on both nodes.
    #[test]
    fn a_step_inside_a_job_sets_its_own_layout() {
        let mut env = job_env();
        step_environment(
            &mut env,
            &step(&[(0, &[0], 2)], "n1"),
            Allocation::Inherited,
            None,
        );
        for (k, v) in [
            ("SLURM_NNODES", "1"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_NPROCS", "1"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_STEP_NUM_NODES", "1"),
            ("SLURM_STEP_NUM_TASKS", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "1"),
            ("SLURM_STEP_NODELIST", "n1"),
            ("SLURM_STEP_ID", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x2)"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        let mut env = job_env();
        // Targets out of node order still list the counts in node order.
        let three = step(&[(1, &[2], 2), (0, &[0, 1], 2)], "n[1-2]");
        step_environment(&mut env, &three, Allocation::Inherited, None);
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "2,1");
        assert_eq!(env["SLURM_STEP_TASKS_PER_NODE"], "2,1");
        assert_eq!(env["SLURM_STEP_NUM_NODES"], "2");
        assert_eq!(env["SLURM_NNODES"], "2");
        assert_eq!(env["SLURM_NTASKS"], "3");
    }

    /// Slurm 22.05, `srun -N2 -n3` outside a job: `SLURM_NNODES=2 SLURM_NODELIST=n[1-2]
    /// SLURM_JOB_NODELIST=n[1-2] SLURM_JOB_NUM_NODES=2 SLURM_JOB_CPUS_PER_NODE=2,1
    /// SLURM_TASKS_PER_NODE=2,1 SLURM_STEP_NUM_NODES=2 SLURM_STEP_TASKS_PER_NODE=2,1`, and
    /// `-N2 --ntasks-per-node=2` adds `SLURM_NTASKS_PER_NODE=2`.
    #[test]
    fn a_step_in_its_own_job_sets_the_job_variables_too() {
        let mut env = HashMap::new();
        let s = step(&[(0, &[0, 1], 2), (1, &[2], 1)], "n[1-2]");
        step_environment(&mut env, &s, Allocation::MadeHere, None);
        for (k, v) in [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_JOB_CPUS_PER_NODE", "2,1"),
            ("SLURM_TASKS_PER_NODE", "2,1"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2,1"),
            ("SLURM_NTASKS", "3"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key("SLURM_NTASKS_PER_NODE"));
        let mut env = HashMap::new();
        let s = step(&[(0, &[0, 1], 2), (1, &[2, 3], 2)], "n[1-2]");
        step_environment(&mut env, &s, Allocation::MadeHere, Some(2));
        assert_eq!(env["SLURM_NTASKS_PER_NODE"], "2");
        assert_eq!(env["SLURM_JOB_CPUS_PER_NODE"], "2(x2)");
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "2(x2)");
    }

    #[test]
    fn node_ids_count_the_steps_nodes_only() {
        let target = |node_index| StepTarget {
            node_index,
            ..StepTarget::default()
        };
        let one = [target(1)];
        assert_eq!(step_node_id(&one, &one[0]), 0, "-N1 -w n2 in a -N2 job");
        let three = [target(4), target(0), target(2)];
        let ids: Vec<u32> = three.iter().map(|t| step_node_id(&three, t)).collect();
        assert_eq!(ids, [2, 0, 1]);
    }

    fn opts(argv: &[&str]) -> JobOpts {
        let mut full = vec!["srun"];
        full.extend_from_slice(argv);
        full.push("true");
        Args::try_parse_from(full).unwrap().opts
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn layout(nodes: u32, ntasks: u32, ntasks_per_node: u32) -> Layout {
        Layout {
            nodes,
            ntasks,
            ntasks_per_node,
        }
    }

    /// Slurm 22.05's srun in a `sbatch -N2 --ntasks-per-node=2` job (its environment:
    /// `SLURM_NNODES=2 SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=2`): `srun` and `srun -w n1`
    /// run 4 tasks `2(x2)` on both nodes; `srun -n3` warns `can't honor --ntasks-per-node set
    /// to 2 which doesn't match the requested tasks 3 with the number of requested nodes 2.
    /// Ignoring --ntasks-per-node.` and runs `2,1`; `srun -N1` warns the same for 4 tasks on
    /// 1 node (then is refused); `srun -n1` warns `can't run 1 processes on 2 nodes, setting
    /// nnodes to 1`; `srun -n2` runs `1(x2)` without a warning; `srun --ntasks-per-node=1`
    /// warns and runs the job's 4 tasks.
    #[test]
    fn inside_a_job_the_layout_comes_from_the_jobs_variables() {
        let job = env(&[
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &job, Allocation::Inherited);
        let ignored = |tpn: u32, n: u32, nodes: u32| {
            format!(
                "can't honor --ntasks-per-node set to {tpn} which doesn't match the requested \
                 tasks {n} with the number of requested nodes {nodes}. Ignoring \
                 --ntasks-per-node."
            )
        };
        assert_eq!(r(&[]), (layout(2, 4, 2), vec![]));
        assert_eq!(r(&["-w", "n1"]), (layout(2, 4, 2), vec![]));
        assert_eq!(r(&["-n3"]), (layout(2, 3, 0), vec![ignored(2, 3, 2)]));
        assert_eq!(r(&["-N1"]), (layout(1, 4, 0), vec![ignored(2, 4, 1)]));
        assert_eq!(
            r(&["-n1"]),
            (
                layout(1, 1, 0),
                vec!["can't run 1 processes on 2 nodes, setting nnodes to 1".to_owned()]
            )
        );
        assert_eq!(r(&["-n2"]), (layout(2, 2, 0), vec![]));
        assert_eq!(
            r(&["--ntasks-per-node=1"]),
            (layout(2, 4, 0), vec![ignored(1, 4, 2)])
        );
    }

    /// Slurm 22.05 in a plain `sbatch -N2 -c4` job (`SLURM_NNODES=2`, no task count):
    /// `srun --ntasks-per-node=2` runs 4 tasks `2(x2)` and sets `SLURM_NTASKS_PER_NODE=2`;
    /// `srun -N1 --ntasks-per-node=2` runs 2 on the first node; `srun -w n2` runs on both
    /// nodes, one task each; `srun -N1 -w n2` one task on n2.
    #[test]
    fn ntasks_per_node_without_a_task_count_multiplies_the_nodes() {
        let job = env(&[("SLURM_NNODES", "2")]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &job, Allocation::Inherited).0;
        assert_eq!(r(&["--ntasks-per-node=2"]), layout(2, 4, 2));
        assert_eq!(r(&["--ntasks-per-node=3"]), layout(2, 6, 3));
        assert_eq!(r(&["-N1", "--ntasks-per-node=2"]), layout(1, 2, 2));
        assert_eq!(r(&["-w", "n2"]), layout(2, 0, 0));
        assert_eq!(r(&["-N1", "-w", "n2"]), layout(1, 0, 0));
        assert_eq!(r(&["-n3"]), layout(2, 3, 0));
    }

    /// Outside a job nothing is inherited: `srun -N2 -n3` stays `-N2 -n3`, `srun -N2 -n3
    /// --ntasks-per-node=2` drops `--ntasks-per-node` (Slurm warns and allocates 3 CPUs).
    #[test]
    fn outside_a_job_only_the_command_line_counts() {
        let stale = env(&[("SLURM_NNODES", "5"), ("SLURM_NTASKS", "9")]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &stale, Allocation::MadeHere).0;
        assert_eq!(r(&["-N2", "-n3"]), layout(2, 3, 0));
        assert_eq!(r(&["-N2", "-n3", "--ntasks-per-node=2"]), layout(2, 3, 0));
        assert_eq!(r(&["-N2", "--ntasks-per-node=2"]), layout(2, 4, 2));
        assert_eq!(r(&["-n4", "--ntasks-per-node=2"]), layout(0, 4, 2));
        assert_eq!(r(&[]), layout(0, 0, 0));
    }
}
