//! A node's availability profile for one pass: free resources over time as a sorted step
//! function, built from what is free now, what running (and just started) jobs give back at
//! their expected ends, and the reservations made this pass.
//!
//! Step `i` holds from `steps[i].t` until `steps[i + 1].t` (the last one forever); the first
//! starts at `i64::MIN`. With the profile, "does this fit during `[t, end)`" is one sweep over
//! the steps of the window instead of recomputing availability from every release and
//! reservation at every reservation start (quadratic in the reservations of a node).

use crate::Tres;
use crate::node::NodeMode;
use crate::select::Resv;

/// Availability during one step, and the reservations active then by kind (a window that
/// overlaps a whole-node or other-mode reservation cannot be used whatever is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub t: i64,
    pub avail: Tres,
    pub whole: u32,
    pub batch: u32,
    pub kube: u32,
}

impl Step {
    /// Whether a request for `need` in `mode` can use this step.
    pub fn admits(&self, need: &Tres, mode: NodeMode, exclusive: bool) -> bool {
        let other = match mode {
            NodeMode::Batch => self.kube,
            NodeMode::Kube => self.batch,
        };
        if self.whole > 0 || other > 0 || (exclusive && self.batch + self.kube > 0) {
            return false;
        }
        need.fits_in(&self.avail)
    }
}

/// Builds the profile. Availability at `t` is `free` plus every release at or before `t`,
/// capped at the node's `total`, minus every reservation active at `t` (saturating).
pub(crate) fn build(free: Tres, total: Tres, releases: &[(i64, Tres)], resv: &[Resv]) -> Vec<Step> {
    let mut times: Vec<i64> = Vec::with_capacity(1 + releases.len() + 2 * resv.len());
    times.push(i64::MIN);
    times.extend(releases.iter().map(|(t, _)| *t));
    for r in resv {
        times.push(r.start);
        times.push(r.end);
    }
    times.sort_unstable();
    times.dedup();

    let mut rel: Vec<(i64, Tres)> = releases.to_vec();
    rel.sort_unstable_by_key(|(t, _)| *t);
    let mut starts: Vec<&Resv> = resv.iter().collect();
    starts.sort_unstable_by_key(|r| r.start);
    let mut ends: Vec<&Resv> = resv.iter().collect();
    ends.sort_unstable_by_key(|r| r.end);

    let (mut ri, mut si, mut ei) = (0, 0, 0);
    let mut base = free;
    // Sums of active reservations; wide so adding then removing is exact.
    let (mut cpus, mut mem, mut gpus) = (0u128, 0u128, 0u128);
    let (mut whole, mut batch, mut kube) = (0u32, 0u32, 0u32);
    let mut steps = Vec::with_capacity(times.len());
    for t in times {
        while ri < rel.len() && rel[ri].0 <= t {
            base = base.saturating_add(&rel[ri].1);
            ri += 1;
        }
        while si < starts.len() && starts[si].start <= t {
            let r = starts[si];
            cpus += u128::from(r.need.cpus);
            mem += u128::from(r.need.mem_mb);
            gpus += u128::from(r.need.gpus);
            whole += u32::from(r.whole);
            match r.mode {
                NodeMode::Batch => batch += 1,
                NodeMode::Kube => kube += 1,
            }
            si += 1;
        }
        while ei < ends.len() && ends[ei].end <= t {
            let r = ends[ei];
            cpus -= u128::from(r.need.cpus);
            mem -= u128::from(r.need.mem_mb);
            gpus -= u128::from(r.need.gpus);
            whole -= u32::from(r.whole);
            match r.mode {
                NodeMode::Batch => batch -= 1,
                NodeMode::Kube => kube -= 1,
            }
            ei += 1;
        }
        let capped = Tres {
            cpus: base.cpus.min(total.cpus),
            mem_mb: base.mem_mb.min(total.mem_mb),
            gpus: base.gpus.min(total.gpus),
        };
        let sub = |have: u128, taken: u128| have.saturating_sub(taken);
        let avail = Tres {
            cpus: u32::try_from(sub(u128::from(capped.cpus), cpus)).unwrap_or(u32::MAX),
            mem_mb: u64::try_from(sub(u128::from(capped.mem_mb), mem)).unwrap_or(u64::MAX),
            gpus: u32::try_from(sub(u128::from(capped.gpus), gpus)).unwrap_or(u32::MAX),
        };
        steps.push(Step {
            t,
            avail,
            whole,
            batch,
            kube,
        });
    }
    steps
}

/// Index of the step in force at `t`.
pub(crate) fn at(steps: &[Step], t: i64) -> usize {
    steps.partition_point(|s| s.t <= t).saturating_sub(1)
}

/// The first step in `[t, end)` the request cannot use (the step in force at `t` is always
/// checked), or `None` when the whole window admits it.
pub(crate) fn first_blocked(
    steps: &[Step],
    t: i64,
    end: i64,
    need: &Tres,
    mode: NodeMode,
    exclusive: bool,
) -> Option<usize> {
    let mut j = at(steps, t);
    loop {
        let s = steps.get(j)?;
        if s.t > t && s.t >= end {
            return None;
        }
        if !s.admits(need, mode, exclusive) {
            return Some(j);
        }
        j += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tres(cpus: u32, gpus: u32) -> Tres {
        Tres {
            cpus,
            mem_mb: u64::from(cpus) * 128,
            gpus,
        }
    }

    fn resv(start: i64, end: i64, need: Tres, mode: NodeMode, whole: bool) -> Resv {
        Resv {
            start,
            end,
            need,
            mode,
            whole,
        }
    }

    #[test]
    fn releases_add_up_to_the_node_size_and_reservations_subtract() {
        let total = tres(8, 8);
        let releases = [(100, tres(4, 4)), (50, tres(4, 4)), (70, tres(4, 4))];
        let r = [resv(60, 80, tres(2, 2), NodeMode::Batch, false)];
        let p = build(tres(0, 0), total, &releases, &r);
        let gpus_at = |t| p[at(&p, t)].avail.gpus;
        assert_eq!(gpus_at(0), 0);
        assert_eq!(gpus_at(50), 4);
        assert_eq!(gpus_at(60), 2, "reservation takes 2 from 4");
        assert_eq!(gpus_at(70), 6, "capped at 8, minus 2 reserved");
        assert_eq!(gpus_at(80), 8);
        assert_eq!(gpus_at(100), 8, "never above the node size");
    }

    #[test]
    fn a_window_is_blocked_by_any_step_inside_it_only() {
        let total = tres(8, 8);
        let r = [resv(100, 200, tres(8, 8), NodeMode::Batch, false)];
        let p = build(total, total, &[], &r);
        let need = tres(1, 1);
        assert_eq!(
            first_blocked(&p, 0, 100, &need, NodeMode::Batch, false),
            None
        );
        assert!(first_blocked(&p, 0, 101, &need, NodeMode::Batch, false).is_some());
        assert_eq!(
            first_blocked(&p, 200, i64::MAX, &need, NodeMode::Batch, false),
            None
        );
    }

    #[test]
    fn whole_node_and_other_mode_reservations_block_whatever_is_free() {
        let total = tres(8, 8);
        let small = tres(1, 1);
        let whole = build(
            total,
            total,
            &[],
            &[resv(10, 20, small, NodeMode::Batch, true)],
        );
        assert!(first_blocked(&whole, 0, 15, &small, NodeMode::Batch, false).is_some());
        let kube = build(
            total,
            total,
            &[],
            &[resv(10, 20, small, NodeMode::Kube, false)],
        );
        assert!(first_blocked(&kube, 0, 15, &small, NodeMode::Batch, false).is_some());
        assert_eq!(
            first_blocked(&kube, 0, 15, &small, NodeMode::Kube, false),
            None
        );
        assert!(
            first_blocked(&kube, 0, 15, &small, NodeMode::Kube, true).is_some(),
            "an exclusive job shares with no reservation"
        );
    }
}
