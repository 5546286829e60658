use proptest::prelude::*;

use super::*;
use crate::config::ClusterConfig;
use crate::job::JobSpec;
use crate::partition::Partition;
use crate::state::NodeRegistration;

/// 8-GPU, 64-CPU, 512 GB workers of partition `gpu`.
fn gpu8() -> WorkerShape {
    WorkerShape {
        partition: "gpu".into(),
        gpus: Some(8),
        gpu_type: Some("h100".into()),
        cpus: Some(64),
        mem_mb: Some(512 * 1024),
        features: vec!["ib".into()],
    }
}

/// Partitions `gpu` (default) and `cpu` (nodes `c1..c4` only), no nodes (worker sets
/// scaled to zero).
fn empty_cluster() -> State {
    let mut c = ClusterConfig {
        partitions: vec![Partition::new("gpu"), Partition::new("cpu")],
        ..ClusterConfig::default()
    };
    c.partitions[0].default = true;
    c.partitions[1].nodes = Some("c[1-4]".into());
    State::new(c).unwrap()
}

fn submit(st: &mut State, spec: JobSpec) -> crate::JobId {
    st.submit(spec, 0).unwrap()
}

fn demand_now(st: &mut State, shape: &WorkerShape) -> ShapeDemand {
    st.schedule(10);
    demand(&Snapshot::capture(st, 10), shape)
}

#[test]
fn multi_node_job_needs_one_worker_per_node() {
    let mut st = empty_cluster();
    submit(
        &mut st,
        JobSpec::test().partition("gpu").nodes(2).gpus_per_node(8),
    );
    let d = demand_now(&mut st, &gpu8());
    assert_eq!((d.pending, d.busy, d.workers()), (2, 0, 2));
    assert!(d.active());
    assert_eq!(d.jobs_fitting, 1);
}

#[test]
fn small_jobs_pack_by_gpus_cpus_and_memory() {
    let mut st = empty_cluster();
    // Ten 1-GPU jobs: 8 fit one worker by GPUs -> 2 workers.
    for _ in 0..10 {
        submit(&mut st, JobSpec::test().partition("gpu").gpus_per_node(1));
    }
    assert_eq!(demand_now(&mut st, &gpu8()).pending, 2);
    // CPU-bound: 5 jobs of 32 CPUs on 64-CPU workers -> 3 workers.
    let mut st = empty_cluster();
    for _ in 0..5 {
        submit(&mut st, JobSpec::test().partition("gpu").cpus_per_task(32));
    }
    assert_eq!(demand_now(&mut st, &gpu8()).pending, 3);
    // Memory-bound: 3 jobs of 300 GB on 512 GB workers -> 3 workers.
    let mut st = empty_cluster();
    for _ in 0..3 {
        submit(&mut st, JobSpec::test().partition("gpu").mem_mb(300 * 1024));
    }
    assert_eq!(demand_now(&mut st, &gpu8()).pending, 3);
}

#[test]
fn jobs_that_can_never_fit_the_shape_are_not_demand() {
    let mut st = empty_cluster();
    submit(&mut st, JobSpec::test().partition("gpu").gpus_per_node(16));
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(1)
            .gpu_type("a100"),
    );
    submit(
        &mut st,
        JobSpec::test().partition("gpu").constraint("nvlink"),
    );
    // Another partition's work is not this shape's.
    submit(&mut st, JobSpec::test().partition("cpu"));
    let d = demand_now(&mut st, &gpu8());
    assert_eq!((d.pending, d.jobs_fitting, d.jobs_unfit), (0, 0, 3));
    assert!(!d.active());
    // The same constraint matches a shape that has the feature.
    let shape = WorkerShape {
        features: vec!["ib".into(), "nvlink".into()],
        ..gpu8()
    };
    assert_eq!(demand_now(&mut st, &shape).pending, 1);
}

#[test]
fn held_later_and_dependent_jobs_are_not_demand() {
    let mut st = empty_cluster();
    let first = submit(&mut st, JobSpec::test().partition("gpu").gpus_per_node(8));
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(8)
            .with(|s| s.hold = true),
    );
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(8)
            .with(|s| s.begin = Some(1_000_000)),
    );
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(8)
            .dependency(&format!("afterok:{first}")),
    );
    let d = demand_now(&mut st, &gpu8());
    assert_eq!(d.pending, 1, "{d:?}");
    let snap = Snapshot::capture(&st, 10);
    let p = snap.partitions["gpu"];
    assert_eq!((p.jobs_pending, p.jobs_hold, p.gpus_pending), (4, 1, 32));
}

#[test]
fn arrays_count_tasks_up_to_their_throttle_without_expanding() {
    let mut c = ClusterConfig {
        partitions: vec![Partition::new("gpu")],
        ..ClusterConfig::default()
    };
    c.partitions[0].default = true;
    c.sched.max_array_size = 2_000_000;
    let mut st = State::new(c).unwrap();
    // A million 1-GPU tasks: 125,000 workers of 8 GPUs; one group in the snapshot.
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(1)
            .array("0-999999"),
    );
    // Throttled to 20 at a time: 20 tasks -> 3 workers.
    submit(
        &mut st,
        JobSpec::test()
            .partition("gpu")
            .gpus_per_node(8)
            .array("0-99%20"),
    );
    st.schedule(10);
    let snap = Snapshot::capture(&st, 10);
    assert_eq!(snap.pending.len(), 2);
    assert_eq!(snap.partitions["gpu"].jobs_pending, 1_000_100);
    let d = demand(&snap, &gpu8());
    assert_eq!(d.jobs_fitting, 1_000_020);
    assert_eq!(d.pending, 125_000 + 20);
}

#[test]
fn busy_workers_of_the_shape_count_and_idle_ones_do_not() {
    let mut st = empty_cluster();
    for i in 0..3 {
        st.register_node(
            NodeRegistration::test(&format!("w{i}"), 64, 512 * 1024, 8)
                .gpu_type("h100")
                .features(&["ib"])
                .partitions(&["gpu"]),
            0,
        )
        .unwrap();
        st.heartbeat(&format!("w{i}"), 0).unwrap();
    }
    // One whole-node job runs; the other two workers are idle; nothing pending.
    submit(&mut st, JobSpec::test().partition("gpu").gpus_per_node(8));
    let d = demand_now(&mut st, &gpu8());
    assert_eq!(st.running_jobs().count(), 1);
    assert_eq!((d.busy, d.pending, d.workers()), (1, 0, 1));
    assert!(d.active());
    // Two 2-node jobs: one starts on the idle pair, the other needs 2 more workers.
    submit(
        &mut st,
        JobSpec::test().partition("gpu").nodes(2).gpus_per_node(8),
    );
    submit(
        &mut st,
        JobSpec::test().partition("gpu").nodes(2).gpus_per_node(8),
    );
    let d = demand_now(&mut st, &gpu8());
    assert_eq!((d.busy, d.pending, d.workers()), (3, 2, 5), "{d:?}");
    // Workers of another GPU type: none busy, but the untyped pending job could run there.
    let other = WorkerShape {
        gpu_type: Some("a100".into()),
        ..gpu8()
    };
    let d = demand_now(&mut st, &other);
    assert_eq!((d.busy, d.pending), (0, 2), "{d:?}");
    // Another partition's workers: nothing.
    let cpu = WorkerShape {
        partition: "cpu".into(),
        ..gpu8()
    };
    assert!(!demand_now(&mut st, &cpu).active());
    let snap = Snapshot::capture(&st, 10);
    assert_eq!(snap.node_states.alloc, 3);
    assert_eq!(snap.partitions["gpu"].nodes.alloc, 3);
    assert_eq!(snap.partitions["gpu"].jobs_running, 2);
    assert_eq!(snap.nodes_batch, 3);
}

#[test]
fn exclusive_jobs_take_whole_workers() {
    let mut st = empty_cluster();
    for _ in 0..3 {
        submit(
            &mut st,
            JobSpec::test()
                .partition("gpu")
                .gpus_per_node(1)
                .with(|s| s.exclusive = true),
        );
    }
    assert_eq!(demand_now(&mut st, &gpu8()).pending, 3);
}

#[test]
fn unlimited_dimensions_do_not_limit_packing() {
    let mut st = empty_cluster();
    for _ in 0..100 {
        submit(&mut st, JobSpec::test().partition("cpu").cpus_per_task(8));
    }
    let shape = WorkerShape {
        partition: "cpu".into(),
        ..WorkerShape::default()
    };
    // No CPU count given: everything fits one worker; with 64 CPUs, 8 per worker.
    assert_eq!(demand_now(&mut st, &shape).pending, 1);
    let shape = WorkerShape {
        cpus: Some(64),
        ..shape
    };
    assert_eq!(demand_now(&mut st, &shape).pending, 13);
}

// === property tests: the grouped packer equals item-by-item first fit ===

/// Item-by-item first-fit-decreasing with the same order, as the reference.
fn naive(cap: Cap, items: &[Item]) -> u64 {
    let mut items = items.to_vec();
    items.sort_by(|a, b| {
        let key = |i: &Item| (i.nodes, i.per_node.gpus, i.per_node.cpus, i.per_node.mem_mb);
        key(b).cmp(&key(a)).then(b.exclusive.cmp(&a.exclusive))
    });
    let mut bins: Vec<Cap> = Vec::new();
    for it in &items {
        for _ in 0..it.count {
            if it.nodes > 1 || it.exclusive {
                for _ in 0..it.nodes {
                    bins.push(if it.exclusive {
                        Cap::ZERO
                    } else {
                        cap.less(&it.per_node, 1)
                    });
                }
                continue;
            }
            match bins.iter_mut().find(|b| b.fits(&it.per_node)) {
                Some(b) => *b = b.less(&it.per_node, 1),
                None => bins.push(cap.less(&it.per_node, 1)),
            }
        }
    }
    bins.len() as u64
}

fn item() -> impl Strategy<Value = Item> {
    (
        0u32..=8,
        1u32..=64,
        0u64..=4,
        1u32..=3,
        any::<bool>(),
        0u64..=12,
    )
        .prop_map(|(gpus, cpus, mem_gb, nodes, exclusive, count)| Item {
            per_node: Tres::new(cpus, mem_gb * 128 * 1024, gpus),
            nodes: if exclusive { 1 } else { nodes },
            exclusive,
            count,
        })
}

proptest! {
    #[test]
    fn grouped_first_fit_equals_item_by_item(items in prop::collection::vec(item(), 0..12)) {
        let cap = Cap { cpus: 64, mem_mb: 512 * 1024, gpus: 8 };
        let mut grouped = items.clone();
        prop_assert_eq!(pack(cap, &mut grouped), naive(cap, &items));
    }

    #[test]
    fn bins_are_within_bounds(items in prop::collection::vec(item(), 0..12)) {
        let cap = Cap { cpus: 64, mem_mb: 512 * 1024, gpus: 8 };
        let mut v = items.clone();
        let bins = pack(cap, &mut v);
        // At most one worker per node-item; at least what the totals need in each dimension.
        let node_items: u64 = items.iter().map(|i| i.count * u64::from(i.nodes)).sum();
        prop_assert!(bins <= node_items);
        let sum = |f: &dyn Fn(&Tres) -> u64| -> u64 {
            items.iter().map(|i| i.count * u64::from(i.nodes) * f(&i.per_node)).sum()
        };
        let lower = [
            sum(&|t| u64::from(t.gpus)).div_ceil(8),
            sum(&|t| u64::from(t.cpus)).div_ceil(64),
            sum(&|t| t.mem_mb).div_ceil(512 * 1024),
        ];
        prop_assert!(lower.iter().all(|l| bins >= *l), "{bins} < {lower:?}");
        // The widest job needs its node count.
        let widest = items.iter().filter(|i| i.count > 0).map(|i| u64::from(i.nodes)).max();
        prop_assert!(bins >= widest.unwrap_or(0));
    }
}
