//! `--dependency`: parsing Slurm's dependency expressions and deciding whether they hold.
//!
//! `afterok:1:2,afterany:3` needs every item (`,`); `afterok:1?afternotok:1` needs any (`?`).
//! Slurm does not allow mixing the two separators, and neither do we.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::JobId;

/// Why a dependency expression was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid dependency {input:?}: {problem}")]
pub struct DependencyError {
    pub input: String,
    pub problem: String,
}

fn derr(input: &str, problem: impl Into<String>) -> DependencyError {
    DependencyError {
        input: crate::quote::clipped(input),
        problem: problem.into(),
    }
}

/// Most items one expression may hold; a longer list is hostile or a mistake.
pub const MAX_DEPENDENCY_ITEMS: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Combine {
    /// `,`: every item must be satisfied.
    All,
    /// `?`: one satisfied item is enough.
    Any,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DepKind {
    /// Start after the target started (or was cancelled before starting), plus a delay.
    After { delay_s: u64 },
    /// After the target ended, in any state.
    AfterAny,
    /// After the target ended COMPLETED (exit code 0).
    AfterOk,
    /// After the target ended in a failed state.
    AfterNotOk,
    /// Task `i` of this array after task `i` of the target array ended COMPLETED.
    AfterCorr,
    /// After every earlier job of the same user and name has ended.
    Singleton,
}

/// The job an item refers to: a job, an array task (`12_3`) or a whole array (`12`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepTarget {
    pub job: JobId,
    pub task: Option<u32>,
}

impl fmt::Display for DepTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(t) => write!(f, "{}_{}", self.job, t),
            None => write!(f, "{}", self.job),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepItem {
    pub kind: DepKind,
    /// `None` only for `Singleton`.
    pub target: Option<DepTarget>,
}

/// A parsed dependency expression.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub combine: Combine,
    pub items: Vec<DepItem>,
}

/// The outcome of evaluating a dependency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepStatus {
    Satisfied,
    Pending,
    /// It can never be satisfied (e.g. `afterok` on a job that failed); Slurm leaves such jobs
    /// pending with reason `DependencyNeverSatisfied`.
    NeverSatisfied,
}

/// What evaluation needs to know about a target (a job, an array task or a whole array).
/// For a whole array, the fields summarise every task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetStatus {
    /// Every task started, or ended without starting (cancelled while pending).
    pub all_started: bool,
    /// Latest start time, when known (for `after:JOB+MIN`).
    pub started_at: Option<i64>,
    /// Every task reached a terminal state.
    pub all_finished: bool,
    /// Some task ended in a state other than COMPLETED.
    pub any_not_ok: bool,
}

impl Dependency {
    /// Parses `afterok:1:2,afterany:3_4,singleton`, `after:5+10` (minutes),
    /// `afterok:1?afternotok:2`.
    pub fn parse(s: &str) -> Result<Dependency, DependencyError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(derr(s, "empty"));
        }
        let (combine, sep) = match (t.contains(','), t.contains('?')) {
            (true, true) => return Err(derr(s, "use either ',' (all) or '?' (any), not both")),
            (false, true) => (Combine::Any, '?'),
            _ => (Combine::All, ','),
        };
        let mut items = Vec::new();
        for part in t.split(sep) {
            let part = part.trim();
            if part.is_empty() {
                return Err(derr(s, "empty element"));
            }
            let mut fields = part.split(':');
            let kind_s = fields.next().unwrap_or_default().to_ascii_lowercase();
            let targets: Vec<&str> = fields.collect();
            if kind_s == "singleton" {
                if !targets.is_empty() {
                    return Err(derr(s, "singleton takes no job ids"));
                }
                items.push(DepItem {
                    kind: DepKind::Singleton,
                    target: None,
                });
                continue;
            }
            let base = match kind_s.as_str() {
                "after" => DepKind::After { delay_s: 0 },
                "afterany" => DepKind::AfterAny,
                "afterok" => DepKind::AfterOk,
                "afternotok" => DepKind::AfterNotOk,
                "aftercorr" => DepKind::AfterCorr,
                "" => return Err(derr(s, "missing dependency type")),
                other => {
                    return Err(derr(
                        s,
                        format!(
                            "unknown type {other:?} (after, afterany, afterok, afternotok, aftercorr, singleton)"
                        ),
                    ));
                }
            };
            if targets.is_empty() {
                return Err(derr(s, format!("{kind_s} needs at least one job id")));
            }
            for target in targets {
                let (id_part, delay) = match target.split_once('+') {
                    Some((id, d)) => {
                        if !matches!(base, DepKind::After { .. }) {
                            return Err(derr(s, "+MINUTES is only allowed with after"));
                        }
                        let mins: u64 =
                            parse_num(d).ok_or_else(|| derr(s, format!("bad delay {d:?}")))?;
                        let secs = mins
                            .checked_mul(60)
                            .ok_or_else(|| derr(s, "delay too large"))?;
                        (id, Some(secs))
                    }
                    None => (target, None),
                };
                let (job_s, task) = match id_part.split_once('_') {
                    Some((j, t)) => {
                        let t = u32::try_from(
                            parse_num(t).ok_or_else(|| derr(s, format!("bad array task {t:?}")))?,
                        )
                        .map_err(|_| derr(s, "array task too large"))?;
                        (j, Some(t))
                    }
                    None => (id_part, None),
                };
                let job = parse_num(job_s)
                    .filter(|j| *j > 0)
                    .ok_or_else(|| derr(s, format!("bad job id {job_s:?}")))?;
                if base == DepKind::AfterCorr && task.is_some() {
                    return Err(derr(s, "aftercorr takes a whole array id, not a task"));
                }
                let kind = match (base, delay) {
                    (DepKind::After { .. }, Some(d)) => DepKind::After { delay_s: d },
                    (k, _) => k,
                };
                items.push(DepItem {
                    kind,
                    target: Some(DepTarget {
                        job: JobId(job),
                        task,
                    }),
                });
                if items.len() > MAX_DEPENDENCY_ITEMS {
                    return Err(derr(s, format!("more than {MAX_DEPENDENCY_ITEMS} items")));
                }
            }
        }
        Ok(Dependency { combine, items })
    }

    /// Whether the expression contains `singleton`.
    pub fn has_singleton(&self) -> bool {
        self.items.iter().any(|i| i.kind == DepKind::Singleton)
    }

    /// Job ids this expression refers to.
    pub fn targets(&self) -> impl Iterator<Item = DepTarget> + '_ {
        self.items.iter().filter_map(|i| i.target)
    }

    /// Evaluates the expression.
    ///
    /// `lookup(target)` describes a target; `None` means the job is no longer known (purged
    /// after it ended), which Slurm treats as satisfied. `my_task` is the dependent job's own
    /// array index (for `aftercorr`). `singleton_clear` says whether no other job of the same
    /// user and name blocks this one.
    pub fn evaluate(
        &self,
        lookup: impl Fn(DepTarget) -> Option<TargetStatus>,
        my_task: Option<u32>,
        singleton_clear: bool,
        now: i64,
    ) -> DepStatus {
        let mut statuses = self.items.iter().map(|item| {
            if item.kind == DepKind::Singleton {
                return if singleton_clear {
                    DepStatus::Satisfied
                } else {
                    DepStatus::Pending
                };
            }
            let Some(mut target) = item.target else {
                return DepStatus::Satisfied;
            };
            if item.kind == DepKind::AfterCorr {
                target.task = my_task;
            }
            let Some(st) = lookup(target) else {
                return DepStatus::Satisfied;
            };
            item_status(item.kind, &st, now)
        });
        match self.combine {
            Combine::All => {
                let mut all = DepStatus::Satisfied;
                for s in statuses.by_ref() {
                    match s {
                        DepStatus::NeverSatisfied => return DepStatus::NeverSatisfied,
                        DepStatus::Pending => all = DepStatus::Pending,
                        DepStatus::Satisfied => {}
                    }
                }
                all
            }
            Combine::Any => {
                let mut any = DepStatus::NeverSatisfied;
                for s in statuses.by_ref() {
                    match s {
                        DepStatus::Satisfied => return DepStatus::Satisfied,
                        DepStatus::Pending => any = DepStatus::Pending,
                        DepStatus::NeverSatisfied => {}
                    }
                }
                any
            }
        }
    }
}

fn item_status(kind: DepKind, st: &TargetStatus, now: i64) -> DepStatus {
    match kind {
        DepKind::After { delay_s } => {
            if !st.all_started {
                DepStatus::Pending
            } else if delay_s == 0 || st.all_finished {
                DepStatus::Satisfied
            } else {
                match st.started_at {
                    Some(t) if now < t.saturating_add(delay_s as i64) => DepStatus::Pending,
                    _ => DepStatus::Satisfied,
                }
            }
        }
        DepKind::AfterAny => {
            if st.all_finished {
                DepStatus::Satisfied
            } else {
                DepStatus::Pending
            }
        }
        DepKind::AfterOk | DepKind::AfterCorr => {
            if st.any_not_ok {
                DepStatus::NeverSatisfied
            } else if st.all_finished {
                DepStatus::Satisfied
            } else {
                DepStatus::Pending
            }
        }
        DepKind::AfterNotOk => match (st.all_finished, st.any_not_ok) {
            (true, true) => DepStatus::Satisfied,
            (true, false) => DepStatus::NeverSatisfied,
            _ => DepStatus::Pending,
        },
        DepKind::Singleton => DepStatus::Satisfied,
    }
}

fn parse_num(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Slurm's form, one item per type and target: `afterok:1,afterok:2,singleton`.
impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = match self.combine {
            Combine::All => ",",
            Combine::Any => "?",
        };
        for (k, item) in self.items.iter().enumerate() {
            if k > 0 {
                f.write_str(sep)?;
            }
            let name = match item.kind {
                DepKind::After { .. } => "after",
                DepKind::AfterAny => "afterany",
                DepKind::AfterOk => "afterok",
                DepKind::AfterNotOk => "afternotok",
                DepKind::AfterCorr => "aftercorr",
                DepKind::Singleton => "singleton",
            };
            f.write_str(name)?;
            if let Some(t) = item.target {
                write!(f, ":{t}")?;
                if let DepKind::After { delay_s } = item.kind
                    && delay_s > 0
                {
                    write!(f, "+{}", delay_s / 60)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn running(at: i64) -> TargetStatus {
        TargetStatus {
            all_started: true,
            started_at: Some(at),
            all_finished: false,
            any_not_ok: false,
        }
    }
    fn done(ok: bool) -> TargetStatus {
        TargetStatus {
            all_started: true,
            started_at: Some(0),
            all_finished: true,
            any_not_ok: !ok,
        }
    }
    fn pending() -> TargetStatus {
        TargetStatus {
            all_started: false,
            started_at: None,
            all_finished: false,
            any_not_ok: false,
        }
    }

    #[test]
    fn parses_every_form() {
        let d = Dependency::parse("afterok:1:2,afterany:3_4,singleton").unwrap();
        assert_eq!(d.combine, Combine::All);
        assert_eq!(d.items.len(), 4);
        assert_eq!(
            d.items[2].target,
            Some(DepTarget {
                job: JobId(3),
                task: Some(4)
            })
        );
        assert!(d.has_singleton());
        assert_eq!(d.to_string(), "afterok:1,afterok:2,afterany:3_4,singleton");
        let d = Dependency::parse("afterok:1?afternotok:1").unwrap();
        assert_eq!(d.combine, Combine::Any);
        assert_eq!(d.to_string(), "afterok:1?afternotok:1");
        let d = Dependency::parse("after:5+10").unwrap();
        assert_eq!(d.items[0].kind, DepKind::After { delay_s: 600 });
        assert_eq!(d.to_string(), "after:5+10");
    }

    #[test]
    fn rejects_bad_expressions() {
        let cases = [
            ("", "empty"),
            ("afterok", "at least one job id"),
            ("afterok:x", "bad job id"),
            ("afterok:0", "bad job id"),
            ("afterok:-1", "bad job id"),
            ("whenever:1", "unknown type"),
            ("afterok:1,afterany:2?afterok:3", "not both"),
            ("singleton:4", "no job ids"),
            ("afterok:1+5", "only allowed with after"),
            ("aftercorr:3_1", "whole array"),
            ("afterok:1,,afterok:2", "empty element"),
        ];
        for (input, want) in cases {
            let e = Dependency::parse(input).unwrap_err();
            assert!(e.to_string().contains(want), "{input}: {e}");
        }
    }

    #[test]
    fn evaluates_each_kind() {
        let cases: &[(&str, TargetStatus, DepStatus)] = &[
            ("afterok:1", pending(), DepStatus::Pending),
            ("afterok:1", running(0), DepStatus::Pending),
            ("afterok:1", done(true), DepStatus::Satisfied),
            ("afterok:1", done(false), DepStatus::NeverSatisfied),
            ("afternotok:1", done(false), DepStatus::Satisfied),
            ("afternotok:1", done(true), DepStatus::NeverSatisfied),
            ("afterany:1", done(false), DepStatus::Satisfied),
            ("afterany:1", running(0), DepStatus::Pending),
            ("after:1", running(0), DepStatus::Satisfied),
            ("after:1", pending(), DepStatus::Pending),
            ("after:1+10", running(50), DepStatus::Pending),
            ("after:1+1", running(0), DepStatus::Satisfied),
            ("afterok:1?afternotok:1", done(false), DepStatus::Satisfied),
            (
                "afterok:1?afterok:1",
                done(false),
                DepStatus::NeverSatisfied,
            ),
        ];
        for (expr, st, want) in cases {
            let d = Dependency::parse(expr).unwrap();
            assert_eq!(d.evaluate(|_| Some(*st), None, true, 100), *want, "{expr}");
        }
    }

    #[test]
    fn unknown_targets_are_satisfied_and_singleton_follows_the_flag() {
        let d = Dependency::parse("afterok:99").unwrap();
        assert_eq!(d.evaluate(|_| None, None, true, 0), DepStatus::Satisfied);
        let d = Dependency::parse("singleton").unwrap();
        assert_eq!(d.evaluate(|_| None, None, false, 0), DepStatus::Pending);
        assert_eq!(d.evaluate(|_| None, None, true, 0), DepStatus::Satisfied);
    }

    #[test]
    fn aftercorr_asks_for_the_matching_task() {
        let d = Dependency::parse("aftercorr:7").unwrap();
        let st = d.evaluate(
            |t| {
                assert_eq!(
                    t,
                    DepTarget {
                        job: JobId(7),
                        task: Some(3)
                    }
                );
                Some(done(true))
            },
            Some(3),
            true,
            0,
        );
        assert_eq!(st, DepStatus::Satisfied);
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in ".{0,60}") {
            let _ = Dependency::parse(&s);
        }

        #[test]
        fn parser_never_panics_on_near_misses(s in "(after(ok|any|notok|corr)?|singleton)?[:0-9_+,?]{0,30}") {
            if let Ok(d) = Dependency::parse(&s) {
                // What parses prints to something that parses to the same thing.
                prop_assert_eq!(Dependency::parse(&d.to_string()).unwrap(), d);
            }
        }
    }
}
