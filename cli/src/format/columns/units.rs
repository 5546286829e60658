//! sacct's notation for times and sizes (Slurm's `mins2time_str`, `_elapsed_time` and
//! size units), apart from the field table that uses it.

/// sacct's Timelimit (Slurm's `mins2time_str`): `D-HH:MM:SS` past a day, else `HH:MM:SS`
/// (squeue writes `5:00` where sacct writes `00:05:00`).
pub(super) fn minutes_as_time(m: u64) -> String {
    tandem_sched::time::format_elapsed(m.saturating_mul(60))
}

/// sacct's CPU times (Slurm's `_elapsed_time`): `D-HH:MM:SS` past a day, `HH:MM:SS` past
/// an hour, else `MM:SS.mmm`, or `00:MM:SS` without milliseconds.
pub(super) fn cpu_time(usec: u64) -> String {
    let secs = usec / 1_000_000;
    let ms = usec % 1_000_000 / 1000;
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h:02}:{m:02}:{s:02}")
    } else if ms > 0 {
        format!("{m:02}:{s:02}.{ms:03}")
    } else {
        format!("00:{m:02}:{s:02}")
    }
}

/// `kib` in `unit` as `sacct --units` prints it: whole when it divides, else two decimals
/// (Slurm 22.05, a 1 MiB ReqMem: `1024K`, `1M`, `0.00G`).
pub fn kib_in_unit(kib: u64, unit: char) -> String {
    let shift = match unit {
        'K' => 0,
        'M' => 1,
        'G' => 2,
        'T' => 3,
        _ => 4,
    };
    let div = 1u64 << (10 * shift);
    if kib.is_multiple_of(div) {
        format!("{}{unit}", kib / div)
    } else {
        format!("{:.2}{unit}", kib as f64 / div as f64)
    }
}

/// A size in KiB as sacct prints it: a larger unit only where it divides exactly
/// (`2236K`, `2048K` -> `2M`).
pub(super) fn kib_with_unit(kib: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    let (mut n, mut i) = (kib, 0);
    while n > 0 && n % 1024 == 0 && i + 1 < UNITS.len() {
        n /= 1024;
        i += 1;
    }
    format!("{n}{}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slurm 22.05's sacct: `00:00:00` for no CPU, `00:01.234`, `01:02:03`; MaxRSS `2236K`,
    /// `2M` for 2048K.
    #[test]
    fn cpu_times_and_sizes_read_as_sacct_prints_them() {
        assert_eq!(cpu_time(0), "00:00:00");
        assert_eq!(cpu_time(1_234_000), "00:01.234");
        assert_eq!(cpu_time(61_000_000), "00:01:01");
        assert_eq!(cpu_time(3_723_000_000), "01:02:03");
        assert_eq!(cpu_time(90_000_000_000), "1-01:00:00");
        assert_eq!(kib_with_unit(2236), "2236K");
        assert_eq!(kib_with_unit(2048), "2M");
        assert_eq!(kib_with_unit(3 * 1024 * 1024), "3G");
        assert_eq!(kib_with_unit(0), "0K");
    }

    /// Slurm 22.05, `sacct --units=K|M|G -o ReqMem` of a job with 1 MiB: `1024K`, `1M`,
    /// `0.00G`.
    #[test]
    fn sizes_in_a_unit_as_sacct_units_prints_them() {
        assert_eq!(kib_in_unit(1024, 'K'), "1024K");
        assert_eq!(kib_in_unit(1024, 'M'), "1M");
        assert_eq!(kib_in_unit(1024, 'G'), "0.00G");
        assert_eq!(kib_in_unit(1536, 'M'), "1.50M");
        assert_eq!(kib_in_unit(3 << 30, 'T'), "3T");
        assert_eq!(kib_in_unit(0, 'P'), "0P");
    }
}
