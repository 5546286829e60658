use proptest::prelude::*;

use super::*;
use crate::job::JobSpec;
use crate::state::{JobSelector, NodeRegistration, Requester};

#[derive(Clone, Debug)]
enum Op {
    Submit {
        cpus: u32,
        gpus: u32,
        nodes: u32,
        kube: bool,
        limit: u64,
        exclusive: bool,
        /// `-n`, 0 = not given: the layout fills nodes beyond the even share the pass placed.
        ntasks: u32,
    },
    Schedule,
    EndOne(usize),
    CancelOne(usize),
    LoseNode(usize),
    RegisterNode(usize),
    /// A node's worker reports one ended job's processes gone.
    Gone(usize, usize),
    DrainNode(usize),
    /// The bridge hands back the nodes one running placeholder was asked for.
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..6, 0u32..5, 1u32..3, any::<bool>(), 10u64..200, prop::bool::weighted(0.1), prop_oneof![Just(0u32), 1u32..12])
            .prop_map(|(cpus, gpus, nodes, kube, limit, exclusive, ntasks)| Op::Submit { cpus, gpus, nodes, kube, limit, exclusive, ntasks }),
        3 => Just(Op::Schedule),
        2 => (0usize..50).prop_map(Op::EndOne),
        1 => (0usize..50).prop_map(Op::CancelOne),
        1 => (0usize..3).prop_map(Op::LoseNode),
        1 => (0usize..3).prop_map(Op::RegisterNode),
        3 => (0usize..3, 0usize..8).prop_map(|(n, j)| Op::Gone(n, j)),
        1 => (0usize..3).prop_map(Op::DrainNode),
        2 => (0usize..50).prop_map(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever happens, node bookkeeping matches the running allocations, no GPU is given
    /// twice, no node is over-allocated or mixes modes, and every pass's starts fit.
    #[test]
    fn bookkeeping_survives_any_event_sequence(ops in proptest::collection::vec(op(), 1..80)) {
        let mut st = State::test_cluster(3, 8, 16_000, 4);
        let mut now = 0i64;
        for op in ops {
            now += 7;
            match op {
                Op::Submit { cpus, gpus, nodes, kube, limit, exclusive, ntasks } => {
                    let mut spec = JobSpec::test().cpus_per_task(cpus).gpus_per_node(gpus).nodes(nodes).time(Some(limit));
                    if ntasks > 0 { spec = spec.ntasks(ntasks); }
                    if kube { spec = spec.kube(); }
                    if exclusive { spec = spec.exclusive(); }
                    let _ = st.submit(spec, now);
                }
                Op::Schedule => {
                    let completing: Vec<crate::NodeId> =
                        st.nodes().filter(|n| n.is_completing()).map(|n| n.id).collect();
                    let plan = st.schedule(now);
                    for s in &plan.starts {
                        prop_assert_eq!(state_of(&st, s.job), JobState::Running);
                        for n in &s.nodes {
                            prop_assert!(!completing.contains(&n.node), "started on a COMPLETING node");
                        }
                    }
                }
                Op::Gone(n, j) => {
                    let name = format!("node-{:02}", n + 1);
                    let ending: Vec<JobId> = st.node_by_name(&name).map(|n| n.ending.iter().map(|e| e.job).collect()).unwrap_or_default();
                    if !ending.is_empty() {
                        st.job_gone(&name, ending[j % ending.len()]).unwrap();
                    }
                }
                Op::EndOne(i) => {
                    let running: Vec<JobId> = st.running_jobs().map(|j| j.id).collect();
                    if !running.is_empty() {
                        end(&mut st, running[i % running.len()], (i % 2) as i32, now);
                    }
                }
                Op::CancelOne(i) => {
                    let all: Vec<JobId> = st.jobs().map(|j| j.id).collect();
                    if !all.is_empty() {
                        let _ = st.cancel(&JobSelector::job(all[i % all.len()]), &Requester::admin(), now);
                    }
                }
                Op::LoseNode(i) => {
                    let _ = st.node_lost(&format!("node-{:02}", i + 1), "", now);
                }
                Op::DrainNode(i) => {
                    let _ = st.drain(&format!("node-{:02}", i + 1), "test");
                }
                Op::Release(i) => {
                    let asked: Vec<(JobId, Vec<crate::NodeId>)> = st
                        .running_jobs()
                        .filter(|j| !j.releasing_nodes().is_empty())
                        .map(|j| (j.id, j.releasing_nodes().to_vec()))
                        .collect();
                    if !asked.is_empty() {
                        let (job, nodes) = &asked[i % asked.len()];
                        let released = st.release_placeholder_nodes(*job, nodes, now).unwrap();
                        if released == crate::state::Release::EndsJob {
                            end(&mut st, *job, 0, now);
                        }
                    }
                }
                Op::RegisterNode(i) => {
                    let name = format!("node-{:02}", i + 1);
                    let running = st.node_by_name(&name).map(|n| n.jobs.clone()).unwrap_or_default();
                    let _ = st.register_node(NodeRegistration { running_jobs: running, ..NodeRegistration::test(&name, 8, 16_000, 4) }, now);
                }
            }
            assert_consistent(&st);
            for j in st.running_jobs() {
                for na in &j.alloc.as_ref().unwrap().nodes {
                    prop_assert!(st.node(na.node).unwrap().jobs.contains(&j.id));
                }
            }
        }
    }
}
