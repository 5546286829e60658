use super::*;
use proptest::prelude::*;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// root
/// ├── physics (shares 60)        usage 100 of 200  -> S 0.6, U 0.5, LF 1.2
/// │   ├── alice (1)              usage  90 of 100  -> S 0.5, U 0.9, LF 0.556
/// │   └── bob   (1)              usage  10 of 100  -> S 0.5, U 0.1, LF 5
/// └── chem    (shares 40)        usage 100 of 200  -> S 0.4, U 0.5, LF 0.8
///     ├── carol (3)              usage   0         -> LF inf
///     └── dave  (1)              usage 100 of 100  -> S 0.25, U 1, LF 0.25
///
/// physics outranks chem, so both physics users come first even though
/// carol has never run anything: bob (4/4), alice (3/4), carol (2/4),
/// dave (1/4).
#[test]
fn account_order_dominates_user_order() {
    let mut t = AssocTree::new();
    t.add_account("physics", "root", 60).unwrap();
    t.add_account("chem", "root", 40).unwrap();
    let alice = t.add_user("alice", "physics", 1).unwrap();
    let bob = t.add_user("bob", "physics", 1).unwrap();
    let carol = t.add_user("carol", "chem", 3).unwrap();
    let dave = t.add_user("dave", "chem", 1).unwrap();
    t.charge(alice, 90.0);
    t.charge(bob, 10.0);
    t.charge(dave, 100.0);

    let fs = t.compute();
    assert_eq!(fs.factor(bob), 1.0);
    assert_eq!(fs.factor(alice), 0.75);
    assert_eq!(fs.factor(carol), 0.5);
    assert_eq!(fs.factor(dave), 0.25);

    let physics = fs.get(t.account("physics").unwrap()).unwrap();
    assert!(close(physics.norm_shares, 0.6));
    assert!(close(physics.effective_usage, 0.5));
    assert!(close(physics.level_fs, 1.2));
    assert!(close(physics.raw_usage, 100.0));
    assert_eq!(physics.fairshare, None);
    let a = fs.get(alice).unwrap();
    assert!(close(a.level_fs, 0.5 / 0.9));
    assert!(fs.get(carol).unwrap().level_fs.is_infinite());
    assert!(close(fs.get(dave).unwrap().norm_shares, 0.25));
}

#[test]
fn rebuilt_tree_keeps_usage_of_surviving_associations() {
    let mut old = AssocTree::new();
    old.add_account("physics", "root", 60).unwrap();
    old.add_account("chem", "root", 40).unwrap();
    let alice = old.add_user("alice", "physics", 1).unwrap();
    let dave = old.add_user("dave", "chem", 1).unwrap();
    old.charge(alice, 90.0);
    old.charge(dave, 100.0);

    // chem and dave are gone, bio is new, alice moved nowhere.
    let mut t = AssocTree::new();
    t.add_account("physics", "root", 10).unwrap();
    t.add_account("bio", "root", 1).unwrap();
    let a2 = t.add_user("alice", "physics", 1).unwrap();
    let d2 = t.add_user("dave", "bio", 1).unwrap();
    t.carry_usage_from(&old);
    assert_eq!(t.own_usage(a2), 90.0);
    // Same user name under another account: a different association, no usage.
    assert_eq!(t.own_usage(d2), 0.0);
    assert_eq!(t.compute().get(t.root()).unwrap().raw_usage, 90.0);
}

/// root
/// ├── a (1) usage 10 -> S 0.5, U 0.5, LF 1
/// │   ├── u1 (1) usage 10 -> LF 0.5
/// │   └── u2 (1) usage  0 -> LF inf
/// └── b (1) usage 10 -> LF 1, tied with a
///     ├── u3 (1) usage  0 -> LF inf
///     └── u4 (1) usage 10 -> LF 0.5
///
/// a and b tie, so their children are merged and sorted together:
/// u2 and u3 (inf) tie at rank 4, u1 and u4 (0.5) tie at rank 2.
#[test]
fn tied_accounts_merge_children() {
    let mut t = AssocTree::new();
    t.add_account("a", "root", 1).unwrap();
    t.add_account("b", "root", 1).unwrap();
    let u1 = t.add_user("u1", "a", 1).unwrap();
    let u2 = t.add_user("u2", "a", 1).unwrap();
    let u3 = t.add_user("u3", "b", 1).unwrap();
    let u4 = t.add_user("u4", "b", 1).unwrap();
    t.charge(u1, 10.0);
    t.charge(u4, 10.0);
    let fs = t.compute();
    assert_eq!(fs.get(u2).unwrap().rank, Some(4));
    assert_eq!(fs.get(u3).unwrap().rank, Some(4));
    assert_eq!(fs.get(u1).unwrap().rank, Some(2));
    assert_eq!(fs.get(u4).unwrap().rank, Some(2));
    assert_eq!(fs.factor(u1), 0.5);
}

/// root
/// ├── solo (1)  usage 10 -> S 0.5, U 0.5, LF 1
/// └── acct (1)  usage 10 -> S 0.5, U 0.5, LF 1 (tied with solo)
///     ├── x (1) usage 10 -> LF 0.5
///     └── y (1) usage  0 -> LF inf
///
/// solo ties with acct, so it shares the rank of acct's best user y (3);
/// x comes next with rank 1 (3 users, competition ranking 3, 3, 1).
#[test]
fn user_tied_with_account_shares_its_best_rank() {
    let mut t = AssocTree::new();
    let solo = t.add_user("solo", "root", 1).unwrap();
    t.add_account("acct", "root", 1).unwrap();
    let x = t.add_user("x", "acct", 1).unwrap();
    let y = t.add_user("y", "acct", 1).unwrap();
    t.charge(solo, 10.0);
    t.charge(x, 10.0);
    let fs = t.compute();
    assert_eq!(fs.get(solo).unwrap().rank, Some(3));
    assert_eq!(fs.get(y).unwrap().rank, Some(3));
    assert_eq!(fs.get(x).unwrap().rank, Some(1));
    assert!(close(fs.factor(x), 1.0 / 3.0));
}

/// Nobody has usage: every LF is inf and every user ties at the top.
/// A user with zero shares has LF 0 and ranks last.
#[test]
fn no_usage_ties_everyone_and_zero_shares_rank_last() {
    let mut t = AssocTree::new();
    t.add_account("a", "root", 1).unwrap();
    let u = t.add_user("u", "a", 1).unwrap();
    let v = t.add_user("v", "a", 1).unwrap();
    let z = t.add_user("z", "a", 0).unwrap();
    let fs = t.compute();
    assert_eq!(fs.factor(u), 1.0);
    assert_eq!(fs.factor(v), 1.0);
    assert!(close(fs.factor(z), 1.0 / 3.0));
}

/// Three levels: the deeper account's order is decided at its own level.
/// root
/// ├── ai (2)                      usage 300 of 400 -> S 2/3, U 0.75, LF 0.889
/// │   ├── vision (1)              usage 100 of 300 -> S 0.5, U 1/3, LF 1.5
/// │   │   └── ann (1)             usage 100        -> LF 1
/// │   └── nlp (1)                 usage 200 of 300 -> S 0.5, U 2/3, LF 0.75
/// │       ├── ben (1) usage 150   -> S 0.5, U 0.75, LF 0.667
/// │       └── cal (1) usage  50   -> S 0.5, U 0.25, LF 2
/// └── bio (1)                     usage 100 of 400 -> S 1/3, U 0.25, LF 1.333
///     └── dan (1) usage 100       -> LF 1
///
/// bio (1.333) before ai (0.889): dan 4; inside ai, vision (1.5) before
/// nlp (0.75): ann 3; inside nlp, cal (2) before ben: cal 2, ben 1.
#[test]
fn three_levels_rank_depth_first() {
    let mut t = AssocTree::new();
    t.add_account("ai", "root", 2).unwrap();
    t.add_account("vision", "ai", 1).unwrap();
    t.add_account("nlp", "ai", 1).unwrap();
    t.add_account("bio", "root", 1).unwrap();
    let ann = t.add_user("ann", "vision", 1).unwrap();
    let ben = t.add_user("ben", "nlp", 1).unwrap();
    let cal = t.add_user("cal", "nlp", 1).unwrap();
    let dan = t.add_user("dan", "bio", 1).unwrap();
    t.charge(ann, 100.0);
    t.charge(ben, 150.0);
    t.charge(cal, 50.0);
    t.charge(dan, 100.0);
    let fs = t.compute();
    let ranks: Vec<_> = [dan, ann, cal, ben]
        .iter()
        .map(|i| fs.get(*i).unwrap().rank.unwrap())
        .collect();
    assert_eq!(ranks, vec![4, 3, 2, 1]);
    assert!(close(
        fs.get(t.account("ai").unwrap()).unwrap().level_fs,
        (2.0 / 3.0) / 0.75
    ));
}

#[test]
fn decay_halves_per_half_life() {
    assert!(close(decay(100.0, 3600, 3600), 50.0));
    assert!(close(decay(100.0, 7200, 3600), 25.0));
    assert_eq!(decay(100.0, 1_000, 0), 100.0);
    let mut t = AssocTree::new();
    let u = t.add_user("u", "root", 1).unwrap();
    t.charge(u, 80.0);
    t.decay_all(60, 60);
    assert!(close(t.own_usage(u), 40.0));
}

#[test]
fn billing_weighs_gpus_most() {
    let w = BillingWeights::default();
    assert!(w.rate(0, 0, 1) > w.rate(8, 16 * 1024, 0));
    assert!(close(w.usage(2, 1024, 1, 10), (2.0 + 0.25 + 16.0) * 10.0));
}

#[test]
fn bad_edits_change_nothing() {
    let mut t = AssocTree::new();
    t.add_account("a", "root", 1).unwrap();
    let u = t.add_user("u", "a", 1).unwrap();
    assert_eq!(
        t.add_account("a", "root", 1),
        Err(FairShareError::DuplicateAccount("a".into()))
    );
    assert!(matches!(
        t.add_user("u", "a", 1),
        Err(FairShareError::DuplicateUser { .. })
    ));
    assert!(matches!(
        t.add_user("w", "nope", 1),
        Err(FairShareError::UnknownAccount(_))
    ));
    assert!(matches!(
        t.add_user("has space", "a", 1),
        Err(FairShareError::BadName(..))
    ));
    assert_eq!(
        t.remove_account("a"),
        Err(FairShareError::AccountNotEmpty("a".into()))
    );
    assert_eq!(t.remove_account("root"), Err(FairShareError::RemoveRoot));
    assert_eq!(t.len(), 3);
    t.remove_user("u", "a").unwrap();
    t.remove_account("a").unwrap();
    assert!(t.is_empty());
    assert_eq!(t.compute().factor(u), 0.0);
}

#[test]
fn walk_is_depth_first_in_creation_order() {
    let mut t = AssocTree::new();
    t.add_account("a", "root", 1).unwrap();
    t.add_account("b", "root", 1).unwrap();
    t.add_user("x", "a", 1).unwrap();
    t.add_user("y", "b", 1).unwrap();
    let names: Vec<_> = t
        .walk()
        .iter()
        .map(|(i, d)| format!("{}{}", d, t.name(*i)))
        .collect();
    assert_eq!(names, vec!["0root", "1a", "2x", "1b", "2y"]);
}

#[test]
fn sshare_rows_name_accounts_and_users() {
    let mut t = AssocTree::new();
    t.add_account("a", "root", 3).unwrap();
    let u = t.add_user("ann", "a", 1).unwrap();
    t.charge(u, 5.0);
    let rows = sshare_rows(&t, &t.compute());
    let got: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.depth,
                r.account.as_str(),
                r.user.as_deref(),
                r.share.fairshare,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "root", None, None),
            (1, "a", None, None),
            (2, "a", Some("ann"), Some(1.0))
        ]
    );
    assert_eq!(rows[1].share.raw_shares, 3);
    assert_eq!(rows[1].share.raw_usage, 5.0);
}

/// A random two-level tree: accounts with random shares, users with random
/// shares and usage.
fn arb_tree() -> impl Strategy<Value = (AssocTree, Vec<AssocIdx>)> {
    prop::collection::vec(
        (1u32..5, prop::collection::vec((0u32..4, 0u32..4), 1..5)),
        1..5,
    )
    .prop_map(|accounts| {
        let mut t = AssocTree::new();
        let mut users = Vec::new();
        for (ai, (shares, us)) in accounts.iter().enumerate() {
            let acct = format!("acct{ai}");
            t.add_account(&acct, "root", *shares).unwrap();
            for (ui, (ushares, usage)) in us.iter().enumerate() {
                let u = t.add_user(&format!("u{ai}_{ui}"), &acct, *ushares).unwrap();
                t.charge(u, f64::from(*usage) * 100.0);
                users.push(u);
            }
        }
        (t, users)
    })
}

proptest! {
    /// Factors lie in (0, 1]; the best user gets exactly 1; no rank
    /// exceeds the user count.
    #[test]
    fn factors_are_ranks_over_users((t, users) in arb_tree()) {
        let fs = t.compute();
        let n = users.len() as u32;
        prop_assert_eq!(fs.user_count(), n);
        let mut best = 0.0_f64;
        for u in &users {
            let r = fs.get(*u).unwrap().rank.unwrap();
            prop_assert!(r >= 1 && r <= n);
            let f = fs.factor(*u);
            prop_assert!(f > 0.0 && f <= 1.0);
            best = best.max(f);
        }
        prop_assert_eq!(best, 1.0);
    }

    /// The Fair Tree guarantee: if sibling account A has a higher level
    /// fair share than B, every user of A outranks every user of B.
    #[test]
    fn higher_account_lf_means_all_its_users_rank_higher((t, _users) in arb_tree()) {
        let fs = t.compute();
        let accts = t.children(t.root()).to_vec();
        for &a in &accts {
            for &b in &accts {
                let (la, lb) = (fs.get(a).unwrap().level_fs, fs.get(b).unwrap().level_fs);
                if la > lb {
                    for &ua in t.children(a) {
                        for &ub in t.children(b) {
                            prop_assert!(fs.factor(ua) > fs.factor(ub));
                        }
                    }
                }
            }
        }
    }

    /// Charging a user more never raises their factor.
    #[test]
    fn more_usage_never_helps((mut t, users) in arb_tree(), pick in 0usize..20, extra in 1u32..1000) {
        let u = users[pick % users.len()];
        let before = t.compute().factor(u);
        t.charge(u, f64::from(extra) * 1000.0);
        let after = t.compute().factor(u);
        prop_assert!(after <= before);
    }
}

#[test]
fn names_reject_separators_controls_and_length() {
    for ok in ["a", "lab-1", "u_2.x", &"n".repeat(MAX_NAME_LEN)] {
        assert_eq!(check_name(ok), Ok(()), "{ok:?}");
    }
    for bad in ["", "a b", "a,b", "a|b", "a:b", "a\tb", "a\u{7}b", "a\nb"] {
        assert!(
            matches!(check_name(bad), Err(FairShareError::BadName(..))),
            "{bad:?}"
        );
    }
    let long = "n".repeat(MAX_NAME_LEN + 1);
    let err = check_name(&long).unwrap_err().to_string();
    assert!(err.contains("longer than 64 bytes"), "{err}");
    // The message shows a prefix, not the whole oversized name.
    assert!(err.len() < 2 * MAX_NAME_LEN + 40, "{err}");
    let mut t = AssocTree::new();
    assert!(t.add_account("x|y", ROOT_ACCOUNT, 1).is_err());
    assert!(t.is_empty());
}
