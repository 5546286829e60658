//! Scenario tests of the model and the pass, through `State`'s public methods.
//!
//! - `lifecycle`: submit, start, outcomes, cancel, hold, update, requeue, purge
//! - `eligibility`: begin times, dependencies, singletons, will-run, priority before a pass
//! - `recovery`: lost, drained and removed nodes; restore after a restart
//! - `limits`: partition, QOS and association limits; usage charging
//! - `placement`: backfill reservations, gangs, node modes, preemption, limits
//! - `arrays`: task splitting, throttle, array dependencies
//! - `completing`: ended jobs hold each node until its processes are reported gone
//! - `invariants`: property test over random event sequences
//! - `admin`: run-time account, user and QOS changes (sacctmgr)
//! - `placeholders`: `kube`-mode jobs on lost, downed and drained nodes

mod admin;
mod arrays;
mod completing;
mod eligibility;
mod invariants;
mod lifecycle;
mod limits;
mod placeholders;
mod placement;
mod recovery;

use crate::effect::Effect;
use crate::job::{JobOutcome, JobState};
use crate::state::{JobError, State};
use crate::{JobId, Plan};

/// Workers that report every ended job's processes gone at once, as they do when nothing
/// survives the kill: the end, then each node's cleanup report.
pub(crate) trait CleanEnd {
    fn job_ended_clean(
        &mut self,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError>;
    /// Every node the effects leave held reports the job's processes gone.
    fn clean_up(&mut self, effects: &[Effect]);
}

impl CleanEnd for State {
    fn job_ended_clean(
        &mut self,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let effects = self.job_ended(id, outcome, now)?;
        self.clean_up(&effects);
        Ok(effects)
    }

    fn clean_up(&mut self, effects: &[Effect]) {
        for e in effects {
            if let Effect::Cleanup { job, nodes } = e {
                for n in nodes {
                    let name = self.node(*n).unwrap().name.clone();
                    self.job_gone(&name, *job).unwrap();
                }
            }
        }
    }
}

/// Ends a running job the way a worker reports it.
fn end(st: &mut State, id: JobId, exit_code: i32, now: i64) {
    st.job_ended_clean(
        id,
        JobOutcome {
            exit_code,
            ..Default::default()
        },
        now,
    )
    .unwrap();
}

fn started(plan: &Plan) -> Vec<JobId> {
    plan.starts.iter().map(|s| s.job).collect()
}

fn state_of(st: &State, id: JobId) -> JobState {
    st.job(id).unwrap().state
}

/// Checks that node bookkeeping equals the sum of running allocations, and that the
/// pass's indexes hold exactly the pending records they describe.
fn assert_consistent(st: &State) {
    let index_of = |keep: fn(&crate::Job) -> bool| -> Vec<JobId> {
        st.pending_jobs()
            .filter(|j| keep(j))
            .map(|j| j.id)
            .collect()
    };
    let unheld = index_of(|j| j.hold == crate::job::Hold::None);
    assert_eq!(
        st.unheld.iter().copied().collect::<Vec<_>>(),
        unheld,
        "unheld index"
    );
    let singletons = index_of(crate::Job::is_singleton);
    assert_eq!(
        st.singletons.iter().copied().collect::<Vec<_>>(),
        singletons,
        "singleton index"
    );
    for j in st.jobs() {
        // Only a running placeholder hands nodes back, and only nodes it holds.
        for r in j.releasing_nodes() {
            assert_eq!(
                (j.state, j.spec.mode),
                (JobState::Running, crate::node::NodeMode::Kube),
                "job {} releases {r} but is not a running placeholder",
                j.id
            );
            assert!(
                j.alloc
                    .as_ref()
                    .is_some_and(|a| a.node_ids().any(|n| n == *r)),
                "job {} releases {r}, which it does not hold",
                j.id
            );
        }
    }
    for n in st.nodes() {
        let mut cpus = 0u32;
        let mut mem = 0u64;
        let mut gpus = 0u64;
        let mut count = 0;
        for j in st.running_jobs() {
            for na in j
                .alloc
                .as_ref()
                .unwrap()
                .nodes
                .iter()
                .filter(|na| na.node == n.id)
            {
                cpus += na.cpus;
                mem += na.mem_mb;
                for g in &na.gpus {
                    assert_eq!(gpus & (1 << g), 0, "GPU {g} of {} given twice", n.name);
                    gpus |= 1 << g;
                }
                count += 1;
            }
        }
        // Ended runs whose processes are not yet reported gone still hold their part.
        for e in &n.ending {
            assert_eq!(e.alloc.node, n.id, "{}: ending elsewhere", n.name);
            assert!(
                !n.jobs.contains(&e.job),
                "{}: job both running and ending",
                n.name
            );
            cpus += e.alloc.cpus;
            mem += e.alloc.mem_mb;
            for g in &e.alloc.gpus {
                assert_eq!(gpus & (1 << g), 0, "GPU {g} of {} given twice", n.name);
                gpus |= 1 << g;
            }
            assert_eq!(
                st.job(e.job).map(|j| j.spec.mode),
                Some(crate::node::NodeMode::Batch),
                "{}: only batch jobs end through COMPLETING",
                n.name
            );
            assert_eq!(
                n.mode,
                crate::node::NodeMode::Batch,
                "{}: mode changed under a COMPLETING job",
                n.name
            );
        }
        assert_eq!(n.jobs.len(), count, "{}: job list", n.name);
        assert_eq!(
            (n.alloc.cpus, n.alloc.mem_mb),
            (cpus, mem),
            "{}: alloc",
            n.name
        );
        assert_eq!(n.gpus_in_use, gpus, "{}: gpus", n.name);
        assert!(n.alloc.fits_in(&n.total), "{}: over-allocated", n.name);
        let modes: std::collections::BTreeSet<_> = n
            .jobs
            .iter()
            .map(|j| st.job(*j).unwrap().spec.mode)
            .collect();
        assert!(modes.len() <= 1, "{}: mixed modes", n.name);
        if let Some(m) = modes.first() {
            assert_eq!(*m, n.mode, "{}: node mode", n.name);
        }
    }
}
