//! What the controller must do after an event: signal workers, forget jobs, record runs.

use serde::{Deserialize, Serialize};

use crate::job::{JobState, PreemptMode};
use crate::{JobId, NodeId};

/// Why workers are asked to end a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SignalReason {
    Cancel,
    Preempt,
    /// Another node of the job was lost.
    NodeFail,
    /// An administrator requeued the running job.
    Requeue,
}

impl SignalReason {
    /// The word the worker protocol uses (`SignalJob.reason`).
    pub fn name(self) -> &'static str {
        match self {
            SignalReason::Cancel => "cancel",
            SignalReason::Preempt => "preempt",
            SignalReason::NodeFail => "node_fail",
            SignalReason::Requeue => "requeue",
        }
    }
}

/// A side effect the pure core asks the controller to carry out, after persisting the
/// changes of the call that returned it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Terminate the job on these nodes: SIGTERM to the process group, the kill wait, then
    /// SIGKILL; with `grace_s`, a first SIGTERM as notice and that sequence `grace_s` later.
    /// The job ends when the worker reports.
    Terminate {
        job: JobId,
        nodes: Vec<NodeId>,
        reason: SignalReason,
        grace_s: u32,
    },
    /// The worker on `node` runs `job`, which the scheduler does not place there (unknown,
    /// finished, or elsewhere): the worker should kill it.
    Abandon { job: JobId, node: NodeId },
    /// A batch job's run ended and its processes on `nodes` are not yet known gone: each
    /// node's worker kills what is left of the job there (SIGTERM, the kill wait, SIGKILL)
    /// and reports when its processes are gone ([`crate::state::State::job_gone`]). The
    /// nodes stay held (COMPLETING) until then.
    Cleanup { job: JobId, nodes: Vec<NodeId> },
    /// One run of a job ended. `requeued` runs went back to PENDING, so the job record no
    /// longer shows this run: write the accounting record from this.
    RunEnded(RunRecord),
}

/// The accounting facts of one run of a job (sacct's line for it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub job: JobId,
    /// State of this run: COMPLETED, FAILED, TIMEOUT, CANCELLED, PREEMPTED, NODE_FAIL,
    /// REQUEUED.
    pub state: JobState,
    pub start_time: Option<i64>,
    pub end_time: i64,
    pub exit_code: i32,
    pub signal: i32,
    pub nodes: Vec<NodeId>,
    /// Whether the job went back to PENDING after this run.
    pub requeued: bool,
}

/// A preemption decided by a scheduling pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempt {
    /// The victim.
    pub job: JobId,
    /// The job it makes room for.
    pub by: JobId,
    pub mode: PreemptMode,
    /// The victim QOS's `GraceTime`: seconds it runs on after a SIGTERM notice before the
    /// usual end (SIGTERM, kill wait, SIGKILL) begins.
    pub grace_s: u32,
    pub nodes: Vec<NodeId>,
}
