//! Submission: validation against the cluster and its limits, id assignment.

use std::collections::{HashMap, HashSet};

use crate::job::{Hold, Job, JobSpec, JobState, NodeCaps, Reason, SpecError};
use crate::partition::PartitionState;
use crate::qos::DEFAULT_QOS;
use crate::{JobId, Tres};

use super::{State, SubmitError, WillRun};

impl State {
    /// Accepts a job: validates it against the cluster, assigns the next id, and records it
    /// PENDING. An array stays one record.
    pub fn submit(&mut self, spec: JobSpec, now: i64) -> Result<JobId, SubmitError> {
        let Admitted {
            spec,
            shape,
            time_limit,
            has_assoc,
            ..
        } = self.admit(spec)?;
        if !has_assoc {
            // Slurm without association enforcement: the user is associated on first use.
            // Marked as such, so a restart keeps it though no list names it; persisted
            // (the tree) in the same batch as this job.
            let _ = self.assoc.add_user_on_first_use(
                &spec.user,
                &spec.account,
                crate::fairshare::DEFAULT_SHARES,
            );
            self.changes.assoc = true;
        }
        let id = JobId(self.next_job_id);
        self.next_job_id += 1;
        let has_dependency = spec.dependency.is_some();
        let mut job = Job::pending(id, spec, shape, time_limit, now);
        if has_dependency {
            // Dependencies are judged by the pass, which sees the whole queue (singleton);
            // the pass records the job's eligibility when it comes.
            job.reason = match job.hold {
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
            // Waiting for a begin time, no pass ranks it before then; Slurm shows its
            // priority from the submit (held jobs have none).
            if job.hold == Hold::None && job.eligible_time.is_none() {
                job.priority = crate::ranking::Ranking::new(self, now).priority(&job);
            }
        }
        self.jobs.insert(id, job);
        self.index(id);
        Ok(id)
    }

    /// When and where a job would start if it were submitted now (`sbatch --test-only`,
    /// Slurm's will-run test): the same checks as a submit, then the earliest start the
    /// running jobs' time limits allow, the queue not counted (as Slurm's test does not).
    /// Changes nothing; the id is the one a submit would get now.
    pub fn will_run(&self, spec: JobSpec, now: i64) -> Result<WillRun, SubmitError> {
        let Admitted {
            spec,
            part,
            shape,
            time_limit,
            ..
        } = self.admit(spec)?;
        let id = JobId(self.next_job_id);
        let job = Job::pending(id, spec, shape, time_limit, now);
        let mut planner = crate::select::Planner::new(self, now);
        let req = crate::select::Request::new(self, &job, part);
        let (start, nodes) = match planner.pick_now(&req) {
            Some(nodes) => (now, nodes),
            None => planner.reserve(&req).ok_or_else(|| {
                SubmitError::Unsatisfiable(
                    "no start time found: the nodes it fits are held by jobs without a time \
                     limit"
                        .into(),
                )
            })?,
        };
        let cpus = nodes.iter().map(|n| planner.need_on(*n, &req).cpus).sum();
        let names = nodes
            .iter()
            .filter_map(|n| self.node(*n).map(|x| x.name.clone()))
            .collect();
        Ok(WillRun {
            job_id: id,
            start,
            nodes: names,
            cpus,
            partition: job.spec.partition,
        })
    }

    /// The checks of a submit, and what they settle: the spec with its defaults filled in,
    /// its shape and time limit.
    fn admit(&self, mut spec: JobSpec) -> Result<Admitted, SubmitError> {
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
        Ok(Admitted {
            spec,
            part: part_idx,
            shape,
            time_limit,
            has_assoc,
        })
    }

    /// Jobs just submitted that no pass will look at soon, because no node has a free CPU:
    /// what a pass would say, as Slurm's submit does when its first attempt finds no room:
    /// why one that cannot be considered waits (a dependency, say), else its priority and
    /// `Resources`. Held jobs keep the hold's reason.
    pub fn no_room_for(&mut self, ids: &[JobId], now: i64) {
        let singles = crate::cycle::singleton_blocked(self);
        let mut waiting: Vec<JobId> = Vec::new();
        let mut reasons: Vec<(JobId, Reason)> = Vec::new();
        for id in ids {
            let Some(job) = self.jobs.get(id) else {
                continue;
            };
            if job.state != JobState::Pending || job.hold != Hold::None {
                continue;
            }
            match crate::cycle::ineligible_reason(self, job, &singles, now) {
                Some(r) => reasons.push((*id, r)),
                None => waiting.push(*id),
            }
        }
        let ranked: Vec<JobId> = reasons
            .iter()
            .map(|(id, _)| *id)
            .chain(waiting.iter().copied())
            .collect();
        for (id, r) in reasons {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.reason = r;
            }
        }
        for id in &waiting {
            if let Some(j) = self.jobs.get_mut(id) {
                j.reason = Reason::Resources;
            }
        }
        // A job waiting for a dependency or a begin time has a priority too, as in Slurm.
        for c in crate::cycle::prioritise(self, &ranked, now) {
            if let Some(j) = self.jobs.get_mut(&c.id) {
                j.priority = c.priority;
            }
        }
        // Already written with the submit when the controller asks before its flush.
        self.changes.jobs.extend(ranked);
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
    pub(super) fn check_satisfiable(
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

/// What a submit's checks settle about a job (see [`State::admit`]).
struct Admitted {
    spec: JobSpec,
    /// Index of its partition in the configuration.
    part: usize,
    shape: crate::job::Shape,
    time_limit: Option<u64>,
    /// Whether the user already has an association with the account.
    has_assoc: bool,
}
