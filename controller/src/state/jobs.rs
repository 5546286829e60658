//! The state actor's job requests: sbatch, scancel, scontrol hold/release/requeue/update,
//! squeue's listing and `WatchJob`.
//!
//! Submit and cancel take and answer plain types ([`Submitted`], [`CancelJobs`],
//! [`Cancelled`]): the handlers in `api/jobs.rs` convert the wire's requests into them and
//! their answers back, and decide who may do what ([`Caller`]).

use super::*;
use tandem_sched::state::JobError;

/// A submit's answer: the job's id and the cluster name Slurm prints with it (empty for
/// the default cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub job: JobId,
    pub cluster: String,
}

/// `scancel`: which jobs, and whether to deliver a signal instead of ending them.
#[derive(Debug, Clone)]
pub struct CancelJobs {
    pub targets: CancelTargets,
    /// Non-zero: deliver this signal only; the jobs' states do not change.
    pub signal: i32,
    /// Signal the batch script's node only.
    pub batch_only: bool,
}

/// The jobs a cancel names.
#[derive(Debug, Clone)]
pub enum CancelTargets {
    /// By id (`12`, `12_3`, `12_[3-5]`), in the order given.
    Jobs(Vec<JobSelector>),
    /// Every live job that is not an array task and matches all the filters set.
    Matching(JobFilter),
}

/// scancel's filters: an empty field matches everything.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub user: String,
    pub name: String,
    pub partition: String,
    pub account: String,
    pub states: Vec<JobState>,
}

impl JobFilter {
    pub fn is_empty(&self) -> bool {
        self.user.is_empty()
            && self.name.is_empty()
            && self.partition.is_empty()
            && self.account.is_empty()
            && self.states.is_empty()
    }

    fn matches(&self, j: &Job) -> bool {
        (self.user.is_empty() || j.spec.user == self.user)
            && (self.name.is_empty() || j.spec.name == self.name)
            && (self.partition.is_empty() || j.spec.partition == self.partition)
            && (self.account.is_empty() || j.spec.account == self.account)
            && (self.states.is_empty() || self.states.contains(&j.state))
    }
}

/// What a cancel did: the jobs cancelled (or signalled), and a failure per target it could
/// not act on, in the order of the targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cancelled {
    pub cancelled: Vec<JobId>,
    pub failures: Vec<CancelFailure>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelFailure {
    /// The target as given (`12`, `12_3`, `12_[3-5]`).
    pub job: String,
    pub kind: CancelFailureKind,
    /// One line for a person to read.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelFailureKind {
    /// No such job (never was, or purged).
    NotFound,
    Denied,
    /// Already ended.
    Ended,
    /// A signal for a job that is not running.
    NotRunning,
    Unspecified,
}

impl Actor {
    pub(super) fn submit(
        &mut self,
        spec: JobSpec,
        payload: Vec<u8>,
        key: Option<String>,
        reply: Reply<Submitted>,
    ) {
        let cluster = self.cluster_for_response();
        if let Some(k) = &key
            && let Some((id, _)) = self.idem.get(k)
        {
            // The first submit may still be in flight: answer after the current batch,
            // which commits after it.
            let resp = Submitted { job: *id, cluster };
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
                        PassTrigger::Now => self.pacing.want(),
                        PassTrigger::IfCapacity => self.pacing.submitted_if_capacity(id),
                        PassTrigger::None => {}
                    }
                }
                self.reply_after_commit(reply, Submitted { job: id, cluster });
            }
            Err(e) => {
                let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
            }
        }
    }

    pub(super) fn cluster_for_response(&self) -> String {
        let name = &self.st.config().cluster_name;
        if name == tandem_sched::config::DEFAULT_CLUSTER_NAME {
            String::new()
        } else {
            name.clone()
        }
    }

    /// The jobs a cancel names: its ids, or the live jobs its filters match.
    fn cancel_targets(&self, targets: CancelTargets) -> Vec<JobSelector> {
        match targets {
            CancelTargets::Jobs(sels) => sels,
            CancelTargets::Matching(filter) => self
                .st
                .jobs()
                .filter(|j| !j.state.is_terminal() && j.array_job_id.is_none())
                .filter(|j| filter.matches(j))
                .map(|j| JobSelector::job(j.id))
                .collect(),
        }
    }

    pub(super) fn cancel(&mut self, caller: &Caller, req: CancelJobs) -> Cancelled {
        let targets = self.cancel_targets(req.targets);
        let now = self.now();
        let by = &caller.by;
        let mut resp = Cancelled::default();
        let fail = |resp: &mut Cancelled, sel: &JobSelector, kind, message: String| {
            resp.failures.push(CancelFailure {
                job: sel.to_string(),
                kind,
                message,
            });
        };
        for sel in targets {
            let Some(job) = self.st.job(sel.job) else {
                fail(
                    &mut resp,
                    &sel,
                    CancelFailureKind::NotFound,
                    format!("Invalid job id specified: {sel}"),
                );
                continue;
            };
            if !caller.may_control(job.spec.uid) {
                let text = format!(
                    "Access/permission denied for job {sel} (owned by {})",
                    job.spec.user
                );
                fail(&mut resp, &sel, CancelFailureKind::Denied, text);
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
                    let kind = if job.state.is_terminal() {
                        CancelFailureKind::Ended
                    } else {
                        CancelFailureKind::NotRunning
                    };
                    let text = format!("Job {sel} is not running; cannot signal it");
                    fail(&mut resp, &sel, kind, text);
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
                resp.cancelled.push(sel.job);
                continue;
            }
            match self.st.cancel(&sel, by, now) {
                Ok(effects) => {
                    self.apply_effects(effects);
                    resp.cancelled.push(sel.job);
                }
                Err(e) => {
                    let kind = match &e {
                        JobError::NotFound(_) | JobError::BadSelector(_) => {
                            CancelFailureKind::NotFound
                        }
                        JobError::InvalidState { .. } => CancelFailureKind::Ended,
                        JobError::PermissionDenied { .. } => CancelFailureKind::Denied,
                        JobError::Invalid { .. } => CancelFailureKind::Unspecified,
                    };
                    fail(&mut resp, &sel, kind, e.to_string());
                }
            }
        }
        if !resp.cancelled.is_empty() {
            self.pacing.want();
        }
        resp
    }

    pub(super) fn update_job(
        &mut self,
        caller: &Caller,
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
        if !caller.may_control(job.spec.uid) {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {sel} (owned by {})",
                job.spec.user
            )));
        }
        let by = &caller.by;
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
            Some(Action::Hold(true)) => self.st.hold(&sel, by).map_err(to_status)?,
            Some(Action::Release(true)) => self.st.release(&sel, by).map_err(to_status)?,
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
                let effects = self.st.requeue(target, by, now).map_err(to_status)?;
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
                    .update_job(sel.job, upd, by, now)
                    .map_err(to_status)?;
            }
            _ => return Err(Status::invalid_argument("action: missing")),
        }
        self.pacing.want();
        Ok(v1::UpdateJobResponse {
            updated: vec![sel.job.0],
        })
    }

    pub(super) fn job_info(&self, job: &Job) -> v1::JobInfo {
        self.job_info_with(job, JobFields::ALL)
    }

    pub(super) fn job_info_with(&self, job: &Job, want: JobFields) -> v1::JobInfo {
        let mut info = convert::job_info_with(&self.st, job, want);
        if want.has(job_field::STEPS)
            && let Some(steps) = self.steps.of(job.id)
        {
            let st = convert::state_to_proto(job.state);
            info.steps = steps.iter().map(|s| s.info(st)).collect();
        }
        info
    }

    pub(super) fn watch(&mut self, job: JobId, tx: WatchTx) -> Result<(), Status> {
        let Some(j) = self.st.job(job) else {
            return Err(Status::not_found(format!(
                "Invalid job id specified: {job}"
            )));
        };
        let info = self.job_info(j);
        let terminal = j.state.is_terminal();
        tx.push(info);
        if !terminal {
            self.watchers.entry(job).or_default().push(tx);
        }
        Ok(())
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
