//! What the node's machine is, as `scontrol show node` reports it: the architecture and
//! operating system `uname` names, its host name, and when it booted.

/// Read once, when the worker registers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// `uname -m`: `x86_64`, `aarch64`.
    pub arch: String,
    /// `uname -s -r -v`, as slurmd reports it: `Linux 6.8.0-45-generic #45-Ubuntu SMP ...`.
    pub os: String,
    /// Unix seconds; 0 when `/proc/stat` does not say.
    pub boot_time: i64,
    /// The machine's host name (a pod's name in Kubernetes); empty when unreadable.
    pub hostname: String,
}

impl Host {
    pub fn read() -> Host {
        let (arch, os) = match nix::sys::utsname::uname() {
            Ok(u) => (
                u.machine().to_string_lossy().into_owned(),
                os_line(
                    &u.sysname().to_string_lossy(),
                    &u.release().to_string_lossy(),
                    &u.version().to_string_lossy(),
                ),
            ),
            Err(_) => (std::env::consts::ARCH.to_owned(), String::new()),
        };
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s))
            .unwrap_or(0);
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        Host {
            arch,
            os,
            boot_time,
            hostname,
        }
    }
}

/// slurmd's `OS=`: system name, release and version, space-separated.
fn os_line(sysname: &str, release: &str, version: &str) -> String {
    [sysname, release, version]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `btime` line of `/proc/stat`: when the machine booted, unix seconds.
fn boot_time(stat: &str) -> Option<i64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_is_the_btime_line() {
        let stat = "cpu  1 2 3 4\nintr 5\nctxt 99\nbtime 1764921112\nprocesses 7\n";
        assert_eq!(boot_time(stat), Some(1_764_921_112));
        assert_eq!(boot_time("cpu 1 2\n"), None);
        assert_eq!(boot_time("btime soon\n"), None);
    }

    #[test]
    fn os_is_system_release_and_version() {
        assert_eq!(
            os_line("Linux", "6.18.44-fc-v1252", "#1 SMP PREEMPT_DYNAMIC @0"),
            "Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0"
        );
        assert_eq!(os_line("Linux", "", ""), "Linux");
    }

    #[test]
    fn this_machine_reads() {
        let h = Host::read();
        assert!(!h.arch.is_empty());
        assert!(h.os.starts_with("Linux "), "{}", h.os);
        assert!(h.boot_time > 0 && h.boot_time <= tandem_net::auth::unix_now());
    }
}
