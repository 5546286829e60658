//! Nodes: resources, health, mode and the allocations on them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::job::NodeAlloc;
use crate::{JobId, NodeId, Tres};

/// Most GPUs one node may have: GPU indices are kept in a 64-bit mask.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Which kind of work a node serves. A node changes mode only when it holds no work.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum NodeMode {
    /// Batch jobs (sbatch, srun).
    #[default]
    Batch,
    /// Pods bridged from Kubernetes (placeholder jobs).
    Kube,
}

impl NodeMode {
    pub fn name(self) -> &'static str {
        match self {
            NodeMode::Batch => "batch",
            NodeMode::Kube => "kube",
        }
    }
}

impl fmt::Display for NodeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the node's worker is there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// Known from persisted state, not yet re-registered since the controller started.
    #[default]
    Unknown,
    Up,
    Down,
}

/// Slurm's node state as sinfo prints it, derived from health, drain and allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    Idle,
    Mixed,
    Allocated,
    Down,
    /// Draining with nothing left running.
    Drained,
    /// Draining, jobs still running.
    Draining,
    /// A job that ended still has processes here, not yet reported gone (Slurm's
    /// COMPLETING flag): the node takes no new work until they are.
    Completing,
    Unknown,
}

impl NodeState {
    pub fn name(self) -> &'static str {
        match self {
            NodeState::Idle => "IDLE",
            NodeState::Mixed => "MIXED",
            NodeState::Allocated => "ALLOCATED",
            NodeState::Down => "DOWN",
            NodeState::Drained => "DRAINED",
            NodeState::Draining => "DRAINING",
            NodeState::Completing => "COMPLETING",
            NodeState::Unknown => "UNKNOWN",
        }
    }

    /// sinfo's short form (`%t`).
    pub fn short(self) -> &'static str {
        match self {
            NodeState::Idle => "idle",
            NodeState::Mixed => "mix",
            NodeState::Allocated => "alloc",
            NodeState::Down => "down",
            NodeState::Drained => "drain",
            NodeState::Draining => "drng",
            NodeState::Completing => "comp",
            NodeState::Unknown => "unk",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A job whose run ended and whose processes on this node are not yet reported gone. The
/// node keeps what the job held until its worker says they are (the time partition: work of
/// another kind must never start beside them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ending {
    pub job: JobId,
    /// What the run held here, still charged to the node.
    pub alloc: NodeAlloc,
    /// When the run ended (Unix seconds): the kill began here then at the latest.
    pub since: i64,
}

/// A node of the pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// Position in `State`'s node table; persisted so a restored job's allocation still
    /// points at the right node.
    pub id: NodeId,
    pub name: String,
    pub total: Tres,
    /// GPU type of all the node's GPUs (`h100`); `None` for untyped or no GPUs.
    pub gpu_type: Option<String>,
    pub features: Vec<String>,
    /// Partitions this node belongs to (names, resolved at registration).
    pub partitions: Vec<String>,
    pub health: Health,
    /// Set by drain; the node takes no new work until resumed.
    pub drain: bool,
    /// Why it is down or drained.
    pub reason: Option<String>,
    /// Who gave `reason`, and when (Unix seconds): sinfo -R's USER and TIMESTAMP, the
    /// `[user@time]` after scontrol's Reason. Absent in records written before it existed.
    #[serde(default)]
    pub reason_by: Option<(String, i64)>,
    pub mode: NodeMode,
    /// Sum of the allocations of `jobs`.
    pub alloc: Tres,
    /// Bit `i` set = GPU index `i` is in use.
    pub gpus_in_use: u64,
    /// Running jobs with an allocation on this node.
    pub jobs: Vec<JobId>,
    /// Ended jobs whose processes here are not yet reported gone; their allocations are
    /// still in `alloc`. Persisted: they outlive a controller restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ending: Vec<Ending>,
    /// Jobs that hold the whole node (`--exclusive`).
    pub exclusive: bool,
    pub last_seen: i64,
    /// Removed from the cluster (`RemoveNode`): hidden from queries and partitions, its id
    /// kept so old allocations stay valid; a worker registering under the name revives it.
    #[serde(default)]
    pub removed: bool,
}

impl Node {
    pub fn new(id: NodeId, name: impl Into<String>, total: Tres) -> Node {
        Node {
            id,
            name: name.into(),
            total,
            gpu_type: None,
            features: Vec::new(),
            partitions: Vec::new(),
            health: Health::Unknown,
            drain: false,
            reason: None,
            reason_by: None,
            mode: NodeMode::Batch,
            alloc: Tres::ZERO,
            gpus_in_use: 0,
            jobs: Vec::new(),
            ending: Vec::new(),
            exclusive: false,
            last_seen: 0,
            removed: false,
        }
    }

    pub fn state(&self) -> NodeState {
        match self.health {
            Health::Down => NodeState::Down,
            Health::Unknown => NodeState::Unknown,
            Health::Up if self.drain => {
                if self.is_empty() {
                    NodeState::Drained
                } else {
                    NodeState::Draining
                }
            }
            // As Slurm prints a node with the COMPLETING flag, whatever else runs there.
            Health::Up if !self.ending.is_empty() => NodeState::Completing,
            Health::Up if self.jobs.is_empty() => NodeState::Idle,
            Health::Up if self.exclusive || self.free().cpus == 0 => NodeState::Allocated,
            Health::Up if self.total.gpus > 0 && self.alloc.gpus >= self.total.gpus => {
                NodeState::Allocated
            }
            Health::Up => NodeState::Mixed,
        }
    }

    /// Whether new work may be placed here: up, not draining, and no ended job's processes
    /// still here (Slurm schedules nothing on a COMPLETING node either).
    pub fn schedulable(&self) -> bool {
        self.health == Health::Up && !self.drain && self.ending.is_empty()
    }

    /// Whether an ended job's processes are still awaited here.
    pub fn is_completing(&self) -> bool {
        !self.ending.is_empty()
    }

    /// Unallocated resources.
    pub fn free(&self) -> Tres {
        if self.exclusive {
            return Tres::ZERO;
        }
        self.total.saturating_sub(&self.alloc)
    }

    /// Nothing runs here and no ended job's processes are awaited.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.ending.is_empty()
    }

    /// The lowest `n` free GPU indices, or `None` if fewer are free.
    pub fn pick_gpus(&self, n: u32) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..self.total.gpus.min(MAX_GPUS_PER_NODE) {
            if out.len() == n as usize {
                break;
            }
            if self.gpus_in_use & (1u64 << i) == 0 {
                out.push(i);
            }
        }
        (out.len() == n as usize).then_some(out)
    }

    /// GPU indices currently in use.
    pub fn gpu_indices_in_use(&self) -> Vec<u32> {
        (0..MAX_GPUS_PER_NODE)
            .filter(|i| self.gpus_in_use & (1u64 << i) != 0)
            .collect()
    }

    /// Whether the node may host work of `mode` now: same mode, or empty (it switches). A
    /// node where an ended job's processes are still awaited is not empty.
    pub fn accepts_mode(&self, mode: NodeMode) -> bool {
        self.mode == mode || self.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_derived_like_slurm() {
        let mut n = Node::new(NodeId(0), "n1", Tres::new(8, 1000, 2));
        assert_eq!(n.state(), NodeState::Unknown);
        n.health = Health::Up;
        assert_eq!(n.state(), NodeState::Idle);
        n.jobs.push(JobId(1));
        n.alloc = Tres::new(2, 0, 1);
        assert_eq!(n.state(), NodeState::Mixed);
        n.alloc = Tres::new(8, 0, 1);
        assert_eq!(n.state(), NodeState::Allocated);
        n.drain = true;
        assert_eq!(n.state(), NodeState::Draining);
        n.jobs.clear();
        assert_eq!(n.state(), NodeState::Drained);
        n.health = Health::Down;
        assert_eq!(n.state(), NodeState::Down);
    }

    #[test]
    fn picks_lowest_free_gpus() {
        let mut n = Node::new(NodeId(0), "n1", Tres::new(8, 1000, 4));
        n.gpus_in_use = 0b0101;
        assert_eq!(n.pick_gpus(2), Some(vec![1, 3]));
        assert_eq!(n.pick_gpus(3), None);
        assert_eq!(n.gpu_indices_in_use(), vec![0, 2]);
    }
}
