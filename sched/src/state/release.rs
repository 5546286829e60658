//! A running `kube`-mode placeholder handing back some of its nodes while it keeps the
//! others: Slurm's shrinking of a running job (`scontrol update JobId=.. NumNodes=..`), the
//! handed-back nodes leaving the job's allocation and record.
//!
//! Why it exists: a placeholder's pods run under the kubelet, not a worker, so neither a
//! drain nor a lost worker says that they stopped. A serving group spread over several
//! nodes must not lose them all because one node is drained (a worker-set rollout) or goes
//! DOWN, and no node may be handed to batch work while a pod of the group may still run
//! there. So the node is first marked *releasing* ([`crate::job::Job::releasing`]); the
//! bridge evicts the group's pods on it and, once the kubelet reports them gone, releases
//! it; only then does it leave the allocation. Usage is charged for it up to that moment.

use crate::job::{JobState, NodeAlloc};
use crate::node::NodeMode;
use crate::{JobId, NodeId};

use super::{JobError, State};

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The nodes left the allocation; the placeholder runs on with the rest.
    Shrunk,
    /// Nothing left to do: the nodes were released already, or the job is over.
    Nothing,
    /// The nodes named are every node it still holds: end it as a placeholder whose pods
    /// are gone ([`State::job_ended`]), which also settles its usage and record.
    EndsJob,
}

impl State {
    /// Marks `node` to be handed back by running placeholder `job` unless it is the last
    /// node the placeholder would keep. Returns whether it is marked (now or before).
    pub(super) fn mark_releasing(&mut self, job: JobId, node: NodeId) -> bool {
        let Some(j) = self.jobs.get(&job) else {
            return false;
        };
        let Some(alloc) = j.alloc.as_deref() else {
            return false;
        };
        if !alloc.node_ids().any(|n| n == node) {
            return false;
        }
        if j.releasing_nodes().contains(&node) {
            return true;
        }
        let keeps = alloc
            .node_ids()
            .any(|n| n != node && !j.releasing_nodes().contains(&n));
        if !keeps {
            return false;
        }
        self.push_releasing(job, node);
        true
    }

    /// Marks `node` to be handed back even when it is the placeholder's last: a drain asks
    /// for the node, not for the group's end; the placeholder ends (COMPLETED, its pods
    /// gone) when the bridge releases the last one.
    pub(super) fn mark_releasing_all_ok(&mut self, job: JobId, node: NodeId) {
        let held = self
            .jobs
            .get(&job)
            .and_then(|j| j.alloc.as_deref())
            .is_some_and(|a| a.node_ids().any(|n| n == node));
        if held {
            self.push_releasing(job, node);
        }
    }

    fn push_releasing(&mut self, job: JobId, node: NodeId) {
        self.with_job(job, |j| {
            let r = j.releasing.get_or_insert_with(Box::default);
            if !r.contains(&node) {
                r.push(node);
            }
        });
    }

    /// The bridge reports the group's pods gone from `nodes` (each one the controller asked
    /// it to hand back) as of `at`: they leave the allocation, their share of the usage is
    /// charged up to `at`, and they are free. A node already released is a repeat;
    /// refused, changing nothing, for a node the placeholder holds but was not asked to
    /// hand back, or for a job that is not a placeholder.
    pub fn release_placeholder_nodes(
        &mut self,
        id: JobId,
        nodes: &[NodeId],
        at: i64,
    ) -> Result<Release, JobError> {
        let job = self
            .jobs
            .get(&id)
            .ok_or_else(|| JobError::NotFound(id.to_string()))?;
        if job.spec.mode != NodeMode::Kube {
            return Err(JobError::Invalid {
                job: id,
                problem: "a batch job, not a placeholder, hands back no nodes".into(),
            });
        }
        if job.state != JobState::Running {
            return Ok(Release::Nothing);
        }
        let Some(alloc) = job.alloc.as_deref() else {
            return Ok(Release::Nothing);
        };
        let mut parts = Vec::new();
        for node in nodes {
            let Some(part) = alloc.nodes.iter().find(|na| na.node == *node) else {
                continue;
            };
            if !job.releasing_nodes().contains(node) {
                let name = self.nodes[node.index()].name.clone();
                return Err(JobError::Invalid {
                    job: id,
                    problem: format!("node {name} was not asked back; it stays with the job"),
                });
            }
            if !parts.iter().any(|p: &NodeAlloc| p.node == *node) {
                parts.push(part.clone());
            }
        }
        if parts.is_empty() {
            return Ok(Release::Nothing);
        }
        if parts.len() == alloc.nodes.len() {
            return Ok(Release::EndsJob);
        }
        for part in &parts {
            self.charge_part(id, &part.tres(), at);
        }
        self.with_job(id, |j| {
            if let Some(a) = j.alloc.as_mut() {
                a.nodes
                    .retain(|na| !parts.iter().any(|p| p.node == na.node));
            }
            if let Some(r) = j.releasing.as_mut() {
                r.retain(|n| !parts.iter().any(|p| p.node == *n));
            }
            if j.releasing_nodes().is_empty() {
                j.releasing = None;
            }
        });
        for part in &parts {
            self.detach_node(id, part);
        }
        Ok(Release::Shrunk)
    }
}
