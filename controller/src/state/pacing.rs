//! When the actor runs a scheduling pass. A struct of its own because the rules are about
//! time and events only, and worth testing without a cluster:
//!
//! - A pass is wanted after any event that can change what runs; events during a pass
//!   coalesce into one more pass.
//! - A pass starts no sooner than its predecessor's duration after that one ended, bounding
//!   scheduling to half the actor's time under a flood of events while an idle cluster's
//!   submit-to-start stays immediate.
//! - A pass joins the flush of the commands before it (one commit for a submit and the start
//!   it allows) only while passes are quick and no tick is due.
//! - A submit that can start only on free resources asks for a pass only if some node has
//!   room; otherwise its job is told now what a pass would tell it.

use std::time::{Duration, Instant};

use tandem_sched::JobId;

#[derive(Debug)]
pub struct PassPacing {
    /// An event that can change what runs (end, cancel, node change, update) happened.
    wanted: bool,
    /// Jobs submitted since the last settling that a pass could start only if some node
    /// has free resources (a preempting QOS wants a pass instead). On a full cluster with a
    /// long queue this spares a pass over every pending job per submit; the jobs get their
    /// priority and reason from `tandem_sched::State::no_room_for` instead.
    submitted_if_capacity: Vec<JobId>,
    next_at: Instant,
    /// How long the last pass took.
    last: Duration,
}

impl PassPacing {
    /// At start: a pass is wanted at once (recovered jobs may start).
    pub fn new(now: Instant) -> Self {
        PassPacing {
            wanted: true,
            submitted_if_capacity: Vec::new(),
            next_at: now,
            last: Duration::ZERO,
        }
    }

    pub fn want(&mut self) {
        self.wanted = true;
    }

    #[cfg(test)]
    pub fn is_wanted(&self) -> bool {
        self.wanted
    }

    /// A job was submitted that a pass could start only on free resources.
    pub fn submitted_if_capacity(&mut self, job: JobId) {
        self.submitted_if_capacity.push(job);
    }

    /// Turns the submits since the last settling into a wanted pass if `capacity()` says
    /// some node has room. Returns the jobs no pass will see now (none has room), to be
    /// told so; empty when there is nothing to tell. `capacity` is asked only when needed.
    pub fn settle(&mut self, capacity: impl FnOnce() -> bool) -> Vec<JobId> {
        if self.submitted_if_capacity.is_empty() {
            return Vec::new();
        }
        let submitted = std::mem::take(&mut self.submitted_if_capacity);
        if self.wanted {
            return Vec::new();
        }
        if capacity() {
            self.wanted = true;
            return Vec::new();
        }
        submitted
    }

    /// When the actor must wake up: at the next tick, or sooner for a wanted pass.
    pub fn wake(&self, next_tick: Instant) -> Instant {
        if self.wanted {
            next_tick.min(self.next_at)
        } else {
            next_tick
        }
    }

    /// Whether a pass is wanted and allowed at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.wanted && now >= self.next_at
    }

    /// Whether the pass due at `now` runs before the drained commands are flushed, sharing
    /// their commit: only while the last pass took at most `quick`, and never when a tick is
    /// due (it runs first, so nodes lost now are not scheduled on).
    pub fn joins_flush(&self, now: Instant, tick_due: bool, quick: Duration) -> bool {
        if tick_due || self.last > quick {
            return false;
        }
        self.due(now)
    }

    /// A pass starts: what is wanted from now on is the next pass.
    pub fn started(&mut self) {
        self.wanted = false;
    }

    /// A pass that took `took` ended at `ended`: the next waits as long.
    pub fn finished(&mut self, ended: Instant, took: Duration) {
        self.next_at = ended + took;
        self.last = took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_pass_waits_as_long_as_its_predecessor_took_and_events_coalesce() {
        let t0 = Instant::now();
        let mut p = PassPacing::new(t0);
        assert!(p.due(t0), "wanted at start");
        p.started();
        // Events during the pass: one more pass, not one each.
        p.want();
        p.want();
        p.finished(t0 + 10 * MS, 10 * MS);
        assert!(!p.due(t0 + 19 * MS));
        assert!(p.due(t0 + 20 * MS));
        assert_eq!(p.wake(t0 + 200 * MS), t0 + 20 * MS);
        p.started();
        p.finished(t0 + 21 * MS, MS);
        assert!(!p.due(t0 + 30 * MS), "nothing happened since");
        assert_eq!(p.wake(t0 + 200 * MS), t0 + 200 * MS);
    }

    #[test]
    fn only_a_quick_pass_joins_the_flush_and_never_before_a_tick() {
        let t0 = Instant::now();
        let quick = MS;
        let mut p = PassPacing::new(t0);
        assert!(p.joins_flush(t0, false, quick));
        assert!(!p.joins_flush(t0, true, quick), "the tick goes first");
        p.started();
        p.finished(t0, 5 * MS);
        p.want();
        assert!(p.due(t0 + 5 * MS));
        assert!(
            !p.joins_flush(t0 + 5 * MS, false, quick),
            "slow passes run after the flush"
        );
        p.started();
        p.finished(t0 + 6 * MS, quick);
        p.want();
        assert!(p.joins_flush(t0 + 7 * MS, false, quick));
        assert!(
            !p.joins_flush(t0 + 6 * MS, false, quick),
            "not before it is due"
        );
    }

    #[test]
    fn submits_want_a_pass_only_where_there_is_room() {
        let t0 = Instant::now();
        let mut p = PassPacing::new(t0);
        p.started();
        // Nothing submitted: capacity is not even asked.
        assert!(p.settle(|| unreachable!()).is_empty());
        // Room somewhere: a pass.
        p.submitted_if_capacity(JobId(1));
        assert!(p.settle(|| true).is_empty());
        assert!(p.is_wanted());
        // A pass already wanted covers the submits.
        p.submitted_if_capacity(JobId(2));
        assert!(p.settle(|| unreachable!()).is_empty());
        // No room: no pass; the jobs are handed back to be told, once.
        p.started();
        p.submitted_if_capacity(JobId(3));
        p.submitted_if_capacity(JobId(4));
        assert_eq!(p.settle(|| false), [JobId(3), JobId(4)]);
        assert!(!p.is_wanted());
        assert!(p.settle(|| false).is_empty());
    }
}
