//! `tandem.v1.Accounting`: sacct over finished runs in the store, plus (on request) the jobs
//! still in memory.

use std::sync::{Arc, Mutex};

use prost::Message;
use tandem_proto::auth::identity;
use tandem_proto::v1::{self, accounting_server::Accounting};
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::convert;
use crate::state::{Command, Handle};
use crate::store::{RecordFilter, Store};

/// Most records one query returns; sacct over a long history asks with a time window.
const MAX_RECORDS: u32 = 200_000;

pub struct AccountingService {
    handle: Handle,
    reader: Arc<Mutex<Store>>,
}

impl AccountingService {
    pub fn new(handle: Handle, reader: Arc<Mutex<Store>>) -> Self {
        Self { handle, reader }
    }
}

/// Whether an active job matches the request's filters (the store applies the same
/// filters to finished runs in SQL).
fn matches(j: &v1::JobInfo, req: &v1::ListJobRecordsRequest, states: &[String]) -> bool {
    let any = |v: &[String], x: &str| v.is_empty() || v.iter().any(|s| s == x);
    let ids_ok = req.jobs.is_empty()
        || req
            .jobs
            .iter()
            .any(|r| r.job_id == j.job_id || r.job_id == j.array_job_id);
    let state = v1::JobState::try_from(j.state)
        .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_owned())
        .unwrap_or_default();
    ids_ok
        && any(&req.users, &j.user)
        && any(&req.accounts, &j.account)
        && any(&req.partitions, &j.partition)
        && any(&req.names, &j.name)
        && (states.is_empty() || states.contains(&state))
        && (req.end_time == 0 || j.submit_time <= req.end_time)
}

#[tonic::async_trait]
impl Accounting for AccountingService {
    #[instrument(skip_all, fields(jobs = request.get_ref().jobs.len()))]
    async fn list_job_records(
        &self,
        request: Request<v1::ListJobRecordsRequest>,
    ) -> Result<Response<v1::ListJobRecordsResponse>, Status> {
        identity(&request)?;
        let req = request.into_inner();
        let mut states = Vec::new();
        for s in &req.states {
            let st = tandem_sched::job::JobState::parse(s)
                .ok_or_else(|| Status::invalid_argument(format!("states: unknown state {s:?}")))?;
            states.push(
                convert::state_to_proto(st)
                    .as_str_name()
                    .trim_start_matches("JOB_STATE_")
                    .to_owned(),
            );
        }
        if req.start_time < 0 || req.end_time < 0 {
            return Err(Status::invalid_argument("start/end time: negative"));
        }
        let filter = RecordFilter {
            ids: req.jobs.iter().map(|r| r.job_id).collect(),
            users: req.users.clone(),
            accounts: req.accounts.clone(),
            partitions: req.partitions.clone(),
            states: states.clone(),
            names: req.names.clone(),
            ended_after: (req.start_time > 0).then_some(req.start_time),
            started_before: (req.end_time > 0).then_some(req.end_time),
            limit: Some(MAX_RECORDS),
        };
        // Everything the actor has applied (a job that just ended) is durable before the
        // store is read.
        self.handle.call(|reply| Command::Barrier { reply }).await?;
        let reader = self.reader.clone();
        let rows = tokio::task::spawn_blocking(move || {
            let store = reader
                .lock()
                .map_err(|_| Status::internal("store reader poisoned"))?;
            store
                .query_records(&filter)
                .map_err(|e| Status::internal(format!("{e:#}")))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let mut jobs = Vec::with_capacity(rows.len());
        for r in rows {
            match v1::JobInfo::decode(r.record.as_slice()) {
                Ok(info) => jobs.push(info),
                Err(e) => tracing::warn!(job_id = r.id, error = %e, "undecodable job record"),
            }
        }
        if req.include_active {
            let active = self
                .handle
                .call(|reply| Command::ActiveJobs { reply })
                .await?;
            jobs.extend(
                active
                    .into_iter()
                    .filter(|j| !tandem_sched_terminal(j.state) && matches(j, &req, &states)),
            );
        }
        Ok(Response::new(v1::ListJobRecordsResponse { jobs }))
    }
}

/// Terminal jobs still in memory already have their record in the store.
fn tandem_sched_terminal(state: i32) -> bool {
    convert::state_from_proto(state).is_ok_and(|s| s.is_terminal())
}
