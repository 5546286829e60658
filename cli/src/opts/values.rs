//! The value parsers clap calls for the job options (`--time`, `-N`, `--mem`, `--gpus`,
//! `--gres`, `--export`, `--signal`, ...): each turns one value into its typed form, and each
//! error is one line naming the value.

use super::{Export, GpuReq, NodeRange, OpenMode, TimeLimit, WarnSignal};

pub(super) fn parse_time_limit(s: &str) -> Result<TimeLimit, String> {
    tandem_sched::time::parse_duration(s)
        .map(TimeLimit)
        .map_err(|e| e.to_string())
}

pub(super) fn parse_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("expected a positive whole number, got {s:?}")),
        Ok(n) => Ok(n),
    }
}

pub(super) fn parse_nodes(s: &str) -> Result<NodeRange, String> {
    let (min, max) = match s.split_once('-') {
        Some((a, b)) => (parse_count(a)?, parse_count(b)?),
        None => {
            let n = parse_count(s)?;
            (n, n)
        }
    };
    if min > max {
        return Err(format!(
            "node range {s:?} has its minimum above its maximum"
        ));
    }
    Ok(NodeRange { min, max })
}

pub(super) fn parse_mem(s: &str) -> Result<u64, String> {
    tandem_sched::tres::parse_mem_mb(s).map_err(|e| e.to_string())
}

/// `N` or `TYPE:N`.
pub(super) fn parse_gpus(s: &str) -> Result<GpuReq, String> {
    let (ty, n) = match s.rsplit_once(':') {
        Some((t, n)) => (Some(t), n),
        None => (None, s),
    };
    if let Some(t) = ty
        && (t.is_empty() || t.contains(':'))
    {
        return Err(format!("invalid GPU request {s:?}: expected [TYPE:]N"));
    }
    let count = n
        .parse::<u32>()
        .map_err(|_| format!("invalid GPU request {s:?}: expected [TYPE:]N"))?;
    Ok(GpuReq {
        gpu_type: ty.map(str::to_string),
        count,
    })
}

/// `gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N`; a comma list may only name gpu once.
pub(super) fn parse_gres(s: &str) -> Result<GpuReq, String> {
    let mut found = None;
    for item in s.split(',') {
        let mut parts = item.split(':');
        let name = parts.next().unwrap_or_default();
        if name != "gpu" {
            return Err(format!(
                "unsupported generic resource {name:?} in --gres={s}: only gpu is available"
            ));
        }
        let rest: Vec<&str> = parts.collect();
        let bad = || format!("invalid --gres={s}: expected gpu[:TYPE][:N]");
        let req = match rest.as_slice() {
            [] => GpuReq {
                gpu_type: None,
                count: 1,
            },
            [one] => match one.parse::<u32>() {
                Ok(n) => GpuReq {
                    gpu_type: None,
                    count: n,
                },
                Err(_) if !one.is_empty() => GpuReq {
                    gpu_type: Some((*one).to_string()),
                    count: 1,
                },
                Err(_) => return Err(bad()),
            },
            [ty, n] if !ty.is_empty() => GpuReq {
                gpu_type: Some((*ty).to_string()),
                count: n.parse().map_err(|_| bad())?,
            },
            _ => return Err(bad()),
        };
        if found.replace(req).is_some() {
            return Err(format!("--gres={s} names gpu twice"));
        }
    }
    found.ok_or_else(|| format!("invalid --gres={s:?}"))
}

pub(crate) fn parse_export(s: &str) -> Result<Export, String> {
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    if items.len() == 1 && items[0].eq_ignore_ascii_case("NONE") {
        return Ok(Export::None);
    }
    let mut all = false;
    let mut list = Vec::new();
    for item in items {
        if item.eq_ignore_ascii_case("ALL") {
            all = true;
            continue;
        }
        if item.eq_ignore_ascii_case("NONE") {
            return Err(format!(
                "invalid --export={s}: NONE cannot be combined with variables"
            ));
        }
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (item, None),
        };
        let valid = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid --export={s}: {k:?} is not a variable name"
            ));
        }
        list.push((k.to_string(), v));
    }
    Ok(if all {
        Export::All(list)
    } else {
        Export::Only(list)
    })
}

pub(super) fn parse_nice(s: &str) -> Result<u32, String> {
    s.parse::<u32>().map_err(|_| {
        format!("invalid --nice={s}: expected a non-negative number (raising priority is an operator's job)")
    })
}

/// Slurm's default lead time for `--signal` without `@TIME`.
const DEFAULT_WARN_BEFORE_S: u32 = 60;

/// `[{R|B}:]SIG[@TIME]`. `R:` (may overlap a reservation's start delay) is accepted and has
/// no effect here: Tandem has no reservations of that kind.
pub(super) fn parse_warn_signal(s: &str) -> Result<WarnSignal, String> {
    let bad = |why: &str| format!("invalid --signal={s}: {why}");
    let (flags, rest) = match s.split_once(':') {
        Some((f, r)) => (Some(f), r),
        None => (None, s),
    };
    let mut batch_only = false;
    if let Some(flags) = flags {
        let mut seen_r = false;
        if flags.is_empty() {
            return Err(bad("expected R: or B: before the signal"));
        }
        for c in flags.chars() {
            match c.to_ascii_uppercase() {
                'B' if !batch_only => batch_only = true,
                'R' if !seen_r => seen_r = true,
                _ => return Err(bad("expected R: or B: before the signal")),
            }
        }
    }
    let (sig, time) = match rest.split_once('@') {
        Some((a, b)) => (a, Some(b)),
        None => (rest, None),
    };
    let number = crate::cmd::scancel::parse_signal(sig).map_err(|e| bad(&e.to_string()))?;
    let before_s = match time {
        None => DEFAULT_WARN_BEFORE_S,
        Some(t) => t
            .parse::<u16>()
            .map(u32::from)
            .map_err(|_| bad("the time must be a whole number of seconds from 0 to 65535"))?,
    };
    Ok(WarnSignal {
        number,
        before_s,
        batch_only,
    })
}

/// `append`/`truncate`, or their first letters.
pub(super) fn parse_open_mode(s: &str) -> Result<OpenMode, String> {
    match s.to_ascii_lowercase().as_str() {
        "a" | "append" => Ok(OpenMode::Append),
        "t" | "truncate" => Ok(OpenMode::Truncate),
        _ => Err(format!(
            "invalid --open-mode={s}: expected append or truncate"
        )),
    }
}

pub(super) fn parse_hostlist(s: &str) -> Result<String, String> {
    tandem_sched::hostlist::expand(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Array specs and dependencies are checked with the scheduling core's parsers so a typo
/// fails before anything is sent; the controller parses them again and trusts nothing.
pub(super) fn parse_array(s: &str) -> Result<String, String> {
    tandem_sched::array::ArraySpec::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}

pub(super) fn parse_dependency(s: &str) -> Result<String, String> {
    tandem_sched::dependency::Dependency::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}
