//! What autoscaling costs the state actor after each pass, against the pass itself, on the
//! cycle bench's cluster: 10,000 nodes x 8 GPUs, all busy, and 1k / 10k / 100k pending jobs
//! of 20 shapes (1-8 GPUs per node, 1-16 nodes) plus one 100k-task array.
//!
//! Per size, one JSON line with mean, p50, p99 and max in milliseconds of:
//! - `pass`: one scheduling pass (`State::schedule`), the steady one (reasons already set);
//! - `old_walk`: the walk the actor did before (`State::pending_demand`, per-partition sums);
//! - `capture`: `demand::Snapshot::capture` (what the actor does now after each pass);
//! - `query`: one `demand::demand` for an 8-GPU worker shape (what one scaler request costs);
//!
//! and the ratios `capture / pass` and `capture / old_walk`, measured in the same run.
//!
//! Run: `cargo bench -p tandem-sched --bench demand` (optionally with sizes: `-- 1000`).

use std::time::Instant;

use tandem_sched::demand::{Snapshot, WorkerShape, demand};
use tandem_sched::sim::rng::SplitMix64;
use tandem_sched::{ClusterConfig, JobSpec, NodeRegistration, State};

const NODES: u32 = 10_000;
const T0: i64 = 1_700_000_000;
const REPS: usize = 15;

fn cluster(rng: &mut SplitMix64, pending: usize) -> State {
    let mut cfg = ClusterConfig::default();
    cfg.sched.max_array_size = 200_000;
    let mut st = State::new(cfg).expect("bench config");
    for i in 0..NODES {
        st.register_node(
            NodeRegistration::test(&format!("gpu{i:05}"), 64, 1024 * 1024, 8),
            T0 - 3_600,
        )
        .expect("bench node");
    }
    for _ in 0..NODES {
        let spec = JobSpec::test()
            .nodes(1)
            .gpus_per_node(8)
            .cpus_per_task(64)
            .time(Some(rng.range(3_600, 48 * 3_600)));
        st.submit(spec, T0 - 3_600).expect("filler job");
    }
    st.schedule(T0 - 3_600);
    for _ in 0..pending {
        let gpn = [1, 2, 4, 8][rng.range(0, 4) as usize];
        let nodes = [1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 16][rng.range(0, 11) as usize];
        let spec = JobSpec::test()
            .user(&format!("u{}", rng.range(0, 200)))
            .nodes(nodes)
            .gpus_per_node(gpn)
            .cpus_per_task(8 * gpn)
            .mem_mb(128 * 1024 * u64::from(gpn));
        st.submit(spec, T0 - rng.range(0, 86_400) as i64)
            .expect("pending job");
    }
    st.submit(JobSpec::test().gpus_per_node(1).array("0-99999"), T0 - 60)
        .expect("array");
    // The first pass sets every reason; the measured ones are steady.
    st.schedule(T0);
    st.take_changes();
    st
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    let pct = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({
        "mean": v.iter().sum::<f64>() / v.len() as f64,
        "p50": pct(0.5),
        "p99": pct(0.99),
        "max": v[v.len() - 1],
    })
}

fn time<R>(reps: usize, mut f: impl FnMut() -> R) -> Vec<f64> {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

fn main() {
    let sizes: Vec<usize> = {
        let a: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if a.is_empty() {
            vec![1_000, 10_000, 100_000]
        } else {
            a
        }
    };
    let shape = WorkerShape {
        partition: "batch".into(),
        gpus: Some(8),
        cpus: Some(64),
        mem_mb: Some(1024 * 1024),
        ..WorkerShape::default()
    };
    let mut rng = SplitMix64::new(7);
    for n in sizes {
        let st = cluster(&mut rng, n);
        let mut s = st.clone();
        let pass = time(REPS.min(5), || s.schedule(T0 + 60).starts.len());
        let old = time(REPS, || st.pending_demand());
        let capture = time(REPS, || Snapshot::capture(&st, T0 + 60));
        let snap = Snapshot::capture(&st, T0 + 60);
        let q = time(REPS, || demand(&snap, &shape));
        let d = demand(&snap, &shape);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "{}",
            serde_json::json!({
                "bench": "demand",
                "pending_jobs": n,
                "array_tasks": 100_000,
                "groups": snap.pending.len(),
                "workers_needed": d.workers(),
                "pass_ms": stats(pass.clone()),
                "old_walk_ms": stats(old.clone()),
                "capture_ms": stats(capture.clone()),
                "query_ms": stats(q),
                "capture_over_pass": mean(&capture) / mean(&pass),
                "capture_over_old_walk": mean(&capture) / mean(&old),
            })
        );
    }
}
