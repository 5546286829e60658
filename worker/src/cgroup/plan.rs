//! What limits a job gets: pure rules, no file system.
//!
//! - Memory: the job's memory on this node (`--mem`, or `--mem-per-cpu` times its CPUs, as
//!   the controller sized it). 0 = no limit (a job that asked for none, as Slurm without
//!   `ConstrainRAMSpace`).
//! - CPUs: a CFS quota of the job's CPUs on this node (`cpus * period`), so a job given 2 of
//!   64 CPUs gets 2 CPUs' worth of time however many threads it starts. The controller sends
//!   CPU counts, not CPU ids, so the worker limits rather than pins.
//! - GPUs: every GPU device file of the node (`/dev/nvidiaN`) not allocated to the job is
//!   denied, by its device number, through the devices controller (v1) or an eBPF device
//!   program (v2); control devices (`nvidiactl`, `nvidia-uvm`) stay open, since a job with
//!   its own GPU needs them.

use std::collections::BTreeSet;

/// CFS period the quota is expressed in (the kernel's default, 100 ms).
pub const CPU_PERIOD_US: u64 = 100_000;

/// A character device (`c MAJOR:MINOR`) as the devices controller names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CharDevice {
    pub major: u64,
    pub minor: u64,
}

/// A GPU device file found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDeviceFile {
    /// `N` of `/dev/nvidiaN`, the index `CUDA_VISIBLE_DEVICES` and the controller use.
    pub index: u32,
    pub device: CharDevice,
}

/// What the controller allocated to a job on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocation {
    /// MiB; 0 = no limit.
    pub mem_mb: u64,
    /// CPUs; 0 = no limit.
    pub cpus: u32,
    /// GPU indices given to the job here.
    pub gpus: Vec<u32>,
}

/// The limits one job's cgroup gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobLimits {
    pub mem_bytes: Option<u64>,
    /// CFS quota per [`CPU_PERIOD_US`].
    pub cpu_quota_us: Option<u64>,
    /// Devices the job must not open.
    pub deny: Vec<CharDevice>,
}

/// The limits for `alloc` on a node with `node_cpus` CPUs and GPU device files `gpus`.
pub fn job_limits(alloc: &Allocation, node_cpus: u32, gpus: &[GpuDeviceFile]) -> JobLimits {
    let mem_bytes = (alloc.mem_mb > 0).then(|| alloc.mem_mb.saturating_mul(1024 * 1024));
    // A job given the whole node (or more than it knows of) is not throttled below it.
    let cpus = if alloc.cpus == 0 {
        None
    } else {
        Some(alloc.cpus.min(node_cpus.max(1)))
    };
    let cpu_quota_us = cpus.map(|c| u64::from(c).saturating_mul(CPU_PERIOD_US));
    let allowed: BTreeSet<u32> = alloc.gpus.iter().copied().collect();
    let mut deny: Vec<CharDevice> = gpus
        .iter()
        .filter(|g| !allowed.contains(&g.index))
        .map(|g| g.device)
        .collect();
    deny.sort_unstable();
    deny.dedup();
    JobLimits {
        mem_bytes,
        cpu_quota_us,
        deny,
    }
}

/// `N` when `name` is a GPU device file name `nvidiaN` (not `nvidiactl`, `nvidia-uvm`, ...).
pub fn gpu_index_of(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("nvidia")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The name of a job's cgroup directory.
pub fn job_dir(job_id: u64) -> String {
    format!("job_{job_id}")
}

/// The name of a step's cgroup directory inside its job's: `step_batch` for the batch
/// script, `step_N` for step N (Slurm's names).
pub fn step_dir(step: Option<u32>) -> String {
    match step {
        None => "step_batch".to_owned(),
        Some(n) => format!("step_{n}"),
    }
}

/// CPU time and peak memory of a cgroup, as sacct reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// User and system CPU in microseconds; `None` where the cgroup does not count them (a
    /// v1 node whose `cpuacct` is not mounted with `cpu`).
    pub cpu_usec: Option<(u64, u64)>,
    /// Peak memory; 0 = not known.
    pub max_rss_bytes: u64,
}

/// The value of `key N` in a flat keyed cgroup file.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some(key))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// User and system CPU in microseconds from v1 `cpuacct.stat` (`user N`, `system N`, in
/// the kernel's USER_HZ ticks, 100 per second on Linux).
pub fn cpuacct_stat_usec(text: &str) -> Option<(u64, u64)> {
    const USEC_PER_TICK: u64 = 10_000;
    Some((
        keyed(text, "user")?.saturating_mul(USEC_PER_TICK),
        keyed(text, "system")?.saturating_mul(USEC_PER_TICK),
    ))
}

/// User and system CPU in microseconds from v2 `cpu.stat`.
pub fn cpu_stat_usec(text: &str) -> Option<(u64, u64)> {
    Some((keyed(text, "user_usec")?, keyed(text, "system_usec")?))
}

/// Parses `oom_kill N` out of v1 `memory.oom_control` or v2 `memory.events`.
pub fn oom_kills(text: &str) -> Option<u64> {
    keyed(text, "oom_kill")
}

/// Pids in a `cgroup.procs` file; garbage lines are skipped.
pub fn parse_pids(text: &str) -> Vec<i32> {
    text.lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|p| *p > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuDeviceFile {
        GpuDeviceFile {
            index,
            device: CharDevice {
                major: 195,
                minor: u64::from(index),
            },
        }
    }

    #[test]
    fn memory_and_cpus_follow_the_allocation() {
        let l = job_limits(
            &Allocation {
                mem_mb: 32,
                cpus: 2,
                gpus: vec![],
            },
            8,
            &[],
        );
        assert_eq!(l.mem_bytes, Some(32 * 1024 * 1024));
        assert_eq!(l.cpu_quota_us, Some(200_000));
        assert!(l.deny.is_empty());
    }

    #[test]
    fn nothing_asked_means_no_limit_and_cpus_are_capped_at_the_node() {
        let l = job_limits(&Allocation::default(), 8, &[]);
        assert_eq!((l.mem_bytes, l.cpu_quota_us), (None, None));
        let l = job_limits(
            &Allocation {
                cpus: 99,
                ..Default::default()
            },
            4,
            &[],
        );
        assert_eq!(l.cpu_quota_us, Some(400_000));
    }

    #[test]
    fn gpus_not_allocated_are_denied() {
        let node = [gpu(0), gpu(1), gpu(2), gpu(3)];
        let l = job_limits(
            &Allocation {
                gpus: vec![1, 3],
                ..Default::default()
            },
            8,
            &node,
        );
        assert_eq!(l.deny, vec![gpu(0).device, gpu(2).device]);
        // A job without GPUs sees none of them.
        let l = job_limits(&Allocation::default(), 8, &node);
        assert_eq!(l.deny.len(), 4);
        // A node without GPU files has nothing to hide.
        let l = job_limits(
            &Allocation {
                gpus: vec![0],
                ..Default::default()
            },
            8,
            &[],
        );
        assert!(l.deny.is_empty());
    }

    #[test]
    fn gpu_file_names() {
        assert_eq!(gpu_index_of("nvidia0"), Some(0));
        assert_eq!(gpu_index_of("nvidia12"), Some(12));
        for other in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia",
            "nvidia-caps",
            "nvme0",
            "nvidia1a",
        ] {
            assert_eq!(gpu_index_of(other), None, "{other}");
        }
    }

    #[test]
    fn oom_counters_and_pids_parse() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(oom_kills(v1), Some(2));
        let v2 = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(v2), Some(1));
        assert_eq!(oom_kills("oom_kill_disable 0\nunder_oom 0\n"), None);
    }

    #[test]
    fn cpu_times_from_both_cgroup_versions() {
        assert_eq!(
            cpuacct_stat_usec("user 12\nsystem 3\n"),
            Some((120_000, 30_000))
        );
        assert_eq!(cpuacct_stat_usec("user 12\n"), None);
        let v2 = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n";
        assert_eq!(cpu_stat_usec(v2), Some((1000, 500)));
        assert_eq!(parse_pids("12\n\n7\nx\n0\n"), vec![12, 7]);
        assert_eq!(step_dir(None), "step_batch");
        assert_eq!(step_dir(Some(3)), "step_3");
        assert_eq!(job_dir(42), "job_42");
    }
}
