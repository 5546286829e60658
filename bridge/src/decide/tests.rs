//! The decisions, group by group state: all or nothing, staged gangs, endings, nodes asked
//! back, members' states.

use super::*;

fn m(name: &str, node: Option<&str>, state: MemberState) -> Member {
    Member {
        name: name.into(),
        rank: None,
        node: node.map(Into::into),
        state,
    }
}

fn waiting(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| m(&format!("p{i}"), None, MemberState::Live))
        .collect()
}

fn allocated(nodes: &[&str], ppn: u32) -> JobView {
    JobView::Allocated {
        job_id: 7,
        nodes: nodes.iter().map(|n| (*n).into()).collect(),
        pods_per_node: ppn,
        releasing: Vec::new(),
    }
}

fn asking_back(nodes: &[&str], back: &[&str]) -> JobView {
    JobView::Allocated {
        job_id: 7,
        nodes: nodes.iter().map(|n| (*n).into()).collect(),
        pods_per_node: 1,
        releasing: back.iter().map(|n| (*n).into()).collect(),
    }
}

/// A node asked back: only the group's pods there are evicted; the node is released
/// once the kubelet reports them stopped (never while one terminates), with the time
/// the last one stopped; the pods elsewhere keep running and nothing binds meanwhile.
#[test]
fn a_node_asked_back_is_cleared_of_the_groups_pods_then_released_alone() {
    let view = asking_back(&["k1", "k2"], &["k1"]);
    let live = vec![
        m("a", Some("k1"), MemberState::Live),
        m("b", Some("k2"), MemberState::Live),
    ];
    assert_eq!(
        decide(&live, Some(2), &view, 100),
        Decision::Evict {
            job_id: 7,
            pods: vec!["a".into()],
            why: EndReason::NodeReleased,
        }
    );
    // Evicted, still terminating: wait, even with a replacement pod waiting to bind.
    let stopping = vec![
        m("a", Some("k1"), MemberState::Terminating),
        m("b", Some("k2"), MemberState::Live),
        m("c", None, MemberState::Live),
    ];
    assert!(matches!(
        decide(&stopping, Some(2), &view, 101),
        Decision::Wait { .. }
    ));
    let stopped = vec![
        m("a", Some("k1"), MemberState::Finished { at: 104 }),
        m("b", Some("k2"), MemberState::Live),
        m("c", None, MemberState::Live),
    ];
    assert_eq!(
        decide(&stopped, Some(2), &view, 110),
        Decision::ReleaseNodes {
            job_id: 7,
            nodes: vec!["k1".into()],
            end_time: 104,
        }
    );
    // A node asked back where the group had nothing (any more): released at once.
    let elsewhere = vec![m("b", Some("k2"), MemberState::Live)];
    assert_eq!(
        decide(&elsewhere, Some(2), &view, 120),
        Decision::ReleaseNodes {
            job_id: 7,
            nodes: vec!["k1".into()],
            end_time: 120,
        }
    );
    // Released: the job runs on k2 alone; the replacement does not fit and waits.
    let after = vec![
        m("b", Some("k2"), MemberState::Live),
        m("c", None, MemberState::Live),
    ];
    assert!(matches!(
        decide(&after, Some(2), &allocated(&["k2"], 1), 121),
        Decision::Wait { .. }
    ));
}

#[test]
fn a_staged_gang_is_submitted_with_its_first_members_and_the_rest_bind_as_they_come() {
    // InOrder: only the leader exists; waiting for all four would wait forever.
    let leader = waiting(1);
    assert_eq!(
        decide_gang(&leader, Some(4), true, &JobView::Absent, 0),
        Decision::Submit
    );
    assert!(matches!(
        decide(&leader, Some(4), &JobView::Absent, 0),
        Decision::Unschedulable { .. }
    ));
    // The whole allocation is held: the leader binds now ...
    let d = decide_gang(&leader, Some(4), true, &allocated(&["k1", "k2"], 2), 0);
    assert_eq!(
        d,
        Decision::Bind {
            job_id: 7,
            bindings: vec![("p0".into(), "k1".into())],
        }
    );
    // ... and the workers, created once it runs, into the slots left.
    let mut later = vec![m("p0", Some("k1"), MemberState::Live)];
    later.extend((1..4).map(|i| m(&format!("w{i}"), None, MemberState::Live)));
    assert_eq!(
        decide_gang(&later, Some(4), true, &allocated(&["k1", "k2"], 2), 0),
        Decision::Bind {
            job_id: 7,
            bindings: vec![
                ("w1".into(), "k1".into()),
                ("w2".into(), "k2".into()),
                ("w3".into(), "k2".into()),
            ],
        }
    );
}

#[test]
fn a_gang_is_submitted_only_when_complete() {
    let d = decide(&waiting(3), Some(4), &JobView::Absent, 0);
    assert_eq!(
        d,
        Decision::Unschedulable {
            pods: vec!["p0".into(), "p1".into(), "p2".into()],
            message: "pod group has 3 of 4 pods; waiting for the rest".into(),
        }
    );
    assert_eq!(
        decide(&waiting(4), Some(4), &JobView::Absent, 0),
        Decision::Submit
    );
    assert!(matches!(
        decide(&waiting(4), None, &JobView::Absent, 0),
        Decision::Unschedulable { .. }
    ));
}

#[test]
fn a_queued_job_explains_itself_on_every_waiting_pod() {
    let d = decide(
        &waiting(2),
        Some(2),
        &JobView::Pending {
            job_id: 7,
            reason: "QOSMaxGRESPerUser".into(),
        },
        0,
    );
    assert_eq!(
        d,
        Decision::Unschedulable {
            pods: vec!["p0".into(), "p1".into()],
            message: "waiting in Tandem's queue: QOSMaxGRESPerUser".into(),
        }
    );
    // Not yet looked at by a scheduling pass (`None`): nothing to explain yet.
    let fresh = JobView::Pending {
        job_id: 7,
        reason: "None".into(),
    };
    assert!(matches!(
        decide(&waiting(2), Some(2), &fresh, 0),
        Decision::Wait { .. }
    ));
}

#[test]
fn a_queued_job_whose_pods_left_is_withdrawn() {
    let pending = JobView::Pending {
        job_id: 9,
        reason: "Priority".into(),
    };
    assert_eq!(
        decide(&[], None, &pending, 5),
        Decision::EndJob {
            job_id: 9,
            end_time: 5
        }
    );
}

#[test]
fn an_allocation_binds_every_pod_in_rank_order() {
    let mut pods = waiting(4);
    for (i, p) in pods.iter_mut().enumerate() {
        p.rank = Some(3 - i as u32);
    }
    let d = decide(&pods, Some(4), &allocated(&["k1", "k2"], 2), 0);
    assert_eq!(
        d,
        Decision::Bind {
            job_id: 7,
            bindings: vec![
                ("p3".into(), "k1".into()),
                ("p2".into(), "k1".into()),
                ("p1".into(), "k2".into()),
                ("p0".into(), "k2".into()),
            ],
        }
    );
}

#[test]
fn after_a_restart_mid_binding_the_rest_fill_the_free_slots() {
    let pods = vec![
        m("a", Some("k2"), MemberState::Live),
        m("b", None, MemberState::Live),
        m("c", None, MemberState::Live),
    ];
    let d = decide(&pods, Some(3), &allocated(&["k1", "k2"], 2), 0);
    assert_eq!(
        d,
        Decision::Bind {
            job_id: 7,
            bindings: vec![("b".into(), "k1".into()), ("c".into(), "k1".into())],
        }
    );
}

#[test]
fn all_or_none_when_the_allocation_is_too_small() {
    let d = decide(&waiting(3), Some(3), &allocated(&["k1"], 2), 0);
    assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
}

#[test]
fn a_terminating_pod_keeps_its_slot() {
    let pods = vec![
        m("old", Some("k1"), MemberState::Terminating),
        m("new", None, MemberState::Live),
    ];
    let d = decide(&pods, Some(1), &allocated(&["k1"], 1), 0);
    assert!(matches!(d, Decision::Wait { .. }), "{d:?}");
}

#[test]
fn pods_gone_end_the_job_at_the_last_stop() {
    let pods = vec![
        m("a", Some("k1"), MemberState::Finished { at: 100 }),
        m("b", Some("k1"), MemberState::Finished { at: 140 }),
    ];
    assert_eq!(
        decide(&pods, Some(2), &allocated(&["k1"], 2), 500),
        Decision::EndJob {
            job_id: 7,
            end_time: 140
        }
    );
    // Every pod deleted and gone from the API: the job ends now.
    assert_eq!(
        decide(&[], Some(2), &allocated(&["k1"], 2), 500),
        Decision::EndJob {
            job_id: 7,
            end_time: 500
        }
    );
}

#[test]
fn a_preempted_job_evicts_its_running_pods_and_replacements_start_over() {
    let pods = vec![
        m("a", Some("k1"), MemberState::Live),
        m("b", Some("k1"), MemberState::Terminating),
    ];
    let ended = JobView::Ended {
        job_id: 7,
        why: EndReason::Preempted,
    };
    assert_eq!(
        decide(&pods, Some(2), &ended, 0),
        Decision::Evict {
            job_id: 7,
            pods: vec!["a".into()],
            why: EndReason::Preempted
        }
    );
    let stopping = vec![m("b", Some("k1"), MemberState::Terminating)];
    assert!(matches!(
        decide(&stopping, Some(1), &ended, 0),
        Decision::Wait { .. }
    ));
    assert_eq!(decide(&waiting(1), Some(1), &ended, 0), Decision::Submit);
}

#[test]
fn an_ending_job_evicts_then_reports_the_pods_gone() {
    let ending = JobView::Ending {
        job_id: 7,
        why: EndReason::TimedOut,
    };
    let live = vec![m("a", Some("k1"), MemberState::Live)];
    assert_eq!(
        decide(&live, Some(1), &ending, 0),
        Decision::Evict {
            job_id: 7,
            pods: vec!["a".into()],
            why: EndReason::TimedOut
        }
    );
    let stopping = vec![m("a", Some("k1"), MemberState::Terminating)];
    assert!(matches!(
        decide(&stopping, Some(1), &ending, 0),
        Decision::Wait { .. }
    ));
    let gone = vec![m("a", Some("k1"), MemberState::Finished { at: 42 })];
    assert_eq!(
        decide(&gone, Some(1), &ending, 99),
        Decision::EndJob {
            job_id: 7,
            end_time: 42
        }
    );
}

#[test]
fn unknowns_fail_closed() {
    let pods = vec![m("a", Some("k1"), MemberState::Live)];
    for job in [JobView::Unknown, JobView::Absent, allocated(&["k9"], 1)] {
        let d = decide(&pods, Some(1), &job, 0);
        assert!(matches!(d, Decision::Wait { .. }), "{job:?} -> {d:?}");
    }
}

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn member_states_follow_the_pod() {
    let running = pod(serde_json::json!({
        "metadata": {"name": "a"},
        "spec": {"nodeName": "k1", "containers": []},
        "status": {"phase": "Running",
            "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]},
    }));
    assert_eq!(member_state(&running, None, 30, 100), MemberState::Live);
    // The node vanished: it keeps its slot for the grace period, then is released.
    assert_eq!(member_state(&running, Some(90), 30, 100), MemberState::Live);
    assert_eq!(
        member_state(&running, Some(50), 30, 100),
        MemberState::Finished { at: 80 }
    );
    let mut deleting = running.clone();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(95).unwrap(),
        ));
    assert_eq!(
        member_state(&deleting, None, 30, 100),
        MemberState::Terminating
    );
    // Deleted with its containers reported stopped but the phase left at `Running`
    // (kubelets before 1.27): stopped. Deleted before any status: still held.
    let mut stopped = deleting.clone();
    if let Some(st) = stopped.status.as_mut() {
        st.container_statuses = Some(vec![
            serde_json::from_value(serde_json::json!({"name": "c", "image": "i",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 137,
                    "finishedAt": "1970-01-01T00:01:39Z"}}}))
            .unwrap(),
        ]);
    }
    assert_eq!(
        member_state(&stopped, None, 30, 100),
        MemberState::Finished { at: 99 }
    );
    let mut unreported = deleting.clone();
    unreported.status = None;
    assert_eq!(
        member_state(&unreported, None, 30, 100),
        MemberState::Terminating
    );
    let done = pod(serde_json::json!({
        "metadata": {"name": "a"},
        "spec": {"nodeName": "k1", "containers": []},
        "status": {"phase": "Succeeded",
            "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": 0,
                "finishedAt": "1970-01-01T00:01:00Z"}}}]},
    }));
    assert_eq!(
        member_state(&done, None, 30, 100),
        MemberState::Finished { at: 60 }
    );
}

#[test]
fn a_pod_that_vanished_running_holds_its_slot_for_its_grace_and_a_margin() {
    let running = pod(serde_json::json!({
        "metadata": {"name": "a"},
        "spec": {"nodeName": "k1", "containers": [], "terminationGracePeriodSeconds": 8},
        "status": {"phase": "Running",
            "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]},
    }));
    // Force-deleted at 100 (deletion grace 0): the kubelet may take the spec's 8 s.
    let mut forced = running.clone();
    forced.metadata.deletion_grace_period_seconds = Some(0);
    assert_eq!(vanish_deadline(&forced, 5, 100), Some(113));
    assert_eq!(vanished_state(113, 112), MemberState::Terminating);
    assert_eq!(vanished_state(113, 113), MemberState::Finished { at: 113 });
    // Without a grace in the spec, Kubernetes' default 30 s.
    let mut default = running.clone();
    if let Some(s) = default.spec.as_mut() {
        s.termination_grace_period_seconds = None;
    }
    assert_eq!(vanish_deadline(&default, 5, 100), Some(135));
    // Nothing could run: never bound, finished, or its containers reported stopped.
    let mut unbound = running.clone();
    if let Some(s) = unbound.spec.as_mut() {
        s.node_name = None;
    }
    assert_eq!(vanish_deadline(&unbound, 5, 100), None);
    let mut failed = running.clone();
    if let Some(s) = failed.status.as_mut() {
        s.phase = Some("Failed".into());
    }
    assert_eq!(vanish_deadline(&failed, 5, 100), None);
    // A vanished pod's slot blocks a new member from binding onto a one-slot node.
    let pods = vec![
        m("gone", Some("k1"), vanished_state(113, 105)),
        m("new", None, MemberState::Live),
    ];
    assert!(matches!(
        decide(&pods, Some(1), &allocated(&["k1"], 1), 105),
        Decision::Wait { .. }
    ));
    // And keeps the job from ending before the deadline.
    let only = vec![m("gone", Some("k1"), vanished_state(113, 105))];
    assert!(matches!(
        decide(&only, Some(1), &allocated(&["k1"], 1), 105),
        Decision::Wait { .. }
    ));
    let later = vec![m("gone", Some("k1"), vanished_state(113, 120))];
    assert_eq!(
        decide(&later, Some(1), &allocated(&["k1"], 1), 120),
        Decision::EndJob {
            job_id: 7,
            end_time: 113
        }
    );
}
