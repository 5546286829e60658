//! The state actor's side of srun's steps: placing a step in a running allocation, signing
//! its launch credential, and recording its end.

use super::step_table::{NoSuchStep, Reporter};
use super::*;

impl Actor {
    pub(super) fn create_step(
        &mut self,
        who: &Identity,
        req: &v1::CreateStepRequest,
    ) -> Result<v1::CreateStepResponse, Status> {
        let id = JobId(req.job_id);
        let job = self
            .st
            .job(id)
            .ok_or_else(|| Status::not_found(format!("Invalid job id specified: {id}")))?;
        if !authz::may_run_step(who, job.spec.uid) {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {id} (owned by {})",
                job.spec.user
            )));
        }
        let Some(alloc) = job
            .alloc
            .as_deref()
            .filter(|_| job.state == JobState::Running)
        else {
            return Err(Status::failed_precondition(format!(
                "job {id} is {}: steps run only inside a running allocation",
                job.state
            )));
        };
        let names = self.st.node_names(job);
        let nodes: Vec<steps::AllocNode> = alloc
            .nodes
            .iter()
            .zip(&names)
            .map(|(na, name)| steps::AllocNode {
                name: (*name).to_owned(),
                cpus: na.cpus,
                gpus: na.gpus.clone(),
            })
            .collect();
        let placed =
            steps::place(&nodes, req, job.shape.ntasks).map_err(Status::invalid_argument)?;
        let step_id = self.steps.next_id(id);
        let now = unix_now();
        let step_names: Vec<&str> = placed.iter().map(|p| nodes[p.node].name.as_str()).collect();
        let nodelist = tandem_sched::hostlist::compress(&step_names);
        let ntasks: u32 = placed.iter().map(|p| p.task_ids.len() as u32).sum();
        let rec = StepRec {
            step_id,
            name: if req.name.is_empty() {
                req.argv.first().cloned().unwrap_or_default()
            } else {
                req.name.clone()
            },
            nodelist: nodelist.clone(),
            ntasks,
            start_time: now,
            end_time: None,
            exit_code: 0,
            signal: 0,
            cpus: placed.iter().map(|p| nodes[p.node].cpus).sum(),
            gpus: placed.iter().map(|p| p.gpus.len() as u32).sum(),
        };
        let targets = placed
            .iter()
            .map(|p| v1::StepTarget {
                node: nodes[p.node].name.clone(),
                address: self.workers.step_address(&nodes[p.node].name).to_owned(),
                task_ids: p.task_ids.clone(),
                gpus: p.gpus.clone(),
                node_index: u32::try_from(p.node).unwrap_or(u32::MAX),
                cpus: nodes[p.node].cpus,
            })
            .collect();
        let (uid, gid) = (job.spec.uid, job.spec.gid);
        self.batch
            .steps
            .push((id.0, step_id, serde_json::to_vec(&rec).unwrap_or_default()));
        self.steps.add(id, rec);
        self.view.dirty_jobs.insert(id.0);
        // The launch credential: workers run this step's tasks only with it (job, step,
        // the step's nodes, the job's user, a short expiry).
        let token = self.key.issue_step(
            &tandem_net::auth::StepGrant {
                job_id: id.0,
                step_id,
                nodes: step_names.iter().map(|n| (*n).to_owned()).collect(),
                uid,
                gid,
                exp: 0,
            },
            now,
            authz::STEP_GRANT_LIFETIME,
        );
        Ok(v1::CreateStepResponse {
            job_id: id.0,
            step_id,
            targets,
            nodelist,
            ntasks,
            launch_token: token,
        })
    }

    pub(super) fn complete_step(
        &mut self,
        who: &Identity,
        job_id: u64,
        step_id: u32,
        exit_code: i32,
        signal: i32,
    ) -> Result<(), Status> {
        let id = JobId(job_id);
        if let Some(job) = self.st.job(id)
            && who.role != Role::Worker
            && !authz::may_run_step(who, job.spec.uid)
        {
            return Err(Status::permission_denied(format!(
                "Access/permission denied for job {id}"
            )));
        }
        // srun's report (worst task) is final; a worker's per-node report only fills in
        // when srun never called.
        let by = if who.role == Role::Worker {
            Reporter::Worker
        } else {
            Reporter::Srun
        };
        let ended = self
            .steps
            .end(id, step_id, exit_code, signal, by, unix_now())
            .map_err(|NoSuchStep| Status::not_found(format!("no step {job_id}.{step_id}")))?;
        let Some(rec) = ended else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(rec).unwrap_or_default();
        self.batch.steps.push((job_id, step_id, bytes));
        self.view.dirty_jobs.insert(job_id);
        Ok(())
    }
}
