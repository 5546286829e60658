//! Slurm's time vocabulary: durations (`--time`, `TimeLimit=`), begin times (`--begin`) and
//! the way squeue and sacct print them.
//!
//! Dates and times of day are computed in a fixed UTC offset given by the caller (`0` = UTC):
//! the core has no clock and no time-zone database, the CLI knows the user's offset.

use thiserror::Error;

/// What was wrong with a time string. The message names the input and the problem.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid time {input:?}: {problem}")]
pub struct TimeError {
    pub input: String,
    pub problem: String,
}

fn terr(input: &str, problem: impl Into<String>) -> TimeError {
    TimeError {
        input: crate::quote::clipped(input),
        problem: problem.into(),
    }
}

/// Largest duration accepted: 100 years. Anything longer is a typo, and the cap keeps every
/// `now + limit` computation far from `i64` overflow.
pub const MAX_DURATION_S: u64 = 100 * 365 * 86_400;

/// Parses a Slurm duration as `--time` takes it, in seconds. `None` means no limit.
///
/// Forms: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`, and `UNLIMITED`,
/// `INFINITE` (any case). As in Slurm, `0` requests no time limit. Field values are not
/// range-checked (`90` and `0:90` are both accepted, as Slurm does); negative or non-numeric
/// fields are errors.
pub fn parse_duration(s: &str) -> Result<Option<u64>, TimeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(terr(s, "empty"));
    }
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    if t.starts_with('-') {
        return Err(terr(s, "must not be negative"));
    }
    let num = |f: &str| -> Result<u64, TimeError> {
        if f.is_empty() {
            return Err(terr(s, "empty field"));
        }
        if !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err(terr(
                s,
                "expected digits in MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
            ));
        }
        f.parse::<u64>().map_err(|_| terr(s, "number too large"))
    };
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, t),
    };
    let fields: Vec<&str> = rest.split(':').collect();
    if fields.len() > 3 {
        return Err(terr(s, "too many ':' fields"));
    }
    let v: Vec<u64> = fields.iter().map(|f| num(f)).collect::<Result<_, _>>()?;
    // (days, hours, minutes, seconds)
    let (d, h, m, sec) = match (days, v.as_slice()) {
        (None, [m]) => (0, 0, *m, 0),
        (None, [m, s]) => (0, 0, *m, *s),
        (None, [h, m, s]) => (0, *h, *m, *s),
        (Some(d), [h]) => (d, *h, 0, 0),
        (Some(d), [h, m]) => (d, *h, *m, 0),
        (Some(d), [h, m, s]) => (d, *h, *m, *s),
        _ => return Err(terr(s, "malformed")),
    };
    let total = d
        .checked_mul(86_400)
        .and_then(|x| x.checked_add(h.checked_mul(3600)?))
        .and_then(|x| x.checked_add(m.checked_mul(60)?))
        .and_then(|x| x.checked_add(sec))
        .ok_or_else(|| terr(s, "too large"))?;
    if total > MAX_DURATION_S {
        return Err(terr(s, "too large (more than 100 years)"));
    }
    Ok(if total == 0 { None } else { Some(total) })
}

/// Formats a duration as squeue prints TIME and TIME_LIMIT: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`;
/// `None` prints `UNLIMITED`.
pub fn format_duration(secs: Option<u64>) -> String {
    let Some(secs) = secs else {
        return "UNLIMITED".to_string();
    };
    let (d, h, m, s) = split(secs);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// Formats a duration as sacct prints Elapsed: `HH:MM:SS` or `D-HH:MM:SS`.
pub fn format_elapsed(secs: u64) -> String {
    let (d, h, m, s) = split(secs);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

fn split(secs: u64) -> (u64, u64, u64, u64) {
    (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    )
}

// === calendar (proleptic Gregorian, Howard Hinnant's days-from-civil) ===

/// Days since 1970-01-01 of a civil date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Civil date `(year, month, day)` of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// Formats unix seconds as Slurm prints timestamps (`2026-12-01T10:00:00`) in the given UTC
/// offset. Slurm prints `Unknown` for unset times; callers decide when a time is unset.
pub fn format_timestamp(t: i64, utc_offset_s: i32) -> String {
    let local = t + i64::from(utc_offset_s);
    let (y, mo, d) = civil_from_days(local.div_euclid(86_400));
    let sod = local.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Parses `--begin` in UTC. See [`parse_begin_with_offset`].
pub fn parse_begin(s: &str, now: i64) -> Result<i64, TimeError> {
    parse_begin_with_offset(s, now, 0)
}

/// Parses a Slurm `--begin` time into unix seconds. Supported forms:
///
/// - `now`, `now+N[unit]` with units `s`/`sec`/`seconds` (the default), `m`/`min`/`minutes`,
///   `h`/`hour`/`hours`, `d`/`day`/`days`, `w`/`week`/`weeks`;
/// - `HH:MM[:SS]` with optional `AM`/`PM`: that time today, or tomorrow if it has passed;
/// - `YYYY-MM-DD[THH:MM[:SS]]`;
/// - `MMDD[YY]`, `MM/DD[/YY]`, `MM.DD[.YY]`: that date (this year, or next year if passed);
/// - `midnight`, `noon`, `elevenses` (11:00), `fika` (15:00), `teatime` (16:00): the next
///   such time; `today`, `tomorrow`: midnight starting that day;
/// - a bare number of seconds since the epoch is *not* accepted (Slurm reads it as MMDD).
///
/// Date/time forms are interpreted at `utc_offset_s` from UTC.
pub fn parse_begin_with_offset(s: &str, now: i64, utc_offset_s: i32) -> Result<i64, TimeError> {
    parse_time(s, now, utc_offset_s, Toward::Future)
}

/// Parses a time for sacct's `--starttime`/`--endtime` (Slurm's `parse_time(.., past)`):
/// the same forms as [`parse_begin_with_offset`], but a time of day or a date without a
/// year is never moved on to tomorrow or next year (`12/03` on December 4 is this year's,
/// `midnight` the one that began today, `noon` before noon today's, which sacct then
/// refuses as a start after its end).
pub fn parse_past_with_offset(s: &str, now: i64, utc_offset_s: i32) -> Result<i64, TimeError> {
    parse_time(s, now, utc_offset_s, Toward::Past)
}

/// Which occurrence a time of day or a yearless date names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Toward {
    Future,
    Past,
}

fn parse_time(s: &str, now: i64, utc_offset_s: i32, toward: Toward) -> Result<i64, TimeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(terr(s, "empty"));
    }
    let lower = t.to_ascii_lowercase();
    let off = i64::from(utc_offset_s);
    let local_now = now + off;
    let today0 = local_now.div_euclid(86_400) * 86_400; // local midnight, in local seconds
    let next_at = |sod: i64| -> i64 {
        let cand = today0 + sod;
        (if toward == Toward::Future && cand <= local_now {
            cand + 86_400
        } else {
            cand
        }) - off
    };
    if let Some(rest) = lower.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now);
        }
        let rest = rest
            .strip_prefix('+')
            .ok_or_else(|| terr(s, "expected now+COUNT[unit]"))?;
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, unit) = rest.split_at(split);
        if digits.is_empty() {
            return Err(terr(s, "expected a count after now+"));
        }
        let n: i64 = digits.parse().map_err(|_| terr(s, "count too large"))?;
        let mult = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => {
                return Err(terr(
                    s,
                    "unknown unit (seconds, minutes, hours, days, weeks)",
                ));
            }
        };
        let delta = n
            .checked_mul(mult)
            .filter(|d| *d as u64 <= MAX_DURATION_S)
            .ok_or_else(|| terr(s, "too far in the future"))?;
        return Ok(now + delta);
    }
    match lower.as_str() {
        "midnight" => return Ok(next_at(0)),
        "noon" => return Ok(next_at(12 * 3600)),
        "elevenses" => return Ok(next_at(11 * 3600)),
        "fika" => return Ok(next_at(15 * 3600)),
        "teatime" => return Ok(next_at(16 * 3600)),
        "today" => return Ok(today0 - off),
        "tomorrow" => return Ok(today0 + 86_400 - off),
        _ => {}
    }
    if t.starts_with('-') {
        return Err(terr(s, "must not be negative"));
    }
    let (y_now, _, _) = civil_from_days(local_now.div_euclid(86_400));
    // YYYY-MM-DD[THH:MM[:SS]]
    if t.len() >= 10 && t.as_bytes().get(4) == Some(&b'-') {
        let (date, time) = match t.split_once(['T', 't']) {
            Some((d, tm)) => (d, Some(tm)),
            None => (t, None),
        };
        let parts: Vec<&str> = date.split('-').collect();
        let [y, mo, d] = parts.as_slice() else {
            return Err(terr(s, "expected YYYY-MM-DD[THH:MM[:SS]]"));
        };
        let y: i64 = parse_field(s, y, 1970, 9999)?.into();
        let mo = parse_field(s, mo, 1, 12)?;
        let d = parse_field(s, d, 1, days_in_month(y, mo))?;
        let sod = match time {
            Some(tm) => parse_clock(s, tm)?,
            None => 0,
        };
        return Ok(days_from_civil(y, mo, d) * 86_400 + sod - off);
    }
    // HH:MM[:SS][AM|PM]
    if t.contains(':') {
        let sod = parse_clock(s, t)?;
        return Ok(next_at(sod));
    }
    // MM/DD[/YY], MM.DD[.YY], MMDD[YY]
    let parts: Vec<&str> = if t.contains('/') {
        t.split('/').collect()
    } else if t.contains('.') {
        t.split('.').collect()
    } else if t.bytes().all(|b| b.is_ascii_digit()) && (t.len() == 4 || t.len() == 6) {
        vec![&t[0..2], &t[2..4], &t[4..]]
            .into_iter()
            .filter(|p| !p.is_empty())
            .collect()
    } else {
        return Err(terr(
            s,
            "unrecognised begin time (try now+1hour, 16:00, 2026-12-01T10:00:00, tomorrow)",
        ));
    };
    let (mo, d, y) = match parts.as_slice() {
        [mo, d] => (*mo, *d, None),
        [mo, d, y] => (*mo, *d, Some(*y)),
        _ => return Err(terr(s, "expected MM/DD[/YY]")),
    };
    let mo = parse_field(s, mo, 1, 12)?;
    let explicit_year = match y {
        Some(y) => Some(2000 + i64::from(parse_field(s, y, 0, 99)?)),
        None => None,
    };
    let year = explicit_year.unwrap_or(y_now);
    let d = parse_field(s, d, 1, days_in_month(year, mo))?;
    let mut at = days_from_civil(year, mo, d) * 86_400;
    if explicit_year.is_none() && toward == Toward::Future && at < today0 {
        let d2 = d.min(days_in_month(year + 1, mo));
        at = days_from_civil(year + 1, mo, d2) * 86_400;
    }
    Ok(at - off)
}

fn parse_field(input: &str, f: &str, min: u32, max: u32) -> Result<u32, TimeError> {
    if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) || f.len() > 4 {
        return Err(terr(input, format!("expected a number, got {f:?}")));
    }
    let v: u32 = f.parse().map_err(|_| terr(input, "number too large"))?;
    if v < min || v > max {
        return Err(terr(input, format!("{v} out of range {min}..={max}")));
    }
    Ok(v)
}

/// `HH:MM[:SS]` with an optional `AM`/`PM` suffix, as seconds since midnight.
fn parse_clock(input: &str, t: &str) -> Result<i64, TimeError> {
    let lower = t.trim().to_ascii_lowercase();
    let (clock, ampm) = if let Some(c) = lower.strip_suffix("am") {
        (c.trim_end(), Some(false))
    } else if let Some(c) = lower.strip_suffix("pm") {
        (c.trim_end(), Some(true))
    } else {
        (lower.as_str(), None)
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (h, m, sec) = match parts.as_slice() {
        [h, m] => (*h, *m, "0"),
        [h, m, s] => (*h, *m, *s),
        _ => return Err(terr(input, "expected HH:MM[:SS]")),
    };
    let mut h = parse_field(input, h, 0, 23)?;
    let m = parse_field(input, m, 0, 59)?;
    let sec = parse_field(input, sec, 0, 59)?;
    if let Some(pm) = ampm {
        if !(1..=12).contains(&h) {
            return Err(terr(input, "hour must be 1..12 with AM/PM"));
        }
        h = match (h, pm) {
            (12, false) => 0,
            (12, true) => 12,
            (h, true) => h + 12,
            (h, false) => h,
        };
    }
    Ok(i64::from(h) * 3600 + i64::from(m) * 60 + i64::from(sec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `--begin`'s times of day and yearless dates move on to the next such time; sacct's
    /// stay where they fall (Slurm's `parse_time(.., past)`).
    #[test]
    fn past_times_stay_where_begin_times_roll_forward() {
        // 2026-12-04T06:00:00Z
        let now = 1_796_364_000;
        let day = 86_400;
        let today0 = now - 6 * 3600;
        let past = |s: &str| parse_past_with_offset(s, now, 0);
        let begin = |s: &str| parse_begin_with_offset(s, now, 0);
        assert_eq!(past("midnight"), Ok(today0));
        assert_eq!(begin("midnight"), Ok(today0 + day));
        assert_eq!(past("noon"), Ok(today0 + 12 * 3600));
        assert_eq!(past("05:00"), Ok(today0 + 5 * 3600));
        assert_eq!(begin("05:00"), Ok(today0 + day + 5 * 3600));
        assert_eq!(past("12/03"), Ok(today0 - day));
        assert_eq!(begin("12/03"), Ok(today0 + 364 * day));
    }

    #[test]
    fn durations_parse_every_slurm_form() {
        let cases: &[(&str, Option<u64>)] = &[
            ("10", Some(600)),
            ("10:30", Some(630)),
            ("1:00:00", Some(3600)),
            ("2-0", Some(2 * 86_400)),
            ("1-12", Some(86_400 + 12 * 3600)),
            ("1-12:30", Some(86_400 + 12 * 3600 + 1800)),
            ("1-12:30:15", Some(86_400 + 12 * 3600 + 1800 + 15)),
            ("0:90", Some(90)),
            ("UNLIMITED", None),
            ("infinite", None),
            ("0", None),
            ("0:00:00", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input), Ok(*want), "{input}");
        }
    }

    #[test]
    fn bad_durations_name_the_problem() {
        let cases = [
            ("-5", "negative"),
            ("abc", "expected digits"),
            ("1:2:3:4", "too many"),
            ("1-", "empty field"),
            ("", "empty"),
            ("1:-5", "expected digits"),
            ("99999999999999999999", "too large"),
            ("1-2:3:4:5", "too many"),
        ];
        for (input, want) in cases {
            let e = parse_duration(input).unwrap_err();
            assert!(e.to_string().contains(want), "{input}: {e}");
        }
    }

    #[test]
    fn durations_print_as_squeue_and_sacct() {
        assert_eq!(format_duration(Some(5)), "0:05");
        assert_eq!(format_duration(Some(3599)), "59:59");
        assert_eq!(format_duration(Some(3600)), "1:00:00");
        assert_eq!(format_duration(Some(90_061)), "1-01:01:01");
        assert_eq!(format_duration(None), "UNLIMITED");
        assert_eq!(format_elapsed(5), "00:00:05");
        assert_eq!(format_elapsed(90_061), "1-01:01:01");
    }

    // 2026-11-30T04:00:00Z
    const NOW: i64 = 1_796_011_200;

    #[test]
    fn civil_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(format_timestamp(NOW, 0), "2026-11-30T04:00:00");
        for z in [-1000, 0, 59, 60, 365, 10_000, 20_000, 100_000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }

    #[test]
    fn begin_times() {
        let day = 86_400;
        let midnight = NOW - 4 * 3600;
        let cases: &[(&str, i64)] = &[
            ("now", NOW),
            ("now+60", NOW + 60),
            ("now+1hour", NOW + 3600),
            ("now+2days", NOW + 2 * day),
            ("now+10minutes", NOW + 600),
            ("16:00", midnight + 16 * 3600),
            ("03:00", midnight + day + 3 * 3600),
            ("4:30pm", midnight + 16 * 3600 + 1800),
            ("2026-12-01T10:00:00", midnight + day + 10 * 3600),
            ("2026-12-01", midnight + day),
            ("midnight", midnight + day),
            ("noon", midnight + 12 * 3600),
            ("teatime", midnight + 16 * 3600),
            ("today", midnight),
            ("tomorrow", midnight + day),
            ("12/25", days_from_civil(2026, 12, 25) * day),
            ("0101", days_from_civil(2027, 1, 1) * day),
            ("12.01.27", days_from_civil(2027, 12, 1) * day),
        ];
        for (input, want) in cases {
            assert_eq!(parse_begin(input, NOW), Ok(*want), "{input}");
        }
        // A UTC offset of +2h: 16:00 local is 14:00 UTC.
        assert_eq!(
            parse_begin_with_offset("16:00", NOW, 7200),
            Ok(midnight + 14 * 3600)
        );
    }

    #[test]
    fn bad_begin_times() {
        for bad in [
            "",
            "now-5",
            "now+",
            "now+5fortnights",
            "25:00",
            "2026-13-01",
            "2026-02-30",
            "-1",
            "garbage",
            "13/01",
            "x:y",
        ] {
            assert!(parse_begin(bad, NOW).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn duration_round_trips(secs in 1u64..=MAX_DURATION_S) {
            let printed = format_duration(Some(secs));
            prop_assert_eq!(parse_duration(&printed), Ok(Some(secs)), "{}", printed);
            prop_assert_eq!(parse_duration(&format_elapsed(secs)), Ok(Some(secs)));
        }

        #[test]
        fn duration_parser_never_panics(s in ".{0,40}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn duration_parser_never_panics_on_near_misses(s in "[0-9:\\-]{0,20}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn begin_parser_never_panics(s in ".{0,40}", now in 0i64..4_000_000_000, off in -50_000i32..50_000) {
            let _ = parse_begin_with_offset(&s, now, off);
        }

        #[test]
        fn begin_parser_never_panics_on_near_misses(s in "(now\\+)?[0-9:/.T\\-]{0,20}[a-z]{0,6}") {
            let _ = parse_begin(&s, NOW);
        }
    }
}
