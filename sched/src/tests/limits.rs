//! Limits that keep jobs pending with Slurm's reasons (partition, QOS, association), and
//! usage charged to (and refunded from) the user's association.

use super::*;
use crate::config::ClusterConfig;
use crate::job::{JobSpec, Reason};
use crate::partition::Partition;
use crate::state::SubmitError;

#[test]
fn partition_and_qos_limits_keep_jobs_pending_with_their_reason() {
    let mut cfg = ClusterConfig::default();
    let mut short = Partition::new("short");
    short.max_time = Some(600);
    short.max_nodes = Some(1);
    cfg.partitions.push(short);
    let mut qos = crate::qos::Qos::new("normal");
    qos.limits.max_jobs_per_user = Some(1);
    qos.limits.max_submit_per_user = Some(4);
    qos.limits.max_wall = Some(7200);
    cfg.qos = vec![qos];
    let mut st = State::test_cluster_with(cfg, 2, 8, 8000, 0);
    let long = st
        .submit(JobSpec::test().partition("short").time(Some(3600)), 0)
        .unwrap();
    let wide = st
        .submit(
            JobSpec::test().partition("short").time(Some(60)).nodes(2),
            0,
        )
        .unwrap();
    let a = st.submit(JobSpec::test(), 0).unwrap();
    let b = st.submit(JobSpec::test(), 0).unwrap();
    assert!(matches!(
        st.submit(JobSpec::test(), 0),
        Err(SubmitError::SubmitLimit { .. })
    ));
    let plan = st.schedule(0);
    assert_eq!(started(&plan), vec![a]);
    assert_eq!(st.job(long).unwrap().reason, Reason::PartitionTimeLimit);
    assert_eq!(st.job(wide).unwrap().reason, Reason::PartitionNodeLimit);
    assert_eq!(st.job(b).unwrap().reason, Reason::QOSMaxJobsPerUserLimit);
    let other = st.submit(JobSpec::test().user("bob"), 0).unwrap();
    assert_eq!(started(&st.schedule(1)), vec![other]);
    let mut st2 = State::test_cluster(1, 8, 8000, 0);
    let walled = st2.submit(JobSpec::test().time(None), 0).unwrap();
    st2.upsert_qos(st.config().qos("normal").unwrap().clone())
        .unwrap();
    st2.schedule(0);
    assert_eq!(
        st2.job(walled).unwrap().reason,
        Reason::QOSMaxWallDurationPerJobLimit
    );
}

#[test]
fn account_gpu_limits_cover_sub_accounts() {
    use crate::account::{AccountConfig, AssocLimits, UserConfig};
    let mut cfg = ClusterConfig::default();
    cfg.accounts.push(AccountConfig {
        limits: AssocLimits {
            grp_gpus: Some(8),
            ..Default::default()
        },
        ..AccountConfig::new("ml", 70)
    });
    cfg.accounts.push(AccountConfig {
        parent: Some("ml".into()),
        ..AccountConfig::new("vision", 1)
    });
    cfg.users.push(UserConfig {
        user: "alice".into(),
        account: "vision".into(),
        shares: 1,
        default: true,
    });
    cfg.sched.enforce_associations = true;
    let mut st = State::test_cluster_with(cfg, 2, 32, 8000, 8);
    let a = st.submit(JobSpec::test().gpus(6), 0).unwrap();
    let b = st.submit(JobSpec::test().gpus(4), 0).unwrap();
    assert_eq!(st.job(a).unwrap().spec.account, "vision");
    assert!(matches!(
        st.submit(JobSpec::test().user("bob"), 0),
        Err(SubmitError::NoAssociation { .. })
    ));
    assert_eq!(started(&st.schedule(0)), vec![a]);
    assert_eq!(st.job(b).unwrap().reason, Reason::AssocGrpGRES);
}

#[test]
fn usage_is_charged_to_the_users_association() {
    let mut st = State::test_cluster(1, 8, 8000, 2);
    let a = st.submit(JobSpec::test().gpus(2), 0).unwrap();
    st.schedule(0);
    st.schedule(100);
    end(&mut st, a, 0, 150);
    let idx = st.assoc().user("alice", "root").unwrap();
    let usage = st.assoc().own_usage(idx);
    // 150 s of 1 CPU and 2 GPUs, slightly decayed over 150 s of a 7-day half-life.
    let rate = st.config().fairshare.billing.rate(1, 0, 2);
    assert!(
        usage > rate * 149.0 && usage <= rate * 150.0,
        "{usage} vs {}",
        rate * 150.0
    );
}

#[test]
fn an_end_reported_after_a_charge_gives_back_the_time_it_did_not_run() {
    let mut st = State::test_cluster(1, 8, 8000, 2);
    let a = st.submit(JobSpec::test().gpus(2), 0).unwrap();
    st.schedule(0);
    st.schedule(100);
    // A pass at 200 charges the job as running; its end at 150 is told only at 210 (a
    // controller restart, a late worker or bridge).
    st.schedule(200);
    end(&mut st, a, 0, 150);
    let idx = st.assoc().user("alice", "root").unwrap();
    let usage = st.assoc().own_usage(idx);
    let rate = st.config().fairshare.billing.rate(1, 0, 2);
    assert!(
        usage > rate * 149.0 && usage <= rate * 150.0,
        "charged {usage}, ran {}",
        rate * 150.0
    );
}

#[test]
fn each_running_limit_names_its_slurm_reason() {
    use crate::account::{AccountConfig, AssocLimits};
    use crate::qos::QosLimits;
    // (qos limits, account limits, second job's reason)
    let cases: Vec<(QosLimits, AssocLimits, Reason)> = vec![
        (
            QosLimits {
                max_gpus_per_user: Some(3),
                ..Default::default()
            },
            AssocLimits::default(),
            Reason::QOSMaxGRESPerUser,
        ),
        (
            QosLimits {
                max_jobs_per_account: Some(1),
                ..Default::default()
            },
            AssocLimits::default(),
            Reason::QOSMaxJobsPerAccountLimit,
        ),
        (
            QosLimits::default(),
            AssocLimits {
                grp_jobs: Some(1),
                ..Default::default()
            },
            Reason::AssocGrpJobsLimit,
        ),
        (
            QosLimits::default(),
            AssocLimits {
                max_jobs_per_user: Some(1),
                ..Default::default()
            },
            Reason::AssocMaxJobsLimit,
        ),
        (
            QosLimits::default(),
            AssocLimits {
                grp_gpus: Some(3),
                ..Default::default()
            },
            Reason::AssocGrpGRES,
        ),
    ];
    for (qos_limits, acct_limits, want) in cases {
        let mut cfg = ClusterConfig::default();
        cfg.qos[0].limits = qos_limits;
        cfg.accounts.push(AccountConfig {
            limits: acct_limits,
            ..AccountConfig::new("lab", 1)
        });
        let mut st = State::test_cluster_with(cfg, 1, 8, 8000, 8);
        let a = st
            .submit(JobSpec::test().account("lab").gpus(2), 0)
            .unwrap();
        let b = st
            .submit(JobSpec::test().account("lab").gpus(2), 0)
            .unwrap();
        assert_eq!(started(&st.schedule(0)), vec![a], "{want}");
        assert_eq!(st.job(b).unwrap().reason, want);
        end(&mut st, a, 0, 1);
        assert_eq!(
            started(&st.schedule(1)),
            vec![b],
            "{want}: runs once the first ends"
        );
    }
}
