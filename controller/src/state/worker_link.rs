//! The state actor's side of the worker link: registration, heartbeats and job and step
//! reports, each checked against the node that sends it.

use super::*;

impl Actor {
    pub(super) fn register(
        &mut self,
        conn: ConnId,
        reg: v1::Register,
        tx: WorkerTx,
    ) -> Result<String, Status> {
        let now = self.now();
        let res = reg.resources.clone().unwrap_or_default();
        // Ends reported for the time the link was down come first, so those jobs are not
        // mistaken for jobs lost with the node.
        for ended in &reg.ended_while_disconnected {
            self.job_ended(reg.node_name.trim(), ended, now);
        }
        let registration = NodeRegistration {
            name: reg.node_name.clone(),
            total: tandem_sched::Tres {
                cpus: res.cpus,
                mem_mb: res.mem_mb,
                gpus: res.gpus,
            },
            gpu_type: (!res.gpu_type.is_empty()).then(|| res.gpu_type.clone()),
            features: reg.features.clone(),
            partitions: reg.partitions.clone(),
            running_jobs: reg.running_jobs.iter().map(|j| JobId(*j)).collect(),
        };
        let effects = self
            .st
            .register_node(registration, now)
            .map_err(|e| Status::invalid_argument(format!("register: {e}")))?;
        let name = reg.node_name.trim().to_owned();
        let _ = tx.send(Ok(v1::ControllerMessage {
            msg: Some(controller_message::Msg::Registered(v1::Registered {
                cluster_name: self.st.config().cluster_name.clone(),
                heartbeat_interval_ms: u64::try_from(self.cfg.heartbeat_interval.as_millis())
                    .unwrap_or(u64::MAX),
            })),
        }));
        let about = Reported {
            step_address: reg.step_address.clone(),
            version: reg.version.clone(),
            arch: reg.arch.clone(),
            os: reg.os.clone(),
            hostname: reg.hostname.clone(),
            machine_boot_time: reg.machine_boot_time,
            started: reg.boot_time,
        };
        self.workers
            .connected(&name, conn, tx, about, Instant::now());
        info!(node = %name, cpus = res.cpus, gpus = res.gpus, running = reg.running_jobs.len(), "worker registered");
        self.apply_effects(effects);
        self.pacing.want();
        Ok(name)
    }

    /// A worker's report of a batch script's end. Only the job's current batch node may end
    /// it: a worker back from the dead may report a run that was requeued and restarted
    /// elsewhere meanwhile.
    pub(super) fn job_ended(&mut self, node: &str, e: &v1::JobEnded, now: i64) {
        let outcome = JobOutcome {
            exit_code: e.exit_code,
            signal: e.signal,
            timed_out: e.timed_out,
            cancelled: e.cancelled,
            launch_error: (!e.launch_error.is_empty()).then(|| e.launch_error.clone()),
            out_of_memory: e.out_of_memory,
            processes_gone: e.processes_gone,
        };
        let end = if e.end_time > 0 { e.end_time } else { now };
        match self.st.job_ended_on(node, JobId(e.job_id), outcome, end) {
            Ok(effects) => {
                // The run's accounting record is written while the effects apply.
                self.ended_usage = Some(MeasuredUsage {
                    job: JobId(e.job_id),
                    batch: e.batch_usage,
                    whole: e.job_usage,
                });
                self.apply_effects(effects);
                self.ended_usage = None;
                self.timeout_signalled.remove(&JobId(e.job_id));
                self.pacing.want();
            }
            Err(err) => debug!(job_id = e.job_id, error = %err, "ignoring job end"),
        }
    }

    pub(super) fn worker_event(&mut self, conn: ConnId, node: &str, msg: worker_message::Msg) {
        if !self.workers.heard(node, conn, Instant::now()) {
            // A stream replaced by a newer one of the same node: its news is stale.
            return;
        }
        let now = self.now();
        match msg {
            worker_message::Msg::Register(_) => {
                warn!(node = %node, "second Register on one stream ignored");
            }
            worker_message::Msg::Heartbeat(_) => {
                let _ = self.st.heartbeat(node, now);
            }
            worker_message::Msg::JobStarted(s) => {
                let job = self.st.job(JobId(s.job_id));
                let host = job.and_then(|j| self.st.node_names(j).first().copied());
                let current = job.and_then(|j| j.start_time);
                if !authz::may_report_start(host, node, current, s.start_time, now) {
                    warn!(node = %node, job_id = s.job_id, "refused a start report for a job this node does not host");
                } else if let Err(e) = self.st.job_started(JobId(s.job_id), s.start_time) {
                    debug!(job_id = s.job_id, error = %e, "ignoring job start");
                }
            }
            worker_message::Msg::JobEnded(e) => self.job_ended(node, &e, now),
            worker_message::Msg::JobGone(g) => {
                // A worker speaks only for its own node: `job_gone` frees this node's hold
                // and nothing else.
                let before = self.st.job(JobId(g.job_id)).map(|j| j.shown_state());
                match self.st.job_gone(node, JobId(g.job_id)) {
                    Ok(()) => {
                        let after = self.st.job(JobId(g.job_id)).map(|j| j.shown_state());
                        if before == Some(JobState::Completing) && after != before {
                            info!(job_id = g.job_id, node = %node, "job no longer COMPLETING: its last node reported its processes gone");
                        } else {
                            debug!(job_id = g.job_id, node = %node, "job's processes gone on this node");
                        }
                        self.pacing.want();
                    }
                    Err(e) => debug!(job_id = g.job_id, error = %e, "ignoring a JobGone"),
                }
            }
            worker_message::Msg::StepEnded(s) => {
                let on_node = self
                    .st
                    .job(JobId(s.job_id))
                    .is_some_and(|j| self.st.node_names(j).contains(&node));
                if !on_node {
                    warn!(node = %node, job_id = s.job_id, "refused a step report for a job not on this node");
                    return;
                }
                let worker = Identity::worker(node, 0, 0);
                let _ = self.complete_step(&worker, s.job_id, s.step_id, s.exit_code, s.signal);
            }
        }
    }
}
