//! Where a job is in its life and why: Slurm's [`JobState`] and [`Reason`] with their exact
//! spellings (what `squeue`, `sacct` and `scontrol` print and parse), and the flags that
//! steer the next transition: who [`Hold`]s it, and why the controller is ending it
//! ([`KillReason`], [`PreemptMode`]).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Slurm's job states. `Display` prints Slurm's names, [`JobState::code`] the short codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Suspended,
    Completing,
    Completed,
    Cancelled,
    Failed,
    Timeout,
    Preempted,
    NodeFail,
    OutOfMemory,
    /// Only as the state of one *run* of a job that went back to PENDING (sacct's record).
    Requeued,
}

impl JobState {
    pub const ALL: [JobState; 12] = [
        JobState::Pending,
        JobState::Running,
        JobState::Suspended,
        JobState::Completing,
        JobState::Completed,
        JobState::Cancelled,
        JobState::Failed,
        JobState::Timeout,
        JobState::Preempted,
        JobState::NodeFail,
        JobState::OutOfMemory,
        JobState::Requeued,
    ];

    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Suspended => "SUSPENDED",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Cancelled => "CANCELLED",
            JobState::Failed => "FAILED",
            JobState::Timeout => "TIMEOUT",
            JobState::Preempted => "PREEMPTED",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
            JobState::Requeued => "REQUEUED",
        }
    }

    /// squeue's compact state (`%t`).
    pub fn code(self) -> &'static str {
        match self {
            JobState::Pending => "PD",
            JobState::Running => "R",
            JobState::Suspended => "S",
            JobState::Completing => "CG",
            JobState::Completed => "CD",
            JobState::Cancelled => "CA",
            JobState::Failed => "F",
            JobState::Timeout => "TO",
            JobState::Preempted => "PR",
            JobState::NodeFail => "NF",
            JobState::OutOfMemory => "OOM",
            JobState::Requeued => "RQ",
        }
    }

    /// Parses a name or code, any case (`squeue -t pd,running`).
    pub fn parse(s: &str) -> Option<JobState> {
        let u = s.trim().to_ascii_uppercase();
        JobState::ALL
            .into_iter()
            .find(|st| st.name() == u || st.code() == u)
    }

    /// The job will not run again (in this record).
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Suspended | JobState::Completing
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a job is pending, or why it ended. `Display` is Slurm's exact spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    None,
    Priority,
    Resources,
    Dependency,
    DependencyNeverSatisfied,
    JobHeldUser,
    JobHeldAdmin,
    BeginTime,
    PartitionTimeLimit,
    PartitionNodeLimit,
    PartitionDown,
    PartitionInactive,
    ReqNodeNotAvail,
    BadConstraints,
    QOSMaxJobsPerUserLimit,
    QOSMaxGRESPerUser,
    QOSMaxWallDurationPerJobLimit,
    QOSMaxJobsPerAccountLimit,
    AssocGrpGRES,
    AssocGrpJobsLimit,
    AssocMaxJobsLimit,
    /// An array's `%N` throttle is reached.
    JobArrayTaskLimit,
    NonZeroExitCode,
    TimeLimit,
    NodeDown,
    JobLaunchFailure,
    /// The kernel's OOM killer ended a process of the job (Slurm's `FAIL_OOM`).
    OutOfMemory,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::None => "None",
            Reason::Priority => "Priority",
            Reason::Resources => "Resources",
            Reason::Dependency => "Dependency",
            Reason::DependencyNeverSatisfied => "DependencyNeverSatisfied",
            Reason::JobHeldUser => "JobHeldUser",
            Reason::JobHeldAdmin => "JobHeldAdmin",
            Reason::BeginTime => "BeginTime",
            Reason::PartitionTimeLimit => "PartitionTimeLimit",
            Reason::PartitionNodeLimit => "PartitionNodeLimit",
            Reason::PartitionDown => "PartitionDown",
            Reason::PartitionInactive => "PartitionInactive",
            Reason::ReqNodeNotAvail => "ReqNodeNotAvail",
            Reason::BadConstraints => "BadConstraints",
            Reason::QOSMaxJobsPerUserLimit => "QOSMaxJobsPerUserLimit",
            Reason::QOSMaxGRESPerUser => "QOSMaxGRESPerUser",
            Reason::QOSMaxWallDurationPerJobLimit => "QOSMaxWallDurationPerJobLimit",
            Reason::QOSMaxJobsPerAccountLimit => "QOSMaxJobsPerAccountLimit",
            Reason::AssocGrpGRES => "AssocGrpGRES",
            Reason::AssocGrpJobsLimit => "AssocGrpJobsLimit",
            Reason::AssocMaxJobsLimit => "AssocMaxJobsLimit",
            Reason::JobArrayTaskLimit => "JobArrayTaskLimit",
            Reason::NonZeroExitCode => "NonZeroExitCode",
            Reason::TimeLimit => "TimeLimit",
            Reason::NodeDown => "NodeDown",
            Reason::JobLaunchFailure => "JobLaunchFailure",
            Reason::OutOfMemory => "OutOfMemory",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who holds a job (`--hold`/`scontrol hold` by its owner is a user hold; by an operator an
/// admin hold, which only an operator releases).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hold {
    #[default]
    None,
    User,
    Admin,
}

/// Why the controller asked the workers to end a running job. Decides the final state when
/// the worker reports the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillReason {
    Cancel,
    Preempt(PreemptMode),
    /// A node of the job was lost; the other nodes are told to kill their part.
    NodeFail,
    /// The administrator requeued a running job.
    Requeue,
}

/// What happens to a preempted job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PreemptMode {
    /// Back to PENDING, to run again later (from the start).
    Requeue,
    /// Ends for good, in state PREEMPTED (Slurm's `PreemptMode=CANCEL`).
    Cancel,
}
