//! sacctmgr's changes: each request checked (names, texts, list lengths, limits) and applied
//! to `State` item by item. The handler sends [`apply`] to the state actor, which runs it
//! on the live state and rolls back whatever it applied if it fails (`state/accounting.rs`).
//! A pure function of the request and `State`, so its rules are tested without a controller.
use tandem_proto::v1;
use tandem_sched::State;
use tandem_sched::account::{AccountConfig, AssocLimits, UserConfig};
use tandem_sched::fairshare::ROOT_ACCOUNT;
use tandem_sched::job::PreemptMode;
use tandem_sched::qos::{Qos, QosLimits};
use tandem_sched::state::AdminError;
use tonic::Status;

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

/// Shares a new association gets when the request names none (Slurm's `Fairshare=1`).
const DEFAULT_SHARES: u32 = tandem_sched::fairshare::DEFAULT_SHARES;

/// Most entries in one list of a request (names, users, accounts, job ids). Every list is
/// walked on the state actor, which serves everything else meanwhile.
pub const MAX_LIST_ITEMS: usize = 10_000;

/// Longest description or organization, in bytes.
pub const MAX_TEXT_LEN: usize = 256;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> State {
        State::test_cluster(1, 4, 8_000, 0)
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
