//! Slurm host lists: `gpu-[01-04,07],cpu-1` <-> `[gpu-01, gpu-02, gpu-03, gpu-04, gpu-07, cpu-1]`.
//!
//! Zero padding is kept: a range takes the width of its lower bound as written (`[01-10]`
//! is `01..10`, `[1-10]` is `1..10`). Several bracket groups in one name expand as a
//! cartesian product (`r[1-2]n[1-2]`). Expansion is capped at [`MAX_HOSTS`] names so hostile
//! input cannot exhaust memory.

use thiserror::Error;

/// Most names one expression may expand to.
pub const MAX_HOSTS: usize = 100_000;

/// Why a host-list expression was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid host list {input:?}: {problem}")]
pub struct HostlistError {
    pub input: String,
    pub problem: String,
}

fn herr(input: &str, problem: impl Into<String>) -> HostlistError {
    HostlistError {
        input: crate::quote::clipped(input),
        problem: problem.into(),
    }
}

/// The first name of a host-list expression (a job's batch host), expanding only the first
/// item; `None` for an empty or malformed one.
pub fn first(expr: &str) -> Option<String> {
    let item = split_top(expr).ok()?.into_iter().find(|i| !i.is_empty())?;
    let mut names = Vec::new();
    expand_item(expr, item, &mut names).ok()?;
    names.into_iter().next()
}

/// Expands a host-list expression into names, in the order written. Empty input gives an
/// empty list; duplicates are kept (callers that need a set dedupe).
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    for item in split_top(expr).map_err(|p| herr(expr, p))? {
        if item.is_empty() {
            continue;
        }
        expand_item(expr, item, &mut out)?;
    }
    Ok(out)
}

/// Splits on commas outside brackets; also checks bracket balance.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err("nested '['".into());
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err("unbalanced ']'".into());
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                items.push(expr[start..i].trim());
                start = i + c.len_utf8();
            }
            c if c.is_whitespace() && depth == 0 && !expr[start..i].trim().is_empty() => {
                // Slurm also accepts spaces as separators.
                items.push(expr[start..i].trim());
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unclosed '['".into());
    }
    items.push(expr[start..].trim());
    Ok(items)
}

/// One numeric range inside brackets, with the zero-padding width of its lower bound.
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

fn parse_ranges(expr: &str, body: &str) -> Result<Vec<Range>, HostlistError> {
    let mut ranges = Vec::new();
    for part in body.split(',') {
        let part = part.trim();
        let (lo_s, hi_s) = part.split_once('-').unwrap_or((part, part));
        let num = |s: &str| -> Result<u64, HostlistError> {
            if s.is_empty() || s.len() > 18 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(herr(
                    expr,
                    format!("bad range {part:?} (expected N or N-M)"),
                ));
            }
            s.parse()
                .map_err(|_| herr(expr, format!("bad number in {part:?}")))
        };
        let (lo, hi) = (num(lo_s)?, num(hi_s)?);
        if hi < lo {
            return Err(herr(expr, format!("range {part:?} is backwards")));
        }
        ranges.push(Range {
            lo,
            hi,
            width: lo_s.len(),
        });
    }
    Ok(ranges)
}

fn expand_item(expr: &str, item: &str, out: &mut Vec<String>) -> Result<(), HostlistError> {
    // Split the item into literal text and bracket groups.
    let mut prefixes: Vec<String> = vec![String::new()];
    let mut rest = item;
    while !rest.is_empty() {
        match rest.find('[') {
            None => {
                for p in &mut prefixes {
                    p.push_str(rest);
                }
                break;
            }
            Some(open) => {
                let lit = &rest[..open];
                let close = rest[open..]
                    .find(']')
                    .map(|c| c + open)
                    .ok_or_else(|| herr(expr, "unclosed '['"))?;
                let ranges = parse_ranges(expr, &rest[open + 1..close])?;
                let count: u64 = ranges
                    .iter()
                    .map(|r| r.hi - r.lo + 1)
                    .fold(0u64, |a, b| a.saturating_add(b));
                let total = (prefixes.len() as u64)
                    .saturating_mul(count)
                    .saturating_add(out.len() as u64);
                if total > MAX_HOSTS as u64 {
                    return Err(herr(
                        expr,
                        format!("expands to more than {MAX_HOSTS} names"),
                    ));
                }
                let mut next = Vec::with_capacity(prefixes.len() * count as usize);
                for p in &prefixes {
                    for r in &ranges {
                        for n in r.lo..=r.hi {
                            next.push(format!("{p}{lit}{n:0w$}", w = r.width));
                        }
                    }
                }
                prefixes = next;
                rest = &rest[close + 1..];
            }
        }
    }
    if out.len() + prefixes.len() > MAX_HOSTS {
        return Err(herr(
            expr,
            format!("expands to more than {MAX_HOSTS} names"),
        ));
    }
    out.extend(prefixes);
    Ok(())
}

/// A name split around its last run of digits.
struct Parts<'a> {
    prefix: &'a str,
    num: Option<(u64, &'a str)>,
    suffix: &'a str,
}

fn split_name(name: &str) -> Parts<'_> {
    let b = name.as_bytes();
    let Some(end) = b.iter().rposition(|c| c.is_ascii_digit()).map(|i| i + 1) else {
        return Parts {
            prefix: name,
            num: None,
            suffix: "",
        };
    };
    let start = b[..end]
        .iter()
        .rposition(|c| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let digits = &name[start..end];
    match digits.parse::<u64>() {
        Ok(n) if digits.len() <= 18 => Parts {
            prefix: &name[..start],
            num: Some((n, digits)),
            suffix: &name[end..],
        },
        _ => Parts {
            prefix: name,
            num: None,
            suffix: "",
        },
    }
}

/// Compresses names into Slurm's host-list form, sorted by prefix then number, without
/// duplicates: `["gpu-01","gpu-02","gpu-07"]` -> `gpu-[01-02,07]`.
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    let mut parts: Vec<Parts<'_>> = names.iter().map(|n| split_name(n.as_ref())).collect();
    parts.sort_by(|a, b| {
        (
            a.prefix,
            a.suffix,
            a.num.map(|n| n.0),
            a.num.map(|n| n.1.len()),
        )
            .cmp(&(
                b.prefix,
                b.suffix,
                b.num.map(|n| n.0),
                b.num.map(|n| n.1.len()),
            ))
    });
    parts.dedup_by(|a, b| {
        a.prefix == b.prefix && a.suffix == b.suffix && a.num.map(|n| n.1) == b.num.map(|n| n.1)
    });
    let mut out = String::new();
    let mut i = 0;
    while i < parts.len() {
        if !out.is_empty() {
            out.push(',');
        }
        let p = &parts[i];
        let Some((first, first_s)) = p.num else {
            out.push_str(p.prefix);
            i += 1;
            continue;
        };
        // Ranges for this prefix/suffix group.
        let mut ranges: Vec<(u64, u64, usize)> = vec![(first, first, first_s.len())];
        let mut j = i + 1;
        while j < parts.len() && parts[j].prefix == p.prefix && parts[j].suffix == p.suffix {
            let Some((n, s)) = parts[j].num else { break };
            let last = ranges.last_mut().expect("ranges starts non-empty");
            if n == last.1 + 1 && format!("{n:0w$}", w = last.2) == s {
                last.1 = n;
            } else {
                ranges.push((n, n, s.len()));
            }
            j += 1;
        }
        out.push_str(p.prefix);
        if ranges.len() == 1 && ranges[0].0 == ranges[0].1 {
            out.push_str(first_s);
        } else {
            out.push('[');
            for (k, (lo, hi, w)) in ranges.iter().enumerate() {
                if k > 0 {
                    out.push(',');
                }
                if lo == hi {
                    out.push_str(&format!("{lo:0w$}"));
                } else {
                    out.push_str(&format!("{lo:0w$}-{hi:0w$}"));
                }
            }
            out.push(']');
        }
        out.push_str(p.suffix);
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn first_is_the_first_name_written() {
        assert_eq!(first("node-[3-4],gpu-1").as_deref(), Some("node-3"));
        assert_eq!(first(",gpu-[07-09]").as_deref(), Some("gpu-07"));
        assert_eq!(first("n1").as_deref(), Some("n1"));
        assert_eq!(first(""), None);
        assert_eq!(first("node-[3-"), None);
    }

    #[test]
    fn expands_slurm_forms() {
        let cases: &[(&str, &[&str])] = &[
            (
                "gpu-[01-04,07],cpu-1",
                &["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07", "cpu-1"],
            ),
            ("node[8-11]", &["node8", "node9", "node10", "node11"]),
            ("n[001-002]x", &["n001x", "n002x"]),
            ("r[1-2]n[1-2]", &["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("a b", &["a", "b"]),
            ("", &[]),
            ("single", &["single"]),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input).unwrap(), v(want), "{input}");
        }
    }

    #[test]
    fn rejects_bad_and_hostile_input() {
        for bad in [
            "gpu-[01-",
            "gpu-]",
            "gpu-[a-b]",
            "gpu-[5-1]",
            "x[[1]]",
            "n[0-99999999]",
            "n[0-999]m[0-999]",
        ] {
            let e = expand(bad).unwrap_err();
            assert!(!e.problem.is_empty(), "{bad}");
        }
    }

    #[test]
    fn compresses_with_padding_kept() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"],
                "gpu-[01-04,07]",
            ),
            (&["node9", "node10", "node11"], "node[9-11]"),
            (&["node09", "node10"], "node[09-10]"),
            (&["n1", "n01"], "n[1,01]"),
            (&["b2", "a1", "b1"], "a1,b[1-2]"),
            (&["login"], "login"),
            (&["n3", "n3"], "n3"),
            (&["n1x", "n2x"], "n[1-2]x"),
        ];
        for (input, want) in cases {
            assert_eq!(compress(input), *want, "{input:?}");
        }
    }

    proptest! {
        #[test]
        fn compress_then_expand_round_trips(names in proptest::collection::vec("[a-c]{1,2}-?[0-9]{0,3}[a-b]?", 0..40)) {
            let compressed = compress(&names);
            let mut back = expand(&compressed).unwrap();
            let mut want = names.clone();
            want.sort();
            want.dedup();
            back.sort();
            prop_assert_eq!(back, want, "{}", compressed);
        }

        #[test]
        fn expand_never_panics(s in ".{0,60}") {
            let _ = expand(&s);
        }

        #[test]
        fn expand_never_panics_on_near_misses(s in "[a-z0-9\\[\\],\\- ]{0,40}") {
            let _ = expand(&s);
        }
    }
}
