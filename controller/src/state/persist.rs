//! Persistence mapping: what changed in `State` since the last flush becomes one store
//! [`Batch`](crate::store::Batch), and ended runs become accounting rows.

use super::*;
use tracing::error;

impl Actor {
    /// The accounting row of a run that ended (the job record itself no longer shows the
    /// run's nodes, and a requeued job not even its state).
    pub(super) fn record_run(&mut self, rec: &RunRecord) {
        let Some(job) = self.st.job(rec.job) else {
            return;
        };
        let mut info = self.job_info(job);
        info.state = convert::state_to_proto(rec.state) as i32;
        info.start_time = rec.start_time.unwrap_or(0);
        info.end_time = rec.end_time;
        info.exit_code = rec.exit_code;
        info.exit_signal = rec.signal;
        let names: Vec<&str> = rec
            .nodes
            .iter()
            .filter_map(|n| self.st.node(*n).map(|x| x.name.as_str()))
            .collect();
        info.nodelist = tandem_sched::hostlist::compress(&names);
        info.num_nodes = names.len() as u32;
        if rec.requeued {
            info.reason = String::new();
        }
        let measured = self.ended_usage.as_ref().filter(|u| u.job == rec.job);
        info.usage = measured.and_then(|u| u.whole);
        let batch_usage = measured.and_then(|u| u.batch);
        let batch_host = names.first().copied().unwrap_or_default().to_owned();
        let run = if rec.requeued {
            job.restarts.saturating_sub(1)
        } else {
            job.restarts
        };
        let row = record_row(job, run, &info, &batch_host, batch_usage);
        self.batch.records.push(row);
        if rec.requeued && self.steps.remove(rec.job) {
            self.batch.removed_steps.push(rec.job.0);
        }
    }

    /// Persists everything changed since the last flush in one batch, with the effects
    /// gathered meanwhile. Returns the rows written.
    pub(super) fn flush(&mut self) -> usize {
        let changes = self.st.take_changes();
        self.placeholders_changed(&changes.jobs, &changes.removed_jobs);
        // Before the batch's replies can run: read-your-writes for listings.
        self.publish_view(&changes);
        // A change that cannot be encoded is not made durable, so no request of this
        // batch may hear "done" (a refused one is safe to retry; idempotency keys dedupe).
        let mut unencodable: Option<StoreError> = None;
        let mut batch = std::mem::take(&mut self.batch);
        if !changes.jobs.is_empty() || !changes.removed_jobs.is_empty() {
            batch
                .meta
                .push(("next_job_id".into(), self.st.next_job_id().to_string()));
        }
        for id in &changes.jobs {
            let Some(job) = self.st.job(*id) else {
                continue;
            };
            match serde_json::to_vec(job) {
                Ok(bytes) => batch.jobs.push((id.0, bytes)),
                Err(e) => {
                    error!(job_id = id.0, error = %e, "cannot serialize job; refusing this batch's requests");
                    unencodable.get_or_insert(StoreError::Encode {
                        what: format!("job {}", id.0),
                        reason: e.to_string(),
                    });
                }
            }
            if job.state.is_terminal() {
                // Runs are recorded when they end (`record_run`); this covers jobs that
                // ended without running (cancelled while pending).
                let recordable = job.start_time.is_none()
                    && match &job.array {
                        None => true,
                        // A meta gets its own line only if indices never ran (cancelled while
                        // pending), as Slurm shows `12_[5-9]` CANCELLED.
                        Some(a) => a.tasks.is_empty(),
                    };
                if recordable {
                    let info = self.job_info(job);
                    batch
                        .records
                        .push(record_row(job, job.restarts, &info, "", None));
                }
                if self.steps.remove(*id) {
                    batch.removed_steps.push(id.0);
                }
            }
            // A consumer that fell behind was told so (its stream ends with the error).
            if let Some(ws) = self.watchers.get_mut(id) {
                ws.retain(|w| !w.lagged());
            }
            if let Some(ws) = self.watchers.get(id) {
                let mut info = self.job_info(job);
                if job.state.is_terminal() {
                    // A watcher (sbatch --wait, srun) ends with the job's final state, not
                    // the COMPLETING shown while its nodes are cleaned.
                    info.state = convert::state_to_proto(job.state) as i32;
                }
                let ws = if job.state.is_terminal() {
                    self.watchers.remove(id).unwrap_or_default()
                } else {
                    ws.clone()
                };
                self.effects
                    .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                        if r.is_ok() {
                            for w in ws {
                                w.push(info.clone());
                            }
                        }
                    }));
            }
        }
        for id in &changes.removed_jobs {
            batch.removed_jobs.push(id.0);
            batch.removed_payloads.push(id.0);
            if self.steps.remove(*id) {
                batch.removed_steps.push(id.0);
            }
            self.watchers.remove(id);
        }
        for nid in &changes.nodes {
            if let Some(n) = self.st.node(*nid) {
                match serde_json::to_vec(n) {
                    Ok(bytes) => batch.nodes.push((n.name.clone(), n.id.0, bytes)),
                    Err(e) => warn!(node = %n.name, error = %e, "cannot serialize node"),
                }
            }
        }
        // The tree in the same batch as the jobs: a submit that associated its user on
        // first use is acknowledged only with that association durable.
        batch.meta.extend(crate::store::recover::accounting_meta(
            &self.st,
            changes.config,
            changes.assoc,
        ));
        let mut effects = std::mem::take(&mut self.effects);
        if let Some(err) = unencodable {
            let err = Arc::new(err);
            effects = effects
                .into_iter()
                .map(|e| {
                    let err = err.clone();
                    Box::new(move |store: &Store, _: Result<(), &StoreError>| {
                        e(store, Err(&err));
                    }) as Effect
                })
                .collect();
        }
        if batch.is_empty() && effects.is_empty() {
            return 0;
        }
        let rows = batch.rows();
        if let Err(e) = self.committer.submit(batch, effects) {
            // The committer died after a failed commit; nothing more can be made durable.
            warn!(error = %e, "store is gone; stopping");
            self.stopping = true;
        }
        rows
    }
}

/// The accounting row of one run.
fn record_row(
    job: &Job,
    run: u32,
    info: &v1::JobInfo,
    batch_host: &str,
    batch_usage: Option<v1::ResourceUsage>,
) -> JobRecordRow {
    let mut info = info.clone();
    // sacct's `JOBID.batch` line: the batch script's own step, on the first node with what
    // the job holds there (Slurm 22.05: `-N8 --exclusive` on 64-CPU nodes is 512 CPUs,
    // its `.batch` 64).
    if info.start_time > 0 {
        let gpu_type = info.tres.as_ref().map(|t| t.gpu_type.clone());
        let batch_tres = job
            .alloc
            .as_ref()
            .and_then(|a| a.nodes.first())
            .map(|n| convert::tres(&n.tres(), gpu_type.as_deref()))
            .or_else(|| info.tres.clone());
        let batch = convert::batch_step(&info, batch_host, batch_tres, batch_usage);
        info.steps.insert(0, batch);
    }
    let state = v1::JobState::try_from(info.state)
        .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_owned())
        .unwrap_or_default();
    JobRecordRow {
        id: job.id.0,
        run,
        array_job_id: job
            .array_job_id
            .map(|a| a.0)
            .or(job.array.as_ref().map(|_| job.id.0)),
        array_task_id: job.array_task_id,
        user: job.spec.user.clone(),
        account: job.spec.account.clone(),
        partition: job.spec.partition.clone(),
        name: job.spec.name.clone(),
        state,
        submit_time: job.submit_time,
        start_time: (info.start_time > 0).then_some(info.start_time),
        end_time: if info.end_time > 0 {
            info.end_time
        } else {
            unix_now()
        },
        record: info.encode_to_vec(),
    }
}
