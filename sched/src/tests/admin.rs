//! Run-time changes to accounts, users and QOS (`sacctmgr`): validated first, nothing
//! changed on error, restored with usage after a restart.

use crate::account::{AccountConfig, UserConfig};
use crate::config::ClusterConfig;
use crate::job::JobSpec;
use crate::qos::Qos;
use crate::state::{AdminError, RestoreInput, State};

fn user(name: &str, account: &str, shares: u32) -> UserConfig {
    UserConfig {
        user: name.into(),
        account: account.into(),
        shares,
        default: false,
    }
}

fn cluster() -> State {
    let mut st = State::test_cluster_with(ClusterConfig::default(), 1, 8, 8000, 0);
    st.add_account(AccountConfig::new("physics", 60)).unwrap();
    st.add_user(user("alice", "physics", 1)).unwrap();
    st.take_changes();
    st
}

#[test]
fn accounts_with_active_jobs_or_children_stay() {
    let mut st = cluster();
    let job = st
        .submit(JobSpec::test().user("alice").account("physics"), 0)
        .unwrap();
    let before = st.config().clone();
    let err = st.remove_user("alice", "physics").unwrap_err();
    assert!(err.to_string().contains("active job"), "{err}");
    // Children (alice) are checked by the tree, jobs by the state: both refuse.
    assert!(st.remove_account("physics").is_err());
    assert_eq!(st.config(), &before);
    assert!(!st.take_changes().config);

    st.cancel(
        &crate::state::JobSelector::job(job),
        &crate::state::Requester::admin(),
        0,
    )
    .unwrap();
    st.remove_user("alice", "physics").unwrap();
    st.remove_account("physics").unwrap();
    assert!(st.assoc().account("physics").is_none());
    assert!(st.config().accounts.is_empty() && st.config().users.is_empty());
}

#[test]
fn first_association_is_the_default_and_defaults_move() {
    let mut st = cluster();
    st.add_account(AccountConfig::new("chem", 1)).unwrap();
    st.add_user(user("alice", "chem", 1)).unwrap();
    let default_of = |st: &State| -> Vec<(String, bool)> {
        st.config()
            .users
            .iter()
            .map(|u| (u.account.clone(), u.default))
            .collect()
    };
    assert_eq!(
        default_of(&st),
        [("physics".into(), true), ("chem".into(), false)]
    );
    st.update_user(UserConfig {
        default: true,
        ..user("alice", "chem", 5)
    })
    .unwrap();
    assert_eq!(
        default_of(&st),
        [("physics".into(), false), ("chem".into(), true)]
    );
    let idx = st.assoc().user("alice", "chem").unwrap();
    assert_eq!(st.assoc().shares(idx), 5);
    // A job naming no account charges the default.
    let j = st.submit(JobSpec::test().user("alice"), 0).unwrap();
    assert_eq!(st.job(j).unwrap().spec.account, "chem");
}

#[test]
fn updates_refuse_unknown_names_and_parent_moves() {
    let mut st = cluster();
    let before = st.config().clone();
    assert!(matches!(
        st.update_account(AccountConfig::new("nope", 1)),
        Err(AdminError::Tree(_))
    ));
    let moved = AccountConfig {
        parent: Some("physics".into()),
        ..AccountConfig::new("physics", 1)
    };
    assert!(st.update_account(moved).is_err());
    assert!(st.update_user(user("bob", "physics", 1)).is_err());
    let mut q = Qos::new("high");
    q.preempt = vec!["ghost".into()];
    assert!(st.upsert_qos(q).is_err());
    assert_eq!(st.config(), &before);

    st.update_account(AccountConfig::new("physics", 7)).unwrap();
    let idx = st.assoc().account("physics").unwrap();
    assert_eq!(st.assoc().shares(idx), 7);
    assert_eq!(st.config().accounts[0].shares, 7);
}

#[test]
fn restore_shapes_the_tree_from_the_lists_and_keeps_usage() {
    let st = cluster();
    let idx = st.assoc().user("alice", "physics").unwrap();
    let mut tree = st.assoc().clone();
    tree.charge(idx, 500.0);
    // The lists gained an account the stored tree never saw.
    let mut config = st.config().clone();
    config.accounts.push(AccountConfig::new("bio", 1));
    let st2 = State::restore(RestoreInput {
        config,
        jobs: Vec::new(),
        nodes: Vec::new(),
        next_job_id: 1,
        assoc: Some(tree),
        usage_charged_at: Some(0),
    })
    .unwrap();
    assert!(st2.assoc().account("bio").is_some());
    let idx2 = st2.assoc().user("alice", "physics").unwrap();
    assert_eq!(st2.assoc().own_usage(idx2), 500.0);
}

#[test]
fn restore_keeps_a_matching_tree_and_its_order() {
    let mut st = cluster();
    // alice joined physics before the sub-account did: sshare lists her first.
    st.add_account(AccountConfig {
        parent: Some("physics".into()),
        ..AccountConfig::new("theory", 1)
    })
    .unwrap();
    let names = |st: &State| -> Vec<String> {
        st.assoc()
            .walk()
            .into_iter()
            .map(|(i, _)| st.assoc().name(i).to_owned())
            .collect()
    };
    let want = names(&st);
    assert_eq!(want, ["root", "physics", "alice", "theory"]);
    let st2 = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs: Vec::new(),
        nodes: Vec::new(),
        next_job_id: 1,
        assoc: Some(st.assoc().clone()),
        usage_charged_at: None,
    })
    .unwrap();
    assert_eq!(names(&st2), want);
}

/// The stored tree (with usage) and config of `st`, restored under `config`.
fn restored(st: &State, config: ClusterConfig) -> State {
    State::restore(RestoreInput {
        config,
        jobs: Vec::new(),
        nodes: Vec::new(),
        next_job_id: 1,
        assoc: Some(st.assoc().clone()),
        usage_charged_at: Some(0),
    })
    .unwrap()
}

/// Issue 29: a user associated on first use (no list names them) comes back after a
/// restart with their usage, whether the stored tree is kept as it is or rebuilt from
/// edited lists; only one whose account is gone is dropped.
#[test]
fn restore_keeps_associations_created_on_first_use_and_their_usage() {
    let mut st = cluster();
    st.add_account(AccountConfig::new("serving", 40)).unwrap();
    for account in ["serving", "physics"] {
        st.submit(JobSpec::test().user("zed").account(account), 0)
            .unwrap();
    }
    assert!(
        st.take_changes().assoc,
        "the new associations must be persisted"
    );
    let zed = st.assoc().user("zed", "serving").unwrap();
    assert!(st.assoc().is_auto(zed));
    let alice = st.assoc().user("alice", "physics").unwrap();
    assert!(
        !st.assoc().is_auto(alice),
        "configured, not created on first use"
    );
    let mut tree = st.assoc().clone();
    tree.charge(zed, 250.0);
    st.assoc = tree;
    let names = |st: &State| -> Vec<String> {
        let t = st.assoc();
        t.walk()
            .into_iter()
            .map(|(i, _)| match t.parent(i) {
                Some(p) => format!("{}/{}={}", t.name(p), t.name(i), t.own_usage(i)),
                None => t.name(i).to_owned(),
            })
            .collect()
    };

    // Same lists: the stored tree as it is, order included.
    let same = restored(&st, st.config().clone());
    assert_eq!(names(&same), names(&st));
    let zed2 = same.assoc().user("zed", "serving").unwrap();
    assert!(same.assoc().is_auto(zed2));

    // Lists edited since (an account added): rebuilt, the first-use associations carried
    // over with their usage, still marked as such (a later restart keeps them too).
    let mut config = st.config().clone();
    config.accounts.push(AccountConfig::new("bio", 1));
    let rebuilt = restored(&st, config);
    let zed3 = rebuilt.assoc().user("zed", "serving").unwrap();
    assert_eq!(rebuilt.assoc().own_usage(zed3), 250.0);
    assert!(rebuilt.assoc().is_auto(zed3));
    assert!(rebuilt.assoc().user("zed", "physics").is_some());
    let again = restored(&rebuilt, rebuilt.config().clone());
    assert_eq!(names(&again), names(&rebuilt));

    // serving is gone from the lists: nothing could charge zed there any more.
    let mut config = st.config().clone();
    config.accounts.retain(|a| a.name != "serving");
    let without = restored(&st, config);
    assert!(without.assoc().user("zed", "serving").is_none());
    assert!(without.assoc().user("zed", "physics").is_some());
}

/// A user association in a stored tree that is neither listed nor created on first use
/// (the lists were edited after it was stored) still goes, as before.
#[test]
fn restore_drops_unlisted_configured_users() {
    let mut st = cluster();
    st.add_user(user("bob", "physics", 2)).unwrap();
    let mut config = st.config().clone();
    config.users.retain(|u| u.user != "bob");
    let st2 = restored(&st, config);
    assert!(st2.assoc().user("bob", "physics").is_none());
    assert!(st2.assoc().user("alice", "physics").is_some());
}
