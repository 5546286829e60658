//! The read view: an immutable picture of jobs, nodes and partitions that the actor
//! publishes after every flush, so listings (squeue, scontrol show job|node|partition,
//! sinfo, sacct's active part) run on the RPC tasks and never on the scheduling actor.
//!
//! ```text
//!  actor: flush ─▶ publish_view(changes) ─▶ ArcSwap<ReadView> ◀─ load() ─ RPC tasks
//!          (O(changed jobs): persistent map)       (lock-free, never waits on the actor)
//! ```
//!
//! - Jobs live in a persistent map (`imbl::OrdMap`), so publishing costs the changed jobs
//!   only, whatever the queue's length; a reader holding an old view keeps it intact.
//! - Read-your-writes: the view is published in the flush that builds the batch, before the
//!   committer runs the batch's replies, so a `squeue` after `sbatch` returned shows the job.
//! - Priority and pending reason are recomputed by every pass without being recorded as
//!   changes (see `tandem_sched::cycle`); rebuilding every pending job's entry per pass would
//!   cost O(queue), so every pass publishes them as one sorted table (a copy of three
//!   numbers per pending job, small next to the pass itself; a later change of the job
//!   wins). [`FACTS_EVERY`] can space those out, like Slurm's PriorityCalcPeriod; it is
//!   zero because `squeue` right after `sbatch` must show the reason the pass just set.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use imbl::OrdMap;
use tandem_proto::v1;
use tandem_sched::array::ArrayState;
use tandem_sched::job::{Job, JobState};
use tandem_sched::state::Changes;
use tandem_sched::state::JobSelector;
use tonic::Status;

use super::{Actor, unix_now};
use crate::api::convert::{self, JobFields, job_field as f};

/// Least time between two publications of the pending jobs' priorities and reasons.
pub const FACTS_EVERY: Duration = Duration::ZERO;

/// What readers share: the latest published view.
pub type SharedView = Arc<ArcSwap<ReadView>>;

/// One published picture of the controller's memory.
#[derive(Clone)]
pub struct ReadView {
    /// Increases with every publication.
    pub version: u64,
    jobs: OrdMap<u64, Arc<JobEntry>>,
    facts: Arc<PendingFacts>,
    nodes: Arc<Vec<v1::NodeInfo>>,
    partitions: Arc<Vec<v1::PartitionInfo>>,
    cluster_name: String,
    start_time: i64,
}

/// One job as the view shows it: its full wire record (steps included) and what listings
/// filter on.
struct JobEntry {
    info: v1::JobInfo,
    state: JobState,
    array: Option<ArrayState>,
    /// The view version that built this entry.
    version: u64,
}

/// Priorities, reasons and planned starts of pending jobs as of one pass, sorted by job id.
#[derive(Default)]
struct PendingFacts {
    version: u64,
    rows: Vec<PendingFact>,
}

struct PendingFact {
    job: u64,
    priority: u64,
    reason: &'static str,
    /// The backfill plan's start and nodes (0 and empty without one).
    expected_start: i64,
    sched_nodes: Arc<str>,
}

impl ReadView {
    fn empty(cluster_name: String, start_time: i64) -> Self {
        ReadView {
            version: 0,
            jobs: OrdMap::new(),
            facts: Arc::new(PendingFacts::default()),
            nodes: Arc::new(Vec::new()),
            partitions: Arc::new(Vec::new()),
            cluster_name,
            start_time,
        }
    }

    /// Number of job records (array metas count once).
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// A job's record restricted to `want`, with the latest published priority and reason.
    fn job_info(&self, e: &JobEntry, want: JobFields) -> v1::JobInfo {
        let mut info = project(&e.info, want);
        if e.state == JobState::Pending && self.facts.version > e.version {
            let id = e.info.job_id;
            if let Ok(i) = self.facts.rows.binary_search_by_key(&id, |r| r.job) {
                let fact = &self.facts.rows[i];
                if want.has(f::PRIORITY) {
                    info.priority = fact.priority;
                }
                if want.has(f::REASON) {
                    fact.reason.clone_into(&mut info.reason);
                }
                if want.has(f::EXPECTED_START) {
                    info.expected_start = fact.expected_start;
                }
                if want.has(f::SCHED_NODES) {
                    info.sched_nodes = fact.sched_nodes.to_string();
                }
            }
        }
        info
    }

    fn entry(&self, id: u64) -> Option<&Arc<JobEntry>> {
        self.jobs.get(&id)
    }

    /// squeue / scontrol show job: the actor's listing rules, over the view.
    pub fn list_jobs(&self, req: &v1::ListJobsRequest) -> Result<v1::ListJobsResponse, Status> {
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
        let mut out = Vec::with_capacity(if selectors.is_empty() {
            self.jobs.len()
        } else {
            0
        });
        let mut consider = |e: &JobEntry| {
            let i = &e.info;
            if !any(&req.users, &i.user)
                || !any(&req.partitions, &i.partition)
                || !any(&req.names, &i.name)
                || !any(&req.accounts, &i.account)
            {
                return;
            }
            if e.state.is_terminal() && !req.include_finished {
                return;
            }
            match &e.array {
                Some(a) => {
                    // The meta record stands for its pending indices only; started tasks
                    // are their own records.
                    if a.pending.is_empty() || e.state.is_terminal() {
                        return;
                    }
                    if !states.is_empty() && !states.contains(&JobState::Pending) {
                        return;
                    }
                    let info = self.job_info(e, want);
                    if req.fold_arrays {
                        out.push(info);
                    } else {
                        for i in a.pending.iter() {
                            out.push(pending_task(&info, i));
                        }
                    }
                }
                None => {
                    if !states.is_empty() && !states.contains(&e.state) {
                        return;
                    }
                    out.push(self.job_info(e, want));
                }
            }
        };
        let mut pending_tasks = Vec::new();
        if selectors.is_empty() {
            for e in self.jobs.values() {
                consider(e);
            }
        } else {
            for sel in &selectors {
                let Some(e) = self.entry(sel.job.0) else {
                    continue;
                };
                match (&sel.tasks, &e.array) {
                    (None, Some(a)) => {
                        consider(e);
                        for (_, t) in &a.tasks {
                            if let Some(te) = self.entry(t.0) {
                                consider(te);
                            }
                        }
                    }
                    (Some(tasks), Some(a)) => {
                        for i in tasks.iter() {
                            if let Some(te) = a.task_job(i).and_then(|t| self.entry(t.0)) {
                                consider(te);
                            } else if a.pending.contains(i)
                                && !e.state.is_terminal()
                                && (states.is_empty() || states.contains(&JobState::Pending))
                            {
                                // A pending index has no record of its own yet.
                                pending_tasks.push(pending_task(&self.job_info(e, want), i));
                            }
                        }
                    }
                    _ => consider(e),
                }
            }
        }
        out.extend(pending_tasks);
        Ok(v1::ListJobsResponse {
            jobs: out,
            now: unix_now(),
        })
    }

    /// Jobs still in memory, for sacct's active part (array metas only while they have
    /// pending indices).
    pub fn active_jobs(&self) -> Vec<v1::JobInfo> {
        self.jobs
            .values()
            .filter(|e| e.array.as_ref().is_none_or(|a| !a.pending.is_empty()))
            .map(|e| self.job_info(e, JobFields::ALL))
            .collect()
    }

    /// sinfo / scontrol show node.
    pub fn list_nodes(&self, req: &v1::ListNodesRequest) -> Result<v1::ListNodesResponse, Status> {
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
            .nodes
            .iter()
            .filter(|n| wanted.as_ref().is_none_or(|w| w.contains(&n.name)))
            .filter(|n| req.partition.is_empty() || n.partitions.contains(&req.partition))
            .cloned()
            .collect();
        Ok(v1::ListNodesResponse { nodes })
    }

    pub fn list_partitions(&self) -> v1::ListPartitionsResponse {
        v1::ListPartitionsResponse {
            partitions: self.partitions.as_ref().clone(),
        }
    }

    pub fn cluster_info(&self) -> v1::ClusterInfoResponse {
        v1::ClusterInfoResponse {
            cluster_name: self.cluster_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            now: unix_now(),
            start_time: self.start_time,
        }
    }
}

/// The row of one pending index of an array, from the meta's row.
fn pending_task(meta: &v1::JobInfo, index: u32) -> v1::JobInfo {
    let mut t = meta.clone();
    t.array_task_id = i64::from(index);
    t.array_pending = String::new();
    t.state = v1::JobState::Pending as i32;
    t
}

/// `full` with only the fields of `want` (the rest at their defaults, not sent).
fn project(full: &v1::JobInfo, want: JobFields) -> v1::JobInfo {
    if want == JobFields::ALL {
        return full.clone();
    }
    macro_rules! pick {
        ($($konst:ident => $field:ident,)*) => {
            v1::JobInfo {
                $($field: if want.has(f::$konst) {
                    full.$field.clone()
                } else {
                    Default::default()
                },)*
            }
        };
    }
    pick! {
        JOB_ID => job_id,
        ARRAY_JOB_ID => array_job_id,
        ARRAY_TASK_ID => array_task_id,
        ARRAY_PENDING => array_pending,
        NAME => name,
        USER => user,
        UID => uid,
        GID => gid,
        ACCOUNT => account,
        PARTITION => partition,
        QOS => qos,
        STATE => state,
        REASON => reason,
        PRIORITY => priority,
        SUBMIT_TIME => submit_time,
        ELIGIBLE_TIME => eligible_time,
        START_TIME => start_time,
        END_TIME => end_time,
        TIME_LIMIT_S => time_limit_s,
        NODELIST => nodelist,
        NUM_NODES => num_nodes,
        NUM_CPUS => num_cpus,
        NUM_TASKS => num_tasks,
        CPUS_PER_TASK => cpus_per_task,
        TRES => tres,
        EXIT_CODE => exit_code,
        EXIT_SIGNAL => exit_signal,
        WORKDIR => workdir,
        STDOUT => stdout,
        STDERR => stderr,
        DEPENDENCY => dependency,
        COMMAND => command,
        REQUEUE => requeue,
        RESTARTS => restarts,
        CONSTRAINT => constraint,
        EXCLUSIVE => exclusive,
        MODE => mode,
        STEPS => steps,
        SUBMIT_HOST => submit_host,
        GPU_BINDING => gpu_binding,
        PREEMPT_TIME => preempt_time,
        COMMENT => comment,
        MEM_PER_NODE_MB => mem_per_node_mb,
        NTASKS_PER_NODE => ntasks_per_node,
        REQ_NODELIST => req_nodelist,
        EXC_NODELIST => exc_nodelist,
        CANCELLED_BY => cancelled_by,
        NICE => nice,
        STDIN => stdin,
        ALLOC_SID => alloc_sid,
        MEM_PER_CPU_MB => mem_per_cpu_mb,
        EXPECTED_START => expected_start,
        SCHED_NODES => sched_nodes,
        USAGE => usage,
        BILLING => billing,
    }
}

/// The actor's side: the view it last published and what changed since outside `State`'s
/// own change records.
pub struct ViewPublisher {
    shared: SharedView,
    current: ReadView,
    /// Jobs whose entry must be rebuilt though `State` did not record them (steps).
    pub dirty_jobs: HashSet<u64>,
    /// Node entries must be rebuilt (a worker connected or left: address, version).
    pub nodes_dirty: bool,
    facts_at: Option<Instant>,
    /// A pass recomputed priorities that are not published yet (rate limit); the tick
    /// publishes them once allowed.
    pub facts_stale: bool,
}

impl ViewPublisher {
    pub fn new(cluster_name: String, start_time: i64) -> Self {
        let current = ReadView::empty(cluster_name, start_time);
        ViewPublisher {
            shared: Arc::new(ArcSwap::from_pointee(current.clone())),
            current,
            dirty_jobs: HashSet::new(),
            nodes_dirty: true,
            facts_at: None,
            facts_stale: false,
        }
    }

    pub fn shared(&self) -> SharedView {
        self.shared.clone()
    }
}

impl Actor {
    fn job_entry(&self, job: &Job, version: u64) -> Arc<JobEntry> {
        Arc::new(JobEntry {
            info: self.job_info(job),
            // squeue lists COMPLETING jobs, and `-t CG` finds them.
            state: job.shown_state(),
            array: job.array.as_deref().cloned(),
            version,
        })
    }

    /// Builds the first view from the whole recovered state.
    pub(super) fn publish_initial_view(&mut self) {
        let version = 1;
        let jobs: OrdMap<u64, Arc<JobEntry>> = self
            .st
            .jobs()
            .map(|j| (j.id.0, self.job_entry(j, version)))
            .collect();
        let mut v = self.view.current.clone();
        v.version = version;
        v.jobs = jobs;
        self.view.current = v;
        self.rebuild_nodes();
        self.publish_facts(true);
        self.view.shared.store(Arc::new(self.view.current.clone()));
    }

    /// Applies what changed since the last flush to the view and publishes it. Costs the
    /// changed jobs, plus every node when a node changed or a changed job holds nodes.
    pub(super) fn publish_view(&mut self, changes: &Changes) {
        let dirty = std::mem::take(&mut self.view.dirty_jobs);
        if changes.is_empty() && dirty.is_empty() && !self.view.nodes_dirty {
            return;
        }
        let version = self.view.current.version + 1;
        let mut jobs = std::mem::take(&mut self.view.current.jobs);
        let mut nodes_dirty = self.view.nodes_dirty || !changes.nodes.is_empty() || changes.config;
        let ids = changes.jobs.iter().map(|j| j.0).chain(dirty);
        for id in ids {
            match self.st.job(tandem_sched::JobId(id)) {
                Some(job) => {
                    nodes_dirty |= job.alloc.is_some();
                    jobs.insert(id, self.job_entry(job, version));
                }
                None => {
                    jobs.remove(&id);
                }
            }
        }
        for id in &changes.removed_jobs {
            jobs.remove(&id.0);
        }
        self.view.current.jobs = jobs;
        self.view.current.version = version;
        if changes.config {
            self.view.current.cluster_name = self.st.config().cluster_name.clone();
        }
        if nodes_dirty {
            self.rebuild_nodes();
        }
        self.view.shared.store(Arc::new(self.view.current.clone()));
    }

    fn rebuild_nodes(&mut self) {
        let nodes: Vec<v1::NodeInfo> = self
            .st
            .nodes()
            .map(|n| {
                let mut info = convert::node_info(n, self.workers.reported(&n.name));
                info.busy_until = self.busy_until(n);
                info
            })
            .collect();
        let partitions: Vec<v1::PartitionInfo> = self
            .st
            .partitions()
            .map(|p| convert::partition_info(&self.st, p))
            .collect();
        self.view.current.nodes = Arc::new(nodes);
        self.view.current.partitions = Arc::new(partitions);
        self.view.nodes_dirty = false;
    }

    /// After a pass: publishes the pending jobs' priorities and reasons, at most every
    /// [`FACTS_EVERY`] unless `force`.
    pub(super) fn publish_facts(&mut self, force: bool) {
        let now = Instant::now();
        if !force && self.view.facts_at.is_some_and(|t| now < t + FACTS_EVERY) {
            self.view.facts_stale = true;
            return;
        }
        self.view.facts_at = Some(now);
        self.view.facts_stale = false;
        // A fresh version, so that these facts win over entries built before them and lose
        // to entries built after.
        let version = self.view.current.version + 1;
        let no_nodes: Arc<str> = Arc::from("");
        // Held jobs are left out: their priority and reason change only with a recorded
        // change (hold, release), so their own entries carry them.
        let rows = self
            .st
            .unheld_pending_jobs()
            .map(|j| {
                let (expected_start, sched_nodes) = self
                    .planned
                    .get(&j.id)
                    .map_or((0, no_nodes.clone()), |(t, n)| (*t, n.clone()));
                PendingFact {
                    job: j.id.0,
                    priority: j.priority,
                    reason: convert::reason_name(j),
                    expected_start,
                    sched_nodes,
                }
            })
            .collect();
        self.view.current.version = version;
        self.view.current.facts = Arc::new(PendingFacts { version, rows });
        self.view.shared.store(Arc::new(self.view.current.clone()));
    }
}
