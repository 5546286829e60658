use super::*;
use crate::config::ClusterConfig;
use crate::job::{JobSpec, PreemptMode, Reason};
use crate::node::NodeMode;
use crate::qos::Qos;
use crate::state::NodeRegistration;

fn two_gpu_nodes() -> State {
    State::test_cluster(2, 32, 64_000, 8)
}

/// A (8 GPUs on node-01 until 1000) and B (2 GPUs on node-02 until 500) run; C needs both
/// whole nodes, so it is reserved at 1000. Small jobs may use node-02's spare GPUs only if
/// they end by then.
#[test]
fn small_jobs_backfill_only_when_they_cannot_delay_the_reservation() {
    let mut st = two_gpu_nodes();
    let a = st
        .submit(JobSpec::test().gpus(8).time(Some(1000)), 0)
        .unwrap();
    let b = st
        .submit(JobSpec::test().gpus(2).time(Some(500)), 0)
        .unwrap();
    assert_eq!(started(&st.schedule(0)), vec![a, b]);
    let c = st
        .submit(
            JobSpec::test().nodes(2).gpus_per_node(8).time(Some(1000)),
            1,
        )
        .unwrap();
    let d = st
        .submit(JobSpec::test().gpus(4).time(Some(399)), 1)
        .unwrap();
    let e = st
        .submit(JobSpec::test().gpus(2).time(Some(2000)), 1)
        .unwrap();
    let f = st
        .submit(JobSpec::test().gpus(2).time(Some(899)), 1)
        .unwrap();
    let plan = st.schedule(1);
    assert_eq!(started(&plan), vec![d, f]);
    assert_eq!(
        plan.stats.reservations, 2,
        "C and E each hold a reservation"
    );
    assert_eq!(st.job(c).unwrap().reason, Reason::Resources);
    assert_eq!(st.job(e).unwrap().reason, Reason::Priority);
    assert_consistent(&st);

    // Time passes; short jobs end; a newcomer that would overrun 1000 is held back.
    end(&mut st, d, 0, 400);
    end(&mut st, b, 0, 500);
    let g = st
        .submit(JobSpec::test().gpus(2).time(Some(600)), 500)
        .unwrap();
    let h = st
        .submit(JobSpec::test().gpus(2).time(Some(100)), 500)
        .unwrap();
    assert_eq!(started(&st.schedule(500)), vec![h]);
    assert_eq!(state_of(&st, g), JobState::Pending);
    end(&mut st, h, 0, 600);
    end(&mut st, f, 0, 900);
    assert!(st.schedule(900).starts.is_empty());
    // A ends at its limit: C starts at its reserved time, not later.
    st.job_ended_clean(
        a,
        JobOutcome {
            timed_out: true,
            signal: 15,
            ..Default::default()
        },
        1000,
    )
    .unwrap();
    let plan = st.schedule(1000);
    assert_eq!(started(&plan)[0], c);
    assert_eq!(plan.starts[0].nodes.len(), 2);
    assert_eq!(plan.starts[0].nodes[0].gpus, (0..8).collect::<Vec<_>>());
}

#[test]
fn without_backfill_lower_priority_jobs_wait_in_order() {
    let mut cfg = ClusterConfig::default();
    cfg.sched.backfill = false;
    let mut st = State::test_cluster_with(cfg, 2, 32, 64_000, 8);
    st.submit(JobSpec::test().gpus(8).time(Some(1000)), 0)
        .unwrap();
    st.schedule(0);
    let big = st
        .submit(JobSpec::test().nodes(2).gpus_per_node(8), 1)
        .unwrap();
    let small = st
        .submit(JobSpec::test().gpus(1).time(Some(10)), 1)
        .unwrap();
    assert!(st.schedule(1).starts.is_empty());
    assert_eq!(st.job(big).unwrap().reason, Reason::Resources);
    assert_eq!(st.job(small).unwrap().reason, Reason::Priority);
}

#[test]
fn gangs_get_all_their_nodes_at_once_or_none() {
    let mut st = State::test_cluster(3, 8, 8000, 0);
    let blocker = st
        .submit(JobSpec::test().cpus_per_task(8).time(Some(100)), 0)
        .unwrap();
    st.schedule(0);
    let gang = st
        .submit(JobSpec::test().nodes(3).time(Some(100)), 1)
        .unwrap();
    assert!(st.schedule(1).starts.is_empty());
    assert!(
        st.nodes().filter(|n| n.jobs.is_empty()).count() == 2,
        "no partial allocation"
    );
    end(&mut st, blocker, 0, 50);
    let plan = st.schedule(50);
    assert_eq!(started(&plan), vec![gang]);
    let names: Vec<&str> = plan.starts[0]
        .nodes
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(names, vec!["node-01", "node-02", "node-03"]);
}

#[test]
fn packing_prefers_the_fullest_node_that_fits() {
    let mut st = State::test_cluster(3, 32, 64_000, 8);
    let a = st.submit(JobSpec::test().gpus(6), 0).unwrap();
    let b = st.submit(JobSpec::test().gpus(2), 0).unwrap();
    let c = st.submit(JobSpec::test().gpus(4), 0).unwrap();
    let plan = st.schedule(0);
    let node_of = |id| {
        plan.starts.iter().find(|s| s.job == id).unwrap().nodes[0]
            .name
            .clone()
    };
    assert_eq!(node_of(a), "node-01");
    assert_eq!(node_of(b), "node-01", "fills node-01's 2 spare GPUs");
    assert_eq!(node_of(c), "node-02");
}

#[test]
fn exclusive_jobs_take_whole_empty_nodes() {
    let mut st = State::test_cluster(2, 32, 64_000, 8);
    let small = st.submit(JobSpec::test().gpus(1), 0).unwrap();
    let excl = st.submit(JobSpec::test().exclusive(), 0).unwrap();
    let plan = st.schedule(0);
    assert_eq!(started(&plan), vec![small, excl]);
    assert_eq!(plan.starts[1].nodes[0].name, "node-02");
    assert_eq!(plan.starts[1].nodes[0].gpus.len(), 8);
    assert_eq!(plan.starts[1].nodes[0].cpus, 32);
    let more = st.submit(JobSpec::test(), 1).unwrap();
    assert_eq!(plan.starts.len(), 2);
    let plan = st.schedule(1);
    assert_eq!(
        plan.starts[0].nodes[0].name, "node-01",
        "{more} shares node-01, not the exclusive node"
    );
}

#[test]
fn features_gpu_types_and_node_lists_restrict_placement() {
    let mut st = State::new(ClusterConfig::default()).unwrap();
    st.register_node(
        NodeRegistration::test("a100-1", 32, 64_000, 8)
            .gpu_type("a100")
            .features(&["ib"]),
        0,
    )
    .unwrap();
    st.register_node(
        NodeRegistration::test("h100-1", 32, 64_000, 8).gpu_type("h100"),
        0,
    )
    .unwrap();
    st.register_node(NodeRegistration::test("cpu-1", 32, 64_000, 0), 0)
        .unwrap();
    let h = st
        .submit(JobSpec::test().gpus(1).gpu_type("h100"), 0)
        .unwrap();
    let ib = st.submit(JobSpec::test().constraint("ib"), 0).unwrap();
    let pinned = st.submit(JobSpec::test().nodelist(&["cpu-1"]), 0).unwrap();
    let excluded = st
        .submit(
            JobSpec::test().with(|s| s.exclude = vec!["a100-1".into(), "h100-1".into()]),
            0,
        )
        .unwrap();
    let plan = st.schedule(0);
    let node_of = |id| {
        plan.starts.iter().find(|s| s.job == id).unwrap().nodes[0]
            .name
            .clone()
    };
    assert_eq!(node_of(h), "h100-1");
    assert_eq!(node_of(ib), "a100-1");
    assert_eq!(node_of(pinned), "cpu-1");
    assert_eq!(node_of(excluded), "cpu-1");
}

#[test]
fn node_modes_separate_kube_and_batch_work() {
    let mut st = State::test_cluster(3, 32, 64_000, 8);
    let k1 = st.submit(JobSpec::test().gpus(4).kube(), 0).unwrap();
    let plan = st.schedule(0);
    assert_eq!(plan.starts[0].nodes[0].name, "node-01");
    assert_eq!(st.node_by_name("node-01").unwrap().mode, NodeMode::Kube);
    // A batch job does not share the kube node although it has room.
    let b1 = st.submit(JobSpec::test().gpus(2), 1).unwrap();
    // Another kube job prefers the node already in kube mode.
    let k2 = st.submit(JobSpec::test().gpus(2).kube(), 1).unwrap();
    let plan = st.schedule(1);
    let node_of = |id| {
        plan.starts.iter().find(|s| s.job == id).unwrap().nodes[0]
            .name
            .clone()
    };
    assert_eq!(node_of(b1), "node-02");
    assert_eq!(node_of(k2), "node-01");
    // A kube job that no longer fits node-01 takes the empty node-03 (switching it), not the
    // batch node-02 that has work.
    let k3 = st.submit(JobSpec::test().gpus(4).kube(), 2).unwrap();
    let plan = st.schedule(2);
    assert_eq!(plan.starts[0].nodes[0].name, "node-03");
    assert_eq!(st.node_by_name("node-03").unwrap().mode, NodeMode::Kube);
    assert_consistent(&st);
    // A batch job pinned to node-01 waits until the kube work there is gone.
    let pinned = st
        .submit(JobSpec::test().nodelist(&["node-01"]), 3)
        .unwrap();
    assert!(st.schedule(3).starts.is_empty());
    end(&mut st, k1, 0, 4);
    assert!(
        st.schedule(4).starts.is_empty(),
        "k2 still holds node-01 in kube mode"
    );
    end(&mut st, k2, 0, 5);
    assert_eq!(started(&st.schedule(5)), vec![pinned]);
    assert_eq!(st.node_by_name("node-01").unwrap().mode, NodeMode::Batch);
    let _ = k3;
    assert_consistent(&st);
}

#[test]
fn a_mode_switch_is_reserved_like_any_other_wait() {
    // One node in kube mode until 100; a batch job reserves it for 100; a later kube job may
    // not slip in if it would run past 100.
    let mut st = State::test_cluster(1, 32, 64_000, 8);
    let k = st
        .submit(JobSpec::test().gpus(1).kube().time(Some(100)), 0)
        .unwrap();
    st.schedule(0);
    let batch = st.submit(JobSpec::test().gpus(1), 1).unwrap();
    let late = st
        .submit(JobSpec::test().gpus(1).kube().time(Some(500)), 1)
        .unwrap();
    let early = st
        .submit(JobSpec::test().gpus(1).kube().time(Some(50)), 1)
        .unwrap();
    assert_eq!(started(&st.schedule(1)), vec![early]);
    assert_eq!(state_of(&st, late), JobState::Pending);
    end(&mut st, k, 0, 100);
    end(&mut st, early, 0, 51);
    assert_eq!(started(&st.schedule(100))[0], batch);
}

fn preempt_config() -> ClusterConfig {
    let mut cfg = ClusterConfig::default();
    let mut low = Qos::new("low");
    low.preempt_mode = PreemptMode::Requeue;
    low.grace_time_s = 30;
    let mut high = Qos::new("high");
    high.priority = 100;
    high.preempt = vec!["low".into()];
    cfg.qos.push(low);
    cfg.qos.push(high);
    cfg
}

/// A scancel during a preemption grace ends the job now (no grace) and for good: it is
/// CANCELLED, not requeued, and the preemptor starts when it is gone.
#[test]
fn cancel_during_a_preemption_grace_ends_the_job_now_as_cancelled() {
    use crate::Effect;
    use crate::effect::SignalReason;
    use crate::state::{JobSelector, Requester};
    let mut st = State::test_cluster_with(preempt_config(), 1, 32, 64_000, 8);
    let low = st.submit(JobSpec::test().gpus(8).qos("low"), 0).unwrap();
    st.schedule(0);
    let high = st
        .submit(JobSpec::test().gpus(8).qos("high").user("bob"), 10)
        .unwrap();
    assert_eq!(st.schedule(10).preemptions[0].grace_s, 30);
    let eff = st
        .cancel(&JobSelector::job(low), &Requester::user("alice"), 12)
        .unwrap();
    assert!(
        matches!(
            &eff[..],
            [Effect::Terminate { job, reason: SignalReason::Cancel, grace_s: 0, .. }] if *job == low
        ),
        "{eff:?}"
    );
    let eff = st
        .job_ended_clean(
            low,
            JobOutcome {
                cancelled: true,
                signal: 15,
                ..Default::default()
            },
            13,
        )
        .unwrap();
    assert!(
        matches!(&eff[0], Effect::RunEnded(r) if r.state == JobState::Cancelled && !r.requeued),
        "{eff:?}"
    );
    assert_eq!(state_of(&st, low), JobState::Cancelled);
    assert_eq!(started(&st.schedule(13)), vec![high]);
}

#[test]
fn a_high_qos_job_preempts_the_most_recent_low_job_which_is_requeued() {
    let mut st = State::test_cluster_with(preempt_config(), 1, 32, 64_000, 8);
    let l1 = st.submit(JobSpec::test().gpus(4).qos("low"), 0).unwrap();
    st.schedule(0);
    let l2 = st.submit(JobSpec::test().gpus(4).qos("low"), 10).unwrap();
    st.schedule(10);
    let h = st
        .submit(JobSpec::test().gpus(4).qos("high").user("bob"), 20)
        .unwrap();
    let plan = st.schedule(20);
    assert!(plan.starts.is_empty());
    assert_eq!(plan.preemptions.len(), 1);
    let p = &plan.preemptions[0];
    assert_eq!(
        (p.job, p.by, p.mode, p.grace_s),
        (l2, h, PreemptMode::Requeue, 30)
    );
    // While the victim stops, no further victims are taken.
    assert!(st.schedule(21).preemptions.is_empty());
    let eff = st
        .job_ended_clean(
            l2,
            JobOutcome {
                cancelled: true,
                signal: 15,
                ..Default::default()
            },
            25,
        )
        .unwrap();
    assert!(
        matches!(&eff[0], crate::Effect::RunEnded(r) if r.state == JobState::Preempted && r.requeued)
    );
    assert_eq!(state_of(&st, l2), JobState::Pending);
    assert_eq!(state_of(&st, l1), JobState::Running);
    let plan = st.schedule(25);
    assert_eq!(started(&plan), vec![h]);
    assert_eq!(state_of(&st, l2), JobState::Pending);
}

#[test]
fn preempt_mode_cancel_ends_the_victim_for_good_and_same_qos_is_never_a_victim() {
    let mut cfg = preempt_config();
    cfg.qos
        .iter_mut()
        .find(|q| q.name == "low")
        .unwrap()
        .preempt_mode = PreemptMode::Cancel;
    let mut st = State::test_cluster_with(cfg, 1, 32, 64_000, 8);
    let l = st.submit(JobSpec::test().gpus(8).qos("low"), 0).unwrap();
    st.schedule(0);
    let h1 = st.submit(JobSpec::test().gpus(8).qos("high"), 1).unwrap();
    let plan = st.schedule(1);
    assert_eq!(plan.preemptions[0].job, l);
    st.job_ended_clean(
        l,
        JobOutcome {
            cancelled: true,
            ..Default::default()
        },
        2,
    )
    .unwrap();
    assert_eq!(state_of(&st, l), JobState::Preempted);
    assert_eq!(started(&st.schedule(2)), vec![h1]);
    let _h2 = st.submit(JobSpec::test().gpus(8).qos("high"), 3).unwrap();
    assert!(st.schedule(3).preemptions.is_empty());
}

mod reservation_property {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// A big job blocked behind random running work gets a reservation; whatever small
        /// jobs arrive later (and whenever running jobs end, at or before their limits), it
        /// starts no later than that reservation, and its reservation never moves later.
        #[test]
        fn a_job_never_starts_past_its_reservation(
            running in proptest::collection::vec((1u32..=4, 10u64..500), 4..12),
            arrivals in proptest::collection::vec((1u32..=4, 5u64..800, 0u64..400), 0..30),
            early in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let mut st = State::test_cluster(4, 16, 64_000, 4);
            for (g, limit) in &running {
                st.submit(JobSpec::test().gpus(*g).time(Some(*limit)), 0).unwrap();
            }
            st.schedule(0);
            let big = st.submit(JobSpec::test().nodes(4).gpus_per_node(4).time(Some(100)), 1).unwrap();
            let plan = st.schedule(1);
            if started(&plan).contains(&big) {
                return Ok(());
            }
            let mut promised = plan.reservations.iter().find(|r| r.job == big).map(|r| r.start).unwrap_or(i64::MAX);
            prop_assert!(promised < i64::MAX, "the big job got a reservation");
            let mut now = 1i64;
            let mut k = 0usize;
            let mut arrivals = arrivals.into_iter().peekable();
            while state_of(&st, big) == JobState::Pending {
                prop_assert!(now <= promised, "pass at {} but promised {}", now, promised);
                // Next event: a running job's limit, or an arrival.
                let next_end = st.running_jobs().filter_map(|j| j.expected_end()).min().unwrap_or(i64::MAX);
                let next_arrival = arrivals.peek().map(|(_, _, at)| *at as i64 + 2).unwrap_or(i64::MAX);
                now = now.max(next_end.min(next_arrival)).max(now + 1);
                let due: Vec<(JobId, i64)> = st.running_jobs().filter_map(|j| j.expected_end().map(|e| (j.id, e))).collect();
                for (id, e) in due {
                    // Some jobs end early, the rest at their limit.
                    k += 1;
                    if e <= now || early[k % early.len()] {
                        end(&mut st, id, 0, now);
                    }
                }
                while arrivals.peek().is_some_and(|(_, _, at)| (*at as i64 + 2) <= now) {
                    let (g, limit, _) = arrivals.next().unwrap();
                    st.submit(JobSpec::test().gpus(g).time(Some(limit)), now).unwrap();
                }
                let plan = st.schedule(now);
                if let Some(r) = plan.reservations.iter().find(|r| r.job == big) {
                    prop_assert!(r.start <= promised, "reservation moved from {} to {}", promised, r.start);
                    promised = r.start;
                }
                assert_consistent(&st);
            }
            let start = st.job(big).unwrap().start_time.unwrap();
            prop_assert!(start <= promised, "started at {} past its reservation {}", start, promised);
        }
    }
}

/// Not a benchmark (those live in `benches/`): a quick look at a pass that starts tens of
/// thousands of jobs on an idle 10,000-node cluster. Run with
/// `cargo test -p tandem-sched --release -- --ignored --nocapture idle_cluster`.
#[test]
#[ignore]
fn idle_cluster_pass_starts_many_jobs() {
    let mut st = State::test_cluster(10_000, 64, 1 << 20, 8);
    for i in 0..100_000u32 {
        let spec = JobSpec::test()
            .user(&format!("u{}", i % 200))
            .gpus(1 + i % 8)
            .time(Some(600 + u64::from(i % 7) * 600));
        st.submit(spec, 0).unwrap();
    }
    let t = std::time::Instant::now();
    let plan = st.schedule(1);
    let first = t.elapsed();
    let t = std::time::Instant::now();
    let again = st.schedule(2);
    println!(
        "idle pass: {} started, {} reservations in {first:?}; next pass {:?} ({} started)",
        plan.starts.len(),
        plan.stats.reservations,
        t.elapsed(),
        again.starts.len()
    );
    assert_consistent(&st);
}

/// `max_reservations` bounds reservations per pass, not the jobs considered; 0 lifts the
/// bound. Both nodes are busy, so three blocked jobs of distinct shapes each want one.
#[test]
fn reservation_bound_counts_shapes_and_zero_means_no_bound() {
    let reservations = |bound: u32| {
        let mut st = two_gpu_nodes();
        st.config.sched.max_reservations = bound;
        st.submit(
            JobSpec::test().nodes(2).gpus_per_node(8).time(Some(1000)),
            0,
        )
        .unwrap();
        assert_eq!(started(&st.schedule(0)).len(), 1);
        for (gpus, limit) in [(8, 100), (4, 200), (2, 300)] {
            st.submit(JobSpec::test().gpus(gpus).time(Some(limit)), 1)
                .unwrap();
        }
        let plan = st.schedule(1);
        assert!(plan.starts.is_empty());
        assert_eq!(plan.stats.considered, 3, "every pending job is considered");
        plan.stats.reservations
    };
    assert_eq!(reservations(1), 1);
    assert_eq!(reservations(2), 2);
    assert_eq!(reservations(0), 3);
}

/// Issue #12: a restarted controller (or a reconnecting worker) must not end a running
/// `kube`-mode placeholder because the worker does not report it: no worker ever runs one.
#[test]
fn a_reregistering_worker_leaves_its_kube_placeholders_running() {
    let mut st = State::test_cluster(1, 32, 64_000, 8);
    let k = st.submit(JobSpec::test().gpus(2).kube(), 0).unwrap();
    let b = st.submit(JobSpec::test().gpus(2).kube(), 0).unwrap();
    assert_eq!(st.schedule(0).starts.len(), 2);
    let effects = st
        .register_node(NodeRegistration::test("node-01", 32, 64_000, 8), 1)
        .unwrap();
    assert!(effects.is_empty(), "{effects:?}");
    for j in [k, b] {
        assert_eq!(state_of(&st, j), JobState::Running);
    }
    // A batch job the worker no longer reports still ends NODE_FAIL (or is requeued).
    let mut st = State::test_cluster(1, 32, 64_000, 8);
    let batch = st.submit(JobSpec::test().no_requeue(), 0).unwrap();
    assert_eq!(st.schedule(0).starts.len(), 1);
    st.register_node(NodeRegistration::test("node-01", 32, 64_000, 8), 1)
        .unwrap();
    assert_ne!(state_of(&st, batch), JobState::Running);
    assert_consistent(&st);
}
