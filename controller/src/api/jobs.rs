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
use crate::state::{
    Caller, CancelFailure, CancelFailureKind, CancelJobs, CancelTargets, Cancelled, Command,
    DETAIL_LIMIT, Handle, JobFilter, WatchTx,
};
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
    who: &tandem_net::auth::Identity,
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

/// The caller as the state actor sees it: the core's requester and [`authz`]'s rule for
/// the jobs it may control.
fn caller(who: &tandem_net::auth::Identity) -> Caller {
    let who = who.clone();
    Caller::new(convert::requester(&who), move |owner_uid| {
        authz::may_control_job(&who, owner_uid)
    })
}

/// The jobs a cancel request names: its ids, or (without ids) the jobs its filters match.
/// Filters that match everything are refused.
fn cancel_request(req: v1::CancelRequest) -> Result<CancelJobs, Status> {
    let targets = if !req.jobs.is_empty() {
        CancelTargets::Jobs(
            req.jobs
                .iter()
                .map(convert::selector)
                .collect::<Result<_, _>>()?,
        )
    } else {
        let filter = JobFilter {
            states: req
                .states
                .iter()
                .map(|s| convert::state_from_proto(*s))
                .collect::<Result<_, _>>()?,
            user: req.user,
            name: req.name,
            partition: req.partition,
            account: req.account,
        };
        if filter.is_empty() {
            return Err(Status::invalid_argument(
                "no job ids and no filters given (refusing to cancel everything)",
            ));
        }
        CancelTargets::Matching(filter)
    };
    Ok(CancelJobs {
        targets,
        signal: req.signal,
        batch_only: req.batch_only,
    })
}

fn cancel_response(c: Cancelled) -> v1::CancelResponse {
    let kind = |k: CancelFailureKind| match k {
        CancelFailureKind::NotFound => v1::CancelFailureKind::NotFound,
        CancelFailureKind::Denied => v1::CancelFailureKind::Denied,
        CancelFailureKind::Ended => v1::CancelFailureKind::Ended,
        CancelFailureKind::NotRunning => v1::CancelFailureKind::NotRunning,
        CancelFailureKind::Unspecified => v1::CancelFailureKind::Unspecified,
    };
    v1::CancelResponse {
        cancelled: c.cancelled.iter().map(|j| j.0).collect(),
        errors: c.failures.iter().map(|f| f.message.clone()).collect(),
        failures: c
            .failures
            .into_iter()
            .map(|CancelFailure { job, kind: k, .. }| v1::CancelFailure {
                job,
                kind: kind(k) as i32,
            })
            .collect(),
    }
}

/// Who submits (recorded on the request's span) and the spec, from a submit or will-run
/// request.
fn submit_request(
    request: Request<v1::SubmitRequest>,
) -> Result<(tandem_net::auth::Identity, v1::JobSpec), Status> {
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
        who: &tandem_net::auth::Identity,
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
        let done = self
            .handle
            .call(|reply| Command::Submit {
                spec: sched_spec,
                payload,
                idempotency_key,
                reply,
            })
            .await?;
        tracing::Span::current().record("job_id", done.job.0);
        Ok(Response::new(v1::SubmitResponse {
            job_id: done.job.0,
            cluster: done.cluster,
            warnings: vec![],
        }))
    }

    #[instrument(skip_all, fields(user))]
    async fn will_run(
        &self,
        request: Request<v1::SubmitRequest>,
    ) -> Result<Response<v1::WillRunResponse>, Status> {
        let (who, spec) = submit_request(request)?;
        // The same conversion and checks as a submit: what it would refuse is refused.
        let (sched_spec, _) = self.batch_spec(spec, &who)?;
        // Answered at once from the live state; nothing is recorded.
        let w = self
            .handle
            .read(move |st, now| {
                st.will_run(sched_spec, now)
                    .map_err(|e| Status::invalid_argument(e.to_string()))
            })
            .await?;
        let nodes: Vec<&str> = w.nodes.iter().map(String::as_str).collect();
        Ok(Response::new(v1::WillRunResponse {
            job_id: w.job_id.0,
            start_time: w.start,
            nodes: tandem_sched::hostlist::compress(&nodes),
            cpus: w.cpus,
            partition: w.partition,
        }))
    }

    #[instrument(skip_all, fields(user, jobs = ?request.get_ref().jobs))]
    async fn cancel(
        &self,
        request: Request<v1::CancelRequest>,
    ) -> Result<Response<v1::CancelResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::Cancel)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = cancel_request(request.into_inner())?;
        let caller = caller(&who);
        let done = self
            .handle
            .call(|reply| Command::Cancel { caller, req, reply })
            .await?;
        Ok(Response::new(cancel_response(done)))
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
        let caller = caller(&who);
        let resp = self
            .handle
            .call(|reply| Command::UpdateJob { caller, req, reply })
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
    use tandem_net::auth::Identity;

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

    #[test]
    fn a_cancel_names_ids_or_filters_and_never_everything() {
        let by_id = cancel_request(v1::CancelRequest {
            jobs: vec![v1::JobRef {
                job_id: 12,
                array_tasks: "3".into(),
            }],
            // Filters beside ids are not looked at, not even checked.
            states: vec![999],
            ..Default::default()
        })
        .unwrap();
        assert!(
            matches!(&by_id.targets, CancelTargets::Jobs(s) if s.len() == 1 && s[0].to_string() == "12_3")
        );
        let err = cancel_request(v1::CancelRequest::default()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("refusing to cancel everything"));
        let bad_state = cancel_request(v1::CancelRequest {
            states: vec![999],
            ..Default::default()
        })
        .unwrap_err();
        assert!(bad_state.message().starts_with("state: "), "{bad_state}");
        let mine = cancel_request(v1::CancelRequest {
            user: "alice".into(),
            signal: 10,
            batch_only: true,
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(&mine.targets, CancelTargets::Matching(f) if f.user == "alice"));
        assert_eq!((mine.signal, mine.batch_only), (10, true));
    }

    #[test]
    fn a_cancels_failures_keep_their_order_in_both_lists() {
        let resp = cancel_response(Cancelled {
            cancelled: vec![JobId(3)],
            failures: vec![
                CancelFailure {
                    job: "1".into(),
                    kind: CancelFailureKind::Denied,
                    message: "denied".into(),
                },
                CancelFailure {
                    job: "2_[1-3]".into(),
                    kind: CancelFailureKind::NotFound,
                    message: "missing".into(),
                },
            ],
        });
        assert_eq!(resp.cancelled, [3]);
        assert_eq!(resp.errors, ["denied", "missing"]);
        let kinds: Vec<(&str, i32)> = resp
            .failures
            .iter()
            .map(|f| (f.job.as_str(), f.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("1", v1::CancelFailureKind::Denied as i32),
                ("2_[1-3]", v1::CancelFailureKind::NotFound as i32)
            ]
        );
    }

    #[test]
    fn a_caller_controls_what_authz_says_it_does() {
        let alice = caller(&Identity::user("alice", 1000, 1000));
        assert!(alice.may_control(1000));
        assert!(!alice.may_control(1001));
        assert!(!alice.by.admin);
        assert_eq!(alice.by.uid, Some(1000));
        let root = caller(&Identity::user("root", 0, 0));
        assert!(root.may_control(1001) && root.by.admin);
    }
}
