//! One run of a job: the resources it holds while running ([`Allocation`], one
//! [`NodeAlloc`] per node with concrete GPU indices) and how the run ended as the worker
//! reports it ([`JobOutcome`]). These cross the controller-worker boundary; the record in
//! the parent module keeps the allocation of the current or last run.

use serde::{Deserialize, Serialize};

use crate::{NodeId, Tres};

/// The resources one node gives a running job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAlloc {
    pub node: NodeId,
    pub cpus: u32,
    pub mem_mb: u64,
    /// GPU indices on that node (`CUDA_VISIBLE_DEVICES`).
    pub gpus: Vec<u32>,
}

impl NodeAlloc {
    pub fn tres(&self) -> Tres {
        Tres {
            cpus: self.cpus,
            mem_mb: self.mem_mb,
            gpus: self.gpus.len() as u32,
        }
    }
}

/// A running job's nodes, in node-name order (the first is where the batch script runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub nodes: Vec<NodeAlloc>,
}

impl Allocation {
    pub fn total(&self) -> Tres {
        self.nodes
            .iter()
            .fold(Tres::ZERO, |a, n| a.saturating_add(&n.tres()))
    }
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().map(|n| n.node)
    }
}

/// How a run ended, as the worker reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub exit_code: i32,
    /// The signal that ended the batch script, 0 if none.
    pub signal: i32,
    /// The worker ended it at its time limit.
    pub timed_out: bool,
    /// The worker ended it on the controller's request (cancel or preemption).
    pub cancelled: bool,
    /// It could not be started (bad working directory, unwritable output, ...).
    pub launch_error: Option<String>,
    /// The kernel's OOM killer ended a process of it (its cgroup's memory limit).
    #[serde(default)]
    pub out_of_memory: bool,
    /// The batch host emptied the job's cgroup (or saw its process group gone) before it
    /// reported: that node is released at once, without a second message.
    #[serde(default)]
    pub processes_gone: bool,
}
