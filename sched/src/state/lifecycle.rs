//! A job's life once a pass places it: start, end, array settlement, purge.

use crate::effect::{Effect, RunRecord};
use crate::job::{
    Allocation, Hold, Job, JobOutcome, JobState, KillReason, NodeAlloc, PreemptMode, Reason, Shape,
};
use crate::node::{Ending, NodeMode};
use crate::{JobId, NodeId, Tres};

use super::{JobError, NodeError, State, control::back_to_pending};

/// The reason Slurm gives a node drained because a job's processes survived the kill.
pub const KILL_TASK_FAILED: &str = "Kill task failed";

impl State {
    /// Marks a pending job RUNNING on `nodes` (already chosen by a pass), recording concrete
    /// GPU indices. Array metas are split first by the caller. `room` (one per node of
    /// `nodes`, in that order) is what each node can give beyond the job's even share
    /// without taking what the pass counted on for anything else.
    pub(crate) fn start_on(
        &mut self,
        id: JobId,
        nodes: &[NodeId],
        room: &[Tres],
        now: i64,
    ) -> crate::cycle::Start {
        let job = &self.jobs[&id];
        let shape = job.shape;
        let mode = job.spec.mode;
        let mut sorted: Vec<(NodeId, Tres)> = nodes
            .iter()
            .enumerate()
            .map(|(k, n)| (*n, room.get(k).copied().unwrap_or_default()))
            .collect();
        sorted
            .sort_by(|(a, _), (b, _)| self.nodes[a.index()].name.cmp(&self.nodes[b.index()].name));
        let mut alloc = Allocation {
            nodes: Vec::with_capacity(sorted.len()),
        };
        let spec = &job.spec;
        let cpt = spec.cpus_per_task.max(1);
        let tasks = lays_out_tasks(job).then(|| {
            let caps: Vec<u32> = sorted
                .iter()
                .map(|(_, r)| {
                    shape.tasks_per_node.saturating_add(extra_tasks(
                        &shape,
                        spec.mem_per_node_mb,
                        cpt,
                        r,
                    ))
                })
                .collect();
            job_task_counts(spec.ntasks, &caps)
        });
        for (k, (nid, r)) in sorted.iter().enumerate() {
            let n = &self.nodes[nid.index()];
            let (cpus, mem_mb, ngpus) = if shape.exclusive {
                (n.total.cpus, n.total.mem_mb, n.total.gpus)
            } else if let Some(t) = tasks.as_ref().and_then(|t| t.get(k)) {
                let cpus = t
                    .saturating_mul(cpt)
                    .min(shape.per_node.cpus.saturating_add(r.cpus));
                // Memory asked per CPU (or the per-CPU default) follows the CPUs; `--mem`
                // is per node whatever the CPUs.
                let mem_mb = if spec.mem_per_node_mb.is_none() && shape.per_node.cpus > 0 {
                    shape.per_node.mem_mb.saturating_mul(u64::from(cpus))
                        / u64::from(shape.per_node.cpus)
                } else {
                    shape.per_node.mem_mb
                };
                (cpus, mem_mb, shape.per_node.gpus)
            } else {
                (
                    shape.per_node.cpus,
                    shape.per_node.mem_mb,
                    shape.per_node.gpus,
                )
            };
            let gpus = n.pick_gpus(ngpus).unwrap_or_default();
            alloc.nodes.push(NodeAlloc {
                node: *nid,
                cpus,
                mem_mb,
                gpus,
            });
        }
        self.attach(id, &alloc, mode, shape.exclusive);
        let start = crate::cycle::Start {
            job: id,
            nodes: alloc
                .nodes
                .iter()
                .map(|na| crate::cycle::StartNode {
                    node: na.node,
                    name: self.nodes[na.node.index()].name.clone(),
                    cpus: na.cpus,
                    mem_mb: na.mem_mb,
                    gpus: na.gpus.clone(),
                })
                .collect(),
        };
        self.with_job(id, |j| {
            j.state = JobState::Running;
            j.reason = Reason::None;
            j.start_time = Some(now);
            j.end_time = None;
            j.alloc = Some(Box::new(alloc));
            j.kill = None;
        });
        start
    }

    /// Splits the next pending index of an array into its own PENDING job record (new id) and
    /// returns its id.
    pub(crate) fn split_task(&mut self, meta: JobId, now: i64) -> Option<JobId> {
        let id = JobId(self.next_job_id);
        let m = self.jobs.get(&meta)?;
        let a = m.array.as_ref()?;
        let index = a.pending.first()?;
        let mut spec = m.spec.clone();
        spec.array = None;
        let task = Job {
            id,
            spec,
            state: JobState::Pending,
            reason: Reason::None,
            priority: m.priority,
            submit_time: m.submit_time,
            eligible_time: m.eligible_time.or(Some(now)),
            start_time: None,
            end_time: None,
            time_limit: m.time_limit,
            shape: m.shape,
            alloc: None,
            exit_code: 0,
            signal: 0,
            array_job_id: Some(meta),
            array_task_id: Some(index),
            array: None,
            restarts: 0,
            hold: Hold::None,
            kill: None,
            preempt_time: None,
            cancelled_by: None,
            completing: None,
            releasing: None,
        };
        self.next_job_id += 1;
        self.with_job(meta, |m| {
            if let Some(a) = m.array.as_mut() {
                a.pending.pop_first();
                a.active += 1;
                a.last_start = Some(now);
                a.tasks.push((index, id));
                if a.pending.is_empty() {
                    m.state = JobState::Running;
                }
            }
        });
        self.jobs.insert(id, task);
        self.index(id);
        Some(id)
    }

    /// The worker confirms the launch. Idempotent; corrects the start time to the worker's.
    pub fn job_started(&mut self, id: JobId, start_time: i64) -> Result<(), JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if job.state != JobState::Running {
            return Err(JobError::InvalidState {
                job: id,
                state: job.state,
                op: "start",
            });
        }
        if job.start_time != Some(start_time) && start_time > 0 {
            self.with_job(id, |j| j.start_time = Some(start_time));
        }
        Ok(())
    }

    /// A worker reports the end of a run. Decides the state by Slurm's rules (a kill the
    /// controller asked for wins: CANCELLED, PREEMPTED, NODE_FAIL; then launch failure ->
    /// FAILED, time limit -> TIMEOUT, a signal or non-zero exit -> FAILED, else COMPLETED),
    /// frees the resources, charges usage, and requeues when the kill asked for it.
    /// Reporting the end of a job that is not running is a no-op (workers re-report after a
    /// reconnect).
    pub fn job_ended(
        &mut self,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if job.state != JobState::Running || job.is_array_meta() {
            return Ok(Vec::new());
        }
        let (state, reason) = match job.kill {
            Some(KillReason::Cancel) => (JobState::Cancelled, Reason::None),
            Some(KillReason::Preempt(_)) => (JobState::Preempted, Reason::None),
            Some(KillReason::NodeFail) => (JobState::NodeFail, Reason::NodeDown),
            Some(KillReason::Requeue) => (JobState::Requeued, Reason::None),
            None if outcome.launch_error.is_some() => (JobState::Failed, Reason::JobLaunchFailure),
            None if outcome.timed_out => (JobState::Timeout, Reason::TimeLimit),
            None if outcome.cancelled => (JobState::Cancelled, Reason::None),
            // As Slurm: an OOM kill anywhere in the job ends it OUT_OF_MEMORY (reason
            // OutOfMemory), even when the batch script survived it.
            None if outcome.out_of_memory => (JobState::OutOfMemory, Reason::OutOfMemory),
            None if outcome.signal != 0 || outcome.exit_code != 0 => {
                (JobState::Failed, Reason::NonZeroExitCode)
            }
            None => (JobState::Completed, Reason::None),
        };
        // The batch host vouches for its own node only; the others report for themselves.
        let gone_on = outcome
            .processes_gone
            .then(|| {
                job.alloc
                    .as_ref()
                    .and_then(|a| a.nodes.first())
                    .map(|n| n.node)
            })
            .flatten();
        Ok(self.end_run_on(
            id,
            state,
            reason,
            outcome.exit_code,
            outcome.signal,
            gone_on,
            now,
        ))
    }

    /// [`State::job_ended`] as reported by the worker of `node`: ignored unless that node is
    /// the job's batch host now. A worker that comes back after its node was declared lost
    /// may report the end of a run that was already requeued and restarted elsewhere; that
    /// report must not end the new run.
    pub fn job_ended_on(
        &mut self,
        node: &str,
        id: JobId,
        outcome: JobOutcome,
        now: i64,
    ) -> Result<Vec<Effect>, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        let host = job
            .alloc
            .as_ref()
            .and_then(|a| a.nodes.first())
            .map(|n| self.nodes[n.node.index()].name.as_str());
        if host != Some(node) {
            return Ok(Vec::new());
        }
        self.job_ended(id, outcome, now)
    }

    /// Ends the current run of a running job in `state`; requeues when the state and the
    /// job's settings call for it. No node is known clean: a batch job's nodes all stay
    /// held (COMPLETING) until each reports its processes gone.
    pub(crate) fn end_run(
        &mut self,
        id: JobId,
        state: JobState,
        reason: Reason,
        exit_code: i32,
        signal: i32,
        now: i64,
    ) -> Vec<Effect> {
        self.end_run_on(id, state, reason, exit_code, signal, None, now)
    }

    /// [`State::end_run`], `gone_on` being a node whose worker already reported the job's
    /// processes there gone (the batch host's end report): that node is freed at once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn end_run_on(
        &mut self,
        id: JobId,
        state: JobState,
        reason: Reason,
        exit_code: i32,
        signal: i32,
        gone_on: Option<NodeId>,
        now: i64,
    ) -> Vec<Effect> {
        let Some(job) = self.jobs.get(&id) else {
            return Vec::new();
        };
        let requeue_ok = job.spec.requeue_allowed(self.config.sched.job_requeue);
        let requeue = match state {
            JobState::Requeued => true,
            JobState::Preempted => {
                matches!(job.kill, Some(KillReason::Preempt(PreemptMode::Requeue))) && requeue_ok
            }
            JobState::NodeFail => requeue_ok,
            _ => false,
        };
        let alloc = job.alloc.as_deref().cloned().unwrap_or_default();
        let record = RunRecord {
            job: id,
            state,
            start_time: job.start_time,
            end_time: now,
            exit_code,
            signal,
            nodes: alloc.node_ids().collect(),
            requeued: requeue,
        };
        let mode = job.spec.mode;
        self.charge_job(id, now);
        let mut effects = Vec::with_capacity(2);
        effects.push(Effect::RunEnded(record));
        if mode == NodeMode::Kube {
            // A placeholder ends when the bridge reports its pods gone: nothing of it is
            // left on any node.
            self.detach(id, &alloc);
        } else {
            let held = self.hold_ending(id, &alloc, gone_on, now);
            if !held.is_empty() {
                effects.push(Effect::Cleanup {
                    job: id,
                    nodes: held,
                });
            }
        }
        // Whatever it was handing back goes with the rest: the run is over everywhere.
        if self.jobs.get(&id).is_some_and(|j| j.releasing.is_some()) {
            self.with_job(id, |j| j.releasing = None);
        }
        self.preempting.retain(|_, victims| {
            victims.retain(|v| *v != id);
            !victims.is_empty()
        });
        if requeue {
            self.with_job(id, back_to_pending);
        } else {
            self.finish(id, state, reason, now, exit_code, signal);
        }
        effects
    }

    /// Takes an ended run off its nodes: `gone_on` is freed; every other node keeps what the
    /// run held there as an [`Ending`] (COMPLETING) until its worker reports the job's
    /// processes gone. Returns the nodes held.
    fn hold_ending(
        &mut self,
        id: JobId,
        alloc: &Allocation,
        gone_on: Option<NodeId>,
        now: i64,
    ) -> Vec<NodeId> {
        let mut held = Vec::new();
        for na in &alloc.nodes {
            if Some(na.node) == gone_on {
                self.detach_node(id, na);
                continue;
            }
            let n = &mut self.nodes[na.node.index()];
            n.jobs.retain(|j| *j != id);
            // A job requeued and restarted before its earlier run was cleaned cannot be on
            // that node again (it takes no work meanwhile), so one entry per job suffices.
            if !n.ending.iter().any(|e| e.job == id) {
                n.ending.push(Ending {
                    job: id,
                    alloc: na.clone(),
                    since: now,
                });
            }
            self.changes.nodes.insert(na.node);
            held.push(na.node);
        }
        if !held.is_empty() {
            self.with_job(id, |j| {
                let c = j.completing.get_or_insert_with(Box::default);
                for n in &held {
                    if !c.contains(n) {
                        c.push(*n);
                    }
                }
            });
        }
        held
    }

    /// The worker of `node` reports that job `id`'s processes there are gone: the node gives
    /// back what the run held, and the job leaves COMPLETING once no node is left. Reports
    /// for a job not held there are ignored (a repeat, or one already released).
    pub fn job_gone(&mut self, node: &str, id: JobId) -> Result<(), NodeError> {
        let nid = *self
            .node_by_name
            .get(node)
            .ok_or_else(|| NodeError::Unknown(node.to_string()))?;
        let n = &mut self.nodes[nid.index()];
        let Some(k) = n.ending.iter().position(|e| e.job == id) else {
            return Ok(());
        };
        let ending = n.ending.swap_remove(k);
        self.detach_node(id, &ending.alloc);
        if self.jobs.get(&id).is_some_and(|j| j.completing_on(nid)) {
            self.with_job(id, |j| j.done_completing_on(nid));
        }
        Ok(())
    }

    /// Drains, with Slurm's reason "Kill task failed", every node where a job's processes
    /// outlived the kill: still there `after_s` seconds after the run ended. The job stays
    /// held there until they are gone; the node stays drained until an administrator
    /// resumes it. Returns the names of the nodes drained now.
    pub fn drain_unkillable(&mut self, now: i64, after_s: i64) -> Vec<String> {
        let mut drained = Vec::new();
        for n in &mut self.nodes {
            if n.drain
                || !n
                    .ending
                    .iter()
                    .any(|e| now.saturating_sub(e.since) >= after_s)
            {
                continue;
            }
            n.drain = true;
            n.reason = Some(KILL_TASK_FAILED.to_string());
            n.reason_by = None;
            self.changes.nodes.insert(n.id);
            drained.push(n.name.clone());
        }
        drained
    }

    /// Puts a job in a terminal state and updates its array's counters.
    pub(super) fn finish(
        &mut self,
        id: JobId,
        state: JobState,
        reason: Reason,
        now: i64,
        exit_code: i32,
        signal: i32,
    ) {
        let Some(array) = self.with_job(id, |j| {
            // The allocation stays on the record (not on the nodes) so finished jobs still
            // show their node list and GPUs; only RUNNING jobs count against nodes.
            j.state = state;
            j.reason = reason;
            j.end_time = Some(now);
            j.kill = None;
            j.exit_code = exit_code;
            j.signal = signal;
            j.array_job_id
        }) else {
            return;
        };
        if let Some(meta) = array {
            self.with_job(meta, |m| {
                if let Some(a) = m.array.as_mut() {
                    a.active = a.active.saturating_sub(1);
                    if state == JobState::Completed {
                        a.ok += 1;
                    } else {
                        a.not_ok += 1;
                        if state == JobState::Cancelled {
                            a.cancelled += 1;
                        }
                    }
                }
            });
            self.settle_array(meta, now);
        }
    }

    /// Gives an array meta its final state once every index has run.
    pub(super) fn settle_array(&mut self, meta: JobId, now: i64) {
        let Some(m) = self.jobs.get(&meta) else {
            return;
        };
        let Some(a) = m.array.as_ref() else { return };
        if m.state.is_terminal() {
            return;
        }
        if a.is_done() {
            let state = if a.not_ok == 0 {
                JobState::Completed
            } else if a.cancelled == a.not_ok {
                JobState::Cancelled
            } else {
                JobState::Failed
            };
            self.with_job(meta, |m| {
                m.state = state;
                m.end_time = Some(now);
            });
        } else if a.pending.is_empty() && m.state == JobState::Pending {
            self.with_job(meta, |m| m.state = JobState::Running);
        }
    }

    /// Removes finished records that ended before `before` (an array meta only once all its
    /// tasks are finished and removable). Returns them; the controller deletes them from its
    /// store (they are also in `Changes::removed_jobs`).
    pub fn purge_finished(&mut self, before: i64) -> Vec<JobId> {
        let mut removed = Vec::new();
        let candidates: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state.is_terminal() && j.end_time.is_some_and(|e| e < before))
            .map(|j| j.id)
            .collect();
        for id in candidates {
            // A task stays while its meta lives, so aftercorr and squeue on the array work.
            let keep = self.jobs[&id]
                .array_job_id
                .is_some_and(|m| self.jobs.get(&m).is_some_and(|m| !m.state.is_terminal()));
            if keep {
                continue;
            }
            self.unindex(id);
            self.jobs.remove(&id);
            self.changes.jobs.remove(&id);
            self.changes.removed_jobs.push(id);
            removed.push(id);
        }
        removed
    }
}

/// Whether a job's nodes get CPUs for the tasks Slurm lays out on each (`-n` without
/// `--ntasks-per-node` and without per-task GPUs, which stay per node), filling the nodes in
/// order as far as their room goes, rather than the even share the pass placed.
pub(crate) fn lays_out_tasks(job: &Job) -> bool {
    let spec = &job.spec;
    !job.shape.exclusive && spec.ntasks > 0 && spec.ntasks_per_node == 0 && spec.gpus_per_task == 0
}

/// Whole tasks (of `cpt` CPUs, and their memory when memory follows the CPUs) that `room`
/// holds beyond the job's even share.
fn extra_tasks(shape: &Shape, mem_per_node: Option<u64>, cpt: u32, room: &Tres) -> u32 {
    let by_cpus = room.cpus / cpt;
    // Rounded up: a node's memory is its CPUs' share rounded down, so this never promises
    // more than `room` has.
    let per_cpu_mb = if mem_per_node.is_none() && shape.per_node.cpus > 0 {
        shape
            .per_node
            .mem_mb
            .div_ceil(u64::from(shape.per_node.cpus))
    } else {
        0
    };
    if per_cpu_mb == 0 {
        return by_cpus;
    }
    let by_mem = room.mem_mb / per_cpu_mb.saturating_mul(u64::from(cpt));
    by_cpus.min(u32::try_from(by_mem).unwrap_or(u32::MAX))
}

/// Tasks of a `-n` job on each of its nodes, as Slurm 22.05 lays them out: one on every
/// node, then the rest filling the nodes in order, each up to its `caps` entry (the tasks
/// its free CPUs hold: `-N2 -n3` -> `2,1`, `-N3 -n4` -> `2,1(x2)`, `-N2 -n5` on idle
/// 64-CPU nodes -> `4,1`). The pass places every node for the even share (`tasks_per_node`,
/// at most each cap), so the counts always add up to `ntasks`.
pub fn job_task_counts(ntasks: u32, caps: &[u32]) -> Vec<u32> {
    let mut out = vec![u32::from(ntasks > 0); caps.len()];
    let mut left = ntasks.saturating_sub(u32::try_from(caps.len()).unwrap_or(u32::MAX));
    for (n, cap) in out.iter_mut().zip(caps) {
        let more = cap.saturating_sub(*n).min(left);
        *n += more;
        left -= more;
    }
    out
}

#[cfg(test)]
mod layout_tests {
    use super::job_task_counts;
    use crate::job::JobSpec;
    use crate::state::State;

    #[test]
    fn one_task_a_node_then_the_first_nodes_fill_up_to_the_cap() {
        // Slurm 22.05: `-N2 -n3` -> `2,1`, `-N3 -n4` -> `2,1(x2)`.
        assert_eq!(job_task_counts(3, &[2, 2]), [2, 1]);
        assert_eq!(job_task_counts(4, &[2, 2, 2]), [2, 1, 1]);
        assert_eq!(job_task_counts(4, &[2, 2]), [2, 2]);
        assert_eq!(job_task_counts(5, &[3, 3]), [3, 2]);
        assert_eq!(job_task_counts(1, &[1]), [1]);
        // Slurm 22.05 on idle 64-CPU nodes: `-N2 -n5` -> `4,1`, `-N3 -n7` -> `5,1(x2)`,
        // `-N2 -n100` -> `64,36`, `-N2 -n40 -c2` -> `32,8`.
        assert_eq!(job_task_counts(5, &[64, 64]), [4, 1]);
        assert_eq!(job_task_counts(7, &[64, 64, 64]), [5, 1, 1]);
        assert_eq!(job_task_counts(100, &[64, 64]), [64, 36]);
        assert_eq!(job_task_counts(40, &[32, 32]), [32, 8]);
        // A node with less room takes less; the next fills up.
        assert_eq!(job_task_counts(7, &[4, 64]), [4, 3]);
        // Fewer tasks than nodes: every node still holds one task's CPUs.
        assert_eq!(job_task_counts(2, &[1, 1, 1]), [1, 1, 1]);
    }

    /// Slurm 22.05, `srun -N2 -n3` outside a job: `SLURM_JOB_CPUS_PER_NODE=2,1`, `scontrol
    /// show job`: `NumCPUs=3`, sacct `AllocCPUS=3`; with `-c2`: `4,2` and 6.
    #[test]
    fn a_job_of_n_tasks_holds_cpus_for_its_layout_on_each_node() {
        let mut st = State::test_cluster(2, 8, 8_000, 0);
        let three = st.submit(JobSpec::test().nodes(2).ntasks(3), 0).unwrap();
        let six = st
            .submit(
                JobSpec::test()
                    .nodes(2)
                    .ntasks(3)
                    .cpus_per_task(2)
                    .mem_per_cpu(100),
                0,
            )
            .unwrap();
        let plan = st.schedule(1);
        let cpus = |id| -> Vec<u32> {
            let s = plan.starts.iter().find(|s| s.job == id).unwrap();
            s.nodes.iter().map(|n| n.cpus).collect()
        };
        assert_eq!(cpus(three), [2, 1]);
        assert_eq!(cpus(six), [4, 2]);
        let mem: Vec<u64> = plan
            .starts
            .iter()
            .find(|s| s.job == six)
            .unwrap()
            .nodes
            .iter()
            .map(|n| n.mem_mb)
            .collect();
        assert_eq!(mem, [400, 200], "memory per CPU follows the CPUs");
        // The nodes are charged what the jobs hold: 6 of 16 CPUs on the first, 3 on the
        // second.
        let used: Vec<u32> = st.nodes().map(|n| n.alloc.cpus).collect();
        assert_eq!(used, [6, 3]);
    }

    fn start_cpus(plan: &crate::cycle::Plan, id: crate::JobId) -> Vec<u32> {
        let s = plan.starts.iter().find(|s| s.job == id).unwrap();
        s.nodes.iter().map(|n| n.cpus).collect()
    }

    /// Slurm 22.05 on idle 64-CPU nodes: `srun -N2 -n5` -> `SLURM_JOB_CPUS_PER_NODE=4,1`,
    /// `-N3 -n7` -> `5,1(x2)`, `-N2 -n40 -c2` -> `64,16`.
    #[test]
    fn a_job_of_n_tasks_fills_its_first_nodes_as_far_as_they_have_room() {
        let mut st = State::test_cluster(3, 64, 64_000, 0);
        let five = st.submit(JobSpec::test().nodes(2).ntasks(5), 0).unwrap();
        let plan = st.schedule(1);
        assert_eq!(start_cpus(&plan, five), [4, 1]);
        let seven = st.submit(JobSpec::test().nodes(3).ntasks(7), 2).unwrap();
        let plan = st.schedule(3);
        // node-01 holds 4 of five's CPUs: 60 left, still room for seven's first five tasks.
        assert_eq!(start_cpus(&plan, seven), [5, 1, 1]);
        let forty = st
            .submit(JobSpec::test().nodes(2).ntasks(40).cpus_per_task(2), 4)
            .unwrap();
        let plan = st.schedule(5);
        // 55 CPUs free on node-01 (27 two-CPU tasks), 62 on node-02: 27 and 13 tasks.
        assert_eq!(start_cpus(&plan, forty), [54, 26]);
    }

    /// Two jobs of one pass on 8-CPU nodes: the `-n5` job's even share is 3 a node, the
    /// one-node job takes 5 CPUs; the layout fills the first node only where the other
    /// start leaves room, and no node ends up over its CPUs.
    #[test]
    fn the_layout_never_takes_what_another_start_of_the_pass_counted_on() {
        let mut st = State::test_cluster(2, 8, 8_000, 0);
        let spread = st.submit(JobSpec::test().nodes(2).ntasks(5), 0).unwrap();
        let single = st.submit(JobSpec::test().nodes(1).ntasks(5), 0).unwrap();
        let plan = st.schedule(1);
        let a = start_cpus(&plan, spread);
        assert_eq!(a.iter().sum::<u32>(), 5);
        assert_eq!(start_cpus(&plan, single), [5]);
        let used: Vec<u32> = st.nodes().map(|n| n.alloc.cpus).collect();
        assert!(used.iter().all(|&c| c <= 8), "{used:?}");
        assert_eq!(used.iter().sum::<u32>(), 10);
    }
}
