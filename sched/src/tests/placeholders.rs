//! `kube`-mode placeholders (the bridge's jobs) on nodes that are lost, set DOWN or drained.
//!
//! A placeholder's pods run under the kubelet, not the worker: losing the worker (or an
//! operator's DOWN) says nothing about whether the pods still run, and a drain does not make
//! a serving pod finish. So the node is marked to be handed back, the placeholder keeps it
//! (in `kube` mode) until the bridge has evicted the group's pods there and releases it, and
//! the placeholder runs on with its other nodes. A placeholder that would keep no node ends
//! as a whole: NODE_FAIL when its last node is lost.

use super::*;
use crate::NodeId;
use crate::effect::{Effect, SignalReason};
use crate::job::{JobSpec, KillReason, Reason};
use crate::node::{NodeMode, NodeState};
use crate::state::{JobSelector, NodeRegistration, Release, Requester};

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
fn a_lost_node_is_handed_back_alone_once_its_pods_are_gone() {
    let (mut st, p) = placeholder_on_two_nodes();
    // A batch job that fits either node: only the placeholder keeps it off them.
    let batch = st.submit(JobSpec::test(), 1).unwrap();
    assert!(st.schedule(1).starts.is_empty());

    let effects = st.node_lost("node-01", "Not responding", 100).unwrap();
    assert!(
        effects.is_empty(),
        "the placeholder keeps serving on node-02: {effects:?}"
    );
    let job = st.job(p).unwrap();
    assert_eq!((job.state, job.kill), (JobState::Running, None));
    assert_eq!(job.releasing_nodes(), &[NodeId(0)]);
    // Recorded as a job change, so the controller tells the bridge which node to clear.
    assert!(st.take_changes().jobs.contains(&p));
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    assert_eq!(st.node_by_name("node-01").unwrap().state(), NodeState::Down);
    assert_consistent(&st);

    // Neither node goes to batch work while the pods may still run on it.
    assert!(st.schedule(101).starts.is_empty());
    assert_eq!(state_of(&st, batch), JobState::Pending);

    // Set DOWN again (the operator retrying, a second timeout): nothing more to do.
    assert!(st.node_lost("node-01", "again", 110).unwrap().is_empty());
    assert_eq!(st.job(p).unwrap().releasing_nodes(), &[NodeId(0)]);

    // The bridge reports the pods on node-01 gone as of 150: the node leaves the job.
    assert_eq!(
        st.release_placeholder_nodes(p, &[NodeId(0)], 150).unwrap(),
        Release::Shrunk
    );
    let job = st.job(p).unwrap();
    assert_eq!((job.state, job.kill), (JobState::Running, None));
    assert!(job.releasing.is_none());
    assert_eq!(st.nodelist(job), "node-02");
    assert!(st.node_by_name("node-01").unwrap().jobs.is_empty());
    assert_eq!(st.node_by_name("node-01").unwrap().alloc, crate::Tres::ZERO);
    assert!(holds(&st, "node-02", p));
    assert_consistent(&st);
    // A repeat changes nothing.
    assert_eq!(
        st.release_placeholder_nodes(p, &[NodeId(0)], 160).unwrap(),
        Release::Nothing
    );

    // The group's last pods end at 300; usage: node-01's share until 150, node-02's until 300.
    let effects = st.job_ended_clean(p, JobOutcome::default(), 300).unwrap();
    let [Effect::RunEnded(rec)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!(
        (rec.state, rec.nodes.clone()),
        (JobState::Completed, vec![NodeId(1)])
    );
    let idx = st.assoc().user("alice", "root").unwrap();
    let part = st.config().fairshare.billing.rate(1, 0, 1);
    let usage = st.assoc().own_usage(idx);
    let ran = part * 150.0 + part * 300.0;
    assert!(
        usage > ran * 0.99 && usage <= ran,
        "charged {usage}, ran {ran}"
    );
    // node-01 stays DOWN; node-02 takes the batch job.
    let plan = st.schedule(301);
    assert_eq!(started(&plan), vec![batch]);
    assert_eq!(plan.starts[0].nodes[0].name, "node-02");
    assert_consistent(&st);
}

#[test]
fn a_lost_node_that_comes_back_stays_held_until_released() {
    let (mut st, p) = placeholder_on_two_nodes();
    st.node_lost("node-01", "Not responding", 100).unwrap();
    // The worker comes back before the bridge reports: it does not vouch for the pods
    // either way (they are not its), so the node stays with the placeholder.
    let effects = st
        .register_node(NodeRegistration::test("node-01", 8, 8_000, 2), 105)
        .unwrap();
    assert!(effects.is_empty(), "{effects:?}");
    let pinned = st
        .submit(JobSpec::test().nodelist(&["node-01"]), 106)
        .unwrap();
    assert!(st.schedule(106).starts.is_empty());
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    st.release_placeholder_nodes(p, &[NodeId(0)], 120).unwrap();
    assert_eq!(started(&st.schedule(121)), vec![pinned]);
    assert_eq!(st.node_by_name("node-01").unwrap().mode, NodeMode::Batch);
    assert_eq!(state_of(&st, p), JobState::Running);
    assert!(holds(&st, "node-02", p));
    assert_consistent(&st);
}

/// When the node lost is the last one a placeholder would keep, it ends NODE_FAIL as a
/// whole: every pod is evicted and every node stays held until the bridge reports them gone.
#[test]
fn losing_the_last_node_it_keeps_ends_the_placeholder_node_fail() {
    let (mut st, p) = placeholder_on_two_nodes();
    assert!(st.node_lost("node-01", "", 100).unwrap().is_empty());
    let effects = st.node_lost("node-02", "", 110).unwrap();
    assert_eq!(
        effects,
        vec![Effect::Terminate {
            job: p,
            nodes: vec![NodeId(0), NodeId(1)],
            reason: SignalReason::NodeFail,
            grace_s: 0,
        }]
    );
    let job = st.job(p).unwrap();
    assert_eq!(
        (job.state, job.kill, job.releasing.is_none()),
        (JobState::Running, Some(KillReason::NodeFail), true)
    );
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    let effects = st.job_ended_clean(p, JobOutcome::default(), 150).unwrap();
    let [Effect::RunEnded(rec)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    assert_eq!((rec.state, rec.end_time), (JobState::NodeFail, 150));
    assert_eq!(
        (state_of(&st, p), st.job(p).unwrap().reason),
        (JobState::NodeFail, Reason::NodeDown)
    );
    assert!(st.nodes().all(|n| n.jobs.is_empty()));
    assert_consistent(&st);
}

/// A one-node placeholder (a Deployment's pod) whose node is lost: NODE_FAIL, as before.
#[test]
fn a_one_node_placeholder_on_a_lost_node_ends_node_fail() {
    let mut st = State::test_cluster(1, 8, 8_000, 2);
    let p = st
        .submit(JobSpec::test().gpus_per_node(1).kube().no_requeue(), 0)
        .unwrap();
    st.schedule(0);
    let effects = st.node_lost("node-01", "", 10).unwrap();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(st.job(p).unwrap().kill, Some(KillReason::NodeFail));
    assert!(holds(&st, "node-01", p));
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
    assert!(st.job(p).unwrap().releasing.is_none());
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    st.job_ended_clean(p, JobOutcome::default(), 70).unwrap();
    assert_eq!(state_of(&st, p), JobState::Cancelled);
    assert!(st.nodes().all(|n| n.jobs.is_empty()));
}

/// A drain hands the node back as `kubectl drain` would (a serving pod never finishes on its
/// own): the placeholder runs on with its other node, and the node ends DRAINED.
#[test]
fn a_drained_node_is_handed_back_and_the_placeholder_runs_on() {
    let (mut st, p) = placeholder_on_two_nodes();
    st.drain("node-01", "maintenance").unwrap();
    let job = st.job(p).unwrap();
    assert_eq!((job.state, job.kill), (JobState::Running, None));
    assert_eq!(job.releasing_nodes(), &[NodeId(0)]);
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
    assert_eq!(
        st.release_placeholder_nodes(p, &[NodeId(0)], 20).unwrap(),
        Release::Shrunk
    );
    assert_eq!(
        st.node_by_name("node-01").unwrap().state(),
        NodeState::Drained
    );
    assert_eq!(state_of(&st, p), JobState::Running);
    assert!(holds(&st, "node-02", p));
    assert_consistent(&st);
}

/// Draining the only node of a placeholder asks for it all the same; releasing it is the
/// group's end (the caller ends the job as one whose pods are gone).
#[test]
fn releasing_every_node_it_holds_ends_the_placeholder() {
    let mut st = State::test_cluster(1, 8, 8_000, 2);
    let p = st
        .submit(JobSpec::test().gpus_per_node(1).kube().no_requeue(), 0)
        .unwrap();
    st.schedule(0);
    st.drain("node-01", "rollout").unwrap();
    assert_eq!(st.job(p).unwrap().releasing_nodes(), &[NodeId(0)]);
    assert_eq!(
        st.release_placeholder_nodes(p, &[NodeId(0)], 5).unwrap(),
        Release::EndsJob
    );
    // Nothing changed yet: ending it is the caller's.
    assert!(holds(&st, "node-01", p));
    assert_consistent(&st);
}

/// A release the controller did not ask for is refused and changes nothing: the bridge
/// cannot free a node whose pods the controller never asked to go.
#[test]
fn a_release_not_asked_for_is_refused() {
    let (mut st, p) = placeholder_on_two_nodes();
    let err = st
        .release_placeholder_nodes(p, &[NodeId(0)], 10)
        .unwrap_err();
    assert!(err.to_string().contains("not asked back"), "{err}");
    assert!(holds(&st, "node-01", p) && holds(&st, "node-02", p));
    st.drain("node-01", "maintenance").unwrap();
    // One asked, one not: all refused.
    assert!(
        st.release_placeholder_nodes(p, &[NodeId(0), NodeId(1)], 10)
            .is_err()
    );
    assert!(holds(&st, "node-01", p));
    let batch = st.submit(JobSpec::test().nodes(1), 0).unwrap();
    st.schedule(0);
    assert!(st.release_placeholder_nodes(batch, &[], 10).is_err());
    assert_consistent(&st);
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
