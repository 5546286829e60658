//! The node's resources: what the flags declare, else what the machine has. A declared
//! `--mem` is parsed by `tandem_sched::tres::parse_mem_mb`, as sbatch's `--mem` is.

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

#[cfg(test)]
mod tests {
    use super::*;

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
