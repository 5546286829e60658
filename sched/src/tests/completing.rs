//! COMPLETING: an ended batch job keeps each of its nodes until that node's worker reports
//! the job's processes gone; nodes whose processes outlive the kill are drained.

use super::*;
use crate::job::JobSpec;
use crate::node::NodeState;
use crate::state::KILL_TASK_FAILED;

fn node_state(st: &State, name: &str) -> NodeState {
    st.node_by_name(name).unwrap().state()
}

/// The batch host reports the end with its own processes gone: it is free at once, while
/// the other node, where a step may still run, stays held until its worker reports.
#[test]
fn the_other_node_of_a_two_node_job_stays_held_until_it_reports() {
    let mut st = State::test_cluster(2, 8, 8000, 2);
    let id = st
        .submit(
            JobSpec::test().nodes(2).cpus_per_task(8).gpus_per_node(2),
            0,
        )
        .unwrap();
    assert_eq!(started(&st.schedule(0)), vec![id]);
    let effects = st
        .job_ended_on(
            "node-01",
            id,
            JobOutcome {
                processes_gone: true,
                ..Default::default()
            },
            10,
        )
        .unwrap();
    assert!(effects.contains(&Effect::Cleanup {
        job: id,
        nodes: vec![crate::NodeId(1)],
    }));
    let job = st.job(id).unwrap();
    // The final state is decided (and accounted) now; squeue shows CG until the end.
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.shown_state(), JobState::Completing);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::RunEnded(r) if r.state == JobState::Completed))
    );
    assert_eq!(node_state(&st, "node-01"), NodeState::Idle);
    assert_eq!(node_state(&st, "node-02"), NodeState::Completing);
    assert_eq!(NodeState::Completing.short(), "comp");
    let n2 = st.node_by_name("node-02").unwrap();
    assert_eq!(
        (n2.alloc.cpus, n2.gpus_in_use),
        (8, 0b11),
        "still allocated to the job"
    );
    assert_consistent(&st);
    // A repeated report from the batch host changes nothing.
    st.job_gone("node-01", id).unwrap();
    assert_eq!(node_state(&st, "node-02"), NodeState::Completing);
    st.job_gone("node-02", id).unwrap();
    let job = st.job(id).unwrap();
    assert_eq!(job.shown_state(), JobState::Completed);
    assert_eq!(node_state(&st, "node-02"), NodeState::Idle);
    assert_eq!(st.node_by_name("node-02").unwrap().alloc, crate::Tres::ZERO);
    assert_consistent(&st);
}

/// Without the batch host's word (an old worker, or its cgroup not yet empty), the batch
/// host is held too: every node must report.
#[test]
fn an_end_without_processes_gone_holds_every_node() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let id = st.submit(JobSpec::test(), 0).unwrap();
    st.schedule(0);
    let effects = st.job_ended(id, JobOutcome::default(), 5).unwrap();
    assert!(effects.contains(&Effect::Cleanup {
        job: id,
        nodes: vec![crate::NodeId(0)],
    }));
    assert_eq!(node_state(&st, "node-01"), NodeState::Completing);
    st.job_gone("node-01", id).unwrap();
    assert_eq!(node_state(&st, "node-01"), NodeState::Idle);
}

#[test]
fn a_pending_job_never_starts_on_a_completing_node() {
    let mut st = State::test_cluster(1, 8, 8000, 0);
    let first = st.submit(JobSpec::test().cpus_per_task(2), 0).unwrap();
    st.schedule(0);
    st.job_ended(first, JobOutcome::default(), 5).unwrap();
    // Six CPUs are free, but the node still has the first job's processes.
    let small = st.submit(JobSpec::test(), 6).unwrap();
    let placeholder = st.submit(JobSpec::test().kube(), 6).unwrap();
    assert!(st.schedule(7).starts.is_empty());
    assert_eq!(state_of(&st, small), JobState::Pending);
    assert_eq!(state_of(&st, placeholder), JobState::Pending);
    assert_eq!(
        st.node_by_name("node-01").unwrap().mode,
        crate::node::NodeMode::Batch
    );
    assert!(
        !st.node_by_name("node-01")
            .unwrap()
            .accepts_mode(crate::node::NodeMode::Kube),
        "no mode change while a job is COMPLETING there"
    );
    st.job_gone("node-01", first).unwrap();
    assert_eq!(started(&st.schedule(8)), vec![small]);
    assert_consistent(&st);
}

/// Slurm's UnkillableStepTimeout: processes still there that long after the end drain the
/// node, "Kill task failed"; the job keeps it until they are gone, and the node stays
/// drained until an administrator resumes it.
#[test]
fn a_node_whose_processes_survive_the_kill_is_drained() {
    let mut st = State::test_cluster(2, 8, 8000, 0);
    let id = st.submit(JobSpec::test().nodes(2), 0).unwrap();
    st.schedule(0);
    st.job_ended_on(
        "node-01",
        id,
        JobOutcome {
            processes_gone: true,
            ..Default::default()
        },
        100,
    )
    .unwrap();
    assert!(
        st.drain_unkillable(159, 60).is_empty(),
        "not before the timeout"
    );
    assert_eq!(st.drain_unkillable(160, 60), vec!["node-02".to_string()]);
    let n2 = st.node_by_name("node-02").unwrap();
    assert_eq!(n2.reason.as_deref(), Some(KILL_TASK_FAILED));
    assert_eq!(n2.state(), NodeState::Draining);
    assert_eq!(st.job(id).unwrap().shown_state(), JobState::Completing);
    assert!(st.drain_unkillable(200, 60).is_empty(), "drained once");
    // Resumed while the processes are still there: it still takes nothing.
    st.resume("node-02").unwrap();
    assert_eq!(node_state(&st, "node-02"), NodeState::Completing);
    st.drain_unkillable(201, 60);
    let other = st.submit(JobSpec::test().nodes(2), 202).unwrap();
    assert!(st.schedule(202).starts.is_empty());
    // The processes finally die: the job ends; the node stays drained.
    st.job_gone("node-02", id).unwrap();
    assert_eq!(st.job(id).unwrap().shown_state(), JobState::Completed);
    assert_eq!(node_state(&st, "node-02"), NodeState::Drained);
    assert!(st.schedule(203).starts.is_empty());
    st.resume("node-02").unwrap();
    assert_eq!(started(&st.schedule(204)), vec![other]);
    assert_consistent(&st);
}

/// The hold survives a controller restart: the node record carries it.
#[test]
fn a_completing_node_is_restored_held() {
    let mut st = State::test_cluster(1, 8, 8000, 2);
    let id = st
        .submit(JobSpec::test().cpus_per_task(4).gpus_per_node(1), 0)
        .unwrap();
    st.schedule(0);
    st.job_ended(id, JobOutcome::default(), 5).unwrap();
    // Persisted records survive a serde round trip.
    let jobs: Vec<crate::Job> =
        serde_json::from_str(&serde_json::to_string(&st.jobs().collect::<Vec<_>>()).unwrap())
            .unwrap();
    let nodes: Vec<crate::node::Node> =
        serde_json::from_str(&serde_json::to_string(&st.nodes().collect::<Vec<_>>()).unwrap())
            .unwrap();
    let mut back = State::restore(crate::state::RestoreInput {
        config: st.config().clone(),
        jobs,
        nodes,
        next_job_id: st.next_job_id(),
        assoc: Some(st.assoc().clone()),
        usage_charged_at: st.usage_charged_at(),
    })
    .unwrap();
    let n = back.node_by_name("node-01").unwrap();
    assert_eq!(
        (n.alloc.cpus, n.gpus_in_use, n.is_completing()),
        (4, 1, true)
    );
    assert_eq!(back.job(id).unwrap().shown_state(), JobState::Completing);
    back.job_gone("node-01", id).unwrap();
    assert_eq!(
        back.node_by_name("node-01").unwrap().alloc,
        crate::Tres::ZERO
    );
}
