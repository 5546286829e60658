//! The accounting surface in-process: sacctmgr changes over gRPC (who may make them, what is
//! refused and then left unchanged, what survives a restart) and the sshare/sprio views.
//! CLI-level tests of the same commands are in `cli/tests/it/accounting.rs`.

use crate::support;

use support::{Controller, alice};
use tandem_controller::Config;
use tandem_net::auth::Identity;
use tandem_net::endpoint::AuthChannel;
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::{self};
use tandem_sched::account::{AccountConfig, UserConfig};
use tonic::Code;

fn root() -> Identity {
    Identity::user("root", 0, 0)
}

fn add_account(names: &[&str], parent: &str, shares: i64) -> v1::AddAccountRequest {
    v1::AddAccountRequest {
        names: names.iter().map(|s| (*s).to_owned()).collect(),
        parent: parent.into(),
        settings: Some(v1::AccountChanges {
            shares: Some(shares),
            ..Default::default()
        }),
    }
}

fn add_user(user: &str, account: &str, shares: i64) -> v1::AddUserRequest {
    v1::AddUserRequest {
        users: vec![user.into()],
        accounts: vec![account.into()],
        settings: Some(v1::UserChanges {
            shares: Some(shares),
        }),
        default_account: String::new(),
    }
}

async fn qos_list(c: &mut AccountingClient<AuthChannel>) -> v1::ListQosResponse {
    c.list_qos(v1::ListQosRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// A batch job that stays pending (these tests start no worker).
fn pending_job(name: &str, account: &str) -> v1::SubmitRequest {
    v1::SubmitRequest {
        spec: Some(v1::JobSpec {
            name: name.into(),
            script: "#!/bin/sh\ntrue\n".into(),
            workdir: "/tmp".into(),
            account: account.into(),
            ..Default::default()
        }),
    }
}

async fn assocs(c: &mut AccountingClient<AuthChannel>) -> v1::ListAssociationsResponse {
    c.list_associations(v1::ListAssociationsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// `account/user -> NormShares` from sshare's rows.
async fn norm_shares(c: &mut AccountingClient<AuthChannel>) -> Vec<(String, f64)> {
    c.list_shares(v1::ListSharesRequest {})
        .await
        .unwrap()
        .into_inner()
        .rows
        .into_iter()
        .map(|r| (format!("{}/{}", r.account, r.user), r.norm_shares))
        .collect()
}

fn share_of(rows: &[(String, f64)], key: &str) -> f64 {
    rows.iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no sshare row {key}: {rows:?}"))
        .1
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test]
async fn operators_change_the_tree_users_only_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut admin = ctl.acct(&root()).await;
    let mut user = ctl.acct(&alice()).await;

    let denied = user
        .add_account(add_account(&["physics"], "", 10))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(
        denied.message().contains("operator"),
        "{}",
        denied.message()
    );
    let denied = user
        .modify_qos(v1::ModifyQosRequest {
            names: vec!["normal".into()],
            settings: Some(v1::QosChanges {
                priority: Some(5),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    admin
        .add_account(add_account(&["physics"], "", 60))
        .await
        .unwrap();
    admin
        .add_account(add_account(&["chem"], "root", 40))
        .await
        .unwrap();
    admin
        .add_user(add_user("alice", "physics", 1))
        .await
        .unwrap();
    admin.add_user(add_user("bob", "physics", 3)).await.unwrap();

    // Users read everything.
    let tree = assocs(&mut user).await;
    let names: Vec<&str> = tree.accounts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["root", "physics", "chem"]);
    assert!(tree.users.iter().any(|u| u.user == "alice" && u.is_default));

    let rows = norm_shares(&mut user).await;
    assert!(close(share_of(&rows, "physics/"), 0.6));
    assert!(close(share_of(&rows, "chem/"), 0.4));
    assert!(close(share_of(&rows, "physics/alice"), 0.25));
    assert!(close(share_of(&rows, "physics/bob"), 0.75));

    admin
        .modify_account(v1::ModifyAccountRequest {
            names: vec!["chem".into()],
            settings: Some(v1::AccountChanges {
                shares: Some(140),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let rows = norm_shares(&mut user).await;
    assert!(close(share_of(&rows, "physics/"), 0.3));
    assert!(close(share_of(&rows, "chem/"), 0.7));
    ctl.stop().await;
}

#[tokio::test]
async fn bad_requests_are_refused_whole_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut admin = ctl.acct(&root()).await;
    admin
        .add_account(add_account(&["physics"], "", 60))
        .await
        .unwrap();
    admin
        .add_user(add_user("alice", "physics", 1))
        .await
        .unwrap();
    let before = assocs(&mut admin).await;
    let qos_before = qos_list(&mut admin).await;

    let mut bad_preempt = v1::AddQosRequest {
        names: vec!["high".into()],
        settings: Some(v1::QosChanges {
            preempt: Some(v1::StringList {
                values: vec!["ghost".into()],
            }),
            ..Default::default()
        }),
    };
    let errors = [
        (
            admin
                .add_account(add_account(&["bio"], "nope", 1))
                .await
                .unwrap_err(),
            "nope",
        ),
        (
            admin
                .add_account(add_account(&["bio"], "", -5))
                .await
                .unwrap_err(),
            "negative",
        ),
        // The first name is fine, the second exists: neither is added.
        (
            admin
                .add_account(add_account(&["bio", "physics"], "", 1))
                .await
                .unwrap_err(),
            "already exists",
        ),
        (
            admin
                .delete_account(v1::DeleteAccountRequest {
                    names: vec!["physics".into()],
                })
                .await
                .unwrap_err(),
            "associations under it",
        ),
        (
            admin
                .modify_user(v1::ModifyUserRequest {
                    users: vec!["alice".into()],
                    accounts: vec![],
                    settings: Some(v1::UserChanges { shares: Some(-1) }),
                    default_account: String::new(),
                })
                .await
                .unwrap_err(),
            "negative",
        ),
        (
            admin.add_qos(bad_preempt.clone()).await.unwrap_err(),
            "ghost",
        ),
        (
            admin
                .delete_qos(v1::DeleteQosRequest {
                    names: vec!["normal".into()],
                })
                .await
                .unwrap_err(),
            "cannot be removed",
        ),
        (
            admin
                .add_user(add_user("carol", "nowhere", 1))
                .await
                .unwrap_err(),
            "nowhere",
        ),
    ];
    for (e, needle) in &errors {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(needle),
            "{:?} lacks {needle:?}",
            e.message()
        );
    }
    assert_eq!(assocs(&mut admin).await, before);
    let qos_after = qos_list(&mut admin).await;
    assert_eq!(qos_after, qos_before);

    // An account with a job that has not ended stays, even without users under it.
    admin
        .add_account(add_account(&["busy"], "", 1))
        .await
        .unwrap();
    let mut jobs = JobsClient::new(ctl.channel(&root()).await);
    jobs.submit(pending_job("pending", "busy")).await.unwrap();
    let e = admin
        .delete_account(v1::DeleteAccountRequest {
            names: vec!["busy".into()],
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("active job"), "{}", e.message());

    // Fixed, the same QOS request goes through.
    bad_preempt.settings.as_mut().unwrap().preempt = Some(v1::StringList {
        values: vec!["normal".into()],
    });
    admin.add_qos(bad_preempt).await.unwrap();
    ctl.stop().await;
}

#[tokio::test]
async fn changes_survive_a_restart_and_the_store_outranks_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    // First start: the config file seeds the store.
    let seed = |c: &mut Config| {
        c.cluster.accounts.push(AccountConfig::new("lab", 5));
        c.cluster.users.push(UserConfig {
            user: "alice".into(),
            account: "lab".into(),
            shares: 1,
            default: true,
        });
    };
    let ctl = Controller::start(dir.path(), seed).await;
    let mut admin = ctl.acct(&root()).await;
    admin
        .add_account(add_account(&["physics"], "lab", 7))
        .await
        .unwrap();
    admin.add_user(add_user("bob", "physics", 2)).await.unwrap();
    admin
        .modify_account(v1::ModifyAccountRequest {
            names: vec!["lab".into()],
            settings: Some(v1::AccountChanges {
                shares: Some(9),
                grp_jobs: Some(4),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    admin
        .add_qos(v1::AddQosRequest {
            names: vec!["high".into()],
            settings: Some(v1::QosChanges {
                priority: Some(100),
                preempt: Some(v1::StringList {
                    values: vec!["normal".into()],
                }),
                max_wall_s: Some(3600),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let before = assocs(&mut admin).await;
    let qos_before = qos_list(&mut admin).await;
    ctl.stop().await;

    // Second start with a config file that says something else: the store wins.
    let ctl = Controller::start(dir.path(), |c| {
        c.cluster.accounts.push(AccountConfig::new("other", 1));
    })
    .await;
    let mut admin = ctl.acct(&root()).await;
    let after = assocs(&mut admin).await;
    assert_eq!(after, before);
    let lab = after.accounts.iter().find(|a| a.name == "lab").unwrap();
    assert_eq!((lab.shares, lab.limits.unwrap().grp_jobs), (9, Some(4)));
    assert!(after.accounts.iter().all(|a| a.name != "other"));
    let qos_after = qos_list(&mut admin).await;
    assert_eq!(qos_after, qos_before);
    // The restored tree is live: shares and the new association are ranked.
    let rows = norm_shares(&mut admin).await;
    assert!(close(share_of(&rows, "physics/bob"), 1.0));
    assert!(close(share_of(&rows, "lab/alice"), 1.0 / 8.0));
    ctl.stop().await;
}

#[tokio::test]
async fn sprio_rows_add_up_to_each_pending_jobs_priority() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut admin = ctl.acct(&root()).await;
    admin
        .add_account(add_account(&["physics"], "", 1))
        .await
        .unwrap();
    admin
        .add_qos(v1::AddQosRequest {
            names: vec!["high".into()],
            settings: Some(v1::QosChanges {
                priority: Some(10),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let mut jobs = JobsClient::new(ctl.channel(&alice()).await);
    let mut ids = Vec::new();
    for (qos, nice) in [("normal", 0), ("high", 0), ("high", 50)] {
        let mut req = pending_job("p", "physics");
        let spec = req.spec.as_mut().unwrap();
        (spec.qos, spec.priority_nice) = (qos.into(), nice);
        let r = jobs.submit(req).await.unwrap();
        ids.push(r.into_inner().job_id);
    }
    let mut user = ctl.acct(&alice()).await;
    let resp = user
        .list_priorities(v1::ListPrioritiesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let w = resp.weights.unwrap();
    assert_eq!(resp.rows.len(), 3);
    for r in &resp.rows {
        let f = r.weighted.unwrap();
        let n = r.normalized.unwrap();
        // Grouped as the priority function adds them, so rounding cannot differ.
        let tres = f.tres_cpu + f.tres_mem + f.tres_gpu;
        let sum = f.age + f.fairshare + f.job_size + f.partition + f.qos + tres - f64::from(r.nice);
        assert_eq!(r.priority, sum.max(1.0) as u64, "{r:?}");
        assert!(close(f.qos, f64::from(w.qos) * n.qos), "{r:?}");
    }
    let by_id = |id: u64| resp.rows.iter().find(|r| r.job_id == id).unwrap();
    // QOS factor: high is the largest QOS priority.
    assert!(close(by_id(ids[1]).normalized.unwrap().qos, 1.0));
    assert!(close(by_id(ids[0]).normalized.unwrap().qos, 0.0));
    // Nice 50 costs 50 (give or take a truncation: the jobs' ages differ by a moment).
    let gap = by_id(ids[1]).priority as i64 - by_id(ids[2]).priority as i64;
    assert!((49..=51).contains(&gap), "nice gap {gap}");
    // Filters.
    let only = user
        .list_priorities(v1::ListPrioritiesRequest {
            jobs: vec![ids[0]],
            users: vec![],
            tasks: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(only.rows.len(), 1);
    let none = user
        .list_priorities(v1::ListPrioritiesRequest {
            jobs: vec![],
            users: vec!["bob".into()],
            tasks: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.rows.is_empty());
    ctl.stop().await;
}

#[tokio::test]
async fn the_config_file_seeds_an_empty_store_once() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |c| {
        c.cluster.accounts.push(AccountConfig::new("lab", 5));
    })
    .await;
    // No sacctmgr change at all: the seed alone must be persisted.
    ctl.stop().await;
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut user = ctl.acct(&alice()).await;
    let names: Vec<String> = assocs(&mut user)
        .await
        .accounts
        .into_iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(names, ["root", "lab"]);
    ctl.stop().await;
}
