//! Every worker-set decision, without a server.

use super::*;

const NOW: i64 = 1_000_000;

fn pod(node: &str) -> WorkerPod {
    WorkerPod {
        name: format!("ws-{node}"),
        node: node.to_owned(),
        phase: PodPhase::Running,
        terminating: false,
        template_hash: "h1".into(),
        drain: None,
    }
}

trait PodExt {
    fn pending(self) -> Self;
    fn hash(self, h: &str) -> Self;
    fn marked(self, since: i64, why: DrainFor) -> Self;
    fn terminating(self) -> Self;
}

impl PodExt for WorkerPod {
    fn pending(mut self) -> Self {
        self.phase = PodPhase::Pending;
        self
    }
    fn hash(mut self, h: &str) -> Self {
        self.template_hash = h.into();
        self
    }
    fn marked(mut self, since: i64, why: DrainFor) -> Self {
        self.drain = Some((since, why));
        self
    }
    fn terminating(mut self) -> Self {
        self.terminating = true;
        self
    }
}

fn node(name: &str) -> BatchNode {
    BatchNode {
        name: name.into(),
        state: NodeState::Idle,
        drain: false,
        reason: String::new(),
        running_jobs: 0,
        busy_until: None,
        kube_mode: false,
    }
}

trait NodeExt {
    fn busy(self, jobs: u32, until: Option<i64>) -> Self;
    fn drained(self, reason: &str) -> Self;
    fn down(self) -> Self;
}

impl NodeExt for BatchNode {
    fn busy(mut self, jobs: u32, until: Option<i64>) -> Self {
        self.running_jobs = jobs;
        self.busy_until = until;
        self.state = NodeState::Allocated;
        self
    }
    fn drained(mut self, reason: &str) -> Self {
        self.drain = true;
        self.reason = reason.into();
        self.state = if self.running_jobs > 0 {
            NodeState::Draining
        } else {
            NodeState::Drained
        };
        self
    }
    fn down(mut self) -> Self {
        self.state = NodeState::Down;
        self
    }
}

fn want(replicas: u32) -> Desired {
    Desired {
        replicas,
        template_hash: "h1".into(),
        drain_deadline_s: 600,
        max_unavailable: 1,
        deleting: false,
        set: "ns/ws".into(),
    }
}

fn seen(pods: Vec<WorkerPod>, nodes: Vec<BatchNode>) -> Observed {
    let members = pods.iter().map(|p| p.node.clone()).collect();
    Observed {
        pods,
        nodes: Lookup::from_nodes(nodes),
        members,
        free_nodes: vec![],
        now: NOW,
    }
}

fn ours(why: DrainFor) -> String {
    drain_reason(why, "ns/ws")
}

fn has(p: &Plan, a: &Action) -> bool {
    p.actions.contains(a)
}

fn deleted(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::DeletePod { pod } => Some(pod.clone()),
            _ => None,
        })
        .collect()
}

fn marked(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Mark { pod, .. } => Some(pod.clone()),
            _ => None,
        })
        .collect()
}

fn created(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::CreatePod { node } => Some(node.clone()),
            _ => None,
        })
        .collect()
}

fn reasons(p: &Plan) -> Vec<&'static str> {
    p.events.iter().map(|e| e.reason).collect()
}

// === scale out ===

#[test]
fn scale_out_creates_one_pod_per_free_node() {
    let mut obs = seen(vec![pod("n1")], vec![node("n1")]);
    obs.free_nodes = vec!["n2".into(), "n3".into(), "n4".into()];
    let p = plan(&want(3), &obs);
    assert_eq!(created(&p), vec!["n2", "n3"]);
    assert!(reasons(&p).contains(&"ScaledOut"));
    assert!(deleted(&p).is_empty());
}

#[test]
fn scale_out_beyond_the_free_nodes_says_so() {
    let mut obs = seen(vec![], vec![]);
    obs.free_nodes = vec!["n1".into()];
    let p = plan(&want(3), &obs);
    assert_eq!(created(&p), vec!["n1"]);
    assert!(
        p.problems
            .iter()
            .any(|m| m.contains("2 worker(s) cannot be placed")),
        "{:?}",
        p.problems
    );
    assert!(reasons(&p).contains(&"NoNodeAvailable"));
}

#[test]
fn nothing_to_do_when_as_desired() {
    let p = plan(
        &want(2),
        &seen(vec![pod("n1"), pod("n2")], vec![node("n1"), node("n2")]),
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(p.events.is_empty());
}

#[test]
fn a_running_worker_not_registered_yet_is_looked_at_again() {
    let p = plan(
        &want(2),
        &seen(vec![pod("n1"), pod("n2")], vec![node("n1")]),
    );
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(
        p.waiting
            .iter()
            .any(|w| w.contains("not registered") && w.contains(&pod("n2").name)),
        "{:?}",
        p.waiting
    );
    assert!(p.requeue_after_s.is_some_and(|s| s <= DRAIN_POLL_S));
    // Down counts as not up; a pod not started yet brings its own pod events.
    let p = plan(
        &want(2),
        &seen(
            vec![pod("n1").pending(), pod("n2")],
            vec![node("n2").down()],
        ),
    );
    assert_eq!(p.waiting.len(), 1, "{:?}", p.waiting);
}

// === scale in: victim choice ===

#[test]
fn scale_in_prefers_unstarted_then_idle_then_soonest_ending() {
    let obs = seen(
        vec![pod("a"), pod("b"), pod("c"), pod("d").pending(), pod("e")],
        vec![
            node("a").busy(1, Some(NOW + 500)),
            node("b").busy(2, Some(NOW + 100)),
            node("c"),
            node("e").busy(1, None),
        ],
    );
    // Remove 3 of 5: d (never started), c (idle), b (ends soonest).
    let p = plan(&want(2), &obs);
    assert_eq!(marked(&p), vec!["ws-d", "ws-c", "ws-b"]);
    let p = plan(&want(1), &obs);
    assert_eq!(
        marked(&p),
        vec!["ws-d", "ws-c", "ws-b", "ws-a"],
        "no-limit job goes last"
    );
    // One Event per victim, each naming its pod, so a recorder keeps them apart.
    let victims: Vec<_> = p
        .events
        .iter()
        .filter(|e| e.reason == "VictimChosen")
        .map(|e| e.related.clone())
        .collect();
    assert_eq!(
        victims,
        ["ws-d", "ws-c", "ws-b", "ws-a"]
            .map(|n| Some(crate::plan::Related::Pod(n.into())))
            .to_vec()
    );
}

#[test]
fn a_chosen_idle_victim_is_drained_and_deleted_once_drained() {
    let obs = seen(
        vec![pod("a"), pod("b")],
        vec![node("a"), node("b").busy(1, Some(NOW + 50))],
    );
    let p = plan(&want(1), &obs);
    assert_eq!(marked(&p), vec!["ws-a"]);
    assert!(has(
        &p,
        &Action::Drain {
            node: "a".into(),
            reason: ours(DrainFor::ScaleIn)
        }
    ));
    assert!(
        deleted(&p).is_empty(),
        "not deleted before the controller reports it drained"
    );
    // Next look: drained and idle -> deleted.
    let obs = seen(
        vec![pod("a").marked(NOW, DrainFor::ScaleIn), pod("b")],
        vec![
            node("a").drained(&ours(DrainFor::ScaleIn)),
            node("b").busy(1, Some(NOW + 50)),
        ],
    );
    let p = plan(&want(1), &obs);
    assert_eq!(deleted(&p), vec!["ws-a"]);
    assert!(reasons(&p).contains(&"WorkerDrained"));
}

#[test]
fn a_busy_victim_keeps_its_pod_until_its_jobs_end() {
    let obs = seen(
        vec![pod("a").marked(NOW - 10, DrainFor::ScaleIn)],
        vec![
            node("a")
                .busy(1, Some(NOW + 100))
                .drained(&ours(DrainFor::ScaleIn)),
        ],
    );
    let p = plan(&want(0), &obs);
    assert!(deleted(&p).is_empty());
    assert!(
        !p.actions.iter().any(|a| matches!(a, Action::Drain { .. })),
        "already drained"
    );
    assert!(
        p.waiting.iter().any(|w| w.contains("drains: 1 job(s)")),
        "{:?}",
        p.waiting
    );
    assert!(p.requeue_after_s.is_some_and(|s| s <= DRAIN_POLL_S));
}

// === drain deadline ===

#[test]
fn past_the_deadline_the_node_goes_down_then_the_pod_is_deleted() {
    let obs = seen(
        vec![pod("a").marked(NOW - 601, DrainFor::ScaleIn)],
        vec![node("a").busy(1, None).drained(&ours(DrainFor::ScaleIn))],
    );
    let p = plan(&want(0), &obs);
    let down = p
        .actions
        .iter()
        .position(|a| matches!(a, Action::Down { node, .. } if node == "a"));
    let del = p
        .actions
        .iter()
        .position(|a| matches!(a, Action::DeletePod { pod } if pod == "ws-a"));
    assert!(
        down.is_some() && del.is_some() && down < del,
        "{:?}",
        p.actions
    );
    assert!(reasons(&p).contains(&"DrainDeadlinePassed"));
}

#[test]
fn before_the_deadline_nothing_is_forced() {
    let obs = seen(
        vec![pod("a").marked(NOW - 599, DrainFor::ScaleIn)],
        vec![node("a").busy(1, None).drained(&ours(DrainFor::ScaleIn))],
    );
    let p = plan(&want(0), &obs);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::Down { .. } | Action::DeletePod { .. }))
    );
}

// === fail closed (slurm-operator PR #79) ===

#[test]
fn a_failed_lookup_never_counts_as_drained() {
    let mut obs = seen(
        vec![
            pod("a").marked(NOW - 10_000, DrainFor::ScaleIn),
            pod("b").pending(),
        ],
        vec![],
    );
    obs.nodes = Lookup::Failed("connection refused".into());
    let p = plan(&want(0), &obs);
    // Only the never-started pod may go; the running worker waits, even past its deadline.
    assert_eq!(deleted(&p), vec!["ws-b"]);
    assert!(!p.actions.iter().any(|a| matches!(
        a,
        Action::Down { .. } | Action::RemoveNode { .. } | Action::Forget { .. }
    )));
    assert!(p.problems.iter().any(|m| m.contains("lookup failed")));
}

#[test]
fn a_failed_lookup_chooses_no_running_victim() {
    let mut obs = seen(vec![pod("a"), pod("b")], vec![]);
    obs.nodes = Lookup::Failed("timeout".into());
    let p = plan(&want(1), &obs);
    assert!(marked(&p).is_empty());
    assert!(
        p.waiting
            .iter()
            .any(|w| w.contains("once the controller answers"))
    );
}

// === only the operator's own drains are cleared ===

#[test]
fn only_drains_with_the_operator_prefix_are_cleared() {
    let obs = seen(
        vec![pod("a"), pod("b")],
        vec![
            node("a").drained(&ours(DrainFor::ScaleIn)),
            node("b").drained("bad DIMM, see ticket 42"),
        ],
    );
    let p = plan(&want(2), &obs);
    assert!(has(&p, &Action::Resume { node: "a".into() }));
    assert!(
        !has(&p, &Action::Resume { node: "b".into() }),
        "an admin's drain stays"
    );
}

#[test]
fn scaling_back_out_cancels_a_scale_in_before_creating_pods() {
    let mut obs = seen(
        vec![pod("a"), pod("b").marked(NOW - 5, DrainFor::ScaleIn)],
        vec![
            node("a"),
            node("b")
                .busy(1, Some(NOW + 100))
                .drained(&ours(DrainFor::ScaleIn)),
        ],
    );
    obs.free_nodes = vec!["c".into()];
    let p = plan(&want(2), &obs);
    assert!(has(&p, &Action::Unmark { pod: "ws-b".into() }));
    assert!(created(&p).is_empty(), "the draining worker stays instead");
    // Next look, the mark gone: the operator's drain is cleared.
    let obs = seen(
        vec![pod("a"), pod("b")],
        vec![
            node("a"),
            node("b")
                .busy(1, Some(NOW + 100))
                .drained(&ours(DrainFor::ScaleIn)),
        ],
    );
    assert!(has(
        &plan(&want(2), &obs),
        &Action::Resume { node: "b".into() }
    ));
}

// === lost pod ===

#[test]
fn a_lost_pod_is_replaced_on_its_node() {
    // n2's pod vanished (deleted by someone, node failure); it is still a member.
    let mut obs = seen(vec![pod("n1")], vec![node("n1"), node("n2").down()]);
    obs.members = vec!["n1".into(), "n2".into()];
    obs.free_nodes = vec!["n3".into()];
    let p = plan(&want(2), &obs);
    assert_eq!(
        created(&p),
        vec!["n2"],
        "comes back under the same node name"
    );
    assert!(reasons(&p).contains(&"PodReplaced"));
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RemoveNode { .. }))
    );
}

#[test]
fn an_ended_pod_is_deleted_and_replaced_once_gone() {
    let mut ended = pod("n1");
    ended.phase = PodPhase::Ended;
    let p = plan(&want(1), &seen(vec![ended], vec![node("n1").down()]));
    assert_eq!(deleted(&p), vec!["ws-n1"]);
    assert!(
        created(&p).is_empty(),
        "the node is still occupied by the old pod"
    );
    assert!(reasons(&p).contains(&"WorkerEnded"));
}

#[test]
fn no_new_pod_on_a_node_whose_old_pod_is_still_terminating() {
    let mut obs = seen(vec![pod("n1").terminating()], vec![node("n1")]);
    obs.free_nodes = vec![];
    let p = plan(&want(1), &obs);
    assert!(created(&p).is_empty());
}

// === removal from the controller ===

#[test]
fn a_removed_workers_node_is_removed_from_the_controller() {
    let mut obs = seen(
        vec![pod("n1")],
        vec![node("n1"), node("n2").drained(&ours(DrainFor::ScaleIn))],
    );
    obs.members = vec!["n1".into(), "n2".into(), "n9".into()];
    let p = plan(&want(1), &obs);
    assert!(has(&p, &Action::RemoveNode { node: "n2".into() }));
    assert!(
        has(&p, &Action::Forget { node: "n9".into() }),
        "unknown to the controller: just forgotten"
    );
    assert!(reasons(&p).contains(&"NodeRemoved"));
}

#[test]
fn a_gone_pods_node_with_jobs_goes_down_and_is_removed_on_a_later_pass() {
    let mut obs = seen(vec![], vec![node("n2").busy(1, Some(NOW + 10))]);
    obs.members = vec!["n2".into()];
    let p = plan(&want(0), &obs);
    assert!(has(
        &p,
        &Action::Down {
            node: "n2".into(),
            reason: format!("{DRAIN_REASON_PREFIX} worker pod gone"),
        }
    ));
    // Removal waits for the controller to report the node free: asked now, it would be
    // refused while a placeholder holds the node.
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RemoveNode { .. })),
        "{:?}",
        p.actions
    );
    assert_eq!(p.requeue_after_s, Some(1), "looked at again soon");
    // Once DOWN and free (its batch jobs requeued or failed), the node is removed.
    let mut obs = seen(vec![], vec![node("n2").down()]);
    obs.members = vec!["n2".into()];
    let p = plan(&want(0), &obs);
    assert_eq!(p.actions, vec![Action::RemoveNode { node: "n2".into() }]);
}

fn kube_mode(mut n: BatchNode) -> BatchNode {
    n.kube_mode = true;
    n
}

#[test]
fn a_down_node_still_holding_bridged_pods_is_waited_for_and_the_pass_goes_on() {
    // n2: pod gone, DOWN, its placeholder held until the bridge reports the pods gone.
    // n3: pod gone, free: removed in the same pass.
    let mut obs = seen(
        vec![pod("n0")],
        vec![
            node("n0"),
            kube_mode(node("n2").busy(1, None).down()),
            node("n3").drained(&ours(DrainFor::ScaleIn)),
        ],
    );
    obs.members = vec!["n0".into(), "n2".into(), "n3".into()];
    let p = plan(&want(1), &obs);
    assert!(
        !p.actions.iter().any(|a| match a {
            Action::Down { node, .. } | Action::RemoveNode { node } => node == "n2",
            _ => false,
        }),
        "neither DOWN again nor a removal the controller refuses: {:?}",
        p.actions
    );
    assert!(has(&p, &Action::RemoveNode { node: "n3".into() }));
    assert!(
        p.waiting
            .iter()
            .any(|w| w.contains("n2") && w.contains("bridged pods")),
        "{:?}",
        p.waiting
    );
    assert!(
        p.problems.is_empty(),
        "waiting is not a problem: {:?}",
        p.problems
    );
    assert_eq!(p.requeue_after_s, Some(DRAIN_POLL_S));
    assert!(
        !p.events.iter().any(|e| e.type_ == EventType::Warning),
        "no warning on every pass: {:?}",
        p.events
    );

    // Deleting the set: not finished while the node is held.
    let mut d = want(0);
    d.deleting = true;
    let mut obs = seen(vec![], vec![kube_mode(node("n2").busy(1, None).down())]);
    obs.members = vec!["n2".into()];
    let p = plan(&d, &obs);
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert!(!p.finished);
}

#[test]
fn a_lost_pods_event_says_what_happens_to_batch_jobs_and_bridged_pods() {
    let note = |n: BatchNode| {
        let mut obs = seen(vec![], vec![n]);
        obs.members = vec!["n2".into()];
        let p = plan(&want(0), &obs);
        let e = p
            .events
            .iter()
            .find(|e| e.reason == "WorkerPodLost")
            .cloned()
            .expect("an event about the lost pod");
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.related, Some(Related::Node("n2".into())));
        e.note
    };
    let batch = note(node("n2").busy(2, Some(NOW + 10)));
    assert!(
        batch.contains("requeued") && batch.contains("NODE_FAIL"),
        "{batch}"
    );
    let bridged = note(kube_mode(node("n2").busy(1, None)));
    assert!(
        bridged.contains("evicts") && bridged.contains("held until they are gone"),
        "{bridged}"
    );
    assert!(
        !bridged.contains("requeued"),
        "bridged pods are not requeued: {bridged}"
    );
}

#[test]
fn a_refused_removal_is_waited_for_and_other_failures_stop_the_pass() {
    let rm = Action::RemoveNode { node: "n2".into() };
    match on_failure(
        &rm,
        true,
        "node n2 holds bridged pods (placeholder job(s) 7)",
    ) {
        OnFailure::Wait(w) => assert!(
            w.contains("n2") && w.contains("placeholder job(s) 7"),
            "{w}"
        ),
        OnFailure::Stop => panic!("a refused removal is a wait"),
    }
    assert_eq!(on_failure(&rm, false, "unavailable"), OnFailure::Stop);
    let down = Action::Down {
        node: "n2".into(),
        reason: "r".into(),
    };
    assert_eq!(on_failure(&down, true, "x"), OnFailure::Stop);
}

// === rollout ===

#[test]
fn a_template_change_drains_outdated_workers_one_at_a_time_idle_first() {
    let obs = seen(
        vec![pod("a").hash("h0"), pod("b").hash("h0"), pod("c")],
        vec![node("a").busy(1, Some(NOW + 100)), node("b"), node("c")],
    );
    let p = plan(&want(3), &obs);
    assert_eq!(
        marked(&p),
        vec!["ws-b"],
        "one at a time (maxUnavailable 1), idle first"
    );
    assert!(has(
        &p,
        &Action::Drain {
            node: "b".into(),
            reason: ours(DrainFor::Rollout)
        }
    ));
    assert!(deleted(&p).is_empty());
    assert!(reasons(&p).contains(&"RolloutDrain"));
}

#[test]
fn a_rollout_never_deletes_a_worker_with_running_jobs() {
    let obs = seen(
        vec![
            pod("a").hash("h0").marked(NOW - 100, DrainFor::Rollout),
            pod("b").hash("h0"),
        ],
        vec![
            node("a")
                .busy(1, Some(NOW + 100))
                .drained(&ours(DrainFor::Rollout)),
            node("b"),
        ],
    );
    let p = plan(&want(2), &obs);
    assert!(deleted(&p).is_empty());
    assert!(marked(&p).is_empty(), "budget used by the draining worker");
}

#[test]
fn a_drained_rollout_worker_is_replaced_on_the_same_node_and_resumed() {
    // Drained and idle: pod deleted.
    let obs = seen(
        vec![pod("a").hash("h0").marked(NOW, DrainFor::Rollout)],
        vec![node("a").drained(&ours(DrainFor::Rollout))],
    );
    let p = plan(&want(1), &obs);
    assert_eq!(deleted(&p), vec!["ws-a"]);
    // Gone: recreated on node a, not removed from the controller.
    let mut obs = seen(
        vec![],
        vec![node("a").drained(&ours(DrainFor::Rollout)).down()],
    );
    obs.members = vec!["a".into()];
    obs.free_nodes = vec!["z".into()];
    let p = plan(&want(1), &obs);
    assert_eq!(created(&p), vec!["a"]);
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a, Action::RemoveNode { .. }))
    );
    // New pod registered: the operator's drain is cleared.
    let obs = seen(
        vec![pod("a")],
        vec![node("a").drained(&ours(DrainFor::Rollout))],
    );
    let p = plan(&want(1), &obs);
    assert!(has(&p, &Action::Resume { node: "a".into() }));
}

// === deletion ===

#[test]
fn deleting_the_set_drains_everything_then_finishes() {
    let mut d = want(3);
    d.deleting = true;
    let obs = seen(
        vec![pod("a"), pod("b")],
        vec![node("a"), node("b").busy(1, Some(NOW + 10))],
    );
    let p = plan(&d, &obs);
    assert_eq!(marked(&p).len(), 2);
    assert!(!p.finished);
    let obs = seen(
        vec![
            pod("a").marked(NOW, DrainFor::Delete),
            pod("b").marked(NOW, DrainFor::Delete),
        ],
        vec![
            node("a").drained(&ours(DrainFor::Delete)),
            node("b")
                .busy(1, Some(NOW + 10))
                .drained(&ours(DrainFor::Delete)),
        ],
    );
    let p = plan(&d, &obs);
    assert_eq!(deleted(&p), vec!["ws-a"]);
    assert!(!p.finished);
    // Pods gone: nodes removed; finished once the controller no longer has them.
    let mut obs = seen(vec![], vec![node("a").drained(&ours(DrainFor::Delete))]);
    obs.members = vec!["a".into(), "b".into()];
    let p = plan(&d, &obs);
    assert!(has(&p, &Action::RemoveNode { node: "a".into() }));
    assert!(has(&p, &Action::Forget { node: "b".into() }));
    let mut obs = seen(vec![], vec![]);
    obs.members = vec![];
    assert!(plan(&d, &obs).finished);
    // Never finished on a failed lookup.
    obs.nodes = Lookup::Failed("x".into());
    assert!(!plan(&d, &obs).finished);
}

#[test]
fn ready_needs_a_registered_up_node() {
    let nodes = Lookup::from_nodes(vec![node("a"), node("b").down()]);
    assert!(ready(&pod("a"), &nodes));
    assert!(!ready(&pod("b"), &nodes));
    assert!(!ready(&pod("c"), &nodes));
    assert!(!ready(&pod("a").pending(), &nodes));
}
