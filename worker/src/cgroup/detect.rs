//! Which cgroup versions the node has, and where this process sits in them: parsing
//! `/proc/self/mounts` and `/proc/self/cgroup`, pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The cgroup file systems mounted on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    /// Where the unified (v2) hierarchy is mounted.
    pub v2: Option<PathBuf>,
    /// v1 controller name -> mount point (`cpu` and `cpuacct` may share one).
    pub v1: BTreeMap<String, PathBuf>,
}

/// Parses `/proc/self/mounts`; only mounts under `under` count (the `--cgroup-root`).
pub fn parse_mounts(text: &str, under: &Path) -> Mounts {
    let mut mounts = Mounts::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, point, fstype, options, ..] = fields[..] else {
            continue;
        };
        let point = PathBuf::from(unescape(point));
        if !point.starts_with(under) {
            continue;
        }
        match fstype {
            "cgroup2" => {
                mounts.v2.get_or_insert(point);
            }
            "cgroup" => {
                for opt in options.split(',') {
                    if is_v1_controller(opt) {
                        mounts
                            .v1
                            .entry(opt.to_owned())
                            .or_insert_with(|| point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    mounts
}

fn is_v1_controller(opt: &str) -> bool {
    matches!(
        opt,
        "memory" | "cpu" | "cpuacct" | "cpuset" | "devices" | "freezer" | "pids" | "blkio"
    )
}

/// `/proc/mounts` writes spaces and friends as octal escapes (`\040`).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0')));
        match octal.and_then(|v| u8::try_from(v).ok()) {
            Some(v) => {
                out.push(v);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where this process sits: `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelfCgroups {
    /// Path in the unified hierarchy (`0::/PATH`).
    pub v2: Option<String>,
    /// v1 controller -> path in its hierarchy.
    pub v1: BTreeMap<String, String>,
}

pub fn parse_self_cgroup(text: &str) -> SelfCgroups {
    let mut me = SelfCgroups::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            me.v2 = Some(path.to_owned());
        } else {
            for c in controllers.split(',') {
                me.v1.insert(c.to_owned(), path.to_owned());
            }
        }
    }
    me
}

/// `mount` + `path` for a cgroup path as `/proc/self/cgroup` prints it (absolute).
pub fn join(mount: &Path, cgroup_path: &str) -> PathBuf {
    mount.join(cgroup_path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/systemd cgroup rw,relatime,name=systemd 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup /mnt/other\\040dir cgroup rw,freezer 0 0
proc /proc proc rw 0 0
";

    #[test]
    fn mounts_by_controller_under_the_root() {
        let m = parse_mounts(MOUNTS, Path::new("/sys/fs/cgroup"));
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(m.v1["memory"], PathBuf::from("/sys/fs/cgroup/memory"));
        assert_eq!(m.v1["cpu"], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(m.v1["cpuacct"], m.v1["cpu"]);
        assert!(!m.v1.contains_key("freezer"), "outside the root");
        assert!(!m.v1.contains_key("name=systemd"));
        let all = parse_mounts(MOUNTS, Path::new("/"));
        assert_eq!(all.v1["freezer"], PathBuf::from("/mnt/other dir"));
    }

    #[test]
    fn pure_v2_node() {
        let m = parse_mounts(
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n",
            Path::new("/sys/fs/cgroup"),
        );
        assert_eq!(m.v2, Some(PathBuf::from("/sys/fs/cgroup")));
        assert!(m.v1.is_empty());
    }

    #[test]
    fn own_cgroups() {
        let me = parse_self_cgroup(
            "9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/user.slice/a.scope\n",
        );
        assert_eq!(me.v1["memory"], "/process_api/abc");
        assert_eq!(me.v1["cpu"], "/x");
        assert_eq!(me.v1["cpuacct"], "/x");
        assert_eq!(me.v2.as_deref(), Some("/user.slice/a.scope"));
        assert_eq!(
            join(Path::new("/sys/fs/cgroup/memory"), "/process_api/abc"),
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
        );
        assert_eq!(
            join(Path::new("/sys/fs/cgroup/memory"), "/"),
            PathBuf::from("/sys/fs/cgroup/memory/")
        );
    }
}
