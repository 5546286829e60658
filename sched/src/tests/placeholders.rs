//! `kube`-mode placeholders (the bridge's jobs) on nodes that are lost, set DOWN or drained.
//!
//! A placeholder's pods run under the kubelet, not the worker: losing the worker (or an
//! operator's DOWN) says nothing about whether the pods still run. So the placeholder is not
//! ended on the spot; it is marked ending NODE_FAIL (the bridge evicts its pods) and keeps
//! every node it holds, in `kube` mode, until the bridge reports the pods gone.

use super::*;
use crate::effect::{Effect, SignalReason};
use crate::job::{JobSpec, KillReason, Reason};
use crate::node::{NodeMode, NodeState};
use crate::state::{JobSelector, NodeRegistration, Requester};

/// Two 8-CPU, 2-GPU nodes; a placeholder (as the controller makes them: never requeued)
/// running on both, one GPU a node.
fn placeholder_on_two_nodes() -> (State, JobId) {
    let mut st = State::test_cluster(2, 8, 8_000, 2);
    let p = st
        .submit(
            JobSpec::test()
                .nodes(2)
                .gpus_per_node(1)
                .kube()
                .no_requeue(),
            0,
        )
        .unwrap();
    assert_eq!(started(&st.schedule(0)), vec![p]);
    assert_eq!(st.nodelist(st.job(p).unwrap()), "node-[01-02]");
    st.take_changes();
    (st, p)
}

fn holds(st: &State, node: &str, job: JobId) -> bool {
    let n = st.node_by_name(node).unwrap();
    n.jobs.contains(&job) && n.mode == NodeMode::Kube
}

#[test]
fn a_lost_node_leaves_its_placeholder_ending_on_all_its_nodes_until_the_pods_are_gone() {
    let (mut st, p) = placeholder_on_two_nodes();
    // A batch job that fits either node: only the placeholder keeps it off them.
    let batch = st.submit(JobSpec::test(), 1).unwrap();
    assert!(st.schedule(1).starts.is_empty());

    let effects = st.node_lost("node-01", "Not responding", 100).unwrap();
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::RunEnded(_))),
        "the placeholder must not end before its pods are gone: {effects:?}"
    );
    // The pods of every node, the lost one's included (its kubelet may be alive), are to go.
    assert_eq!(
        effects,
        vec![Effect::Terminate {
            job: p,
            nodes: vec![crate::NodeId(0), crate::NodeId(1)],
            reason: SignalReason::NodeFail,
            grace_s: 0,
        }]
    );
    let job = st.job(p).unwrap();
    assert_eq!(
        (job.state, job.kill, job.end_time),
        (JobState::Running, Some(KillReason::NodeFail), None)
    );
    // Recorded as a job change, so the controller announces the ending to the bridge.
    assert!(st.take_changes().jobs.contains(&p));
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    assert_eq!(st.node_by_name("node-01").unwrap().state(), NodeState::Down);
    assert_consistent(&st);

    // The survivor is not handed to batch work while the pods may still run there.
    assert!(st.schedule(101).starts.is_empty());
    assert_eq!(state_of(&st, batch), JobState::Pending);
    assert!(holds(&st, "node-02", p));

    // Set DOWN again (the operator retrying, a second timeout): nothing more to do.
    assert!(st.node_lost("node-01", "again", 110).unwrap().is_empty());
    assert_eq!(st.job(p).unwrap().kill, Some(KillReason::NodeFail));

    // The bridge reports the pods gone: the placeholder ends NODE_FAIL then, and is charged
    // until then.
    let effects = st.job_ended_clean(p, JobOutcome::default(), 150).unwrap();
    let [Effect::RunEnded(rec)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(
        (rec.state, rec.end_time, rec.requeued),
        (JobState::NodeFail, 150, false)
    );
    let job = st.job(p).unwrap();
    assert_eq!(
        (job.state, job.reason, job.end_time),
        (JobState::NodeFail, Reason::NodeDown, Some(150))
    );
    let idx = st.assoc().user("alice", "root").unwrap();
    let rate = st.config().fairshare.billing.rate(2, 0, 2);
    let usage = st.assoc().own_usage(idx);
    assert!(
        usage > rate * 149.0 && usage <= rate * 150.0,
        "charged until the pods were gone: {usage} vs {}",
        rate * 150.0
    );

    // Both nodes are free now; the lost one stays DOWN, the survivor takes the batch job.
    assert!(st.node_by_name("node-01").unwrap().jobs.is_empty());
    assert_eq!(st.node_by_name("node-01").unwrap().state(), NodeState::Down);
    let plan = st.schedule(151);
    assert_eq!(started(&plan), vec![batch]);
    assert_eq!(plan.starts[0].nodes[0].name, "node-02");
    assert_eq!(st.node_by_name("node-02").unwrap().mode, NodeMode::Batch);
    assert_consistent(&st);
}

#[test]
fn a_lost_node_that_comes_back_stays_kube_while_the_placeholder_ends() {
    let (mut st, p) = placeholder_on_two_nodes();
    st.node_lost("node-01", "Not responding", 100).unwrap();
    // The worker comes back before the bridge reports: it does not vouch for the pods
    // either way (they are not its), so the placeholder keeps ending and keeps the node.
    let effects = st
        .register_node(NodeRegistration::test("node-01", 8, 8_000, 2), 105)
        .unwrap();
    assert!(effects.is_empty(), "{effects:?}");
    assert_eq!(
        (state_of(&st, p), st.job(p).unwrap().kill),
        (JobState::Running, Some(KillReason::NodeFail))
    );
    let pinned = st
        .submit(JobSpec::test().nodelist(&["node-01"]), 106)
        .unwrap();
    assert!(st.schedule(106).starts.is_empty());
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    st.job_ended_clean(p, JobOutcome::default(), 120).unwrap();
    assert_eq!(state_of(&st, p), JobState::NodeFail);
    assert_eq!(started(&st.schedule(121)), vec![pinned]);
    assert_eq!(st.node_by_name("node-01").unwrap().mode, NodeMode::Batch);
    assert_consistent(&st);
}

#[test]
fn a_placeholder_already_ending_keeps_its_reason_when_a_node_is_lost() {
    let (mut st, p) = placeholder_on_two_nodes();
    st.cancel(&JobSelector::job(p), &Requester::admin(), 50)
        .unwrap();
    assert_eq!(st.job(p).unwrap().kill, Some(KillReason::Cancel));
    // The eviction is already asked for: losing a node neither re-asks nor ends the job.
    assert!(st.node_lost("node-02", "", 60).unwrap().is_empty());
    assert_eq!(
        (state_of(&st, p), st.job(p).unwrap().kill),
        (JobState::Running, Some(KillReason::Cancel))
    );
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    st.job_ended_clean(p, JobOutcome::default(), 70).unwrap();
    assert_eq!(state_of(&st, p), JobState::Cancelled);
    assert!(st.nodes().all(|n| n.jobs.is_empty()));
}

#[test]
fn a_drained_node_lets_its_placeholder_run_on() {
    let (mut st, p) = placeholder_on_two_nodes();
    st.drain("node-01", "maintenance").unwrap();
    let job = st.job(p).unwrap();
    assert_eq!((job.state, job.kill), (JobState::Running, None));
    assert_eq!(
        st.node_by_name("node-01").unwrap().state(),
        NodeState::Draining
    );
    // No new work lands on the draining node, kube or batch.
    let more = st
        .submit(
            JobSpec::test()
                .gpus_per_node(1)
                .kube()
                .nodelist(&["node-01"]),
            10,
        )
        .unwrap();
    assert!(st.schedule(10).starts.is_empty());
    assert_eq!(state_of(&st, more), JobState::Pending);
    // The pods finish: the placeholder completes and the node is DRAINED.
    st.job_ended_clean(p, JobOutcome::default(), 20).unwrap();
    assert_eq!(state_of(&st, p), JobState::Completed);
    assert_eq!(
        st.node_by_name("node-01").unwrap().state(),
        NodeState::Drained
    );
}

/// A node holding batch work and a lost one holding a placeholder, lost together (a
/// controller restart after both workers died): batch work ends NODE_FAIL at once as before.
#[test]
fn batch_jobs_on_lost_nodes_still_end_at_once() {
    let mut st = State::test_cluster(3, 8, 8_000, 2);
    let p = st
        .submit(JobSpec::test().gpus_per_node(1).kube().no_requeue(), 0)
        .unwrap();
    let b = st
        .submit(JobSpec::test().nodes(2).cpus_per_task(8).no_requeue(), 0)
        .unwrap();
    st.schedule(0);
    let kube_node = st.node_names(st.job(p).unwrap())[0].to_owned();
    let batch_nodes: Vec<String> = st
        .node_names(st.job(b).unwrap())
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    assert!(!batch_nodes.contains(&kube_node));
    let effects = st.node_lost(&batch_nodes[0], "", 10).unwrap();
    assert!(
        effects.iter().any(
            |e| matches!(e, Effect::RunEnded(r) if r.job == b && r.state == JobState::NodeFail)
        )
    );
    assert_eq!(
        (state_of(&st, b), st.job(b).unwrap().reason),
        (JobState::NodeFail, Reason::NodeDown)
    );
    st.node_lost(&kube_node, "", 11).unwrap();
    assert_eq!(state_of(&st, p), JobState::Running);
    assert_consistent(&st);
}
