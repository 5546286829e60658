//! The batch jobs running on this node: launch, supervise, signal, report.
//!
//! Each job gets one supervisor task that owns its process, its [`Enforcer`] and a control
//! channel. The supervisor is the only place that signals the job's process group, so time
//! limits, cancels and abandons cannot race each other into contradictory reports.
//!
//! # Invariants
//!
//! - A job is in the table from `launch` until its `JobEnded` has been handed to the event
//!   channel; the removal and the send happen under the table lock. A reader that snapshots
//!   the table and then drains the channel therefore sees every job either as running or as
//!   ended, never neither (the session relies on this when it re-registers).
//! - Exactly one `JobEnded` per launched job, including jobs that failed to start.
//! - With cgroups, a job's processes live in `job_ID/step_batch` from their first
//!   instruction (the launcher joins before it execs), signals reach the whole cgroup (a
//!   process that called `setsid` included), and the job's cgroup is emptied and removed
//!   before its end is reported.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tandem_net::auth::unix_now;
use tandem_proto::v1::{JobEnded, JobStarted, LaunchJob, SignalJob};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cgroup::plan::Allocation;
use crate::cgroup::{Isolation, JobCgroup};
use crate::journal::Journal;
use crate::launch::env::{NodeLocal, batch_env};
use crate::launch::exec::Launcher;
use crate::launch::limits::{
    DEFAULT_KILL_WAIT, Due, EndCause, Enforcer, ExitReport, Target, Warning,
};
use crate::launch::process::{self, BatchSpec, Confinement, RunAs, confined};
use crate::step::registry::StepRegistry;

/// What the job table tells the controller session.
#[derive(Debug, Clone, PartialEq)]
pub enum JobEvent {
    Started(JobStarted),
    Ended(JobEnded),
    /// Every process of an ended job is gone from this node (the answer to `EndJob`).
    Gone(u64),
}

/// Requests from the session to one job's supervisor.
#[derive(Debug, Clone, Copy)]
enum Control {
    /// SIGTERM, kill_wait, SIGKILL: a cancel or preemption, or the controller's safety net
    /// for a time limit this worker missed (then reported as a timeout). A preemption's
    /// QOS grace time comes first, after a SIGTERM sent as notice.
    Terminate { cause: EndCause, grace: Duration },
    /// Deliver a signal as is.
    Signal { signal: Signal, batch_only: bool },
    /// SIGKILL now: the controller no longer knows the job, or the worker stops.
    Kill,
}

/// This node's facts the supervisors need.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub name: String,
    pub cpus: u32,
    /// Where batch scripts are written.
    pub spool: PathBuf,
    /// uid of the worker process, to decide whether jobs run as another user.
    pub worker_uid: u32,
    /// `--kill-wait`: overrides the controller's value when set.
    pub kill_wait: Option<Duration>,
    /// The node's cgroup tree (or none).
    pub isolation: Isolation,
    /// Starts job processes in their cgroup and as their user; `None`: spawn directly.
    pub launcher: Option<Launcher>,
    /// The worker's private directory for launch requests.
    pub exec_dir: PathBuf,
}

/// Handle to the job table; cheap to clone.
#[derive(Debug, Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node: NodeFacts,
    /// Running jobs by id, each with its supervisor's control channel.
    table: Mutex<HashMap<u64, mpsc::UnboundedSender<Control>>>,
    /// Unbounded so a supervisor never waits on a disconnected controller; it holds at most
    /// one start and one end per job, and jobs per node are few.
    events: mpsc::UnboundedSender<JobEvent>,
    steps: Arc<StepRegistry>,
    /// Running pids and ends on disk, for a worker restart.
    journal: Journal,
}

impl Jobs {
    pub fn new(
        node: NodeFacts,
        steps: Arc<StepRegistry>,
        journal: Journal,
    ) -> (Self, mpsc::UnboundedReceiver<JobEvent>) {
        let (events, rx) = mpsc::unbounded_channel();
        let inner = Inner {
            node,
            table: Mutex::new(HashMap::new()),
            events,
            steps,
            journal,
        };
        (
            Self {
                inner: Arc::new(inner),
            },
            rx,
        )
    }

    /// Ids of the jobs running now, sorted.
    pub fn running(&self) -> Vec<u64> {
        let table = self
            .inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut ids: Vec<u64> = table.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Starts a job. A second launch of a running job (a controller that restarted and
    /// resent it) is ignored.
    pub fn launch(&self, job: LaunchJob) {
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut table = self
                .inner
                .table
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if table.contains_key(&job.job_id) {
                info!(
                    job_id = job.job_id,
                    "launch of a job already running ignored"
                );
                return;
            }
            table.insert(job.job_id, tx);
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let job_id = job.job_id;
            let ended = supervise(&inner, job, rx).await;
            // On disk before anyone hears of it: a worker crash after this loses nothing.
            inner.journal.record_ended(&ended);
            let mut table = inner.table.lock().unwrap_or_else(PoisonError::into_inner);
            table.remove(&job_id);
            // The receiver lives as long as the worker; if it is gone the worker is stopping.
            let _ = inner.events.send(JobEvent::Ended(ended));
        });
    }

    /// Applies the controller's `SignalJob`. Returns false if the job does not run here.
    pub fn signal(&self, req: &SignalJob) -> bool {
        let control = if req.signal == 0 {
            Control::Terminate {
                cause: match req.reason.as_str() {
                    "timeout" => EndCause::TimeLimit,
                    _ => EndCause::Cancel,
                },
                grace: Duration::from_secs(req.grace_s.into()),
            }
        } else {
            match Signal::try_from(req.signal) {
                Ok(signal) => Control::Signal {
                    signal,
                    batch_only: req.batch_only,
                },
                Err(_) => {
                    warn!(
                        job_id = req.job_id,
                        signal = req.signal,
                        "SignalJob with an unknown signal ignored"
                    );
                    return false;
                }
            }
        };
        self.send(req.job_id, control) || self.signal_steps(req.job_id, control)
    }

    /// Kills a job the controller no longer knows. Its end is still reported.
    pub fn abandon(&self, job_id: u64) -> bool {
        self.send(job_id, Control::Kill) || self.signal_steps(job_id, Control::Kill)
    }

    /// The controller's `EndJob`: the job ended; what is left of it here (step tasks, or a
    /// batch script's processes that outlived its cgroup's cleanup) is ended like a cancel
    /// (SIGTERM, the kill wait, SIGKILL), and `JobEvent::Gone` follows once every process
    /// of it here is gone, judged from its cgroup and its step tasks. Until then the node
    /// stays held by the job (COMPLETING); processes that never die keep it so (the
    /// controller drains the node, "Kill task failed").
    pub fn end_job(&self, job_id: u64) {
        let terminate = Control::Terminate {
            cause: EndCause::Cancel,
            grace: Duration::ZERO,
        };
        // A batch script still running here (an EndJob can only overtake its own end after a
        // reconnect) ends as cancelled; its end is reported first, as always.
        if !self.send(job_id, terminate) {
            self.signal_steps(job_id, terminate);
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let wait = inner.node.kill_wait.unwrap_or(DEFAULT_KILL_WAIT);
            let begun = Instant::now();
            let mut poll = Duration::from_millis(5);
            loop {
                let batch_running = inner
                    .table
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .contains_key(&job_id);
                if !batch_running && processes_gone(&inner.node.isolation, &inner.steps, job_id) {
                    break;
                }
                if begun.elapsed() >= wait {
                    // Past the kill wait: SIGKILL to whatever is left, every round, for
                    // processes that may yet be killable (stuck in the kernel for a while).
                    inner.steps.signal_job(job_id, Signal::SIGKILL);
                    if let Some(c) = inner.node.isolation.existing_job(job_id) {
                        c.kill_all();
                    }
                }
                tokio::time::sleep(poll).await;
                poll = (poll * 2).min(GONE_POLL_MAX);
            }
            // The job's cgroup, empty now, goes too (a step's own cleanup may have done it).
            if let Some(c) = inner.node.isolation.existing_job(job_id) {
                c.destroy().await;
            }
            info!(job_id, "ended job's processes gone from this node");
            let _ = inner.events.send(JobEvent::Gone(job_id));
        });
    }

    /// On the other nodes of a multi-node job only its step tasks run here; they get the
    /// same treatment the batch script gets on the first node.
    fn signal_steps(&self, job_id: u64, control: Control) -> bool {
        let steps = &self.inner.steps;
        let signalled = match control {
            Control::Terminate { grace, .. } => {
                let n = steps.signal_job(job_id, Signal::SIGTERM);
                if n > 0 {
                    let steps = Arc::clone(steps);
                    let wait = self.inner.node.kill_wait.unwrap_or(DEFAULT_KILL_WAIT);
                    // The batch node's sequence (see `Enforcer::terminate`): the first
                    // SIGTERM was notice; the end proper begins when the grace is over.
                    tokio::spawn(async move {
                        if !grace.is_zero() {
                            tokio::time::sleep(grace).await;
                            steps.signal_job(job_id, Signal::SIGTERM);
                        }
                        tokio::time::sleep(wait).await;
                        steps.signal_job(job_id, Signal::SIGKILL);
                    });
                }
                n
            }
            Control::Signal { signal, .. } => steps.signal_job(job_id, signal),
            Control::Kill => steps.signal_job(job_id, Signal::SIGKILL),
        };
        signalled > 0
    }

    /// Kills every job (the worker is stopping) and waits until their ends are queued, at
    /// most `wait`.
    pub async fn kill_all(&self, wait: Duration) {
        for id in self.running() {
            self.send(id, Control::Kill);
        }
        let deadline = Instant::now() + wait;
        while !self.running().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn send(&self, job_id: u64, control: Control) -> bool {
        let table = self
            .inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match table.get(&job_id) {
            Some(tx) => tx.send(control).is_ok(),
            None => {
                debug!(job_id, ?control, "control for a job not running here");
                false
            }
        }
    }
}

/// Longest pause between two looks at an ended job's leftover processes.
const GONE_POLL_MAX: Duration = Duration::from_secs(1);

/// How long the batch host looks for the job's process group to vanish before it reports the
/// end without `processes_gone` (then the controller asks again with `EndJob`).
const BATCH_GONE_WAIT: Duration = Duration::from_millis(200);

/// Whether no process of job `job_id` is left on this node: its cgroup is empty or gone, and
/// no step task of it is unreaped. Without cgroups the step tasks' process groups are all
/// the worker can see.
pub fn processes_gone(
    isolation: &crate::cgroup::Isolation,
    steps: &StepRegistry,
    job_id: u64,
) -> bool {
    isolation.job_processes_gone(job_id) && !steps.has_job(job_id)
}

/// Whether process group `pgid` has no member left (zombies not yet reaped count).
fn group_gone(pgid: Pid) -> bool {
    matches!(killpg(pgid, None), Err(nix::errno::Errno::ESRCH))
}

/// Runs one job to its end and describes that end.
#[tracing::instrument(skip_all, fields(job_id = job.job_id))]
async fn supervise(
    inner: &Inner,
    job: LaunchJob,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> JobEnded {
    let node = &inner.node;
    let mut ended = JobEnded {
        job_id: job.job_id,
        ..Default::default()
    };
    let env = batch_env(
        &job.environment,
        &NodeLocal {
            node_name: &node.name,
            cpus: node.cpus,
        },
        &job.gpus,
    );
    let cgroup = match node.isolation.create_job(
        job.job_id,
        &Allocation {
            mem_mb: job.mem_mb,
            cpus: job.cpus,
            gpus: job.gpus.clone(),
        },
    ) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("cannot create the job's cgroup: {e}");
            warn!(error = %msg, "batch script did not start");
            ended.launch_error = msg;
            ended.exit_code = 1;
            ended.end_time = unix_now();
            return ended;
        }
    };
    let cgroup_procs = match cgroup.as_ref().map(|c| c.add_step(None)).transpose() {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => {
            if let Some(c) = &cgroup {
                c.destroy().await;
            }
            let msg = format!("cannot create the batch step's cgroup: {e}");
            ended.launch_error = msg;
            ended.exit_code = 1;
            ended.end_time = unix_now();
            return ended;
        }
    };
    let started = match RunAs::decide(node.worker_uid, job.uid, job.gid) {
        Ok(run_as) => {
            let confine = confined(
                cgroup.is_some(),
                matches!(run_as, RunAs::User { .. }),
                node.launcher.as_ref(),
            )
            .then(|| Confinement {
                launcher: node.launcher.as_ref(),
                exec_dir: &node.exec_dir,
                request_name: format!("job{}.batch", job.job_id),
                cgroup_procs,
                exec_failed_code: None,
            });
            let spec = BatchSpec {
                job_id: job.job_id,
                script: &job.script,
                argv: &job.argv,
                workdir: std::path::Path::new(&job.workdir),
                env: &env,
                stdout: &job.stdout,
                stderr: &job.stderr,
                stdin: &job.stdin,
                open_append: job.open_append,
                umask: job.umask.map(|m| m & 0o777),
                node_name: &node.name,
                run_as,
                confine,
            };
            process::start(&node.spool, &spec).await
        }
        Err(e) => Err(e),
    };
    let mut started = match started {
        Ok(s) => s,
        Err(e) => {
            if let Some(c) = &cgroup {
                c.destroy().await;
            }
            warn!(error = %e.one_line(), "batch script did not start");
            ended.launch_error = e.one_line();
            ended.exit_code = 1;
            ended.end_time = unix_now();
            return ended;
        }
    };
    info!(pid = started.pid, "batch script started");
    inner.journal.record_running(job.job_id, started.pid);
    let _ = inner.events.send(JobEvent::Started(JobStarted {
        job_id: job.job_id,
        pid: started.pid,
        start_time: unix_now(),
    }));

    // process_group(0) made the shell a group leader: its pid is the group id.
    let pgid = Pid::from_raw(i32::try_from(started.pid).unwrap_or(0));
    let kill_wait = node
        .kill_wait
        .or_else(|| (job.kill_wait_s > 0).then(|| Duration::from_secs(job.kill_wait_s.into())))
        .unwrap_or(DEFAULT_KILL_WAIT);
    let limit = (job.time_limit_s > 0).then(|| Duration::from_secs(job.time_limit_s));
    let start = Instant::now().into_std();
    let mut enforcer = Enforcer::new(start, limit, kill_wait).with_warning(start, warning_of(&job));
    let apply = |sig: Option<Signal>| {
        if let Some(sig) = sig {
            info!(signal = %sig, "signalling the job's process group");
            if let Err(e) = killpg(pgid, sig) {
                debug!(error = %e, "killpg failed (group already gone?)");
            }
            // Processes that left the group (setsid, setpgid) are still in the cgroup.
            match &cgroup {
                Some(c) if sig == Signal::SIGKILL => c.kill_all(),
                Some(c) => {
                    c.signal_escaped(None, pgid, sig);
                }
                None => {}
            }
            inner.steps.signal_job(job.job_id, sig);
        }
    };

    let status = loop {
        let wake = enforcer.next_wakeup().map(Instant::from_std);
        tokio::select! {
            status = started.child.wait() => break status,
            () = sleep_until(wake) => match enforcer.on_tick(Instant::now().into_std()) {
                Some(Due { signal, to: Target::Job }) => apply(Some(signal)),
                Some(Due { signal, to: Target::BatchShell }) => {
                    info!(signal = %signal, "signalling the batch shell (--signal=B:)");
                    if let Err(e) = kill(pgid, signal) {
                        debug!(error = %e, "kill failed");
                    }
                }
                Some(Due { signal, to: Target::Steps }) => {
                    let steps = inner.steps.signal_job(job.job_id, signal);
                    info!(signal = %signal, steps, "signalling the job's steps (--signal)");
                }
                None => {}
            },
            Some(c) = control.recv() => match c {
                Control::Terminate { cause, grace } => {
                    apply(enforcer.terminate(Instant::now().into_std(), cause, grace));
                }
                Control::Kill => apply(enforcer.kill_now()),
                Control::Signal { signal, batch_only: true } => {
                    if let Err(e) = kill(pgid, signal) {
                        debug!(error = %e, "kill failed");
                    }
                }
                Control::Signal { signal, batch_only: false } => apply(Some(signal)),
            },
        }
    };

    // Slurm ends every process of a job when its batch script ends; stragglers that stayed
    // in the group (background jobs the script did not wait for) go now.
    let _ = killpg(pgid, Signal::SIGKILL);
    inner.steps.signal_job(job.job_id, Signal::SIGKILL);
    // The kernel counted OOM kills in the job's cgroup; read before it is removed.
    let out_of_memory = cgroup.as_ref().is_some_and(JobCgroup::out_of_memory);
    // So are the job's CPU time and peak memory, and its batch script's (sacct's .batch).
    // Where the cgroup does not count CPU, the script's own (wait4: it and the children
    // it waited for) stands in for both.
    let waited = started.child.cpu_usec();
    let measured = |scope: Option<Option<u32>>| {
        let u = cgroup.as_ref().map(|c| c.usage(scope)).unwrap_or_default();
        let cpu = u.cpu_usec.or(waited)?;
        Some(tandem_proto::v1::ResourceUsage {
            user_cpu_usec: cpu.0,
            system_cpu_usec: cpu.1,
            max_rss_bytes: u.max_rss_bytes,
        })
    };
    ended.batch_usage = measured(Some(None));
    ended.job_usage = measured(None);
    // Whether this node can be freed with the end report itself (no second message on the
    // common path): the job's cgroup emptied, or without one, its process group gone.
    let emptied = match &cgroup {
        Some(c) => c.destroy().await,
        None => {
            let deadline = Instant::now() + BATCH_GONE_WAIT;
            while !group_gone(pgid) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            group_gone(pgid)
        }
    };
    ended.processes_gone = emptied && !inner.steps.has_job(job.job_id);
    if let Err(e) = process::remove_spool(&started.spool_dir) {
        debug!(error = %e, "spool cleanup failed");
    }

    let report = match status {
        Ok(s) => ExitReport::from_status(s),
        Err(e) => {
            warn!(error = %e, "waiting for the batch script failed");
            ExitReport {
                exit_code: 1,
                signal: 0,
            }
        }
    };
    ended.exit_code = report.exit_code;
    ended.signal = report.signal;
    ended.timed_out = enforcer.timed_out();
    ended.cancelled = enforcer.cancelled();
    ended.out_of_memory = out_of_memory;
    ended.end_time = unix_now();
    info!(
        exit_code = ended.exit_code,
        signal = ended.signal,
        timed_out = ended.timed_out,
        cancelled = ended.cancelled,
        out_of_memory = ended.out_of_memory,
        "batch script ended"
    );
    ended
}

/// The job's `--signal`, if it asked for one this worker can send.
fn warning_of(job: &LaunchJob) -> Option<Warning> {
    if job.signal_number == 0 {
        return None;
    }
    match Signal::try_from(job.signal_number) {
        Ok(signal) => Some(Warning {
            signal,
            before: Duration::from_secs(job.signal_before_s.into()),
            batch_only: job.signal_batch_only,
        }),
        Err(_) => {
            warn!(
                signal = job.signal_number,
                "--signal with a signal this node does not know ignored"
            );
            None
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
