//! Preemption: choosing running jobs to stop so a blocked job of a preempting QOS can start.
//!
//! Candidates are running jobs whose QOS is in the preemptor's QOS `Preempt=` list and that
//! are not already being stopped. On each node, victims are taken lowest priority first,
//! most recently started first among equals, until the preemptor fits there; the nodes that
//! need the fewest victims (then the least victim priority) win. A victim spanning several
//! chosen nodes is counted once.

use std::collections::BTreeSet;

use crate::job::Job;
use crate::select::{Planner, Request};
use crate::{JobId, NodeId, Tres};

/// Victims for the request, and the nodes they free, or `None` when preemption cannot make
/// room.
pub(crate) fn choose_victims(
    p: &Planner<'_>,
    req: &Request<'_>,
    preemptable: impl Fn(&Job) -> bool,
) -> Option<(Vec<JobId>, Vec<NodeId>)> {
    let st = p.st;
    let k = req.shape.nodes as usize;
    // (victim count, priority sum, node, victims)
    let mut options: Vec<(usize, u64, NodeId, Vec<JobId>)> = Vec::new();
    for &n in &st.part_nodes[req.part] {
        if !p.fits_static(n, req) {
            continue;
        }
        if !req.required.is_empty() && !req.required.contains(&n) && req.required.len() >= k {
            continue;
        }
        let i = n.index();
        let need = p.need_on(n, req);
        let node = &st.nodes[i];
        // Jobs planned to start this pass are not in node.jobs and cannot be victims; their
        // resources are already out of `p.free`.
        let mut victims_here: Vec<&Job> = node
            .jobs
            .iter()
            .filter_map(|j| st.jobs.get(j))
            .filter(|j| j.kill.is_none() && preemptable(j))
            .collect();
        victims_here.sort_by_key(|j| {
            (
                j.priority,
                std::cmp::Reverse(j.start_time),
                std::cmp::Reverse(j.id),
            )
        });
        let mut free = p.free[i];
        let mut chosen = Vec::new();
        let mut remaining = p.njobs[i] as usize;
        let mode_ok = |remaining: usize| p.mode[i] == req.mode || remaining == 0;
        let exclusive_ok = |remaining: usize| !req.shape.exclusive || remaining == 0;
        let fits = |free: &Tres, remaining: usize| {
            need.fits_in(free) && mode_ok(remaining) && exclusive_ok(remaining)
        };
        if fits(&free, remaining) {
            // Fits without victims; the pass could not start it for other reasons
            // (reservations). Preemption does not help there.
            continue;
        }
        let mut prio = 0u64;
        for v in victims_here {
            if let Some(a) = v.alloc.as_deref() {
                for na in a.nodes.iter().filter(|na| na.node == n) {
                    free = free.saturating_add(&na.tres());
                }
            }
            chosen.push(v.id);
            prio = prio.saturating_add(v.priority);
            remaining -= 1;
            if fits(&free, remaining) {
                break;
            }
        }
        if fits(&free, remaining) {
            options.push((chosen.len(), prio, n, chosen));
        }
    }
    if options.len() < k {
        return None;
    }
    // Required nodes first, then the cheapest.
    options.sort_by_key(|(count, prio, n, _)| (!req.required.contains(n), *count, *prio, *n));
    let picked = &options[..k];
    if req
        .required
        .iter()
        .any(|r| !picked.iter().any(|(_, _, n, _)| n == r))
    {
        return None;
    }
    let victims: BTreeSet<JobId> = picked
        .iter()
        .flat_map(|(_, _, _, v)| v.iter().copied())
        .collect();
    if victims.is_empty() {
        return None;
    }
    Some((
        victims.into_iter().collect(),
        picked.iter().map(|(_, _, n, _)| *n).collect(),
    ))
}
