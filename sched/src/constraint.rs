//! `--constraint`: node features a job requires (`a100`, `ib&nvlink`, `a100|h100`).

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid constraint {input:?}: {problem}")]
pub struct ConstraintError {
    pub input: String,
    pub problem: &'static str,
}

/// A feature expression. Slurm's richer forms (counts `a*2`, brackets `[a|b]` meaning "all
/// nodes alike") are rejected with a clear error rather than half-supported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Constraint {
    /// Every feature (`a&b`, or a single feature).
    All(Vec<String>),
    /// At least one feature (`a|b`).
    Any(Vec<String>),
}

impl Constraint {
    pub fn parse(s: &str) -> Result<Constraint, ConstraintError> {
        let err = |problem| ConstraintError {
            input: s.chars().take(64).collect(),
            problem,
        };
        let t = s.trim();
        if t.is_empty() {
            return Err(err("empty"));
        }
        if t.contains(['[', ']', '*', '(', ')']) {
            return Err(err("only feature names joined by '&' or '|' are supported"));
        }
        let (any, parts): (bool, Vec<&str>) =
            match (t.contains('&') || t.contains(','), t.contains('|')) {
                (true, true) => return Err(err("mixing '&' and '|' is not supported")),
                (false, true) => (true, t.split('|').collect()),
                _ => (false, t.split(['&', ',']).collect()),
            };
        let mut names = Vec::with_capacity(parts.len());
        for p in parts {
            let p = p.trim();
            if p.is_empty() {
                return Err(err("empty feature name"));
            }
            if !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '='))
            {
                return Err(err("feature names use letters, digits and _-.:="));
            }
            names.push(p.to_string());
        }
        Ok(if any {
            Constraint::Any(names)
        } else {
            Constraint::All(names)
        })
    }

    /// Whether a node with `features` satisfies the expression.
    pub fn matches<S: AsRef<str>>(&self, features: &[S]) -> bool {
        let has = |f: &String| features.iter().any(|x| x.as_ref() == f);
        match self {
            Constraint::All(fs) => fs.iter().all(has),
            Constraint::Any(fs) => fs.iter().any(has),
        }
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::All(fs) => f.write_str(&fs.join("&")),
            Constraint::Any(fs) => f.write_str(&fs.join("|")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let node = ["a100", "ib"];
        let cases = [
            ("a100", true),
            ("a100&ib", true),
            ("a100&nvlink", false),
            ("h100|a100", true),
            ("h100|v100", false),
        ];
        for (expr, want) in cases {
            let c = Constraint::parse(expr).unwrap();
            assert_eq!(c.matches(&node), want, "{expr}");
            assert_eq!(Constraint::parse(&c.to_string()).unwrap(), c);
        }
        for bad in ["", "a&b|c", "[a|b]", "a*2", "a&&b", "a b"] {
            assert!(Constraint::parse(bad).is_err(), "{bad}");
        }
    }
}
