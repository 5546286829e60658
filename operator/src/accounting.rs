//! Accounts, users and QOS from a `TandemCluster` spec -> Accounting RPCs, pure.
//!
//! Only what the spec names is created or changed, and only what the operator itself created
//! (listed in `status.managed`) is ever deleted: accounts, users and QOS made with
//! `sacctmgr` are left alone, as Slurm sites mix declarative and manual administration.

use std::collections::BTreeSet;

use tandem_proto::v1;

use crate::crd::cluster::{ManagedEntities, QosSpec, TandemClusterSpec};

/// One change, in the order to apply (parents before children, users after accounts,
/// deletions children first).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    AddQos(v1::AddQosRequest),
    ModifyQos(v1::ModifyQosRequest),
    AddAccount(v1::AddAccountRequest),
    ModifyAccount(v1::ModifyAccountRequest),
    AddUser(v1::AddUserRequest),
    ModifyUser(v1::ModifyUserRequest),
    DeleteUser(v1::DeleteUserRequest),
    DeleteAccount(v1::DeleteAccountRequest),
    DeleteQos(v1::DeleteQosRequest),
}

/// What the controller holds now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Current {
    pub accounts: Vec<v1::AccountInfo>,
    pub users: Vec<v1::UserAssocInfo>,
    pub qos: Vec<v1::QosInfo>,
}

fn opt(v: Option<u32>) -> Option<i64> {
    v.map(i64::from)
}

fn qos_changes(q: &QosSpec) -> v1::QosChanges {
    v1::QosChanges {
        priority: Some(i64::from(q.priority)),
        preempt: Some(v1::StringList {
            values: q.preempt.clone(),
        }),
        preempt_mode: q.preempt_mode.map(|m| {
            match m {
                crate::crd::cluster::PreemptModeSpec::Requeue => "requeue",
                crate::crd::cluster::PreemptModeSpec::Cancel => "cancel",
            }
            .to_owned()
        }),
        grace_time_s: opt(q.grace_time_seconds),
        max_jobs_per_user: opt(q.max_jobs_per_user),
        max_submit_per_user: opt(q.max_submit_per_user),
        max_jobs_per_account: opt(q.max_jobs_per_account),
        max_submit_per_account: opt(q.max_submit_per_account),
        max_gpus_per_user: opt(q.max_gpus_per_user),
        max_wall_s: q
            .max_wall
            .as_deref()
            .and_then(|s| tandem_sched::time::parse_duration(s).ok().flatten())
            .and_then(|s| i64::try_from(s).ok()),
    }
}

fn qos_matches(want: &QosSpec, have: &v1::QosInfo) -> bool {
    let c = qos_changes(want);
    let l = have.limits.unwrap_or_default();
    let u = |x: Option<u32>| x.map(i64::from);
    c.priority == Some(i64::from(have.priority))
        && c.preempt.as_ref().map(|p| &p.values) == Some(&have.preempt)
        && c.preempt_mode.as_deref().unwrap_or("requeue") == have.preempt_mode
        && c.grace_time_s.unwrap_or(0) == i64::from(have.grace_time_s)
        && c.max_jobs_per_user == u(l.max_jobs_per_user)
        && c.max_submit_per_user == u(l.max_submit_per_user)
        && c.max_jobs_per_account == u(l.max_jobs_per_account)
        && c.max_submit_per_account == u(l.max_submit_per_account)
        && c.max_gpus_per_user == u(l.max_gpus_per_user)
        && c.max_wall_s == l.max_wall_s.and_then(|x| i64::try_from(x).ok())
}

/// The changes that make the controller match the spec, and what the operator manages
/// afterwards (to record in status once they are applied).
pub fn diff(
    spec: &TandemClusterSpec,
    current: &Current,
    managed: &ManagedEntities,
) -> (Vec<Change>, ManagedEntities) {
    let mut out = Vec::new();
    let mut now_managed = ManagedEntities::default();

    // QOS.
    for q in &spec.qos {
        now_managed.qos.push(q.name.clone());
        match current.qos.iter().find(|x| x.name == q.name) {
            None => out.push(Change::AddQos(v1::AddQosRequest {
                names: vec![q.name.clone()],
                settings: Some(qos_changes(q)),
            })),
            Some(have) if !qos_matches(q, have) => {
                out.push(Change::ModifyQos(v1::ModifyQosRequest {
                    names: vec![q.name.clone()],
                    settings: Some(qos_changes(q)),
                }))
            }
            Some(_) => {}
        }
    }

    // Accounts, parents first (the spec's order may list children first).
    let mut ordered = Vec::new();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    while ordered.len() < spec.accounts.len() {
        let before = ordered.len();
        for a in &spec.accounts {
            let parent = a
                .parent
                .as_deref()
                .filter(|p| !p.is_empty() && *p != "root");
            if !placed.contains(a.name.as_str())
                && parent.is_none_or(|p| {
                    placed.contains(p) || !spec.accounts.iter().any(|x| x.name == p)
                })
            {
                placed.insert(&a.name);
                ordered.push(a);
            }
        }
        if ordered.len() == before {
            break; // a cycle: validation reports it
        }
    }
    for a in ordered {
        now_managed.accounts.push(a.name.clone());
        let parent = a
            .parent
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "root".into());
        let settings = v1::AccountChanges {
            shares: Some(i64::from(a.shares)),
            grp_gpus: opt(a.grp_gpus),
            grp_jobs: opt(a.grp_jobs),
            max_jobs_per_user: opt(a.max_jobs_per_user),
            description: None,
            organization: None,
        };
        match current.accounts.iter().find(|x| x.name == a.name) {
            None => out.push(Change::AddAccount(v1::AddAccountRequest {
                names: vec![a.name.clone()],
                parent,
                settings: Some(settings),
            })),
            Some(have) => {
                let l = have.limits.unwrap_or_default();
                let same = have.shares == a.shares
                    && l.grp_gpus == a.grp_gpus
                    && l.grp_jobs == a.grp_jobs
                    && l.max_jobs_per_user == a.max_jobs_per_user;
                if !same {
                    out.push(Change::ModifyAccount(v1::ModifyAccountRequest {
                        names: vec![a.name.clone()],
                        settings: Some(settings),
                    }));
                }
            }
        }
        for u in &a.users {
            now_managed.users.push(format!("{}/{}", u.name, a.name));
            let have = current
                .users
                .iter()
                .find(|x| x.user == u.name && x.account == a.name);
            let default_account = if u.default {
                a.name.clone()
            } else {
                String::new()
            };
            match have {
                None => out.push(Change::AddUser(v1::AddUserRequest {
                    users: vec![u.name.clone()],
                    accounts: vec![a.name.clone()],
                    settings: Some(v1::UserChanges {
                        shares: Some(i64::from(u.shares)),
                    }),
                    default_account,
                })),
                Some(h) if h.shares != u.shares || (u.default && !h.is_default) => {
                    out.push(Change::ModifyUser(v1::ModifyUserRequest {
                        users: vec![u.name.clone()],
                        accounts: vec![a.name.clone()],
                        settings: Some(v1::UserChanges {
                            shares: Some(i64::from(u.shares)),
                        }),
                        default_account,
                    }))
                }
                Some(_) => {}
            }
        }
    }

    // Deletions: only what the operator made and the spec no longer names.
    for pair in &managed.users {
        if now_managed.users.contains(pair) {
            continue;
        }
        if let Some((user, account)) = pair.split_once('/')
            && current
                .users
                .iter()
                .any(|x| x.user == user && x.account == account)
        {
            out.push(Change::DeleteUser(v1::DeleteUserRequest {
                users: vec![user.to_owned()],
                accounts: vec![account.to_owned()],
            }));
        }
    }
    // Children before parents: deepest first.
    let depth = |name: &str| {
        let mut d = 0;
        let mut cur = current.accounts.iter().find(|x| x.name == name);
        while let Some(a) = cur {
            d += 1;
            if d > current.accounts.len() {
                break;
            }
            cur = current.accounts.iter().find(|x| x.name == a.parent);
        }
        d
    };
    let mut gone: Vec<&String> = managed
        .accounts
        .iter()
        .filter(|a| {
            !now_managed.accounts.contains(a) && current.accounts.iter().any(|x| &x.name == *a)
        })
        .collect();
    gone.sort_by_key(|a| std::cmp::Reverse(depth(a)));
    for a in gone {
        out.push(Change::DeleteAccount(v1::DeleteAccountRequest {
            names: vec![a.clone()],
        }));
    }
    for q in &managed.qos {
        if !now_managed.qos.contains(q) && current.qos.iter().any(|x| &x.name == q) {
            out.push(Change::DeleteQos(v1::DeleteQosRequest {
                names: vec![q.clone()],
            }));
        }
    }
    (out, now_managed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::cluster::{AccountSpec, UserSpec};

    fn acct(name: &str, parent: Option<&str>, shares: u32) -> AccountSpec {
        AccountSpec {
            name: name.into(),
            parent: parent.map(Into::into),
            shares,
            ..Default::default()
        }
    }
    fn have_acct(name: &str, parent: &str, shares: u32) -> v1::AccountInfo {
        v1::AccountInfo {
            name: name.into(),
            parent: parent.into(),
            shares,
            ..Default::default()
        }
    }

    #[test]
    fn new_entities_are_added_parents_first() {
        let mut child = acct("hep", Some("physics"), 2);
        child.users.push(UserSpec {
            name: "alice".into(),
            shares: 1,
            default: true,
        });
        let spec = TandemClusterSpec {
            accounts: vec![child, acct("physics", None, 70)],
            qos: vec![QosSpec {
                name: "high".into(),
                priority: 100,
                ..Default::default()
            }],
            ..Default::default()
        };
        let (changes, managed) = diff(&spec, &Current::default(), &ManagedEntities::default());
        let kinds: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::AddQos(r) => format!("qos {}", r.names[0]),
                Change::AddAccount(r) => format!("acct {} < {}", r.names[0], r.parent),
                Change::AddUser(r) => format!("user {}/{}", r.users[0], r.accounts[0]),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                "qos high",
                "acct physics < root",
                "acct hep < physics",
                "user alice/hep"
            ]
        );
        assert_eq!(managed.accounts, vec!["physics", "hep"]);
        assert_eq!(managed.users, vec!["alice/hep"]);
    }

    #[test]
    fn sacctmgr_made_entities_are_left_alone_and_only_changed_fields_modified() {
        let spec = TandemClusterSpec {
            accounts: vec![acct("physics", None, 70)],
            ..Default::default()
        };
        let current = Current {
            accounts: vec![
                have_acct("physics", "root", 50),
                have_acct("manual", "root", 1),
            ],
            users: vec![v1::UserAssocInfo {
                user: "bob".into(),
                account: "manual".into(),
                shares: 1,
                is_default: true,
            }],
            qos: vec![v1::QosInfo {
                name: "adhoc".into(),
                ..Default::default()
            }],
        };
        let managed = ManagedEntities {
            accounts: vec!["physics".into()],
            ..Default::default()
        };
        let (changes, _) = diff(&spec, &current, &managed);
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(matches!(&changes[0], Change::ModifyAccount(r) if r.names == ["physics"]));
    }

    #[test]
    fn entities_the_operator_made_and_the_spec_dropped_are_deleted_children_first() {
        let spec = TandemClusterSpec::default();
        let current = Current {
            accounts: vec![
                have_acct("physics", "root", 1),
                have_acct("hep", "physics", 1),
                have_acct("manual", "root", 1),
            ],
            users: vec![v1::UserAssocInfo {
                user: "alice".into(),
                account: "hep".into(),
                shares: 1,
                is_default: true,
            }],
            qos: vec![],
        };
        let managed = ManagedEntities {
            accounts: vec!["physics".into(), "hep".into()],
            users: vec!["alice/hep".into()],
            qos: vec![],
        };
        let (changes, now) = diff(&spec, &current, &managed);
        let order: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::DeleteUser(r) => format!("user {}", r.users[0]),
                Change::DeleteAccount(r) => format!("acct {}", r.names[0]),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            order,
            vec!["user alice", "acct hep", "acct physics"],
            "manual stays"
        );
        assert_eq!(now, ManagedEntities::default());
    }

    #[test]
    fn an_unchanged_spec_makes_no_change() {
        let spec = TandemClusterSpec {
            accounts: vec![acct("physics", None, 70)],
            ..Default::default()
        };
        let current = Current {
            accounts: vec![have_acct("physics", "root", 70)],
            ..Default::default()
        };
        assert!(
            diff(&spec, &current, &ManagedEntities::default())
                .0
                .is_empty()
        );
    }
}
