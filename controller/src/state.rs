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
//! - Passes are event driven (end, node change, cancel, update want one; a submit
//!   does when some node has free resources or its QOS may preempt, unless the job is held
//!   or begins later, so a flood of held submits costs no pass); triggers during a pass
//!   coalesce into one more pass. A pass starts no sooner than its predecessor's duration
//!   after it ended, bounding scheduling to half the actor's time under a flood of events
//!   while keeping an idle cluster's submit-to-start immediate. A slow timer adds a pass for
//!   time-based eligibility (`--begin`) only. See `state/pacing.rs`.
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
use tandem_net::auth::{ClusterKey, Identity, Role, unix_now};
use tandem_proto::v1::{self, controller_message, worker_message};
use tandem_sched::cycle::{PassObserver, Phase};
use tandem_sched::effect::{Effect as CoreEffect, RunRecord};
use tandem_sched::job::{Hold, Job, JobOutcome, JobSpec, JobState};
use tandem_sched::node::Health;
use tandem_sched::state::{JobSelector, NodeRegistration, Requester};
use tandem_sched::{JobId, State};
use tokio::sync::oneshot;
use tonic::Status;
use tracing::{debug, info, warn};

mod accounting;
mod effects;
mod job_steps;
mod jobs;
mod launch_msg;
mod node_admin;
mod nodes;
mod pacing;
mod pass;
mod persist;
mod placeholders;
mod step_table;
mod timers;
mod view;
mod watch;
mod worker_link;
pub use accounting::AcctChange;
pub use jobs::{
    CancelFailure, CancelFailureKind, CancelJobs, CancelTargets, Cancelled, JobFilter, Submitted,
};
pub use node_admin::{NodesRemoved, RemoveNodes};
use view::ViewPublisher;
pub use view::{ReadView, SharedView};

use crate::api::convert::{JobFields, job_field};
use crate::api::{authz, convert};
use crate::config::Config;
use crate::launch::{self, ArrayFacts, LaunchFacts, Payload};
use crate::metrics::Metrics;
use crate::steps::{self, StepRec};
use crate::store::{Batch, Committer, Effect, JobRecordRow, Store, StoreError};
use crate::workers::{ConnId, Reported, WorkerTx, Workers};

pub type Reply<T> = oneshot::Sender<Result<T, Status>>;
/// A read over the live state at `now` that answers its caller itself ([`Command::Read`]).
pub type StateRead = Box<dyn FnOnce(&State, i64) + Send>;
pub use watch::WatchTx;
pub type PlaceholderTx = tokio::sync::mpsc::Sender<Result<v1::PlaceholderEvent, Status>>;
/// Events a bridge may have unread before its stream is ended (it subscribes again and
/// gets a fresh snapshot): a stalled subscriber costs bounded memory.
pub const PLACEHOLDER_STREAM_DEPTH: usize = 65_536;

/// Finished jobs stay in memory (squeue/scontrol show them) this long, like Slurm's
/// MinJobAge; their accounting records stay in the store for good.
const MIN_JOB_AGE_S: i64 = 300;
/// Retried submits arrive within seconds; keys older than this are forgotten.
const IDEMPOTENCY_TTL_S: i64 = 3600;
/// Requests queued for the actor at most; past it clients get `RESOURCE_EXHAUSTED`. About
/// eight rounds of the actor: room for bursts (a group commit's worth of submits), not for
/// a flood's backlog.
pub const QUEUE_CAPACITY: usize = 65_536;
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
        reply: Reply<Submitted>,
    },
    /// Runs a read over the live `State` at once (`now` given) and answers without a
    /// commit, as a query reads the actor's memory (see [`Handle::read`]).
    Read(StateRead),
    Cancel {
        caller: Caller,
        req: CancelJobs,
        reply: Reply<Cancelled>,
    },
    UpdateJob {
        caller: Caller,
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
    UpdateNode {
        who: Identity,
        req: v1::UpdateNodeRequest,
        reply: Reply<v1::UpdateNodeResponse>,
    },
    /// The operator's node removal (see `state/node_admin.rs`).
    RemoveNode {
        req: RemoveNodes,
        reply: Reply<NodesRemoved>,
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
    /// A sacctmgr change, applied whole or not at all; the lines changed are the answer,
    /// once durable (see `state/accounting.rs`).
    AccountingChange {
        apply: AcctChange,
        reply: Reply<Vec<String>>,
    },
    /// The bridge's placeholder jobs (see `state/placeholders.rs`).
    SubmitPlaceholder {
        spec: JobSpec,
        reply: Reply<v1::SubmitPlaceholderResponse>,
    },
    EndPlaceholder {
        job: JobId,
        end_time: i64,
        /// The namespace asking: must own the placeholder.
        namespace: String,
        reply: Reply<v1::EndPlaceholderResponse>,
    },
    ReleasePlaceholderNodes {
        job: JobId,
        /// Kubernetes node names, as the placeholder events give them.
        nodes: Vec<String>,
        end_time: i64,
        /// The namespace asking: must own the placeholder.
        namespace: String,
        reply: Reply<v1::ReleasePlaceholderNodesResponse>,
    },
    WatchPlaceholders {
        tx: PlaceholderTx,
        reply: Reply<()>,
    },
    /// Stop after flushing what is queued.
    Shutdown,
}

/// The handlers' side of the actor.
#[derive(Clone)]
pub struct Handle {
    tx: std_mpsc::SyncSender<Command>,
    view: SharedView,
}

impl Handle {
    /// The latest published read view (listings are served from it, not by the actor).
    pub fn view(&self) -> Arc<ReadView> {
        self.view.load_full()
    }

    /// Runs `f` over the live state on the actor and waits for its answer. For reads that
    /// need the model itself rather than the published [`ReadView`] (priorities, fair share,
    /// a will-run test); `f` runs on the actor, so it must be quick.
    pub async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&State, i64) -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        self.call(|reply| {
            Command::Read(Box::new(move |st: &State, now: i64| {
                let _ = reply.send(f(st, now));
            }))
        })
        .await
    }

    /// Sends a command built around a fresh reply channel and waits for the answer.
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx))?;
        rx.await
            .map_err(|_| Status::unavailable("controller is shutting down"))?
    }

    /// Queues a command without waiting: a full queue answers `RESOURCE_EXHAUSTED` (the
    /// client retries later) instead of growing the controller's memory.
    #[allow(clippy::result_large_err)]
    pub fn send(&self, cmd: Command) -> Result<(), Status> {
        self.tx.try_send(cmd).map_err(|e| match e {
            std_mpsc::TrySendError::Full(_) => Status::resource_exhausted(format!(
                "controller busy: its request queue is full ({QUEUE_CAPACITY} requests); retry later"
            )),
            std_mpsc::TrySendError::Disconnected(_) => {
                Status::unavailable("controller is shutting down")
            }
        })
    }

    /// Queues a command that must not be dropped (a worker's report, shutdown), waiting
    /// while the queue is full: back-pressure on that one stream.
    #[allow(clippy::result_large_err)]
    pub async fn send_wait(&self, mut cmd: Command) -> Result<(), Status> {
        let mut pause = Duration::from_millis(1);
        loop {
            match self.tx.try_send(cmd) {
                Ok(()) => return Ok(()),
                Err(std_mpsc::TrySendError::Full(c)) => {
                    cmd = c;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(std_mpsc::TrySendError::Disconnected(_)) => {
                    return Err(Status::unavailable("controller is shutting down"));
                }
            }
        }
    }
}

/// Who asks, as the actor needs it: the core's [`Requester`], and the caller's right to
/// control a job, asked once the actor knows the job's owner. The rule is `api::authz`'s:
/// the handler that built the caller supplies it, the actor only applies it.
pub struct Caller {
    pub by: Requester,
    may_control: Box<dyn Fn(u32) -> bool + Send>,
}

impl Caller {
    /// `may_control(owner_uid)`: may this caller cancel, signal, hold, release, requeue or
    /// update a job of that owner?
    pub fn new(by: Requester, may_control: impl Fn(u32) -> bool + Send + 'static) -> Self {
        Caller {
            by,
            may_control: Box::new(may_control),
        }
    }

    pub fn may_control(&self, owner_uid: u32) -> bool {
        (self.may_control)(owner_uid)
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
    let (tx, rx) = std_mpsc::sync_channel(QUEUE_CAPACITY);
    let start_time = unix_now();
    let view = ViewPublisher::new(st.config().cluster_name.clone(), start_time);
    let handle = Handle {
        tx,
        view: view.shared(),
    };
    let (launch_failed_tx, launch_failed_rx) = std_mpsc::channel();
    let now = Instant::now();
    let mut actor = Actor {
        st,
        cfg: parts.config,
        key: parts.key,
        committer: parts.committer,
        launch_failed_tx,
        launch_failed_rx,
        metrics: parts.metrics,
        workers: Workers::new(now),
        steps: step_table::StepTable::new(parts.steps),
        watchers: HashMap::new(),
        idem: parts.idempotency,
        batch: Batch::default(),
        effects: Vec::new(),
        pacing: pacing::PassPacing::new(now),
        next_tick: now,
        next_purge: now + Duration::from_secs(10),
        next_periodic_pass: now,
        planned: HashMap::new(),
        ended_usage: None,
        timeout_signalled: HashSet::new(),
        placeholders: placeholders::Placeholders::default(),
        stopping: false,
        view,
    };
    actor.placeholders.index(&actor.st);
    actor.publish_initial_view();
    let join = std::thread::Builder::new()
        .name("tandem-state".into())
        .spawn(move || actor.run(rx))?;
    Ok((handle, join))
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
    steps: step_table::StepTable,
    /// Open WatchJob streams per job.
    watchers: HashMap<JobId, Vec<WatchTx>>,
    /// Submit idempotency keys -> (job, created).
    idem: HashMap<String, (JobId, i64)>,
    /// Writes and effects of the commands applied since the last flush.
    batch: Batch,
    effects: Vec<Effect>,
    /// When the next scheduling pass runs (wanted, paced, joining a flush).
    pacing: pacing::PassPacing,
    next_tick: Instant,
    next_purge: Instant,
    next_periodic_pass: Instant,
    /// What the worker measured of the run whose end is being applied (see `job_ended`):
    /// its accounting record carries it.
    ended_usage: Option<MeasuredUsage>,
    /// The last pass's backfill plan: when and where each pending job it reserved for is
    /// expected to start (squeue --start).
    planned: HashMap<JobId, (i64, Arc<str>)>,
    /// Jobs past their time limit the controller already asked to end.
    timeout_signalled: HashSet<JobId>,
    /// Live placeholder jobs by pod-group UID, and the bridges watching them.
    placeholders: placeholders::Placeholders,
    stopping: bool,
    /// What listings read, published after every flush.
    view: ViewPublisher,
}

/// A job's CPU time and peak memory as its worker measured them when it ended.
struct MeasuredUsage {
    job: JobId,
    /// The batch script's own cgroup (sacct's `.batch`).
    batch: Option<v1::ResourceUsage>,
    /// The whole job (the allocation line).
    whole: Option<v1::ResourceUsage>,
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
            let wake = self.pacing.wake(self.next_tick);
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
            // 2. flush, with the pass when it can share the commit (see `pass_joins_flush`)
            if applied > 0 {
                // Settled before the flush: what it tells jobs no pass will see now is
                // written with their submit.
                self.settle_pass_wanted();
                let rows = if self.pass_joins_flush() {
                    self.pass()
                } else {
                    self.flush()
                };
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
            self.settle_pass_wanted();
            if self.pacing.due(Instant::now()) {
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
            Command::Read(read) => read(&self.st, self.now()),
            Command::Cancel { caller, req, reply } => {
                let resp = self.cancel(&caller, req);
                self.reply_after_commit(reply, resp);
            }
            Command::UpdateJob { caller, req, reply } => match self.update_job(&caller, &req) {
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
            Command::UpdateNode { who, req, reply } => match self.update_node(&who, &req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::RemoveNode { req, reply } => match self.remove_nodes(req) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::SubmitPlaceholder { spec, reply } => self.submit_placeholder(spec, reply),
            Command::EndPlaceholder {
                job,
                end_time,
                namespace,
                reply,
            } => match self.end_placeholder(job, end_time, &namespace) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::ReleasePlaceholderNodes {
                job,
                nodes,
                end_time,
                namespace,
                reply,
            } => match self.release_placeholder_nodes(job, &nodes, end_time, &namespace) {
                Ok(resp) => self.reply_after_commit(reply, resp),
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            Command::WatchPlaceholders { tx, reply } => {
                self.watch_placeholders(tx);
                let _ = reply.send(Ok(()));
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
                self.view.nodes_dirty = true;
                info!(node = %node, "worker stream closed");
            }
            Command::Barrier { reply } => self.reply_after_commit(reply, ()),
            Command::AccountingChange { apply, reply } => self.accounting_change(apply, reply),
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
            self.pacing.want();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(capacity: usize) -> (Handle, std_mpsc::Receiver<Command>) {
        let (tx, rx) = std_mpsc::sync_channel(capacity);
        let view = ViewPublisher::new("test".into(), 0);
        (
            Handle {
                tx,
                view: view.shared(),
            },
            rx,
        )
    }

    #[test]
    fn a_full_queue_answers_resource_exhausted_and_keeps_what_it_holds() {
        let (h, rx) = handle(2);
        h.send(Command::Shutdown).expect("room for one");
        h.send(Command::Shutdown).expect("room for two");
        let err = h.send(Command::Shutdown).expect_err("queue is full");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
        assert_eq!(rx.try_iter().count(), 2);
        h.send(Command::Shutdown).expect("room again once drained");
        drop(rx);
        let err = h.send(Command::Shutdown).expect_err("actor gone");
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }

    #[tokio::test]
    async fn send_wait_waits_for_room_instead_of_dropping() {
        let (h, rx) = handle(1);
        h.send(Command::Shutdown).expect("room for one");
        let drain = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let first = rx.recv().is_ok();
            let second = rx.recv_timeout(Duration::from_secs(30)).is_ok();
            first && second
        });
        h.send_wait(Command::Shutdown)
            .await
            .expect("queued once drained");
        assert!(drain.join().expect("drain thread"), "both commands arrived");
    }
}
