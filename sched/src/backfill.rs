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
use crate::select::{Planner, Request, Resv};

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
        let empty_from = if self.njobs[i] == 0 {
            self.now
        } else {
            self.last_end[i]
        };
        if (self.mode[i] != mode || exclusive) && t < empty_from {
            return false;
        }
        let resv = &self.resv[i];
        for r in resv {
            let overlaps = r.start < end && t < r.end;
            if overlaps && (r.mode != mode || r.whole || exclusive) {
                return false;
            }
        }
        if !need.fits_in(&self.avail_at(n, t)) {
            return false;
        }
        for r in resv {
            if r.start > t && r.start < end && !need.fits_in(&self.avail_at(n, r.start)) {
                return false;
            }
        }
        true
    }

    /// Resources free on `n` at time `t` (before anything new is placed).
    fn avail_at(&self, n: NodeId, t: i64) -> Tres {
        let i = n.index();
        let mut a = self.free[i];
        for (when, amount) in &self.releases[i] {
            if *when <= t {
                a = a.saturating_add(amount);
            }
        }
        let total = self.st.nodes[i].total;
        if a.cpus > total.cpus || a.mem_mb > total.mem_mb || a.gpus > total.gpus {
            a = Tres {
                cpus: a.cpus.min(total.cpus),
                mem_mb: a.mem_mb.min(total.mem_mb),
                gpus: a.gpus.min(total.gpus),
            };
        }
        for r in &self.resv[i] {
            if r.start <= t && t < r.end {
                a = a.saturating_sub(&r.need);
            }
        }
        a
    }

    /// The earliest time `>= from` at which the request fits on `n` for its whole window.
    fn earliest_fit(&self, n: NodeId, from: i64, req: &Request<'_>) -> Option<i64> {
        let i = n.index();
        let need = self.need_on(n, req);
        let mut times: Vec<i64> =
            Vec::with_capacity(1 + self.releases[i].len() + self.resv[i].len());
        times.push(from);
        times.extend(
            self.releases[i]
                .iter()
                .map(|(t, _)| *t)
                .filter(|t| *t > from && *t < i64::MAX),
        );
        times.extend(
            self.resv[i]
                .iter()
                .map(|r| r.end)
                .filter(|t| *t > from && *t < i64::MAX),
        );
        times.sort_unstable();
        times.dedup();
        times
            .into_iter()
            .find(|&t| self.window_ok(n, t, req.end_at(t), need, req.mode, req.shape.exclusive))
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
            required_fit.push((self.earliest_fit(n, self.now, req)?, n));
        }
        let cands: Vec<(i64, NodeId)> = members
            .iter()
            .filter(|n| !req.required.contains(n) && self.fits_static(**n, req))
            .filter_map(|&n| self.earliest_fit(n, self.now, req).map(|t| (t, n)))
            .collect();
        self.settle(req, &required_fit, cands)
    }

    /// The `shape.nodes` candidates with the earliest single-node fits, visiting nodes in
    /// order of a lower bound on their fit time and stopping once no unvisited node can beat
    /// the current k-th best. On a full cluster this looks at little more than `k` nodes
    /// instead of the whole partition. The flag says whether every node was visited.
    fn k_earliest(&self, req: &Request<'_>) -> (Vec<(i64, NodeId)>, bool) {
        let k = req.shape.nodes as usize;
        let mut best: BinaryHeap<(i64, NodeId)> = BinaryHeap::with_capacity(k + 1);
        let mut complete = true;
        let order = if req.shape.per_node.gpus > 0 {
            &self.lb_order_gpu
        } else {
            &self.lb_order_cpu
        };
        for &(lb, n) in &order[req.part] {
            if best.len() == k && best.peek().is_some_and(|(e, _)| lb >= *e) {
                complete = false;
                break;
            }
            if !self.fits_static(n, req) {
                continue;
            }
            if let Some(e) = self.earliest_fit(n, self.now, req) {
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
