//! Discrete-event replay of a job list under a policy, in simulated time.
//!
//! ```text
//!   jobs (by submit) ──► arrivals ─┐
//!                                  ├─► event time t ─► pass(t) ─► starts ─► ends heap
//!   running jobs ────► ends ───────┘        ▲                               │
//!                                           └───────────────────────────────┘
//! ```
//!
//! Time jumps from one event (a submit or an end) to the next; at each event
//! time every end and every arrival at that time is applied first, then one
//! scheduling pass runs. The machine is a processor count ([`Machine`]): trace
//! jobs ask for processors, not nodes, and counting keeps a pass O(queue)
//! even for the 93,312-processor CEA Curie machine, where one core node per
//! processor would make every placement scan tens of thousands of nodes.
//!
//! Policies:
//! - FCFS: start jobs in submit order while the first one fits; never skip it.
//! - EASY: FCFS, and when the first job does not fit it gets a reservation at
//!   the *shadow time* (when enough running jobs will have ended, by their
//!   estimates); a later job starts now if it fits and either ends by the
//!   shadow time or uses only the *extra* processors the reservation leaves.
//!   [`BackfillRule::ShadowOnly`] is RLScheduler's variant: only jobs that end
//!   strictly before the shadow time, no extra-processor rule.
//! - Tandem: the scheduling core itself, see [`super::tandem`]. FCFS and
//!   EASY are the textbook rules on the counted machine, so they stay exact
//!   and fast on every trace; Tandem's policy is only what the core does.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::SimError;
use super::swf::SimJob;
use super::tandem::TandemPolicy;

/// Which policy replays the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Fcfs,
    Easy,
    Tandem,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "easy" => Ok(Self::Easy),
            "tandem" => Ok(Self::Tandem),
            other => Err(format!(
                "unknown policy {other:?} (expected fcfs, easy or tandem)"
            )),
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::Easy => "easy",
            Self::Tandem => "tandem",
        })
    }
}

/// Which jobs EASY lets past a blocked queue head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BackfillRule {
    /// The classic rule: ends by the shadow time, or fits in the extra
    /// processors.
    Easy,
    /// RLScheduler's rule: ends strictly before the shadow time.
    ShadowOnly,
}

/// What one replay needs besides the jobs.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Processors in the machine.
    pub procs: u64,
    pub policy: Policy,
    pub backfill: BackfillRule,
    /// CPUs per node of the core's cluster (Tandem policy only); see
    /// [`super::tandem::node_cpus`].
    pub node_cpus: u64,
}

/// When each job started, and what the passes cost.
#[derive(Clone, Debug, Default)]
pub struct Replayed {
    /// Start time per job, aligned with the input slice.
    pub start: Vec<i64>,
    /// Passes that had at least one pending job.
    pub passes: u64,
    /// Wall time spent inside those passes.
    pub pass_time: Duration,
    /// The slowest pass.
    pub max_pass: Duration,
}

/// Replay `jobs` (sorted by submit time) from an empty machine. Every job fits
/// the machine (the cleaning rules guarantee it), so every job starts.
pub fn replay(jobs: &[SimJob], cfg: &ReplayConfig) -> Result<Replayed, SimError> {
    let mut machine = Machine::new(cfg.procs);
    let mut policy: Box<dyn Scheduler> = match cfg.policy {
        Policy::Fcfs => Box::new(Fcfs),
        Policy::Easy => Box::new(Easy { rule: cfg.backfill }),
        Policy::Tandem => {
            Box::new(TandemPolicy::new(jobs, cfg.procs, cfg.node_cpus).map_err(SimError::Core)?)
        }
    };
    let mut out = Replayed {
        start: vec![i64::MIN; jobs.len()],
        ..Replayed::default()
    };
    let mut queue: Vec<usize> = Vec::new();
    let mut next = 0;
    loop {
        let arrival = jobs.get(next).map(|j| j.submit);
        let now = match (arrival, machine.next_end()) {
            (Some(a), Some(e)) => a.min(e),
            (Some(a), None) => a,
            (None, Some(e)) => e,
            (None, None) => break,
        };
        for idx in machine.release_until(now) {
            policy.on_end(now, idx, &jobs[idx]);
        }
        while next < jobs.len() && jobs[next].submit <= now {
            queue.push(next);
            policy.on_submit(now, next, &jobs[next]);
            next += 1;
        }
        if queue.is_empty() {
            continue;
        }
        let began = Instant::now();
        let started = policy.pass(now, &mut machine, &mut queue, jobs);
        let took = began.elapsed();
        out.passes += 1;
        out.pass_time += took;
        out.max_pass = out.max_pass.max(took);
        for idx in started {
            out.start[idx] = now;
        }
        if let Some(e) = policy.error() {
            return Err(SimError::Core(e));
        }
    }
    if let Some(i) = out.start.iter().position(|s| *s == i64::MIN) {
        return Err(SimError::Core(format!(
            "trace job {} never started",
            jobs[i].id
        )));
    }
    Ok(out)
}

/// A replay policy: told about submits and ends, asked for starts.
pub(crate) trait Scheduler {
    fn on_submit(&mut self, _now: i64, _idx: usize, _job: &SimJob) {}
    fn on_end(&mut self, _now: i64, _idx: usize, _job: &SimJob) {}
    /// Start jobs at `now` on `machine`; remove them from `queue` (which holds
    /// pending job indices in submit order) and return them.
    fn pass(
        &mut self,
        now: i64,
        machine: &mut Machine,
        queue: &mut Vec<usize>,
        jobs: &[SimJob],
    ) -> Vec<usize>;
    /// Something the policy could not do; the replay stops with it.
    fn error(&mut self) -> Option<String> {
        None
    }
}

// === impl Machine ===

/// Processors as a counted resource, with running jobs by real end (events)
/// and by estimated end (reservations).
#[derive(Debug)]
pub(crate) struct Machine {
    free: u64,
    /// Real ends drive the simulation clock.
    ends: BinaryHeap<Reverse<(i64, usize)>>,
    /// (estimated end, job) -> processors: what a scheduler may know.
    planned: BTreeMap<(i64, usize), u64>,
    /// Estimated end per running job, to find it in `planned` at its end.
    est_end: Vec<(usize, i64, u64)>,
}

impl Machine {
    pub(crate) fn new(procs: u64) -> Self {
        Self {
            free: procs,
            ends: BinaryHeap::new(),
            planned: BTreeMap::new(),
            est_end: Vec::new(),
        }
    }

    pub(crate) fn free(&self) -> u64 {
        self.free
    }

    pub(crate) fn start(&mut self, now: i64, idx: usize, job: &SimJob) {
        debug_assert!(job.procs <= self.free);
        self.free -= job.procs;
        self.ends.push(Reverse((now + job.run, idx)));
        let est = now + job.estimate;
        self.planned.insert((est, idx), job.procs);
        self.est_end.push((idx, est, job.procs));
    }

    fn next_end(&self) -> Option<i64> {
        self.ends.peek().map(|Reverse((t, _))| *t)
    }

    /// End every job whose real end is at or before `now`.
    fn release_until(&mut self, now: i64) -> Vec<usize> {
        let mut done = Vec::new();
        while let Some(Reverse((t, idx))) = self.ends.peek().copied() {
            if t > now {
                break;
            }
            self.ends.pop();
            if let Some(pos) = self.est_end.iter().position(|(i, _, _)| *i == idx) {
                let (_, est, procs) = self.est_end.swap_remove(pos);
                self.planned.remove(&(est, idx));
                self.free += procs;
            }
            done.push(idx);
        }
        done
    }

    /// Running jobs as (estimated end, processors), earliest first. A job
    /// past its estimate is taken to end now.
    pub(crate) fn planned_ends(&self, now: i64) -> impl Iterator<Item = (i64, u64)> + '_ {
        self.planned
            .iter()
            .map(move |((t, _), p)| ((*t).max(now), *p))
    }

    /// EASY's reservation for a job of `need` processors: the earliest
    /// estimated time it fits, and the processors left over then.
    pub(crate) fn shadow(&self, now: i64, need: u64) -> (i64, u64) {
        let mut avail = self.free;
        if avail >= need {
            return (now, avail - need);
        }
        for (t, p) in self.planned_ends(now) {
            avail += p;
            if avail >= need {
                return (t, avail - need);
            }
        }
        // Unreachable for jobs that fit the machine; no backfill otherwise.
        (i64::MAX, 0)
    }
}

// === impl Fcfs ===

struct Fcfs;

impl Scheduler for Fcfs {
    fn pass(
        &mut self,
        now: i64,
        machine: &mut Machine,
        queue: &mut Vec<usize>,
        jobs: &[SimJob],
    ) -> Vec<usize> {
        start_heads(now, machine, queue, jobs)
    }
}

/// Start jobs from the front of `queue` while they fit.
fn start_heads(
    now: i64,
    machine: &mut Machine,
    queue: &mut Vec<usize>,
    jobs: &[SimJob],
) -> Vec<usize> {
    let mut k = 0;
    while k < queue.len() && jobs[queue[k]].procs <= machine.free() {
        machine.start(now, queue[k], &jobs[queue[k]]);
        k += 1;
    }
    queue.drain(..k).collect()
}

// === impl Easy ===

struct Easy {
    rule: BackfillRule,
}

impl Scheduler for Easy {
    fn pass(
        &mut self,
        now: i64,
        machine: &mut Machine,
        queue: &mut Vec<usize>,
        jobs: &[SimJob],
    ) -> Vec<usize> {
        let mut started = start_heads(now, machine, queue, jobs);
        if queue.is_empty() {
            return started;
        }
        let backfilled = backfill_behind_head(now, machine, queue, jobs, self.rule);
        started.extend(backfilled);
        started
    }
}

/// EASY backfilling behind `queue[0]`, which does not fit now. Starts jobs,
/// removes them from `queue`, and returns them.
pub(crate) fn backfill_behind_head(
    now: i64,
    machine: &mut Machine,
    queue: &mut Vec<usize>,
    jobs: &[SimJob],
    rule: BackfillRule,
) -> Vec<usize> {
    let (shadow, mut extra) = machine.shadow(now, jobs[queue[0]].procs);
    let mut started = Vec::new();
    for &idx in &queue[1..] {
        if machine.free() == 0 {
            break;
        }
        let job = &jobs[idx];
        if job.procs > machine.free() {
            continue;
        }
        let end = now.saturating_add(job.estimate);
        let fits = match rule {
            BackfillRule::Easy if end <= shadow => true,
            BackfillRule::Easy if job.procs <= extra => {
                extra -= job.procs;
                true
            }
            BackfillRule::Easy => false,
            BackfillRule::ShadowOnly => end < shadow,
        };
        if fits {
            machine.start(now, idx, job);
            started.push(idx);
        }
    }
    if !started.is_empty() {
        let mut gone = started.clone();
        gone.sort_unstable();
        queue.retain(|i| gone.binary_search(i).is_err());
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, submit: i64, run: i64, procs: u64) -> SimJob {
        SimJob {
            id,
            submit,
            run,
            procs,
            estimate: run,
            user: 1,
            group: 1,
            recorded_wait: None,
        }
    }

    fn run(jobs: &[SimJob], procs: u64, policy: Policy, backfill: BackfillRule) -> Vec<i64> {
        replay(
            jobs,
            &ReplayConfig {
                procs,
                policy,
                backfill,
                node_cpus: 1,
            },
        )
        .unwrap()
        .start
    }

    /// 4 processors.
    /// j1: t=0, 2 procs, 100 s  -> starts 0
    /// j2: t=1, 4 procs,  50 s  -> blocked until j1 ends: 100
    /// j3: t=2, 2 procs, 150 s  -> FCFS: after j2 (150); EASY: the shadow time
    ///     is 100 and 2 + 150 > 100, and j2 leaves no extra processors, so it
    ///     cannot backfill either -> 150
    /// j4: t=3, 2 procs,  90 s  -> FCFS 150; EASY: 3 + 90 = 93 <= 100: backfills at 3
    #[test]
    fn easy_backfills_only_what_cannot_delay_the_head() {
        let jobs = [
            job(1, 0, 100, 2),
            job(2, 1, 50, 4),
            job(3, 2, 150, 2),
            job(4, 3, 90, 2),
        ];
        assert_eq!(
            run(&jobs, 4, Policy::Fcfs, BackfillRule::Easy),
            vec![0, 100, 150, 150]
        );
        assert_eq!(
            run(&jobs, 4, Policy::Easy, BackfillRule::Easy),
            vec![0, 100, 150, 3]
        );
        // Under RLScheduler's strict rule 93 < 100 still backfills.
        assert_eq!(
            run(&jobs, 4, Policy::Easy, BackfillRule::ShadowOnly),
            vec![0, 100, 150, 3]
        );
    }

    /// 4 processors, j1 holds 3 until 100. j2 wants 2 (shadow 100, extra 4 - 2 = 2
    /// processors free at 100 beyond its need). j3 wants 1 for 500 s: it ends
    /// after the shadow time but fits in the extra processors, so classic EASY
    /// starts it at 2; the shadow-only rule makes it wait for j2 (100) and it
    /// starts with j2 at 100 (3 free then).
    #[test]
    fn extra_processors_rule_is_classic_easy_only() {
        let jobs = [job(1, 0, 100, 3), job(2, 1, 50, 2), job(3, 2, 500, 1)];
        assert_eq!(
            run(&jobs, 4, Policy::Easy, BackfillRule::Easy),
            vec![0, 100, 2]
        );
        assert_eq!(
            run(&jobs, 4, Policy::Easy, BackfillRule::ShadowOnly),
            vec![0, 100, 100]
        );
    }

    /// A backfilled job never delays the head even when estimates are long:
    /// j3's estimate (200) is what counts, not its real run time (10).
    #[test]
    fn backfill_trusts_estimates_not_run_times() {
        let mut j3 = job(3, 2, 10, 2);
        j3.estimate = 200;
        let jobs = [job(1, 0, 100, 2), job(2, 1, 50, 4), j3];
        assert_eq!(
            run(&jobs, 4, Policy::Easy, BackfillRule::Easy),
            vec![0, 100, 150]
        );
    }

    #[test]
    fn idle_gaps_and_simultaneous_events() {
        // j2 arrives long after j1 ended; j3 and j4 arrive together.
        let jobs = [
            job(1, 0, 10, 4),
            job(2, 1000, 10, 4),
            job(3, 2000, 5, 2),
            job(4, 2000, 5, 2),
        ];
        assert_eq!(
            run(&jobs, 4, Policy::Fcfs, BackfillRule::Easy),
            vec![0, 1000, 2000, 2000]
        );
    }
}
