//! `tandem.v1.Jobs`: sbatch, scancel, squeue, scontrol on jobs, srun's steps.

use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use tandem_proto::listing::{EncodedListJobs, jobs_server::Jobs};
use tandem_proto::v1;
use tandem_sched::JobId;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{authz, reads};

use super::convert::{self, JobFields, PAYLOAD_FIELDS};
use crate::launch::Payload;
use crate::state::{Command, DETAIL_LIMIT, Handle, WatchTx};
use crate::store::{RecordFilter, Store};

/// Largest request the Jobs service decodes: a maximal script plus environment and
/// argv, so oversized fields are refused by validation with a message that names them.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

pub struct JobsService {
    handle: Handle,
    /// Read-only store connection: payloads for detailed views, records of purged jobs.
    reader: Arc<Mutex<Store>>,
    max_array_size: u32,
}

impl JobsService {
    pub fn new(handle: Handle, reader: Arc<Mutex<Store>>, max_array_size: u32) -> Self {
        Self {
            handle,
            reader,
            max_array_size,
        }
    }
}

/// Fills the wanted payload fields (workdir, output paths, command, ...) of a few jobs from
/// their stored payloads.
pub async fn add_payloads(reader: &Arc<Mutex<Store>>, jobs: &mut [v1::JobInfo], want: JobFields) {
    if jobs.is_empty() || jobs.len() > DETAIL_LIMIT || !wants_payloads(want) {
        return;
    }
    let ids: Vec<u64> = jobs
        .iter()
        .map(|j| {
            if j.array_job_id != 0 {
                j.array_job_id
            } else {
                j.job_id
            }
        })
        .collect();
    let reader = reader.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        let Ok(store) = reader.lock() else {
            return Vec::new();
        };
        ids.iter()
            .map(|id| {
                store
                    .load_payload(*id)
                    .ok()
                    .flatten()
                    .and_then(|b| Payload::decode(&b).ok())
            })
            .collect()
    })
    .await
    .unwrap_or_default();
    for (info, p) in jobs.iter_mut().zip(loaded) {
        if let Some(p) = p {
            convert::add_payload(info, &p, want);
        }
    }
}

fn wants_payloads(want: JobFields) -> bool {
    PAYLOAD_FIELDS.iter().any(|f| want.has(*f))
}

/// Everyone sees every job's state (as squeue shows); only the owner and admins see what it
/// runs and where its output goes. `drop_uid`: the owner was added for this check only.
fn redact(
    mut resp: v1::ListJobsResponse,
    who: &tandem_proto::auth::Identity,
    drop_uid: bool,
) -> v1::ListJobsResponse {
    for j in resp
        .jobs
        .iter_mut()
        .filter(|j| !authz::may_read_job_details(who, j.uid))
    {
        for field in [
            &mut j.workdir,
            &mut j.stdout,
            &mut j.stderr,
            &mut j.command,
            &mut j.comment,
        ] {
            field.clear();
        }
    }
    if drop_uid {
        for j in &mut resp.jobs {
            j.uid = 0;
        }
    }
    resp
}

/// Who submits (recorded on the request's span) and the spec, from a submit or will-run
/// request.
fn submit_request(
    request: Request<v1::SubmitRequest>,
) -> Result<(tandem_proto::auth::Identity, v1::JobSpec), Status> {
    let who = authz::require(&request, authz::Rpc::Submit)?;
    tracing::Span::current().record("user", who.user.as_str());
    let spec = request
        .into_inner()
        .spec
        .ok_or_else(|| Status::invalid_argument("spec: missing"))?;
    Ok((who, spec))
}

impl JobsService {
    /// A batch job's spec from a submit (or will-run) request: kube-mode jobs come only
    /// through the bridge.
    fn batch_spec(
        &self,
        spec: v1::JobSpec,
        who: &tandem_proto::auth::Identity,
    ) -> Result<(tandem_sched::JobSpec, Payload), Status> {
        let (sched_spec, payload) = convert::submit_from_proto(spec, who, self.max_array_size)?;
        if sched_spec.mode == tandem_sched::node::NodeMode::Kube {
            return Err(Status::permission_denied(
                "kube-mode jobs are the bridge's placeholders for Kubernetes pods; \
                 they are submitted through tandem.v1.Bridge, not sbatch",
            ));
        }
        Ok((sched_spec, payload))
    }
}

#[tonic::async_trait]
impl Jobs for JobsService {
    // Debug level: at the default log level a span per submit is measurable overhead at
    // tens of thousands of submits per second.
    #[instrument(level = "debug", skip_all, fields(user, job_id))]
    async fn submit(
        &self,
        request: Request<v1::SubmitRequest>,
    ) -> Result<Response<v1::SubmitResponse>, Status> {
        let (who, spec) = submit_request(request)?;
        // Keys are per user: two users may pick the same key.
        let idempotency_key = (!spec.idempotency_key.is_empty())
            .then(|| format!("{}:{}", who.uid, spec.idempotency_key));
        let (sched_spec, payload) = self.batch_spec(spec, &who)?;
        let payload = payload.into_bytes();
        let resp = self
            .handle
            .call(|reply| Command::Submit {
                spec: sched_spec,
                payload,
                idempotency_key,
                reply,
            })
            .await?;
        tracing::Span::current().record("job_id", resp.job_id);
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(user))]
    async fn will_run(
        &self,
        request: Request<v1::SubmitRequest>,
    ) -> Result<Response<v1::WillRunResponse>, Status> {
        let (who, spec) = submit_request(request)?;
        // The same conversion and checks as a submit: what it would refuse is refused.
        let (sched_spec, _) = self.batch_spec(spec, &who)?;
        let resp = self
            .handle
            .call(|reply| Command::WillRun {
                spec: sched_spec,
                reply,
            })
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(user, jobs = ?request.get_ref().jobs))]
    async fn cancel(
        &self,
        request: Request<v1::CancelRequest>,
    ) -> Result<Response<v1::CancelResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::Cancel)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = request.into_inner();
        let resp = self
            .handle
            .call(|reply| Command::Cancel { who, req, reply })
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all)]
    async fn list_jobs(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Response<EncodedListJobs>, Status> {
        let who = authz::require(&request, authz::Rpc::ListJobs)?;
        let mut req = request.into_inner();
        let want = JobFields::from_names(&req.fields)?;
        // Privacy below needs each job's owner even when the caller asked for fewer fields.
        let add_uid =
            !who.is_admin() && !req.fields.is_empty() && !req.fields.iter().any(|f| f == "uid");
        if add_uid {
            req.fields.push("uid".to_owned());
        }
        // Everything but the payload read (a few jobs, from the store) runs on the listing
        // threads, the reply's encoding and the freeing of its jobs included.
        let finish = move |resp| EncodedListJobs::encode(redact(resp, &who, add_uid));
        if !wants_payloads(want) {
            let encoded =
                reads::on_view(&self.handle, move |v| Ok(finish(v.list_jobs(&req)?))).await?;
            return Ok(Response::new(encoded));
        }
        let mut resp = reads::on_view(&self.handle, move |v| v.list_jobs(&req)).await?;
        add_payloads(&self.reader, &mut resp.jobs, want).await;
        Ok(Response::new(reads::run(move || Ok(finish(resp))).await?))
    }

    #[instrument(skip_all, fields(user, job_id = request.get_ref().job.as_ref().map(|j| j.job_id)))]
    async fn update_job(
        &self,
        request: Request<v1::UpdateJobRequest>,
    ) -> Result<Response<v1::UpdateJobResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::UpdateJob)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = request.into_inner();
        let resp = self
            .handle
            .call(|reply| Command::UpdateJob { who, req, reply })
            .await?;
        Ok(Response::new(resp))
    }

    type WatchJobStream = Pin<Box<dyn Stream<Item = Result<v1::JobInfo, Status>> + Send>>;

    #[instrument(skip_all, fields(job_id = request.get_ref().job.as_ref().map(|j| j.job_id)))]
    async fn watch_job(
        &self,
        request: Request<v1::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        authz::require(&request, authz::Rpc::WatchJob)?;
        let job = request
            .into_inner()
            .job
            .ok_or_else(|| Status::invalid_argument("job: missing"))?;
        if job.job_id == 0 {
            return Err(Status::invalid_argument("job id: 0 is not a job id"));
        }
        let (tx, rx) = WatchTx::channel();
        let id = JobId(job.job_id);
        match self
            .handle
            .call(|reply| Command::Watch { job: id, tx, reply })
            .await
        {
            Ok(()) => {}
            Err(e) if e.code() == tonic::Code::NotFound => {
                // Purged from memory: its final record is in the store.
                self.handle.call(|reply| Command::Barrier { reply }).await?;
                let reader = self.reader.clone();
                let last = tokio::task::spawn_blocking(move || {
                    let store = reader.lock().ok()?;
                    let rows = store
                        .query_records(&RecordFilter {
                            ids: vec![id.0],
                            ..Default::default()
                        })
                        .ok()?;
                    rows.into_iter()
                        .rev()
                        .find(|r| r.id == id.0)
                        .and_then(|r| prost::Message::decode(r.record.as_slice()).ok())
                })
                .await
                .ok()
                .flatten();
                let info: v1::JobInfo = last.ok_or(e)?;
                let s = futures::stream::iter([Ok(info)]);
                return Ok(Response::new(Box::pin(s)));
            }
            Err(e) => return Err(e),
        }
        Ok(Response::new(Box::pin(rx)))
    }

    #[instrument(skip_all, fields(user, job_id = request.get_ref().job_id))]
    async fn create_step(
        &self,
        request: Request<v1::CreateStepRequest>,
    ) -> Result<Response<v1::CreateStepResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::CreateStep)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = request.into_inner();
        let resp = self
            .handle
            .call(|reply| Command::CreateStep { who, req, reply })
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(job_id = request.get_ref().job_id, step_id = request.get_ref().step_id))]
    async fn complete_step(
        &self,
        request: Request<v1::CompleteStepRequest>,
    ) -> Result<Response<v1::CompleteStepResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::CompleteStep)?;
        let req = request.into_inner();
        let resp = self
            .handle
            .call(|reply| Command::CompleteStep { who, req, reply })
            .await?;
        Ok(Response::new(resp))
    }
}

#[cfg(test)]
mod tests {
    use tandem_proto::auth::Identity;

    use super::*;

    fn job(id: u64, uid: u32) -> v1::JobInfo {
        v1::JobInfo {
            job_id: id,
            uid,
            command: "/home/a/train.sh".into(),
            workdir: "/home/a".into(),
            stdout: "/home/a/out".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_listing_shows_details_of_the_callers_own_jobs_only() {
        let resp = v1::ListJobsResponse {
            jobs: vec![job(1, 1000), job(2, 1001)],
            now: 0,
        };
        let out = redact(resp.clone(), &Identity::user("a", 1000, 1000), false);
        assert_eq!(out.jobs[0], resp.jobs[0]);
        assert_eq!(out.jobs[1].command, "");
        assert_eq!(out.jobs[1].workdir, "");
        assert_eq!(out.jobs[1].stdout, "");
        assert_eq!(out.jobs[1].uid, 1001);
        // Root sees everything; an owner added only for the check is taken out again.
        let root = redact(resp.clone(), &Identity::user("root", 0, 0), true);
        assert_eq!(root.jobs[1].command, resp.jobs[1].command);
        assert!(root.jobs.iter().all(|j| j.uid == 0));
    }
}
