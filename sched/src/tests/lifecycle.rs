use super::*;
use crate::config::ClusterConfig;
use crate::effect::{Effect, SignalReason};
use crate::job::{Hold, JobSpec, Reason};
use crate::partition::Partition;
use crate::state::{JobSelector, NodeRegistration, Requester, RestoreInput, SubmitError};

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

#[test]
fn lost_nodes_requeue_or_fail_their_jobs() {
    let mut st = State::test_cluster(3, 8, 8000, 0);
    let requeued = st
        .submit(JobSpec::test().nodes(2).cpus_per_task(8), 0)
        .unwrap();
    let failed = st.submit(JobSpec::test().no_requeue(), 0).unwrap();
    st.schedule(0);
    assert_eq!(st.nodelist(st.job(requeued).unwrap()), "node-[01-02]");
    assert_eq!(st.node_names(st.job(failed).unwrap()), vec!["node-03"]);
    let effects = st.node_lost("node-01", "", 100).unwrap();
    assert!(effects.contains(&Effect::Terminate {
        job: requeued,
        nodes: vec![crate::NodeId(1)],
        reason: SignalReason::NodeFail,
        grace_s: 0
    }));
    let job = st.job(requeued).unwrap();
    assert_eq!(
        (job.state, job.restarts, job.alloc.is_none()),
        (JobState::Pending, 1, true)
    );
    assert!(
        effects.iter().any(
            |e| matches!(e, Effect::RunEnded(r) if r.state == JobState::NodeFail && r.requeued)
        )
    );
    assert_eq!(
        st.node_by_name("node-01").unwrap().state(),
        crate::node::NodeState::Down
    );
    // node-02's worker kills its part and reports it gone; node-01, lost, cannot: it stays
    // held (fail closed), but the job waits for it no more.
    assert!(effects.contains(&Effect::Cleanup {
        job: requeued,
        nodes: vec![crate::NodeId(0), crate::NodeId(1)],
    }));
    assert!(st.node_by_name("node-02").unwrap().is_completing());
    st.job_gone("node-02", requeued).unwrap();
    assert_eq!(st.job(requeued).unwrap().completing, None);
    assert!(st.node_by_name("node-01").unwrap().is_completing());
    st.node_lost("node-03", "worker gone", 101).unwrap();
    assert_eq!(
        (state_of(&st, failed), st.job(failed).unwrap().reason),
        (JobState::NodeFail, Reason::NodeDown)
    );
    assert_consistent(&st);
    // Only node-02 is up: the 2-node job waits.
    assert!(st.schedule(102).starts.is_empty());
    let effects = st
        .register_node(NodeRegistration::test("node-01", 8, 8000, 0), 103)
        .unwrap();
    // Back, node-01 is asked again for the processes of the run that ended while it was
    // away, and takes nothing until it answers.
    assert!(effects.contains(&Effect::Cleanup {
        job: requeued,
        nodes: vec![crate::NodeId(0)],
    }));
    assert!(st.schedule(103).starts.is_empty());
    st.clean_up(&effects);
    assert_eq!(started(&st.schedule(103)), vec![requeued]);
}

#[test]
fn drained_nodes_take_no_new_work() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    st.drain("node-01", "maintenance").unwrap();
    let a = st.submit(JobSpec::test().nodes(2), 0).unwrap();
    let b = st.submit(JobSpec::test(), 0).unwrap();
    let plan = st.schedule(0);
    assert_eq!(started(&plan), vec![b]);
    assert_eq!(plan.starts[0].nodes[0].name, "node-02");
    assert_eq!(
        st.node_by_name("node-01").unwrap().state(),
        crate::node::NodeState::Drained
    );
    assert!(st.drain("node-01", " ").is_err());
    st.resume("node-01").unwrap();
    end(&mut st, b, 0, 5);
    assert_eq!(started(&st.schedule(5)), vec![a]);
}

#[test]
fn restore_keeps_running_jobs_and_reconciles_with_workers() {
    let mut st = State::test_cluster(2, 8, 8000, 2);
    let a = st.submit(JobSpec::test().gpus(1), 0).unwrap();
    let b = st.submit(JobSpec::test().gpus(1).nodes(2), 0).unwrap();
    let pending = st
        .submit(JobSpec::test().cpus_per_task(8).nodes(2), 0)
        .unwrap();
    st.schedule(0);
    let jobs: Vec<_> = st.jobs().cloned().collect();
    let nodes: Vec<_> = st.nodes().cloned().collect();
    // Persisted records survive a serde round trip.
    let jobs: Vec<crate::Job> =
        serde_json::from_str(&serde_json::to_string(&jobs).unwrap()).unwrap();
    let mut restored = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs,
        nodes,
        next_job_id: st.next_job_id(),
        assoc: Some(st.assoc().clone()),
        usage_charged_at: st.usage_charged_at(),
    })
    .unwrap();
    assert_consistent(&restored);
    assert_eq!(state_of(&restored, a), JobState::Running);
    assert_eq!(
        restored.node_by_name("node-01").unwrap().state(),
        crate::node::NodeState::Unknown
    );
    assert!(
        restored.schedule(1).starts.is_empty(),
        "unknown nodes take no work"
    );
    // node-02 is not the batch host of b: it need not report it, only the stranger.
    let e2 = restored
        .register_node(
            NodeRegistration {
                running_jobs: vec![JobId(999)],
                ..NodeRegistration::test("node-02", 8, 8000, 2)
            },
            2,
        )
        .unwrap();
    assert_eq!(
        e2,
        vec![Effect::Abandon {
            job: JobId(999),
            node: crate::NodeId(1)
        }]
    );
    assert_eq!(state_of(&restored, b), JobState::Running);
    // node-01 hosts a and b but lost b while the controller was away.
    let e1 = restored
        .register_node(
            NodeRegistration {
                running_jobs: vec![a],
                ..NodeRegistration::test("node-01", 8, 8000, 2)
            },
            3,
        )
        .unwrap();
    assert!(e1.contains(&Effect::Terminate {
        job: b,
        nodes: vec![crate::NodeId(1)],
        reason: SignalReason::NodeFail,
        grace_s: 0
    }));
    assert_eq!(state_of(&restored, b), JobState::Pending);
    assert_eq!(state_of(&restored, a), JobState::Running);
    assert_eq!(
        restored.submit(JobSpec::test(), 4).unwrap(),
        JobId(pending.0 + 1)
    );
    assert_consistent(&restored);
}

#[test]
fn restore_rejects_broken_records() {
    let st = State::test_cluster(2, 8, 8000, 0);
    let mut nodes: Vec<_> = st.nodes().cloned().collect();
    nodes[1].id = crate::NodeId(5);
    let err = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs: vec![],
        nodes,
        next_job_id: 1,
        assoc: None,
        usage_charged_at: None,
    });
    assert!(err.is_err());
}

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
fn partitions_take_nodes_from_host_lists_and_registrations() {
    let mut cfg = ClusterConfig::default();
    let mut gpu = Partition::new("gpu");
    gpu.nodes = Some("node-[01-02]".into());
    gpu.priority_tier = 2;
    cfg.partitions.push(gpu);
    cfg.partitions.push(Partition::new("burst"));
    cfg.partitions.last_mut().unwrap().nodes = Some("none-0".into());
    let mut st = State::test_cluster_with(cfg, 3, 8, 8000, 0);
    st.register_node(
        NodeRegistration::test("extra", 8, 8000, 0).partitions(&["burst"]),
        0,
    )
    .unwrap();
    let names = |p: &str| {
        st.partition_nodes(p)
            .map(|n| n.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names("gpu"), vec!["node-01", "node-02"]);
    assert_eq!(names("batch").len(), 4);
    assert_eq!(names("burst"), vec!["extra"]);
    assert!(
        st.register_node(
            NodeRegistration::test("x", 8, 8000, 0).partitions(&["nope"]),
            0
        )
        .is_err()
    );
    // A job in the gpu partition never lands on node-03.
    let jobs: Vec<JobId> = (0..3)
        .map(|_| {
            st.submit(JobSpec::test().partition("gpu").cpus_per_task(8), 0)
                .unwrap()
        })
        .collect();
    let plan = st.schedule(0);
    assert_eq!(plan.starts.len(), 2);
    assert!(plan.starts.iter().all(|s| s.nodes[0].name != "node-03"));
    assert_eq!(st.job(jobs[2]).unwrap().reason, Reason::Resources);
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

#[test]
fn a_stale_end_report_from_a_lost_node_does_not_end_the_new_run() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let a = st.submit(JobSpec::test().cpus_per_task(8), 0).unwrap();
    st.schedule(0);
    let first = st.node_names(st.job(a).unwrap())[0].to_string();
    st.node_lost(&first, "", 10).unwrap();
    st.schedule(11);
    let second = st.node_names(st.job(a).unwrap())[0].to_string();
    assert_ne!(first, second);
    // The old worker returns and reports the end of the old run.
    let eff = st
        .job_ended_on(
            &first,
            a,
            JobOutcome {
                exit_code: 1,
                ..Default::default()
            },
            12,
        )
        .unwrap();
    assert!(eff.is_empty());
    assert_eq!(state_of(&st, a), JobState::Running);
    st.job_ended_on(&second, a, JobOutcome::default(), 13)
        .unwrap();
    assert_eq!(state_of(&st, a), JobState::Completed);
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

#[test]
fn removed_nodes_leave_queries_and_partitions_until_a_worker_registers_again() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let a = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(0);
    let host = st.node_names(st.job(a).unwrap())[0].to_owned();
    // Busy: refused, nothing changed.
    assert!(st.remove_node(&host).is_err());
    assert!(st.node_by_name(&host).is_some());
    end(&mut st, a, 0, 1);
    st.remove_node(&host).unwrap();
    assert!(st.node_by_name(&host).is_none());
    assert_eq!(st.nodes().count(), 1);
    assert!(
        st.partitions()
            .all(|p| st.partition_nodes(&p.name).all(|n| n.name != host))
    );
    // Work goes only to the remaining node.
    let b = st.submit(JobSpec::test().nodes(1), 2).unwrap();
    let plan = st.schedule(2);
    assert_eq!(started(&plan), vec![b]);
    assert_ne!(plan.starts[0].nodes[0].name, host);
    // Removal survives a restore (the record is persisted with the flag).
    let restored = State::restore(RestoreInput {
        config: st.config().clone(),
        jobs: st.jobs().cloned().collect(),
        nodes: st.nodes.clone(),
        next_job_id: st.next_job_id(),
        assoc: None,
        usage_charged_at: None,
    })
    .unwrap();
    assert!(restored.node_by_name(&host).is_none());
    // A worker registering under the name brings it back.
    st.register_node(NodeRegistration::test(&host, 8, 8000, 0), 3)
        .unwrap();
    assert!(
        st.node_by_name(&host)
            .is_some_and(|n| !n.partitions.is_empty())
    );
    assert_eq!(st.nodes().count(), 2);
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
