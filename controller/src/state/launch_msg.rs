//! Launch assembly: the `LaunchJob` message for a started job, built after the commit from
//! the job's facts and its stored payload.

use super::*;

impl Actor {
    pub(super) fn launch(&mut self, start: &tandem_sched::Start, now: i64) {
        let Some(job) = self.st.job(start.job) else {
            return;
        };
        // A placeholder holds its nodes for pods the bridge binds; no worker runs it.
        if job.spec.mode == tandem_sched::node::NodeMode::Kube {
            return;
        }
        let Some(first) = start.nodes.first() else {
            return;
        };
        let facts = self.launch_facts(job, start, now);
        let nodelist = self.st.nodelist(job);
        let payload_id = job.array_job_id.unwrap_or(job.id).0;
        let job_id = job.id;
        let time_limit = job.time_limit.unwrap_or(0);
        let kill_wait = u32::try_from(self.cfg.kill_wait.as_secs()).unwrap_or(u32::MAX);
        let gpus = first.gpus.clone();
        let tx = self.workers.sender(&first.name);
        let node = first.name.clone();
        let failed = self.launch_failed_tx.clone();
        self.effects.push(Box::new(move |store: &Store, r: Result<(), &StoreError>| {
            if r.is_err() {
                return;
            }
            let payload = match store.load_payload(payload_id) {
                Ok(Some(bytes)) => Payload::decode(&bytes).map_err(|e| e.to_string()),
                Ok(None) => Err(format!("payload of job {payload_id} is missing")),
                Err(e) => Err(e.to_string()),
            };
            let payload = match payload {
                Ok(p) => p,
                Err(error) => {
                    let _ = failed.send((job_id, error));
                    return;
                }
            };
            let (stdout, stderr) = launch::output_paths(&facts, &payload);
            let stdin = launch::input_path(&facts, &payload);
            let environment = launch::job_environment(&facts, &payload, &nodelist);
            let msg = v1::LaunchJob {
                job_id: job_id.0,
                name: facts.name.clone(),
                user: facts.user.clone(),
                uid: facts.uid,
                gid: facts.gid,
                script: payload.script,
                argv: payload.argv,
                workdir: payload.workdir,
                environment: environment.into_iter().collect(),
                stdout,
                stderr,
                time_limit_s: time_limit,
                gpus,
                kill_wait_s: kill_wait,
                start_time: facts.start_time,
                stdin,
                open_append: payload.open_append,
                signal_number: payload.signal.map_or(0, |w| w.number),
                signal_before_s: payload.signal.map_or(0, |w| w.before_s),
                signal_batch_only: payload.signal.is_some_and(|w| w.batch_only),
                mem_mb: facts.mem_per_node_mb,
                cpus: facts.cpus_per_node.first().copied().unwrap_or(0),
                umask: payload.umask,
            };
            let sent = tx.is_some_and(|tx| {
                tx.send(Ok(v1::ControllerMessage {
                    msg: Some(controller_message::Msg::LaunchJob(msg)),
                }))
                .is_ok()
            });
            if !sent {
                // The worker's stream is gone; when it re-registers without this job the
                // core ends it NODE_FAIL (requeued when allowed), and a worker that never
                // returns times out the same way.
                warn!(job_id = job_id.0, node = %node, "launch not delivered: worker not connected");
            }
        }));
    }

    pub(super) fn launch_facts(
        &self,
        job: &Job,
        start: &tandem_sched::Start,
        now: i64,
    ) -> LaunchFacts {
        let array = job.array_job_id.and_then(|meta| {
            let m = self.st.job(meta)?;
            let spec = m.spec.array.as_deref()?;
            Some(ArrayFacts {
                array_job_id: meta.0,
                task_id: job.array_task_id.unwrap_or(0),
                count: spec.indices.len(),
                min: spec.indices.first().unwrap_or(0),
                max: spec.indices.last().unwrap_or(0),
                step: spec.indices.step(),
            })
        });
        LaunchFacts {
            job_id: job.id.0,
            name: job.spec.name.clone(),
            user: job.spec.user.clone(),
            uid: job.spec.uid,
            gid: job.spec.gid,
            partition: job.spec.partition.clone(),
            account: job.spec.account.clone(),
            qos: job.spec.qos.clone(),
            cluster_name: self.st.config().cluster_name.clone(),
            nodes: start.nodes.iter().map(|n| n.name.clone()).collect(),
            cpus_per_node: start.nodes.iter().map(|n| n.cpus).collect(),
            mem_per_node_mb: job.shape.per_node.mem_mb,
            ntasks: job.shape.ntasks,
            tasks_per_node: job.shape.tasks_per_node,
            ntasks_given: job.spec.ntasks > 0 || job.spec.ntasks_per_node > 0,
            tasks_per_node_given: job.spec.ntasks_per_node > 0,
            cpus_per_task: job.spec.cpus_per_task,
            gpus_total: start.nodes.iter().map(|n| n.gpus.len() as u32).sum(),
            batch_node_gpus: start
                .nodes
                .first()
                .map(|n| n.gpus.clone())
                .unwrap_or_default(),
            array,
            start_time: job.start_time.unwrap_or(now),
            time_limit_s: job.time_limit,
            restarts: job.restarts,
        }
    }
}
