//! Status numbers from the controller's node view, pure: what `kubectl get tandemclusters`
//! and `kubectl get workersets` print in their columns.
//!
//! Node states change without any Kubernetes object changing (a job starts, a node drains),
//! so no watch event triggers a pass for them: the reconcilers look again every
//! [`DEFAULT_REFRESH_S`] seconds (`--status-refresh-seconds`) and patch status only when
//! these numbers (or anything else in it) differ, so a steady cluster causes no writes.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::crd::WorkerSetStatus;
use crate::crd::cluster::NodeCounts;
use crate::plan::{BatchNode, NodeState};

/// How often a settled cluster or worker set is looked at again, in seconds.
pub const DEFAULT_REFRESH_S: u64 = 30;

/// A worker set's node columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetCounts {
    pub idle: i32,
    /// ALLOCATED or MIXED.
    pub allocated: i32,
    pub kube: i32,
    pub down: i32,
    /// The drain flag set (DRAINING or DRAINED, or DOWN and drained).
    pub drain: i32,
}

impl SetCounts {
    /// Into the set's status columns.
    pub fn write(self, status: &mut WorkerSetStatus) {
        status.idle = self.idle;
        status.allocated = self.allocated;
        status.kube = self.kube;
        status.down = self.down;
        status.drain = self.drain;
    }
}

/// Counts over the batch nodes of `workers` (the set's live pods' nodes); a worker whose
/// node the controller does not know (not registered yet) counts nowhere.
pub fn set_counts<'a>(
    workers: impl IntoIterator<Item = &'a str>,
    nodes: &BTreeMap<String, BatchNode>,
) -> SetCounts {
    let mut c = SetCounts::default();
    for n in workers.into_iter().filter_map(|w| nodes.get(w)) {
        match n.state {
            NodeState::Idle => c.idle += 1,
            NodeState::Mixed | NodeState::Allocated => c.allocated += 1,
            NodeState::Down => c.down += 1,
            NodeState::Drained | NodeState::Draining | NodeState::Unknown => {}
        }
        if n.drain {
            c.drain += 1;
        }
        if n.kube_mode {
            c.kube += 1;
        }
    }
    c
}

/// Counts over every node of the cluster, one base state each, as `sinfo` shows them.
pub fn cluster_counts(nodes: &[BatchNode]) -> NodeCounts {
    let mut c = NodeCounts::default();
    for n in nodes {
        c.total += 1;
        match n.state {
            NodeState::Idle => c.idle += 1,
            NodeState::Mixed => c.mixed += 1,
            NodeState::Allocated => c.allocated += 1,
            NodeState::Down => c.down += 1,
            NodeState::Drained | NodeState::Draining => c.drain += 1,
            NodeState::Unknown => {}
        }
        if n.kube_mode {
            c.kube += 1;
        }
    }
    c
}

/// When to look again: what the pass asked for (seconds; a drain to watch, a deadline), but
/// never later than `refresh`, so the node columns follow the controller.
pub fn next_look(asked_s: Option<i64>, refresh: Duration) -> Duration {
    match asked_s {
        Some(s) => Duration::from_secs(u64::try_from(s.max(1)).unwrap_or(1)).min(refresh),
        None => refresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, state: NodeState) -> BatchNode {
        BatchNode {
            name: name.into(),
            state,
            drain: false,
            reason: String::new(),
            running_jobs: 0,
            busy_until: None,
            kube_mode: false,
        }
    }

    fn by_name(nodes: Vec<BatchNode>) -> BTreeMap<String, BatchNode> {
        nodes.into_iter().map(|n| (n.name.clone(), n)).collect()
    }

    #[test]
    fn a_job_taking_a_node_moves_it_from_idle_to_allocated() {
        let before = by_name(vec![node("a", NodeState::Idle), node("b", NodeState::Idle)]);
        let after = by_name(vec![
            node("a", NodeState::Allocated),
            node("b", NodeState::Idle),
        ]);
        let workers = ["a", "b"];
        let b = set_counts(workers, &before);
        let a = set_counts(workers, &after);
        assert_eq!((b.idle, b.allocated), (2, 0));
        assert_eq!((a.idle, a.allocated), (1, 1));
        // Different numbers: the status differs and is patched. The same view twice: the
        // same status, no patch.
        let (mut old, mut new) = (WorkerSetStatus::default(), WorkerSetStatus::default());
        b.write(&mut old);
        a.write(&mut new);
        assert_ne!(old, new);
        assert_eq!((new.idle, new.allocated), (1, 1));
        let mut again = new.clone();
        set_counts(workers, &after).write(&mut again);
        assert_eq!(again, new);
    }

    #[test]
    fn set_counts_cover_only_the_sets_registered_workers() {
        let mut drained_down = node("c", NodeState::Down);
        drained_down.drain = true;
        let mut kube = node("d", NodeState::Mixed);
        kube.kube_mode = true;
        let nodes = by_name(vec![
            node("a", NodeState::Idle),
            node("other-set", NodeState::Allocated),
            drained_down,
            kube,
        ]);
        let c = set_counts(["a", "c", "d", "not-registered"], &nodes);
        assert_eq!(
            c,
            SetCounts {
                idle: 1,
                allocated: 1,
                kube: 1,
                down: 1,
                drain: 1,
            }
        );
    }

    #[test]
    fn cluster_counts_count_each_node_once_by_base_state() {
        let mut k = node("k", NodeState::Allocated);
        k.kube_mode = true;
        let c = cluster_counts(&[
            node("i", NodeState::Idle),
            node("m", NodeState::Mixed),
            k,
            node("d", NodeState::Down),
            node("r", NodeState::Draining),
            node("s", NodeState::Drained),
        ]);
        assert_eq!(
            c,
            NodeCounts {
                total: 6,
                idle: 1,
                mixed: 1,
                allocated: 1,
                down: 1,
                drain: 2,
                kube: 1,
            }
        );
    }

    #[test]
    fn a_settled_object_is_looked_at_again_within_the_refresh_period() {
        let refresh = Duration::from_secs(30);
        assert_eq!(next_look(None, refresh), refresh);
        assert_eq!(next_look(Some(5), refresh), Duration::from_secs(5));
        assert_eq!(next_look(Some(600), refresh), refresh);
        assert_eq!(next_look(Some(0), refresh), Duration::from_secs(1));
        assert_eq!(next_look(Some(-3), refresh), Duration::from_secs(1));
    }
}
