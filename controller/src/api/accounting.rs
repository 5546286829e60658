//! `tandem.v1.Accounting`: sacct over finished runs in the store, plus (on request) the jobs
//! still in memory; sacctmgr changes and views, sshare and sprio, run on the state actor
//! (`state::accounting`, `Handle::read`). Changes need an operator
//! ([`authz::may_change_accounting`]).
//!
//! - [`changes`]: sacctmgr's add, modify and delete, checked and applied to `State`.
//! - [`views`]: what `sacctmgr show`, `sshare` and `sprio` print, read from `State`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prost::Message;
use tandem_proto::v1::{self, accounting_server::Accounting};
use tandem_sched::JobSelector;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{authz, convert, reads};
use crate::state::{Command, Handle};

pub mod changes;
pub mod views;

use crate::store::{RecordFilter, Store};
pub use changes::{Change, MAX_LIST_ITEMS, MAX_TEXT_LEN, at_most};

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
fn matches(
    j: &v1::JobInfo,
    req: &v1::ListJobRecordsRequest,
    selectors: &[JobSelector],
    states: &[String],
) -> bool {
    let any = |v: &[String], x: &str| v.is_empty() || v.iter().any(|s| s == x);
    let ids_ok = selectors.is_empty() || selectors.iter().any(|sel| selects(sel, j));
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

/// Whether `sacct -j` names a job's record as the store's filter does: `12` is job 12 or
/// every task of array 12; `12_3` is task 3 of array 12 and nothing else. A pending array's
/// folded record (`12_[3-9]`) is no single task, so `12_3` does not name it: Slurm 22.05
/// lists nothing for `sacct -j 12_3` while task 3 pends.
fn selects(sel: &JobSelector, j: &v1::JobInfo) -> bool {
    match &sel.tasks {
        None => sel.job.0 == j.job_id || sel.job.0 == j.array_job_id,
        Some(tasks) => {
            sel.job.0 == j.array_job_id
                && u32::try_from(j.array_task_id).is_ok_and(|t| tasks.contains(t))
        }
    }
}

impl AccountingService {
    /// An operator's change, applied by the actor; answers once it is durable.
    async fn change(
        &self,
        who: &tandem_net::auth::Identity,
        change: Change,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        if !authz::may_change_accounting(who) {
            return Err(Status::permission_denied(format!(
                "user {} is not an operator: only operators and root may change accounts, users and QOS",
                who.user
            )));
        }
        tracing::info!(user = %who.user, change = ?change, "accounting change");
        let changed = self
            .handle
            .call(|reply| Command::AccountingChange {
                apply: Box::new(move |st| changes::apply(st, change)),
                reply,
            })
            .await?;
        Ok(Response::new(v1::AccountingChangeResponse { changed }))
    }
}

#[tonic::async_trait]
impl Accounting for AccountingService {
    #[instrument(skip_all)]
    async fn add_account(
        &self,
        request: Request<v1::AddAccountRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::AddAccount(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn modify_account(
        &self,
        request: Request<v1::ModifyAccountRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::ModifyAccount(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn delete_account(
        &self,
        request: Request<v1::DeleteAccountRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::DeleteAccount(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn add_user(
        &self,
        request: Request<v1::AddUserRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::AddUser(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn modify_user(
        &self,
        request: Request<v1::ModifyUserRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::ModifyUser(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn delete_user(
        &self,
        request: Request<v1::DeleteUserRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::DeleteUser(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn add_qos(
        &self,
        request: Request<v1::AddQosRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::AddQos(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn modify_qos(
        &self,
        request: Request<v1::ModifyQosRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::ModifyQos(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn delete_qos(
        &self,
        request: Request<v1::DeleteQosRequest>,
    ) -> Result<Response<v1::AccountingChangeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::AccountingChange)?;
        self.change(&who, Change::DeleteQos(request.into_inner()))
            .await
    }

    #[instrument(skip_all)]
    async fn list_associations(
        &self,
        request: Request<v1::ListAssociationsRequest>,
    ) -> Result<Response<v1::ListAssociationsResponse>, Status> {
        authz::require(&request, authz::Rpc::ListAssociations)?;
        let resp = self
            .handle
            .read(|st, _| Ok(views::associations(st)))
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all)]
    async fn list_qos(
        &self,
        request: Request<v1::ListQosRequest>,
    ) -> Result<Response<v1::ListQosResponse>, Status> {
        authz::require(&request, authz::Rpc::ListQos)?;
        let resp = self.handle.read(|st, _| Ok(views::qos_list(st))).await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all)]
    async fn list_shares(
        &self,
        request: Request<v1::ListSharesRequest>,
    ) -> Result<Response<v1::ListSharesResponse>, Status> {
        authz::require(&request, authz::Rpc::ListShares)?;
        let resp = self.handle.read(|st, _| Ok(views::shares(st))).await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all)]
    async fn list_priorities(
        &self,
        request: Request<v1::ListPrioritiesRequest>,
    ) -> Result<Response<v1::ListPrioritiesResponse>, Status> {
        authz::require(&request, authz::Rpc::ListPriorities)?;
        let req = request.into_inner();
        check_priorities_request(&req)?;
        let resp = self
            .handle
            .read(move |st, now| Ok(views::priorities(st, &req, now)))
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(jobs = request.get_ref().jobs.len()))]
    async fn list_job_records(
        &self,
        request: Request<v1::ListJobRecordsRequest>,
    ) -> Result<Response<v1::ListJobRecordsResponse>, Status> {
        authz::require(&request, authz::Rpc::ListJobRecords)?;
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
        let selectors = req
            .jobs
            .iter()
            .map(convert::selector)
            .collect::<Result<Vec<_>, _>>()?;
        let filter = RecordFilter {
            ids: selectors
                .iter()
                .filter(|s| s.tasks.is_none())
                .map(|s| s.job.0)
                .collect(),
            tasks: selectors
                .iter()
                .filter_map(|s| Some((s.job.0, s.tasks.clone()?)))
                .collect(),
            users: req.users.clone(),
            accounts: req.accounts.clone(),
            partitions: req.partitions.clone(),
            states: states.clone(),
            names: req.names.clone(),
            ended_after: (req.start_time > 0).then_some(req.start_time),
            started_before: (req.end_time > 0).then_some(req.end_time),
            limit: Some(MAX_RECORDS),
        };
        // The active jobs first, the store second: a run that ends between the two reads
        // is then in the store (and dropped from the active part by `merge_runs`) instead
        // of in neither.
        let active = if req.include_active {
            reads::on_view(&self.handle, |v| Ok(v.active_jobs())).await?
        } else {
            Vec::new()
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
        let mut stored = Vec::with_capacity(rows.len());
        for r in rows {
            match v1::JobInfo::decode(r.record.as_slice()) {
                Ok(info) => stored.push((r.id, r.run, info)),
                Err(e) => tracing::warn!(job_id = r.id, error = %e, "undecodable job record"),
            }
        }
        let active = active
            .into_iter()
            .filter(|j| !tandem_sched_terminal(j.state) && matches(j, &req, &selectors, &states))
            .map(with_batch_step);
        let jobs = merge_runs(stored, active);
        Ok(Response::new(v1::ListJobRecordsResponse { jobs }))
    }
}

/// A started job's `JOBID.batch` line while it runs, as sacct shows it (Slurm 22.05:
/// `19.batch batch a1 1 RUNNING 0:0`); its run's record carries the exact one when it ends
/// (`state::persist`). The view holds the job's whole allocation only, so the line gets an
/// even share of it, on the first node.
fn with_batch_step(mut info: v1::JobInfo) -> v1::JobInfo {
    use v1::JobState::{Completing, Running, Suspended};
    let started = matches!(info.state(), Running | Suspended | Completing) && info.start_time > 0;
    if !started || info.steps.iter().any(|s| s.step_id == "batch") {
        return info;
    }
    let host = tandem_sched::hostlist::first(&info.nodelist).unwrap_or_default();
    let nodes = info.num_nodes.max(1);
    let share = info.tres.clone().map(|t| v1::Tres {
        cpus: t.cpus / nodes,
        mem_mb: t.mem_mb / u64::from(nodes),
        gpus: t.gpus / nodes,
        gpu_type: t.gpu_type,
    });
    let batch = convert::batch_step(&info, &host, share, None);
    info.steps.insert(0, batch);
    info
}

/// sacct's lines: the stored runs `(job id, run, record)`, then each active job whose
/// current run has no stored record. The active list was read before the store, so a run
/// that ended in between has both; the stored record, the later word, wins. A job's run
/// number is its restart count during that run, as `JobInfo::restarts` shows it.
fn merge_runs(
    stored: Vec<(u64, u32, v1::JobInfo)>,
    active: impl IntoIterator<Item = v1::JobInfo>,
) -> Vec<v1::JobInfo> {
    let recorded: HashSet<(u64, u32)> = stored.iter().map(|(id, run, _)| (*id, *run)).collect();
    let mut jobs: Vec<v1::JobInfo> = stored.into_iter().map(|(_, _, info)| info).collect();
    jobs.extend(
        active
            .into_iter()
            .filter(|j| !recorded.contains(&(j.job_id, j.restarts))),
    );
    jobs
}

/// sprio's filters are matched on the state actor: an oversized list is refused here,
/// before it reaches the actor.
fn check_priorities_request(req: &v1::ListPrioritiesRequest) -> Result<(), Status> {
    at_most("job ids", &req.jobs)?;
    at_most("array tasks", &req.tasks)?;
    at_most("users", &req.users)
}

/// Terminal jobs still in memory already have their record in the store.
fn tandem_sched_terminal(state: i32) -> bool {
    convert::state_from_proto(state).is_ok_and(|s| s.is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_sprio_filters_are_refused() {
        let cap = 10_000;
        let ok = v1::ListPrioritiesRequest {
            jobs: vec![1; cap],
            users: vec!["u".into(); cap],
            ..Default::default()
        };
        assert!(check_priorities_request(&ok).is_ok());
        for req in [
            v1::ListPrioritiesRequest {
                jobs: vec![1; cap + 1],
                ..Default::default()
            },
            v1::ListPrioritiesRequest {
                users: vec!["u".into(); cap + 1],
                ..Default::default()
            },
            v1::ListPrioritiesRequest {
                tasks: vec![v1::ArrayTaskRef::default(); cap + 1],
                ..Default::default()
            },
        ] {
            let err = check_priorities_request(&req).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains("at most 10000"), "{}", err.message());
        }
    }

    fn info(id: u64, state: v1::JobState, restarts: u32) -> v1::JobInfo {
        v1::JobInfo {
            job_id: id,
            state: state as i32,
            restarts,
            ..Default::default()
        }
    }

    /// `sacct -j 12` names a job or a whole array, `12_3` one task of array 12 only (Slurm
    /// 22.05); a pending array's folded record is no single task.
    #[test]
    fn job_and_task_selectors() {
        use v1::JobState::{Completed, Pending};
        let sel = |s: &str| JobSelector::parse(s).unwrap();
        let task = |id: u64, array: u64, index: i64| v1::JobInfo {
            array_job_id: array,
            array_task_id: index,
            ..info(id, Completed, 0)
        };
        let plain = v1::JobInfo {
            array_task_id: -1,
            ..info(3, Completed, 0)
        };
        // Task 3 of array 12 runs as job 15; task 0 as job 12 itself.
        let (t3, t0) = (task(15, 12, 3), task(12, 12, 0));
        let folded = v1::JobInfo {
            array_job_id: 12,
            array_task_id: -1,
            array_pending: "4-9".into(),
            ..info(12, Pending, 0)
        };
        for (s, j, want) in [
            ("12", &t3, true),
            ("12", &t0, true),
            ("12", &folded, true),
            ("15", &t3, true),
            ("15", &t0, false),
            ("12_3", &t3, true),
            ("12_3", &t0, false),
            ("12_0", &t0, true),
            ("12_4", &folded, false),
            ("15_3", &t3, false),
            ("3_0", &plain, false),
            ("3", &plain, true),
            ("12_[0-3]", &t3, true),
            ("12_[1-2]", &t3, false),
        ] {
            assert_eq!(selects(&sel(s), j), want, "{s} vs job {}", j.job_id);
        }
    }

    /// A running job's batch line, as Slurm lists it under the job in sacct; a pending job
    /// has none, and a line already there is not doubled.
    #[test]
    fn a_running_job_has_its_batch_line() {
        use v1::JobState::{Pending, Running};
        let running = v1::JobInfo {
            nodelist: "node-[3-4]".into(),
            num_nodes: 2,
            start_time: 100,
            tres: Some(v1::Tres {
                cpus: 8,
                mem_mb: 4096,
                gpus: 2,
                gpu_type: "h100".into(),
            }),
            ..info(7, Running, 0)
        };
        let listed = with_batch_step(running.clone());
        assert_eq!(listed.steps.len(), 1);
        let batch = &listed.steps[0];
        assert_eq!(
            (
                batch.step_id.as_str(),
                batch.nodelist.as_str(),
                batch.ntasks
            ),
            ("batch", "node-3", 1)
        );
        assert_eq!(
            (batch.state, batch.start_time, batch.end_time),
            (Running as i32, 100, 0)
        );
        let tres = batch.tres.clone().unwrap();
        assert_eq!((tres.cpus, tres.mem_mb, tres.gpus), (4, 2048, 1));
        assert_eq!(with_batch_step(listed.clone()).steps.len(), 1);
        assert!(with_batch_step(info(8, Pending, 0)).steps.is_empty());
    }

    /// A job seen running (or pending) in memory whose run ended before the store was
    /// read is listed once, as its record; a requeued job's earlier runs do not hide the
    /// run it waits for now.
    #[test]
    fn a_run_recorded_meanwhile_replaces_its_active_entry() {
        use v1::JobState::{Completed, Pending, Preempted, Running};
        let stored = vec![(1, 0, info(1, Completed, 0)), (2, 0, info(2, Preempted, 1))];
        let active = vec![
            info(1, Running, 0), // ended between the reads
            info(2, Pending, 1), // requeued: run 1 is still to come
            info(3, Running, 0), // still running
        ];
        let got: Vec<(u64, i32)> = merge_runs(stored, active)
            .iter()
            .map(|j| (j.job_id, j.state))
            .collect();
        assert_eq!(
            got,
            [
                (1, Completed as i32),
                (2, Preempted as i32),
                (2, Pending as i32),
                (3, Running as i32),
            ]
        );
    }
}
