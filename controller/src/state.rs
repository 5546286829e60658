//! The state actor: one thread owns `tandem_sched::State`; everything else talks to it with
//! [`Command`]s.
//!
//! ```text
//!  RPC handlers ──Command──▶ queue ──▶ actor thread
//!                                      1. drain: apply every queued command to State
//!                                      2. flush: take_changes -> one Batch -> committer
//!                                         (replies ride along as after-commit effects)
//!                                      3. pass:  if triggered and allowed, schedule(now),
//!                                         flush again; launches/signals are effects too
//!                                      4. tick:  node timeouts, purge, safety-net pass
//! ```
//!
//! # Invariants
//!
//! - A caller hears "done" for a change only from an effect of the batch holding it, that
//!   is, only once it is durable; a rejected request changed nothing and is answered at once.
//! - Launches and signals run after the commit of the pass that decided them, so a worker
//!   never runs a job the store does not know as RUNNING.
//! - The actor never waits for the disk: while one transaction is fsynced it applies the
//!   next commands, which form the next (group) commit.
//! - Passes are event driven (end, node change, cancel, update set `pass_wanted`; a submit
//!   does when some node has free resources or its QOS may preempt, unless the job is held
//!   or begins later, so a flood of held submits costs no pass); triggers during a pass
//!   coalesce into one more pass. A pass starts no sooner than its predecessor's duration
//!   after it ended, bounding scheduling to half the actor's time under a flood of events
//!   while keeping an idle cluster's submit-to-start immediate. A slow timer adds a pass for
//!   time-based eligibility (`--begin`) only.
//! - Queries answer from memory at once (they may see a change a moment before it is
//!   durable); queries that read the store first pass a [`Command::Barrier`], so `sacct`
//!   right after a job ends finds its record.
//! - The actor stops on [`Command::Shutdown`] or when every [`Handle`] is gone, then
//!   flushes; the committer drains its queue and exits after it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use prost::Message;
use tandem_proto::auth::{ClusterKey, Identity, Role};
use tandem_proto::v1::{self, controller_message, worker_message};
use tandem_sched::cycle::{PassObserver, Phase};
use tandem_sched::effect::{Effect as CoreEffect, RunRecord};
use tandem_sched::job::{Hold, Job, JobOutcome, JobSpec, JobState};
use tandem_sched::node::Health;
use tandem_sched::state::{JobSelector, NodeRegistration, Requester};
use tandem_sched::{JobId, State};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;
use tracing::{debug, info, warn};

mod accounting;
mod node_admin;
pub use accounting::{AcctCommand, Change, at_most};

use crate::api::convert::{JobFields, job_field};
use crate::api::{authz, convert};
use crate::config::Config;
use crate::launch::{self, ArrayFacts, LaunchFacts, Payload};
use crate::metrics::Metrics;
use crate::steps::{self, StepRec};
use crate::store::{Batch, Committer, Effect, JobRecordRow, Store, StoreError};
use crate::workers::{ConnId, WorkerTx, Workers};

pub type Reply<T> = oneshot::Sender<Result<T, Status>>;
pub type WatchTx = mpsc::UnboundedSender<Result<v1::JobInfo, Status>>;

/// Finished jobs stay in memory (squeue/scontrol show them) this long, like Slurm's
/// MinJobAge; their accounting records stay in the store for good.
const MIN_JOB_AGE_S: i64 = 300;
/// Retried submits arrive within seconds; keys older than this are forgotten.
const IDEMPOTENCY_TTL_S: i64 = 3600;
/// Commands applied before the actor flushes and looks at its timers again.
const MAX_COMMANDS_PER_ROUND: usize = 8192;
/// Grace on top of time limit + kill wait before the controller itself ends a job whose
/// worker never reported it.
const TIMEOUT_SLACK_S: i64 = 60;
/// List responses with at most this many jobs get their payload fields (workdir, output
/// paths, command); larger listings (squeue over everything) never touch payloads.
pub const DETAIL_LIMIT: usize = 16;

/// A request to the actor.
pub enum Command {
    Submit {
        spec: JobSpec,
        payload: Vec<u8>,
        idempotency_key: Option<String>,
        reply: Reply<v1::SubmitResponse>,
    },
    Cancel {
        who: Identity,
        req: v1::CancelRequest,
        reply: Reply<v1::CancelResponse>,
    },
    ListJobs {
        req: v1::ListJobsRequest,
        reply: Reply<v1::ListJobsResponse>,
    },
    UpdateJob {
        who: Identity,
        req: v1::UpdateJobRequest,
        reply: Reply<v1::UpdateJobResponse>,
    },
    Watch {
        job: JobId,
        tx: WatchTx,
        reply: Reply<()>,
    },
    CreateStep {
        who: Identity,
        req: v1::CreateStepRequest,
        reply: Reply<v1::CreateStepResponse>,
    },
    CompleteStep {
        who: Identity,
        req: v1::CompleteStepRequest,
        reply: Reply<v1::CompleteStepResponse>,
    },
    ListNodes {
        req: v1::ListNodesRequest,
        reply: Reply<v1::ListNodesResponse>,
    },
    ListPartitions {
        reply: Reply<v1::ListPartitionsResponse>,
    },
    UpdateNode {
        who: Identity,
        req: v1::UpdateNodeRequest,
        reply: Reply<v1::UpdateNodeResponse>,
    },
    /// The operator's node removal (see `state/node_admin.rs`).
    RemoveNode {
        who: Identity,
        req: v1::RemoveNodeRequest,
        reply: Reply<v1::RemoveNodeResponse>,
    },
    ClusterInfo {
        reply: Reply<v1::ClusterInfoResponse>,
    },
    /// Jobs still in memory, for sacct's active part.
    ActiveJobs {
        reply: Reply<Vec<v1::JobInfo>>,
    },
    WorkerRegister {
        conn: ConnId,
        reg: v1::Register,
        tx: WorkerTx,
        reply: Reply<String>,
    },
    WorkerEvent {
        conn: ConnId,
        node: String,
        msg: worker_message::Msg,
    },
    WorkerGone {
        conn: ConnId,
        node: String,
    },
    /// Answers once everything applied so far is durable (read-your-writes for queries
    /// that go to the store, like sacct).
    Barrier {
        reply: Reply<()>,
    },
    /// sacctmgr changes, and the association, QOS, sshare and sprio views.
    Accounting(AcctCommand),
    /// Stop after flushing what is queued.
    Shutdown,
}

/// The handlers' side of the actor.
#[derive(Clone)]
pub struct Handle {
    tx: std_mpsc::Sender<Command>,
}

impl Handle {
    /// Sends a command built around a fresh reply channel and waits for the answer.
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await
            .map_err(|_| Status::unavailable("controller is shutting down"))?
    }

    #[allow(clippy::result_large_err)]
    pub fn send(&self, cmd: Command) -> Result<(), Status> {
        self.tx
            .send(cmd)
            .map_err(|_| Status::unavailable("controller is shutting down"))
    }
}

/// What the actor needs besides the recovered state.
pub struct ActorParts {
    pub config: Arc<Config>,
    pub key: Arc<ClusterKey>,
    pub committer: Committer,
    pub metrics: Arc<Metrics>,
    pub idempotency: HashMap<String, (JobId, i64)>,
    pub steps: HashMap<JobId, Vec<StepRec>>,
}

/// Starts the actor thread. It ends on [`Command::Shutdown`] or when every [`Handle`] is
/// dropped.
pub fn spawn(
    st: State,
    parts: ActorParts,
) -> std::io::Result<(Handle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std_mpsc::channel();
    let handle = Handle { tx };
    let (launch_failed_tx, launch_failed_rx) = std_mpsc::channel();
    let now = Instant::now();
    let actor = Actor {
        st,
        cfg: parts.config,
        key: parts.key,
        committer: parts.committer,
        launch_failed_tx,
        launch_failed_rx,
        metrics: parts.metrics,
        workers: Workers::new(now),
        steps: parts.steps,
        watchers: HashMap::new(),
        idem: parts.idempotency,
        batch: Batch::default(),
        effects: Vec::new(),
        pass_wanted: true,
        pass_if_capacity: false,
        next_pass_at: now,
        next_tick: now,
        next_purge: now + Duration::from_secs(10),
        next_periodic_pass: now,
        timeout_signalled: HashSet::new(),
        start_time: unix_now(),
        stopping: false,
    };
    let join = std::thread::Builder::new()
        .name("tandem-state".into())
        .spawn(move || actor.run(rx))?;
    Ok((handle, join))
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

struct Actor {
    st: State,
    cfg: Arc<Config>,
    /// Signs step launch tokens.
    key: Arc<ClusterKey>,
    committer: Committer,
    /// Launches that could not be built (payload unreadable) come back here. Separate from
    /// the command queue so that the queue disconnects, and the actor stops, once every
    /// `Handle` is gone (e.g. the server future was dropped).
    launch_failed_tx: std_mpsc::Sender<(JobId, String)>,
    launch_failed_rx: std_mpsc::Receiver<(JobId, String)>,
    metrics: Arc<Metrics>,
    workers: Workers,
    /// Steps of running jobs; folded into the accounting record when the job ends.
    steps: HashMap<JobId, Vec<StepRec>>,
    /// Open WatchJob streams per job.
    watchers: HashMap<JobId, Vec<WatchTx>>,
    /// Submit idempotency keys -> (job, created).
    idem: HashMap<String, (JobId, i64)>,
    /// Writes and effects of the commands applied since the last flush.
    batch: Batch,
    effects: Vec<Effect>,
    /// An event that can change what runs (end, cancel, node change, update) happened.
    pass_wanted: bool,
    /// Only submits happened: a pass can start something only if some node has free
    /// resources (a preempting QOS sets `pass_wanted` instead). On a full cluster with a
    /// long queue this spares a pass over every pending job per submit.
    pass_if_capacity: bool,
    next_pass_at: Instant,
    next_tick: Instant,
    next_purge: Instant,
    next_periodic_pass: Instant,
    /// Jobs past their time limit the controller already asked to end.
    timeout_signalled: HashSet<JobId>,
    start_time: i64,
    stopping: bool,
}

/// How often timers (node timeouts, purge) are looked at.
const TICK: Duration = Duration::from_millis(200);

impl Actor {
    fn run(mut self, rx: std_mpsc::Receiver<Command>) {
        info!(
            jobs = self.st.jobs().count(),
            nodes = self.st.nodes().count(),
            "state actor started"
        );
        loop {
            let now = Instant::now();
            let mut wake = self.next_tick;
            if self.pass_wanted {
                wake = wake.min(self.next_pass_at);
            }
            let first = match rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(cmd) => Some(cmd),
                Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
            };
            // 1. drain
            let drain_start = Instant::now();
            let mut applied = 0usize;
            if let Some(cmd) = first {
                self.handle(cmd);
                applied += 1;
                while applied < MAX_COMMANDS_PER_ROUND {
                    match rx.try_recv() {
                        Ok(cmd) => {
                            self.handle(cmd);
                            applied += 1;
                        }
                        Err(_) => break,
                    }
                }
            }
            while let Ok((job, error)) = self.launch_failed_rx.try_recv() {
                self.launch_failed(job, error);
                applied += 1;
            }
            // 2. flush
            if applied > 0 {
                let rows = self.flush();
                debug!(
                    commands = applied,
                    rows,
                    apply_us = drain_start.elapsed().as_micros() as u64,
                    "applied commands"
                );
            }
            // 4. tick (before the pass, so nodes lost now are not scheduled on)
            if Instant::now() >= self.next_tick {
                self.tick();
                self.flush();
                self.next_tick = Instant::now() + TICK;
            }
            // 3. pass
            if self.pass_if_capacity && !self.pass_wanted {
                self.pass_wanted = self.capacity_available();
            }
            self.pass_if_capacity = false;
            if self.pass_wanted && Instant::now() >= self.next_pass_at {
                self.pass();
            }
            if self.stopping {
                break;
            }
        }
        // Shutdown: end worker and watch streams so the server can drain, and let the
        // committer finish what is queued.
        self.workers.close_all();
        self.watchers.clear();
        self.flush();
        info!("state actor stopped");
    }

    fn now(&self) -> i64 {
        unix_now()
    }

    fn requester(who: &Identity) -> Requester {
        Requester {
            user: who.user.clone(),
            admin: who.is_admin(),
        }
    }

    /// Replies after the current batch commits.
    fn reply_after_commit<T: Send + 'static>(&mut self, reply: Reply<T>, value: T) {
        self.effects
            .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                let _ = reply.send(match r {
                    Ok(()) => Ok(value),
                    Err(e) => Err(Status::unavailable(format!("not committed: {e}"))),
                });
            }));
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                spec,
                payload,
                idempotency_key,
                reply,
            } => self.submit(spec, payload, idempotency_key, reply),
            Command::Cancel { who, req, reply } => {
                let r = self.cancel(&who, &req);
                match r {
                    Ok(resp) => self.reply_after_commit(reply, resp),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::ListJobs { req, reply } => {
                let _ = reply.send(self.list_jobs(&req));
            }
            Command::UpdateJob { who, req, reply } => match self.update_job(&who, &req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::Watch { job, tx, reply } => {
                let _ = reply.send(self.watch(job, tx));
            }
            Command::CreateStep { who, req, reply } => match self.create_step(&who, &req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::CompleteStep { who, req, reply } => {
                match self.complete_step(&who, req.job_id, req.step_id, req.exit_code, req.signal) {
                    Ok(()) => self.reply_after_commit(reply, v1::CompleteStepResponse {}),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::ListNodes { req, reply } => {
                let _ = reply.send(self.list_nodes(&req));
            }
            Command::ListPartitions { reply } => {
                let partitions = self
                    .st
                    .partitions()
                    .map(|p| convert::partition_info(&self.st, p))
                    .collect();
                let _ = reply.send(Ok(v1::ListPartitionsResponse { partitions }));
            }
            Command::UpdateNode { who, req, reply } => match self.update_node(&who, &req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::RemoveNode { who, req, reply } => match self.remove_nodes(&who, &req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::ClusterInfo { reply } => {
                let _ = reply.send(Ok(v1::ClusterInfoResponse {
                    cluster_name: self.st.config().cluster_name.clone(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    now: self.now(),
                    start_time: self.start_time,
                }));
            }
            Command::ActiveJobs { reply } => {
                let jobs = self
                    .st
                    .jobs()
                    .filter(|j| {
                        !j.is_array_meta()
                            || j.array.as_ref().is_some_and(|a| !a.pending.is_empty())
                    })
                    .map(|j| self.job_info(j))
                    .collect();
                let _ = reply.send(Ok(jobs));
            }
            Command::WorkerRegister {
                conn,
                reg,
                tx,
                reply,
            } => {
                let r = self.register(conn, reg, tx);
                let _ = reply.send(r);
            }
            Command::WorkerEvent { conn, node, msg } => self.worker_event(conn, &node, msg),
            Command::WorkerGone { conn, node } => {
                self.workers.disconnected(&node, conn);
                info!(node = %node, "worker stream closed");
            }
            Command::Barrier { reply } => self.reply_after_commit(reply, ()),
            Command::Accounting(cmd) => self.accounting(cmd),
            Command::Shutdown => self.stopping = true,
        }
    }

    fn launch_failed(&mut self, job: JobId, error: String) {
        warn!(job_id = job.0, error = %error, "launch failed");
        let now = self.now();
        let outcome = JobOutcome {
            exit_code: 1,
            launch_error: Some(error),
            ..JobOutcome::default()
        };
        if let Ok(effects) = self.st.job_ended(job, outcome, now) {
            self.apply_effects(effects);
            self.pass_wanted = true;
        }
    }

    // === jobs ===

    fn submit(
        &mut self,
        spec: JobSpec,
        payload: Vec<u8>,
        key: Option<String>,
        reply: Reply<v1::SubmitResponse>,
    ) {
        let cluster = self.cluster_for_response();
        if let Some(k) = &key
            && let Some((id, _)) = self.idem.get(k)
        {
            // The first submit may still be in flight: answer after the current batch,
            // which commits after it.
            let resp = v1::SubmitResponse {
                job_id: id.0,
                cluster,
                warnings: vec![],
            };
            self.reply_after_commit(reply, resp);
            return;
        }
        let now = self.now();
        match self.st.submit(spec, now) {
            Ok(id) => {
                self.batch.payloads.push((id.0, payload));
                if let Some(k) = key {
                    self.batch.idempotency.push((k.clone(), id.0, now));
                    self.idem.insert(k, (id, now));
                }
                self.metrics.submitted(1);
                if let Some(job) = self.st.job(id) {
                    let preempts = self
                        .st
                        .config()
                        .qos(&job.spec.qos)
                        .is_some_and(|q| !q.preempt.is_empty());
                    match submit_pass_trigger(job, preempts, now) {
                        PassTrigger::Now => self.pass_wanted = true,
                        PassTrigger::IfCapacity => self.pass_if_capacity = true,
                        PassTrigger::None => {}
                    }
                }
                self.reply_after_commit(
                    reply,
                    v1::SubmitResponse {
                        job_id: id.0,
                        cluster,
                        warnings: vec![],
                    },
                );
            }
            Err(e) => {
                let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
            }
        }
    }

    fn cluster_for_response(&self) -> String {
        let name = &self.st.config().cluster_name;
        if name == tandem_sched::config::DEFAULT_CLUSTER_NAME {
            String::new()
        } else {
            name.clone()
        }
    }

    /// The jobs a cancel request names, or (without ids) those its filters match.
    fn cancel_targets(&self, req: &v1::CancelRequest) -> Result<Vec<JobSelector>, Status> {
        if !req.jobs.is_empty() {
            return req.jobs.iter().map(convert::selector).collect();
        }
        let states: Vec<JobState> = req
            .states
            .iter()
            .map(|s| convert::state_from_proto(*s))
            .collect::<Result<_, _>>()?;
        if req.user.is_empty()
            && req.name.is_empty()
            && req.partition.is_empty()
            && req.account.is_empty()
            && states.is_empty()
        {
            return Err(Status::invalid_argument(
                "no job ids and no filters given (refusing to cancel everything)",
            ));
        }
        Ok(self
            .st
            .jobs()
            .filter(|j| !j.state.is_terminal() && j.array_job_id.is_none())
            .filter(|j| req.user.is_empty() || j.spec.user == req.user)
            .filter(|j| req.name.is_empty() || j.spec.name == req.name)
            .filter(|j| req.partition.is_empty() || j.spec.partition == req.partition)
            .filter(|j| req.account.is_empty() || j.spec.account == req.account)
            .filter(|j| states.is_empty() || states.contains(&j.state))
            .map(|j| JobSelector::job(j.id))
            .collect())
    }

    fn cancel(
        &mut self,
        who: &Identity,
        req: &v1::CancelRequest,
    ) -> Result<v1::CancelResponse, Status> {
        let targets = self.cancel_targets(req)?;
        let now = self.now();
        let by = Self::requester(who);
        let mut resp = v1::CancelResponse::default();
        for sel in targets {
            let Some(job) = self.st.job(sel.job) else {
                resp.errors.push(format!("Invalid job id specified: {sel}"));
                continue;
            };
            if !authz::may_control_job(who, job.spec.uid) {
                resp.errors.push(format!(
                    "Access/permission denied for job {sel} (owned by {})",
                    job.spec.user
                ));
                continue;
            }
            if req.signal != 0 {
                // Deliver a signal only; the job's state does not change.
                let nodes: Vec<String> = self
                    .st
                    .node_names(job)
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                if job.state != JobState::Running || nodes.is_empty() {
                    resp.errors
                        .push(format!("Job {sel} is not running; cannot signal it"));
                    continue;
                }
                let targets: Vec<String> = if req.batch_only {
                    nodes.into_iter().take(1).collect()
                } else {
                    nodes
                };
                for n in &targets {
                    self.signal_node(n, sel.job, req.signal, req.batch_only, "signal");
                }
                resp.cancelled.push(sel.job.0);
                continue;
            }
            match self.st.cancel(&sel, &by, now) {
                Ok(effects) => {
                    self.apply_effects(effects);
                    resp.cancelled.push(sel.job.0);
                }
                Err(e) => resp.errors.push(e.to_string()),
            }
        }
        if !resp.cancelled.is_empty() {
            self.pass_wanted = true;
        }
        Ok(resp)
    }

    fn update_job(
        &mut self,
        who: &Identity,
        req: &v1::UpdateJobRequest,
    ) -> Result<v1::UpdateJobResponse, Status> {
        let r = req
            .job
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("job: missing"))?;
        let sel = convert::selector(r)?;
        let job = self
            .st
            .job(sel.job)
            .ok_or_else(|| Status::not_found(format!("Invalid job id specified: {sel}")))?;
        if !authz::may_control_job(who, job.spec.uid) {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {sel} (owned by {})",
                job.spec.user
            )));
        }
        let by = Self::requester(who);
        let now = self.now();
        let to_status = |e: tandem_sched::state::JobError| match e {
            tandem_sched::state::JobError::NotFound(_) => Status::not_found(e.to_string()),
            tandem_sched::state::JobError::PermissionDenied { .. } => {
                Status::permission_denied(e.to_string())
            }
            _ => Status::failed_precondition(e.to_string()),
        };
        use v1::update_job_request::Action;
        match &req.action {
            Some(Action::Hold(true)) => self.st.hold(&sel, &by).map_err(to_status)?,
            Some(Action::Release(true)) => self.st.release(&sel, &by).map_err(to_status)?,
            Some(Action::Requeue(true)) => {
                let target = match &sel.tasks {
                    None => sel.job,
                    Some(t) if t.len() == 1 => {
                        let i = t.first().unwrap_or(0);
                        self.st
                            .array_task(sel.job, i)
                            .map(|j| j.id)
                            .ok_or_else(|| {
                                Status::not_found(format!("Invalid job id specified: {sel}"))
                            })?
                    }
                    Some(_) => {
                        return Err(Status::invalid_argument(
                            "requeue takes one job or one array task",
                        ));
                    }
                };
                let effects = self.st.requeue(target, &by, now).map_err(to_status)?;
                self.apply_effects(effects);
            }
            Some(Action::Update(u)) => {
                let upd = convert::job_update(u)?;
                if sel.tasks.is_some() {
                    return Err(Status::invalid_argument(
                        "update a whole job or array, not some of its tasks",
                    ));
                }
                self.st
                    .update_job(sel.job, upd, &by, now)
                    .map_err(to_status)?;
            }
            _ => return Err(Status::invalid_argument("action: missing")),
        }
        self.pass_wanted = true;
        Ok(v1::UpdateJobResponse {
            updated: vec![sel.job.0],
        })
    }

    fn job_info(&self, job: &Job) -> v1::JobInfo {
        self.job_info_with(job, JobFields::ALL)
    }

    fn job_info_with(&self, job: &Job, want: JobFields) -> v1::JobInfo {
        let mut info = convert::job_info_with(&self.st, job, want);
        if want.has(job_field::STEPS)
            && let Some(steps) = self.steps.get(&job.id)
        {
            let st = convert::state_to_proto(job.state);
            info.steps = steps.iter().map(|s| s.info(st)).collect();
        }
        info
    }

    fn list_jobs(&self, req: &v1::ListJobsRequest) -> Result<v1::ListJobsResponse, Status> {
        let selectors: Vec<JobSelector> = req
            .jobs
            .iter()
            .map(convert::selector)
            .collect::<Result<_, _>>()?;
        let states: Vec<JobState> = req
            .states
            .iter()
            .map(|s| convert::state_from_proto(*s))
            .collect::<Result<_, _>>()?;
        let want = JobFields::from_names(&req.fields)?;
        let any = |v: &[String], x: &str| v.is_empty() || v.iter().any(|s| s == x);
        // Sized for "every job" up front: growing a vector of 100,000 records copies it
        // several times over, and untouched capacity costs no memory.
        let mut out = Vec::with_capacity(if selectors.is_empty() {
            self.st.jobs().size_hint().0
        } else {
            0
        });
        let mut consider = |job: &Job| {
            if !any(&req.users, &job.spec.user)
                || !any(&req.partitions, &job.spec.partition)
                || !any(&req.names, &job.spec.name)
                || !any(&req.accounts, &job.spec.account)
            {
                return;
            }
            if job.state.is_terminal() && !req.include_finished {
                return;
            }
            match &job.array {
                Some(a) => {
                    // The meta record stands for its pending indices only; started tasks
                    // are their own records.
                    if a.pending.is_empty() || job.state.is_terminal() {
                        return;
                    }
                    if !states.is_empty() && !states.contains(&JobState::Pending) {
                        return;
                    }
                    let info = self.job_info_with(job, want);
                    if req.fold_arrays {
                        out.push(info);
                    } else {
                        for i in a.pending.iter() {
                            let mut t = info.clone();
                            t.array_task_id = i64::from(i);
                            t.array_pending = String::new();
                            t.state = v1::JobState::Pending as i32;
                            out.push(t);
                        }
                    }
                }
                None => {
                    if !states.is_empty() && !states.contains(&job.state) {
                        return;
                    }
                    out.push(self.job_info_with(job, want));
                }
            }
        };
        let mut pending_tasks = Vec::new();
        if selectors.is_empty() {
            for job in self.st.jobs() {
                consider(job);
            }
        } else {
            for sel in &selectors {
                let Some(job) = self.st.job(sel.job) else {
                    continue;
                };
                match (&sel.tasks, &job.array) {
                    (None, Some(a)) => {
                        consider(job);
                        for (_, t) in &a.tasks {
                            if let Some(tj) = self.st.job(*t) {
                                consider(tj);
                            }
                        }
                    }
                    (Some(tasks), Some(a)) => {
                        for i in tasks.iter() {
                            if let Some(tj) = self.st.array_task(sel.job, i) {
                                consider(tj);
                            } else if a.pending.contains(i)
                                && !job.state.is_terminal()
                                && (states.is_empty() || states.contains(&JobState::Pending))
                            {
                                // A pending index has no record of its own yet.
                                let mut t = self.job_info_with(job, want);
                                t.array_task_id = i64::from(i);
                                t.array_pending = String::new();
                                t.state = v1::JobState::Pending as i32;
                                pending_tasks.push(t);
                            }
                        }
                    }
                    _ => consider(job),
                }
            }
        }
        out.extend(pending_tasks);
        Ok(v1::ListJobsResponse {
            jobs: out,
            now: self.now(),
        })
    }

    fn watch(&mut self, job: JobId, tx: WatchTx) -> Result<(), Status> {
        let Some(j) = self.st.job(job) else {
            return Err(Status::not_found(format!(
                "Invalid job id specified: {job}"
            )));
        };
        let info = self.job_info(j);
        let terminal = j.state.is_terminal();
        let _ = tx.send(Ok(info));
        if !terminal {
            self.watchers.entry(job).or_default().push(tx);
        }
        Ok(())
    }

    // === steps ===

    fn create_step(
        &mut self,
        who: &Identity,
        req: &v1::CreateStepRequest,
    ) -> Result<v1::CreateStepResponse, Status> {
        let id = JobId(req.job_id);
        let job = self
            .st
            .job(id)
            .ok_or_else(|| Status::not_found(format!("Invalid job id specified: {id}")))?;
        if !authz::may_run_step(who, job.spec.uid) {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {id} (owned by {})",
                job.spec.user
            )));
        }
        let Some(alloc) = job
            .alloc
            .as_deref()
            .filter(|_| job.state == JobState::Running)
        else {
            return Err(Status::failed_precondition(format!(
                "job {id} is {}: steps run only inside a running allocation",
                job.state
            )));
        };
        let names = self.st.node_names(job);
        let nodes: Vec<steps::AllocNode> = alloc
            .nodes
            .iter()
            .zip(&names)
            .map(|(na, name)| steps::AllocNode {
                name: (*name).to_owned(),
                cpus: na.cpus,
                gpus: na.gpus.clone(),
            })
            .collect();
        let placed = steps::place(&nodes, req, job.shape.ntasks, job.shape.tasks_per_node)
            .map_err(Status::invalid_argument)?;
        let list = self.steps.entry(id).or_default();
        let step_id = list.iter().map(|s| s.step_id + 1).max().unwrap_or(0);
        let now = unix_now();
        let step_names: Vec<&str> = placed.iter().map(|p| nodes[p.node].name.as_str()).collect();
        let nodelist = tandem_sched::hostlist::compress(&step_names);
        let ntasks: u32 = placed.iter().map(|p| p.task_ids.len() as u32).sum();
        let rec = StepRec {
            step_id,
            name: if req.name.is_empty() {
                req.argv.first().cloned().unwrap_or_default()
            } else {
                req.name.clone()
            },
            nodelist: nodelist.clone(),
            ntasks,
            start_time: now,
            end_time: None,
            exit_code: 0,
            signal: 0,
            cpus: placed.iter().map(|p| nodes[p.node].cpus).sum(),
            gpus: placed.iter().map(|p| p.gpus.len() as u32).sum(),
        };
        let targets = placed
            .iter()
            .map(|p| v1::StepTarget {
                node: nodes[p.node].name.clone(),
                address: self.workers.step_address(&nodes[p.node].name).to_owned(),
                task_ids: p.task_ids.clone(),
                gpus: p.gpus.clone(),
                node_index: u32::try_from(p.node).unwrap_or(u32::MAX),
                cpus: nodes[p.node].cpus,
            })
            .collect();
        let (uid, gid) = (job.spec.uid, job.spec.gid);
        self.batch
            .steps
            .push((id.0, step_id, serde_json::to_vec(&rec).unwrap_or_default()));
        list.push(rec);
        // The launch credential: workers run this step's tasks only with it (job, step,
        // the step's nodes, the job's user, a short expiry).
        let token = self.key.issue_step(
            &tandem_proto::auth::StepGrant {
                job_id: id.0,
                step_id,
                nodes: step_names.iter().map(|n| (*n).to_owned()).collect(),
                uid,
                gid,
                exp: 0,
            },
            now,
            authz::STEP_GRANT_LIFETIME,
        );
        Ok(v1::CreateStepResponse {
            job_id: id.0,
            step_id,
            targets,
            nodelist,
            ntasks,
            launch_token: token,
        })
    }

    fn complete_step(
        &mut self,
        who: &Identity,
        job_id: u64,
        step_id: u32,
        exit_code: i32,
        signal: i32,
    ) -> Result<(), Status> {
        let id = JobId(job_id);
        if let Some(job) = self.st.job(id)
            && who.role != Role::Worker
            && !authz::may_run_step(who, job.spec.uid)
        {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {id}"
            )));
        }
        let rec = self
            .steps
            .get_mut(&id)
            .and_then(|l| l.iter_mut().find(|s| s.step_id == step_id))
            .ok_or_else(|| Status::not_found(format!("no step {job_id}.{step_id}")))?;
        // srun's report (worst task) is final; a worker's per-node report only fills in
        // when srun never called.
        if rec.end_time.is_some() && who.role == Role::Worker {
            return Ok(());
        }
        rec.end_time = Some(unix_now());
        rec.exit_code = exit_code;
        rec.signal = signal;
        let bytes = serde_json::to_vec(&*rec).unwrap_or_default();
        self.batch.steps.push((job_id, step_id, bytes));
        Ok(())
    }

    // === nodes ===

    fn list_nodes(&self, req: &v1::ListNodesRequest) -> Result<v1::ListNodesResponse, Status> {
        let wanted: Option<HashSet<String>> = if req.nodes.trim().is_empty() {
            None
        } else {
            Some(
                tandem_sched::hostlist::expand(&req.nodes)
                    .map_err(|e| Status::invalid_argument(format!("nodes: {e}")))?
                    .into_iter()
                    .collect(),
            )
        };
        let nodes = self
            .st
            .nodes()
            .filter(|n| wanted.as_ref().is_none_or(|w| w.contains(&n.name)))
            .filter(|n| req.partition.is_empty() || n.partitions.contains(&req.partition))
            .map(|n| {
                let mut info = convert::node_info(
                    n,
                    self.workers.step_address(&n.name),
                    self.workers.version(&n.name),
                );
                info.busy_until = self.busy_until(n);
                info
            })
            .collect();
        Ok(v1::ListNodesResponse { nodes })
    }

    fn update_node(
        &mut self,
        who: &Identity,
        req: &v1::UpdateNodeRequest,
    ) -> Result<v1::UpdateNodeResponse, Status> {
        if !authz::may_update_node(who) {
            return Err(Status::permission_denied(
                "only an operator (root or admin) may change nodes",
            ));
        }
        let names = tandem_sched::hostlist::expand(&req.nodes)
            .map_err(|e| Status::invalid_argument(format!("nodes: {e}")))?;
        if names.is_empty() {
            return Err(Status::invalid_argument("nodes: none given"));
        }
        for n in &names {
            if self.st.node_by_name(n).is_none() {
                return Err(Status::not_found(format!("unknown node {n:?}")));
            }
        }
        let state = req.state.to_ascii_uppercase();
        let reason = if req.reason.trim().is_empty() {
            format!("set {state} by {}", who.user)
        } else {
            req.reason.clone()
        };
        if !matches!(state.as_str(), "DRAIN" | "RESUME" | "UNDRAIN" | "DOWN") {
            return Err(Status::invalid_argument(format!(
                "state: {:?} is not DRAIN, RESUME, UNDRAIN or DOWN",
                req.state
            )));
        }
        let now = self.now();
        for n in &names {
            let r = match state.as_str() {
                "DRAIN" => self.st.drain(n, &reason),
                // The worker stays attached; the node stays DOWN until resumed.
                "DOWN" => self
                    .st
                    .node_lost(n, &reason, now)
                    .map(|effects| self.apply_effects(effects)),
                _ => {
                    let down = self
                        .st
                        .node_by_name(n)
                        .is_some_and(|x| x.health == Health::Down);
                    let r = self.st.resume(n);
                    if down && r.is_ok() {
                        // A DOWN node comes back when its worker registers: end the
                        // current stream so a live worker re-registers at once.
                        self.workers.lost(n);
                    }
                    r
                }
            };
            r.map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        self.pass_wanted = true;
        Ok(v1::UpdateNodeResponse { updated: names })
    }

    // === workers ===

    fn register(
        &mut self,
        conn: ConnId,
        reg: v1::Register,
        tx: WorkerTx,
    ) -> Result<String, Status> {
        let now = self.now();
        let res = reg.resources.clone().unwrap_or_default();
        // Ends reported for the time the link was down come first, so those jobs are not
        // mistaken for jobs lost with the node.
        for ended in &reg.ended_while_disconnected {
            self.job_ended(reg.node_name.trim(), ended, now);
        }
        let registration = NodeRegistration {
            name: reg.node_name.clone(),
            total: tandem_sched::Tres {
                cpus: res.cpus,
                mem_mb: res.mem_mb,
                gpus: res.gpus,
            },
            gpu_type: (!res.gpu_type.is_empty()).then(|| res.gpu_type.clone()),
            features: reg.features.clone(),
            partitions: reg.partitions.clone(),
            running_jobs: reg.running_jobs.iter().map(|j| JobId(*j)).collect(),
        };
        let effects = self
            .st
            .register_node(registration, now)
            .map_err(|e| Status::invalid_argument(format!("register: {e}")))?;
        let name = reg.node_name.trim().to_owned();
        let _ = tx.send(Ok(v1::ControllerMessage {
            msg: Some(controller_message::Msg::Registered(v1::Registered {
                cluster_name: self.st.config().cluster_name.clone(),
                heartbeat_interval_ms: u64::try_from(self.cfg.heartbeat_interval.as_millis())
                    .unwrap_or(u64::MAX),
            })),
        }));
        self.workers.connected(
            &name,
            conn,
            tx,
            reg.step_address.clone(),
            reg.version.clone(),
            Instant::now(),
        );
        info!(node = %name, cpus = res.cpus, gpus = res.gpus, running = reg.running_jobs.len(), "worker registered");
        self.apply_effects(effects);
        self.pass_wanted = true;
        Ok(name)
    }

    /// A worker's report of a batch script's end. Only the job's current batch node may end
    /// it: a worker back from the dead may report a run that was requeued and restarted
    /// elsewhere meanwhile.
    fn job_ended(&mut self, node: &str, e: &v1::JobEnded, now: i64) {
        let outcome = JobOutcome {
            exit_code: e.exit_code,
            signal: e.signal,
            timed_out: e.timed_out,
            cancelled: e.cancelled,
            launch_error: (!e.launch_error.is_empty()).then(|| e.launch_error.clone()),
            out_of_memory: e.out_of_memory,
        };
        let end = if e.end_time > 0 { e.end_time } else { now };
        match self.st.job_ended_on(node, JobId(e.job_id), outcome, end) {
            Ok(effects) => {
                self.apply_effects(effects);
                self.timeout_signalled.remove(&JobId(e.job_id));
                self.pass_wanted = true;
            }
            Err(err) => debug!(job_id = e.job_id, error = %err, "ignoring job end"),
        }
    }

    fn worker_event(&mut self, conn: ConnId, node: &str, msg: worker_message::Msg) {
        if !self.workers.heard(node, conn, Instant::now()) {
            // A stream replaced by a newer one of the same node: its news is stale.
            return;
        }
        let now = self.now();
        match msg {
            worker_message::Msg::Register(_) => {
                warn!(node = %node, "second Register on one stream ignored");
            }
            worker_message::Msg::Heartbeat(_) => {
                let _ = self.st.heartbeat(node, now);
            }
            worker_message::Msg::JobStarted(s) => {
                let job = self.st.job(JobId(s.job_id));
                let host = job.and_then(|j| self.st.node_names(j).first().copied());
                let current = job.and_then(|j| j.start_time);
                if !authz::may_report_start(host, node, current, s.start_time, now) {
                    warn!(node = %node, job_id = s.job_id, "refused a start report for a job this node does not host");
                } else if let Err(e) = self.st.job_started(JobId(s.job_id), s.start_time) {
                    debug!(job_id = s.job_id, error = %e, "ignoring job start");
                }
            }
            worker_message::Msg::JobEnded(e) => self.job_ended(node, &e, now),
            worker_message::Msg::StepEnded(s) => {
                let on_node = self
                    .st
                    .job(JobId(s.job_id))
                    .is_some_and(|j| self.st.node_names(j).contains(&node));
                if !on_node {
                    warn!(node = %node, job_id = s.job_id, "refused a step report for a job not on this node");
                    return;
                }
                let worker = Identity::worker(node, 0, 0);
                let _ = self.complete_step(&worker, s.job_id, s.step_id, s.exit_code, s.signal);
            }
        }
    }

    fn signal_node(&self, node: &str, job: JobId, signal: i32, batch_only: bool, reason: &str) {
        let msg = controller_message::Msg::SignalJob(v1::SignalJob {
            job_id: job.0,
            signal,
            batch_only,
            reason: reason.to_owned(),
            grace_s: 0,
        });
        if !self.workers.send(node, msg) {
            debug!(node = %node, job_id = job.0, "signal not sent: worker not connected");
        }
    }

    /// Turns the core's effects into after-commit sends and accounting rows.
    fn apply_effects(&mut self, effects: Vec<CoreEffect>) {
        for e in effects {
            match e {
                CoreEffect::Terminate {
                    job,
                    nodes,
                    reason,
                    grace_s,
                } => {
                    for n in nodes {
                        if let Some(name) = self.st.node(n).map(|x| x.name.clone()) {
                            self.send_after_commit(
                                &name,
                                controller_message::Msg::SignalJob(v1::SignalJob {
                                    job_id: job.0,
                                    signal: 0,
                                    batch_only: false,
                                    reason: reason.name().to_owned(),
                                    grace_s,
                                }),
                            );
                        }
                    }
                }
                CoreEffect::Abandon { job, node } => {
                    if let Some(name) = self.st.node(node).map(|x| x.name.clone()) {
                        info!(job_id = job.0, node = %name, "worker runs an unknown job: abandoning it");
                        self.send_after_commit(
                            &name,
                            controller_message::Msg::AbandonJob(v1::AbandonJob { job_id: job.0 }),
                        );
                    }
                }
                CoreEffect::RunEnded(rec) => self.record_run(&rec),
            }
        }
    }

    fn send_after_commit(&mut self, node: &str, msg: controller_message::Msg) {
        let Some(tx) = self.workers.sender(node) else {
            debug!(node = %node, "message dropped: worker not connected");
            return;
        };
        self.effects
            .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                if r.is_ok() {
                    let _ = tx.send(Ok(v1::ControllerMessage { msg: Some(msg) }));
                }
            }));
    }

    /// The accounting row of a run that ended (the job record itself no longer shows the
    /// run's nodes, and a requeued job not even its state).
    fn record_run(&mut self, rec: &RunRecord) {
        let Some(job) = self.st.job(rec.job) else {
            return;
        };
        let mut info = self.job_info(job);
        info.state = convert::state_to_proto(rec.state) as i32;
        info.start_time = rec.start_time.unwrap_or(0);
        info.end_time = rec.end_time;
        info.exit_code = rec.exit_code;
        info.exit_signal = rec.signal;
        let names: Vec<&str> = rec
            .nodes
            .iter()
            .filter_map(|n| self.st.node(*n).map(|x| x.name.as_str()))
            .collect();
        info.nodelist = tandem_sched::hostlist::compress(&names);
        info.num_nodes = names.len() as u32;
        if rec.requeued {
            info.reason = String::new();
        }
        let batch_host = names.first().copied().unwrap_or_default().to_owned();
        let run = if rec.requeued {
            job.restarts.saturating_sub(1)
        } else {
            job.restarts
        };
        let row = record_row(job, run, &info, &batch_host);
        self.batch.records.push(row);
        if rec.requeued && self.steps.remove(&rec.job).is_some() {
            self.batch.removed_steps.push(rec.job.0);
        }
    }

    // === flush, pass, tick ===

    /// Persists everything changed since the last flush in one batch, with the effects
    /// gathered meanwhile. Returns the rows written.
    fn flush(&mut self) -> usize {
        let changes = self.st.take_changes();
        let mut batch = std::mem::take(&mut self.batch);
        if !changes.jobs.is_empty() || !changes.removed_jobs.is_empty() {
            batch
                .meta
                .push(("next_job_id".into(), self.st.next_job_id().to_string()));
        }
        for id in &changes.jobs {
            let Some(job) = self.st.job(*id) else {
                continue;
            };
            match serde_json::to_vec(job) {
                Ok(bytes) => batch.jobs.push((id.0, bytes)),
                Err(e) => warn!(job_id = id.0, error = %e, "cannot serialize job"),
            }
            if job.state.is_terminal() {
                // Runs are recorded when they end (`record_run`); this covers jobs that
                // ended without running (cancelled while pending).
                let recordable = job.start_time.is_none()
                    && match &job.array {
                        None => true,
                        // A meta gets its own line only if indices never ran (cancelled while
                        // pending), as Slurm shows `12_[5-9]` CANCELLED.
                        Some(a) => a.tasks.is_empty(),
                    };
                if recordable {
                    let info = self.job_info(job);
                    batch.records.push(record_row(job, job.restarts, &info, ""));
                }
                if self.steps.remove(id).is_some() {
                    batch.removed_steps.push(id.0);
                }
            }
            if let Some(ws) = self.watchers.get(id) {
                let info = self.job_info(job);
                let ws = if job.state.is_terminal() {
                    self.watchers.remove(id).unwrap_or_default()
                } else {
                    ws.clone()
                };
                self.effects
                    .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                        if r.is_ok() {
                            for w in ws {
                                let _ = w.send(Ok(info.clone()));
                            }
                        }
                    }));
            }
        }
        for id in &changes.removed_jobs {
            batch.removed_jobs.push(id.0);
            batch.removed_payloads.push(id.0);
            if self.steps.remove(id).is_some() {
                batch.removed_steps.push(id.0);
            }
            self.watchers.remove(id);
        }
        for nid in &changes.nodes {
            if let Some(n) = self.st.node(*nid) {
                match serde_json::to_vec(n) {
                    Ok(bytes) => batch.nodes.push((n.name.clone(), n.id.0, bytes)),
                    Err(e) => warn!(node = %n.name, error = %e, "cannot serialize node"),
                }
            }
        }
        if changes.config
            && let Ok(c) = serde_json::to_string(self.st.config())
        {
            batch.meta.push(("cluster_config".into(), c));
        }
        if changes.assoc {
            if let Ok(t) = serde_json::to_string(self.st.assoc()) {
                batch.meta.push(("assoc_tree".into(), t));
            }
            if let Some(t) = self.st.usage_charged_at() {
                batch.meta.push(("usage_charged_at".into(), t.to_string()));
            }
        }
        let effects = std::mem::take(&mut self.effects);
        if batch.is_empty() && effects.is_empty() {
            return 0;
        }
        let rows = batch.rows();
        if let Err(e) = self.committer.submit(batch, effects) {
            // The committer died after a failed commit; nothing more can be made durable.
            warn!(error = %e, "store is gone; stopping");
            self.stopping = true;
        }
        rows
    }

    fn pass(&mut self) {
        self.pass_wanted = false;
        let started = Instant::now();
        let now = self.now();
        let mut phases = PhaseTimer::default();
        let plan = tandem_sched::cycle::schedule_observed(&mut self.st, now, &mut phases);
        let sched_us = started.elapsed().as_micros() as u64;
        let n_starts = plan.starts.len();
        for start in &plan.starts {
            self.launch(start, now);
        }
        for p in &plan.preemptions {
            for n in &p.nodes {
                if let Some(name) = self.st.node(*n).map(|x| x.name.clone()) {
                    self.send_after_commit(
                        &name,
                        controller_message::Msg::SignalJob(v1::SignalJob {
                            job_id: p.job.0,
                            signal: 0,
                            batch_only: false,
                            reason: "preempt".into(),
                            // The victim's QOS GraceTime: the worker sends SIGTERM now
                            // and starts the KillWait countdown only after it.
                            grace_s: p.grace_s,
                        }),
                    );
                }
            }
        }
        let dispatch_us = started.elapsed().as_micros() as u64 - sched_us;
        let rows = self.flush();
        let total = started.elapsed();
        self.metrics.pass(n_starts, total.as_micros() as u64);
        // Cap scheduling at half the actor's time: the next pass waits as long as this
        // one took.
        self.next_pass_at = Instant::now() + total;
        if n_starts > 0 || !plan.preemptions.is_empty() || sched_us > 10_000 {
            info!(
                considered = plan.stats.considered,
                eligible = plan.stats.eligible,
                started = n_starts,
                preempted = plan.preemptions.len(),
                reservations = plan.stats.reservations,
                sched_us,
                usage_us = phases.us(Phase::Usage),
                eligible_us = phases.us(Phase::Eligible),
                order_us = phases.us(Phase::Order),
                place_us = phases.us(Phase::Place),
                preempt_us = phases.us(Phase::Preempt),
                apply_us = phases.us(Phase::Apply),
                dispatch_us,
                rows,
                "scheduling pass"
            );
        } else {
            debug!(
                considered = plan.stats.considered,
                sched_us, "scheduling pass"
            );
        }
        self.publish_demand();
    }

    fn launch(&mut self, start: &tandem_sched::Start, now: i64) {
        let Some(job) = self.st.job(start.job) else {
            return;
        };
        let Some(first) = start.nodes.first() else {
            return;
        };
        let facts = self.launch_facts(job, start, now);
        let nodelist = self.st.nodelist(job);
        let payload_id = job.array_job_id.unwrap_or(job.id).0;
        let job_id = job.id;
        let time_limit = job.time_limit.unwrap_or(0);
        let kill_wait = u32::try_from(self.cfg.kill_wait.as_secs()).unwrap_or(u32::MAX);
        let gpus = first.gpus.clone();
        let tx = self.workers.sender(&first.name);
        let node = first.name.clone();
        let failed = self.launch_failed_tx.clone();
        self.effects.push(Box::new(move |store: &Store, r: Result<(), &StoreError>| {
            if r.is_err() {
                return;
            }
            let payload = match store.load_payload(payload_id) {
                Ok(Some(bytes)) => Payload::decode(&bytes).map_err(|e| e.to_string()),
                Ok(None) => Err(format!("payload of job {payload_id} is missing")),
                Err(e) => Err(e.to_string()),
            };
            let payload = match payload {
                Ok(p) => p,
                Err(error) => {
                    let _ = failed.send((job_id, error));
                    return;
                }
            };
            let (stdout, stderr) = launch::output_paths(&facts, &payload);
            let stdin = launch::input_path(&facts, &payload);
            let environment = launch::job_environment(&facts, &payload, &nodelist);
            let msg = v1::LaunchJob {
                job_id: job_id.0,
                name: facts.name.clone(),
                user: facts.user.clone(),
                uid: facts.uid,
                gid: facts.gid,
                script: payload.script,
                argv: payload.argv,
                workdir: payload.workdir,
                environment: environment.into_iter().collect(),
                stdout,
                stderr,
                time_limit_s: time_limit,
                gpus,
                kill_wait_s: kill_wait,
                start_time: facts.start_time,
                stdin,
                open_append: payload.open_append,
                signal_number: payload.signal.map_or(0, |w| w.number),
                signal_before_s: payload.signal.map_or(0, |w| w.before_s),
                signal_batch_only: payload.signal.is_some_and(|w| w.batch_only),
                mem_mb: facts.mem_per_node_mb,
                cpus: facts.cpus_per_node.first().copied().unwrap_or(0),
            };
            let sent = tx.is_some_and(|tx| {
                tx.send(Ok(v1::ControllerMessage {
                    msg: Some(controller_message::Msg::LaunchJob(msg)),
                }))
                .is_ok()
            });
            if !sent {
                // The worker's stream is gone; when it re-registers without this job the
                // core ends it NODE_FAIL (requeued when allowed), and a worker that never
                // returns times out the same way.
                warn!(job_id = job_id.0, node = %node, "launch not delivered: worker not connected");
            }
        }));
    }

    fn launch_facts(&self, job: &Job, start: &tandem_sched::Start, now: i64) -> LaunchFacts {
        let array = job.array_job_id.and_then(|meta| {
            let m = self.st.job(meta)?;
            let spec = m.spec.array.as_deref()?;
            Some(ArrayFacts {
                array_job_id: meta.0,
                task_id: job.array_task_id.unwrap_or(0),
                count: spec.indices.len(),
                min: spec.indices.first().unwrap_or(0),
                max: spec.indices.last().unwrap_or(0),
                step: spec.indices.step(),
            })
        });
        LaunchFacts {
            job_id: job.id.0,
            name: job.spec.name.clone(),
            user: job.spec.user.clone(),
            uid: job.spec.uid,
            gid: job.spec.gid,
            partition: job.spec.partition.clone(),
            account: job.spec.account.clone(),
            qos: job.spec.qos.clone(),
            cluster_name: self.st.config().cluster_name.clone(),
            nodes: start.nodes.iter().map(|n| n.name.clone()).collect(),
            cpus_per_node: start.nodes.iter().map(|n| n.cpus).collect(),
            mem_per_node_mb: job.shape.per_node.mem_mb,
            ntasks: job.shape.ntasks,
            tasks_per_node: job.shape.tasks_per_node,
            ntasks_given: job.spec.ntasks > 0 || job.spec.ntasks_per_node > 0,
            tasks_per_node_given: job.spec.ntasks_per_node > 0,
            cpus_per_task: job.spec.cpus_per_task,
            gpus_total: start.nodes.iter().map(|n| n.gpus.len() as u32).sum(),
            batch_node_gpus: start
                .nodes
                .first()
                .map(|n| n.gpus.clone())
                .unwrap_or_default(),
            array,
            start_time: job.start_time.unwrap_or(now),
            time_limit_s: job.time_limit,
            restarts: job.restarts,
        }
    }

    fn tick(&mut self) {
        let now_i = Instant::now();
        let now = self.now();
        // A pass whose demand was not published (too soon after the last) is, now.
        self.metrics.publish_if_stale(&self.st, now);
        // Lost workers.
        let lost: Vec<String> = self
            .st
            .nodes()
            .filter(|n| n.health != Health::Down)
            .filter(|n| self.workers.silence(&n.name, now_i) > self.cfg.node_timeout)
            .map(|n| n.name.clone())
            .collect();
        for name in lost {
            warn!(node = %name, timeout_ms = self.cfg.node_timeout.as_millis() as u64, "worker not responding: node DOWN");
            if let Ok(effects) = self.st.node_lost(&name, "Not responding", now) {
                self.apply_effects(effects);
            }
            self.workers.lost(&name);
            self.pass_wanted = true;
        }
        // Safety net for time limits the worker should have enforced.
        let kill_wait = i64::try_from(self.cfg.kill_wait.as_secs()).unwrap_or(i64::MAX);
        let overdue: Vec<(JobId, Vec<String>)> = self
            .st
            .running_jobs()
            .filter(|j| !self.timeout_signalled.contains(&j.id))
            .filter(|j| {
                j.expected_end().is_some_and(|e| {
                    now > e.saturating_add(kill_wait).saturating_add(TIMEOUT_SLACK_S)
                })
            })
            .map(|j| {
                (
                    j.id,
                    self.st
                        .node_names(j)
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                )
            })
            .collect();
        for (id, nodes) in overdue {
            warn!(
                job_id = id.0,
                "job overran its time limit unreported; signalling its nodes"
            );
            for n in &nodes {
                self.signal_node(n, id, 0, false, "timeout");
            }
            self.timeout_signalled.insert(id);
        }
        // Periodic work.
        if now_i >= self.next_periodic_pass {
            // Begin times and time-based eligibility have no event of their own.
            if self.st.pending_jobs().next().is_some() {
                self.pass_wanted = true;
            }
            self.next_periodic_pass = now_i + self.cfg.sched_interval;
        }
        if now_i >= self.next_purge {
            let purged = self.st.purge_finished(now - MIN_JOB_AGE_S);
            if !purged.is_empty() {
                debug!(purged = purged.len(), "purged finished jobs from memory");
            }
            let before = now - IDEMPOTENCY_TTL_S;
            let n = self.idem.len();
            self.idem.retain(|_, (_, t)| *t >= before);
            if self.idem.len() != n {
                self.batch.expire_idempotency_before = Some(before);
            }
            self.next_purge = now_i + Duration::from_secs(10);
        }
    }

    /// Whether any node could take more work now.
    fn capacity_available(&self) -> bool {
        self.st.nodes().any(|n| {
            let free = n.free();
            n.schedulable() && free.cpus > 0
        })
    }

    /// Gauges and the scaler's demand snapshot, from what the pass left (at most every
    /// `metrics::PUBLISH_EVERY`; the tick publishes what a burst of passes left).
    fn publish_demand(&self) {
        self.metrics.pass_done(&self.st, self.now());
    }
}

/// What a newly submitted job asks of the scheduling loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassTrigger {
    /// It cannot start now: no pass.
    None,
    /// A pass only if some node has free resources.
    IfCapacity,
    /// A pass even on a full cluster: its QOS may preempt.
    Now,
}

/// A held job, or one that begins later, cannot start now, so it triggers no pass (a release
/// triggers one, the periodic pass covers begin times). Passes walk every pending job: a
/// flood of held submits that each caused one would make submit cost grow with the queue.
fn submit_pass_trigger(job: &Job, preempts: bool, now: i64) -> PassTrigger {
    let may_start = job.hold == Hold::None && job.spec.begin.is_none_or(|b| b <= now);
    match (may_start, preempts) {
        (false, _) => PassTrigger::None,
        (true, true) => PassTrigger::Now,
        (true, false) => PassTrigger::IfCapacity,
    }
}

/// Times the phases of one pass (the core has no clock; it reports phase boundaries).
#[derive(Default)]
struct PhaseTimer {
    current: Option<(Phase, Instant)>,
    done: Vec<(Phase, Duration)>,
}

impl PassObserver for PhaseTimer {
    fn phase(&mut self, phase: Phase) {
        let now = Instant::now();
        if let Some((p, t)) = self.current.take() {
            self.done.push((p, now - t));
        }
        self.current = Some((phase, now));
    }
}

impl PhaseTimer {
    fn us(&self, phase: Phase) -> u64 {
        self.done
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, d)| d.as_micros() as u64)
            .sum()
    }
}

/// The accounting row of one run.
fn record_row(job: &Job, run: u32, info: &v1::JobInfo, batch_host: &str) -> JobRecordRow {
    let mut info = info.clone();
    // sacct's `JOBID.batch` line: the batch script's own step.
    if info.start_time > 0 {
        info.steps.insert(
            0,
            v1::StepInfo {
                step_id: "batch".into(),
                name: "batch".into(),
                state: info.state,
                nodelist: batch_host.to_owned(),
                ntasks: 1,
                start_time: info.start_time,
                end_time: info.end_time,
                exit_code: info.exit_code,
                signal: info.exit_signal,
                tres: info.tres.clone(),
            },
        );
    }
    let state = v1::JobState::try_from(info.state)
        .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_owned())
        .unwrap_or_default();
    JobRecordRow {
        id: job.id.0,
        run,
        array_job_id: job
            .array_job_id
            .map(|a| a.0)
            .or(job.array.as_ref().map(|_| job.id.0)),
        array_task_id: job.array_task_id,
        user: job.spec.user.clone(),
        account: job.spec.account.clone(),
        partition: job.spec.partition.clone(),
        name: job.spec.name.clone(),
        state,
        submit_time: job.submit_time,
        start_time: (info.start_time > 0).then_some(info.start_time),
        end_time: if info.end_time > 0 {
            info.end_time
        } else {
            unix_now()
        },
        record: info.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_jobs_that_may_start_now_trigger_a_pass() {
        let now = 1_000;
        let plain = Job::test(JobId(1), JobSpec::test());
        assert_eq!(
            submit_pass_trigger(&plain, false, now),
            PassTrigger::IfCapacity
        );
        assert_eq!(submit_pass_trigger(&plain, true, now), PassTrigger::Now);
        let mut held = Job::test(JobId(2), JobSpec::test());
        held.hold = Hold::User;
        assert_eq!(submit_pass_trigger(&held, true, now), PassTrigger::None);
        held.hold = Hold::Admin;
        assert_eq!(submit_pass_trigger(&held, false, now), PassTrigger::None);
        let later = Job::test(JobId(3), JobSpec::test().begin(now + 60));
        assert_eq!(submit_pass_trigger(&later, false, now), PassTrigger::None);
        let due = Job::test(JobId(4), JobSpec::test().begin(now));
        assert_eq!(
            submit_pass_trigger(&due, false, now),
            PassTrigger::IfCapacity
        );
    }
}
