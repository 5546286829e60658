//! A job's life through `State`'s events: submit, start, outcomes, cancel, hold, update,
//! requeue and purge.

use super::*;
use crate::config::ClusterConfig;
use crate::effect::{Effect, SignalReason};
use crate::job::{Hold, JobSpec, Reason};
use crate::state::{JobSelector, Requester, RestoreInput};

#[test]
fn submit_assigns_increasing_ids_and_rejects_without_changing_anything() {
    let mut st = State::test_cluster(2, 32, 64_000, 8);
    assert_eq!(st.submit(JobSpec::test(), 0), Ok(JobId(1)));
    assert_eq!(st.submit(JobSpec::test(), 0), Ok(JobId(2)));
    st.take_changes();
    let cases: Vec<(JobSpec, &str)> = vec![
        (JobSpec::test().partition("nope"), "invalid partition"),
        (
            JobSpec::test().gpus_per_node(9),
            "requested 9 GPUs per node but the largest node in partition batch has 8",
        ),
        (
            JobSpec::test().nodes(3),
            "requested 3 nodes but partition batch has 2",
        ),
        (JobSpec::test().cpus_per_task(33), "33 CPUs per node"),
        (JobSpec::test().mem_mb(100_000), "MB of memory"),
        (JobSpec::test().qos("gold"), "invalid qos"),
        (JobSpec::test().account("physics"), "invalid account"),
        (JobSpec::test().gpus(1).gpu_type("h100"), "GPU type h100"),
        (JobSpec::test().constraint("ib"), "features ib"),
        (JobSpec::test().dependency("afterok:99"), "job 99 not found"),
        (JobSpec::test().nodelist(&["ghost"]), "unknown node"),
        (
            JobSpec {
                mem_per_cpu_mb: Some(1),
                mem_per_node_mb: Some(1),
                ..JobSpec::test()
            },
            "mutually exclusive",
        ),
    ];
    for (spec, want) in cases {
        let err = st.submit(spec, 0).unwrap_err().to_string();
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
    assert_eq!(st.next_job_id(), 3);
    assert!(st.take_changes().is_empty());
}

#[test]
fn a_partition_without_nodes_accepts_jobs_so_demand_can_scale_it_up() {
    let mut st = State::new(ClusterConfig::default()).unwrap();
    let id = st
        .submit(JobSpec::test().gpus_per_node(8).nodes(4), 0)
        .unwrap();
    let plan = st.schedule(1);
    assert!(plan.starts.is_empty());
    assert_eq!(st.job(id).unwrap().reason, Reason::Resources);
}

#[test]
fn a_job_starts_with_concrete_gpus_and_ends_completed() {
    let mut st = State::test_cluster(1, 32, 64_000, 8);
    let a = st.submit(JobSpec::test().gpus(3), 0).unwrap();
    let b = st.submit(JobSpec::test().gpus(2), 0).unwrap();
    let plan = st.schedule(10);
    assert_eq!(started(&plan), vec![a, b]);
    assert_eq!(plan.starts[0].nodes[0].gpus, vec![0, 1, 2]);
    assert_eq!(plan.starts[1].nodes[0].gpus, vec![3, 4]);
    assert_eq!(plan.starts[0].nodes[0].name, "node-01");
    let changes = st.take_changes();
    assert!(changes.jobs.contains(&a) && changes.nodes.contains(&crate::NodeId(0)));
    assert_eq!(state_of(&st, a), JobState::Running);
    assert_eq!(st.job(a).unwrap().start_time, Some(10));
    assert_consistent(&st);
    end(&mut st, a, 0, 50);
    let job = st.job(a).unwrap();
    assert_eq!(
        (job.state, job.end_time, job.reason),
        (JobState::Completed, Some(50), Reason::None)
    );
    assert_eq!(
        st.node(crate::NodeId(0)).unwrap().gpu_indices_in_use(),
        vec![3, 4]
    );
    // A finished job still shows where it ran.
    assert_eq!(st.nodelist(st.job(a).unwrap()), "node-01");
    assert_consistent(&st);
}

#[test]
fn busy_resources_leave_jobs_pending_with_slurm_reasons_until_they_free() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test().cpus_per_task(8), 0).unwrap();
    let b = st.submit(JobSpec::test().cpus_per_task(8), 1).unwrap();
    let c = st.submit(JobSpec::test().cpus_per_task(8), 2).unwrap();
    assert_eq!(started(&st.schedule(10)), vec![a]);
    assert_eq!(st.job(b).unwrap().reason, Reason::Resources);
    assert_eq!(st.job(c).unwrap().reason, Reason::Priority);
    end(&mut st, a, 0, 20);
    assert_eq!(started(&st.schedule(20)), vec![b]);
}

#[test]
fn job_outcomes_map_to_slurm_states() {
    let cases: Vec<(JobOutcome, JobState, Reason)> = vec![
        (JobOutcome::default(), JobState::Completed, Reason::None),
        (
            JobOutcome {
                exit_code: 3,
                ..Default::default()
            },
            JobState::Failed,
            Reason::NonZeroExitCode,
        ),
        (
            JobOutcome {
                signal: 9,
                ..Default::default()
            },
            JobState::Failed,
            Reason::NonZeroExitCode,
        ),
        (
            JobOutcome {
                timed_out: true,
                signal: 15,
                ..Default::default()
            },
            JobState::Timeout,
            Reason::TimeLimit,
        ),
        (
            JobOutcome {
                cancelled: true,
                signal: 15,
                ..Default::default()
            },
            JobState::Cancelled,
            Reason::None,
        ),
        // Killed by the kernel in its cgroup, or survived an OOM kill of a child: Slurm
        // reports OUT_OF_MEMORY either way; a cancel or time limit still wins.
        (
            JobOutcome {
                out_of_memory: true,
                signal: 9,
                ..Default::default()
            },
            JobState::OutOfMemory,
            Reason::OutOfMemory,
        ),
        (
            JobOutcome {
                out_of_memory: true,
                ..Default::default()
            },
            JobState::OutOfMemory,
            Reason::OutOfMemory,
        ),
        (
            JobOutcome {
                out_of_memory: true,
                timed_out: true,
                ..Default::default()
            },
            JobState::Timeout,
            Reason::TimeLimit,
        ),
        (
            JobOutcome {
                launch_error: Some("no such dir".into()),
                exit_code: 1,
                ..Default::default()
            },
            JobState::Failed,
            Reason::JobLaunchFailure,
        ),
    ];
    for (outcome, want_state, want_reason) in cases {
        let mut st = State::test_cluster(1, 8, 8000, 0);
        let id = st.submit(JobSpec::test(), 0).unwrap();
        st.schedule(0);
        let effects = st.job_ended_clean(id, outcome.clone(), 30).unwrap();
        let job = st.job(id).unwrap();
        assert_eq!(
            (job.state, job.reason),
            (want_state, want_reason),
            "{outcome:?}"
        );
        assert_eq!(job.exit_code, outcome.exit_code);
        let Effect::RunEnded(rec) = &effects[0] else {
            panic!("{effects:?}")
        };
        assert_eq!(
            (rec.state, rec.requeued, rec.start_time),
            (want_state, false, Some(0))
        );
        // A second report of the same end is harmless.
        assert_eq!(st.job_ended_clean(id, outcome, 31).unwrap(), vec![]);
        assert_eq!(st.job(id).unwrap().end_time, Some(30));
    }
}

#[test]
fn cancel_is_immediate_when_pending_and_signals_when_running() {
    let mut st = State::test_cluster(1, 1, 1000, 0);
    let run = st.submit(JobSpec::test(), 0).unwrap();
    let wait = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(0);
    let alice = Requester::user("alice");
    let bob = Requester::user("bob");
    assert!(matches!(
        st.cancel(&JobSelector::job(run), &bob, 1),
        Err(crate::state::JobError::PermissionDenied { .. })
    ));
    assert_eq!(
        st.cancel(&JobSelector::job(wait), &alice, 1).unwrap(),
        vec![]
    );
    assert_eq!(state_of(&st, wait), JobState::Cancelled);
    let effects = st.cancel(&JobSelector::job(run), &alice, 2).unwrap();
    assert_eq!(
        effects,
        vec![Effect::Terminate {
            job: run,
            nodes: vec![crate::NodeId(0)],
            reason: SignalReason::Cancel,
            grace_s: 0
        }]
    );
    assert_eq!(state_of(&st, run), JobState::Running);
    // The worker reports a signal death; the cancel decides the state.
    st.job_ended_clean(
        run,
        JobOutcome {
            signal: 15,
            ..Default::default()
        },
        3,
    )
    .unwrap();
    assert_eq!(state_of(&st, run), JobState::Cancelled);
    assert!(st.cancel(&JobSelector::job(run), &alice, 4).is_err());
    assert!(
        st.cancel(&JobSelector::job(JobId(77)), &Requester::admin(), 4)
            .is_err()
    );
}

#[test]
fn held_jobs_wait_and_admin_holds_need_an_operator() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test().held(), 0).unwrap();
    assert!(st.schedule(1).starts.is_empty());
    assert_eq!(st.job(a).unwrap().reason, Reason::JobHeldUser);
    st.hold(&JobSelector::job(a), &Requester::admin()).unwrap();
    assert_eq!(st.job(a).unwrap().hold, Hold::Admin);
    assert!(
        st.release(&JobSelector::job(a), &Requester::user("alice"))
            .is_err()
    );
    st.release(&JobSelector::job(a), &Requester::admin())
        .unwrap();
    assert_eq!(started(&st.schedule(2)), vec![a]);
}

#[test]
fn passes_leave_held_jobs_alone_until_they_are_released() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let held: Vec<JobId> = (0..50)
        .map(|_| st.submit(JobSpec::test().held(), 0).unwrap())
        .collect();
    let by_admin = held[1];
    st.hold(&JobSelector::job(by_admin), &Requester::admin())
        .unwrap();
    let free = st.submit(JobSpec::test().cpus_per_task(8), 0).unwrap();
    let waits = st.submit(JobSpec::test().cpus_per_task(8), 0).unwrap();
    st.take_changes();
    let plan = st.schedule(1);
    assert_eq!(started(&plan), vec![free]);
    // Only the two unheld records were looked at, and the held ones still say why they wait.
    assert_eq!(plan.stats.considered, 2);
    assert_eq!(st.job(held[0]).unwrap().reason, Reason::JobHeldUser);
    assert_eq!(st.job(by_admin).unwrap().reason, Reason::JobHeldAdmin);
    assert_eq!(st.job(waits).unwrap().reason, Reason::Resources);
    assert_eq!(st.job(held[0]).unwrap().priority, 0);

    // A restart from records stored with another reason: the hold's comes back.
    let mut records: Vec<crate::Job> = st.jobs().cloned().collect();
    for j in records.iter_mut().filter(|j| j.hold != Hold::None) {
        j.reason = Reason::Priority;
    }
    let mut restored = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs: records,
        nodes: st.nodes().cloned().collect(),
        next_job_id: st.next_job_id(),
        assoc: Some(st.assoc().clone()),
        usage_charged_at: st.usage_charged_at(),
    })
    .unwrap();
    assert_eq!(restored.job(held[2]).unwrap().reason, Reason::JobHeldUser);
    assert_eq!(restored.job(by_admin).unwrap().reason, Reason::JobHeldAdmin);

    // Released, a job is looked at again: it starts once the node is free.
    st.release(&JobSelector::job(held[0]), &Requester::user("alice"))
        .unwrap();
    end(&mut st, free, 0, 2);
    st.cancel(&JobSelector::job(waits), &Requester::admin(), 2)
        .unwrap();
    let plan = st.schedule(3);
    assert_eq!(started(&plan), vec![held[0]]);
    assert_eq!(plan.stats.considered, 1);
    assert_consistent(&st);
    restored.schedule(3);
    assert_eq!(restored.job(held[3]).unwrap().reason, Reason::JobHeldUser);
}

#[test]
fn update_job_checks_permissions_and_validates() {
    use crate::state::JobUpdate;
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test().held(), 0).unwrap();
    let alice = Requester::user("alice");
    let raise = JobUpdate {
        time_limit: Some(Some(7200)),
        ..Default::default()
    };
    assert!(st.update_job(a, raise.clone(), &alice, 0).is_err());
    st.update_job(a, raise, &Requester::admin(), 0).unwrap();
    assert_eq!(st.job(a).unwrap().time_limit, Some(7200));
    st.update_job(
        a,
        JobUpdate {
            time_limit: Some(Some(60)),
            name: Some("renamed".into()),
            ..Default::default()
        },
        &alice,
        0,
    )
    .unwrap();
    assert_eq!(
        (
            st.job(a).unwrap().time_limit,
            st.job(a).unwrap().spec.name.as_str()
        ),
        (Some(60), "renamed")
    );
    assert!(
        st.update_job(
            a,
            JobUpdate {
                partition: Some("nope".into()),
                ..Default::default()
            },
            &alice,
            0
        )
        .is_err()
    );
    assert!(
        st.update_job(
            a,
            JobUpdate {
                priority: Some(Some(5)),
                ..Default::default()
            },
            &alice,
            0
        )
        .is_err()
    );
}

#[test]
fn requeue_of_a_running_job_brings_it_back_pending() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(0);
    let eff = st.requeue(a, &Requester::user("alice"), 5).unwrap();
    assert!(matches!(
        eff[0],
        Effect::Terminate {
            reason: SignalReason::Requeue,
            ..
        }
    ));
    let eff = st
        .job_ended_clean(
            a,
            JobOutcome {
                signal: 15,
                ..Default::default()
            },
            6,
        )
        .unwrap();
    assert!(matches!(&eff[0], Effect::RunEnded(r) if r.state == JobState::Requeued && r.requeued));
    assert_eq!(
        (state_of(&st, a), st.job(a).unwrap().restarts),
        (JobState::Pending, 1)
    );
    assert_eq!(started(&st.schedule(7)), vec![a]);
    end(&mut st, a, 0, 8);
    st.requeue(a, &Requester::admin(), 9).unwrap();
    assert_eq!(state_of(&st, a), JobState::Pending);
}

/// A pending job must stay small: the controller targets < 2 KB per pending job in total.
#[test]
fn a_pending_job_record_is_small() {
    let size = std::mem::size_of::<crate::Job>();
    // 576 plus one boxed pointer for the nodes a placeholder hands back (`releasing`).
    assert!(size <= 584, "Job is {size} bytes");
    let mut st = State::test_cluster(1, 8, 8000, 0);
    st.submit(JobSpec::test(), 0).unwrap();
    // Heap beyond the struct: the short strings (name, user, account, partition, qos).
    let job = st.jobs().next().unwrap();
    let heap: usize = [
        &job.spec.name,
        &job.spec.user,
        &job.spec.account,
        &job.spec.partition,
        &job.spec.qos,
    ]
    .iter()
    .map(|s| s.capacity())
    .sum();
    assert!(size + heap < 700, "{size} + {heap}");
}

#[test]
fn requeueing_a_finished_array_task_does_not_count_it_twice() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let arr = st.submit(JobSpec::test().array("0-1"), 0).unwrap();
    let plan = st.schedule(0);
    let (t0, t1) = (plan.starts[0].job, plan.starts[1].job);
    end(&mut st, t0, 1, 5);
    st.requeue(t0, &Requester::admin(), 6).unwrap();
    st.schedule(6);
    end(&mut st, t0, 0, 7);
    end(&mut st, t1, 0, 8);
    let a = st.job(arr).unwrap().array.as_ref().unwrap();
    assert_eq!((a.ok, a.not_ok, a.active), (2, 0, 0));
    assert_eq!(state_of(&st, arr), JobState::Completed);
}

#[test]
fn purge_drops_old_finished_records_only() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let a = st.submit(JobSpec::test(), 0).unwrap();
    let b = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(0);
    end(&mut st, a, 0, 10);
    st.take_changes();
    assert_eq!(st.purge_finished(11), vec![a]);
    assert!(st.job(a).is_none() && st.job(b).is_some());
    assert_eq!(st.take_changes().removed_jobs, vec![a]);
    // A dependency on a purged job counts as satisfied, as in Slurm.
    let c = st
        .submit(JobSpec::test().dependency(&format!("afterok:{b}")), 12)
        .unwrap();
    end(&mut st, b, 0, 13);
    st.purge_finished(14);
    assert_eq!(started(&st.schedule(14)), vec![c]);
}

#[test]
fn pending_demand_counts_array_indices_per_partition() {
    let mut st = State::test_cluster(1, 8, 8000, 8);
    st.submit(JobSpec::test().gpus(8), 0).unwrap();
    st.schedule(0);
    st.submit(JobSpec::test().gpus(2).array("0-9"), 1).unwrap();
    st.submit(JobSpec::test().nodes(1).gpus_per_node(4), 1)
        .unwrap();
    let d = st.pending_demand();
    assert_eq!(
        (d["batch"].jobs, d["batch"].gpus, d["batch"].nodes),
        (11, 24, 11)
    );
}

/// Slurm records who cancelled a job (sacct: `CANCELLED by 1000`): a pending job at once,
/// a running one when its kill lands; the controller's own cancels name nobody, and a
/// requeue forgets it.
#[test]
fn a_cancel_records_the_uid_that_asked() {
    let mut st = State::test_cluster(1, 8, 8_000, 0);
    let running = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(1);
    let pending = st.submit(JobSpec::test().held(), 2).unwrap();
    let quiet = st.submit(JobSpec::test().held(), 2).unwrap();
    let root = Requester::admin().with_uid(0);
    st.cancel(
        &JobSelector::job(pending),
        &Requester::admin().with_uid(1000),
        3,
    )
    .unwrap();
    st.cancel(&JobSelector::job(quiet), &Requester::admin(), 3)
        .unwrap();
    st.cancel(&JobSelector::job(running), &root, 3).unwrap();
    assert_eq!(state_of(&st, pending), JobState::Cancelled);
    assert_eq!(st.job(pending).unwrap().cancelled_by, Some(1000));
    assert_eq!(st.job(quiet).unwrap().cancelled_by, None);
    assert_eq!(st.job(running).unwrap().cancelled_by, Some(0));
    end(&mut st, running, 0, 4);
    assert_eq!(state_of(&st, running), JobState::Cancelled);
    assert_eq!(st.job(running).unwrap().cancelled_by, Some(0));
    st.requeue(running, &root, 5).unwrap();
    assert_eq!(st.job(running).unwrap().cancelled_by, None);
}
