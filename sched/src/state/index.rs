//! Derived indexes (per-partition membership, limit counters, node usage), kept in step with
//! every job change.

use std::collections::HashMap;

use crate::job::{Allocation, Hold, Job, JobState, NodeAlloc};
use crate::node::NodeMode;
use crate::{JobId, NodeId, Tres};

use super::State;

impl State {
    /// Removes a job from the derived indexes; call before changing it.
    pub(crate) fn unindex(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        self.pending.remove(&id);
        self.unheld.remove(&id);
        self.singletons.remove(&id);
        self.running.remove(&id);
        let w = submit_weight(job);
        if w > 0 {
            self.submitted_user.sub(&job.spec.qos, &job.spec.user, w);
            self.submitted_account
                .sub(&job.spec.qos, &job.spec.account, w);
        }
    }

    /// Adds a job to the derived indexes and marks it changed.
    pub(crate) fn index(&mut self, id: JobId) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let schedulable = match &job.array {
            Some(a) => job.state == JobState::Pending && !a.pending.is_empty(),
            None => job.state == JobState::Pending,
        };
        if schedulable {
            self.pending.insert(id);
            if job.hold == Hold::None {
                self.unheld.insert(id);
            }
            if job.is_singleton() {
                self.singletons.insert(id);
            }
        }
        if job.state == JobState::Running && job.alloc.is_some() {
            self.running.insert(id);
        }
        let w = submit_weight(job);
        if w > 0 {
            self.submitted_user.add(&job.spec.qos, &job.spec.user, w);
            self.submitted_account
                .add(&job.spec.qos, &job.spec.account, w);
        }
        self.changes.jobs.insert(id);
    }

    /// Changes a job with its indexes kept right. Returns `None` if the job is unknown.
    pub(crate) fn with_job<R>(&mut self, id: JobId, f: impl FnOnce(&mut Job) -> R) -> Option<R> {
        if !self.jobs.contains_key(&id) {
            return None;
        }
        self.unindex(id);
        let r = self.jobs.get_mut(&id).map(f);
        self.index(id);
        r
    }

    pub(super) fn rebuild_partitions(&mut self) {
        self.part_nodes = vec![Vec::new(); self.config.partitions.len()];
        self.part_totals = vec![std::cell::OnceCell::new(); self.config.partitions.len()];
        // Expand each partition's host list once, not once per node.
        let lists: Vec<Option<std::collections::HashSet<String>>> = self
            .config
            .partitions
            .iter()
            .map(|p| {
                p.nodes.as_ref().map(|e| {
                    crate::hostlist::expand(e)
                        .unwrap_or_default()
                        .into_iter()
                        .collect()
                })
            })
            .collect();
        for i in 0..self.nodes.len() {
            self.place_in_partitions(NodeId(i as u32), &lists);
        }
    }

    /// Recomputes one node's partitions (after it registers).
    pub(super) fn refresh_partitions_of(&mut self, id: NodeId) {
        let lists: Vec<Option<std::collections::HashSet<String>>> = self
            .config
            .partitions
            .iter()
            .map(|p| match &p.nodes {
                // Only this node's membership matters: test it alone instead of expanding.
                Some(e) => {
                    let name = &self.nodes[id.index()].name;
                    let hit = crate::hostlist::expand(e)
                        .map(|v| v.iter().any(|n| n == name))
                        .unwrap_or(false);
                    Some(if hit {
                        std::iter::once(name.clone()).collect()
                    } else {
                        Default::default()
                    })
                }
                None => None,
            })
            .collect();
        for members in &mut self.part_nodes {
            members.retain(|n| *n != id);
        }
        // Its size may have changed too (registration sets it first).
        for totals in &mut self.part_totals {
            totals.take();
        }
        self.place_in_partitions(id, &lists);
    }

    fn place_in_partitions(
        &mut self,
        id: NodeId,
        lists: &[Option<std::collections::HashSet<String>>],
    ) {
        let n = &mut self.nodes[id.index()];
        if n.removed {
            n.partitions.clear();
            return;
        }
        let mut names = Vec::new();
        for (i, p) in self.config.partitions.iter().enumerate() {
            let member = n.partitions.iter().any(|x| x == &p.name)
                || match &lists[i] {
                    None => true,
                    Some(set) => set.contains(&n.name),
                };
            if member {
                // Kept sorted by id so passes visit nodes in a stable order.
                let members = &mut self.part_nodes[i];
                let at = members.partition_point(|m| *m < id);
                members.insert(at, id);
                names.push(p.name.clone());
            }
        }
        n.partitions = names;
    }

    /// Puts an allocation on its nodes.
    pub(crate) fn attach(
        &mut self,
        job: JobId,
        alloc: &Allocation,
        mode: NodeMode,
        exclusive: bool,
    ) {
        for na in &alloc.nodes {
            let n = &mut self.nodes[na.node.index()];
            // Never while an ended job's processes may still run there (`ending`).
            if n.is_empty() {
                n.mode = mode;
            }
            n.alloc = n.alloc.saturating_add(&na.tres());
            for g in &na.gpus {
                if *g < 64 {
                    n.gpus_in_use |= 1u64 << g;
                }
            }
            n.jobs.push(job);
            n.exclusive |= exclusive;
            self.changes.nodes.insert(na.node);
        }
    }

    /// Takes an allocation off its nodes.
    pub(crate) fn detach(&mut self, job: JobId, alloc: &Allocation) {
        for na in &alloc.nodes {
            self.detach_node(job, na);
        }
    }

    /// Takes one node's part of an allocation off it (the job running there, or ending).
    pub(crate) fn detach_node(&mut self, job: JobId, na: &NodeAlloc) {
        let n = &mut self.nodes[na.node.index()];
        n.alloc = n.alloc.saturating_sub(&na.tres());
        for g in &na.gpus {
            if *g < 64 {
                n.gpus_in_use &= !(1u64 << g);
            }
        }
        n.jobs.retain(|j| *j != job);
        if n.jobs.is_empty() {
            n.exclusive = false;
        }
        if n.is_empty() {
            n.alloc = Tres::ZERO;
            n.gpus_in_use = 0;
        }
        self.changes.nodes.insert(na.node);
    }
}

/// Counts keyed by two names (QOS, then user or account). Nested maps so that lookups and
/// updates borrow `&str` keys: this runs on every job change and must not allocate.
#[derive(Clone, Debug, Default)]
pub(crate) struct PairCounts(HashMap<String, HashMap<String, u64>>);

impl PairCounts {
    pub(crate) fn get(&self, a: &str, b: &str) -> u64 {
        self.0.get(a).and_then(|m| m.get(b)).copied().unwrap_or(0)
    }
    fn add(&mut self, a: &str, b: &str, w: u64) {
        let inner = match self.0.get_mut(a) {
            Some(m) => m,
            None => self.0.entry(a.to_string()).or_default(),
        };
        match inner.get_mut(b) {
            Some(c) => *c += w,
            None => {
                inner.insert(b.to_string(), w);
            }
        }
    }
    fn sub(&mut self, a: &str, b: &str, w: u64) {
        if let Some(c) = self.0.get_mut(a).and_then(|m| m.get_mut(b)) {
            *c = c.saturating_sub(w);
        }
    }
}

/// How many submit-limit units a record holds: its pending indices for an array meta, one for
/// any other job that is not finished.
pub(super) fn submit_weight(job: &Job) -> u64 {
    match &job.array {
        Some(a) => a.pending.len(),
        None if !job.state.is_terminal() => 1,
        None => 0,
    }
}
