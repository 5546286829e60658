//! Job references as users type them: `12`, `12_3`, `12_[3-5,7]`, and comma lists of those
//! (`squeue -j 12,13_[1-2]`). Pure.

use tandem_proto::v1::JobRef;

/// Parses one reference.
pub fn parse(s: &str) -> Result<JobRef, String> {
    let t = s.trim();
    let bad = || format!("Invalid job id specified: {t:?}");
    let (id, tasks) = match t.split_once('_') {
        None => (t, String::new()),
        Some((id, tasks)) => {
            let inner = match tasks.strip_prefix('[') {
                Some(rest) => rest.strip_suffix(']').ok_or_else(bad)?,
                None => tasks,
            };
            if inner.is_empty()
                || !inner
                    .chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '-' | ',' | ':' | '%'))
            {
                return Err(bad());
            }
            (id, inner.to_string())
        }
    };
    let job_id = id.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(bad)?;
    Ok(JobRef {
        job_id,
        array_tasks: tasks,
    })
}

/// Parses a comma list; commas inside `[...]` belong to the task list.
pub fn parse_list(s: &str) -> Result<Vec<JobRef>, String> {
    split_outside_brackets(s)
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .map(parse)
        .collect()
}

/// Splits on commas that are not inside brackets.
pub fn split_outside_brackets(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(job_id: u64, tasks: &str) -> JobRef {
        JobRef {
            job_id,
            array_tasks: tasks.to_string(),
        }
    }

    #[test]
    fn forms() {
        assert_eq!(parse("12"), Ok(r(12, "")));
        assert_eq!(parse("12_3"), Ok(r(12, "3")));
        assert_eq!(parse("12_[3-5]"), Ok(r(12, "3-5")));
        assert_eq!(
            parse_list("12,13_[1-2,7],14_0"),
            Ok(vec![r(12, ""), r(13, "1-2,7"), r(14, "0")])
        );
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in ["", "x", "0", "-1", "12_", "12_[", "12_[3-5", "12_a", "12.5"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
