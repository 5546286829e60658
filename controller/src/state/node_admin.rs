//! The state actor's node administration for the operator: removing nodes whose worker
//! pods are gone, and the per-node end time scale-in ranks victims by. The handler
//! (`api/nodes.rs`) checks that the caller may remove nodes and expands the request.

use tandem_sched::node::{Node, NodeMode};
use tonic::Status;
use tracing::info;

use super::Actor;

/// `RemoveNode`, as the handler checked and expanded it.
#[derive(Debug, Clone)]
pub struct RemoveNodes {
    /// Node names, at least one.
    pub nodes: Vec<String>,
    /// Remove nodes that still run jobs (requeueing them).
    pub force: bool,
    /// Recorded as the nodes' reason.
    pub reason: String,
    /// The user the reason is stamped with.
    pub by: String,
}

/// What a removal did: nodes removed, and names the controller does not know (not an error,
/// so a removal whose answer was lost can be retried).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodesRemoved {
    pub removed: Vec<String>,
    pub unknown: Vec<String>,
}

impl Actor {
    /// Latest expected end of the node's running jobs: 0 when none run, -1 when one has no
    /// time limit.
    pub(super) fn busy_until(&self, n: &Node) -> i64 {
        let mut latest = 0;
        for id in &n.jobs {
            match self.st.job(*id).and_then(|j| j.expected_end()) {
                Some(end) => latest = latest.max(end),
                None => return -1,
            }
        }
        latest
    }

    /// `RemoveNode`. Every named node is checked before any is changed, so a refused
    /// request changes nothing; unknown names are reported, not an error, so the operator
    /// can retry a removal that was applied but whose answer was lost.
    pub(super) fn remove_nodes(&mut self, req: RemoveNodes) -> Result<NodesRemoved, Status> {
        let RemoveNodes {
            nodes: names,
            force,
            reason,
            by,
        } = req;
        let mut known = Vec::new();
        let mut unknown = Vec::new();
        for n in names {
            match self.st.node_by_name(&n) {
                Some(node) => {
                    // Forcing fails batch jobs on the spot, but a placeholder's pods run
                    // under the kubelet whatever the worker does: losing the node only asks
                    // the bridge to evict them, and the node stays held (in `kube` mode)
                    // until they are gone. Removing it before then would let a new worker
                    // there take batch work beside live pods.
                    let bridged: Vec<String> = node
                        .jobs
                        .iter()
                        .filter(|j| {
                            self.st
                                .job(**j)
                                .is_some_and(|j| j.spec.mode == NodeMode::Kube)
                        })
                        .map(|j| j.0.to_string())
                        .collect();
                    if !bridged.is_empty() && force {
                        return Err(Status::failed_precondition(format!(
                            "node {n} holds bridged pods (placeholder job(s) {}); set it DOWN so the bridge evicts them, and remove it once they are gone",
                            bridged.join(",")
                        )));
                    }
                    if !node.jobs.is_empty() && !force {
                        return Err(Status::failed_precondition(format!(
                            "node {n} still runs {} job(s); drain it first or remove with force (requeues them)",
                            node.jobs.len()
                        )));
                    }
                    known.push(n);
                }
                None => unknown.push(n),
            }
        }
        let now = self.now();
        for n in &known {
            let busy = self.st.node_by_name(n).is_some_and(|x| !x.jobs.is_empty());
            if busy {
                let effects = self
                    .st
                    .node_lost(n, &reason, now)
                    .map_err(|e| Status::internal(e.to_string()))?;
                self.apply_effects(effects);
            }
            self.st
                .remove_node(n)
                .map_err(|e| Status::internal(e.to_string()))?;
            self.st.stamp_reason(n, &by, now);
            // End its stream: a worker still running would otherwise keep heartbeating a
            // node that no longer exists (it re-registers, reviving it, if it is not gone).
            self.workers.lost(n);
            info!(node = %n, reason = %reason, forced = busy, "node removed");
        }
        self.pacing.want();
        Ok(NodesRemoved {
            removed: known,
            unknown,
        })
    }
}
