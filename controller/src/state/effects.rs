//! Turning the core's effects into messages to workers that leave only after the batch
//! deciding them commits.

use super::*;

impl Actor {
    pub(super) fn signal_node(
        &self,
        node: &str,
        job: JobId,
        signal: i32,
        batch_only: bool,
        reason: &str,
    ) {
        let msg = controller_message::Msg::SignalJob(v1::SignalJob {
            job_id: job.0,
            signal,
            batch_only,
            reason: reason.to_owned(),
            grace_s: 0,
        });
        if !self.workers.send(node, msg) {
            debug!(node = %node, job_id = job.0, "signal not sent: worker not connected");
        }
    }

    /// Turns the core's effects into after-commit sends and accounting rows.
    pub(super) fn apply_effects(&mut self, effects: Vec<CoreEffect>) {
        for e in effects {
            match e {
                CoreEffect::Terminate {
                    job,
                    nodes,
                    reason,
                    grace_s,
                } => {
                    // A placeholder's pods are the bridge's to evict (it watches the
                    // job's ending); its worker runs nothing of it.
                    if self
                        .st
                        .job(job)
                        .is_some_and(|j| j.spec.mode == tandem_sched::node::NodeMode::Kube)
                    {
                        info!(
                            job_id = job.0,
                            reason = reason.name(),
                            "placeholder ending: the bridge evicts its pods; its nodes stay held until it reports them gone"
                        );
                        continue;
                    }
                    for n in nodes {
                        if let Some(name) = self.st.node(n).map(|x| x.name.clone()) {
                            self.send_after_commit(
                                &name,
                                controller_message::Msg::SignalJob(v1::SignalJob {
                                    job_id: job.0,
                                    signal: 0,
                                    batch_only: false,
                                    reason: reason.name().to_owned(),
                                    grace_s,
                                }),
                            );
                        }
                    }
                }
                CoreEffect::Abandon { job, node } => {
                    if let Some(name) = self.st.node(node).map(|x| x.name.clone()) {
                        info!(job_id = job.0, node = %name, "worker runs an unknown job: abandoning it");
                        self.send_after_commit(
                            &name,
                            controller_message::Msg::AbandonJob(v1::AbandonJob { job_id: job.0 }),
                        );
                    }
                }
                CoreEffect::Cleanup { job, nodes } => {
                    // Each node answers with JobGone once the job's processes there are
                    // gone; until then it stays held (COMPLETING). A worker not connected
                    // is asked again when it registers.
                    for n in nodes {
                        if let Some(name) = self.st.node(n).map(|x| x.name.clone()) {
                            self.send_after_commit(
                                &name,
                                controller_message::Msg::EndJob(v1::EndJob { job_id: job.0 }),
                            );
                        }
                    }
                }
                CoreEffect::RunEnded(rec) => self.record_run(&rec),
            }
        }
    }

    pub(super) fn send_after_commit(&mut self, node: &str, msg: controller_message::Msg) {
        let Some(tx) = self.workers.sender(node) else {
            debug!(node = %node, "message dropped: worker not connected");
            return;
        };
        self.effects
            .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                if r.is_ok() {
                    let _ = tx.send(Ok(v1::ControllerMessage { msg: Some(msg) }));
                }
            }));
    }
}
