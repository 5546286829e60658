//! Quality of service: priority, limits and preemption rules.

use serde::{Deserialize, Serialize};

use crate::job::PreemptMode;

/// The QOS jobs get when they name none.
pub const DEFAULT_QOS: &str = "normal";

/// A QOS as configured (`sacctmgr add qos`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    /// Feeds the QOS factor of multifactor priority.
    pub priority: u32,
    pub limits: QosLimits,
    /// QOS names whose running jobs this QOS may preempt (`Preempt=`).
    pub preempt: Vec<String>,
    /// What happens to this QOS's jobs when they are preempted.
    pub preempt_mode: PreemptMode,
    /// `GraceTime`, seconds: a preempted job gets SIGTERM at once and is ended (SIGTERM,
    /// KillWait, SIGKILL) only this long after.
    pub grace_time_s: u32,
}

/// Limits of a QOS. `None` = no limit. Slurm's names in the comments.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimits {
    /// `MaxJobsPerUser`: running jobs per user.
    pub max_jobs_per_user: Option<u32>,
    /// `MaxSubmitJobsPerUser`: pending + running jobs per user (array tasks count).
    pub max_submit_per_user: Option<u32>,
    /// `MaxJobsPerAccount`.
    pub max_jobs_per_account: Option<u32>,
    /// `MaxSubmitJobsPerAccount`.
    pub max_submit_per_account: Option<u32>,
    /// `MaxTRESPerUser=gres/gpu=N`: GPUs in use per user.
    pub max_gpus_per_user: Option<u32>,
    /// `MaxWall`: longest time limit, seconds.
    pub max_wall: Option<u64>,
}

impl Qos {
    pub fn new(name: impl Into<String>) -> Qos {
        Qos {
            name: name.into(),
            priority: 0,
            limits: QosLimits::default(),
            preempt: Vec::new(),
            preempt_mode: PreemptMode::Requeue,
            grace_time_s: 0,
        }
    }

    pub fn can_preempt(&self, other: &str) -> bool {
        self.preempt.iter().any(|q| q == other)
    }
}
