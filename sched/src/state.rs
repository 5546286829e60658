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
use crate::array::IndexSet;
use crate::config::{ClusterConfig, ConfigError};
use crate::fairshare::{AssocTree, FairShareError};
use crate::job::{Hold, Job, JobState, Reason, SpecError};
use crate::node::{Health, Node};
use crate::partition::{Partition, PartitionState};
use crate::qos::Qos;
use crate::{JobId, NodeId, Tres};

mod index;
use index::PairCounts;
mod admin;
mod control;
mod dependencies;
mod lifecycle;
pub use lifecycle::KILL_TASK_FAILED;
pub(crate) use lifecycle::lays_out_tasks;
mod nodes;
mod release;
pub use release::Release;
mod submit;
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
    /// The asking user's uid, recorded on the jobs it cancels; `None` for the controller's
    /// own requests.
    pub uid: Option<u32>,
}

impl Requester {
    pub fn user(name: impl Into<String>) -> Requester {
        Requester {
            user: name.into(),
            admin: false,
            uid: None,
        }
    }
    pub fn admin() -> Requester {
        Requester {
            user: "root".into(),
            admin: true,
            uid: None,
        }
    }

    /// The same requester, known by `uid`.
    pub fn with_uid(self, uid: u32) -> Requester {
        Requester {
            uid: Some(uid),
            ..self
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

/// When and where a job would start if submitted now ([`State::will_run`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WillRun {
    /// The id a submit would give it now.
    pub job_id: JobId,
    /// Unix seconds; now when it could start at once.
    pub start: i64,
    pub nodes: Vec<String>,
    /// CPUs it would be given, on all its nodes together.
    pub cpus: u32,
    pub partition: String,
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
    /// Pending records: pending jobs and array metas with pending indices.
    pub(crate) pending: BTreeSet<JobId>,
    /// The records of `pending` without a hold: those a pass looks at. A held record's
    /// reason and priority are set when it is held (at submit, by `hold`, at restore) and
    /// change only when it is released, so a user's thousands of held jobs cost each pass
    /// nothing (they were a lookup, a reason and a write-back each, every pass).
    pub(crate) unheld: BTreeSet<JobId>,
    /// The records of `pending` with a `singleton` dependency, held ones included (an older
    /// one claims the name): a pass looks for them without walking the whole queue.
    pub(crate) singletons: BTreeSet<JobId>,
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
            unheld: BTreeSet::new(),
            singletons: BTreeSet::new(),
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
                // No list names the associations created on first use: the stored tree
                // is their only record.
                st.assoc.carry_auto_users_from(&tree);
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
            // Ended runs whose processes were not yet reported gone still hold the node.
            for e in &n.ending {
                n.alloc = n.alloc.saturating_add(&e.alloc.tres());
                for g in &e.alloc.gpus {
                    if *g < 64 {
                        n.gpus_in_use |= 1u64 << g;
                    }
                }
            }
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
            // Passes no longer look at held records: a record stored with another reason
            // (before a restart or an upgrade) gets the hold's now.
            let mut job = job;
            if job.state == JobState::Pending {
                match job.hold {
                    Hold::User => job.reason = Reason::JobHeldUser,
                    Hold::Admin => job.reason = Reason::JobHeldAdmin,
                    Hold::None => {}
                }
            }
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
    /// Pending records without a hold, in id order: what a pass considers. A held record's
    /// priority (0) and reason (the hold's) do not change until it is released.
    pub fn unheld_pending_jobs(&self) -> impl Iterator<Item = &Job> + '_ {
        self.unheld.iter().filter_map(|id| self.jobs.get(id))
    }
    /// Pending records with a `singleton` dependency, held ones included, in id order.
    pub(crate) fn pending_singletons(&self) -> impl Iterator<Item = &Job> + '_ {
        self.singletons.iter().filter_map(|id| self.jobs.get(id))
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
/// parents and shares, plus any user associations created on first use (which no list
/// names).
fn tree_matches(tree: &AssocTree, config: &ClusterConfig) -> bool {
    use crate::fairshare::{AssocKind, ROOT_ACCOUNT};
    let live = tree.walk();
    let accounts = live
        .iter()
        .filter(|(i, _)| tree.kind(*i) == AssocKind::Account)
        .count();
    let listed: HashSet<(&str, &str)> = config
        .users
        .iter()
        .map(|u| (u.user.as_str(), u.account.as_str()))
        .collect();
    let unlisted_auto = live
        .iter()
        .filter(|(i, _)| {
            tree.kind(*i) == AssocKind::User && tree.is_auto(*i) && {
                let account = tree.parent(*i).map_or("", |p| tree.name(p));
                !listed.contains(&(tree.name(*i), account))
            }
        })
        .count();
    // With every listed user present (checked below), the count leaves room for no
    // other unlisted association.
    if accounts != config.accounts.len() + 1
        || live.len() != accounts + config.users.len() + unlisted_auto
    {
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
