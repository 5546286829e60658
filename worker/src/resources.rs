//! The node's resources: what the flags declare, else what the machine has.

/// CPUs this process may use (affinity and cgroup quotas respected), at least 1.
pub fn machine_cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

/// Total memory in MiB from `/proc/meminfo`, if readable.
pub fn machine_mem_mb() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_meminfo(&t))
}

/// `MemTotal:  16318460 kB` -> MiB.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") | None => Some(value / 1024),
        Some(_) => None,
    }
}

/// A memory size in Slurm's units: a number with an optional `K`, `M` (default), `G` or `T`
/// suffix (case-insensitive, an optional trailing `B`), in MiB.
pub fn parse_mem_mb(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (examples: 4096, 64G, 1T)"))?;
    let mb = match unit.to_ascii_uppercase().as_str() {
        "K" => Some(value / 1024),
        "" | "M" => Some(value),
        "G" => value.checked_mul(1024),
        "T" => value.checked_mul(1024 * 1024),
        _ => return Err(format!("{text:?} has an unknown unit (use K, M, G or T)")),
    };
    match mb {
        Some(0) => Err(format!("{text:?} is less than 1 MiB")),
        Some(mb) => Ok(mb),
        None => Err(format!("{text:?} is too large")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_in_slurm_units() {
        let ok = [
            ("4096", 4096),
            ("64G", 65_536),
            ("64g", 65_536),
            ("64GB", 65_536),
            ("512M", 512),
            ("1T", 1_048_576),
            ("2048K", 2),
        ];
        for (text, want) in ok {
            assert_eq!(parse_mem_mb(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "G",
            "-1G",
            "1.5G",
            "64X",
            "0",
            "100K",
            "99999999999999999T",
        ] {
            assert!(parse_mem_mb(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn meminfo_total_in_mib() {
        let text = "MemTotal:       16318460 kB\nMemFree:         1234 kB\n";
        assert_eq!(parse_meminfo(text), Some(15_935));
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn this_machine_has_cpus_and_memory() {
        assert!(machine_cpus() >= 1);
        assert!(machine_mem_mb().is_some_and(|m| m > 0));
    }
}
