//! The state actor's side of `tandem.v1.Accounting` beyond sacct: run-time changes to
//! accounts, user associations and QOS (sacctmgr), and the numbers sshare and sprio show.
//!
//! A change request is applied to the live `State` item by item and undone as a whole if any
//! item fails ([`State::rollback_accounting`]), so `sacctmgr add account a,b` with a bad `b`
//! adds neither. Accepted changes mark the configuration and the tree changed; the actor's
//! flush persists both (`cluster_config`, `assoc_tree`) in the batch that answers the caller,
//! and the next pass sees the new shares, priorities and limits.
//!
//! The functions over `State` here are pure (no I/O, `now` is an argument), so their tests
//! need no controller.

use std::collections::{HashMap, HashSet};

use tandem_proto::v1;
use tandem_sched::State;
use tandem_sched::account::{AccountConfig, AssocLimits, UserConfig};
use tandem_sched::fairshare::{AssocKind, ROOT_ACCOUNT, sshare_rows};
use tandem_sched::job::{JobState, PreemptMode, Reason};
use tandem_sched::qos::{Qos, QosLimits};
use tandem_sched::ranking::Ranking;
use tandem_sched::state::AdminError;
use tonic::Status;

use super::{Actor, Reply};

/// Shares a new association gets when the request names none (Slurm's `Fairshare=1`).
const DEFAULT_SHARES: u32 = tandem_sched::fairshare::DEFAULT_SHARES;

/// Most entries in one list of a request (names, users, accounts, job ids). Every list is
/// walked on the state actor, which serves everything else meanwhile.
pub const MAX_LIST_ITEMS: usize = 10_000;

/// Longest description or organization, in bytes.
pub const MAX_TEXT_LEN: usize = 256;

/// Requests for the actor. The handler has already checked that a change comes from an
/// operator.
pub enum AcctCommand {
    Change {
        change: Change,
        reply: Reply<v1::AccountingChangeResponse>,
    },
    Associations {
        reply: Reply<v1::ListAssociationsResponse>,
    },
    Qos {
        reply: Reply<v1::ListQosResponse>,
    },
    Shares {
        reply: Reply<v1::ListSharesResponse>,
    },
    Priorities {
        req: v1::ListPrioritiesRequest,
        reply: Reply<v1::ListPrioritiesResponse>,
    },
}

/// One sacctmgr change, as it came over the wire.
#[derive(Debug, Clone)]
pub enum Change {
    AddAccount(v1::AddAccountRequest),
    ModifyAccount(v1::ModifyAccountRequest),
    DeleteAccount(v1::DeleteAccountRequest),
    AddUser(v1::AddUserRequest),
    ModifyUser(v1::ModifyUserRequest),
    DeleteUser(v1::DeleteUserRequest),
    AddQos(v1::AddQosRequest),
    ModifyQos(v1::ModifyQosRequest),
    DeleteQos(v1::DeleteQosRequest),
}

impl Actor {
    pub(super) fn accounting(&mut self, cmd: AcctCommand) {
        match cmd {
            AcctCommand::Change { change, reply } => {
                let snap = self.st.accounting_snapshot();
                match apply(&mut self.st, change) {
                    Ok(changed) => {
                        // New shares, priorities or limits may reorder or unblock the queue.
                        self.pass_wanted = true;
                        self.reply_after_commit(reply, v1::AccountingChangeResponse { changed });
                    }
                    Err(e) => {
                        self.st.rollback_accounting(snap);
                        let _ = reply.send(Err(e));
                    }
                }
            }
            AcctCommand::Associations { reply } => {
                let _ = reply.send(Ok(associations(&self.st)));
            }
            AcctCommand::Qos { reply } => {
                let _ = reply.send(Ok(qos_list(&self.st)));
            }
            AcctCommand::Shares { reply } => {
                let _ = reply.send(Ok(shares(&self.st)));
            }
            AcctCommand::Priorities { req, reply } => {
                let now = self.now();
                let _ = reply.send(Ok(priorities(&self.st, &req, now)));
            }
        }
    }
}

// === changes ===

fn admin_error(e: AdminError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Applies one change to `st`; on error some items may have been applied (the caller rolls
/// back). Returns one line per thing changed.
pub fn apply(st: &mut State, change: Change) -> Result<Vec<String>, Status> {
    let mut changed = Vec::new();
    match change {
        Change::AddAccount(r) => {
            need("account names", &r.names)?;
            check_names(&r.names)?;
            let parent = match r.parent.as_str() {
                "" | ROOT_ACCOUNT => None,
                p => Some(p.to_owned()),
            };
            let s = r.settings.unwrap_or_default();
            for name in &r.names {
                let mut acct = AccountConfig {
                    parent: parent.clone(),
                    ..AccountConfig::new(name, DEFAULT_SHARES)
                };
                account_settings(&mut acct, &s)?;
                st.add_account(acct).map_err(admin_error)?;
                changed.push(format!("account {name}"));
            }
        }
        Change::ModifyAccount(r) => {
            need("account names", &r.names)?;
            let s = r.settings.unwrap_or_default();
            if s == v1::AccountChanges::default() {
                return Err(Status::invalid_argument("nothing to set"));
            }
            for name in &r.names {
                let Some(mut acct) = st
                    .config()
                    .accounts
                    .iter()
                    .find(|a| &a.name == name)
                    .cloned()
                else {
                    let what = if name == ROOT_ACCOUNT {
                        "the root account cannot be modified".to_owned()
                    } else {
                        format!("account {name:?} does not exist")
                    };
                    return Err(Status::invalid_argument(what));
                };
                account_settings(&mut acct, &s)?;
                st.update_account(acct).map_err(admin_error)?;
                changed.push(format!("account {name}"));
            }
        }
        Change::DeleteAccount(r) => {
            need("account names", &r.names)?;
            for name in &r.names {
                st.remove_account(name).map_err(admin_error)?;
                changed.push(format!("account {name}"));
            }
        }
        Change::AddUser(r) => {
            need("user names", &r.users)?;
            check_names(&r.users)?;
            let mut accounts = r.accounts.clone();
            if accounts.is_empty() && !r.default_account.is_empty() {
                accounts.push(r.default_account.clone());
            }
            need("accounts (Account=)", &accounts)?;
            check_names(&accounts)?;
            if !r.default_account.is_empty() {
                check_name(&r.default_account)?;
            }
            let shares = match r.settings.and_then(|s| s.shares) {
                Some(v) => non_negative("Fairshare", v)?,
                None => DEFAULT_SHARES,
            };
            for user in &r.users {
                for account in &accounts {
                    st.add_user(UserConfig {
                        user: user.clone(),
                        account: account.clone(),
                        shares,
                        default: false,
                    })
                    .map_err(admin_error)?;
                    changed.push(format!("user {user} account {account}"));
                }
                if !r.default_account.is_empty() {
                    set_default(st, user, &r.default_account)?;
                }
            }
        }
        Change::ModifyUser(r) => {
            need("user names", &r.users)?;
            at_most("accounts (Account=)", &r.accounts)?;
            let shares = r
                .settings
                .and_then(|s| s.shares)
                .map(|v| non_negative("Fairshare", v))
                .transpose()?;
            if shares.is_none() && r.default_account.is_empty() {
                return Err(Status::invalid_argument("nothing to set"));
            }
            for user in &r.users {
                if let Some(shares) = shares {
                    for mut assoc in matching_users(st, user, &r.accounts)? {
                        assoc.shares = shares;
                        changed.push(format!("user {user} account {}", assoc.account));
                        st.update_user(assoc).map_err(admin_error)?;
                    }
                }
                if !r.default_account.is_empty() {
                    set_default(st, user, &r.default_account)?;
                    changed.push(format!("user {user} default account {}", r.default_account));
                }
            }
        }
        Change::DeleteUser(r) => {
            need("user names", &r.users)?;
            at_most("accounts (Account=)", &r.accounts)?;
            for user in &r.users {
                for assoc in matching_users(st, user, &r.accounts)? {
                    st.remove_user(user, &assoc.account).map_err(admin_error)?;
                    changed.push(format!("user {user} account {}", assoc.account));
                }
            }
        }
        Change::AddQos(r) => {
            need("QOS names", &r.names)?;
            check_names(&r.names)?;
            let s = r.settings.unwrap_or_default();
            for name in &r.names {
                if st.config().qos(name).is_some() {
                    return Err(Status::invalid_argument(format!(
                        "QOS {name:?} already exists"
                    )));
                }
                let mut q = Qos::new(name);
                qos_settings(&mut q, &s)?;
                st.upsert_qos(q).map_err(admin_error)?;
                changed.push(format!("qos {name}"));
            }
        }
        Change::ModifyQos(r) => {
            need("QOS names", &r.names)?;
            let s = r.settings.unwrap_or_default();
            if s == v1::QosChanges::default() {
                return Err(Status::invalid_argument("nothing to set"));
            }
            for name in &r.names {
                let Some(mut q) = st.config().qos(name).cloned() else {
                    return Err(Status::invalid_argument(format!(
                        "QOS {name:?} does not exist"
                    )));
                };
                qos_settings(&mut q, &s)?;
                st.upsert_qos(q).map_err(admin_error)?;
                changed.push(format!("qos {name}"));
            }
        }
        Change::DeleteQos(r) => {
            need("QOS names", &r.names)?;
            for name in &r.names {
                st.remove_qos(name).map_err(admin_error)?;
                changed.push(format!("qos {name}"));
            }
        }
    }
    Ok(changed)
}

fn need(what: &str, v: &[String]) -> Result<(), Status> {
    if v.is_empty() || v.iter().any(String::is_empty) {
        return Err(Status::invalid_argument(format!("no {what} given")));
    }
    at_most(what, v)
}

/// Refuses a list longer than [`MAX_LIST_ITEMS`].
pub fn at_most<T>(what: &str, v: &[T]) -> Result<(), Status> {
    if v.len() > MAX_LIST_ITEMS {
        return Err(Status::invalid_argument(format!(
            "too many {what}: {} (at most {MAX_LIST_ITEMS})",
            v.len()
        )));
    }
    Ok(())
}

/// Account, user and QOS names share the association tree's rule.
fn check_name(name: &str) -> Result<(), Status> {
    tandem_sched::fairshare::check_name(name).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn check_names(names: &[String]) -> Result<(), Status> {
    names.iter().try_for_each(|n| check_name(n))
}

/// A description or organization: one line, at most [`MAX_TEXT_LEN`] bytes.
fn check_text(field: &str, v: &str) -> Result<(), Status> {
    if v.len() > MAX_TEXT_LEN {
        return Err(Status::invalid_argument(format!(
            "{field} is longer than {MAX_TEXT_LEN} bytes ({} bytes)",
            v.len()
        )));
    }
    if v.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "{field} must not contain control characters"
        )));
    }
    Ok(())
}

fn non_negative(field: &str, v: i64) -> Result<u32, Status> {
    if v < 0 {
        return Err(Status::invalid_argument(format!(
            "{field} must not be negative (got {v})"
        )));
    }
    u32::try_from(v)
        .map_err(|_| Status::invalid_argument(format!("{field} is too large (got {v})")))
}

/// A limit: -1 clears it (Slurm's convention), other negatives are errors.
fn limit(field: &str, v: i64) -> Result<Option<u32>, Status> {
    if v == -1 {
        return Ok(None);
    }
    non_negative(field, v).map(Some)
}

fn account_settings(a: &mut AccountConfig, s: &v1::AccountChanges) -> Result<(), Status> {
    if let Some(v) = s.shares {
        a.shares = non_negative("Fairshare", v)?;
    }
    let AssocLimits {
        grp_gpus,
        grp_jobs,
        max_jobs_per_user,
    } = &mut a.limits;
    if let Some(v) = s.grp_gpus {
        *grp_gpus = limit("GrpTRES gres/gpu", v)?;
    }
    if let Some(v) = s.grp_jobs {
        *grp_jobs = limit("GrpJobs", v)?;
    }
    if let Some(v) = s.max_jobs_per_user {
        *max_jobs_per_user = limit("MaxJobs", v)?;
    }
    if let Some(v) = &s.description {
        check_text("Description", v)?;
        a.description = v.clone();
    }
    if let Some(v) = &s.organization {
        check_text("Organization", v)?;
        a.organization = v.clone();
    }
    Ok(())
}

fn qos_settings(q: &mut Qos, s: &v1::QosChanges) -> Result<(), Status> {
    if let Some(v) = s.priority {
        q.priority = non_negative("Priority", v)?;
    }
    if let Some(list) = &s.preempt {
        at_most("Preempt QOS", &list.values)?;
        check_names(&list.values)?;
        q.preempt = list.values.clone();
    }
    if let Some(m) = &s.preempt_mode {
        q.preempt_mode = match m.to_ascii_lowercase().as_str() {
            "requeue" => PreemptMode::Requeue,
            "cancel" => PreemptMode::Cancel,
            other => {
                return Err(Status::invalid_argument(format!(
                    "PreemptMode {other:?}: Tandem supports requeue and cancel"
                )));
            }
        };
    }
    if let Some(v) = s.grace_time_s {
        q.grace_time_s = non_negative("GraceTime", v)?;
    }
    let QosLimits {
        max_jobs_per_user,
        max_submit_per_user,
        max_jobs_per_account,
        max_submit_per_account,
        max_gpus_per_user,
        max_wall,
    } = &mut q.limits;
    for (field, value, slot) in [
        ("MaxJobsPerUser", s.max_jobs_per_user, max_jobs_per_user),
        (
            "MaxSubmitJobsPerUser",
            s.max_submit_per_user,
            max_submit_per_user,
        ),
        (
            "MaxJobsPerAccount",
            s.max_jobs_per_account,
            max_jobs_per_account,
        ),
        (
            "MaxSubmitJobsPerAccount",
            s.max_submit_per_account,
            max_submit_per_account,
        ),
        (
            "MaxTRESPerUser gres/gpu",
            s.max_gpus_per_user,
            max_gpus_per_user,
        ),
    ] {
        if let Some(v) = value {
            *slot = limit(field, v)?;
        }
    }
    if let Some(v) = s.max_wall_s {
        *max_wall = match v {
            -1 => None,
            v if v < 0 => {
                return Err(Status::invalid_argument(format!(
                    "MaxWall must not be negative (got {v})"
                )));
            }
            v => Some(v as u64),
        };
    }
    Ok(())
}

/// The associations of `user` (with the given accounts, or all); an error if none.
fn matching_users(st: &State, user: &str, accounts: &[String]) -> Result<Vec<UserConfig>, Status> {
    let found: Vec<UserConfig> = st
        .config()
        .users
        .iter()
        .filter(|u| u.user == user && (accounts.is_empty() || accounts.contains(&u.account)))
        .cloned()
        .collect();
    if found.is_empty() {
        let which = if accounts.is_empty() {
            String::new()
        } else {
            format!(" with account(s) {}", accounts.join(","))
        };
        return Err(Status::invalid_argument(format!(
            "user {user:?} has no association{which}"
        )));
    }
    for a in accounts {
        if !found.iter().any(|u| &u.account == a) {
            return Err(Status::invalid_argument(format!(
                "user {user:?} has no association with account {a:?}"
            )));
        }
    }
    Ok(found)
}

fn set_default(st: &mut State, user: &str, account: &str) -> Result<(), Status> {
    let mut assoc = matching_users(st, user, &[account.to_owned()])?
        .into_iter()
        .next()
        .ok_or_else(|| Status::internal("association vanished"))?;
    assoc.default = true;
    st.update_user(assoc).map_err(admin_error)
}

// === queries ===

fn limits_to_proto(l: &AssocLimits) -> v1::AssocLimits {
    v1::AssocLimits {
        grp_gpus: l.grp_gpus,
        grp_jobs: l.grp_jobs,
        max_jobs_per_user: l.max_jobs_per_user,
    }
}

/// `sacctmgr show account/user/assoc`: accounts and users in tree order (root first,
/// parents before children).
pub fn associations(st: &State) -> v1::ListAssociationsResponse {
    let tree = st.assoc();
    let cfg = st.config();
    // By name first: a walk over thousands of associations must not scan the lists per row.
    let by_name: HashMap<&str, &AccountConfig> =
        cfg.accounts.iter().map(|a| (a.name.as_str(), a)).collect();
    let defaults: HashSet<(&str, &str)> = cfg
        .users
        .iter()
        .filter(|u| u.default)
        .map(|u| (u.user.as_str(), u.account.as_str()))
        .collect();
    let mut accounts = Vec::new();
    let mut users = Vec::new();
    for (idx, _) in tree.walk() {
        let name = tree.name(idx);
        match tree.kind(idx) {
            AssocKind::Account => {
                let parent = tree
                    .parent(idx)
                    .map(|p| tree.name(p).to_owned())
                    .unwrap_or_default();
                let info = match by_name.get(name) {
                    Some(a) => v1::AccountInfo {
                        name: a.name.clone(),
                        parent,
                        shares: a.shares,
                        limits: Some(limits_to_proto(&a.limits)),
                        description: a.description.clone(),
                        organization: a.organization.clone(),
                    },
                    None => v1::AccountInfo {
                        name: name.to_owned(),
                        parent,
                        shares: tree.shares(idx),
                        limits: Some(v1::AssocLimits::default()),
                        ..Default::default()
                    },
                };
                accounts.push(info);
            }
            AssocKind::User => {
                let account = tree
                    .parent(idx)
                    .map(|p| tree.name(p).to_owned())
                    .unwrap_or_default();
                let is_default = defaults.contains(&(name, account.as_str()));
                users.push(v1::UserAssocInfo {
                    user: name.to_owned(),
                    account,
                    shares: tree.shares(idx),
                    is_default,
                });
            }
        }
    }
    v1::ListAssociationsResponse {
        cluster_name: cfg.cluster_name.clone(),
        accounts,
        users,
    }
}

/// `sacctmgr show qos`.
pub fn qos_list(st: &State) -> v1::ListQosResponse {
    let qos = st
        .config()
        .qos
        .iter()
        .map(|q| v1::QosInfo {
            name: q.name.clone(),
            priority: q.priority,
            preempt: q.preempt.clone(),
            preempt_mode: match q.preempt_mode {
                PreemptMode::Requeue => "requeue",
                PreemptMode::Cancel => "cancel",
            }
            .to_owned(),
            grace_time_s: q.grace_time_s,
            limits: Some(v1::QosLimits {
                max_jobs_per_user: q.limits.max_jobs_per_user,
                max_submit_per_user: q.limits.max_submit_per_user,
                max_jobs_per_account: q.limits.max_jobs_per_account,
                max_submit_per_account: q.limits.max_submit_per_account,
                max_gpus_per_user: q.limits.max_gpus_per_user,
                max_wall_s: q.limits.max_wall,
            }),
        })
        .collect();
    v1::ListQosResponse { qos }
}

/// `sshare -a -l`: every association with the numbers the last pass ranked by (usage is
/// charged at the start of each pass).
pub fn shares(st: &State) -> v1::ListSharesResponse {
    let table = st.assoc().compute();
    let rows = sshare_rows(st.assoc(), &table);
    let total = rows.first().map_or(0.0, |r| r.share.raw_usage);
    let rows = rows
        .into_iter()
        .map(|r| v1::ShareRow {
            depth: r.depth as u32,
            account: r.account,
            user: r.user.unwrap_or_default(),
            raw_shares: r.share.raw_shares,
            norm_shares: r.share.norm_shares,
            raw_usage: r.share.raw_usage,
            norm_usage: if total > 0.0 {
                r.share.raw_usage / total
            } else {
                0.0
            },
            effective_usage: r.share.effective_usage,
            level_fs: r.share.level_fs,
            fairshare: r.share.fairshare,
        })
        .collect();
    v1::ListSharesResponse { rows }
}

/// `sprio`: the factors of every pending job that is not held, at `now`.
pub fn priorities(
    st: &State,
    req: &v1::ListPrioritiesRequest,
    now: i64,
) -> v1::ListPrioritiesResponse {
    let cfg = &st.config().priority;
    let w = cfg.weights;
    let mut ranking = Ranking::new(st, now);
    // Sets first: the filters are checked once per pending job.
    let ids: HashSet<u64> = req.jobs.iter().copied().collect();
    let users: HashSet<&str> = req.users.iter().map(String::as_str).collect();
    let task_set: HashSet<(u64, u32)> = req
        .tasks
        .iter()
        .map(|t| (t.array_job_id, t.task_id))
        .collect();
    let mut tasks: HashMap<u64, Vec<u32>> = HashMap::new();
    for &(array, task) in &task_set {
        tasks.entry(array).or_default().push(task);
    }
    for v in tasks.values_mut() {
        v.sort_unstable();
    }
    let any_job = ids.is_empty() && tasks.is_empty();
    let mut rows = Vec::new();
    for job in st.unheld_pending_jobs() {
        if job.state != JobState::Pending {
            continue;
        }
        // Slurm's sprio leaves out jobs not yet eligible: a dependency or a begin time to
        // wait for (their priority still shows in squeue).
        if matches!(
            job.reason,
            Reason::Dependency | Reason::DependencyNeverSatisfied | Reason::BeginTime
        ) {
            continue;
        }
        if !users.is_empty() && !users.contains(job.spec.user.as_str()) {
            continue;
        }
        let id = job.id.0;
        let array_id = job.array_job_id.map(|a| a.0);
        let whole = match (&job.array, array_id, job.array_task_id) {
            (Some(a), _, _) => format!("{id}_[{}]", a.pending),
            (None, Some(meta), Some(task)) => format!("{meta}_{task}"),
            _ => id.to_string(),
        };
        let displays: Vec<String> =
            if any_job || ids.contains(&id) || array_id.is_some_and(|a| ids.contains(&a)) {
                vec![whole]
            } else if let Some(a) = &job.array {
                // The array's unstarted tasks share this one record: a row per task asked for.
                tasks
                    .get(&id)
                    .into_iter()
                    .flatten()
                    .filter(|t| a.pending.contains(**t))
                    .map(|t| format!("{id}_{t}"))
                    .collect()
            } else {
                match (array_id, job.array_task_id) {
                    (Some(meta), Some(task)) if task_set.contains(&(meta, task)) => {
                        vec![whole]
                    }
                    _ => Vec::new(),
                }
            };
        if displays.is_empty() {
            continue;
        }
        let b = ranking.breakdown(job);
        let f = b.factors;
        for display_id in displays {
            rows.push(v1::PriorityRow {
                job_id: id,
                display_id,
                partition: job.spec.partition.clone(),
                user: job.spec.user.clone(),
                account: job.spec.account.clone(),
                qos: job.spec.qos.clone(),
                priority: job.spec.priority.unwrap_or(u64::from(b.total)),
                normalized: Some(v1::PriorityFactors {
                    age: f.age,
                    fairshare: f.fairshare,
                    job_size: f.job_size,
                    partition: f.partition,
                    qos: f.qos,
                    tres_cpu: f.tres_cpu,
                    tres_mem: f.tres_mem,
                    tres_gpu: f.tres_gpu,
                }),
                weighted: Some(v1::PriorityFactors {
                    age: b.age,
                    fairshare: b.fairshare,
                    job_size: b.job_size,
                    partition: b.partition,
                    qos: b.qos,
                    tres_cpu: f64::from(w.tres_cpu) * f.tres_cpu,
                    tres_mem: f64::from(w.tres_mem) * f.tres_mem,
                    tres_gpu: f64::from(w.tres_gpu) * f.tres_gpu,
                }),
                nice: b.nice,
                fixed: job.spec.priority.is_some(),
            });
        }
    }
    v1::ListPrioritiesResponse {
        weights: Some(v1::PriorityWeights {
            age: w.age,
            fairshare: w.fairshare,
            job_size: w.job_size,
            partition: w.partition,
            qos: w.qos,
            tres_cpu: w.tres_cpu,
            tres_mem: w.tres_mem,
            tres_gpu: w.tres_gpu,
        }),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use tandem_sched::job::JobSpec;

    use super::*;

    fn cluster() -> State {
        State::test_cluster(1, 4, 8_000, 0)
    }

    fn ids(resp: &v1::ListPrioritiesResponse) -> Vec<String> {
        let mut v: Vec<String> = resp.rows.iter().map(|r| r.display_id.clone()).collect();
        v.sort();
        v
    }

    fn task(array_job_id: u64, task_id: u32) -> v1::ArrayTaskRef {
        v1::ArrayTaskRef {
            array_job_id,
            task_id,
        }
    }

    #[test]
    fn sprio_filters_by_job_user_and_single_array_task() {
        let mut st = cluster();
        let one = st.submit(JobSpec::test(), 0).unwrap().0;
        let bobs = st.submit(JobSpec::test().user("bob"), 0).unwrap().0;
        let arr = st.submit(JobSpec::test().array("0-5"), 0).unwrap().0;
        let ask = |req: v1::ListPrioritiesRequest| ids(&priorities(&st, &req, 10));
        assert_eq!(ask(Default::default()).len(), 3);
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                users: vec!["bob".into()],
                ..Default::default()
            }),
            [bobs.to_string()]
        );
        // The whole array by its id; one task (asked twice) by `id_task`; a task the
        // array does not have matches nothing.
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                jobs: vec![arr],
                ..Default::default()
            }),
            [format!("{arr}_[0-5]")]
        );
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                tasks: vec![task(arr, 3), task(arr, 9), task(arr, 3)],
                ..Default::default()
            }),
            [format!("{arr}_3")]
        );
        assert_eq!(
            ask(v1::ListPrioritiesRequest {
                jobs: vec![one],
                tasks: vec![task(arr, 1), task(one, 1)],
                ..Default::default()
            }),
            [one.to_string(), format!("{arr}_1")]
        );
        // Filters combine with AND: bob has no array task.
        assert!(
            ask(v1::ListPrioritiesRequest {
                users: vec!["bob".into()],
                tasks: vec![task(arr, 1)],
                ..Default::default()
            })
            .is_empty()
        );
    }

    /// Slurm 22.05: `sprio -j` of a job waiting for a dependency or a begin time, or held,
    /// says "Unable to find jobs matching user/id(s) specified"; squeue shows its priority.
    #[test]
    fn sprio_leaves_out_jobs_not_yet_eligible() {
        let mut st = cluster();
        let running = st.submit(JobSpec::test().cpus_per_task(4), 0).unwrap();
        let waits = st.submit(JobSpec::test(), 0).unwrap();
        let after = st
            .submit(
                JobSpec::test().dependency(&format!("afterok:{}", running.0)),
                0,
            )
            .unwrap();
        let later = st.submit(JobSpec::test().begin(3_600), 0).unwrap();
        st.submit(JobSpec::test().held(), 0).unwrap();
        st.schedule(1);
        let job = |id| st.job(id).unwrap();
        assert_eq!(job(after).reason, Reason::Dependency);
        assert_eq!(job(later).reason, Reason::BeginTime);
        assert!(job(after).priority > 0 && job(later).priority > 0);
        assert_eq!(
            ids(&priorities(&st, &Default::default(), 10)),
            [waits.0.to_string()]
        );
    }

    #[test]
    fn associations_keep_settings_and_default_accounts() {
        let mut st = cluster();
        let mut acct = AccountConfig::new("phys", 3);
        acct.description = "physics".into();
        st.add_account(acct).unwrap();
        st.add_account(AccountConfig {
            parent: Some("phys".into()),
            ..AccountConfig::new("astro", 1)
        })
        .unwrap();
        for (account, default) in [("phys", false), ("astro", true)] {
            st.add_user(UserConfig {
                user: "alice".into(),
                account: account.into(),
                shares: 1,
                default,
            })
            .unwrap();
        }
        let resp = associations(&st);
        let phys = resp.accounts.iter().find(|a| a.name == "phys").unwrap();
        assert_eq!((phys.shares, phys.description.as_str()), (3, "physics"));
        let astro = resp.accounts.iter().find(|a| a.name == "astro").unwrap();
        assert_eq!(astro.parent, "phys");
        let mut defaults: Vec<(&str, bool)> = resp
            .users
            .iter()
            .map(|u| (u.account.as_str(), u.is_default))
            .collect();
        defaults.sort();
        assert_eq!(defaults, [("astro", true), ("phys", false)]);
    }

    fn add_account(names: &[&str], s: v1::AccountChanges) -> Change {
        Change::AddAccount(v1::AddAccountRequest {
            names: names.iter().map(|n| n.to_string()).collect(),
            settings: Some(s),
            ..Default::default()
        })
    }

    /// Refused before anything is applied, so even without the actor's rollback the
    /// configuration is untouched.
    #[track_caller]
    fn refused(st: &mut State, change: Change, says: &str) {
        let before = st.config().clone();
        let err = apply(st, change).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(says), "{:?}", err.message());
        assert!(!err.message().contains('\n'));
        assert_eq!(st.config().accounts, before.accounts);
        assert_eq!(st.config().users, before.users);
        assert_eq!(st.config().qos, before.qos);
    }

    #[test]
    fn bad_names_texts_and_huge_lists_are_refused_up_front() {
        let mut st = cluster();
        let none = v1::AccountChanges::default;
        for bad in ["a|b", "a:b", "a,b", "a\u{1b}b"] {
            refused(&mut st, add_account(&["ok", bad], none()), "invalid name");
        }
        let long = "x".repeat(65);
        refused(
            &mut st,
            add_account(&[&long], none()),
            "longer than 64 bytes",
        );
        let text = "d".repeat(MAX_TEXT_LEN + 1);
        refused(
            &mut st,
            add_account(
                &["ok"],
                v1::AccountChanges {
                    description: Some(text.clone()),
                    ..Default::default()
                },
            ),
            "Description is longer than 256 bytes",
        );
        refused(
            &mut st,
            add_account(
                &["ok"],
                v1::AccountChanges {
                    organization: Some(text),
                    ..Default::default()
                },
            ),
            "Organization is longer than 256 bytes",
        );
        let many: Vec<String> = (0..=MAX_LIST_ITEMS).map(|i| format!("a{i}")).collect();
        let many_refs: Vec<&str> = many.iter().map(String::as_str).collect();
        refused(&mut st, add_account(&many_refs, none()), "too many");
        st.add_account(AccountConfig::new("phys", 1)).unwrap();
        let user = |users: &[&str], accounts: &[&str], default: &str| {
            Change::AddUser(v1::AddUserRequest {
                users: users.iter().map(|n| n.to_string()).collect(),
                accounts: accounts.iter().map(|n| n.to_string()).collect(),
                default_account: default.into(),
                ..Default::default()
            })
        };
        refused(&mut st, user(&["u:x"], &["phys"], ""), "invalid name");
        refused(&mut st, user(&["u"], &["ph|ys"], ""), "invalid name");
        refused(&mut st, user(&["u"], &["phys"], "p,x"), "invalid name");
        refused(
            &mut st,
            user(&many_refs, &["phys"], ""),
            "too many user names",
        );
        refused(
            &mut st,
            Change::DeleteUser(v1::DeleteUserRequest {
                users: vec!["u".into()],
                accounts: many.clone(),
            }),
            "too many accounts",
        );
        refused(
            &mut st,
            Change::AddQos(v1::AddQosRequest {
                names: vec!["q|1".into()],
                ..Default::default()
            }),
            "invalid name",
        );
        // At the limits, accepted.
        let at_limit = v1::AccountChanges {
            description: Some("d".repeat(MAX_TEXT_LEN)),
            ..Default::default()
        };
        apply(&mut st, add_account(&[&"x".repeat(64)], at_limit)).unwrap();
        apply(&mut st, user(&["u"], &["phys"], "phys")).unwrap();
    }
}
