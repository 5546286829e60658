//! Running the tasks of one step on this node and streaming them back to `srun`.
//!
//! One process per task, each in its own process group (so `SignalTasks` reaches what a task
//! starts), stdout/stderr piped back as `TaskOutput` chunks, then one `TaskExit` per task
//! after all of its output. A step supervisor watches the response stream: when `srun` goes
//! away, the step's tasks are killed, as Slurm does when srun dies.
//!
//! With cgroups, a step's tasks start through the launcher in `job_ID/step_N`: inside the
//! job's cgroup (and under its limits) on the node that runs the batch script, in a job
//! cgroup without limits on the job's other nodes (the step request carries no memory size).
//! When the step's last task exits, what is left in its cgroup is killed and the cgroup
//! removed. Tasks of a user run with that user's supplementary groups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tandem_proto::v1::{TaskExit, TaskOutput, task_output};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::Status;
use tracing::{debug, warn};

use super::registry::{StepKey, StepRegistry};
use crate::cgroup::{Isolation, JobCgroup};
use crate::launch::exec::{self, Launcher};
use crate::launch::limits::ExitReport;
use crate::launch::process::{Confinement, RunAs, confined, plain_command};

/// Bytes read from a task's pipe per chunk sent.
const CHUNK: usize = 8 * 1024;
/// Exit code reported for a task that could not be executed (Slurm's slurmstepd uses 2).
const EXEC_FAILED: i32 = 2;

pub type OutputTx = mpsc::Sender<Result<TaskOutput, Status>>;

/// One task to start.
#[derive(Debug)]
pub struct TaskSpec<'a> {
    pub task_id: u32,
    pub argv: &'a [String],
    pub workdir: &'a Path,
    pub env: BTreeMap<String, String>,
    /// srun's file-creation mask; `None`: the worker's.
    pub umask: Option<u32>,
}

/// Where step tasks go: the node's cgroups and the launcher.
#[derive(Debug, Clone)]
pub struct Placement {
    pub isolation: Isolation,
    pub launcher: Option<Launcher>,
    pub exec_dir: PathBuf,
}

impl Placement {
    /// No cgroups, no launcher: tasks are spawned directly.
    pub fn direct() -> Self {
        Self {
            isolation: Isolation::off(),
            launcher: None,
            exec_dir: PathBuf::new(),
        }
    }

    /// The job's cgroup here, and whether this step created it.
    fn job_cgroup(&self, job_id: u64) -> (Option<JobCgroup>, bool) {
        match self.isolation.job_for_step(job_id) {
            Ok(c) => c,
            Err(e) => {
                warn!(job_id, error = %e, "cannot create the job's cgroup: step tasks run outside it");
                (None, false)
            }
        }
    }
}

/// Starts the tasks and a supervisor that ends the stream after the last exit.
pub fn start_step(
    key: StepKey,
    run_as: RunAs,
    owner_uid: u32,
    tasks: Vec<TaskSpec<'_>>,
    registry: Arc<StepRegistry>,
    placement: &Placement,
    tx: OutputTx,
) {
    let (cgroup, created_job) = placement.job_cgroup(key.0);
    let procs = match cgroup.as_ref().map(|c| c.add_step(Some(key.1))).transpose() {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => {
            warn!(job_id = key.0, step_id = key.1, error = %e, "cannot create the step's cgroup");
            Vec::new()
        }
    };
    let mut pumps = JoinSet::new();
    for t in tasks {
        match spawn_task(&t, run_as, placement, &procs, key) {
            Ok(child) => {
                let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
                registry.add_task(key, owner_uid, t.task_id, pid);
                pumps.spawn(pump(
                    child,
                    t.task_id,
                    key,
                    Arc::clone(&registry),
                    tx.clone(),
                ));
            }
            Err(e) => {
                let program = t.argv.first().map(String::as_str).unwrap_or_default();
                // Slurm's step daemon's words (`execve(): nosuchcmd: No such file or
                // directory`), the errno's text without Rust's "(os error 2)".
                let why = e.raw_os_error().map_or_else(
                    || e.to_string(),
                    |n| nix::errno::Errno::from_raw(n).desc().to_owned(),
                );
                let text = format!("tandem-worker: error: execve(): {program}: {why}\n");
                let tx = tx.clone();
                let task_id = t.task_id;
                pumps.spawn(async move {
                    let _ = tx
                        .send(Ok(output(task_id, Event::Stderr(text.into_bytes()))))
                        .await;
                    let exit = TaskExit {
                        exit_code: EXEC_FAILED,
                        signal: 0,
                    };
                    let _ = tx.send(Ok(output(task_id, Event::Exit(exit)))).await;
                });
            }
        }
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tx.closed() => {
                    warn!(job_id = key.0, step_id = key.1, "srun went away: killing the step's tasks");
                    registry.signal_step(key, Signal::SIGKILL);
                    while pumps.join_next().await.is_some() {}
                    break;
                }
                r = pumps.join_next() => if r.is_none() { break },
            }
        }
        if let Some(c) = &cgroup {
            c.finish_step(Some(key.1), created_job).await;
        }
        // Dropping the last sender ends the response stream.
        drop(tx);
    });
}

fn spawn_task(
    t: &TaskSpec<'_>,
    run_as: RunAs,
    placement: &Placement,
    procs: &[PathBuf],
    key: StepKey,
) -> std::io::Result<Child> {
    let (program, args) = t
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"))?;
    let launcher = placement.launcher.as_ref();
    if confined(
        !procs.is_empty(),
        matches!(run_as, RunAs::User { .. }),
        launcher,
    ) {
        let confine = Confinement {
            launcher,
            exec_dir: &placement.exec_dir,
            request_name: format!("job{}.step{}.task{}", key.0, key.1, t.task_id),
            cgroup_procs: procs.to_vec(),
            exec_failed_code: u8::try_from(EXEC_FAILED).ok(),
        };
        let user = match run_as {
            RunAs::User { uid, gid } => Some(exec::User {
                uid,
                gid,
                groups: exec::user_groups(uid, gid),
            }),
            RunAs::Worker => None,
        };
        let mut cmd = confine.command(
            Path::new(program),
            args.iter().map(Into::into).collect(),
            &t.env,
            t.workdir,
            user,
            t.umask,
        )?;
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        return cmd.spawn();
    }
    let mut cmd = plain_command(Path::new(program), &t.env, t.workdir, t.umask)?;
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let RunAs::User { uid, gid } = run_as {
        cmd.uid(uid).gid(gid);
    }
    cmd.spawn()
}

enum Event {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(TaskExit),
}

fn output(task_id: u32, e: Event) -> TaskOutput {
    let event = match e {
        Event::Stdout(b) => task_output::Event::Stdout(b),
        Event::Stderr(b) => task_output::Event::Stderr(b),
        Event::Exit(x) => task_output::Event::Exit(x),
    };
    TaskOutput {
        task_id,
        event: Some(event),
    }
}

/// Forwards one task's output, then its exit.
async fn pump(
    mut child: Child,
    task_id: u32,
    key: StepKey,
    registry: Arc<StepRegistry>,
    tx: OutputTx,
) {
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let out = forward(child.stdout.take(), task_id, &tx, Event::Stdout);
    let err = forward(child.stderr.take(), task_id, &tx, Event::Stderr);
    let (out, err) = tokio::join!(out, err);
    if out.is_err() || err.is_err() {
        // The caller is gone; a task blocked on a full pipe would never exit by itself.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    let status = child.wait().await;
    registry.remove_task(key, task_id);
    let report = match status {
        Ok(s) => ExitReport::from_status(s),
        Err(e) => {
            debug!(error = %e, task_id, "wait failed");
            ExitReport {
                exit_code: 1,
                signal: 0,
            }
        }
    };
    let exit = TaskExit {
        exit_code: report.exit_code,
        signal: report.signal,
    };
    let _ = tx.send(Ok(output(task_id, Event::Exit(exit)))).await;
}

/// Sends chunks until EOF; `Err` when the receiver is gone.
async fn forward<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    task_id: u32,
    tx: &OutputTx,
    wrap: fn(Vec<u8>) -> Event,
) -> Result<(), ()> {
    let Some(mut pipe) = pipe else {
        return Ok(());
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => {
                let chunk = buf[..n].to_vec();
                tx.send(Ok(output(task_id, wrap(chunk))))
                    .await
                    .map_err(|_| ())?;
            }
        }
    }
}
