//! Job arrays: `--array` specs and the compact index sets that keep a million-task array one
//! small record.
//!
//! An [`IndexSet`] is a sorted list of disjoint arithmetic runs `start..=end step s`. Typed
//! specs (`0-999999`, `1,3,5`, `0-99:2`) are almost always a handful of runs, so parsing,
//! counting and taking the next index are O(runs), independent of the task count.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Slurm's `MaxArraySize` default for Tandem: indices `0..=1_000_000` (1,000,001 tasks).
pub const DEFAULT_MAX_ARRAY_SIZE: u32 = 1_000_001;

/// Why an array spec was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid array spec {input:?}: {problem}")]
pub struct ArrayError {
    pub input: String,
    pub problem: String,
}

fn aerr(input: &str, problem: impl Into<String>) -> ArrayError {
    ArrayError {
        input: crate::quote::clipped(input),
        problem: problem.into(),
    }
}

/// One arithmetic run: `start, start+step, ..., end` (`end` is a member; `step >= 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub start: u32,
    pub end: u32,
    pub step: u32,
}

impl Run {
    fn len(&self) -> u64 {
        u64::from((self.end - self.start) / self.step) + 1
    }
    fn contains(&self, i: u32) -> bool {
        i >= self.start && i <= self.end && (i - self.start).is_multiple_of(self.step)
    }
}

/// A set of array indices as sorted, disjoint arithmetic runs.
///
/// Invariant: runs are sorted, `runs[k].end < runs[k+1].start`, every run is non-empty and
/// its `end` is a member. Built only through [`IndexSetBuilder`], which merges neighbours, so
/// equal sets built from sorted input have equal runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexSet {
    runs: Vec<Run>,
}

/// Builds an [`IndexSet`] from indices or runs given in increasing order.
#[derive(Default)]
pub struct IndexSetBuilder {
    runs: Vec<Run>,
}

impl IndexSetBuilder {
    /// Appends `i`, which must be greater than everything pushed so far.
    pub fn push(&mut self, i: u32) {
        self.push_run(Run {
            start: i,
            end: i,
            step: 1,
        });
    }

    /// Appends a run that starts after everything pushed so far.
    pub fn push_run(&mut self, r: Run) {
        debug_assert!(self.runs.last().is_none_or(|l| l.end < r.start));
        if let Some(last) = self.runs.last_mut() {
            let gap = r.start - last.end;
            let last_single = last.start == last.end;
            let r_single = r.start == r.end;
            if last_single && (r_single || r.step == gap) {
                *last = Run {
                    start: last.start,
                    end: r.end,
                    step: gap,
                };
                return;
            }
            if !last_single && gap == last.step && (r_single || r.step == last.step) {
                last.end = r.end;
                return;
            }
        }
        self.runs.push(r);
    }

    pub fn build(self) -> IndexSet {
        IndexSet { runs: self.runs }
    }
}

impl IndexSet {
    pub fn new() -> Self {
        IndexSet::default()
    }

    /// `lo..=hi` with step 1 (empty when `hi < lo`).
    pub fn range(lo: u32, hi: u32) -> Self {
        if hi < lo {
            return IndexSet::new();
        }
        IndexSet {
            runs: vec![Run {
                start: lo,
                end: hi,
                step: 1,
            }],
        }
    }

    pub fn from_sorted(indices: impl IntoIterator<Item = u32>) -> Self {
        let mut b = IndexSetBuilder::default();
        let mut last: Option<u32> = None;
        for i in indices {
            if last.is_some_and(|l| i <= l) {
                continue;
            }
            b.push(i);
            last = Some(i);
        }
        b.build()
    }

    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    pub fn len(&self) -> u64 {
        self.runs.iter().map(Run::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn first(&self) -> Option<u32> {
        self.runs.first().map(|r| r.start)
    }

    pub fn last(&self) -> Option<u32> {
        self.runs.last().map(|r| r.end)
    }

    /// The common step when the set is one run (for `SLURM_ARRAY_TASK_STEP`), else 1.
    pub fn step(&self) -> u32 {
        match self.runs.as_slice() {
            [r] if r.start != r.end => r.step,
            _ => 1,
        }
    }

    pub fn contains(&self, i: u32) -> bool {
        let k = self.runs.partition_point(|r| r.end < i);
        self.runs.get(k).is_some_and(|r| r.contains(i))
    }

    /// Removes and returns the smallest index. O(1) amortised for the front run.
    pub fn pop_first(&mut self) -> Option<u32> {
        let r = self.runs.first_mut()?;
        let i = r.start;
        if r.start == r.end {
            self.runs.remove(0);
        } else {
            r.start += r.step;
        }
        Some(i)
    }

    /// Removes `i`; returns whether it was present.
    pub fn remove(&mut self, i: u32) -> bool {
        let k = self.runs.partition_point(|r| r.end < i);
        let Some(r) = self.runs.get(k).copied() else {
            return false;
        };
        if !r.contains(i) {
            return false;
        }
        if r.start == r.end {
            self.runs.remove(k);
        } else if i == r.start {
            self.runs[k].start += r.step;
        } else if i == r.end {
            self.runs[k].end -= r.step;
        } else {
            self.runs[k].end = i - r.step;
            self.runs.insert(
                k + 1,
                Run {
                    start: i + r.step,
                    end: r.end,
                    step: r.step,
                },
            );
        }
        true
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (r.start..=r.end).step_by(r.step as usize))
    }

    /// Elements of `self` that are in `other`, in order.
    pub fn intersection<'a>(&'a self, other: &'a IndexSet) -> impl Iterator<Item = u32> + 'a {
        // Walk the smaller side and test membership in the larger: hostile selections like
        // `12_[0-1000000]` against a small pending set stay cheap.
        let small_is_self = self.len() <= other.len();
        let (small, large) = if small_is_self {
            (self, other)
        } else {
            (other, self)
        };
        small.iter().filter(move |i| large.contains(*i))
    }

    /// Parses an index list as typed after `JOBID_` (`3`, `3,5-7`, `[3-5]`, `0-99:2`), with
    /// no throttle.
    pub fn parse(s: &str, max_size: u32) -> Result<IndexSet, ArrayError> {
        let t = s.trim();
        let t = t
            .strip_prefix('[')
            .and_then(|x| x.strip_suffix(']'))
            .unwrap_or(t);
        parse_runs(s, t, max_size)
    }
}

/// Folded Slurm form: `0-99:2`, `1,3,7-9`.
impl fmt::Display for IndexSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, r) in self.runs.iter().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            match r.len() {
                1 => write!(f, "{}", r.start)?,
                2 if r.step > 1 => write!(f, "{},{}", r.start, r.end)?,
                _ if r.step == 1 => write!(f, "{}-{}", r.start, r.end)?,
                _ => write!(f, "{}-{}:{}", r.start, r.end, r.step)?,
            }
        }
        Ok(())
    }
}

fn parse_runs(input: &str, body: &str, max_size: u32) -> Result<IndexSet, ArrayError> {
    if body.is_empty() {
        return Err(aerr(input, "empty"));
    }
    let max_index = max_size.saturating_sub(1);
    let num = |f: &str| -> Result<u32, ArrayError> {
        if f.starts_with('-') {
            return Err(aerr(input, "indices must not be negative"));
        }
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err(aerr(input, format!("expected a number, got {f:?}")));
        }
        let v: u64 = f.parse().map_err(|_| aerr(input, "number too large"))?;
        if v > u64::from(max_index) {
            return Err(aerr(
                input,
                format!("index {v} exceeds the maximum {max_index} (MaxArraySize={max_size})"),
            ));
        }
        Ok(v as u32)
    };
    let mut runs = Vec::new();
    for item in body.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(aerr(input, "empty element"));
        }
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        let (lo, hi) = match range.split_once('-') {
            Some(("", _)) => return Err(aerr(input, "indices must not be negative")),
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let v = num(range)?;
                (v, v)
            }
        };
        if hi < lo {
            return Err(aerr(input, format!("range {range:?} is backwards")));
        }
        let step = match step {
            Some(s) => {
                let v = num(s).map_err(|_| aerr(input, format!("bad step {s:?}")))?;
                if v == 0 {
                    return Err(aerr(input, "step must be at least 1"));
                }
                v
            }
            None => 1,
        };
        // Normalise so `end` is a member.
        let end = lo + (hi - lo) / step * step;
        runs.push(Run {
            start: lo,
            end,
            step: if end == lo { 1 } else { step },
        });
    }
    runs.sort_by_key(|r| (r.start, r.end));
    let overlapping = runs.windows(2).any(|w| w[0].end >= w[1].start);
    let mut b = IndexSetBuilder::default();
    if overlapping {
        // Rare (`1-5,3-7`): materialise, bounded by max_size, then rebuild.
        let mut all: Vec<u32> = runs
            .iter()
            .flat_map(|r| (r.start..=r.end).step_by(r.step as usize))
            .collect();
        all.sort_unstable();
        all.dedup();
        for i in all {
            b.push(i);
        }
    } else {
        for r in runs {
            b.push_run(r);
        }
    }
    let set = b.build();
    if set.len() > u64::from(max_size) {
        return Err(aerr(input, format!("more than {max_size} tasks")));
    }
    Ok(set)
}

/// A parsed `--array` spec: indices and an optional `%N` limit on concurrently running tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    pub indices: IndexSet,
    pub throttle: Option<u32>,
}

impl ArraySpec {
    /// Parses with the default [`DEFAULT_MAX_ARRAY_SIZE`].
    pub fn parse(s: &str) -> Result<ArraySpec, ArrayError> {
        Self::parse_with_max(s, DEFAULT_MAX_ARRAY_SIZE)
    }

    /// Parses `0-15`, `0,6,16-32`, `0-15:4`, `0-15%4`, `1,3,5%2`. Indices must be below
    /// `max_size` (Slurm's `MaxArraySize`).
    pub fn parse_with_max(s: &str, max_size: u32) -> Result<ArraySpec, ArrayError> {
        let t = s.trim();
        let (body, throttle) = match t.split_once('%') {
            Some((b, th)) => {
                if th.is_empty() || !th.bytes().all(|c| c.is_ascii_digit()) {
                    return Err(aerr(s, format!("bad throttle {th:?} (expected %N)")));
                }
                let n: u32 = th.parse().map_err(|_| aerr(s, "throttle too large"))?;
                if n == 0 {
                    return Err(aerr(s, "throttle %0 would never run a task"));
                }
                (b, Some(n))
            }
            None => (t, None),
        };
        Ok(ArraySpec {
            indices: parse_runs(s, body, max_size)?,
            throttle,
        })
    }
}

impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.indices)?;
        if let Some(n) = self.throttle {
            write!(f, "%{n}")?;
        }
        Ok(())
    }
}

/// The progress of an array job, kept on its record (the "meta" job) while tasks split off.
///
/// Counters exist so dependencies on the whole array (`afterok:ARRAY`) and the array's final
/// state can be decided without keeping every finished task in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayState {
    /// Indices that have not started yet (shrinks from the front as tasks start).
    pub pending: IndexSet,
    /// Started tasks, in start order: (index, the task's own job id).
    pub tasks: Vec<(u32, crate::JobId)>,
    /// Tasks started and not yet in a terminal state (running, or requeued and pending).
    pub active: u32,
    /// Tasks (or pending indices) that ended in a state other than COMPLETED.
    pub not_ok: u64,
    /// Of those, how many were cancelled.
    pub cancelled: u64,
    /// Tasks that ended COMPLETED.
    pub ok: u64,
    /// When the latest task started (`after:ARRAY+MIN` counts from it).
    #[serde(default)]
    pub last_start: Option<i64>,
}

impl ArrayState {
    pub fn new(spec: &ArraySpec) -> Self {
        ArrayState {
            pending: spec.indices.clone(),
            ..Default::default()
        }
    }

    /// The job id of task `index`, if it has started.
    pub fn task_job(&self, index: u32) -> Option<crate::JobId> {
        self.tasks
            .iter()
            .rev()
            .find(|(i, _)| *i == index)
            .map(|(_, j)| *j)
    }

    /// Whether every index has started and every started task has ended.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && self.active == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_folds_slurm_forms() {
        let cases: &[(&str, &str, u64)] = &[
            ("0-15", "0-15", 16),
            ("0,6,16-32", "0,6,16-32", 19),
            ("0-15:4", "0-12:4", 4),
            ("1,3,5", "1-5:2", 3),
            ("1,2,3", "1-3", 3),
            ("6-99%4", "6-99%4", 94),
            ("1-5,3-7", "1-7", 7),
            ("5,1", "1,5", 2),
            ("0-1000000", "0-1000000", 1_000_001),
            ("7", "7", 1),
        ];
        for (input, want, n) in cases {
            let spec = ArraySpec::parse(input).unwrap();
            assert_eq!(spec.to_string(), *want, "{input}");
            assert_eq!(spec.indices.len(), *n, "{input}");
        }
    }

    #[test]
    fn a_million_tasks_is_one_run() {
        let spec = ArraySpec::parse("0-1000000%10").unwrap();
        assert_eq!(spec.indices.runs().len(), 1);
        assert_eq!(spec.throttle, Some(10));
    }

    #[test]
    fn rejects_bad_specs() {
        let cases = [
            ("", "empty"),
            ("-1", "negative"),
            ("5-1", "backwards"),
            ("0-10:0", "step"),
            ("0-10%0", "throttle"),
            ("0-10%x", "throttle"),
            ("1000001", "exceeds the maximum"),
            ("a-b", "expected a number"),
            ("1,,2", "empty element"),
        ];
        for (input, want) in cases {
            let e = ArraySpec::parse(input).unwrap_err();
            assert!(e.to_string().contains(want), "{input}: {e}");
        }
        assert!(ArraySpec::parse_with_max("0-10", 10).is_err());
        assert!(ArraySpec::parse_with_max("0-9", 10).is_ok());
    }

    #[test]
    fn removing_splits_runs() {
        let mut s = IndexSet::parse("0-10:2", 100).unwrap();
        assert!(s.remove(4));
        assert!(!s.remove(5));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 2, 6, 8, 10]);
        assert_eq!(s.pop_first(), Some(0));
        assert_eq!(s.len(), 4);
        assert!(s.contains(8) && !s.contains(4));
    }

    #[test]
    fn selection_intersects_cheaply() {
        let pending = IndexSet::range(6, 99);
        let sel = IndexSet::parse("[3-7]", DEFAULT_MAX_ARRAY_SIZE).unwrap();
        assert_eq!(pending.intersection(&sel).collect::<Vec<_>>(), vec![6, 7]);
        let huge = IndexSet::range(0, 1_000_000);
        assert_eq!(huge.intersection(&IndexSet::range(5, 6)).count(), 2);
    }

    proptest! {
        #[test]
        fn print_parse_round_trips(mut idx in proptest::collection::vec(0u32..500, 1..60), throttle in proptest::option::of(1u32..50)) {
            idx.sort_unstable();
            idx.dedup();
            let spec = ArraySpec { indices: IndexSet::from_sorted(idx.iter().copied()), throttle };
            let printed = spec.to_string();
            let back = ArraySpec::parse(&printed).unwrap();
            prop_assert_eq!(back.indices.iter().collect::<Vec<_>>(), idx);
            prop_assert_eq!(back.to_string(), printed);
            prop_assert_eq!(back.throttle, throttle);
        }

        #[test]
        fn removal_matches_a_plain_set(idx in proptest::collection::btree_set(0u32..200, 1..60), rm in proptest::collection::vec(0u32..200, 0..30)) {
            let mut s = IndexSet::from_sorted(idx.iter().copied());
            let mut want = idx.clone();
            for r in rm {
                prop_assert_eq!(s.remove(r), want.remove(&r));
            }
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), want.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(s.len(), want.len() as u64);
        }

        #[test]
        fn parser_never_panics(s in ".{0,40}") {
            let _ = ArraySpec::parse(&s);
        }

        #[test]
        fn parser_never_panics_on_near_misses(s in "[0-9,:%\\-]{0,30}") {
            let _ = ArraySpec::parse(&s);
        }
    }
}
