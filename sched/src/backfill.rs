//! Backfill: the per-node reservation timeline of a pass.
//!
//! Each node's future is its free resources now, plus what running jobs give back at their
//! expected ends (start + time limit), minus reservations made this pass for higher-priority
//! jobs that could not start. A job may start now on a node only if it fits there for its
//! whole time limit at every moment a reservation begins (availability only grows between
//! reservation starts, because releases only add). That is what makes "a lower-priority job
//! never delays a reservation" hold by construction.
//!
//! The earliest start of a blocked job is the first time at which `shape.nodes` of its
//! candidate nodes all fit for the whole window; all its nodes are reserved at that one time
//! (gangs are all-or-nothing).

use std::collections::BinaryHeap;

use crate::NodeId;
use crate::Tres;
use crate::node::NodeMode;
use crate::profile;
use crate::select::{LbIndex, Planner, Request, Resv};

/// Times tried when looking for a common start of a multi-node job before giving up on a
/// reservation for it this pass (the job still starts when it fits; it is only unprotected).
const MAX_RESERVE_ROUNDS: usize = 16;

impl Planner<'_> {
    /// Whether `need` fits on node `n` during `[t, end)`, given releases and reservations,
    /// and the node's mode allows the work (a node switches mode only once empty).
    pub(crate) fn window_ok(
        &self,
        n: NodeId,
        t: i64,
        end: i64,
        need: Tres,
        mode: NodeMode,
        exclusive: bool,
    ) -> bool {
        let i = n.index();
        if (self.mode[i] != mode || exclusive) && t < self.empty_from(i) {
            return false;
        }
        profile::first_blocked(&self.profile[i], t, end, &need, mode, exclusive).is_none()
    }

    /// When node `i` has no running (or just started) job left.
    fn empty_from(&self, i: usize) -> i64 {
        if self.njobs[i] == 0 {
            self.now
        } else {
            self.last_end[i]
        }
    }

    /// The earliest time `>= from` at which the request fits on `n` for its whole window:
    /// one sweep over the node's profile, jumping past each step that blocks the window.
    /// Gives up (`None`) once the start would be later than `bound`.
    fn earliest_fit(&self, n: NodeId, from: i64, bound: i64, req: &Request<'_>) -> Option<i64> {
        let i = n.index();
        let need = self.need_on(n, req);
        let (mode, exclusive) = (req.mode, req.shape.exclusive);
        let steps = &self.profile[i];
        let mut t = from;
        if self.mode[i] != mode || exclusive {
            t = t.max(self.empty_from(i));
        }
        loop {
            if t == i64::MAX || t > bound {
                return None;
            }
            match profile::first_blocked(steps, t, req.end_at(t), &need, mode, exclusive) {
                None => return Some(t),
                // Every window that starts before the blocking step ends contains it.
                Some(j) => t = steps.get(j + 1)?.t,
            }
        }
    }

    /// Recomputes node `i`'s profile after its releases or reservations changed, and its
    /// keys in the per-GPU-count lower-bound index.
    pub(crate) fn refresh_profile(&mut self, i: usize) {
        self.profile[i] = profile::build(
            self.free[i],
            self.st.nodes[i].total,
            &self.releases[i],
            &self.resv[i],
        );
        let node = &self.st.nodes[i];
        if !node.schedulable() {
            return;
        }
        let g_max = (node.total.gpus as usize).min(self.gpu_lb.first().map_or(0, Vec::len));
        let mut lbs = vec![i64::MAX; g_max];
        let steps = &self.profile[i];
        let mut found = 0usize;
        for s in &steps[profile::at(steps, self.now)..] {
            let g = (s.avail.gpus as usize).min(g_max);
            while found < g {
                lbs[found] = s.t.max(self.now);
                found += 1;
            }
            if found == g_max {
                break;
            }
        }
        let id = NodeId(i as u32);
        let old = std::mem::take(&mut self.node_gpu_lb[i]);
        for &pi in &self.node_parts[i] {
            let sets = &mut self.gpu_lb[pi];
            for (g, &lb) in lbs.iter().enumerate() {
                let Some(set) = sets[g].as_mut() else {
                    continue;
                };
                match old.get(g) {
                    Some(&o) if o == lb => continue,
                    Some(&o) => {
                        set.remove(&(o, id));
                    }
                    None => {}
                }
                set.insert((lb, id));
            }
        }
        self.node_gpu_lb[i] = lbs;
    }

    /// Finds the earliest common start of the request and reserves its nodes then. Returns
    /// the start time and nodes, or `None` when no start was found (e.g. nodes held by jobs without a
    /// time limit).
    pub(crate) fn reserve(&mut self, req: &Request<'_>) -> Option<(i64, Vec<NodeId>)> {
        if req.required.is_empty() {
            let (cands, complete) = self.k_earliest(req);
            if let Some(found) = self.settle(req, &[], cands) {
                return Some(found);
            }
            if complete {
                return None;
            }
        }
        // Slow path: node lists, or a fast-path guess that reservations made non-monotone.
        let st = self.st;
        let members = &st.part_nodes[req.part];
        let mut required_fit: Vec<(i64, NodeId)> = Vec::new();
        for &n in &req.required {
            if !members.contains(&n) || !self.fits_static(n, req) {
                return None;
            }
            required_fit.push((self.earliest_fit(n, self.now, i64::MAX, req)?, n));
        }
        let cands: Vec<(i64, NodeId)> = members
            .iter()
            .filter(|n| !req.required.contains(n) && self.fits_static(**n, req))
            .filter_map(|&n| {
                self.earliest_fit(n, self.now, i64::MAX, req)
                    .map(|t| (t, n))
            })
            .collect();
        self.settle(req, &required_fit, cands)
    }

    /// The `shape.nodes` candidates with the earliest single-node fits, visiting nodes in
    /// order of a lower bound on their fit time and stopping once no unvisited node can beat
    /// the current k-th best. On a full cluster this looks at little more than `k` nodes
    /// instead of the whole partition. The flag says whether every node was visited.
    fn k_earliest(&mut self, req: &Request<'_>) -> (Vec<(i64, NodeId)>, bool) {
        let k = req.shape.nodes as usize;
        let g = req.shape.per_node.gpus as usize;
        if g > 0
            && let Some(slot) = self.gpu_lb[req.part].get(g - 1)
            && slot.is_none()
        {
            let set: LbIndex = self.st.part_nodes[req.part]
                .iter()
                .filter_map(|&n| self.node_gpu_lb[n.index()].get(g - 1).map(|lb| (*lb, n)))
                .collect();
            self.gpu_lb[req.part][g - 1] = Some(set);
        }
        let mut best: BinaryHeap<(i64, NodeId)> = BinaryHeap::with_capacity(k + 1);
        let mut complete = true;
        let order: Box<dyn Iterator<Item = &(i64, NodeId)>> = if g > 0 {
            match self.gpu_lb[req.part].get(g - 1).and_then(Option::as_ref) {
                Some(set) => Box::new(set.iter()),
                // No schedulable node has that many GPUs.
                None => return (Vec::new(), true),
            }
        } else {
            Box::new(self.lb_order_cpu[req.part].iter())
        };
        for &(lb, n) in order {
            if best.len() == k && best.peek().is_some_and(|(e, _)| lb >= *e) {
                complete = false;
                break;
            }
            if !self.fits_static(n, req) {
                continue;
            }
            // `lb` bounds this node's fit from below; a fit later than the k-th best would
            // be dropped at once, so neither needs sweeping.
            let bound = if best.len() == k {
                best.peek().map_or(i64::MAX, |(e, _)| *e)
            } else {
                i64::MAX
            };
            if let Some(e) = self.earliest_fit(n, lb.max(self.now), bound, req) {
                best.push((e, n));
                if best.len() > k {
                    best.pop();
                }
            }
        }
        (best.into_sorted_vec(), complete)
    }

    /// Looks for a common start of the request on `required` plus `cands` (each with its
    /// earliest single-node fit) and reserves it.
    fn settle(
        &mut self,
        req: &Request<'_>,
        required_fit: &[(i64, NodeId)],
        mut cands: Vec<(i64, NodeId)>,
    ) -> Option<(i64, Vec<NodeId>)> {
        let k = req.shape.nodes as usize;
        if required_fit.len() + cands.len() < k {
            return None;
        }
        cands.sort_unstable();
        // First guess: the k-th earliest single-node start (required nodes always count).
        let need_others = k.saturating_sub(required_fit.len());
        let mut t = required_fit
            .iter()
            .map(|(t, _)| *t)
            .max()
            .unwrap_or(self.now);
        if need_others > 0 {
            t = t.max(cands[need_others - 1].0);
        }
        for _ in 0..MAX_RESERVE_ROUNDS {
            let end = req.end_at(t);
            let fits = |n: NodeId| {
                self.window_ok(
                    n,
                    t,
                    end,
                    self.need_on(n, req),
                    req.mode,
                    req.shape.exclusive,
                )
            };
            let mut chosen: Vec<NodeId> = Vec::with_capacity(k);
            let mut ok = true;
            for &(_, n) in required_fit {
                if !fits(n) {
                    ok = false;
                    break;
                }
                chosen.push(n);
            }
            if ok {
                for &(e, n) in &cands {
                    if chosen.len() >= k || e > t {
                        break;
                    }
                    if fits(n) {
                        chosen.push(n);
                    }
                }
            }
            if ok && chosen.len() >= k {
                chosen.truncate(k);
                for &n in &chosen {
                    let need = self.need_on(n, req);
                    self.resv[n.index()].push(Resv {
                        start: t,
                        end,
                        need,
                        mode: req.mode,
                        whole: req.shape.exclusive,
                    });
                    self.refresh_profile(n.index());
                }
                return Some((t, chosen));
            }
            // Try the next time any candidate's situation changes.
            let next = cands
                .iter()
                .map(|(e, _)| *e)
                .chain(self.resv_ends_after(t, &cands))
                .filter(|e| *e > t)
                .min()?;
            t = next;
        }
        None
    }

    fn resv_ends_after<'b>(
        &'b self,
        t: i64,
        cands: &'b [(i64, NodeId)],
    ) -> impl Iterator<Item = i64> + 'b {
        cands.iter().flat_map(move |(_, n)| {
            self.resv[n.index()]
                .iter()
                .map(|r| r.end)
                .filter(move |e| *e > t)
        })
    }
}
