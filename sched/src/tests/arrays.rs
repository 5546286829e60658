use super::*;
use crate::job::{JobSpec, Reason};
use crate::state::{JobSelector, Requester};

#[test]
fn tasks_split_off_with_new_ids_under_the_throttle() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-9%2"), 0).unwrap();
    assert_eq!(st.job(arr).unwrap().display_id(), "1_[0-9%2]");
    let plan = st.schedule(0);
    let ids = started(&plan);
    assert_eq!(ids, vec![JobId(2), JobId(3)]);
    let t0 = st.job(ids[0]).unwrap();
    assert_eq!(
        (t0.array_job_id, t0.array_task_id, t0.display_id()),
        (Some(arr), Some(0), "1_0".to_string())
    );
    assert_eq!(st.job(arr).unwrap().display_id(), "1_[2-9%2]");
    assert!(st.schedule(1).starts.is_empty());
    assert_eq!(st.job(arr).unwrap().reason, Reason::JobArrayTaskLimit);
    end(&mut st, ids[0], 0, 5);
    let plan = st.schedule(5);
    assert_eq!(plan.starts.len(), 1);
    assert_eq!(st.job(plan.starts[0].job).unwrap().array_task_id, Some(2));
    assert_eq!(st.array_task(arr, 2).unwrap().id, plan.starts[0].job);
    assert_consistent(&st);
}

#[test]
fn an_array_completes_when_every_task_has_and_feeds_dependencies() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("1,3,5"), 0).unwrap();
    let after = st
        .submit(JobSpec::test().dependency(&format!("afterok:{arr}")), 0)
        .unwrap();
    let plan = st.schedule(0);
    assert_eq!(plan.starts.len(), 3);
    assert_eq!(state_of(&st, arr), JobState::Running);
    assert_eq!(st.job(after).unwrap().reason, Reason::Dependency);
    for s in &plan.starts {
        end(&mut st, s.job, 0, 10);
    }
    assert_eq!(state_of(&st, arr), JobState::Completed);
    assert_eq!(started(&st.schedule(10)), vec![after]);
}

#[test]
fn one_failed_task_fails_the_array_and_afterok_never_holds() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-1"), 0).unwrap();
    let after = st
        .submit(JobSpec::test().dependency(&format!("afterok:{arr}")), 0)
        .unwrap();
    let corr = st
        .submit(
            JobSpec::test()
                .array("0-1")
                .dependency(&format!("aftercorr:{arr}")),
            0,
        )
        .unwrap();
    let plan = st.schedule(0);
    assert_eq!(plan.starts.len(), 2);
    end(&mut st, plan.starts[0].job, 0, 5);
    // aftercorr: task 0 of `corr` may start once task 0 of `arr` completed.
    let plan2 = st.schedule(5);
    assert_eq!(plan2.starts.len(), 1);
    assert_eq!(
        st.job(plan2.starts[0].job).unwrap().array_job_id,
        Some(corr)
    );
    end(&mut st, plan.starts[1].job, 2, 6);
    assert_eq!(state_of(&st, arr), JobState::Failed);
    st.schedule(6);
    assert_eq!(
        st.job(after).unwrap().reason,
        Reason::DependencyNeverSatisfied
    );
}

#[test]
fn cancelling_tasks_removes_pending_indices_and_signals_running_ones() {
    let mut st = State::test_cluster(1, 2, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-9"), 0).unwrap();
    let plan = st.schedule(0);
    assert_eq!(plan.starts.len(), 2);
    let alice = Requester::user("alice");
    st.cancel(
        &JobSelector::parse(&format!("{arr}_[5-9]")).unwrap(),
        &alice,
        1,
    )
    .unwrap();
    assert_eq!(st.job(arr).unwrap().display_id(), "1_[2-4]");
    let eff = st
        .cancel(&JobSelector::parse(&format!("{arr}_0")).unwrap(), &alice, 1)
        .unwrap();
    assert_eq!(eff.len(), 1);
    assert!(
        st.cancel(
            &JobSelector::parse(&format!("{arr}_77")).unwrap(),
            &alice,
            1
        )
        .is_err()
    );
    let eff = st.cancel(&JobSelector::job(arr), &alice, 2).unwrap();
    assert_eq!(
        eff.len(),
        1,
        "task 0 is already being killed; only task 1 is signalled now"
    );
    for s in &plan.starts {
        st.job_ended_clean(
            s.job,
            JobOutcome {
                signal: 15,
                ..Default::default()
            },
            3,
        )
        .unwrap();
    }
    assert_eq!(state_of(&st, arr), JobState::Cancelled);
    assert!(st.pending_jobs().next().is_none());
}

#[test]
fn a_million_task_array_is_one_small_record_and_a_cheap_pass() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-999999"), 0).unwrap();
    let meta = st.job(arr).unwrap();
    assert_eq!(meta.array.as_ref().unwrap().pending.runs().len(), 1);
    assert_eq!(meta.array.as_ref().unwrap().pending.len(), 1_000_000);
    let plan = st.schedule(0);
    assert_eq!(plan.starts.len(), 16);
    assert_eq!(st.job(arr).unwrap().display_id(), "1_[16-999999]");
    assert_eq!(st.jobs().count(), 17);
}

#[test]
fn selectors_parse_slurm_forms() {
    assert_eq!(JobSelector::parse("12").unwrap().to_string(), "12");
    assert_eq!(JobSelector::parse("12_3").unwrap().to_string(), "12_3");
    assert_eq!(
        JobSelector::parse("12_[3-5]").unwrap().to_string(),
        "12_[3-5]"
    );
    for bad in ["", "x", "12_", "12_[a]", "-1", "_3"] {
        assert!(JobSelector::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_hostile_task_selection_is_cheap() {
    let mut st = State::test_cluster(1, 2, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-999999"), 0).unwrap();
    st.schedule(0);
    let sel = JobSelector::parse(&format!("{arr}_[0-4000000000]")).unwrap();
    let eff = st.cancel(&sel, &Requester::user("alice"), 1).unwrap();
    assert_eq!(eff.len(), 2, "the two running tasks");
    assert!(
        st.job(arr)
            .unwrap()
            .array
            .as_ref()
            .unwrap()
            .pending
            .is_empty()
    );
}

/// Issue #5: an array that started some tasks in a pass showed `(None)` for the rest until
/// the next pass; the reason must be set in the pass that started them.
#[test]
fn an_array_that_started_some_tasks_explains_the_rest_in_the_same_pass() {
    struct Case {
        name: &'static str,
        spec: JobSpec,
        max_jobs_per_user: Option<u32>,
        want_started: usize,
        want_reason: Reason,
    }
    let cases = [
        Case {
            name: "throttle reached",
            spec: JobSpec::test().array("0-9%2"),
            max_jobs_per_user: None,
            want_started: 2,
            want_reason: Reason::JobArrayTaskLimit,
        },
        Case {
            name: "node full before the throttle",
            spec: JobSpec::test().array("0-9%5").cpus_per_task(4),
            max_jobs_per_user: None,
            want_started: 2,
            want_reason: Reason::Resources,
        },
        Case {
            name: "QOS limit before the throttle",
            spec: JobSpec::test().array("0-9%5"),
            max_jobs_per_user: Some(3),
            want_started: 3,
            want_reason: Reason::QOSMaxJobsPerUserLimit,
        },
    ];
    for case in cases {
        let mut cfg = crate::config::ClusterConfig::default();
        if let Some(m) = case.max_jobs_per_user {
            let mut qos = crate::qos::Qos::new("normal");
            qos.limits.max_jobs_per_user = Some(m);
            cfg.qos = vec![qos];
        }
        let mut st = State::test_cluster_with(cfg, 1, 8, 8000, 0);
        let arr = st.submit(case.spec, 0).unwrap();
        let plan = st.schedule(0);
        assert_eq!(plan.starts.len(), case.want_started, "case: {}", case.name);
        let meta = st.job(arr).unwrap();
        assert_eq!(meta.state, JobState::Pending, "case: {}", case.name);
        assert_eq!(meta.reason, case.want_reason, "case: {}", case.name);
        assert!(
            st.changes.jobs.contains(&arr),
            "case {}: the reason change must be recorded for persistence",
            case.name
        );
        assert_consistent(&st);
    }
}

#[test]
fn an_array_whose_last_tasks_all_start_gets_no_pending_reason() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-2%3"), 0).unwrap();
    assert_eq!(st.schedule(0).starts.len(), 3);
    assert_ne!(state_of(&st, arr), JobState::Pending);
}
