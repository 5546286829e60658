//! When a pending job becomes eligible and gets a priority: begin times, dependencies,
//! singletons, `--test-only` (will-run), and which of those changes are written.

use super::*;
use crate::config::ClusterConfig;
use crate::job::{JobSpec, Reason};
use crate::state::{JobSelector, Requester, RestoreInput, SubmitError};

#[test]
fn jobs_no_pass_will_see_get_a_priority_and_resources_at_once() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let full = st.submit(JobSpec::test().cpus_per_task(8), 0).unwrap();
    assert_eq!(started(&st.schedule(0)), vec![full]);
    let waits = st.submit(JobSpec::test(), 1).unwrap();
    let held = st.submit(JobSpec::test().held(), 1).unwrap();
    let after = st
        .submit(
            JobSpec::test().dependency(&format!("afterok:{}", full.0)),
            1,
        )
        .unwrap();
    st.take_changes();
    st.no_room_for(&[waits, held, after], 1);
    let job = |id| st.job(id).unwrap();
    assert_eq!(job(waits).reason, Reason::Resources);
    assert!(job(waits).priority > 0);
    assert_eq!(
        (job(held).reason, job(held).priority),
        (Reason::JobHeldUser, 0)
    );
    assert_eq!(job(after).reason, Reason::Dependency);
    // Waiting for a dependency, it shows a priority all the same, as in Slurm.
    assert!(job(after).priority > 0);
    let given = job(waits).priority;
    // Changed records are written (with their submit, in the controller), the held one not.
    assert_eq!(
        st.take_changes().jobs.into_iter().collect::<Vec<_>>(),
        vec![waits, after]
    );
    // A pass gives the same priority.
    st.schedule(1);
    assert_eq!(st.job(waits).unwrap().priority, given);
    assert_eq!(st.job(waits).unwrap().reason, Reason::Resources);
}

#[test]
fn a_pass_gives_jobs_waiting_for_a_dependency_or_begin_time_a_priority_but_not_held_ones() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let first = st.submit(JobSpec::test(), 0).unwrap();
    let after = st
        .submit(
            JobSpec::test().dependency(&format!("afterok:{}", first.0)),
            0,
        )
        .unwrap();
    let later = st.submit(JobSpec::test().begin(3_600), 0).unwrap();
    let held = st.submit(JobSpec::test().held(), 0).unwrap();
    assert_eq!(started(&st.schedule(1)), vec![first]);
    let job = |st: &State, id| st.job(id).unwrap().clone();
    assert_eq!(job(&st, after).reason, Reason::Dependency);
    assert_eq!(job(&st, later).reason, Reason::BeginTime);
    assert!(job(&st, after).priority > 0 && job(&st, later).priority > 0);
    assert_eq!(job(&st, held).priority, 0);
    // Not recomputed while they wait: the next pass leaves the same numbers.
    let before = (job(&st, after).priority, job(&st, later).priority);
    st.schedule(2);
    assert_eq!((job(&st, after).priority, job(&st, later).priority), before);
    assert_consistent(&st);
}

#[test]
fn will_run_says_when_and_where_without_submitting() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let now = 1_000;
    // An idle cluster: now, on one node, with the CPUs asked for.
    let w = st
        .will_run(JobSpec::test().cpus_per_task(4).time(Some(600)), now)
        .unwrap();
    assert_eq!((w.start, w.cpus, w.nodes.len()), (now, 4, 1));
    assert_eq!(w.partition, "batch");
    let first = w.job_id;
    // Both nodes busy until their jobs' limits: the earliest end.
    let _long = st
        .submit(JobSpec::test().cpus_per_task(8).time(Some(900)), now)
        .unwrap();
    let short = st
        .submit(JobSpec::test().cpus_per_task(8).time(Some(300)), now)
        .unwrap();
    assert_eq!(started(&st.schedule(now)).len(), 2);
    st.take_changes();
    let w = st
        .will_run(JobSpec::test().cpus_per_task(8).time(Some(60)), now + 10)
        .unwrap();
    assert_eq!(w.start, now + 300);
    let short_node = st.job(short).unwrap().alloc.as_ref().unwrap().nodes[0].node;
    assert_eq!(w.nodes, vec![st.node(short_node).unwrap().name.clone()]);
    // Asked twice, nothing was created: the id is the next submit's.
    assert_eq!(w.job_id.0, first.0 + 2);
    assert!(st.take_changes().jobs.is_empty());
    assert_eq!(st.submit(JobSpec::test(), now + 20).unwrap(), w.job_id);
    // A submit's checks apply.
    assert!(matches!(
        st.will_run(JobSpec::test().partition("nope"), now),
        Err(SubmitError::UnknownPartition(_))
    ));
    assert!(matches!(
        st.will_run(JobSpec::test().cpus_per_task(9), now),
        Err(SubmitError::Unsatisfiable(_))
    ));
}

#[test]
fn begin_time_delays_eligibility() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test().begin(100), 0).unwrap();
    // Known at submit, before any pass: squeue shows it at once.
    assert_eq!(st.job(a).unwrap().reason, Reason::BeginTime);
    let due = st.submit(JobSpec::test().begin(0), 0).unwrap();
    assert_eq!(st.job(due).unwrap().reason, Reason::None);
    st.cancel(&JobSelector::job(due), &Requester::admin(), 0)
        .unwrap();
    assert!(st.schedule(50).starts.is_empty());
    assert_eq!(st.job(a).unwrap().reason, Reason::BeginTime);
    assert_eq!(started(&st.schedule(100)), vec![a]);
    assert_eq!(st.job(a).unwrap().eligible_time, Some(100));
}

/// What a store would hold: each job record as last written, and how often it was written.
#[derive(Default)]
struct Written {
    records: std::collections::BTreeMap<JobId, crate::Job>,
    writes: std::collections::BTreeMap<JobId, u32>,
}

impl Written {
    fn flush(&mut self, st: &mut State) {
        for id in st.take_changes().jobs {
            self.records.insert(id, st.job(id).unwrap().clone());
            *self.writes.entry(id).or_default() += 1;
        }
    }
}

#[test]
fn a_waiting_job_is_written_once_across_submit_and_first_pass() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    st.take_changes();
    let mut disk = Written::default();
    let runs = st.submit(JobSpec::test().cpus_per_task(8), 5).unwrap();
    let waits = st.submit(JobSpec::test(), 5).unwrap();
    let later = st.submit(JobSpec::test().begin(1000), 5).unwrap();
    disk.flush(&mut st);
    // Eligible from its submit: the age factor counts from then, and that is durable.
    assert_eq!(disk.records[&waits].eligible_time, Some(5));
    assert_eq!(disk.records[&later].eligible_time, None);

    assert_eq!(started(&st.schedule(6)), vec![runs]);
    disk.flush(&mut st);
    // squeue reads the live reason; the pass derived it, so it is not rewritten.
    assert_eq!(st.job(waits).unwrap().reason, Reason::Resources);
    assert_eq!(st.job(later).unwrap().reason, Reason::BeginTime);
    assert_eq!(disk.writes[&waits], 1);
    assert_eq!(disk.writes[&later], 1);
    // Starting is a durable change.
    assert_eq!(disk.writes[&runs], 2);
    // Later passes write nothing for jobs that still wait.
    st.schedule(7);
    assert!(st.take_changes().jobs.is_empty());

    // After a restart from what was written, the first pass says why again.
    let mut restored = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs: disk.records.values().cloned().collect(),
        nodes: st.nodes().cloned().collect(),
        next_job_id: st.next_job_id(),
        assoc: Some(st.assoc().clone()),
        usage_charged_at: st.usage_charged_at(),
    })
    .unwrap();
    assert_eq!(restored.job(waits).unwrap().reason, Reason::None);
    restored.schedule(8);
    assert_eq!(restored.job(waits).unwrap().reason, Reason::Resources);
    assert_eq!(restored.job(waits).unwrap().eligible_time, Some(5));
}

#[test]
fn a_job_that_cannot_be_considered_at_submit_says_why_and_is_not_eligible_yet() {
    let mut config = ClusterConfig::default();
    config.partitions[0].state = crate::partition::PartitionState::Down;
    let mut st = State::test_cluster_with(config, 1, 8, 8000, 0);
    let a = st.submit(JobSpec::test(), 5).unwrap();
    let job = st.job(a).unwrap();
    assert_eq!(
        (job.reason, job.eligible_time),
        (Reason::PartitionDown, None)
    );
}

#[test]
fn eligibility_that_comes_in_a_pass_is_written() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let held = st.submit(JobSpec::test().held(), 5).unwrap();
    // A job with a dependency waits for the pass, which judges it against the whole queue.
    let dep = st
        .submit(JobSpec::test().dependency(&format!("afterany:{held}")), 5)
        .unwrap();
    for id in [held, dep] {
        assert_eq!(st.job(id).unwrap().eligible_time, None);
    }
    st.schedule(6);
    assert_eq!(st.job(dep).unwrap().reason, Reason::Dependency);
    st.take_changes();
    st.release(&JobSelector::job(held), &Requester::admin())
        .unwrap();
    st.take_changes();
    assert_eq!(started(&st.schedule(9)), vec![held]);
    assert_eq!(st.job(held).unwrap().eligible_time, Some(9));
    assert!(st.take_changes().jobs.contains(&held));
}

#[test]
fn dependency_chains_wait_start_and_never_satisfy() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let a = st.submit(JobSpec::test(), 0).unwrap();
    let b = st
        .submit(JobSpec::test().dependency(&format!("afterok:{a}")), 0)
        .unwrap();
    let c = st
        .submit(JobSpec::test().dependency(&format!("afterok:{b}")), 0)
        .unwrap();
    let d = st
        .submit(JobSpec::test().dependency(&format!("afternotok:{a}")), 0)
        .unwrap();
    let e = st
        .submit(JobSpec::test().dependency(&format!("afterany:{a}")), 0)
        .unwrap();
    assert_eq!(started(&st.schedule(0)), vec![a]);
    assert_eq!(st.job(b).unwrap().reason, Reason::Dependency);
    end(&mut st, a, 0, 10);
    let plan = st.schedule(10);
    assert_eq!(started(&plan), vec![b, e]);
    assert_eq!(st.job(d).unwrap().reason, Reason::DependencyNeverSatisfied);
    assert_eq!(state_of(&st, d), JobState::Pending);
    end(&mut st, b, 1, 20);
    st.schedule(20);
    assert_eq!(st.job(c).unwrap().reason, Reason::DependencyNeverSatisfied);
}

#[test]
fn singleton_runs_one_job_of_a_name_at_a_time() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let ids: Vec<JobId> = (0..3)
        .map(|_| {
            st.submit(JobSpec::test().name("train").dependency("singleton"), 0)
                .unwrap()
        })
        .collect();
    let other = st
        .submit(JobSpec::test().name("eval").dependency("singleton"), 0)
        .unwrap();
    assert_eq!(started(&st.schedule(0)), vec![ids[0], other]);
    assert_eq!(st.job(ids[1]).unwrap().reason, Reason::Dependency);
    end(&mut st, ids[0], 0, 5);
    assert_eq!(started(&st.schedule(5)), vec![ids[1]]);
}
