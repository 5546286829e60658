//! Jobs: what a user asked for ([`JobSpec`]), and the record the scheduler keeps ([`Job`]).
//!
//! Only scheduling fields live here. The script, argv, environment, working directory and
//! output patterns are payload the controller stores beside the job; keeping them out makes a
//! pending job a few hundred bytes. Rare parts (array, dependency, constraint, allocation)
//! are `Option<Box<..>>` so a plain pending job pays one pointer for each.
//!
//! # Layout
//!
//! - `spec`: the request ([`JobSpec`]), its validation, and its [`Shape`].
//! - `state`: [`JobState`], [`Reason`], holds and kill reasons, with Slurm's names.
//! - `run`: a run's [`Allocation`] and its [`JobOutcome`].
//! - here: the record ([`Job`]) that ties them together.

mod run;
mod spec;
mod state;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::array::ArrayState;
use crate::{JobId, NodeId};

pub use run::{Allocation, JobOutcome, NodeAlloc};
pub use spec::{
    JobSpec, MAX_CPUS_PER_TASK, MAX_GPUS_PER_JOB, MAX_NAME_LEN, MAX_NICE, MAX_NODES_PER_JOB,
    MAX_TASKS_PER_JOB, NodeCaps, Shape, SpecError,
};
pub use state::{Hold, JobState, KillReason, PreemptMode, Reason};

/// The scheduler's record of a job (also of an array's "meta" record, see `array`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub state: JobState,
    /// Pending reason, or why it ended.
    pub reason: Reason,
    /// Last computed priority (Slurm's 32-bit-ish scale, larger runs first).
    pub priority: u64,
    pub submit_time: i64,
    /// When it last became eligible (dependencies, hold, begin time all clear).
    pub eligible_time: Option<i64>,
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Resolved limit in seconds (spec or partition default); `None` = no limit.
    pub time_limit: Option<u64>,
    pub shape: Shape,
    /// The nodes of the current run; for a finished job, of its last run. Only RUNNING jobs
    /// hold their allocation on the nodes.
    pub alloc: Option<Box<Allocation>>,
    pub exit_code: i32,
    pub signal: i32,
    /// For array tasks: the array's job id and this task's index.
    pub array_job_id: Option<JobId>,
    pub array_task_id: Option<u32>,
    /// For an array's meta record: the indices still pending and task counters.
    pub array: Option<Box<ArrayState>>,
    /// Times it was requeued.
    pub restarts: u32,
    pub hold: Hold,
    /// Set when the controller was told to end the running job; decides the final state.
    pub kill: Option<KillReason>,
    pub preempt_time: Option<i64>,
    /// The uid of the user whose cancel ended or is ending the job (Slurm's `requid`:
    /// sacct shows `CANCELLED by 1000`); `None` for the controller's own cancels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<u32>,
    /// Nodes of the last run whose processes are not yet reported gone: while any is, the
    /// job shows COMPLETING (Slurm's flag over its final state). The nodes themselves hold
    /// what the run had there (`Node::ending`).
    /// Boxed: rare, and a pending job's record must stay small.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completing: Option<Box<Vec<NodeId>>>,
    /// Nodes a RUNNING `kube`-mode placeholder must hand back while it keeps the others
    /// (drained, or lost: its pods there run under the kubelet, so nothing is known to
    /// have stopped). The bridge evicts the group's pods on them, then releases them
    /// ([`crate::state::State::release_placeholder_nodes`]); until then each stays held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releasing: Option<Box<Vec<NodeId>>>,
}

impl Job {
    /// A record just submitted: PENDING, held if the spec asks, no reason yet.
    pub(crate) fn pending(
        id: JobId,
        spec: JobSpec,
        shape: Shape,
        time_limit: Option<u64>,
        now: i64,
    ) -> Job {
        let hold = if spec.hold { Hold::User } else { Hold::None };
        let array = spec
            .array
            .as_deref()
            .map(|a| Box::new(crate::array::ArrayState::new(a)));
        Job {
            id,
            spec,
            state: JobState::Pending,
            reason: Reason::None,
            priority: 0,
            submit_time: now,
            eligible_time: None,
            start_time: None,
            end_time: None,
            time_limit,
            shape,
            alloc: None,
            exit_code: 0,
            signal: 0,
            array_job_id: None,
            array_task_id: None,
            array,
            restarts: 0,
            hold,
            kill: None,
            preempt_time: None,
            cancelled_by: None,
            completing: None,
            releasing: None,
        }
    }

    /// The state squeue and scontrol show: COMPLETING while processes of the ended run are
    /// still awaited on some node (a requeued job's too, as Slurm shows it), else `state`.
    /// `state` keeps the final state, which accounting records.
    pub fn shown_state(&self) -> JobState {
        if self.completing.is_some()
            && (self.state == JobState::Pending || self.state.is_terminal())
        {
            JobState::Completing
        } else {
            self.state
        }
    }

    /// Whether the processes of an ended run are still awaited on `node`.
    pub fn completing_on(&self, node: NodeId) -> bool {
        self.completing.as_ref().is_some_and(|c| c.contains(&node))
    }

    /// Nodes the placeholder must hand back (see [`Job::releasing`]).
    pub fn releasing_nodes(&self) -> &[NodeId] {
        self.releasing.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Nodes where the processes of an ended run are still awaited.
    pub fn completing_nodes(&self) -> &[NodeId] {
        self.completing.as_deref().map_or(&[], Vec::as_slice)
    }

    /// `node` reported (or can no longer report): the job waits for it no more, and leaves
    /// COMPLETING with the last one.
    pub(crate) fn done_completing_on(&mut self, node: NodeId) {
        if let Some(c) = self.completing.as_mut() {
            c.retain(|n| *n != node);
            if c.is_empty() {
                self.completing = None;
            }
        }
    }

    /// Whether this is an array's meta record (pending indices, never runs itself).
    pub fn is_array_meta(&self) -> bool {
        self.array.is_some()
    }

    /// Whether it has a `singleton` dependency (one job of its user and name at a time).
    pub fn is_singleton(&self) -> bool {
        self.spec
            .dependency
            .as_ref()
            .is_some_and(|d| d.has_singleton())
    }

    /// `12`, `12_3` for a task, `12_[6-99%4]` for an array's pending indices.
    pub fn display_id(&self) -> String {
        match (&self.array, self.array_job_id, self.array_task_id) {
            (Some(a), _, _) => {
                let throttle = self.spec.array.as_ref().and_then(|s| s.throttle);
                let mut s = format!("{}_", self.id);
                let body = a.pending.to_string();
                let folded = a.pending.len() > 1 || throttle.is_some();
                if folded {
                    s.push('[');
                }
                s.push_str(&body);
                if let Some(t) = throttle {
                    s.push_str(&format!("%{t}"));
                }
                if folded {
                    s.push(']');
                }
                s
            }
            (None, Some(a), Some(t)) => format!("{a}_{t}"),
            _ => self.id.to_string(),
        }
    }

    /// Elapsed run time at `now` (0 if it never started).
    pub fn elapsed(&self, now: i64) -> u64 {
        match self.start_time {
            Some(s) => (self.end_time.unwrap_or(now) - s).max(0) as u64,
            None => 0,
        }
    }

    /// When the job is expected to end (start + time limit); `None` when not running or
    /// unlimited.
    pub fn expected_end(&self) -> Option<i64> {
        Some(self.start_time?.saturating_add(self.time_limit? as i64))
    }
}
