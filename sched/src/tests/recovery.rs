//! Nodes and restarts: lost, drained and removed nodes, partitions built from host lists,
//! stale reports, and `State::restore` reconciling with the workers.

use super::*;
use crate::config::ClusterConfig;
use crate::effect::{Effect, SignalReason};
use crate::job::{JobSpec, Reason};
use crate::partition::Partition;
use crate::state::{NodeRegistration, RestoreInput};

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
