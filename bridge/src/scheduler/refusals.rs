//! The scheduler loop's book of evictions refused by PodDisruptionBudgets. Pure: the loop
//! records each refusal an eviction operation reports, and asks, when a job's pods are to
//! be evicted, which to evict now, which to delete (refused for the whole eviction
//! timeout) and which to leave until their backoff has passed; every rule is a unit test.
//!
//! A refused eviction is tried again with backoff, and past the timeout the pod is
//! deleted: a PodDisruptionBudget must not hold a scancel, a preemption or a time limit
//! forever.

use std::collections::HashMap;

use super::PodKey;

/// The longest wait, in seconds, between two evictions of a pod a PodDisruptionBudget
/// keeps refusing.
const MAX_EVICT_BACKOFF_S: i64 = 30;

/// A pod whose eviction a PodDisruptionBudget refused: since when, and when to try again
/// (2 s after the first refusal, doubling up to [`MAX_EVICT_BACKOFF_S`]).
#[derive(Debug, Clone, Copy)]
struct Refusal {
    first: i64,
    attempts: u32,
    next: i64,
}

/// Evictions refused by PodDisruptionBudgets, per pod.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    by_pod: HashMap<PodKey, Refusal>,
}

/// What to do now with the pods a decision evicts.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Evict through the Eviction API: never refused, or their backoff has passed.
    pub evict: Vec<String>,
    /// Delete: their evictions were refused for the whole eviction timeout.
    pub overdue: Vec<String>,
}

impl Plan {
    /// Every pod's eviction is backing off: nothing to do before the next try.
    pub(super) fn backs_off(&self) -> bool {
        self.evict.is_empty() && self.overdue.is_empty()
    }
}

impl Refusals {
    /// A PodDisruptionBudget refused `key`'s eviction at `now`: its next try waits twice
    /// as long as the last (up to [`MAX_EVICT_BACKOFF_S`]).
    pub(super) fn refused(&mut self, key: PodKey, now: i64) {
        let r = self.by_pod.entry(key).or_insert(Refusal {
            first: now,
            attempts: 0,
            next: now,
        });
        r.attempts = r.attempts.saturating_add(1);
        let wait = 1i64
            .checked_shl(r.attempts.min(6))
            .unwrap_or(MAX_EVICT_BACKOFF_S)
            .min(MAX_EVICT_BACKOFF_S);
        r.next = now.saturating_add(wait);
    }

    /// The pod left the API: its refusals with it.
    pub(super) fn forget(&mut self, key: &PodKey) {
        self.by_pod.remove(key);
    }

    /// Which of `names` (pods of namespace `ns` a decision evicts) to evict at `now` and
    /// which to delete, refused for `timeout_s` since their first refusal; the rest are
    /// backing off.
    pub(super) fn plan(&self, ns: &str, names: Vec<String>, now: i64, timeout_s: i64) -> Plan {
        let mut plan = Plan::default();
        for n in names {
            match self.by_pod.get(&(ns.to_owned(), n.clone())) {
                Some(r) if now >= r.first.saturating_add(timeout_s) => plan.overdue.push(n),
                Some(r) if now < r.next => {}
                _ => plan.evict.push(n),
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: i64 = 600;

    fn key(name: &str) -> PodKey {
        ("ns".into(), name.into())
    }

    fn plan(r: &Refusals, names: &[&str], now: i64) -> Plan {
        let names = names.iter().map(|n| (*n).to_owned()).collect();
        r.plan("ns", names, now, TIMEOUT)
    }

    fn evict(names: &[&str]) -> Plan {
        Plan {
            evict: names.iter().map(|n| (*n).to_owned()).collect(),
            overdue: Vec::new(),
        }
    }

    /// The first second at which `a` is evicted again after a refusal at `at`.
    fn next_try(r: &Refusals, at: i64) -> i64 {
        (at..at + 100)
            .find(|t| !plan(r, &["a"], *t).backs_off())
            .expect("tried again within 100 s")
    }

    #[test]
    fn a_pod_not_refused_is_evicted_at_once() {
        let mut r = Refusals::default();
        assert_eq!(plan(&r, &["a", "b"], 100), evict(&["a", "b"]));
        // Another pod's refusal, or the same name in another namespace, changes nothing.
        r.refused(key("b"), 100);
        r.refused(("other".into(), "a".into()), 100);
        assert_eq!(plan(&r, &["a", "b"], 100), evict(&["a"]));
    }

    #[test]
    fn backoff_doubles_up_to_thirty_seconds() {
        let mut r = Refusals::default();
        let mut at = 1_000;
        let mut waits = Vec::new();
        for _ in 0..8 {
            r.refused(key("a"), at);
            let next = next_try(&r, at);
            waits.push(next - at);
            at = next;
        }
        assert_eq!(waits, [2, 4, 8, 16, 30, 30, 30, 30]);
        assert_eq!(MAX_EVICT_BACKOFF_S, 30);
    }

    #[test]
    fn backing_off_is_neither_evicted_nor_overdue() {
        let mut r = Refusals::default();
        r.refused(key("a"), 100);
        let p = plan(&r, &["a"], 101);
        assert!(p.backs_off());
        assert_eq!(p, Plan::default());
        assert_eq!(plan(&r, &["a"], 102), evict(&["a"]));
    }

    #[test]
    fn overdue_exactly_at_first_refusal_plus_timeout() {
        let mut r = Refusals::default();
        r.refused(key("a"), 100);
        // Refused again and again: the timeout counts from the first refusal.
        for t in (102..100 + TIMEOUT).step_by(30) {
            r.refused(key("a"), t);
        }
        let before = plan(&r, &["a"], 100 + TIMEOUT - 1);
        assert!(before.overdue.is_empty());
        let due = plan(&r, &["a"], 100 + TIMEOUT);
        assert_eq!(due.overdue, ["a"]);
        assert!(due.evict.is_empty());
        // Overdue even while its backoff runs.
        r.refused(key("a"), 100 + TIMEOUT);
        assert_eq!(plan(&r, &["a"], 100 + TIMEOUT + 1).overdue, ["a"]);
    }

    #[test]
    fn a_forgotten_pod_starts_over() {
        let mut r = Refusals::default();
        r.refused(key("a"), 100);
        r.forget(&key("a"));
        assert_eq!(plan(&r, &["a"], 100), evict(&["a"]));
        r.refused(key("a"), 100 + TIMEOUT);
        assert!(plan(&r, &["a"], 100 + TIMEOUT).backs_off());
    }

    #[test]
    fn a_plan_keeps_the_order_it_was_given() {
        let mut r = Refusals::default();
        r.refused(key("c"), 0);
        r.refused(key("a"), 0);
        let p = plan(&r, &["d", "c", "b", "a"], TIMEOUT);
        assert_eq!(p.evict, ["d", "b"]);
        assert_eq!(p.overdue, ["c", "a"]);
    }
}
