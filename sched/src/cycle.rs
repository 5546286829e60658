//! One scheduling pass, as numbered phases (Kueue style):
//!
//! ```text
//!  0. usage     decay fair-share usage, charge running jobs up to now
//!  1. eligible  hold, begin time, dependencies, partition state and limits, array throttle
//!  2. order     multifactor priority (priority.rs + fairshare.rs), partition tier first
//!  3. place     for each job in order: QOS/association limits, start now if it fits without
//!               delaying a reservation, else reserve its earliest start (backfill.rs)
//!  4. preempt   blocked jobs of a preempting QOS pick victims (preempt.rs)
//!  5. apply     starts become RUNNING in State (array tasks split off first), victims are
//!               marked, pending reasons updated; the Plan lists what the controller must do
//! ```
//!
//! Phases 1-4 only read `State` (through the `Planner`'s private view), so the pass sees one
//! consistent snapshot; phase 5 is the only writer.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::dependency::DepStatus;
use crate::effect::Preempt;
use crate::job::{Hold, Job, JobState, KillReason, Reason};
use crate::partition::PartitionState;
use crate::select::{Planner, Request};
use crate::state::State;
use crate::{JobId, NodeId, Tres};

/// What a pass decided. Starts are already RUNNING in `State`; the controller persists the
/// changes, then launches them and signals the preemption victims.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub starts: Vec<Start>,
    pub preemptions: Vec<Preempt>,
    /// Blocked jobs that hold a reservation: their expected start (squeue `--start`'s
    /// START_TIME) and the nodes set aside for them. Recomputed every pass.
    pub reservations: Vec<Reservation>,
    pub stats: PassStats,
}

/// A blocked job's reserved start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// For an array, the meta's id (the next task to start).
    pub job: JobId,
    pub start: i64,
    pub nodes: Vec<NodeId>,
}

/// A job to launch. For an array task, `job` is the task's own new id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    pub job: JobId,
    /// In node-name order; the batch script runs on the first.
    pub nodes: Vec<StartNode>,
}

/// What one node gives a starting job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartNode {
    pub node: NodeId,
    pub name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    /// GPU indices for `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
}

/// Counts of one pass, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassStats {
    /// Pending records looked at (not held ones).
    pub considered: usize,
    pub eligible: usize,
    pub started: usize,
    pub reservations: usize,
    /// Jobs skipped because an identical, earlier job already could not start.
    pub skipped_same_shape: usize,
    pub preempted: usize,
}

/// The phases, for [`PassObserver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Usage,
    Eligible,
    Order,
    Place,
    Preempt,
    Apply,
    Done,
}

/// Told when each phase begins, so a caller with a clock can time them (the core has none).
pub trait PassObserver {
    fn phase(&mut self, phase: Phase);
}

impl PassObserver for () {
    fn phase(&mut self, _: Phase) {}
}

/// Runs one pass. See the module docs.
pub fn schedule(st: &mut State, now: i64) -> Plan {
    schedule_observed(st, now, &mut ())
}

/// A pending record that passed phase 1.
pub(crate) struct Candidate {
    pub(crate) id: JobId,
    part: usize,
    tier: u16,
    pub(crate) priority: u64,
    submit_time: i64,
}

enum Decision {
    Start { job: JobId, nodes: Vec<NodeId> },
    Preempt { by: JobId, victims: Vec<JobId> },
}

/// Runs one pass, reporting phase boundaries to `obs`.
pub fn schedule_observed(st: &mut State, now: i64, obs: &mut impl PassObserver) -> Plan {
    let mut stats = PassStats::default();

    // 0. usage
    obs.phase(Phase::Usage);
    st.charge_usage(now);

    // 1. eligible
    obs.phase(Phase::Eligible);
    let mut reasons: Vec<(JobId, Reason)> = Vec::new();
    let mut eligible: Vec<JobId> = Vec::new();
    let mut newly_eligible: Vec<JobId> = Vec::new();
    {
        let st: &State = st;
        let singles = singleton_blocked(st);
        // Held records are not looked at: their reason was set when they were held.
        for job in st.unheld_pending_jobs() {
            stats.considered += 1;
            match ineligible_reason(st, job, &singles, now) {
                Some(r) => reasons.push((job.id, r)),
                None => {
                    eligible.push(job.id);
                    if job.eligible_time.is_none() {
                        newly_eligible.push(job.id);
                    }
                }
            }
        }
    }
    stats.eligible = eligible.len();
    // Jobs that wait for a dependency or a begin time still show a priority (Slurm computes
    // it at submit); without an age until they are eligible, once is enough. Recorded, so
    // that it shows at once (most were just submitted: their row is being written anyway).
    let unranked: Vec<JobId> = reasons
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| st.jobs.get(id).is_some_and(|j| j.priority == 0))
        .collect();
    if !unranked.is_empty() {
        for c in prioritise(st, &unranked, now) {
            if let Some(j) = st.jobs.get_mut(&c.id) {
                j.priority = c.priority;
                st.changes.jobs.insert(c.id);
            }
        }
    }
    for id in &newly_eligible {
        // Eligibility feeds no index: set it in place and record the change.
        if let Some(j) = st.jobs.get_mut(id) {
            j.eligible_time = Some(now);
            st.changes.jobs.insert(*id);
        }
    }

    // 2. order
    obs.phase(Phase::Order);
    let mut cands = prioritise(st, &eligible, now);
    // Still in id order here, so the job table is walked in order (cache-friendly at 100k).
    for c in &cands {
        if let Some(j) = st.jobs.get_mut(&c.id) {
            // Not a recorded change: priority is recomputed every pass.
            j.priority = c.priority;
        }
    }
    cands.sort_unstable_by(|a, b| {
        b.tier
            .cmp(&a.tier)
            .then(b.priority.cmp(&a.priority))
            .then(a.submit_time.cmp(&b.submit_time))
            .then(a.id.cmp(&b.id))
    });

    // 3. place
    obs.phase(Phase::Place);
    let mut decisions: Vec<Decision> = Vec::new();
    let mut blocked: Vec<(JobId, usize)> = Vec::new();
    let mut reservations: Vec<Reservation> = Vec::new();
    let room: Vec<Vec<Tres>>;
    {
        let st: &State = st;
        let mut planner = Planner::new(st, now);
        let mut limits = LimitCounters::new(st);
        let mut memo: HashMap<ShapeKey, Memo> = HashMap::new();
        let mut part_blocked = vec![false; st.config.partitions.len()];
        let backfill = st.config.sched.backfill;
        let max_resv = match st.config.sched.max_reservations {
            0 => usize::MAX,
            n => n as usize,
        };
        for c in &cands {
            let job = &st.jobs[&c.id];
            let req = Request::new(st, job, c.part);
            if let Some(r) = limits.check(st, job) {
                reasons.push((job.id, r));
                continue;
            }
            if !backfill && part_blocked[c.part] {
                reasons.push((job.id, Reason::Priority));
                continue;
            }
            let key = ShapeKey::of(job, c.part);
            let limit = job.time_limit.unwrap_or(u64::MAX);
            let memo_entry = key.as_ref().and_then(|k| memo.get(k));
            let known_blocked = memo_entry.is_some_and(|m| limit >= m.failed_limit);
            // How many starts this record may take now (array tasks under the throttle).
            let mut budget = start_budget(job);
            let mut started = 0u64;
            // Why starting stopped before the budget ran out, if it did.
            let mut stopped_by: Option<Reason> = None;
            if !known_blocked {
                while started < budget {
                    let Some(nodes) = planner.pick_now(&req) else {
                        stopped_by = Some(Reason::Resources);
                        break;
                    };
                    planner.commit_start(&nodes, &req);
                    limits.add(st, job);
                    decisions.push(Decision::Start { job: job.id, nodes });
                    started += 1;
                    if let Some(r) = limits.check(st, job) {
                        budget = started;
                        stopped_by = Some(r);
                    }
                }
            } else {
                stats.skipped_same_shape += 1;
            }
            if started > 0 {
                // An array keeps its other tasks pending: say why now, not a pass later.
                if let Some(r) = rest_of_array_reason(job, started, stopped_by) {
                    reasons.push((job.id, r));
                }
                continue;
            }
            // Could not start: remember, reserve, explain.
            let already_reserved = memo_entry.is_some_and(|m| m.reserved);
            let mut reserved = false;
            if backfill
                && !already_reserved
                && stats.reservations < max_resv
                && let Some((start, nodes)) = planner.reserve(&req)
            {
                stats.reservations += 1;
                reserved = true;
                reservations.push(Reservation {
                    job: job.id,
                    start,
                    nodes,
                });
            }
            if let Some(k) = key {
                let m = memo.entry(k).or_insert(Memo {
                    failed_limit: u64::MAX,
                    reserved: false,
                });
                m.failed_limit = m.failed_limit.min(limit);
                m.reserved |= reserved;
            }
            let reason = if part_blocked[c.part] {
                Reason::Priority
            } else {
                Reason::Resources
            };
            part_blocked[c.part] = true;
            reasons.push((job.id, reason));
            blocked.push((job.id, c.part));
        }

        // 4. preempt
        obs.phase(Phase::Preempt);
        let any_preemptor = st.config.qos.iter().any(|q| !q.preempt.is_empty());
        let mut no_victims: HashSet<(ShapeKey, &str)> = HashSet::new();
        for (id, part) in blocked.into_iter().filter(|_| any_preemptor) {
            let job = &st.jobs[&id];
            if st.preempting.contains_key(&id) {
                continue;
            }
            let Some(qos) = st.config.qos(&job.spec.qos) else {
                continue;
            };
            if qos.preempt.is_empty() {
                continue;
            }
            // Victims only get scarcer during this phase: a shape of a QOS that found none
            // finds none for the rest of the pass.
            let key = ShapeKey::of(job, part).map(|k| (k, job.spec.qos.as_str()));
            if key.as_ref().is_some_and(|k| no_victims.contains(k)) {
                continue;
            }
            let req = Request::new(st, job, part);
            let victims = crate::preempt::choose_victims(&planner, &req, |v| {
                v.spec.qos != job.spec.qos && qos.can_preempt(&v.spec.qos)
            });
            match victims {
                Some((victims, nodes)) => {
                    planner.promise(&nodes);
                    decisions.push(Decision::Preempt { by: id, victims });
                }
                None => {
                    if let Some(k) = key {
                        no_victims.insert(k);
                    }
                }
            }
        }
        // Room for Slurm's task layout (`State::start_on`), per start and node, with every
        // decision of the pass counted.
        room = decisions
            .iter()
            .map(|d| match d {
                // Only a multi-node `-n` job's layout looks at the room: no work (and no
                // allocation) for the rest of a pass's starts.
                Decision::Start { job, nodes }
                    if nodes.len() > 1 && crate::state::lays_out_tasks(&st.jobs[job]) =>
                {
                    let job = &st.jobs[job];
                    let end = match job.time_limit {
                        Some(l) => now.saturating_add(i64::try_from(l).unwrap_or(i64::MAX)),
                        None => i64::MAX,
                    };
                    planner.room(nodes, end, job.spec.mode)
                }
                Decision::Start { .. } | Decision::Preempt { .. } => Vec::new(),
            })
            .collect();
    }

    // 5. apply
    obs.phase(Phase::Apply);
    let mut plan = Plan {
        reservations,
        ..Plan::default()
    };
    // What starts already took beyond their even share, per node: no longer room for later
    // starts of the pass.
    let mut taken: HashMap<NodeId, Tres> = HashMap::new();
    for (d, room) in decisions.into_iter().zip(room) {
        match d {
            Decision::Start { job, nodes } => {
                let run = if st.jobs[&job].is_array_meta() {
                    match st.split_task(job, now) {
                        Some(t) => t,
                        None => continue,
                    }
                } else {
                    job
                };
                let room: Vec<Tres> = nodes
                    .iter()
                    .zip(&room)
                    .map(|(n, r)| r.saturating_sub(&taken.get(n).copied().unwrap_or_default()))
                    .collect();
                let start = st.start_on(run, &nodes, &room, now);
                let share = st.jobs[&run].shape.per_node;
                for sn in &start.nodes {
                    let used = Tres::new(sn.cpus, sn.mem_mb, 0);
                    let beyond = used.saturating_sub(&Tres::new(share.cpus, share.mem_mb, 0));
                    if !beyond.is_zero() {
                        let t = taken.entry(sn.node).or_default();
                        *t = t.saturating_add(&beyond);
                    }
                }
                plan.starts.push(start);
            }
            Decision::Preempt { by, victims } => {
                for v in &victims {
                    let Some(vj) = st.jobs.get(v) else { continue };
                    let mode = st
                        .config
                        .qos(&vj.spec.qos)
                        .map(|q| q.preempt_mode)
                        .unwrap_or(crate::job::PreemptMode::Requeue);
                    let grace = st
                        .config
                        .qos(&vj.spec.qos)
                        .map(|q| q.grace_time_s)
                        .unwrap_or(0);
                    let nodes = vj
                        .alloc
                        .as_ref()
                        .map(|a| a.node_ids().collect())
                        .unwrap_or_default();
                    st.with_job(*v, |j| {
                        j.kill = Some(KillReason::Preempt(mode));
                        j.preempt_time = Some(now);
                    });
                    plan.preemptions.push(Preempt {
                        job: *v,
                        by,
                        mode,
                        grace_s: grace,
                        nodes,
                    });
                }
                st.preempting.insert(by, victims);
            }
        }
    }
    // In id order, so the job table is walked in order; stable, so a later reason for the
    // same record still wins. Not a recorded change: like priority, a pending reason is
    // recomputed by every pass (the first one after a restart included), and recording it
    // would write every new job a second time right after its submit.
    reasons.sort_by_key(|(id, _)| *id);
    for (id, r) in reasons {
        if let Some(j) = st.jobs.get_mut(&id)
            && j.state == JobState::Pending
        {
            j.reason = r;
        }
    }
    stats.started = plan.starts.len();
    stats.preempted = plan.preemptions.len();
    plan.stats = stats;
    obs.phase(Phase::Done);
    plan
}

/// Why a pending record cannot be considered now, or `None` if it can. `singles`: pending
/// singleton jobs that must wait (see [`singleton_blocked`]).
pub(crate) fn ineligible_reason(
    st: &State,
    job: &Job,
    singles: &HashSet<JobId>,
    now: i64,
) -> Option<Reason> {
    match job.hold {
        Hold::User => return Some(Reason::JobHeldUser),
        Hold::Admin => return Some(Reason::JobHeldAdmin),
        Hold::None => {}
    }
    if job.spec.begin.is_some_and(|b| b > now) {
        return Some(Reason::BeginTime);
    }
    match st.dependency_status(job, !singles.contains(&job.id), now) {
        DepStatus::Satisfied => {}
        DepStatus::Pending => return Some(Reason::Dependency),
        DepStatus::NeverSatisfied => return Some(Reason::DependencyNeverSatisfied),
    }
    // A partition removed from the configuration while the job waited.
    let Some(part) = st.config.partition(&job.spec.partition) else {
        return Some(Reason::PartitionInactive);
    };
    match part.state {
        PartitionState::Down => return Some(Reason::PartitionDown),
        PartitionState::Inactive => return Some(Reason::PartitionInactive),
        _ => {}
    }
    if let Some(max) = part.max_time
        && job.time_limit.is_none_or(|t| t > max)
    {
        return Some(Reason::PartitionTimeLimit);
    }
    if part.max_nodes.is_some_and(|m| job.shape.nodes > m) {
        return Some(Reason::PartitionNodeLimit);
    }
    if let Some(q) = st.config.qos(&job.spec.qos)
        && let Some(max) = q.limits.max_wall
        && job.time_limit.is_none_or(|t| t > max)
    {
        return Some(Reason::QOSMaxWallDurationPerJobLimit);
    }
    if let (Some(a), Some(spec)) = (&job.array, &job.spec.array)
        && let Some(t) = spec.throttle
        && a.active >= t
    {
        return Some(Reason::JobArrayTaskLimit);
    }
    None
}

/// Pending jobs with a `singleton` dependency that must wait: another job of the same user
/// and name is running, or an older pending singleton of theirs goes first.
pub(crate) fn singleton_blocked(st: &State) -> HashSet<JobId> {
    let mut blocked = HashSet::new();
    let singles: Vec<&Job> = st.pending_singletons().collect();
    if singles.is_empty() {
        return blocked;
    }
    let mut taken: HashSet<(&str, &str)> = st
        .running_jobs()
        .map(|j| (j.spec.user.as_str(), j.spec.name.as_str()))
        .collect();
    for j in singles {
        // pending_singletons() is in id order: the oldest claims the name.
        if !taken.insert((j.spec.user.as_str(), j.spec.name.as_str())) {
            blocked.insert(j.id);
        }
    }
    blocked
}

/// How many runs a record may start this pass: 1, or for an array its pending indices up to
/// the throttle.
pub(crate) fn start_budget(job: &Job) -> u64 {
    // aftercorr was checked for the next index only.
    let corr = job.spec.dependency.as_ref().is_some_and(|d| {
        d.items
            .iter()
            .any(|i| i.kind == crate::dependency::DepKind::AfterCorr)
    });
    if corr && job.is_array_meta() {
        return 1;
    }
    match (&job.array, job.spec.array.as_ref().and_then(|s| s.throttle)) {
        (Some(a), Some(t)) => a.pending.len().min(u64::from(t.saturating_sub(a.active))),
        (Some(a), None) => a.pending.len(),
        (None, _) => 1,
    }
}

/// Why an array whose record just started `started` tasks still has pending ones, or `None`
/// when none remain or the reason is not a simple one (aftercorr's one-at-a-time budget).
fn rest_of_array_reason(job: &Job, started: u64, stopped_by: Option<Reason>) -> Option<Reason> {
    let a = job.array.as_ref()?;
    if a.pending.len() <= started {
        return None;
    }
    if stopped_by.is_some() {
        return stopped_by;
    }
    let throttle = job.spec.array.as_ref().and_then(|s| s.throttle)?;
    (u64::from(a.active) + started >= u64::from(throttle)).then_some(Reason::JobArrayTaskLimit)
}

pub(crate) fn prioritise(st: &State, ids: &[JobId], now: i64) -> Vec<Candidate> {
    let mut ranking = crate::ranking::Ranking::new(st, now);
    ids.iter()
        .filter_map(|id| {
            let job = &st.jobs[id];
            let part = st
                .config
                .partitions
                .iter()
                .position(|p| p.name == job.spec.partition)?;
            Some(Candidate {
                id: *id,
                part,
                tier: st.config.partitions[part].priority_tier,
                priority: ranking.priority(job),
                submit_time: job.submit_time,
            })
        })
        .collect()
}

/// Jobs that need the same thing from the same nodes: when one cannot start now, a later one
/// with a time limit at least as long cannot either (resources only shrink during a pass).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ShapeKey {
    part: usize,
    shape: crate::job::Shape,
    mode: crate::node::NodeMode,
    gpu_type: Option<String>,
    constraint: Option<String>,
}

impl ShapeKey {
    /// `None` for jobs with node lists (rare; never grouped).
    fn of(job: &Job, part: usize) -> Option<ShapeKey> {
        if !job.spec.nodelist.is_empty() || !job.spec.exclude.is_empty() {
            return None;
        }
        Some(ShapeKey {
            part,
            shape: job.shape,
            mode: job.spec.mode,
            gpu_type: job.spec.gpu_type.clone(),
            constraint: job.spec.constraint.as_ref().map(|c| c.to_string()),
        })
    }
}

struct Memo {
    /// Shortest time limit of this shape that failed to start now.
    failed_limit: u64,
    reserved: bool,
}

/// Running-job counts behind QOS and association limits, kept up to date during the pass.
struct LimitCounters {
    user_qos_jobs: HashMap<(String, String), u32>,
    user_qos_gpus: HashMap<(String, String), u64>,
    account_qos_jobs: HashMap<(String, String), u32>,
    /// Per account, including its sub-accounts' jobs.
    grp_jobs: HashMap<String, u32>,
    grp_gpus: HashMap<String, u64>,
    user_account_jobs: HashMap<(String, String), u32>,
    /// Account limits by name, and parents, for walking up the tree.
    parents: HashMap<String, String>,
    any_limits: bool,
}

impl LimitCounters {
    fn new(st: &State) -> LimitCounters {
        let any_qos = st.config.qos.iter().any(|q| {
            let l = &q.limits;
            l.max_jobs_per_user.is_some()
                || l.max_gpus_per_user.is_some()
                || l.max_jobs_per_account.is_some()
        });
        let any_acct = st
            .config
            .accounts
            .iter()
            .any(|a| a.limits != crate::account::AssocLimits::default());
        let mut c = LimitCounters {
            user_qos_jobs: HashMap::new(),
            user_qos_gpus: HashMap::new(),
            account_qos_jobs: HashMap::new(),
            grp_jobs: HashMap::new(),
            grp_gpus: HashMap::new(),
            user_account_jobs: HashMap::new(),
            parents: st
                .config
                .accounts
                .iter()
                .filter_map(|a| a.parent.clone().map(|p| (a.name.clone(), p)))
                .collect(),
            any_limits: any_qos || any_acct,
        };
        if c.any_limits {
            for j in st.running_jobs() {
                c.add(st, j);
            }
        }
        c
    }

    fn chain<'a>(&'a self, account: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let mut cur = Some(account);
        let mut steps = 0;
        std::iter::from_fn(move || {
            let a = cur?;
            steps += 1;
            // Guards against a cycle in a hand-edited config.
            cur = if steps > 64 {
                None
            } else {
                self.parents.get(a).map(String::as_str)
            };
            Some(a)
        })
    }

    fn add(&mut self, _st: &State, job: &Job) {
        if !self.any_limits {
            return;
        }
        let gpus = u64::from(job.shape.total().gpus);
        let uq = (job.spec.user.clone(), job.spec.qos.clone());
        *self.user_qos_jobs.entry(uq.clone()).or_default() += 1;
        *self.user_qos_gpus.entry(uq).or_default() += gpus;
        *self
            .account_qos_jobs
            .entry((job.spec.account.clone(), job.spec.qos.clone()))
            .or_default() += 1;
        *self
            .user_account_jobs
            .entry((job.spec.user.clone(), job.spec.account.clone()))
            .or_default() += 1;
        let chain: Vec<String> = self.chain(&job.spec.account).map(str::to_string).collect();
        for a in chain {
            *self.grp_jobs.entry(a.clone()).or_default() += 1;
            *self.grp_gpus.entry(a).or_default() += gpus;
        }
    }

    /// The limit one more run of `job` would break, if any.
    fn check(&self, st: &State, job: &Job) -> Option<Reason> {
        if !self.any_limits {
            return None;
        }
        let gpus = u64::from(job.shape.total().gpus);
        if let Some(q) = st.config.qos(&job.spec.qos) {
            let uq = (job.spec.user.clone(), job.spec.qos.clone());
            if let Some(m) = q.limits.max_jobs_per_user
                && self.user_qos_jobs.get(&uq).copied().unwrap_or(0) >= m
            {
                return Some(Reason::QOSMaxJobsPerUserLimit);
            }
            if let Some(m) = q.limits.max_gpus_per_user
                && self.user_qos_gpus.get(&uq).copied().unwrap_or(0) + gpus > u64::from(m)
            {
                return Some(Reason::QOSMaxGRESPerUser);
            }
            if let Some(m) = q.limits.max_jobs_per_account
                && self
                    .account_qos_jobs
                    .get(&(job.spec.account.clone(), job.spec.qos.clone()))
                    .copied()
                    .unwrap_or(0)
                    >= m
            {
                return Some(Reason::QOSMaxJobsPerAccountLimit);
            }
        }
        for a in self.chain(&job.spec.account) {
            let Some(acct) = st.config.accounts.iter().find(|x| x.name == a) else {
                continue;
            };
            if let Some(m) = acct.limits.grp_gpus
                && self.grp_gpus.get(a).copied().unwrap_or(0) + gpus > u64::from(m)
            {
                return Some(Reason::AssocGrpGRES);
            }
            if let Some(m) = acct.limits.grp_jobs
                && self.grp_jobs.get(a).copied().unwrap_or(0) >= m
            {
                return Some(Reason::AssocGrpJobsLimit);
            }
            if a == job.spec.account
                && let Some(m) = acct.limits.max_jobs_per_user
                && self
                    .user_account_jobs
                    .get(&(job.spec.user.clone(), a.to_string()))
                    .copied()
                    .unwrap_or(0)
                    >= m
            {
                return Some(Reason::AssocMaxJobsLimit);
            }
        }
        None
    }
}
