//! Partitions: named sets of nodes with limits and a priority.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Slurm's partition states.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionState {
    /// Accepts and runs jobs.
    #[default]
    Up,
    /// Accepts jobs, starts none.
    Down,
    /// Accepts no new jobs, runs those it has.
    Drain,
    /// Accepts none, runs none.
    Inactive,
}

impl PartitionState {
    pub fn name(self) -> &'static str {
        match self {
            PartitionState::Up => "UP",
            PartitionState::Down => "DOWN",
            PartitionState::Drain => "DRAIN",
            PartitionState::Inactive => "INACTIVE",
        }
    }
}

impl fmt::Display for PartitionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A partition as configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// Jobs that name no partition go to the default one.
    pub default: bool,
    /// Host-list expression of member nodes; `None` = every node. Nodes may also join a
    /// partition by naming it when they register (worker sets do).
    pub nodes: Option<String>,
    /// Seconds; `None` = UNLIMITED.
    pub max_time: Option<u64>,
    /// Time limit of jobs that give none; `None` = `max_time`.
    pub default_time: Option<u64>,
    /// Most nodes one job may use; `None` = unlimited.
    pub max_nodes: Option<u32>,
    /// Accounts allowed to use it; empty = all.
    pub allowed_accounts: Vec<String>,
    /// Jobs of a higher tier are considered first (Slurm's `PriorityTier`).
    pub priority_tier: u16,
    /// Feeds the partition factor of multifactor priority (`PriorityJobFactor`).
    pub priority_job_factor: u16,
    pub state: PartitionState,
}

impl Partition {
    /// An UP partition over every node, no limits.
    pub fn new(name: impl Into<String>) -> Partition {
        Partition {
            name: name.into(),
            default: false,
            nodes: None,
            max_time: None,
            default_time: None,
            max_nodes: None,
            allowed_accounts: Vec::new(),
            priority_tier: 1,
            priority_job_factor: 1,
            state: PartitionState::Up,
        }
    }

    /// The time limit a job gets when it gives none.
    pub fn default_limit(&self) -> Option<u64> {
        self.default_time.or(self.max_time)
    }

    pub fn allows_account(&self, account: &str) -> bool {
        self.allowed_accounts.is_empty() || self.allowed_accounts.iter().any(|a| a == account)
    }
}
