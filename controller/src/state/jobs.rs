//! The state actor's job requests: sbatch, scancel, scontrol hold/release/requeue/update,
//! squeue's listing and `WatchJob`.

use super::*;
use tandem_sched::state::JobError;

impl Actor {
    pub(super) fn submit(
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
                        PassTrigger::IfCapacity => self.submitted_if_capacity.push(id),
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

    pub(super) fn will_run(&self, spec: JobSpec) -> Result<v1::WillRunResponse, Status> {
        let w = self
            .st
            .will_run(spec, self.now())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let nodes: Vec<&str> = w.nodes.iter().map(String::as_str).collect();
        Ok(v1::WillRunResponse {
            job_id: w.job_id.0,
            start_time: w.start,
            nodes: tandem_sched::hostlist::compress(&nodes),
            cpus: w.cpus,
            partition: w.partition,
        })
    }

    pub(super) fn cluster_for_response(&self) -> String {
        let name = &self.st.config().cluster_name;
        if name == tandem_sched::config::DEFAULT_CLUSTER_NAME {
            String::new()
        } else {
            name.clone()
        }
    }

    /// The jobs a cancel request names, or (without ids) those its filters match.
    pub(super) fn cancel_targets(
        &self,
        req: &v1::CancelRequest,
    ) -> Result<Vec<JobSelector>, Status> {
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

    pub(super) fn cancel(
        &mut self,
        who: &Identity,
        req: &v1::CancelRequest,
    ) -> Result<v1::CancelResponse, Status> {
        let targets = self.cancel_targets(req)?;
        let now = self.now();
        let by = Self::requester(who);
        let mut resp = v1::CancelResponse::default();
        let fail = |resp: &mut v1::CancelResponse, sel: &JobSelector, kind, text: String| {
            resp.errors.push(text);
            resp.failures.push(v1::CancelFailure {
                job: sel.to_string(),
                kind: kind as i32,
            });
        };
        for sel in targets {
            let Some(job) = self.st.job(sel.job) else {
                fail(
                    &mut resp,
                    &sel,
                    v1::CancelFailureKind::NotFound,
                    format!("Invalid job id specified: {sel}"),
                );
                continue;
            };
            if !authz::may_control_job(who, job.spec.uid) {
                let text = format!(
                    "Access/permission denied for job {sel} (owned by {})",
                    job.spec.user
                );
                fail(&mut resp, &sel, v1::CancelFailureKind::Denied, text);
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
                        v1::CancelFailureKind::Ended
                    } else {
                        v1::CancelFailureKind::NotRunning
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
                resp.cancelled.push(sel.job.0);
                continue;
            }
            match self.st.cancel(&sel, &by, now) {
                Ok(effects) => {
                    self.apply_effects(effects);
                    resp.cancelled.push(sel.job.0);
                }
                Err(e) => {
                    let kind = match &e {
                        JobError::NotFound(_) | JobError::BadSelector(_) => {
                            v1::CancelFailureKind::NotFound
                        }
                        JobError::InvalidState { .. } => v1::CancelFailureKind::Ended,
                        JobError::PermissionDenied { .. } => v1::CancelFailureKind::Denied,
                        JobError::Invalid { .. } => v1::CancelFailureKind::Unspecified,
                    };
                    fail(&mut resp, &sel, kind, e.to_string());
                }
            }
        }
        if !resp.cancelled.is_empty() {
            self.pass_wanted = true;
        }
        Ok(resp)
    }

    pub(super) fn update_job(
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

    pub(super) fn job_info(&self, job: &Job) -> v1::JobInfo {
        self.job_info_with(job, JobFields::ALL)
    }

    pub(super) fn job_info_with(&self, job: &Job, want: JobFields) -> v1::JobInfo {
        let mut info = convert::job_info_with(&self.st, job, want);
        if want.has(job_field::STEPS)
            && let Some(steps) = self.steps.get(&job.id)
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
