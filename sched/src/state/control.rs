//! Job control asked for by users and admins: cancel, hold, release, requeue, update.

use crate::JobId;
use crate::array::IndexSet;
use crate::effect::{Effect, SignalReason};
use crate::job::{Hold, Job, JobState, KillReason, Reason};

use super::{JobError, JobSelector, JobUpdate, Requester, State};

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
                m.cancelled_by = by.uid;
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
            effects.extend(self.cancel_one(id, by.uid, now));
        }
        Ok(effects)
    }

    fn cancel_one(&mut self, id: JobId, by: Option<u32>, now: i64) -> Vec<Effect> {
        let Some(job) = self.jobs.get(&id) else {
            return Vec::new();
        };
        match job.state {
            JobState::Pending => {
                self.with_job(id, |j| j.cancelled_by = by);
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
                self.with_job(id, |j| {
                    j.kill = Some(KillReason::Cancel);
                    j.cancelled_by = by;
                });
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

pub(super) fn back_to_pending(j: &mut Job) {
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
    j.cancelled_by = None;
    j.releasing = None;
}
