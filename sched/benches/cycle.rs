//! One full scheduling pass (usage, eligibility, priorities with Fair Tree,
//! placement with backfill reservations) over 1k, 10k and 100k pending jobs on
//! 10,000 nodes x 8 GPUs. Prints one JSON line per size and a summary line
//! with the growth ratios.
//!
//! The cluster is full when the pass runs: 10,000 one-node 8-GPU jobs hold
//! every GPU and end at staggered times over the next two days, so no pending
//! job can start now and every one of them goes through the backfill planner
//! (the expensive case). Pending jobs mix 1-8 GPUs per node, 1-16 nodes, the
//! round time limits users pick, 200 users in 20 accounts with uneven usage.
//!
//! `pass_ms` is the first pass after the jobs were submitted (it sets every
//! pending reason); `steady_pass_ms` the next one a minute later.
//!
//! Run: `cargo bench -p tandem-sched --bench cycle` (optionally with sizes:
//! `-- 1000 10000`). Single-threaded: the pass uses one core.

use std::time::{Duration, Instant};

use tandem_sched::account::{AccountConfig, UserConfig};
use tandem_sched::cycle::{PassObserver, Phase};
use tandem_sched::sim::rng::SplitMix64;
use tandem_sched::{ClusterConfig, JobSpec, NodeRegistration, State};

const NODES: u32 = 10_000;
const GPUS_PER_NODE: u32 = 8;
const CPUS_PER_NODE: u32 = 64;
const MEM_PER_NODE_MB: u64 = 1024 * 1024;
const ACCOUNTS: u32 = 20;
const USERS_PER_ACCOUNT: u32 = 10;
const T0: i64 = 1_700_000_000;
/// Round limits users ask for: 10 min to 2 days.
const LIMITS: [u64; 7] = [
    600,
    1_800,
    3_600,
    4 * 3_600,
    12 * 3_600,
    24 * 3_600,
    48 * 3_600,
];
/// Repetitions per size (the median is reported); `CYCLE_BENCH_REPS` overrides,
/// e.g. to make the passes dominate a profile.
const REPS: usize = 3;

fn config() -> ClusterConfig {
    let mut cfg = ClusterConfig::default();
    for a in 0..ACCOUNTS {
        // Uneven shares so Fair Tree has something to rank.
        cfg.accounts
            .push(AccountConfig::new(format!("acct{a}"), 1 + a % 4));
        for u in 0..USERS_PER_ACCOUNT {
            cfg.users.push(UserConfig {
                user: format!("u{a}_{u}"),
                account: format!("acct{a}"),
                shares: 1,
                default: true,
            });
        }
    }
    cfg
}

fn user(rng: &mut SplitMix64) -> (String, String) {
    let a = rng.range(0, u64::from(ACCOUNTS));
    let u = rng.range(0, u64::from(USERS_PER_ACCOUNT));
    (format!("u{a}_{u}"), format!("acct{a}"))
}

/// A full cluster: every node runs one 8-GPU job, ending at staggered times.
fn full_cluster(rng: &mut SplitMix64) -> State {
    let mut st = State::new(config()).expect("bench config is valid");
    for i in 0..NODES {
        st.register_node(
            NodeRegistration::test(
                &format!("gpu{i:05}"),
                CPUS_PER_NODE,
                MEM_PER_NODE_MB,
                GPUS_PER_NODE,
            ),
            T0 - 3_600,
        )
        .expect("bench node registers");
    }
    for _ in 0..NODES {
        let (u, a) = user(rng);
        let limit = rng.range(3_600, 48 * 3_600);
        let spec = JobSpec::test()
            .user(&u)
            .account(&a)
            .nodes(1)
            .gpus_per_node(GPUS_PER_NODE)
            .cpus_per_task(CPUS_PER_NODE)
            .time(Some(limit));
        st.submit(spec, T0 - 3_600).expect("bench job submits");
    }
    let plan = st.schedule(T0 - 3_600);
    assert_eq!(
        plan.starts.len(),
        NODES as usize,
        "the filler jobs all start"
    );
    st.take_changes();
    st
}

/// How alike the pending jobs are.
#[derive(Clone, Copy, Debug)]
enum Mix {
    /// 20 shapes (GPUs per node x nodes) and 7 round limits: what a real queue
    /// looks like, and what the pass's same-shape memo exploits.
    Typical,
    /// Memory per node and the limit drawn per job: (almost) every job is its
    /// own shape, so nothing is skipped and reservations hit their cap.
    Distinct,
}

fn add_pending(st: &mut State, rng: &mut SplitMix64, n: usize, mix: Mix) {
    for _ in 0..n {
        let (u, a) = user(rng);
        let gpn = [1, 2, 4, 8][rng.range(0, 4) as usize];
        let nodes = [1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 16][rng.range(0, 11) as usize];
        let (limit, mem_mb) = match mix {
            Mix::Typical => (
                LIMITS[rng.range(0, LIMITS.len() as u64) as usize],
                128 * 1024 * u64::from(gpn),
            ),
            Mix::Distinct => (rng.range(600, 48 * 3_600), rng.range(1024, 512 * 1024)),
        };
        let spec = JobSpec::test()
            .user(&u)
            .account(&a)
            .nodes(nodes)
            .gpus_per_node(gpn)
            .cpus_per_task(8 * gpn)
            .mem_mb(mem_mb)
            .time(Some(limit));
        st.submit(spec, T0 - rng.range(0, 86_400) as i64)
            .expect("bench job submits");
    }
    st.take_changes();
}

/// Times each phase of a pass.
struct PhaseTimer {
    last: Option<(Phase, Instant)>,
    spent: Vec<(Phase, Duration)>,
}

impl PassObserver for PhaseTimer {
    fn phase(&mut self, phase: Phase) {
        let now = Instant::now();
        if let Some((p, t)) = self.last.take() {
            self.spent.push((p, now - t));
        }
        if phase != Phase::Done {
            self.last = Some((phase, now));
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let sizes: Vec<usize> = {
        let args: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if args.is_empty() {
            vec![1_000, 10_000, 100_000]
        } else {
            args
        }
    };
    policy_only(&sizes);
    let mut rng = SplitMix64::new(42);
    let base = full_cluster(&mut rng);
    let only = std::env::var("CYCLE_BENCH_MIX").ok();
    for mix in [Mix::Typical, Mix::Distinct] {
        if only
            .as_deref()
            .is_some_and(|m| !format!("{mix:?}").eq_ignore_ascii_case(m))
        {
            continue;
        }
        run_sizes(&base, &mut rng, &sizes, mix);
    }
}

fn run_sizes(base: &State, rng: &mut SplitMix64, sizes: &[usize], mix: Mix) {
    let mix_name = format!("{mix:?}").to_lowercase();
    let mut results = Vec::new();
    for &n in sizes {
        let mut st = base.clone();
        add_pending(&mut st, rng, n, mix);
        let reps = std::env::var("CYCLE_BENCH_REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(REPS);
        let mut runs = Vec::new();
        for _ in 0..reps.max(1) {
            let mut s = st.clone();
            let mut timer = PhaseTimer {
                last: None,
                spent: Vec::new(),
            };
            let began = Instant::now();
            let plan = tandem_sched::cycle::schedule_observed(&mut s, T0 + 60, &mut timer);
            let took = began.elapsed();
            timer.phase(Phase::Done);
            // The next pass, a minute later: pending reasons are already set, so
            // this is the steady state of a busy cluster.
            let began = Instant::now();
            let again = tandem_sched::cycle::schedule(&mut s, T0 + 120);
            let steady = began.elapsed();
            assert_eq!(again.starts.len(), 0, "nothing ends between the two passes");
            runs.push((took, plan.stats, timer.spent, steady));
        }
        runs.sort_by_key(|r| r.0);
        let (took, stats, phases, _) = &runs[runs.len() / 2];
        let mut steady: Vec<Duration> = runs.iter().map(|r| r.3).collect();
        steady.sort();
        let steady = steady[steady.len() / 2];
        let phases: Vec<String> = phases
            .iter()
            .map(|(p, d)| format!("\"{}\":{:.3}", format!("{p:?}").to_lowercase(), ms(*d)))
            .collect();
        println!(
            "{{\"bench\":\"cycle\",\"mix\":\"{mix_name}\",\"pending\":{n},\"nodes\":{NODES},\"gpus_per_node\":{GPUS_PER_NODE},\"pass_ms\":{:.3},\"min_ms\":{:.3},\"steady_pass_ms\":{:.3},\"phases_ms\":{{{}}},\"considered\":{},\"started\":{},\"reservations\":{},\"skipped_same_shape\":{}}}",
            ms(*took),
            ms(runs[0].0),
            ms(steady),
            phases.join(","),
            stats.considered,
            stats.started,
            stats.reservations,
            stats.skipped_same_shape,
        );
        results.push((n, took.as_secs_f64()));
    }
    // Growth per 10x: n log n would give 10 * log(10n)/log(n) (about 13.3 from
    // 1k to 10k, 12.5 from 10k to 100k); linear gives 10.
    let ratios: Vec<String> = results
        .windows(2)
        .map(|w| {
            let (n0, t0) = w[0];
            let (n1, t1) = w[1];
            let nlogn = (n1 as f64 * (n1 as f64).ln()) / (n0 as f64 * (n0 as f64).ln());
            format!(
                "{{\"from\":{n0},\"to\":{n1},\"time_ratio\":{:.2},\"nlogn_ratio\":{nlogn:.2}}}",
                t1 / t0
            )
        })
        .collect();
    println!(
        "{{\"bench\":\"cycle\",\"mix\":\"{mix_name}\",\"growth\":[{}]}}",
        ratios.join(",")
    );
}

/// The policy's own share of a pass: one Fair Tree computation over the bench's
/// 20 accounts and 200 users, and the multifactor priority of every pending job
/// (what `cycle::prioritise` adds on top of its look-ups and the sort).
fn policy_only(sizes: &[usize]) {
    use tandem_sched::fairshare::AssocTree;
    use tandem_sched::priority::{PriorityConfig, PriorityContext, PriorityInput, priority};

    let mut tree = AssocTree::new();
    let mut users = Vec::new();
    let mut rng = SplitMix64::new(7);
    for a in 0..ACCOUNTS {
        let acct = format!("acct{a}");
        tree.add_account(&acct, "root", 1 + a % 4)
            .expect("bench account");
        for u in 0..USERS_PER_ACCOUNT {
            let idx = tree
                .add_user(&format!("u{a}_{u}"), &acct, 1)
                .expect("bench user");
            tree.charge(idx, rng.range(0, 1_000_000) as f64);
            users.push(idx);
        }
    }
    let began = Instant::now();
    let table = tree.compute();
    let fair_tree = began.elapsed();
    let cfg = PriorityConfig::default();
    let ctx = PriorityContext {
        now: T0,
        total_nodes: NODES,
        total_cpus: u64::from(NODES * CPUS_PER_NODE),
        total_mem_mb: u64::from(NODES) * MEM_PER_NODE_MB,
        total_gpus: u64::from(NODES * GPUS_PER_NODE),
        max_partition_factor: 1,
        max_qos_priority: 0,
    };
    for &n in sizes {
        let inputs: Vec<PriorityInput> = (0..n)
            .map(|_| PriorityInput {
                eligible_at: T0 - rng.range(0, 86_400) as i64,
                fairshare: table.factor(users[rng.range(0, users.len() as u64) as usize]),
                nodes: 1 + rng.range(0, 16) as u32,
                cpus: 64,
                mem_mb: 1024,
                gpus: 8,
                partition_factor: 1,
                qos_priority: 0,
                nice: 0,
            })
            .collect();
        let began = Instant::now();
        let total: u64 = inputs
            .iter()
            .map(|i| u64::from(priority(&cfg, &ctx, i).total))
            .sum();
        let took = began.elapsed();
        println!(
            "{{\"bench\":\"policy\",\"pending\":{n},\"users\":{},\"fair_tree_us\":{:.1},\"priorities_ms\":{:.3},\"ns_per_job\":{:.1},\"checksum\":{total}}}",
            users.len(),
            fair_tree.as_secs_f64() * 1e6,
            ms(took),
            took.as_secs_f64() * 1e9 / n as f64,
        );
    }
}
