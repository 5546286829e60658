//! `State`: the whole cluster model, changed only through event methods.
//!
//! Every event method validates first and changes nothing when it returns an error. Each
//! change marks the touched job and node records in [`Changes`], which the controller takes
//! after the call to know exactly what to persist. Side effects the controller must carry
//! out come back as [`Effect`]s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::account::{AccountConfig, UserConfig};
use crate::array::{ArrayState, IndexSet};
use crate::config::{ClusterConfig, ConfigError};
use crate::dependency::{DepStatus, DepTarget, TargetStatus};
use crate::effect::{Effect, RunRecord, SignalReason};
use crate::fairshare::{AssocIdx, AssocTree, FairShareError};
use crate::job::{
    Allocation, Hold, Job, JobOutcome, JobSpec, JobState, KillReason, NodeAlloc, NodeCaps,
    PreemptMode, Reason, SpecError,
};
use crate::node::{Health, Node, NodeMode};
use crate::partition::{Partition, PartitionState};
use crate::qos::{DEFAULT_QOS, Qos};
use crate::{JobId, NodeId, Tres};

/// Records changed since the last [`State::take_changes`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Jobs created or changed: persist `state.job(id)`.
    pub jobs: BTreeSet<JobId>,
    /// Nodes created or changed: persist `state.node(id)`.
    pub nodes: BTreeSet<NodeId>,
    /// Jobs removed by [`State::purge_finished`]: delete their records.
    pub removed_jobs: Vec<JobId>,
    /// The configuration changed (partitions, QOS, accounts): persist `state.config()`.
    pub config: bool,
    /// The account tree changed (usage charged, associations added): persist
    /// `state.assoc()`.
    pub assoc: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.nodes.is_empty()
            && self.removed_jobs.is_empty()
            && !self.config
            && !self.assoc
    }
}

/// Pending demand of one partition (see [`State::pending_demand`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Demand {
    pub jobs: u64,
    pub gpus: u64,
    pub nodes: u64,
}

/// Who asks for a change to a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requester {
    pub user: String,
    /// Operators and root may act on any job and set admin holds.
    pub admin: bool,
}

impl Requester {
    pub fn user(name: impl Into<String>) -> Requester {
        Requester {
            user: name.into(),
            admin: false,
        }
    }
    pub fn admin() -> Requester {
        Requester {
            user: "root".into(),
            admin: true,
        }
    }
    fn may_touch(&self, job: &Job) -> bool {
        self.admin || job.spec.user == self.user
    }
}

/// A job, or some tasks of an array: `12`, `12_3`, `12_[3-5]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSelector {
    pub job: JobId,
    /// `None` = the whole job or array.
    pub tasks: Option<IndexSet>,
}

impl JobSelector {
    pub fn job(id: JobId) -> JobSelector {
        JobSelector {
            job: id,
            tasks: None,
        }
    }

    /// Parses `12`, `12_3`, `12_[3-5,7]`.
    pub fn parse(s: &str) -> Result<JobSelector, JobError> {
        let bad = || JobError::BadSelector(s.chars().take(64).collect());
        let (id, tasks) = match s.trim().split_once('_') {
            Some((id, t)) => (id, Some(IndexSet::parse(t, u32::MAX).map_err(|_| bad())?)),
            None => (s.trim(), None),
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let id: u64 = id.parse().map_err(|_| bad())?;
        Ok(JobSelector {
            job: JobId(id),
            tasks,
        })
    }
}

impl std::fmt::Display for JobSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tasks {
            None => write!(f, "{}", self.job),
            Some(t) if t.len() == 1 => write!(f, "{}_{}", self.job, t),
            Some(t) => write!(f, "{}_[{}]", self.job, t),
        }
    }
}

/// Why a submission was refused. Messages name the problem in Slurm's terms.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubmitError {
    #[error("invalid job: {0}")]
    Invalid(#[from] SpecError),
    #[error("invalid partition name specified: {0:?}")]
    UnknownPartition(String),
    #[error("partition {partition} is {state} and accepts no new jobs")]
    PartitionClosed {
        partition: String,
        state: PartitionState,
    },
    #[error("invalid qos specification: {0:?}")]
    UnknownQos(String),
    #[error("invalid account: {0:?}")]
    UnknownAccount(String),
    #[error("account {account} may not use partition {partition}")]
    AccountNotAllowed { account: String, partition: String },
    #[error("user {user} has no association with account {account}")]
    NoAssociation { user: String, account: String },
    #[error("requested node configuration is not available: {0}")]
    Unsatisfiable(String),
    #[error("job dependency problem: {0}")]
    Dependency(String),
    #[error(
        "job violates QOS {qos} limit MaxSubmitJobs{per}={limit} (QOSMaxSubmitJobPerUserLimit)"
    )]
    SubmitLimit {
        qos: String,
        per: &'static str,
        limit: u32,
    },
    #[error("array index {index} exceeds MaxArraySize={max}")]
    ArrayTooLarge { index: u32, max: u32 },
    #[error("job id space exhausted")]
    IdsExhausted,
}

/// Why an operation on an existing job was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JobError {
    #[error("invalid job id specified: {0}")]
    NotFound(String),
    #[error("bad job id {0:?} (expected JOBID, JOBID_TASK or JOBID_[TASKS])")]
    BadSelector(String),
    #[error("access denied: job {job} belongs to {owner}")]
    PermissionDenied { job: JobId, owner: String },
    #[error("job {job} is {state}: cannot {op}")]
    InvalidState {
        job: JobId,
        state: JobState,
        op: &'static str,
    },
    #[error("job {job}: {problem}")]
    Invalid { job: JobId, problem: String },
}

/// Why a node event was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NodeError {
    #[error("invalid node name {0:?}")]
    BadName(String),
    #[error("unknown node {0:?}")]
    Unknown(String),
    #[error("node {node}: {problem}")]
    Invalid { node: String, problem: String },
}

/// Why accounts or QOS could not be changed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AdminError {
    #[error(transparent)]
    Tree(#[from] FairShareError),
    #[error("{0}")]
    Invalid(String),
}

/// Accounts, users, QOS and the tree as they were; see [`State::accounting_snapshot`].
#[derive(Clone, Debug)]
pub struct AccountingSnapshot {
    accounts: Vec<AccountConfig>,
    users: Vec<UserConfig>,
    qos: Vec<Qos>,
    assoc: AssocTree,
    config_changed: bool,
    assoc_changed: bool,
}

/// What a worker reports when it (re)registers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub name: String,
    pub total: Tres,
    pub gpu_type: Option<String>,
    pub features: Vec<String>,
    /// Partitions the worker asks to join (worker sets name theirs); must exist.
    pub partitions: Vec<String>,
    /// Jobs the worker still runs.
    pub running_jobs: Vec<JobId>,
}

/// Fields `scontrol update job` may change; `None` = unchanged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobUpdate {
    pub time_limit: Option<Option<u64>>,
    pub partition: Option<String>,
    pub name: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub nice: Option<i32>,
    pub dependency: Option<Option<crate::dependency::Dependency>>,
    pub priority: Option<Option<u64>>,
}

/// What the controller persisted, to rebuild a `State` after a restart.
#[derive(Clone, Debug)]
pub struct RestoreInput {
    pub config: ClusterConfig,
    /// Every job record not purged (pending, running, finished).
    pub jobs: Vec<Job>,
    /// Every node record; ids must be `0..n`.
    pub nodes: Vec<Node>,
    /// The persisted next id; raised above every restored job id if needed.
    pub next_job_id: u64,
    /// The persisted account tree (with usage); `None` rebuilds it from the config.
    pub assoc: Option<AssocTree>,
    /// When usage was last charged (persist with the tree).
    pub usage_charged_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum RestoreError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("node records are not numbered 0..n: {0}")]
    NodeIds(String),
    #[error("job {job}: {problem}")]
    Job { job: JobId, problem: String },
    #[error(transparent)]
    Tree(#[from] FairShareError),
}

/// The cluster model. See the crate docs for the event/plan cycle.
#[derive(Clone, Debug)]
pub struct State {
    pub(crate) config: ClusterConfig,
    /// Every job record, finished ones until purged. BTreeMap: queries list in id order.
    pub(crate) jobs: BTreeMap<JobId, Job>,
    /// Node table; a node's id is its index. Never shrinks (see `NodeId`).
    pub(crate) nodes: Vec<Node>,
    pub(crate) node_by_name: HashMap<String, NodeId>,
    /// Members of each partition (index of `config.partitions`), derived from node records.
    pub(crate) part_nodes: Vec<Vec<NodeId>>,
    /// Per partition: the distinct node sizes (`total`) of its members with their counts,
    /// filled on first use after a membership or size change. Lets `submit` check a request
    /// against a 10k-node partition in a few steps instead of a scan of every node.
    part_totals: Vec<std::cell::OnceCell<Vec<(Tres, u32)>>>,
    /// Records a pass must look at: pending jobs and array metas with pending indices.
    pub(crate) pending: BTreeSet<JobId>,
    /// Jobs holding an allocation.
    pub(crate) running: BTreeSet<JobId>,
    pub(crate) next_job_id: u64,
    pub(crate) assoc: AssocTree,
    /// Non-terminal jobs (array tasks counted one by one) per (user, qos) and (account, qos),
    /// for MaxSubmitJobs limits without scanning every job at submit.
    pub(crate) submitted_user: PairCounts,
    pub(crate) submitted_account: PairCounts,
    /// Preemptors waiting for their victims to end: not given more victims meanwhile.
    pub(crate) preempting: BTreeMap<JobId, Vec<JobId>>,
    pub(crate) usage_charged_at: Option<i64>,
    pub(crate) changes: Changes,
}

// === construction and queries ===

impl State {
    /// An empty cluster under `config`.
    pub fn new(config: ClusterConfig) -> Result<State, ConfigError> {
        config.validate()?;
        let assoc = tree_from_config(&config).map_err(|e| ConfigError(e.to_string()))?;
        let parts = config.partitions.len();
        Ok(State {
            config,
            jobs: BTreeMap::new(),
            nodes: Vec::new(),
            node_by_name: HashMap::new(),
            part_nodes: vec![Vec::new(); parts],
            part_totals: vec![std::cell::OnceCell::new(); parts],
            pending: BTreeSet::new(),
            running: BTreeSet::new(),
            next_job_id: 1,
            assoc,
            submitted_user: PairCounts::default(),
            submitted_account: PairCounts::default(),
            preempting: BTreeMap::new(),
            usage_charged_at: None,
            changes: Changes::default(),
        })
    }

    /// Rebuilds the model from persisted records after a controller restart. Running jobs
    /// stay RUNNING on their nodes; nodes are UNKNOWN until their workers register again
    /// (and are then reconciled with what the workers report).
    pub fn restore(input: RestoreInput) -> Result<State, RestoreError> {
        let RestoreInput {
            config,
            jobs,
            mut nodes,
            next_job_id,
            assoc,
            usage_charged_at,
        } = input;
        let mut st = State::new(config)?;
        // The account and user lists shape the tree (a tree stored before the lists were, or
        // lists edited since, must not leave jobs charging associations the lists lack); the
        // stored tree supplies the usage.
        if let Some(tree) = assoc {
            if tree_matches(&tree, &st.config) {
                // Kept as stored: same associations, and sshare's order (creation order)
                // survives the restart.
                st.assoc = tree;
            } else {
                st.assoc.carry_usage_from(&tree);
            }
        }
        st.usage_charged_at = usage_charged_at;
        nodes.sort_by_key(|n| n.id);
        for (i, mut n) in nodes.into_iter().enumerate() {
            if n.id.index() != i {
                return Err(RestoreError::NodeIds(format!(
                    "expected id {i}, found {} ({})",
                    n.id.0, n.name
                )));
            }
            if st.node_by_name.contains_key(&n.name) {
                return Err(RestoreError::NodeIds(format!(
                    "node name {} repeated",
                    n.name
                )));
            }
            n.alloc = Tres::ZERO;
            n.gpus_in_use = 0;
            n.jobs.clear();
            n.exclusive = false;
            if n.health == Health::Up {
                n.health = Health::Unknown;
            }
            st.node_by_name.insert(n.name.clone(), n.id);
            st.nodes.push(n);
        }
        st.rebuild_partitions();
        let mut max_id = 0;
        for job in jobs {
            max_id = max_id.max(job.id.0);
            if job.state == JobState::Running && !job.is_array_meta() {
                let Some(alloc) = job.alloc.as_deref() else {
                    return Err(RestoreError::Job {
                        job: job.id,
                        problem: "RUNNING without an allocation".into(),
                    });
                };
                for na in &alloc.nodes {
                    if na.node.index() >= st.nodes.len() {
                        return Err(RestoreError::Job {
                            job: job.id,
                            problem: format!("allocation names unknown {}", na.node),
                        });
                    }
                }
                let alloc = alloc.clone();
                st.attach(job.id, &alloc, job.spec.mode, job.shape.exclusive);
            }
            let id = job.id;
            st.jobs.insert(id, job);
            st.index(id);
        }
        st.next_job_id = next_job_id.max(max_id + 1).max(1);
        st.changes = Changes::default();
        Ok(st)
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }
    /// Every job record, in id order.
    pub fn jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.jobs.values()
    }
    /// Pending records (jobs and array metas with pending indices), in id order.
    pub fn pending_jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.pending.iter().filter_map(|id| self.jobs.get(id))
    }
    /// Jobs holding an allocation, in id order.
    pub fn running_jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.running.iter().filter_map(|id| self.jobs.get(id))
    }
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }
    /// A node of the cluster by name (not one removed).
    pub fn node_by_name(&self, name: &str) -> Option<&Node> {
        self.node_by_name
            .get(name)
            .and_then(|id| self.nodes.get(id.index()))
            .filter(|n| !n.removed)
    }
    /// The cluster's nodes (not those removed).
    pub fn nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        self.nodes.iter().filter(|n| !n.removed)
    }
    pub fn partitions(&self) -> impl Iterator<Item = &Partition> + '_ {
        self.config.partitions.iter()
    }
    /// Member nodes of a partition.
    pub fn partition_nodes(&self, name: &str) -> impl Iterator<Item = &Node> + '_ {
        let idx = self.config.partitions.iter().position(|p| p.name == name);
        idx.map(|i| self.part_nodes[i].as_slice())
            .unwrap_or(&[])
            .iter()
            .map(|id| &self.nodes[id.index()])
    }
    pub fn next_job_id(&self) -> u64 {
        self.next_job_id
    }
    /// The account tree with shares and usage (for sshare, and to persist).
    pub fn assoc(&self) -> &AssocTree {
        &self.assoc
    }
    pub fn usage_charged_at(&self) -> Option<i64> {
        self.usage_charged_at
    }
    /// The job's nodes in host-list form (`gpu-[01-02]`); empty when it has none.
    pub fn nodelist(&self, job: &Job) -> String {
        match &job.alloc {
            Some(a) => crate::hostlist::compress(
                &a.nodes
                    .iter()
                    .map(|n| self.nodes[n.node.index()].name.as_str())
                    .collect::<Vec<_>>(),
            ),
            None => String::new(),
        }
    }
    /// Node names of an allocation, in allocation order (first = batch host).
    pub fn node_names(&self, job: &Job) -> Vec<&str> {
        job.alloc
            .as_ref()
            .map(|a| {
                a.nodes
                    .iter()
                    .map(|n| self.nodes[n.node.index()].name.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }
    /// The record of task `index` of array `array`, if it has started.
    pub fn array_task(&self, array: JobId, index: u32) -> Option<&Job> {
        let meta = self.jobs.get(&array)?;
        let id = meta.array.as_ref()?.task_job(index)?;
        self.jobs.get(&id)
    }

    /// Pending work per partition, for autoscaling metrics (pending jobs and GPUs, array
    /// indices counted one by one). Held jobs and jobs waiting on dependencies count too:
    /// they are demand a scaler may want to see; filter by reason if not.
    pub fn pending_demand(&self) -> BTreeMap<String, Demand> {
        let mut out: BTreeMap<String, Demand> = self
            .config
            .partitions
            .iter()
            .map(|p| (p.name.clone(), Demand::default()))
            .collect();
        for job in self.pending_jobs() {
            let n = job.array.as_ref().map_or(1, |a| a.pending.len());
            let d = out.entry(job.spec.partition.clone()).or_default();
            d.jobs += n;
            d.gpus += n.saturating_mul(u64::from(job.shape.total().gpus));
            d.nodes += n.saturating_mul(u64::from(job.shape.nodes));
        }
        out
    }

    /// Records changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Runs a scheduling pass; see [`crate::cycle`].
    pub fn schedule(&mut self, now: i64) -> crate::cycle::Plan {
        crate::cycle::schedule(self, now)
    }
}

fn tree_from_config(config: &ClusterConfig) -> Result<AssocTree, FairShareError> {
    let mut tree = AssocTree::new();
    for a in &config.accounts {
        tree.add_account(
            &a.name,
            a.parent
                .as_deref()
                .unwrap_or(crate::fairshare::ROOT_ACCOUNT),
            a.shares,
        )?;
    }
    for u in &config.users {
        tree.add_user(&u.user, &u.account, u.shares)?;
    }
    Ok(tree)
}

/// Whether a stored tree has exactly the accounts and users of the lists, with their
/// parents and shares.
fn tree_matches(tree: &AssocTree, config: &ClusterConfig) -> bool {
    use crate::fairshare::{AssocKind, ROOT_ACCOUNT};
    let live = tree.walk();
    let accounts = live
        .iter()
        .filter(|(i, _)| tree.kind(*i) == AssocKind::Account)
        .count();
    if accounts != config.accounts.len() + 1 || live.len() != accounts + config.users.len() {
        return false;
    }
    let accounts_ok = config.accounts.iter().all(|a| {
        tree.account(&a.name).is_some_and(|i| {
            let parent = tree.parent(i).map(|p| tree.name(p));
            tree.shares(i) == a.shares
                && parent == Some(a.parent.as_deref().unwrap_or(ROOT_ACCOUNT))
        })
    });
    accounts_ok
        && config.users.iter().all(|u| {
            tree.user(&u.user, &u.account)
                .is_some_and(|i| tree.shares(i) == u.shares)
        })
}

// === indexes ===

impl State {
    /// Removes a job from the derived indexes; call before changing it.
    pub(crate) fn unindex(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        self.pending.remove(&id);
        self.running.remove(&id);
        let w = submit_weight(job);
        if w > 0 {
            self.submitted_user.sub(&job.spec.qos, &job.spec.user, w);
            self.submitted_account
                .sub(&job.spec.qos, &job.spec.account, w);
        }
    }

    /// Adds a job to the derived indexes and marks it changed.
    pub(crate) fn index(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let schedulable = match &job.array {
            Some(a) => job.state == JobState::Pending && !a.pending.is_empty(),
            None => job.state == JobState::Pending,
        };
        if schedulable {
            self.pending.insert(id);
        }
        if job.state == JobState::Running && job.alloc.is_some() {
            self.running.insert(id);
        }
        let w = submit_weight(job);
        if w > 0 {
            self.submitted_user.add(&job.spec.qos, &job.spec.user, w);
            self.submitted_account
                .add(&job.spec.qos, &job.spec.account, w);
        }
        self.changes.jobs.insert(id);
    }

    /// Changes a job with its indexes kept right. Returns `None` if the job is unknown.
    pub(crate) fn with_job<R>(&mut self, id: JobId, f: impl FnOnce(&mut Job) -> R) -> Option<R> {
        if !self.jobs.contains_key(&id) {
            return None;
        }
        self.unindex(id);
        let r = self.jobs.get_mut(&id).map(f);
        self.index(id);
        r
    }

    fn rebuild_partitions(&mut self) {
        self.part_nodes = vec![Vec::new(); self.config.partitions.len()];
        self.part_totals = vec![std::cell::OnceCell::new(); self.config.partitions.len()];
        // Expand each partition's host list once, not once per node.
        let lists: Vec<Option<std::collections::HashSet<String>>> = self
            .config
            .partitions
            .iter()
            .map(|p| {
                p.nodes.as_ref().map(|e| {
                    crate::hostlist::expand(e)
                        .unwrap_or_default()
                        .into_iter()
                        .collect()
                })
            })
            .collect();
        for i in 0..self.nodes.len() {
            self.place_in_partitions(NodeId(i as u32), &lists);
        }
    }

    /// Recomputes one node's partitions (after it registers).
    fn refresh_partitions_of(&mut self, id: NodeId) {
        let lists: Vec<Option<std::collections::HashSet<String>>> = self
            .config
            .partitions
            .iter()
            .map(|p| match &p.nodes {
                // Only this node's membership matters: test it alone instead of expanding.
                Some(e) => {
                    let name = &self.nodes[id.index()].name;
                    let hit = crate::hostlist::expand(e)
                        .map(|v| v.iter().any(|n| n == name))
                        .unwrap_or(false);
                    Some(if hit {
                        std::iter::once(name.clone()).collect()
                    } else {
                        Default::default()
                    })
                }
                None => None,
            })
            .collect();
        for members in &mut self.part_nodes {
            members.retain(|n| *n != id);
        }
        // Its size may have changed too (registration sets it first).
        for totals in &mut self.part_totals {
            totals.take();
        }
        self.place_in_partitions(id, &lists);
    }

    fn place_in_partitions(
        &mut self,
        id: NodeId,
        lists: &[Option<std::collections::HashSet<String>>],
    ) {
        let n = &mut self.nodes[id.index()];
        if n.removed {
            n.partitions.clear();
            return;
        }
        let mut names = Vec::new();
        for (i, p) in self.config.partitions.iter().enumerate() {
            let member = n.partitions.iter().any(|x| x == &p.name)
                || match &lists[i] {
                    None => true,
                    Some(set) => set.contains(&n.name),
                };
            if member {
                // Kept sorted by id so passes visit nodes in a stable order.
                let members = &mut self.part_nodes[i];
                let at = members.partition_point(|m| *m < id);
                members.insert(at, id);
                names.push(p.name.clone());
            }
        }
        n.partitions = names;
    }

    /// Puts an allocation on its nodes.
    pub(crate) fn attach(
        &mut self,
        job: JobId,
        alloc: &Allocation,
        mode: NodeMode,
        exclusive: bool,
    ) {
        for na in &alloc.nodes {
            let n = &mut self.nodes[na.node.index()];
            if n.jobs.is_empty() {
                n.mode = mode;
            }
            n.alloc = n.alloc.saturating_add(&na.tres());
            for g in &na.gpus {
                if *g < 64 {
                    n.gpus_in_use |= 1u64 << g;
                }
            }
            n.jobs.push(job);
            n.exclusive |= exclusive;
            self.changes.nodes.insert(na.node);
        }
    }

    /// Takes an allocation off its nodes.
    pub(crate) fn detach(&mut self, job: JobId, alloc: &Allocation) {
        for na in &alloc.nodes {
            let n = &mut self.nodes[na.node.index()];
            n.alloc = n.alloc.saturating_sub(&na.tres());
            for g in &na.gpus {
                if *g < 64 {
                    n.gpus_in_use &= !(1u64 << g);
                }
            }
            n.jobs.retain(|j| *j != job);
            if n.jobs.is_empty() {
                n.exclusive = false;
                n.alloc = Tres::ZERO;
                n.gpus_in_use = 0;
            }
            self.changes.nodes.insert(na.node);
        }
    }
}

/// Counts keyed by two names (QOS, then user or account). Nested maps so that lookups and
/// updates borrow `&str` keys: this runs on every job change and must not allocate.
#[derive(Clone, Debug, Default)]
pub(crate) struct PairCounts(HashMap<String, HashMap<String, u64>>);

impl PairCounts {
    pub(crate) fn get(&self, a: &str, b: &str) -> u64 {
        self.0.get(a).and_then(|m| m.get(b)).copied().unwrap_or(0)
    }
    fn add(&mut self, a: &str, b: &str, w: u64) {
        let inner = match self.0.get_mut(a) {
            Some(m) => m,
            None => self.0.entry(a.to_string()).or_default(),
        };
        match inner.get_mut(b) {
            Some(c) => *c += w,
            None => {
                inner.insert(b.to_string(), w);
            }
        }
    }
    fn sub(&mut self, a: &str, b: &str, w: u64) {
        if let Some(c) = self.0.get_mut(a).and_then(|m| m.get_mut(b)) {
            *c = c.saturating_sub(w);
        }
    }
}

/// How many submit-limit units a record holds: its pending indices for an array meta, one for
/// any other job that is not finished.
fn submit_weight(job: &Job) -> u64 {
    match &job.array {
        Some(a) => a.pending.len(),
        None if !job.state.is_terminal() => 1,
        None => 0,
    }
}

// === submit ===

impl State {
    /// Accepts a job: validates it against the cluster, assigns the next id, and records it
    /// PENDING. An array stays one record.
    pub fn submit(&mut self, mut spec: JobSpec, now: i64) -> Result<JobId, SubmitError> {
        spec.validate()?;
        // Partition.
        let part_idx = if spec.partition.is_empty() {
            self.config
                .partitions
                .iter()
                .position(|p| p.default)
                .unwrap_or(0)
        } else {
            self.config
                .partitions
                .iter()
                .position(|p| p.name == spec.partition)
                .ok_or_else(|| SubmitError::UnknownPartition(spec.partition.clone()))?
        };
        let part = &self.config.partitions[part_idx];
        if matches!(part.state, PartitionState::Drain | PartitionState::Inactive) {
            return Err(SubmitError::PartitionClosed {
                partition: part.name.clone(),
                state: part.state,
            });
        }
        spec.partition = part.name.clone();
        // QOS.
        if spec.qos.is_empty() {
            spec.qos = DEFAULT_QOS.to_string();
        }
        let qos = self
            .config
            .qos(&spec.qos)
            .ok_or_else(|| SubmitError::UnknownQos(spec.qos.clone()))?;
        // Account.
        if spec.account.is_empty() {
            spec.account = self.default_account(&spec.user);
        }
        if self.assoc.account(&spec.account).is_none() {
            return Err(SubmitError::UnknownAccount(spec.account.clone()));
        }
        if !part.allows_account(&spec.account) {
            return Err(SubmitError::AccountNotAllowed {
                account: spec.account.clone(),
                partition: part.name.clone(),
            });
        }
        let has_assoc = self.assoc.user(&spec.user, &spec.account).is_some();
        if !has_assoc && self.config.sched.enforce_associations {
            return Err(SubmitError::NoAssociation {
                user: spec.user.clone(),
                account: spec.account.clone(),
            });
        }
        // Array.
        if let Some(a) = &spec.array {
            if a.indices.is_empty() {
                return Err(SpecError::Invalid {
                    field: "array",
                    problem: "no indices".into(),
                }
                .into());
            }
            let max = self.config.sched.max_array_size;
            if let Some(last) = a.indices.last()
                && last >= max
            {
                return Err(SubmitError::ArrayTooLarge { index: last, max });
            }
        }
        // Dependencies must name jobs that exist.
        if let Some(dep) = &spec.dependency {
            for t in dep.targets() {
                let Some(target) = self.jobs.get(&t.job) else {
                    return Err(SubmitError::Dependency(format!("job {} not found", t.job)));
                };
                if let Some(task) = t.task
                    && !target.is_array_meta()
                {
                    return Err(SubmitError::Dependency(format!(
                        "job {} is not an array (task {task} requested)",
                        t.job
                    )));
                }
            }
        }
        // Submit limits.
        let weight = spec.array.as_ref().map_or(1, |a| a.indices.len());
        if let Some(limit) = qos.limits.max_submit_per_user {
            let have = self.submitted_user.get(&spec.qos, &spec.user);
            if have + weight > u64::from(limit) {
                return Err(SubmitError::SubmitLimit {
                    qos: qos.name.clone(),
                    per: "PerUser",
                    limit,
                });
            }
        }
        if let Some(limit) = qos.limits.max_submit_per_account {
            let have = self.submitted_account.get(&spec.qos, &spec.account);
            if have + weight > u64::from(limit) {
                return Err(SubmitError::SubmitLimit {
                    qos: qos.name.clone(),
                    per: "PerAccount",
                    limit,
                });
            }
        }
        // Nodes named with -w must exist.
        for n in &spec.nodelist {
            if !self.node_by_name.contains_key(n) {
                return Err(SubmitError::Unsatisfiable(format!(
                    "unknown node {n:?} in --nodelist"
                )));
            }
        }
        let shape = spec.shape(
            self.partition_caps(part_idx),
            self.config.sched.default_mem_per_cpu_mb,
        );
        self.check_satisfiable(part_idx, &spec, &shape)?;
        let time_limit = spec.time_limit.or(part.default_limit());
        if self.next_job_id >= u64::MAX - 1 {
            return Err(SubmitError::IdsExhausted);
        }
        // Everything checked: now change state.
        if !has_assoc {
            // Slurm without association enforcement: the user is associated on first use.
            let _ =
                self.assoc
                    .add_user(&spec.user, &spec.account, crate::fairshare::DEFAULT_SHARES);
            self.changes.assoc = true;
        }
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        let hold = if spec.hold { Hold::User } else { Hold::None };
        let has_dependency = spec.dependency.is_some();
        let array = spec.array.as_deref().map(|a| Box::new(ArrayState::new(a)));
        let mut job = Job {
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
        };
        if has_dependency {
            // Dependencies are judged by the pass, which sees the whole queue (singleton);
            // the pass records the job's eligibility when it comes.
            job.reason = match hold {
                Hold::None if job.spec.begin.is_some_and(|b| b > now) => Reason::BeginTime,
                Hold::None => Reason::None,
                _ => Reason::JobHeldUser,
            };
        } else {
            // Known now, as Slurm shows it at once (a held or later job triggers no pass that
            // would say why). A job that could be considered right away is eligible from its
            // submit, so its age counts from now and the first pass has nothing durable to
            // change about it: one write per submit, not two.
            match crate::cycle::ineligible_reason(self, &job, &HashSet::new(), now) {
                Some(r) => job.reason = r,
                None => job.eligible_time = Some(now),
            }
        }
        self.jobs.insert(id, job);
        self.index(id);
        Ok(id)
    }

    fn default_account(&self, user: &str) -> String {
        let mine = self.config.users.iter().filter(|u| u.user == user);
        let mut first = None;
        for u in mine {
            if u.default {
                return u.account.clone();
            }
            first.get_or_insert_with(|| u.account.clone());
        }
        first.unwrap_or_else(|| crate::fairshare::ROOT_ACCOUNT.to_string())
    }

    /// The distinct node sizes of a partition's members, with counts (cached).
    fn partition_totals(&self, part_idx: usize) -> &[(Tres, u32)] {
        self.part_totals[part_idx].get_or_init(|| {
            let mut sizes: HashMap<Tres, u32> = HashMap::new();
            for id in &self.part_nodes[part_idx] {
                *sizes.entry(self.nodes[id.index()].total).or_default() += 1;
            }
            sizes.into_iter().collect()
        })
    }

    /// The largest CPU and GPU counts of the partition's nodes (any health).
    pub(crate) fn partition_caps(&self, part_idx: usize) -> NodeCaps {
        let mut caps = NodeCaps::default();
        for (t, _) in self.partition_totals(part_idx) {
            caps.cpus = caps.cpus.max(t.cpus);
            caps.gpus = caps.gpus.max(t.gpus);
        }
        caps
    }

    /// Rejects a request that no set of nodes of the partition could ever satisfy (counting
    /// nodes that are down: they may come back). A partition without nodes accepts anything,
    /// so demand can scale an empty worker set up from zero.
    fn check_satisfiable(
        &self,
        part_idx: usize,
        spec: &JobSpec,
        shape: &crate::job::Shape,
    ) -> Result<(), SubmitError> {
        let members = &self.part_nodes[part_idx];
        if members.is_empty() {
            return Ok(());
        }
        let pname = &self.config.partitions[part_idx].name;
        // Partition MaxNodes/MaxTime are not checked here: as with Slurm's default
        // (EnforcePartLimits=NO) such jobs stay pending with a reason an update can fix.
        let need = shape.per_node;
        let mut fit = 0u32;
        let (mut max_cpus, mut max_mem, mut max_gpus) = (0, 0, 0);
        let mut type_seen = false;
        let mut feature_seen = false;
        if spec.exclude.is_empty() && spec.gpu_type.is_none() && spec.constraint.is_none() {
            // Only sizes matter: count from the cached size table.
            for (t, count) in self.partition_totals(part_idx) {
                max_cpus = max_cpus.max(t.cpus);
                max_mem = max_mem.max(t.mem_mb);
                max_gpus = max_gpus.max(t.gpus);
                if need.fits_in(t) {
                    fit = fit.saturating_add(*count);
                }
            }
        }
        let filtered =
            !(spec.exclude.is_empty() && spec.gpu_type.is_none() && spec.constraint.is_none());
        for id in members.iter().filter(|_| filtered) {
            let n = &self.nodes[id.index()];
            if spec.exclude.contains(&n.name) {
                continue;
            }
            if let Some(t) = &spec.gpu_type
                && n.gpu_type.as_deref() != Some(t.as_str())
            {
                continue;
            }
            type_seen = true;
            if let Some(c) = &spec.constraint
                && !c.matches(&n.features)
            {
                continue;
            }
            feature_seen = true;
            max_cpus = max_cpus.max(n.total.cpus);
            max_mem = max_mem.max(n.total.mem_mb);
            max_gpus = max_gpus.max(n.total.gpus);
            if need.fits_in(&n.total) {
                fit += 1;
            }
        }
        for n in &spec.nodelist {
            let Some(id) = self.node_by_name.get(n) else {
                continue;
            };
            if !members.contains(id) {
                return Err(SubmitError::Unsatisfiable(format!(
                    "node {n} is not in partition {pname}"
                )));
            }
            if !need.fits_in(&self.nodes[id.index()].total) {
                return Err(SubmitError::Unsatisfiable(format!(
                    "node {n} is too small for the request"
                )));
            }
        }
        if let Some(t) = &spec.gpu_type
            && !type_seen
        {
            return Err(SubmitError::Unsatisfiable(format!(
                "no node in partition {pname} has GPU type {t}"
            )));
        }
        if let Some(c) = &spec.constraint
            && !feature_seen
        {
            return Err(SubmitError::Unsatisfiable(format!(
                "no node in partition {pname} has features {c}"
            )));
        }
        if need.gpus > max_gpus {
            return Err(SubmitError::Unsatisfiable(format!(
                "requested {} GPUs per node but the largest node in partition {pname} has {max_gpus}",
                need.gpus
            )));
        }
        if need.cpus > max_cpus {
            return Err(SubmitError::Unsatisfiable(format!(
                "requested {} CPUs per node but the largest node in partition {pname} has {max_cpus}",
                need.cpus
            )));
        }
        if need.mem_mb > max_mem {
            return Err(SubmitError::Unsatisfiable(format!(
                "requested {} MB of memory per node but the largest node in partition {pname} has {max_mem} MB",
                need.mem_mb
            )));
        }
        if fit < shape.nodes {
            return Err(SubmitError::Unsatisfiable(format!(
                "requested {} nodes but partition {pname} has {fit} that fit the request",
                shape.nodes
            )));
        }
        Ok(())
    }
}

// === job control: cancel, hold, release, requeue, update ===

impl State {
    /// Cancels a job, an array (its pending indices and running tasks), or some array tasks.
    /// Pending work becomes CANCELLED at once; running work gets a `Terminate` effect and
    /// ends CANCELLED when its worker reports.
    pub fn cancel(
        &mut self,
        sel: &JobSelector,
        by: &Requester,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self.job_for(by, sel.job, &sel)?;
        // Resolve the selection to (pending indices of a meta, job records) first.
        let mut pending_indices: Option<IndexSet> = None;
        let mut targets: Vec<JobId> = Vec::new();
        match (&job.array, &sel.tasks) {
            (Some(a), None) => {
                if job.state.is_terminal() {
                    return Err(JobError::InvalidState {
                        job: job.id,
                        state: job.state,
                        op: "cancel",
                    });
                }
                pending_indices = Some(a.pending.clone());
                targets.extend(a.tasks.iter().map(|(_, j)| *j));
            }
            (Some(a), Some(tasks)) => {
                let idx = IndexSet::from_sorted(a.pending.intersection(tasks).collect::<Vec<_>>());
                // Walk the started tasks, not the selection: `12_[0-4000000000]` is one run
                // to parse but four billion indices to iterate.
                let started: Vec<JobId> = a
                    .tasks
                    .iter()
                    .filter(|(i, _)| tasks.contains(*i))
                    .map(|(_, j)| *j)
                    .collect();
                if idx.is_empty() && started.is_empty() {
                    return Err(JobError::NotFound(sel.to_string()));
                }
                pending_indices = Some(idx);
                targets.extend(started);
            }
            (None, Some(_)) => return Err(JobError::NotFound(sel.to_string())),
            (None, None) => {
                if job.state.is_terminal() {
                    return Err(JobError::InvalidState {
                        job: job.id,
                        state: job.state,
                        op: "cancel",
                    });
                }
                targets.push(job.id);
            }
        }
        let mut effects = Vec::new();
        if let Some(idx) = pending_indices
            && !idx.is_empty()
        {
            let meta_id = sel.job;
            let n = idx.len();
            self.with_job(meta_id, |m| {
                if let Some(a) = m.array.as_mut() {
                    if idx == a.pending {
                        a.pending = IndexSet::new();
                    } else {
                        for i in idx.iter() {
                            a.pending.remove(i);
                        }
                    }
                    a.not_ok += n;
                    a.cancelled += n;
                }
            });
            self.settle_array(meta_id, now);
        }
        for id in targets {
            effects.extend(self.cancel_one(id, now));
        }
        Ok(effects)
    }

    fn cancel_one(&mut self, id: JobId, now: i64) -> Vec<Effect> {
        let Some(job) = self.jobs.get(&id) else {
            return Vec::new();
        };
        match job.state {
            JobState::Pending => {
                self.finish(id, JobState::Cancelled, Reason::None, now, 0, 0);
                Vec::new()
            }
            // A job in its preemption grace is cancelled now, as in Slurm: the grace gives
            // it time to checkpoint, not a shield against its owner's scancel.
            JobState::Running
                if job.kill.is_none()
                    || matches!(job.kill, Some(KillReason::Requeue | KillReason::Preempt(_))) =>
            {
                let nodes = job
                    .alloc
                    .as_ref()
                    .map(|a| a.node_ids().collect())
                    .unwrap_or_default();
                self.with_job(id, |j| j.kill = Some(KillReason::Cancel));
                vec![Effect::Terminate {
                    job: id,
                    nodes,
                    reason: SignalReason::Cancel,
                    grace_s: 0,
                }]
            }
            _ => Vec::new(),
        }
    }

    /// The job `id` if `by` may act on it; `shown` names it in the error as the user typed it.
    fn job_for(
        &self,
        by: &Requester,
        id: JobId,
        shown: &dyn std::fmt::Display,
    ) -> Result<&Job, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(shown.to_string()))?;
        if !by.may_touch(job) {
            return Err(JobError::PermissionDenied {
                job: id,
                owner: job.spec.user.clone(),
            });
        }
        Ok(job)
    }

    /// Holds pending jobs (`scontrol hold`, `--hold`): a user hold by the owner, an admin
    /// hold by an operator.
    pub fn hold(&mut self, sel: &JobSelector, by: &Requester) -> Result<(), JobError> {
        let job = self.job_for(by, sel.job, &sel)?;
        if job.state != JobState::Pending {
            return Err(JobError::InvalidState {
                job: job.id,
                state: job.state,
                op: "hold",
            });
        }
        let (hold, reason) = if by.admin {
            (Hold::Admin, Reason::JobHeldAdmin)
        } else {
            (Hold::User, Reason::JobHeldUser)
        };
        self.with_job(sel.job, |j| {
            j.hold = hold;
            j.reason = reason;
            j.priority = 0;
            // Age counts from when the job is eligible again, as after a release in Slurm.
            j.eligible_time = None;
        });
        Ok(())
    }

    /// Releases a hold. Only an operator releases an admin hold.
    pub fn release(&mut self, sel: &JobSelector, by: &Requester) -> Result<(), JobError> {
        let job = self.job_for(by, sel.job, &sel)?;
        if job.hold == Hold::Admin && !by.admin {
            return Err(JobError::Invalid {
                job: job.id,
                problem: "held by an administrator; only an operator can release it".into(),
            });
        }
        if job.state != JobState::Pending {
            return Err(JobError::InvalidState {
                job: job.id,
                state: job.state,
                op: "release",
            });
        }
        self.with_job(sel.job, |j| {
            j.hold = Hold::None;
            if matches!(j.reason, Reason::JobHeldUser | Reason::JobHeldAdmin) {
                j.reason = Reason::None;
            }
        });
        Ok(())
    }

    /// Requeues a job: a running one is terminated and goes back to PENDING when its worker
    /// reports; a finished one goes back to PENDING at once.
    pub fn requeue(
        &mut self,
        id: JobId,
        by: &Requester,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self.job_for(by, id, &id)?;
        if job.is_array_meta() {
            return Err(JobError::Invalid {
                job: id,
                problem: "requeue array tasks one by one (JOBID_TASK)".into(),
            });
        }
        match job.state {
            JobState::Running => {
                if job.kill.is_some() {
                    return Ok(Vec::new());
                }
                let nodes = job
                    .alloc
                    .as_ref()
                    .map(|a| a.node_ids().collect())
                    .unwrap_or_default();
                self.with_job(id, |j| j.kill = Some(KillReason::Requeue));
                Ok(vec![Effect::Terminate {
                    job: id,
                    nodes,
                    reason: SignalReason::Requeue,
                    grace_s: 0,
                }])
            }
            s if s.is_terminal() => {
                let array = job.array_job_id;
                self.with_job(id, back_to_pending);
                if let Some(meta) = array {
                    // The task's earlier end no longer counts: it will end again.
                    self.with_job(meta, |m| {
                        if let Some(a) = m.array.as_mut() {
                            a.active += 1;
                            if s == JobState::Completed {
                                a.ok = a.ok.saturating_sub(1);
                            } else {
                                a.not_ok = a.not_ok.saturating_sub(1);
                                if s == JobState::Cancelled {
                                    a.cancelled = a.cancelled.saturating_sub(1);
                                }
                            }
                        }
                        if m.state.is_terminal() {
                            m.state = JobState::Running;
                            m.end_time = None;
                        }
                    });
                }
                let _ = now;
                Ok(Vec::new())
            }
            s => Err(JobError::InvalidState {
                job: id,
                state: s,
                op: "requeue",
            }),
        }
    }

    /// `scontrol update job`: validated as a whole, then applied. Users may only lower a time
    /// limit and raise nice; partition, account and QOS change only while pending.
    pub fn update_job(
        &mut self,
        id: JobId,
        upd: JobUpdate,
        by: &Requester,
        _now: i64,
    ) -> Result<(), JobError> {
        let job = self.job_for(by, id, &id)?;
        if job.state.is_terminal() {
            return Err(JobError::InvalidState {
                job: id,
                state: job.state,
                op: "update",
            });
        }
        let inv = |p: &str| JobError::Invalid {
            job: id,
            problem: p.to_string(),
        };
        let pending = job.state == JobState::Pending;
        let mut spec = job.spec.clone();
        let mut time_limit = job.time_limit;
        if let Some(t) = upd.time_limit {
            let raising = match (t, job.time_limit) {
                (None, Some(_)) => true,
                (Some(new), Some(old)) => new > old,
                _ => false,
            };
            if raising && !by.admin {
                return Err(inv("only an operator may raise a time limit"));
            }
            if t.is_some_and(|t| t > crate::time::MAX_DURATION_S) {
                return Err(inv("time limit longer than 100 years"));
            }
            time_limit = t;
            spec.time_limit = t;
        }
        if let Some(p) = upd.partition {
            if !pending {
                return Err(inv("partition can change only while pending"));
            }
            let part = self
                .config
                .partition(&p)
                .ok_or_else(|| inv(&format!("invalid partition name specified: {p:?}")))?;
            if spec.time_limit.is_none() {
                time_limit = part.default_limit();
            }
            spec.partition = p;
        }
        if let Some(q) = upd.qos {
            if !pending {
                return Err(inv("QOS can change only while pending"));
            }
            if self.config.qos(&q).is_none() {
                return Err(inv(&format!("invalid qos specification: {q:?}")));
            }
            spec.qos = q;
        }
        if let Some(a) = upd.account {
            if !pending {
                return Err(inv("account can change only while pending"));
            }
            if self.assoc.account(&a).is_none() {
                return Err(inv(&format!("invalid account: {a:?}")));
            }
            if self.config.sched.enforce_associations && self.assoc.user(&spec.user, &a).is_none() {
                return Err(inv(&format!(
                    "user {} has no association with account {a}",
                    spec.user
                )));
            }
            spec.account = a;
        }
        if let Some(n) = upd.name {
            spec.name = n;
        }
        if let Some(n) = upd.nice {
            if n < job.spec.nice && !by.admin {
                return Err(inv("only an operator may lower nice"));
            }
            spec.nice = n;
        }
        if let Some(d) = upd.dependency {
            if let Some(d) = &d {
                for t in d.targets() {
                    if t.job == id || !self.jobs.contains_key(&t.job) {
                        return Err(inv(&format!(
                            "job dependency problem: job {} not found",
                            t.job
                        )));
                    }
                }
            }
            spec.dependency = d.map(Box::new);
        }
        if let Some(p) = upd.priority {
            if !by.admin {
                return Err(inv("only an operator may set a priority"));
            }
            spec.priority = p;
        }
        spec.validate().map_err(|e| inv(&e.to_string()))?;
        let part_idx = self
            .config
            .partitions
            .iter()
            .position(|p| p.name == spec.partition)
            .unwrap_or(0);
        let shape = spec.shape(
            self.partition_caps(part_idx),
            self.config.sched.default_mem_per_cpu_mb,
        );
        if pending {
            self.check_satisfiable(part_idx, &spec, &shape)
                .map_err(|e| inv(&e.to_string()))?;
        }
        self.with_job(id, |j| {
            j.spec = spec;
            j.time_limit = time_limit;
            if pending {
                j.shape = shape;
            }
        });
        Ok(())
    }
}

fn back_to_pending(j: &mut Job) {
    j.state = JobState::Pending;
    j.reason = Reason::None;
    j.restarts += 1;
    j.start_time = None;
    j.end_time = None;
    j.eligible_time = None;
    j.alloc = None;
    j.kill = None;
    j.exit_code = 0;
    j.signal = 0;
}

// === job lifecycle: start, end ===

impl State {
    /// Marks a pending job RUNNING on `nodes` (already chosen by a pass), recording concrete
    /// GPU indices. Array metas are split first by the caller.
    pub(crate) fn start_on(
        &mut self,
        id: JobId,
        nodes: &[NodeId],
        now: i64,
    ) -> crate::cycle::Start {
        let job = &self.jobs[&id];
        let shape = job.shape;
        let mode = job.spec.mode;
        let mut sorted: Vec<NodeId> = nodes.to_vec();
        sorted.sort_by(|a, b| self.nodes[a.index()].name.cmp(&self.nodes[b.index()].name));
        let mut alloc = Allocation {
            nodes: Vec::with_capacity(sorted.len()),
        };
        for nid in &sorted {
            let n = &self.nodes[nid.index()];
            let (cpus, mem_mb, ngpus) = if shape.exclusive {
                (n.total.cpus, n.total.mem_mb, n.total.gpus)
            } else {
                (
                    shape.per_node.cpus,
                    shape.per_node.mem_mb,
                    shape.per_node.gpus,
                )
            };
            let gpus = n.pick_gpus(ngpus).unwrap_or_default();
            alloc.nodes.push(NodeAlloc {
                node: *nid,
                cpus,
                mem_mb,
                gpus,
            });
        }
        self.attach(id, &alloc, mode, shape.exclusive);
        let start = crate::cycle::Start {
            job: id,
            nodes: alloc
                .nodes
                .iter()
                .map(|na| crate::cycle::StartNode {
                    node: na.node,
                    name: self.nodes[na.node.index()].name.clone(),
                    cpus: na.cpus,
                    mem_mb: na.mem_mb,
                    gpus: na.gpus.clone(),
                })
                .collect(),
        };
        self.with_job(id, |j| {
            j.state = JobState::Running;
            j.reason = Reason::None;
            j.start_time = Some(now);
            j.end_time = None;
            j.alloc = Some(Box::new(alloc));
            j.kill = None;
        });
        start
    }

    /// Splits the next pending index of an array into its own PENDING job record (new id) and
    /// returns its id.
    pub(crate) fn split_task(&mut self, meta: JobId, now: i64) -> Option<JobId> {
        let id = JobId(self.next_job_id);
        let m = self.jobs.get(&meta)?;
        let a = m.array.as_ref()?;
        let index = a.pending.first()?;
        let mut spec = m.spec.clone();
        spec.array = None;
        let task = Job {
            id,
            spec,
            state: JobState::Pending,
            reason: Reason::None,
            priority: m.priority,
            submit_time: m.submit_time,
            eligible_time: m.eligible_time.or(Some(now)),
            start_time: None,
            end_time: None,
            time_limit: m.time_limit,
            shape: m.shape,
            alloc: None,
            exit_code: 0,
            signal: 0,
            array_job_id: Some(meta),
            array_task_id: Some(index),
            array: None,
            restarts: 0,
            hold: Hold::None,
            kill: None,
            preempt_time: None,
        };
        self.next_job_id += 1;
        self.with_job(meta, |m| {
            if let Some(a) = m.array.as_mut() {
                a.pending.pop_first();
                a.active += 1;
                a.last_start = Some(now);
                a.tasks.push((index, id));
                if a.pending.is_empty() {
                    m.state = JobState::Running;
                }
            }
        });
        self.jobs.insert(id, task);
        self.index(id);
        Some(id)
    }

    /// The worker confirms the launch. Idempotent; corrects the start time to the worker's.
    pub fn job_started(&mut self, id: JobId, start_time: i64) -> Result<(), JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if job.state != JobState::Running {
            return Err(JobError::InvalidState {
                job: id,
                state: job.state,
                op: "start",
            });
        }
        if job.start_time != Some(start_time) && start_time > 0 {
            self.with_job(id, |j| j.start_time = Some(start_time));
        }
        Ok(())
    }

    /// A worker reports the end of a run. Decides the state by Slurm's rules (a kill the
    /// controller asked for wins: CANCELLED, PREEMPTED, NODE_FAIL; then launch failure ->
    /// FAILED, time limit -> TIMEOUT, a signal or non-zero exit -> FAILED, else COMPLETED),
    /// frees the resources, charges usage, and requeues when the kill asked for it.
    /// Reporting the end of a job that is not running is a no-op (workers re-report after a
    /// reconnect).
    pub fn job_ended(
        &mut self,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if job.state != JobState::Running || job.is_array_meta() {
            return Ok(Vec::new());
        }
        let (state, reason) = match job.kill {
            Some(KillReason::Cancel) => (JobState::Cancelled, Reason::None),
            Some(KillReason::Preempt(_)) => (JobState::Preempted, Reason::None),
            Some(KillReason::NodeFail) => (JobState::NodeFail, Reason::NodeDown),
            Some(KillReason::Requeue) => (JobState::Requeued, Reason::None),
            None if outcome.launch_error.is_some() => (JobState::Failed, Reason::JobLaunchFailure),
            None if outcome.timed_out => (JobState::Timeout, Reason::TimeLimit),
            None if outcome.cancelled => (JobState::Cancelled, Reason::None),
            // As Slurm: an OOM kill anywhere in the job ends it OUT_OF_MEMORY, even when
            // the batch script survived it.
            None if outcome.out_of_memory => (JobState::OutOfMemory, Reason::None),
            None if outcome.signal != 0 || outcome.exit_code != 0 => {
                (JobState::Failed, Reason::NonZeroExitCode)
            }
            None => (JobState::Completed, Reason::None),
        };
        Ok(self.end_run(id, state, reason, outcome.exit_code, outcome.signal, now))
    }

    /// [`State::job_ended`] as reported by the worker of `node`: ignored unless that node is
    /// the job's batch host now. A worker that comes back after its node was declared lost
    /// may report the end of a run that was already requeued and restarted elsewhere; that
    /// report must not end the new run.
    pub fn job_ended_on(
        &mut self,
        node: &str,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        let host = job
            .alloc
            .as_ref()
            .and_then(|a| a.nodes.first())
            .map(|n| self.nodes[n.node.index()].name.as_str());
        if host != Some(node) {
            return Ok(Vec::new());
        }
        self.job_ended(id, outcome, now)
    }

    /// Ends the current run of a running job in `state`; requeues when the state and the
    /// job's settings call for it.
    pub(crate) fn end_run(
        &mut self,
        id: JobId,
        state: JobState,
        reason: Reason,
        exit_code: i32,
        signal: i32,
        now: i64,
    ) -> Vec<Effect> {
        let Some(job) = self.jobs.get(&id) else {
            return Vec::new();
        };
        let requeue_ok = job.spec.requeue_allowed(self.config.sched.job_requeue);
        let requeue = match state {
            JobState::Requeued => true,
            JobState::Preempted => {
                matches!(job.kill, Some(KillReason::Preempt(PreemptMode::Requeue))) && requeue_ok
            }
            JobState::NodeFail => requeue_ok,
            _ => false,
        };
        let alloc = job.alloc.as_deref().cloned().unwrap_or_default();
        let record = RunRecord {
            job: id,
            state,
            start_time: job.start_time,
            end_time: now,
            exit_code,
            signal,
            nodes: alloc.node_ids().collect(),
            requeued: requeue,
        };
        self.charge_job(id, now);
        self.detach(id, &alloc);
        self.preempting.retain(|_, victims| {
            victims.retain(|v| *v != id);
            !victims.is_empty()
        });
        if requeue {
            self.with_job(id, back_to_pending);
        } else {
            self.finish(id, state, reason, now, exit_code, signal);
        }
        vec![Effect::RunEnded(record)]
    }

    /// Puts a job in a terminal state and updates its array's counters.
    fn finish(
        &mut self,
        id: JobId,
        state: JobState,
        reason: Reason,
        now: i64,
        exit_code: i32,
        signal: i32,
    ) {
        let Some(array) = self.with_job(id, |j| {
            // The allocation stays on the record (not on the nodes) so finished jobs still
            // show their node list and GPUs; only RUNNING jobs count against nodes.
            j.state = state;
            j.reason = reason;
            j.end_time = Some(now);
            j.kill = None;
            j.exit_code = exit_code;
            j.signal = signal;
            j.array_job_id
        }) else {
            return;
        };
        if let Some(meta) = array {
            self.with_job(meta, |m| {
                if let Some(a) = m.array.as_mut() {
                    a.active = a.active.saturating_sub(1);
                    if state == JobState::Completed {
                        a.ok += 1;
                    } else {
                        a.not_ok += 1;
                        if state == JobState::Cancelled {
                            a.cancelled += 1;
                        }
                    }
                }
            });
            self.settle_array(meta, now);
        }
    }

    /// Gives an array meta its final state once every index has run.
    fn settle_array(&mut self, meta: JobId, now: i64) {
        let Some(m) = self.jobs.get(&meta) else {
            return;
        };
        let Some(a) = m.array.as_ref() else { return };
        if m.state.is_terminal() {
            return;
        }
        if a.is_done() {
            let state = if a.not_ok == 0 {
                JobState::Completed
            } else if a.cancelled == a.not_ok {
                JobState::Cancelled
            } else {
                JobState::Failed
            };
            self.with_job(meta, |m| {
                m.state = state;
                m.end_time = Some(now);
            });
        } else if a.pending.is_empty() && m.state == JobState::Pending {
            self.with_job(meta, |m| m.state = JobState::Running);
        }
    }

    /// Removes finished records that ended before `before` (an array meta only once all its
    /// tasks are finished and removable). Returns them; the controller deletes them from its
    /// store (they are also in `Changes::removed_jobs`).
    pub fn purge_finished(&mut self, before: i64) -> Vec<JobId> {
        let mut removed = Vec::new();
        let candidates: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state.is_terminal() && j.end_time.is_some_and(|e| e < before))
            .map(|j| j.id)
            .collect();
        for id in candidates {
            // A task stays while its meta lives, so aftercorr and squeue on the array work.
            let keep = self.jobs[&id]
                .array_job_id
                .is_some_and(|m| self.jobs.get(&m).is_some_and(|m| !m.state.is_terminal()));
            if keep {
                continue;
            }
            self.unindex(id);
            self.jobs.remove(&id);
            self.changes.jobs.remove(&id);
            self.changes.removed_jobs.push(id);
            removed.push(id);
        }
        removed
    }
}

// === nodes ===

impl State {
    /// A worker registers (new node) or re-registers (known node). The node becomes UP.
    /// Jobs whose batch host is this node and that the worker no longer reports ended while
    /// it was away (or never received their launch): they end NODE_FAIL (requeued when
    /// allowed). Other nodes of a multi-node job need not report it. Jobs the worker reports that
    /// do not belong there come back as `Abandon` effects.
    pub fn register_node(
        &mut self,
        reg: NodeRegistration,
        now: i64,
    ) -> Result<Vec<Effect>, NodeError> {
        let name = reg.name.trim();
        if name.is_empty()
            || name.len() > 128
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(NodeError::BadName(reg.name.clone()));
        }
        let invalid = |p: String| NodeError::Invalid {
            node: name.to_string(),
            problem: p,
        };
        if reg.total.gpus > self.config.sched.max_gpus_per_node {
            return Err(invalid(format!(
                "{} GPUs, more than the {} supported per node",
                reg.total.gpus, self.config.sched.max_gpus_per_node
            )));
        }
        if reg.total.cpus == 0 {
            return Err(invalid("reports no CPUs".into()));
        }
        for p in &reg.partitions {
            if self.config.partition(p).is_none() {
                return Err(invalid(format!("unknown partition {p:?}")));
            }
        }
        let id = match self.node_by_name.get(name) {
            Some(id) => *id,
            None => {
                let id = NodeId(
                    u32::try_from(self.nodes.len())
                        .map_err(|_| invalid("node table full".into()))?,
                );
                self.nodes.push(Node::new(id, name, reg.total));
                self.node_by_name.insert(name.to_string(), id);
                id
            }
        };
        {
            let n = &mut self.nodes[id.index()];
            n.removed = false;
            n.total = reg.total;
            n.gpu_type = reg.gpu_type.clone();
            n.features = reg.features.clone();
            n.partitions = reg.partitions.clone();
            if n.health != Health::Up {
                n.health = Health::Up;
                if !n.drain {
                    n.reason = None;
                }
            }
            n.last_seen = now;
        }
        self.changes.nodes.insert(id);
        self.refresh_partitions_of(id);
        let mut effects = Vec::new();
        // Only the batch host runs a job's script, so only it can vouch for the job; the
        // other nodes of a multi-node job run nothing until steps start.
        let hosted: Vec<JobId> = self.nodes[id.index()]
            .jobs
            .iter()
            .copied()
            .filter(|j| {
                self.jobs
                    .get(j)
                    .and_then(|j| j.alloc.as_ref())
                    .and_then(|a| a.nodes.first())
                    .is_some_and(|n| n.node == id)
            })
            .collect();
        for job in hosted {
            if !reg.running_jobs.contains(&job) {
                effects.extend(self.fail_job_on_lost_node(job, id, now));
            }
        }
        for job in &reg.running_jobs {
            let ours = self.jobs.get(job).is_some_and(|j| {
                j.state == JobState::Running
                    && j.alloc
                        .as_ref()
                        .is_some_and(|a| a.node_ids().any(|n| n == id))
            });
            if !ours {
                effects.push(Effect::Abandon {
                    job: *job,
                    node: id,
                });
            }
        }
        Ok(effects)
    }

    /// A worker's heartbeat: only refreshes `last_seen` (not persisted; no change recorded).
    pub fn heartbeat(&mut self, name: &str, now: i64) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        self.nodes[id.index()].last_seen = now;
        Ok(())
    }

    /// The node's worker is gone (timeout) or an operator set it DOWN: it takes no work and
    /// its jobs end NODE_FAIL, or go back to PENDING when requeue is allowed. The other nodes
    /// of a multi-node job are told to kill their part.
    pub fn node_lost(
        &mut self,
        name: &str,
        reason: &str,
        now: i64,
    ) -> Result<Vec<Effect>, NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        {
            let n = &mut self.nodes[id.index()];
            n.health = Health::Down;
            n.reason = Some(if reason.is_empty() {
                "Not responding".to_string()
            } else {
                reason.to_string()
            });
        }
        self.changes.nodes.insert(id);
        let jobs = self.nodes[id.index()].jobs.clone();
        let mut effects = Vec::new();
        for job in jobs {
            effects.extend(self.fail_job_on_lost_node(job, id, now));
        }
        Ok(effects)
    }

    fn fail_job_on_lost_node(&mut self, job: JobId, lost: NodeId, now: i64) -> Vec<Effect> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let others: Vec<NodeId> = j
            .alloc
            .as_ref()
            .map(|a| a.node_ids().filter(|n| *n != lost).collect())
            .unwrap_or_default();
        let mut effects = Vec::new();
        if !others.is_empty() {
            effects.push(Effect::Terminate {
                job,
                nodes: others,
                reason: SignalReason::NodeFail,
                grace_s: 0,
            });
        }
        // A kill the controller already asked for keeps its meaning (a cancelled job stays
        // cancelled even if its node dies meanwhile).
        let (state, reason) = match j.kill {
            Some(KillReason::Cancel) => (JobState::Cancelled, Reason::None),
            Some(KillReason::Requeue) => (JobState::Requeued, Reason::None),
            _ => (JobState::NodeFail, Reason::NodeDown),
        };
        self.with_job(job, |j| {
            if j.kill.is_none() {
                j.kill = Some(KillReason::NodeFail);
            }
        });
        effects.extend(self.end_run(job, state, reason, 0, 0, now));
        effects
    }

    /// Drains a node: it finishes its jobs and takes no new ones.
    pub fn drain(&mut self, name: &str, reason: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        if reason.trim().is_empty() {
            return Err(NodeError::Invalid {
                node: name.to_string(),
                problem: "a drain needs a reason".into(),
            });
        }
        let n = &mut self.nodes[id.index()];
        n.drain = true;
        n.reason = Some(reason.to_string());
        self.changes.nodes.insert(id);
        Ok(())
    }

    /// Removes an idle node from the cluster (its worker set shrank): it leaves sinfo and its
    /// partitions. Refused while it holds jobs; set it DOWN first to requeue them. The id
    /// stays reserved (finished jobs' allocations name it); registering revives it.
    pub fn remove_node(&mut self, name: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        let n = &mut self.nodes[id.index()];
        if !n.jobs.is_empty() {
            return Err(NodeError::Invalid {
                node: name.to_string(),
                problem: format!("{} job(s) still run there", n.jobs.len()),
            });
        }
        n.removed = true;
        n.health = Health::Down;
        n.drain = false;
        n.reason = Some("removed".into());
        self.changes.nodes.insert(id);
        self.refresh_partitions_of(id);
        Ok(())
    }

    /// Ends a drain (`scontrol update state=resume`). A DOWN node comes back when its worker
    /// registers.
    pub fn resume(&mut self, name: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        let n = &mut self.nodes[id.index()];
        n.drain = false;
        if n.health != Health::Down {
            n.reason = None;
        }
        self.changes.nodes.insert(id);
        Ok(())
    }
}

// === accounts, QOS, usage ===

impl State {
    /// `sacctmgr add account`.
    pub fn add_account(&mut self, acct: AccountConfig) -> Result<(), AdminError> {
        let parent = acct
            .parent
            .clone()
            .unwrap_or_else(|| crate::fairshare::ROOT_ACCOUNT.to_string());
        self.assoc.add_account(&acct.name, &parent, acct.shares)?;
        self.config.accounts.push(acct);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr delete account` (must have no users or sub-accounts, and no jobs that
    /// have not ended).
    pub fn remove_account(&mut self, name: &str) -> Result<(), AdminError> {
        if self.assoc.account(name).is_some() {
            let active = self.active_jobs_charging(name, None);
            if active > 0 {
                return Err(AdminError::Invalid(format!(
                    "account {name} has {active} active job(s); cancel them first"
                )));
            }
        }
        self.assoc.remove_account(name)?;
        self.config.accounts.retain(|a| a.name != name);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify account set fairshare=.. GrpTRES=..`.
    pub fn modify_account(
        &mut self,
        name: &str,
        shares: Option<u32>,
        limits: Option<crate::account::AssocLimits>,
    ) -> Result<(), AdminError> {
        let idx = self
            .assoc
            .account(name)
            .ok_or_else(|| AdminError::Invalid(format!("account {name:?} does not exist")))?;
        if let Some(s) = shares {
            self.assoc.set_shares(idx, s);
        }
        if let Some(a) = self.config.accounts.iter_mut().find(|a| a.name == name) {
            if let Some(s) = shares {
                a.shares = s;
            }
            if let Some(l) = limits {
                a.limits = l;
            }
        } else if limits.is_some() {
            return Err(AdminError::Invalid("the root account has no limits".into()));
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr add user NAME account=A`. A user's first association is their default
    /// account; a new default takes the flag from the old one.
    pub fn add_user(&mut self, mut user: UserConfig) -> Result<(), AdminError> {
        self.assoc
            .add_user(&user.user, &user.account, user.shares)?;
        let first = !self.config.users.iter().any(|u| u.user == user.user);
        user.default |= first;
        if user.default {
            for u in self.config.users.iter_mut().filter(|u| u.user == user.user) {
                u.default = false;
            }
        }
        self.config.users.push(user);
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify account set ...`: replaces an account's settings (shares, limits,
    /// description); its name and parent stay.
    pub fn update_account(&mut self, acct: AccountConfig) -> Result<(), AdminError> {
        let Some(idx) = self.assoc.account(&acct.name) else {
            return Err(FairShareError::UnknownAccount(acct.name).into());
        };
        let Some(cur) = self
            .config
            .accounts
            .iter_mut()
            .find(|a| a.name == acct.name)
        else {
            return Err(AdminError::Invalid(
                "the root account cannot be modified".into(),
            ));
        };
        if cur.parent != acct.parent {
            return Err(AdminError::Invalid(format!(
                "account {}: the parent cannot be changed",
                acct.name
            )));
        }
        self.assoc.set_shares(idx, acct.shares);
        *cur = acct;
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr modify user ... set ...`: replaces one association's settings. Making it
    /// the default takes the flag from the user's other associations.
    pub fn update_user(&mut self, user: UserConfig) -> Result<(), AdminError> {
        let Some(idx) = self.assoc.user(&user.user, &user.account) else {
            return Err(FairShareError::UnknownUser {
                user: user.user,
                account: user.account,
            }
            .into());
        };
        self.assoc.set_shares(idx, user.shares);
        for u in self.config.users.iter_mut().filter(|u| u.user == user.user) {
            if u.account == user.account {
                u.shares = user.shares;
                u.default = user.default;
            } else if user.default {
                u.default = false;
            }
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// Jobs not yet ended that charge `account` (only `user`'s, if given).
    pub fn active_jobs_charging(&self, account: &str, user: Option<&str>) -> usize {
        self.jobs
            .values()
            .filter(|j| !j.state.is_terminal() && j.spec.account == account)
            .filter(|j| user.is_none_or(|u| j.spec.user == u))
            .count()
    }

    /// What run-time account, user and QOS changes touch, to undo a request that fails
    /// part-way (`sacctmgr add account a,b` when `b` is bad adds neither).
    pub fn accounting_snapshot(&self) -> AccountingSnapshot {
        AccountingSnapshot {
            accounts: self.config.accounts.clone(),
            users: self.config.users.clone(),
            qos: self.config.qos.clone(),
            assoc: self.assoc.clone(),
            config_changed: self.changes.config,
            assoc_changed: self.changes.assoc,
        }
    }

    /// Puts back what [`State::accounting_snapshot`] saw.
    pub fn rollback_accounting(&mut self, snap: AccountingSnapshot) {
        self.config.accounts = snap.accounts;
        self.config.users = snap.users;
        self.config.qos = snap.qos;
        self.assoc = snap.assoc;
        self.changes.config = snap.config_changed;
        self.changes.assoc = snap.assoc_changed;
    }

    /// Marks the configuration and the account tree changed, so the controller persists
    /// them: on first start, this makes the store the authority from then on.
    pub fn mark_accounting_changed(&mut self) {
        self.changes.config = true;
        self.changes.assoc = true;
    }

    /// `sacctmgr delete user NAME account=A` (refused while the association has jobs that
    /// have not ended).
    pub fn remove_user(&mut self, user: &str, account: &str) -> Result<(), AdminError> {
        if self.assoc.user(user, account).is_some() {
            let active = self.active_jobs_charging(account, Some(user));
            if active > 0 {
                return Err(AdminError::Invalid(format!(
                    "user {user} has {active} active job(s) in account {account}; cancel them first"
                )));
            }
        }
        self.assoc.remove_user(user, account)?;
        self.config
            .users
            .retain(|u| !(u.user == user && u.account == account));
        let mut mine = self.config.users.iter_mut().filter(|u| u.user == user);
        if let Some(first) = mine.next()
            && !first.default
            && !mine.any(|u| u.default)
        {
            // The default went with the association: the next one takes over.
            if let Some(u) = self.config.users.iter_mut().find(|u| u.user == user) {
                u.default = true;
            }
        }
        self.changes.config = true;
        self.changes.assoc = true;
        Ok(())
    }

    /// `sacctmgr add/modify qos`: inserts or replaces by name.
    pub fn upsert_qos(&mut self, qos: Qos) -> Result<(), AdminError> {
        for p in &qos.preempt {
            if p != &qos.name && self.config.qos(p).is_none() {
                return Err(AdminError::Invalid(format!(
                    "QOS {} preempts unknown QOS {p:?}",
                    qos.name
                )));
            }
        }
        match self.config.qos.iter_mut().find(|q| q.name == qos.name) {
            Some(q) => *q = qos,
            None => self.config.qos.push(qos),
        }
        self.changes.config = true;
        Ok(())
    }

    /// `sacctmgr delete qos` (not `normal`, not one jobs still use).
    pub fn remove_qos(&mut self, name: &str) -> Result<(), AdminError> {
        if name == DEFAULT_QOS {
            return Err(AdminError::Invalid(format!(
                "QOS {DEFAULT_QOS} cannot be removed"
            )));
        }
        if self
            .jobs
            .values()
            .any(|j| !j.state.is_terminal() && j.spec.qos == name)
        {
            return Err(AdminError::Invalid(format!("QOS {name} is used by jobs")));
        }
        let before = self.config.qos.len();
        self.config.qos.retain(|q| q.name != name);
        if self.config.qos.len() == before {
            return Err(AdminError::Invalid(format!("QOS {name:?} does not exist")));
        }
        for q in &mut self.config.qos {
            q.preempt.retain(|p| p != name);
        }
        self.changes.config = true;
        Ok(())
    }

    /// The association a job charges: its user under its account, else the account.
    pub fn job_assoc(&self, job: &Job) -> Option<AssocIdx> {
        self.assoc
            .user(&job.spec.user, &job.spec.account)
            .or_else(|| self.assoc.account(&job.spec.account))
    }

    /// Decays all usage to `now` and charges running jobs for the time since the last
    /// charge. Called at the start of each pass; job ends charge their final stretch.
    pub fn charge_usage(&mut self, now: i64) {
        let Some(last) = self.usage_charged_at else {
            self.usage_charged_at = Some(now);
            return;
        };
        if now <= last {
            return;
        }
        let elapsed = (now - last) as u64;
        self.assoc
            .decay_all(elapsed, self.config.fairshare.half_life_s);
        let running: Vec<JobId> = self.running.iter().copied().collect();
        for id in running {
            let job = &self.jobs[&id];
            let from = job.start_time.unwrap_or(now).max(last);
            self.charge(job.id, from, now);
        }
        self.usage_charged_at = Some(now);
        self.changes.assoc = true;
    }

    /// Charges a job's last stretch (since the last periodic charge) when it ends.
    fn charge_job(&mut self, id: JobId, now: i64) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let last = self.usage_charged_at.unwrap_or(i64::MIN);
        let from = job.start_time.unwrap_or(now).max(last);
        self.charge(id, from, now);
        self.changes.assoc = true;
    }

    fn charge(&mut self, id: JobId, from: i64, to: i64) {
        if to <= from {
            return;
        }
        let job = &self.jobs[&id];
        let Some(alloc) = job.alloc.as_deref() else {
            return;
        };
        let t = alloc.total();
        let usage = self.config.fairshare.billing.usage(
            u64::from(t.cpus),
            t.mem_mb,
            u64::from(t.gpus),
            (to - from) as u64,
        );
        if let Some(idx) = self.job_assoc(job) {
            self.assoc.charge(idx, usage);
        }
    }
}

// === dependencies ===

impl State {
    /// Describes a dependency target for [`crate::dependency::Dependency::evaluate`].
    pub(crate) fn target_status(&self, t: DepTarget) -> Option<TargetStatus> {
        let job = self.jobs.get(&t.job)?;
        if let Some(task) = t.task {
            let a = job.array.as_ref()?;
            if a.pending.contains(task) {
                return Some(TargetStatus {
                    all_started: false,
                    started_at: None,
                    all_finished: false,
                    any_not_ok: false,
                });
            }
            let id = a.task_job(task)?;
            return self.jobs.get(&id).map(single_status);
        }
        match &job.array {
            None => Some(single_status(job)),
            Some(a) => Some(TargetStatus {
                all_started: a.pending.is_empty(),
                started_at: a.last_start,
                all_finished: a.is_done(),
                any_not_ok: a.not_ok > 0,
            }),
        }
    }

    /// Evaluates a job's dependency. `singleton_clear` comes from the pass's index.
    pub(crate) fn dependency_status(
        &self,
        job: &Job,
        singleton_clear: bool,
        now: i64,
    ) -> DepStatus {
        match &job.spec.dependency {
            None => DepStatus::Satisfied,
            // An array meta is judged for the index it would start next (aftercorr).
            Some(d) => {
                let my_task = job
                    .array_task_id
                    .or_else(|| job.array.as_ref().and_then(|a| a.pending.first()));
                d.evaluate(|t| self.target_status(t), my_task, singleton_clear, now)
            }
        }
    }
}

fn single_status(j: &Job) -> TargetStatus {
    let finished = j.state.is_terminal();
    TargetStatus {
        all_started: j.start_time.is_some() || finished,
        started_at: j.start_time,
        all_finished: finished,
        any_not_ok: finished && j.state != JobState::Completed,
    }
}
