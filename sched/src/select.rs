//! Node selection for one job: which nodes could ever host it, and which host it now.
//!
//! The [`Planner`] is a pass's private view of the cluster: free resources, node modes and a
//! per-partition index of schedulable nodes ordered by free GPUs, then free CPUs. A job's
//! candidates are read from the index starting at its GPU need, so the first nodes seen are
//! the best fits (packing: the fewest spare GPUs left behind), full nodes are never visited,
//! and nodes already in the job's mode come before empty nodes of the other mode (which would
//! have to switch). Gangs take all their nodes at once or none.
//!
//! The timeline half of the planner (reservations, earliest start) is in `backfill.rs`.

use std::collections::BTreeSet;

use crate::job::{Job, Shape};
use crate::node::{Node, NodeMode};
use crate::profile::Step;
use crate::state::State;
use crate::{NodeId, Tres};

/// What a job needs, in the planner's terms.
#[derive(Clone, Debug)]
pub(crate) struct Request<'a> {
    pub part: usize,
    pub shape: Shape,
    /// Seconds; `None` = unlimited.
    pub limit: Option<u64>,
    pub mode: NodeMode,
    pub job: &'a Job,
    /// Nodes named with `-w`, resolved.
    pub required: Vec<NodeId>,
}

impl<'a> Request<'a> {
    pub fn new(st: &State, job: &'a Job, part: usize) -> Request<'a> {
        let required = job
            .spec
            .nodelist
            .iter()
            .filter_map(|n| st.node_by_name.get(n).copied())
            .collect();
        Request {
            part,
            shape: job.shape,
            limit: job.time_limit,
            mode: job.spec.mode,
            job,
            required,
        }
    }

    /// End of a window starting at `t`.
    pub fn end_at(&self, t: i64) -> i64 {
        match self.limit {
            Some(l) => t.saturating_add(i64::try_from(l).unwrap_or(i64::MAX)),
            None => i64::MAX,
        }
    }
}

/// One reservation on one node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resv {
    pub start: i64,
    pub end: i64,
    pub need: Tres,
    pub mode: NodeMode,
    /// Whole node (exclusive job).
    pub whole: bool,
}

/// Nodes keyed by a lower bound on when something can start there.
pub(crate) type LbIndex = BTreeSet<(i64, NodeId)>;

/// A pass's private, mutable view of the nodes.
pub(crate) struct Planner<'a> {
    pub st: &'a State,
    pub now: i64,
    pub free: Vec<Tres>,
    pub njobs: Vec<u32>,
    pub mode: Vec<NodeMode>,
    /// Resources coming back: (time, amount), per node, unsorted.
    pub releases: Vec<Vec<(i64, Tres)>>,
    /// When each node becomes empty (`now` if it is).
    pub last_end: Vec<i64>,
    pub resv: Vec<Vec<Resv>>,
    /// Per node: availability over time, rebuilt whenever its releases or reservations change.
    pub profile: Vec<Vec<Step>>,
    /// Per partition: schedulable nodes keyed by (mode, free GPUs, free CPUs, id).
    pub index: Vec<BTreeSet<(NodeMode, u32, u32, NodeId)>>,
    /// Partitions of each node (indexes into `config.partitions`).
    pub node_parts: Vec<Vec<usize>>,
    /// Nodes whose resources preemption already promised to a job this pass.
    pub promised: Vec<bool>,
    /// Per partition: schedulable members sorted by a lower bound on when anything can
    /// start there (`now` if something is free, else the first release). Starts during the
    /// pass only happen where something was free, so the bounds stay valid all pass.
    /// Bounds by free CPUs; used for jobs without GPUs (GPU jobs use `gpu_lb`).
    pub lb_order_cpu: Vec<Vec<(i64, NodeId)>>,
    /// Per partition, per GPU count `g` (index `g - 1`): schedulable members keyed by the
    /// first time their profile has `g` GPUs free (not before now). Kept current as
    /// reservations fill the profiles, so the bound stays tight late in a pass when the
    /// static first-release bound says little.
    /// A count's index is built the first time a job asks for that many GPUs per node.
    pub gpu_lb: Vec<Vec<Option<LbIndex>>>,
    /// Each node's current key in `gpu_lb`, per GPU count.
    pub node_gpu_lb: Vec<Vec<i64>>,
}

impl<'a> Planner<'a> {
    pub fn new(st: &'a State, now: i64) -> Planner<'a> {
        let n = st.nodes.len();
        let mut p = Planner {
            st,
            now,
            free: st.nodes.iter().map(Node::free).collect(),
            njobs: st.nodes.iter().map(|n| n.jobs.len() as u32).collect(),
            mode: st.nodes.iter().map(|n| n.mode).collect(),
            releases: vec![Vec::new(); n],
            last_end: vec![now; n],
            resv: vec![Vec::new(); n],
            profile: vec![Vec::new(); n],
            index: vec![BTreeSet::new(); st.part_nodes.len()],
            node_parts: vec![Vec::new(); n],
            promised: vec![false; n],
            lb_order_cpu: Vec::new(),
            gpu_lb: Vec::new(),
            node_gpu_lb: vec![Vec::new(); n],
        };
        for (pi, members) in st.part_nodes.iter().enumerate() {
            for id in members {
                p.node_parts[id.index()].push(pi);
            }
        }
        for job in st.running_jobs() {
            // An overdue job is about to end: count it as ending just after now.
            let end = job.expected_end().unwrap_or(i64::MAX).max(now + 1);
            if let Some(a) = job.alloc.as_deref() {
                for na in &a.nodes {
                    let i = na.node.index();
                    p.releases[i].push((end, na.tres()));
                    p.last_end[i] = p.last_end[i].max(end);
                }
            }
        }
        for node in &st.nodes {
            if node.schedulable() {
                p.insert(node.id);
            }
        }
        let max_gpus = st
            .nodes
            .iter()
            .filter(|n| n.schedulable())
            .map(|n| n.total.gpus as usize)
            .max()
            .unwrap_or(0);
        p.gpu_lb = vec![vec![None; max_gpus]; st.part_nodes.len()];
        for i in 0..n {
            p.refresh_profile(i);
        }
        // Lower bounds per resource that gates a start: a job that needs a GPU cannot start
        // on a node without a free GPU before something there ends; every job needs a CPU.
        let first_release = |i: usize| {
            p.releases[i]
                .iter()
                .map(|(t, _)| *t)
                .min()
                .unwrap_or(i64::MAX)
        };
        let lb_cpu: Vec<i64> = (0..n)
            .map(|i| {
                if p.free[i].cpus > 0 {
                    now
                } else {
                    first_release(i)
                }
            })
            .collect();
        p.lb_order_cpu = st
            .part_nodes
            .iter()
            .map(|members| {
                let mut v: Vec<(i64, NodeId)> = members
                    .iter()
                    .filter(|id| st.nodes[id.index()].schedulable())
                    .map(|id| (lb_cpu[id.index()], *id))
                    .collect();
                v.sort_unstable();
                v
            })
            .collect();
        p
    }

    fn key(&self, id: NodeId) -> (NodeMode, u32, u32, NodeId) {
        let f = self.free[id.index()];
        (self.mode[id.index()], f.gpus, f.cpus, id)
    }

    fn insert(&mut self, id: NodeId) {
        let key = self.key(id);
        for &pi in &self.node_parts[id.index()] {
            self.index[pi].insert(key);
        }
    }

    fn remove(&mut self, id: NodeId) {
        let key = self.key(id);
        for &pi in &self.node_parts[id.index()] {
            self.index[pi].remove(&key);
        }
    }

    /// Whether node `n` could ever host one part of the request (ignores current load).
    pub fn fits_static(&self, n: NodeId, req: &Request<'_>) -> bool {
        let node = &self.st.nodes[n.index()];
        let spec = &req.job.spec;
        if !node.schedulable() || self.promised[n.index()] {
            return false;
        }
        if !req.shape.per_node.fits_in(&node.total) {
            return false;
        }
        if let Some(t) = &spec.gpu_type
            && node.gpu_type.as_deref() != Some(t.as_str())
        {
            return false;
        }
        if let Some(c) = &spec.constraint
            && !c.matches(&node.features)
        {
            return false;
        }
        if !spec.exclude.is_empty() && spec.exclude.iter().any(|x| x == &node.name) {
            return false;
        }
        true
    }

    /// Per-node amount the request takes on `n` (the whole node when exclusive).
    pub fn need_on(&self, n: NodeId, req: &Request<'_>) -> Tres {
        if req.shape.exclusive {
            self.st.nodes[n.index()].total
        } else {
            req.shape.per_node
        }
    }

    /// Whether `n` can host the request from now for its whole time limit without delaying
    /// any reservation.
    pub fn fits_now(&self, n: NodeId, req: &Request<'_>) -> bool {
        let i = n.index();
        if self.mode[i] != req.mode && self.njobs[i] > 0 {
            return false;
        }
        if req.shape.exclusive && self.njobs[i] > 0 {
            return false;
        }
        let need = self.need_on(n, req);
        need.fits_in(&self.free[i])
            && self.window_ok(
                n,
                self.now,
                req.end_at(self.now),
                need,
                req.mode,
                req.shape.exclusive,
            )
    }

    /// Chooses nodes to start the request now: required nodes first, then best fits from
    /// the index. `None` unless all `shape.nodes` are found.
    pub fn pick_now(&self, req: &Request<'_>) -> Option<Vec<NodeId>> {
        let k = req.shape.nodes as usize;
        let mut chosen: Vec<NodeId> = Vec::with_capacity(k);
        for &n in &req.required {
            if !self.node_parts[n.index()].contains(&req.part)
                || !self.fits_static(n, req)
                || !self.fits_now(n, req)
            {
                return None;
            }
            if !chosen.contains(&n) {
                chosen.push(n);
            }
        }
        if chosen.len() >= k {
            chosen.truncate(k);
            return Some(chosen);
        }
        let g = req.shape.per_node.gpus;
        let other = match req.mode {
            NodeMode::Batch => NodeMode::Kube,
            NodeMode::Kube => NodeMode::Batch,
        };
        // Nodes in the job's mode first, then nodes of the other mode (only empty ones fit).
        for mode in [req.mode, other] {
            let lo = (mode, g, 0, NodeId(0));
            let hi = (mode, u32::MAX, u32::MAX, NodeId(u32::MAX));
            for &(_, _, cpus, n) in self.index[req.part].range(lo..=hi) {
                if cpus < req.shape.per_node.cpus || chosen.contains(&n) {
                    continue;
                }
                if self.fits_static(n, req) && self.fits_now(n, req) {
                    chosen.push(n);
                    if chosen.len() == k {
                        return Some(chosen);
                    }
                }
            }
        }
        None
    }

    /// Records a start decided this pass: the nodes' free resources shrink and they come back
    /// at the end of the job's time limit.
    pub fn commit_start(&mut self, nodes: &[NodeId], req: &Request<'_>) {
        let end = req.end_at(self.now);
        for &n in nodes {
            let need = self.need_on(n, req);
            self.remove(n);
            let i = n.index();
            self.free[i] = self.free[i].saturating_sub(&need);
            self.njobs[i] += 1;
            self.mode[i] = req.mode;
            self.releases[i].push((end, need));
            self.last_end[i] = self.last_end[i].max(end);
            self.refresh_profile(i);
            self.insert(n);
        }
    }

    /// What each of `nodes` has free for a `mode` job over `[now, end)` once every decision
    /// of the pass so far is counted (starts, reservations); nothing on a node promised to
    /// a preemptor or reserved whole or for the other mode within the window.
    pub fn room(&self, nodes: &[NodeId], end: i64, mode: NodeMode) -> Vec<Tres> {
        nodes
            .iter()
            .map(|n| {
                let i = n.index();
                if self.promised[i] {
                    return Tres::default();
                }
                let steps = &self.profile[i];
                let mut room = self.free[i];
                for s in steps.iter().skip(crate::profile::at(steps, self.now)) {
                    if s.t > self.now && s.t >= end {
                        break;
                    }
                    if !s.admits(&Tres::default(), mode, false) {
                        return Tres::default();
                    }
                    room = Tres {
                        cpus: room.cpus.min(s.avail.cpus),
                        mem_mb: room.mem_mb.min(s.avail.mem_mb),
                        gpus: room.gpus.min(s.avail.gpus),
                    };
                }
                room
            })
            .collect()
    }

    /// Takes nodes out of consideration for the rest of the pass (promised to a preemptor).
    pub fn promise(&mut self, nodes: &[NodeId]) {
        for &n in nodes {
            self.remove(n);
            self.promised[n.index()] = true;
        }
    }
}
