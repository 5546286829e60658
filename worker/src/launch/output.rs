//! Slurm's filename patterns (`--output`, `--error`): `%j %A %a %x %u %N %n %t %s %%`.
//!
//! The controller expands everything it knows before a job reaches a worker and leaves `%N`
//! (and `%%`) alone; the worker expands `%N` for the batch script and `%n %t %s` for step
//! tasks. One expander serves both, and a field the caller does not know stays literal, so an
//! expansion done in two places never expands a `%` twice.

/// The values a pattern may refer to; `None` leaves that specifier untouched.
#[derive(Debug, Default, Clone)]
pub struct PatternFields<'a> {
    /// `%j`
    pub job_id: Option<u64>,
    /// `%A`
    pub array_job_id: Option<u64>,
    /// `%a`
    pub array_task_id: Option<u64>,
    /// `%x`
    pub job_name: Option<&'a str>,
    /// `%u`
    pub user: Option<&'a str>,
    /// `%N`
    pub node_name: Option<&'a str>,
    /// `%n`: node index within the job or step.
    pub node_index: Option<u64>,
    /// `%t`: task rank.
    pub task_id: Option<u64>,
    /// `%s`: step id.
    pub step_id: Option<u64>,
}

/// Slurm ignores padding wider than this.
const MAX_PAD: usize = 10;

/// Expands `pattern`. A number between `%` and a numeric specifier zero-pads it (`%5j` ->
/// `00042`), as in Slurm; padding is ignored for text fields.
pub fn expand(pattern: &str, f: &PatternFields<'_>) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut rest = pattern;
    while let Some(pos) = rest.find('%') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let Some(spec) = after[digits..].chars().next() else {
            // A trailing '%' (or '%5') is kept as written.
            out.push_str(&rest[pos..]);
            return out;
        };
        let width: usize = after[..digits].parse().unwrap_or(0).min(MAX_PAD);
        let consumed = 1 + digits + spec.len_utf8();
        let number = |v: Option<u64>| v.map(|n| format!("{n:0width$}"));
        let text = |v: Option<&str>| v.map(str::to_owned);
        let value = match spec {
            '%' if digits == 0 => Some("%".to_owned()),
            'j' => number(f.job_id),
            'A' => number(f.array_job_id),
            'a' => number(f.array_task_id),
            'n' => number(f.node_index),
            't' => number(f.task_id),
            's' => number(f.step_id),
            'x' => text(f.job_name),
            'u' => text(f.user),
            'N' => text(f.node_name),
            _ => None,
        };
        match value {
            Some(v) => out.push_str(&v),
            None => out.push_str(&rest[pos..pos + consumed]),
        }
        rest = &rest[pos + consumed..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> PatternFields<'static> {
        PatternFields {
            job_id: Some(42),
            array_job_id: Some(40),
            array_task_id: Some(2),
            job_name: Some("train"),
            user: Some("alice"),
            node_name: Some("gpu-01"),
            node_index: Some(1),
            task_id: Some(3),
            step_id: Some(0),
        }
    }

    #[test]
    fn expands_every_specifier() {
        let cases = [
            ("slurm-%j.out", "slurm-42.out"),
            ("%x_%A_%a.log", "train_40_2.log"),
            ("/home/%u/%N/%j", "/home/alice/gpu-01/42"),
            ("step%s-node%n-task%t", "step0-node1-task3"),
            ("100%%", "100%"),
            ("%%j", "%j"),
        ];
        for (pattern, want) in cases {
            assert_eq!(expand(pattern, &all()), want, "pattern {pattern:?}");
        }
    }

    #[test]
    fn worker_side_expansion_leaves_controller_fields_alone() {
        let node_only = PatternFields {
            node_name: Some("n3"),
            ..Default::default()
        };
        assert_eq!(expand("%x-%N-%j.out", &node_only), "%x-n3-%j.out");
    }

    #[test]
    fn zero_padding_applies_to_numbers_only() {
        assert_eq!(expand("%5j", &all()), "00042");
        assert_eq!(expand("%3N", &all()), "gpu-01");
        assert_eq!(expand("%99j", &all()), format!("{:010}", 42));
    }

    #[test]
    fn odd_patterns_are_kept_literally() {
        assert_eq!(expand("a%", &all()), "a%");
        assert_eq!(expand("a%5", &all()), "a%5");
        assert_eq!(expand("%q%é", &all()), "%q%é");
        assert_eq!(expand("", &all()), "");
        assert_eq!(expand("no specifiers", &all()), "no specifiers");
    }
}
