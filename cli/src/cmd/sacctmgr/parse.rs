//! sacctmgr's words, parsed and checked without a cluster: `Action Entity [names] [where
//! KEY=VALUE...] [set KEY=VALUE...]` into [`Words`], then add/modify/delete into the request
//! to send ([`change_request`]). Slurm's spellings of keys and their abbreviations are
//! accepted (`Key::parse`); limits take `-1` to clear.

use anyhow::{Context as _, bail};
use tandem_proto::v1;

use crate::format::columns::MAX_WIDTH;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Add,
    Modify,
    Delete,
    Show,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entity {
    Account,
    User,
    Assoc,
    Qos,
}

/// One sacctmgr command line, split but not yet interpreted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Words {
    pub action: Action,
    pub entity: Entity,
    /// Bare names and `Name(s)=` values.
    pub names: Vec<String>,
    /// `where` conditions (and, for add, the settings): canonical key, value.
    pub conds: Vec<(Key, String)>,
    /// `set` settings (modify only).
    pub sets: Vec<(Key, String)>,
    /// `format=` fields of show, with an optional `%width`.
    pub format: Vec<(String, Option<usize>)>,
}

/// The keys Tandem understands, with Slurm's spellings in `Key::parse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Name,
    Account,
    User,
    Cluster,
    Parent,
    Fairshare,
    GrpTres,
    GrpJobs,
    MaxJobs,
    Description,
    Organization,
    DefaultAccount,
    Priority,
    Preempt,
    PreemptMode,
    GraceTime,
    MaxJobsPerUser,
    MaxSubmitPerUser,
    MaxJobsPerAccount,
    MaxSubmitPerAccount,
    MaxTresPerUser,
    MaxWall,
}

impl Key {
    fn parse(k: &str) -> Option<Key> {
        Some(match k.to_ascii_lowercase().as_str() {
            "name" | "names" => Key::Name,
            "account" | "accounts" | "acct" => Key::Account,
            "user" | "users" => Key::User,
            "cluster" | "clusters" => Key::Cluster,
            "parent" => Key::Parent,
            "fairshare" | "share" | "shares" => Key::Fairshare,
            "grptres" => Key::GrpTres,
            "grpjobs" => Key::GrpJobs,
            "maxjobs" => Key::MaxJobs,
            "description" | "descr" => Key::Description,
            "organization" | "org" => Key::Organization,
            "defaultaccount" | "defaccount" | "defacct" => Key::DefaultAccount,
            "priority" => Key::Priority,
            "preempt" => Key::Preempt,
            "preemptmode" => Key::PreemptMode,
            "gracetime" => Key::GraceTime,
            "maxjobsperuser" | "maxjobspu" => Key::MaxJobsPerUser,
            "maxsubmitjobsperuser" | "maxsubmitpu" | "maxsubmitjobspu" => Key::MaxSubmitPerUser,
            "maxjobsperaccount" | "maxjobspa" => Key::MaxJobsPerAccount,
            "maxsubmitjobsperaccount" | "maxsubmitpa" | "maxsubmitjobspa" => {
                Key::MaxSubmitPerAccount
            }
            "maxtresperuser" | "maxtrespu" => Key::MaxTresPerUser,
            "maxwall" | "maxwalldurationperjob" => Key::MaxWall,
            _ => return None,
        })
    }

    /// Slurm's spelling, for messages.
    fn name(self) -> &'static str {
        match self {
            Key::Name => "Name",
            Key::Account => "Account",
            Key::User => "User",
            Key::Cluster => "Cluster",
            Key::Parent => "Parent",
            Key::Fairshare => "Fairshare",
            Key::GrpTres => "GrpTRES",
            Key::GrpJobs => "GrpJobs",
            Key::MaxJobs => "MaxJobs",
            Key::Description => "Description",
            Key::Organization => "Organization",
            Key::DefaultAccount => "DefaultAccount",
            Key::Priority => "Priority",
            Key::Preempt => "Preempt",
            Key::PreemptMode => "PreemptMode",
            Key::GraceTime => "GraceTime",
            Key::MaxJobsPerUser => "MaxJobsPerUser",
            Key::MaxSubmitPerUser => "MaxSubmitJobsPerUser",
            Key::MaxJobsPerAccount => "MaxJobsPerAccount",
            Key::MaxSubmitPerAccount => "MaxSubmitJobsPerAccount",
            Key::MaxTresPerUser => "MaxTRESPerUser",
            Key::MaxWall => "MaxWall",
        }
    }
}

fn action(w: &str) -> Option<Action> {
    Some(match w.to_ascii_lowercase().as_str() {
        "add" | "create" => Action::Add,
        "modify" | "update" => Action::Modify,
        "delete" | "remove" => Action::Delete,
        "show" | "list" => Action::Show,
        _ => return None,
    })
}

fn entity(w: &str) -> Option<Entity> {
    Some(match w.to_ascii_lowercase().as_str() {
        "account" | "accounts" => Entity::Account,
        "user" | "users" => Entity::User,
        "assoc" | "assocs" | "association" | "associations" => Entity::Assoc,
        "qos" => Entity::Qos,
        _ => return None,
    })
}

/// Splits a command line into action, entity, names, conditions and settings.
pub fn parse(words: &[String]) -> anyhow::Result<Words> {
    let mut it = words.iter();
    let Some(a) = it.next() else {
        bail!("no command given (add, modify, delete or show)");
    };
    let action = action(a).with_context(|| {
        format!("unknown command {a:?} (Tandem's sacctmgr knows add, modify, delete, show)")
    })?;
    let Some(e) = it.next() else {
        bail!("{a}: no entity given (account, user, assoc or qos)");
    };
    let entity = entity(e).with_context(|| {
        format!("unknown entity {e:?} (Tandem's sacctmgr knows account, user, assoc, qos)")
    })?;
    if entity == Entity::Assoc && action != Action::Show {
        bail!("associations are changed through users: sacctmgr {a} user ...");
    }
    let mut out = Words {
        action,
        entity,
        names: Vec::new(),
        conds: Vec::new(),
        sets: Vec::new(),
        format: Vec::new(),
    };
    let mut in_set = false;
    for w in it {
        if w.eq_ignore_ascii_case("where") {
            if in_set {
                bail!("'where' after 'set'");
            }
            continue;
        }
        if w.eq_ignore_ascii_case("set") {
            if action != Action::Modify {
                bail!("'set' is for modify");
            }
            in_set = true;
            continue;
        }
        let Some((k, v)) = w.split_once('=') else {
            if in_set {
                bail!("{w:?} after 'set' is not KEY=VALUE");
            }
            out.names.extend(split_list(w));
            continue;
        };
        if k.ends_with('+') || k.ends_with('-') {
            bail!("{k}=: adding to or removing from a list is not supported; set the whole list");
        }
        if action == Action::Show && k.eq_ignore_ascii_case("format") {
            for f in split_list(v) {
                let (name, width) = match f.split_once('%') {
                    Some((n, w)) => {
                        let width = w
                            .parse::<usize>()
                            .ok()
                            .filter(|w| *w <= MAX_WIDTH)
                            .with_context(|| {
                                format!("format field {f:?}: width must be 0 to {MAX_WIDTH}")
                            })?;
                        (n.to_owned(), Some(width))
                    }
                    None => (f, None),
                };
                out.format.push((name, width));
            }
            continue;
        }
        let key = Key::parse(k).with_context(|| format!("unknown field {k:?}"))?;
        if key == Key::Name && !in_set {
            out.names.extend(split_list(v));
        } else if in_set {
            out.sets.push((key, v.to_owned()));
        } else {
            out.conds.push((key, v.to_owned()));
        }
    }
    if action == Action::Modify && out.sets.is_empty() {
        bail!("modify needs 'set KEY=VALUE'");
    }
    Ok(out)
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn int(key: Key, v: &str) -> anyhow::Result<i64> {
    v.trim()
        .parse::<i64>()
        .with_context(|| format!("{}: {v:?} is not a number", key.name()))
}

/// `gres/gpu=N` out of a TRES list (`-1` clears); other TRES are not tracked by Tandem.
fn gpu_tres(key: Key, v: &str) -> anyhow::Result<i64> {
    let mut gpus = None;
    for item in split_list(v) {
        let Some((t, n)) = item.split_once('=') else {
            bail!("{}: {item:?} is not TRES=COUNT", key.name());
        };
        if !t.eq_ignore_ascii_case("gres/gpu") {
            bail!(
                "{}: TRES {t:?} is not supported (Tandem limits gres/gpu)",
                key.name()
            );
        }
        gpus = Some(int(key, n)?);
    }
    gpus.with_context(|| format!("{}: no gres/gpu=N given", key.name()))
}

fn seconds(key: Key, v: &str) -> anyhow::Result<i64> {
    if v.trim() == "-1" {
        return Ok(-1);
    }
    let d = tandem_sched::time::parse_duration(v).with_context(|| key.name())?;
    Ok(d.map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX)))
}

pub(super) fn only(
    w: &Words,
    allowed: &[Key],
    what: &str,
    list: &[(Key, String)],
) -> anyhow::Result<()> {
    for (k, _) in list {
        if !allowed.contains(k) {
            bail!(
                "{} cannot be {what} for {}",
                k.name(),
                match w.entity {
                    Entity::Account => "an account",
                    Entity::User => "a user",
                    Entity::Assoc => "an association",
                    Entity::Qos => "a QOS",
                }
            );
        }
    }
    Ok(())
}

pub(super) fn values(list: &[(Key, String)], key: Key) -> Vec<String> {
    list.iter()
        .filter(|(k, _)| *k == key)
        .flat_map(|(_, v)| split_list(v))
        .collect()
}

fn last(list: &[(Key, String)], key: Key) -> Option<&str> {
    list.iter()
        .rev()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
}

const ACCOUNT_SETTINGS: &[Key] = &[
    Key::Fairshare,
    Key::GrpTres,
    Key::GrpJobs,
    Key::MaxJobs,
    Key::Description,
    Key::Organization,
];

fn account_changes(list: &[(Key, String)]) -> anyhow::Result<v1::AccountChanges> {
    let mut c = v1::AccountChanges::default();
    for (k, v) in list {
        match k {
            Key::Fairshare => c.shares = Some(int(*k, v)?),
            Key::GrpTres => c.grp_gpus = Some(gpu_tres(*k, v)?),
            Key::GrpJobs => c.grp_jobs = Some(int(*k, v)?),
            Key::MaxJobs => c.max_jobs_per_user = Some(int(*k, v)?),
            Key::Description => c.description = Some(v.clone()),
            Key::Organization => c.organization = Some(v.clone()),
            _ => {}
        }
    }
    Ok(c)
}

const QOS_SETTINGS: &[Key] = &[
    Key::Priority,
    Key::Preempt,
    Key::PreemptMode,
    Key::GraceTime,
    Key::MaxJobsPerUser,
    Key::MaxSubmitPerUser,
    Key::MaxJobsPerAccount,
    Key::MaxSubmitPerAccount,
    Key::MaxTresPerUser,
    Key::MaxWall,
];

fn qos_changes(list: &[(Key, String)]) -> anyhow::Result<v1::QosChanges> {
    let mut c = v1::QosChanges::default();
    for (k, v) in list {
        match k {
            Key::Priority => c.priority = Some(int(*k, v)?),
            Key::Preempt => {
                c.preempt = Some(v1::StringList {
                    values: split_list(v.trim_matches(|c| c == '\'' || c == '"')),
                });
            }
            Key::PreemptMode => c.preempt_mode = Some(v.clone()),
            Key::GraceTime => {
                c.grace_time_s = Some(match v.trim().parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => seconds(*k, v)?,
                });
            }
            Key::MaxJobsPerUser => c.max_jobs_per_user = Some(int(*k, v)?),
            Key::MaxSubmitPerUser => c.max_submit_per_user = Some(int(*k, v)?),
            Key::MaxJobsPerAccount => c.max_jobs_per_account = Some(int(*k, v)?),
            Key::MaxSubmitPerAccount => c.max_submit_per_account = Some(int(*k, v)?),
            Key::MaxTresPerUser => c.max_gpus_per_user = Some(gpu_tres(*k, v)?),
            Key::MaxWall => c.max_wall_s = Some(seconds(*k, v)?),
            _ => {}
        }
    }
    Ok(c)
}

/// A change request ready to send.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeRequest {
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

/// The users a `modify user` or `delete user` names, by name or `User=` condition, after
/// checking its conditions.
fn selected_users(w: &Words) -> anyhow::Result<Vec<String>> {
    let mut users = w.names.clone();
    users.extend(values(&w.conds, Key::User));
    if users.is_empty() {
        bail!("no user name given");
    }
    only(
        w,
        &[Key::Account, Key::User, Key::Cluster],
        "a condition",
        &w.conds,
    )?;
    Ok(users)
}

/// A user's settings (`Fairshare=`) from `pairs`.
fn user_changes(pairs: &[(Key, String)]) -> anyhow::Result<v1::UserChanges> {
    let shares = last(pairs, Key::Fairshare)
        .map(|v| int(Key::Fairshare, v))
        .transpose()?;
    Ok(v1::UserChanges { shares })
}

/// Turns parsed words of add/modify/delete into a request; every value is checked here.
pub fn change_request(w: &Words) -> anyhow::Result<ChangeRequest> {
    let names = w.names.clone();
    let need_names = |what: &str| -> anyhow::Result<()> {
        if names.is_empty() {
            bail!("no {what} name given");
        }
        Ok(())
    };
    Ok(match (w.action, w.entity) {
        (Action::Add, Entity::Account) => {
            need_names("account")?;
            let mut allowed = ACCOUNT_SETTINGS.to_vec();
            allowed.extend([Key::Parent, Key::Cluster]);
            only(w, &allowed, "set", &w.conds)?;
            ChangeRequest::AddAccount(v1::AddAccountRequest {
                names,
                parent: last(&w.conds, Key::Parent).unwrap_or_default().to_owned(),
                settings: Some(account_changes(&w.conds)?),
            })
        }
        (Action::Modify, Entity::Account) => {
            need_names("account")?;
            only(w, &[Key::Cluster], "a condition", &w.conds)?;
            if w.sets.iter().any(|(k, _)| *k == Key::Parent) {
                bail!("Parent cannot be changed: delete and re-add the account");
            }
            only(w, ACCOUNT_SETTINGS, "set", &w.sets)?;
            ChangeRequest::ModifyAccount(v1::ModifyAccountRequest {
                names,
                settings: Some(account_changes(&w.sets)?),
            })
        }
        (Action::Delete, Entity::Account) => {
            need_names("account")?;
            only(w, &[Key::Cluster], "a condition", &w.conds)?;
            ChangeRequest::DeleteAccount(v1::DeleteAccountRequest { names })
        }
        (Action::Add, Entity::User) => {
            need_names("user")?;
            only(
                w,
                &[
                    Key::Account,
                    Key::DefaultAccount,
                    Key::Fairshare,
                    Key::Cluster,
                ],
                "set",
                &w.conds,
            )?;
            let accounts = values(&w.conds, Key::Account);
            let default_account = last(&w.conds, Key::DefaultAccount)
                .unwrap_or_default()
                .to_owned();
            if accounts.is_empty() && default_account.is_empty() {
                bail!("no account given: add user NAME Account=ACCOUNT");
            }
            ChangeRequest::AddUser(v1::AddUserRequest {
                users: names,
                accounts,
                settings: Some(user_changes(&w.conds)?),
                default_account,
            })
        }
        (Action::Modify, Entity::User) => {
            let users = selected_users(w)?;
            only(w, &[Key::Fairshare, Key::DefaultAccount], "set", &w.sets)?;
            ChangeRequest::ModifyUser(v1::ModifyUserRequest {
                users,
                accounts: values(&w.conds, Key::Account),
                settings: Some(user_changes(&w.sets)?),
                default_account: last(&w.sets, Key::DefaultAccount)
                    .unwrap_or_default()
                    .to_owned(),
            })
        }
        (Action::Delete, Entity::User) => {
            let users = selected_users(w)?;
            ChangeRequest::DeleteUser(v1::DeleteUserRequest {
                users,
                accounts: values(&w.conds, Key::Account),
            })
        }
        (Action::Add, Entity::Qos) => {
            need_names("QOS")?;
            only(w, QOS_SETTINGS, "set", &w.conds)?;
            ChangeRequest::AddQos(v1::AddQosRequest {
                names,
                settings: Some(qos_changes(&w.conds)?),
            })
        }
        (Action::Modify, Entity::Qos) => {
            need_names("QOS")?;
            only(w, &[], "a condition", &w.conds)?;
            only(w, QOS_SETTINGS, "set", &w.sets)?;
            ChangeRequest::ModifyQos(v1::ModifyQosRequest {
                names,
                settings: Some(qos_changes(&w.sets)?),
            })
        }
        (Action::Delete, Entity::Qos) => {
            need_names("QOS")?;
            only(w, &[], "a condition", &w.conds)?;
            ChangeRequest::DeleteQos(v1::DeleteQosRequest { names })
        }
        (Action::Show, _) | (_, Entity::Assoc) => bail!("not a change"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn req(s: &str) -> anyhow::Result<ChangeRequest> {
        change_request(&parse(&words(s))?)
    }

    #[test]
    fn add_account_takes_parent_shares_and_gpu_limits() {
        let r = req(
            "add account physics,chem Parent=science Fairshare=60 GrpTRES=gres/gpu=16 GrpJobs=-1",
        )
        .unwrap();
        let ChangeRequest::AddAccount(a) = r else {
            panic!("{r:?}")
        };
        assert_eq!(a.names, ["physics", "chem"]);
        assert_eq!(a.parent, "science");
        let s = a.settings.unwrap();
        assert_eq!(
            (s.shares, s.grp_gpus, s.grp_jobs),
            (Some(60), Some(16), Some(-1))
        );
    }

    #[test]
    fn modify_splits_where_and_set() {
        let r = req("modify user where name=alice account=physics set fairshare=5").unwrap();
        assert_eq!(
            r,
            ChangeRequest::ModifyUser(v1::ModifyUserRequest {
                users: vec!["alice".into()],
                accounts: vec!["physics".into()],
                settings: Some(v1::UserChanges { shares: Some(5) }),
                default_account: String::new(),
            })
        );
        let r =
            req("update qos high set MaxWall=1-00:00:00 Preempt=normal,low MaxTRESPU=gres/gpu=4")
                .unwrap();
        let ChangeRequest::ModifyQos(q) = r else {
            panic!("{r:?}")
        };
        let s = q.settings.unwrap();
        assert_eq!(s.max_wall_s, Some(86_400));
        assert_eq!(s.preempt.unwrap().values, ["normal", "low"]);
        assert_eq!(s.max_gpus_per_user, Some(4));
    }

    #[test]
    fn delete_user_takes_names_and_user_conditions_alike() {
        let r = req("delete user bob where user=carol account=physics").unwrap();
        assert_eq!(
            r,
            ChangeRequest::DeleteUser(v1::DeleteUserRequest {
                users: vec!["bob".into(), "carol".into()],
                accounts: vec!["physics".into()],
            })
        );
        let err = req("delete user where account=physics").unwrap_err();
        assert!(err.to_string().contains("no user name given"), "{err}");
        let err = req("delete user bob where parent=science").unwrap_err();
        assert!(
            err.to_string().contains("cannot be a condition for a user"),
            "{err}"
        );
    }

    #[test]
    fn negative_shares_reach_the_controller_to_be_refused_by_name() {
        // The CLI passes the number on; the controller names the problem (one place).
        let ChangeRequest::AddAccount(a) = req("add account x fairshare=-3").unwrap() else {
            panic!()
        };
        assert_eq!(a.settings.unwrap().shares, Some(-3));
    }

    #[test]
    fn bad_words_are_errors_before_any_rpc() {
        let cases = [
            ("", "no command"),
            ("frobnicate account x", "unknown command"),
            ("add thing x", "unknown entity"),
            ("add account", "no account name"),
            ("add account x Bogus=1", "unknown field"),
            ("add account x Fairshare=lots", "not a number"),
            ("add account x GrpTRES=cpu=4", "not supported"),
            ("add user alice", "no account given"),
            ("modify account x", "needs 'set"),
            ("modify account x set parent=y", "Parent cannot be changed"),
            ("modify qos high set Preempt+=low", "not supported"),
            ("add account x set fairshare=1", "'set' is for modify"),
            ("add qos q MaxWall=forever", "MaxWall"),
            ("modify assoc x set fairshare=1", "through users"),
        ];
        for (line, want) in cases {
            let err = parse(&words(line))
                .and_then(|w| change_request(&w))
                .expect_err(line);
            assert!(
                format!("{err:#}").contains(want),
                "{line:?}: {err:#} should mention {want:?}"
            );
        }
    }

    #[test]
    fn format_widths_are_capped() {
        let w = |s: &str| parse(&words(s)).map(|r| r.format);
        assert_eq!(
            w("show account format=Account%1024,Descr").unwrap(),
            [
                ("Account".to_owned(), Some(1024)),
                ("Descr".to_owned(), None)
            ]
        );
        for bad in [
            "show account format=Account%1025",
            "show account format=Account%99999999999999",
            "show account format=Account%99999999999999999999999999",
            "show account format=Account%-1",
        ] {
            let err = format!("{:#}", w(bad).unwrap_err());
            assert!(err.contains("width must be 0 to 1024"), "{bad}: {err}");
        }
    }
}
