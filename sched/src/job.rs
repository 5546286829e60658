//! Jobs: what a user asked for ([`JobSpec`]), and the record the scheduler keeps ([`Job`]).
//!
//! Only scheduling fields live here. The script, argv, environment, working directory and
//! output patterns are payload the controller stores beside the job; keeping them out makes a
//! pending job a few hundred bytes. Rare parts (array, dependency, constraint, allocation)
//! are `Option<Box<..>>` so a plain pending job pays one pointer for each.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::array::{ArraySpec, ArrayState};
use crate::constraint::Constraint;
use crate::dependency::Dependency;
use crate::node::NodeMode;
use crate::time::MAX_DURATION_S;
use crate::{JobId, NodeId, Tres};

/// Upper bounds on counts in a spec: large enough for any real cluster, small enough that
/// every product of them fits the integer types used in the arithmetic.
pub const MAX_NODES_PER_JOB: u32 = 100_000;
pub const MAX_TASKS_PER_JOB: u32 = 10_000_000;
pub const MAX_CPUS_PER_TASK: u32 = 100_000;
pub const MAX_GPUS_PER_JOB: u32 = 1_000_000;
pub const MAX_NAME_LEN: usize = 256;
pub const MAX_NICE: i32 = 10_000;

/// What a user asked for: the scheduling half of `sbatch`'s options.
///
/// "Not given" is `0`, `None` or empty, so the controller's proto conversion is direct.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// Empty: the user's default account (see `ClusterConfig::users`), else `root`.
    pub account: String,
    /// Empty: the default partition.
    pub partition: String,
    /// Empty: the default QOS (`normal`).
    pub qos: String,
    /// Seconds. `None` = not given: the partition's DefaultTime, else its MaxTime, else no
    /// limit. (`--time=UNLIMITED` therefore also falls back to the partition's limits.)
    pub time_limit: Option<u64>,
    /// `-N` minimum; 0 = not given (derived from tasks and GPUs).
    pub nodes_min: u32,
    /// `-N min-max`; 0 = same as the minimum. Tandem allocates the minimum.
    pub nodes_max: u32,
    /// `-n`; 0 = one task per node.
    pub ntasks: u32,
    pub ntasks_per_node: u32,
    /// `-c`; 0 = 1.
    pub cpus_per_task: u32,
    pub mem_per_node_mb: Option<u64>,
    pub mem_per_cpu_mb: Option<u64>,
    /// `-G`: total GPUs, spread evenly over the nodes (rounded up per node).
    pub gpus: u32,
    pub gpus_per_node: u32,
    pub gpus_per_task: u32,
    /// Required GPU type (`--gres=gpu:h100:8`, `--gpus=h100:8`).
    pub gpu_type: Option<String>,
    /// Whole nodes.
    pub exclusive: bool,
    pub constraint: Option<Box<Constraint>>,
    /// `-w`: nodes that must be part of the allocation (expanded names).
    pub nodelist: Vec<String>,
    /// `-x`: nodes that must not be used.
    pub exclude: Vec<String>,
    pub dependency: Option<Box<Dependency>>,
    pub array: Option<Box<ArraySpec>>,
    /// Submitted held (`--hold`).
    pub hold: bool,
    /// Not eligible before this time (`--begin`).
    pub begin: Option<i64>,
    /// `--requeue` / `--no-requeue`; `None` = the cluster default.
    pub requeue: Option<bool>,
    pub mode: NodeMode,
    /// A `kube`-mode placeholder's pod group (its UID): the bridge finds the job by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_uid: Option<String>,
    /// `--nice`: subtracted from the priority.
    pub nice: i32,
    /// Administrator's fixed priority (`scontrol update Priority=`).
    pub priority: Option<u64>,
}

/// A spec that is wrong on its face, before looking at the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

fn invalid(field: &'static str, problem: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field,
        problem: problem.into(),
    }
}

impl JobSpec {
    /// Intrinsic checks: bounds, mutually exclusive options, names.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.user.is_empty() {
            return Err(invalid("user", "missing"));
        }
        for (field, v) in [
            ("job name", &self.name),
            ("user", &self.user),
            ("account", &self.account),
            ("partition", &self.partition),
            ("qos", &self.qos),
        ] {
            if v.len() > MAX_NAME_LEN {
                return Err(invalid(
                    field,
                    format!("longer than {MAX_NAME_LEN} characters"),
                ));
            }
            if v.chars().any(char::is_control) {
                return Err(invalid(field, "contains control characters"));
            }
        }
        if let Some(t) = self.time_limit
            && t > MAX_DURATION_S
        {
            return Err(invalid("time", "longer than 100 years"));
        }
        if self.nodes_min > MAX_NODES_PER_JOB || self.nodes_max > MAX_NODES_PER_JOB {
            return Err(invalid("nodes", format!("more than {MAX_NODES_PER_JOB}")));
        }
        if self.nodes_max != 0 && self.nodes_max < self.nodes_min {
            return Err(invalid(
                "nodes",
                format!(
                    "maximum {} is below minimum {}",
                    self.nodes_max, self.nodes_min
                ),
            ));
        }
        if self.ntasks > MAX_TASKS_PER_JOB || self.ntasks_per_node > MAX_TASKS_PER_JOB {
            return Err(invalid("ntasks", format!("more than {MAX_TASKS_PER_JOB}")));
        }
        if self.cpus_per_task > MAX_CPUS_PER_TASK {
            return Err(invalid(
                "cpus-per-task",
                format!("more than {MAX_CPUS_PER_TASK}"),
            ));
        }
        if self.mem_per_node_mb.is_some() && self.mem_per_cpu_mb.is_some() {
            return Err(invalid(
                "mem",
                "--mem and --mem-per-cpu are mutually exclusive",
            ));
        }
        let gpu_forms = [self.gpus, self.gpus_per_node, self.gpus_per_task]
            .iter()
            .filter(|g| **g > 0)
            .count();
        if gpu_forms > 1 {
            return Err(invalid(
                "gpus",
                "give only one of --gpus, --gpus-per-node, --gpus-per-task",
            ));
        }
        if self.gpus > MAX_GPUS_PER_JOB
            || self.gpus_per_node > MAX_GPUS_PER_JOB
            || self.gpus_per_task > MAX_GPUS_PER_JOB
        {
            return Err(invalid("gpus", format!("more than {MAX_GPUS_PER_JOB}")));
        }
        if let Some(t) = &self.gpu_type {
            if gpu_forms == 0 {
                return Err(invalid(
                    "gpus",
                    format!("GPU type {t:?} given without a GPU count"),
                ));
            }
            if t.is_empty()
                || t.len() > 64
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            {
                return Err(invalid("gpus", format!("bad GPU type {t:?}")));
            }
        }
        if self.nice.abs() > MAX_NICE {
            return Err(invalid(
                "nice",
                format!("must be within -{MAX_NICE}..={MAX_NICE}"),
            ));
        }
        if self.ntasks > 0 && self.ntasks_per_node > 0 && self.nodes_min > 0 {
            let fit = u64::from(self.ntasks_per_node) * u64::from(self.nodes_min);
            if u64::from(self.ntasks) > fit {
                return Err(invalid(
                    "ntasks",
                    format!(
                        "{} tasks do not fit {} nodes at {} per node",
                        self.ntasks, self.nodes_min, self.ntasks_per_node
                    ),
                ));
            }
        }
        if self.nodelist.iter().any(|n| self.exclude.contains(n)) {
            return Err(invalid(
                "nodelist",
                "a node is both required (-w) and excluded (-x)",
            ));
        }
        Ok(())
    }

    /// Computes the per-node request. `caps` describes the largest node of the partition and
    /// is used only when the user did not give `-N`: then the node count grows until tasks
    /// and GPUs fit (Slurm spreads `-n 64` over as many nodes as it takes).
    pub fn shape(&self, caps: NodeCaps, default_mem_per_cpu_mb: u64) -> Shape {
        let cpt = self.cpus_per_task.max(1);
        let mut nodes = self
            .nodes_min
            .max(1)
            .max(u32::try_from(self.nodelist.len()).unwrap_or(u32::MAX));
        if self.nodes_min == 0 {
            if self.ntasks > 0 && self.ntasks_per_node > 0 {
                nodes = nodes.max(self.ntasks.div_ceil(self.ntasks_per_node));
            } else if self.ntasks > 0 && caps.cpus > 0 && !self.exclusive {
                let mut tasks_fit = caps.cpus / cpt;
                // `-n4 --gpus-per-task=4` on 8-GPU nodes needs two nodes, as in Slurm.
                if self.gpus_per_task > 0 && caps.gpus > 0 {
                    tasks_fit = tasks_fit.min(caps.gpus / self.gpus_per_task);
                }
                nodes = nodes.max(self.ntasks.div_ceil(tasks_fit.max(1)));
            }
            if self.gpus > 0 && caps.gpus > 0 {
                nodes = nodes.max(self.gpus.div_ceil(caps.gpus));
            }
        }
        let nodes = nodes.min(MAX_NODES_PER_JOB);
        let tasks_per_node = if self.ntasks_per_node > 0 {
            self.ntasks_per_node
        } else if self.ntasks > 0 {
            self.ntasks.div_ceil(nodes)
        } else {
            1
        };
        let ntasks = if self.ntasks > 0 {
            self.ntasks
        } else {
            tasks_per_node.saturating_mul(nodes)
        };
        let cpus = tasks_per_node.saturating_mul(cpt);
        let gpus = if self.gpus_per_node > 0 {
            self.gpus_per_node
        } else if self.gpus_per_task > 0 {
            self.gpus_per_task.saturating_mul(tasks_per_node)
        } else if self.gpus > 0 {
            self.gpus.div_ceil(nodes)
        } else {
            0
        };
        let mem_mb = match (self.mem_per_node_mb, self.mem_per_cpu_mb) {
            (Some(m), _) => m,
            (None, Some(m)) => m.saturating_mul(u64::from(cpus)),
            (None, None) => default_mem_per_cpu_mb.saturating_mul(u64::from(cpus)),
        };
        Shape {
            nodes,
            tasks_per_node,
            ntasks,
            per_node: Tres { cpus, mem_mb, gpus },
            exclusive: self.exclusive,
        }
    }

    /// Requeue allowed, given the cluster default.
    pub fn requeue_allowed(&self, cluster_default: bool) -> bool {
        self.requeue.unwrap_or(cluster_default)
    }
}

/// The largest node of a partition, for deriving node counts (see [`JobSpec::shape`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCaps {
    pub cpus: u32,
    pub gpus: u32,
}

/// A job's resolved request: how many nodes, and what it needs on each.
///
/// Every node of a job gets the same `per_node` amounts (Slurm's common case and what
/// launchers like torchrun assume). An exclusive job is given whole nodes at start; its
/// `per_node` is what it asked for and is used to decide which nodes could host it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub nodes: u32,
    pub tasks_per_node: u32,
    pub ntasks: u32,
    pub per_node: Tres,
    pub exclusive: bool,
}

impl Shape {
    pub fn total(&self) -> Tres {
        self.per_node.saturating_mul(self.nodes)
    }
}

/// Slurm's job states. `Display` prints Slurm's names, [`JobState::code`] the short codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Suspended,
    Completing,
    Completed,
    Cancelled,
    Failed,
    Timeout,
    Preempted,
    NodeFail,
    OutOfMemory,
    /// Only as the state of one *run* of a job that went back to PENDING (sacct's record).
    Requeued,
}

impl JobState {
    pub const ALL: [JobState; 12] = [
        JobState::Pending,
        JobState::Running,
        JobState::Suspended,
        JobState::Completing,
        JobState::Completed,
        JobState::Cancelled,
        JobState::Failed,
        JobState::Timeout,
        JobState::Preempted,
        JobState::NodeFail,
        JobState::OutOfMemory,
        JobState::Requeued,
    ];

    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Suspended => "SUSPENDED",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Cancelled => "CANCELLED",
            JobState::Failed => "FAILED",
            JobState::Timeout => "TIMEOUT",
            JobState::Preempted => "PREEMPTED",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Requeued => "REQUEUED",
        }
    }

    /// squeue's compact state (`%t`).
    pub fn code(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Suspended => "S",
            JobState::Completing => "CG",
            JobState::Completed => "CD",
            JobState::Cancelled => "CA",
            JobState::Failed => "F",
            JobState::Timeout => "TO",
            JobState::Preempted => "PR",
            JobState::NodeFail => "NF",
            JobState::OutOfMemory => "OOM",
            JobState::Requeued => "RQ",
        }
    }

    /// Parses a name or code, any case (`squeue -t pd,running`).
    pub fn parse(s: &str) -> Option<JobState> {
        let u = s.trim().to_ascii_uppercase();
        JobState::ALL
            .into_iter()
            .find(|st| st.name() == u || st.code() == u)
    }

    /// The job will not run again (in this record).
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Suspended | JobState::Completing
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a job is pending, or why it ended. `Display` is Slurm's exact spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    None,
    Priority,
    Resources,
    Dependency,
    DependencyNeverSatisfied,
    JobHeldUser,
    JobHeldAdmin,
    BeginTime,
    PartitionTimeLimit,
    PartitionNodeLimit,
    PartitionDown,
    PartitionInactive,
    ReqNodeNotAvail,
    BadConstraints,
    QOSMaxJobsPerUserLimit,
    QOSMaxGRESPerUser,
    QOSMaxWallDurationPerJobLimit,
    QOSMaxJobsPerAccountLimit,
    AssocGrpGRES,
    AssocGrpJobsLimit,
    AssocMaxJobsLimit,
    /// An array's `%N` throttle is reached.
    JobArrayTaskLimit,
    NonZeroExitCode,
    TimeLimit,
    NodeDown,
    JobLaunchFailure,
    /// The kernel's OOM killer ended a process of the job (Slurm's `FAIL_OOM`).
    OutOfMemory,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::None => "None",
            Reason::Priority => "Priority",
            Reason::Resources => "Resources",
            Reason::Dependency => "Dependency",
            Reason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            Reason::JobHeldUser => "JobHeldUser",
            Reason::JobHeldAdmin => "JobHeldAdmin",
            Reason::BeginTime => "BeginTime",
            Reason::PartitionTimeLimit => "PartitionTimeLimit",
            Reason::PartitionNodeLimit => "PartitionNodeLimit",
            Reason::PartitionDown => "PartitionDown",
            Reason::PartitionInactive => "PartitionInactive",
            Reason::ReqNodeNotAvail => "ReqNodeNotAvail",
            Reason::BadConstraints => "BadConstraints",
            Reason::QOSMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            Reason::QOSMaxGRESPerUser => "QOSMaxGRESPerUser",
            Reason::QOSMaxWallDurationPerJobLimit => "QOSMaxWallDurationPerJobLimit",
            Reason::QOSMaxJobsPerAccountLimit => "QOSMaxJobsPerAccountLimit",
            Reason::AssocGrpGRES => "AssocGrpGRES",
            Reason::AssocGrpJobsLimit => "AssocGrpJobsLimit",
            Reason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
            Reason::JobArrayTaskLimit => "JobArrayTaskLimit",
            Reason::NonZeroExitCode => "NonZeroExitCode",
            Reason::TimeLimit => "TimeLimit",
            Reason::NodeDown => "NodeDown",
            Reason::JobLaunchFailure => "JobLaunchFailure",
            Reason::OutOfMemory => "OutOfMemory",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who holds a job (`--hold`/`scontrol hold` by its owner is a user hold; by an operator an
/// admin hold, which only an operator releases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hold {
    #[default]
    None,
    User,
    Admin,
}

/// Why the controller asked the workers to end a running job. Decides the final state when
/// the worker reports the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillReason {
    Cancel,
    Preempt(PreemptMode),
    /// A node of the job was lost; the other nodes are told to kill their part.
    NodeFail,
    /// The administrator requeued a running job.
    Requeue,
}

/// What happens to a preempted job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptMode {
    /// Back to PENDING, to run again later (from the start).
    Requeue,
    /// Ends for good, in state PREEMPTED (Slurm's `PreemptMode=CANCEL`).
    Cancel,
}

/// The resources one node gives a running job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAlloc {
    pub node: NodeId,
    pub cpus: u32,
    pub mem_mb: u64,
    /// GPU indices on that node (`CUDA_VISIBLE_DEVICES`).
    pub gpus: Vec<u32>,
}

impl NodeAlloc {
    pub fn tres(&self) -> Tres {
        Tres {
            cpus: self.cpus,
            mem_mb: self.mem_mb,
            gpus: self.gpus.len() as u32,
        }
    }
}

/// A running job's nodes, in node-name order (the first is where the batch script runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub nodes: Vec<NodeAlloc>,
}

impl Allocation {
    pub fn total(&self) -> Tres {
        self.nodes
            .iter()
            .fold(Tres::ZERO, |a, n| a.saturating_add(&n.tres()))
    }
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().map(|n| n.node)
    }
}

/// How a run ended, as the worker reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub exit_code: i32,
    /// The signal that ended the batch script, 0 if none.
    pub signal: i32,
    /// The worker ended it at its time limit.
    pub timed_out: bool,
    /// The worker ended it on the controller's request (cancel or preemption).
    pub cancelled: bool,
    /// It could not be started (bad working directory, unwritable output, ...).
    pub launch_error: Option<String>,
    /// The kernel's OOM killer ended a process of it (its cgroup's memory limit).
    #[serde(default)]
    pub out_of_memory: bool,
    /// The batch host emptied the job's cgroup (or saw its process group gone) before it
    /// reported: that node is released at once, without a second message.
    #[serde(default)]
    pub processes_gone: bool,
}

/// The scheduler's record of a job (also of an array's "meta" record, see `array`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub state: JobState,
    /// Pending reason, or why it ended.
    pub reason: Reason,
    /// Last computed priority (Slurm's 32-bit-ish scale, larger runs first).
    pub priority: u64,
    pub submit_time: i64,
    /// When it last became eligible (dependencies, hold, begin time all clear).
    pub eligible_time: Option<i64>,
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Resolved limit in seconds (spec or partition default); `None` = no limit.
    pub time_limit: Option<u64>,
    pub shape: Shape,
    /// The nodes of the current run; for a finished job, of its last run. Only RUNNING jobs
    /// hold their allocation on the nodes.
    pub alloc: Option<Box<Allocation>>,
    pub exit_code: i32,
    pub signal: i32,
    /// For array tasks: the array's job id and this task's index.
    pub array_job_id: Option<JobId>,
    pub array_task_id: Option<u32>,
    /// For an array's meta record: the indices still pending and task counters.
    pub array: Option<Box<ArrayState>>,
    /// Times it was requeued.
    pub restarts: u32,
    pub hold: Hold,
    /// Set when the controller was told to end the running job; decides the final state.
    pub kill: Option<KillReason>,
    pub preempt_time: Option<i64>,
    /// The uid of the user whose cancel ended or is ending the job (Slurm's `requid`:
    /// sacct shows `CANCELLED by 1000`); `None` for the controller's own cancels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<u32>,
    /// Nodes of the last run whose processes are not yet reported gone: while any is, the
    /// job shows COMPLETING (Slurm's flag over its final state). The nodes themselves hold
    /// what the run had there (`Node::ending`).
    /// Boxed: rare, and a pending job's record must stay small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completing: Option<Box<Vec<NodeId>>>,
    /// Nodes a RUNNING `kube`-mode placeholder must hand back while it keeps the others
    /// (drained, or lost: its pods there run under the kubelet, so nothing is known to
    /// have stopped). The bridge evicts the group's pods on them, then releases them
    /// ([`crate::state::State::release_placeholder_nodes`]); until then each stays held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releasing: Option<Box<Vec<NodeId>>>,
}

impl Job {
    /// A record just submitted: PENDING, held if the spec asks, no reason yet.
    pub(crate) fn pending(
        id: JobId,
        spec: JobSpec,
        shape: Shape,
        time_limit: Option<u64>,
        now: i64,
    ) -> Job {
        let hold = if spec.hold { Hold::User } else { Hold::None };
        let array = spec
            .array
            .as_deref()
            .map(|a| Box::new(crate::array::ArrayState::new(a)));
        Job {
            id,
            spec,
            state: JobState::Pending,
            reason: Reason::None,
            priority: 0,
            submit_time: now,
            eligible_time: None,
            start_time: None,
            end_time: None,
            time_limit,
            shape,
            alloc: None,
            exit_code: 0,
            signal: 0,
            array_job_id: None,
            array_task_id: None,
            array,
            restarts: 0,
            hold,
            kill: None,
            preempt_time: None,
            cancelled_by: None,
            completing: None,
            releasing: None,
        }
    }

    /// The state squeue and scontrol show: COMPLETING while processes of the ended run are
    /// still awaited on some node (a requeued job's too, as Slurm shows it), else `state`.
    /// `state` keeps the final state, which accounting records.
    pub fn shown_state(&self) -> JobState {
        if self.completing.is_some()
            && (self.state == JobState::Pending || self.state.is_terminal())
        {
            JobState::Completing
        } else {
            self.state
        }
    }

    /// Whether the processes of an ended run are still awaited on `node`.
    pub fn completing_on(&self, node: NodeId) -> bool {
        self.completing.as_ref().is_some_and(|c| c.contains(&node))
    }

    /// Nodes the placeholder must hand back (see [`Job::releasing`]).
    pub fn releasing_nodes(&self) -> &[NodeId] {
        self.releasing.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Nodes where the processes of an ended run are still awaited.
    pub fn completing_nodes(&self) -> &[NodeId] {
        self.completing.as_deref().map_or(&[], Vec::as_slice)
    }

    /// `node` reported (or can no longer report): the job waits for it no more, and leaves
    /// COMPLETING with the last one.
    pub(crate) fn done_completing_on(&mut self, node: NodeId) {
        if let Some(c) = self.completing.as_mut() {
            c.retain(|n| *n != node);
            if c.is_empty() {
                self.completing = None;
            }
        }
    }

    /// Whether this is an array's meta record (pending indices, never runs itself).
    pub fn is_array_meta(&self) -> bool {
        self.array.is_some()
    }

    /// Whether it has a `singleton` dependency (one job of its user and name at a time).
    pub fn is_singleton(&self) -> bool {
        self.spec
            .dependency
            .as_ref()
            .is_some_and(|d| d.has_singleton())
    }

    /// `12`, `12_3` for a task, `12_[6-99%4]` for an array's pending indices.
    pub fn display_id(&self) -> String {
        match (&self.array, self.array_job_id, self.array_task_id) {
            (Some(a), _, _) => {
                let throttle = self.spec.array.as_ref().and_then(|s| s.throttle);
                let mut s = format!("{}_", self.id);
                let body = a.pending.to_string();
                let folded = a.pending.len() > 1 || throttle.is_some();
                if folded {
                    s.push('[');
                }
                s.push_str(&body);
                if let Some(t) = throttle {
                    s.push_str(&format!("%{t}"));
                }
                if folded {
                    s.push(']');
                }
                s
            }
            (None, Some(a), Some(t)) => format!("{a}_{t}"),
            _ => self.id.to_string(),
        }
    }

    /// Elapsed run time at `now` (0 if it never started).
    pub fn elapsed(&self, now: i64) -> u64 {
        match self.start_time {
            Some(s) => (self.end_time.unwrap_or(now) - s).max(0) as u64,
            None => 0,
        }
    }

    /// When the job is expected to end (start + time limit); `None` when not running or
    /// unlimited.
    pub fn expected_end(&self) -> Option<i64> {
        Some(self.start_time?.saturating_add(self.time_limit? as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_print_slurm_names_and_codes() {
        assert_eq!(JobState::NodeFail.to_string(), "NODE_FAIL");
        assert_eq!(JobState::Pending.code(), "PD");
        assert_eq!(JobState::parse("cd"), Some(JobState::Completed));
        assert_eq!(JobState::parse("timeout"), Some(JobState::Timeout));
        assert!(JobState::Cancelled.is_terminal() && !JobState::Running.is_terminal());
        for st in JobState::ALL {
            assert_eq!(JobState::parse(st.name()), Some(st));
            assert_eq!(JobState::parse(st.code()), Some(st));
        }
        assert_eq!(
            Reason::QOSMaxJobsPerUserLimit.to_string(),
            "QOSMaxJobsPerUserLimit"
        );
    }

    #[test]
    fn validate_names_the_problem() {
        let ok = JobSpec::test();
        assert_eq!(ok.validate(), Ok(()));
        let cases: Vec<(JobSpec, &str)> = vec![
            (
                JobSpec {
                    user: String::new(),
                    ..JobSpec::test()
                },
                "user",
            ),
            (
                JobSpec {
                    mem_per_node_mb: Some(1),
                    mem_per_cpu_mb: Some(1),
                    ..JobSpec::test()
                },
                "mutually exclusive",
            ),
            (
                JobSpec {
                    gpus: 1,
                    gpus_per_node: 1,
                    ..JobSpec::test()
                },
                "only one of",
            ),
            (
                JobSpec {
                    gpu_type: Some("a100".into()),
                    ..JobSpec::test()
                },
                "without a GPU count",
            ),
            (
                JobSpec::test().nodes(4).with(|s| s.nodes_max = 2),
                "below minimum",
            ),
            (
                JobSpec::test()
                    .nodes(2)
                    .ntasks(10)
                    .with(|s| s.ntasks_per_node = 2),
                "do not fit",
            ),
            (
                JobSpec {
                    time_limit: Some(u64::MAX),
                    ..JobSpec::test()
                },
                "100 years",
            ),
            (
                JobSpec {
                    name: "x".repeat(300),
                    ..JobSpec::test()
                },
                "longer than",
            ),
            (
                JobSpec {
                    nice: 1_000_000,
                    ..JobSpec::test()
                },
                "nice",
            ),
            (
                JobSpec {
                    nodelist: vec!["a".into()],
                    exclude: vec!["a".into()],
                    ..JobSpec::test()
                },
                "both required",
            ),
        ];
        for (spec, want) in cases {
            let e = spec.validate().unwrap_err();
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn shapes_follow_slurm_defaults() {
        let caps = NodeCaps { cpus: 32, gpus: 8 };
        // (spec, nodes, tasks/node, per-node tres)
        let cases: Vec<(JobSpec, u32, u32, Tres)> = vec![
            (JobSpec::test(), 1, 1, Tres::new(1, 0, 0)),
            (
                JobSpec::test().nodes(2).gpus_per_node(8),
                2,
                1,
                Tres::new(1, 0, 8),
            ),
            (JobSpec::test().ntasks(64), 2, 32, Tres::new(32, 0, 0)),
            (
                JobSpec::test().ntasks(8).cpus_per_task(4).mem_per_cpu(1000),
                1,
                8,
                Tres::new(32, 32_000, 0),
            ),
            (JobSpec::test().gpus(16), 2, 1, Tres::new(1, 0, 8)),
            (
                JobSpec::test()
                    .nodes(2)
                    .ntasks(4)
                    .with(|s| s.gpus_per_task = 2),
                2,
                2,
                Tres::new(2, 0, 4),
            ),
            (JobSpec::test().mem_mb(4096), 1, 1, Tres::new(1, 4096, 0)),
            // Without -N, tasks spread until their GPUs fit (8 a node here).
            (
                JobSpec::test().ntasks(4).with(|s| s.gpus_per_task = 4),
                2,
                2,
                Tres::new(2, 0, 8),
            ),
        ];
        for (spec, nodes, tpn, per_node) in cases {
            let s = spec.shape(caps, 0);
            assert_eq!(
                (s.nodes, s.tasks_per_node, s.per_node),
                (nodes, tpn, per_node),
                "{spec:?}"
            );
        }
        assert_eq!(
            JobSpec::test()
                .cpus_per_task(2)
                .shape(caps, 100)
                .per_node
                .mem_mb,
            200
        );
    }

    #[test]
    fn array_ids_fold() {
        let mut job = Job::test(JobId(12), JobSpec::test().array("6-99%4"));
        job.array = Some(Box::new(ArrayState::new(
            job.spec.array.as_deref().unwrap(),
        )));
        assert_eq!(job.display_id(), "12_[6-99%4]");
        let task = Job {
            array: None,
            array_job_id: Some(JobId(12)),
            array_task_id: Some(3),
            ..job
        };
        assert_eq!(task.display_id(), "12_3");
    }
}
