//! cgroup v2: one unified tree, `tandem/NODE/job_ID/step_S` below the worker's own cgroup.
//!
//! Controllers are enabled top-down through `cgroup.subtree_control`; only those the node
//! offers (`cgroup.controllers`) are asked for, so a tree without `memory` still isolates
//! and kills (`cgroup.kill`), it just cannot limit.
//!
//! v2 has no `devices.deny`: GPUs not given to a job are hidden by an eBPF device program
//! (`BPF_PROG_TYPE_CGROUP_DEVICE`, [`super::devfilter`]) attached to the job's directory
//! with `BPF_F_ALLOW_MULTI` before any of its processes join, refusing exactly the devices
//! v1 would deny (the same [`JobLimits::deny`]); its steps inherit it. A job with nothing
//! to hide (a node without GPU device files, a job given all of them) gets no program. When
//! the kernel refuses the program (no `CONFIG_CGROUP_BPF`, no `CAP_SYS_ADMIN`/`CAP_BPF`), a
//! job with GPUs to hide fails to launch rather than see them: [`Tree::prepare`] probes
//! once, so the worker says so at its start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::dir::Dir;
use super::plan::{self, JobLimits};
use super::{bpf, devfilter};

/// The controllers a job's subtree uses, when the node has them.
const WANTED: [&str; 3] = ["memory", "cpu", "pids"];

#[derive(Debug, Clone)]
pub struct Tree {
    /// `.../tandem/NODE`, held open.
    base: Dir,
    /// Of [`WANTED`], those enabled for the subtree.
    controllers: Vec<String>,
    /// Whether a device program could be attached below `base`, or why not.
    devices: Result<(), String>,
}

#[derive(Debug, Clone)]
pub struct Job {
    dir: Dir,
    controllers: Vec<String>,
}

/// The `+memory +cpu` line for `cgroup.subtree_control`, from what `cgroup.controllers` offers.
pub fn enable_line(available: &str) -> (String, Vec<String>) {
    let have: Vec<&str> = available.split_whitespace().collect();
    let on: Vec<String> = WANTED
        .iter()
        .filter(|c| have.contains(c))
        .map(|c| (*c).to_owned())
        .collect();
    let line = on
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    (line, on)
}

impl Tree {
    /// `own`: the worker's cgroup (`<mount>/<path from /proc/self/cgroup>`); the tree goes in
    /// `own/tandem/NODE`. When `own` is not the root and holds processes, v2 forbids enabling
    /// controllers for its children ("no internal processes"), so the worker moves itself into
    /// a leaf `own/tandem/worker_NODE` first, as slurmd moves itself into its `system` cgroup.
    pub fn prepare(own: &Path, node: &str) -> io::Result<Self> {
        let available = fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
        let (line, controllers) = enable_line(&available);
        let tandem = own.join("tandem");
        let base = tandem.join(node);
        fs::create_dir_all(&base)?;
        if !line.is_empty() {
            if let Err(e) = fs::write(own.join("cgroup.subtree_control"), &line) {
                if e.raw_os_error() != Some(nix::errno::Errno::EBUSY as i32) {
                    return Err(e);
                }
                let leaf = tandem.join(format!("worker_{node}"));
                fs::create_dir_all(&leaf)?;
                fs::write(leaf.join("cgroup.procs"), "0")?;
                fs::write(own.join("cgroup.subtree_control"), &line)?;
            }
            fs::write(tandem.join("cgroup.subtree_control"), &line)?;
            fs::write(base.join("cgroup.subtree_control"), &line)?;
        }
        let devices = probe_device_filter(&base);
        Ok(Self {
            base: Dir::open(&base)?,
            controllers,
            devices,
        })
    }

    /// `Ok` when [`Tree::prepare`] could attach a device program in this tree, else the
    /// kernel's refusal.
    pub fn device_filter(&self) -> Result<(), &str> {
        self.devices.as_ref().map_err(String::as_str).copied()
    }

    pub fn base(&self) -> &Dir {
        &self.base
    }

    pub fn controllers(&self) -> &[String] {
        &self.controllers
    }

    pub fn leftover_jobs(&self) -> Vec<u64> {
        super::job_ids_in(&self.base)
    }

    pub fn job(&self, job_id: u64) -> Job {
        Job {
            dir: self.base.join(&plan::job_dir(job_id)),
            controllers: self.controllers.clone(),
        }
    }

    /// Creates job `job_id`'s directory with its limits. The device program goes first, while
    /// the directory is still empty; when it cannot be attached the directory is removed
    /// again and the error says why (fail closed: the job must not start seeing every GPU).
    pub fn create_job(&self, job_id: u64, limits: &JobLimits) -> io::Result<Job> {
        let job = self.job(job_id);
        // Not `create_dir_all`: an existing directory is a stale one, which the caller
        // clears (see `Isolation::create_job`).
        job.dir.create()?;
        if !limits.deny.is_empty()
            && let Err(e) = hide_devices(&job.dir.path(), &limits.deny)
        {
            let _ = job.dir.remove();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot hide the {} GPU device(s) not given to the job (cgroup v2 device \
                     program): {e}",
                    limits.deny.len()
                ),
            ));
        }
        let has = |c: &str| job.controllers.iter().any(|x| x == c);
        if has("memory")
            && let Some(bytes) = limits.mem_bytes
        {
            job.dir.write("memory.max", bytes.to_string())?;
            // No swapping past the limit either, where swap is accounted.
            if job.dir.has("memory.swap.max") {
                let _ = job.dir.write("memory.swap.max", "0");
            }
        }
        if has("cpu")
            && let Some(quota) = limits.cpu_quota_us
        {
            job.dir
                .write("cpu.max", format!("{quota} {}", plan::CPU_PERIOD_US))?;
        }
        Ok(job)
    }
}

/// Attaches to `dir` a device program refusing `deny`.
fn hide_devices(dir: &Path, deny: &[plan::CharDevice]) -> io::Result<()> {
    let prog = devfilter::program(deny).map_err(io::Error::other)?;
    bpf::attach_device_program(dir, &devfilter::encode(&prog))
}

/// Attaches a device program that allows everything to a throw-away cgroup below `base`,
/// and removes it: whether jobs' GPU filters will load and attach here.
fn probe_device_filter(base: &Path) -> Result<(), String> {
    let dir = base.join("devices_probe");
    if let Err(e) = fs::create_dir_all(&dir) {
        return Err(format!("cannot create {}: {e}", dir.display()));
    }
    let attached = hide_devices(&dir, &[]).map_err(|e| e.to_string());
    // The program goes with the cgroup.
    let _ = fs::remove_dir(&dir);
    attached
}

impl Job {
    pub fn dir_exists(&self) -> bool {
        self.dir.is_dir()
    }

    pub fn add_step(&self, step: Option<u32>) -> io::Result<Vec<PathBuf>> {
        let d = self.dir.join(&plan::step_dir(step));
        super::create_step(&d)?;
        Ok(vec![d.path().join("cgroup.procs")])
    }

    pub fn step_dirs(&self, step: Option<u32>) -> Vec<Dir> {
        vec![self.dir.join(&plan::step_dir(step))]
    }

    pub fn dirs(&self) -> Vec<Dir> {
        vec![self.dir.clone()]
    }

    pub fn pids(&self) -> Vec<i32> {
        super::pids_under(&self.dir)
    }

    pub fn signal(&self, signal: Signal) -> usize {
        super::signal_pids(&self.pids(), signal)
    }

    /// `cgroup.kill` (Linux 5.14+) kills the whole subtree atomically; older kernels get
    /// SIGKILL per process, repeated by the caller until the tree is empty.
    pub fn kill_all(&self) {
        if self.dir.has("cgroup.kill") && self.dir.write("cgroup.kill", "1").is_ok() {
            return;
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    /// `memory.events` of the job counts its descendants' OOM kills too.
    /// CPU time (`cpu.stat`) and peak memory (`memory.peak`, Linux 5.19 and later) of the
    /// job, or of one of its steps.
    pub fn usage(&self, step: Option<Option<u32>>) -> plan::Usage {
        let dir = match step {
            Some(s) => self.dir.join(&plan::step_dir(s)),
            None => self.dir.clone(),
        };
        let cpu_usec = dir
            .read("cpu.stat")
            .ok()
            .and_then(|t| plan::cpu_stat_usec(&t));
        plan::Usage {
            cpu_usec,
            max_rss_bytes: dir
                .read("memory.peak")
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    pub fn oom_kills(&self) -> u64 {
        self.dir
            .read("memory.events")
            .ok()
            .and_then(|t| plan::oom_kills(&t))
            .unwrap_or(0)
    }

    pub fn remove(&self) -> io::Result<()> {
        super::remove_tree(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enables_only_what_the_node_offers() {
        let (line, on) = enable_line("cpuset cpu io memory hugetlb pids rdma misc");
        assert_eq!(line, "+memory +cpu +pids");
        assert_eq!(on, ["memory", "cpu", "pids"]);
        let (line, on) = enable_line("hugetlb\n");
        assert!(line.is_empty() && on.is_empty());
    }

    #[test]
    fn writes_limits_in_v2_syntax() {
        let tmp = tempfile::tempdir().unwrap();
        let own = tmp.path();
        fs::write(own.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let tree = Tree::prepare(own, "n1").unwrap();
        assert_eq!(tree.controllers(), ["memory", "cpu", "pids"]);
        let read = |p: &str| fs::read_to_string(own.join(p)).unwrap();
        assert_eq!(read("cgroup.subtree_control"), "+memory +cpu +pids");
        assert_eq!(
            read("tandem/n1/cgroup.subtree_control"),
            "+memory +cpu +pids"
        );
        let job = tree
            .create_job(
                9,
                &JobLimits {
                    mem_bytes: Some(64 << 20),
                    cpu_quota_us: Some(150_000),
                    deny: vec![],
                },
            )
            .unwrap();
        assert_eq!(read("tandem/n1/job_9/memory.max"), "67108864");
        assert_eq!(read("tandem/n1/job_9/cpu.max"), "150000 100000");
        let procs = job.add_step(Some(0)).unwrap();
        assert_eq!(procs, vec![own.join("tandem/n1/job_9/step_0/cgroup.procs")]);
        fs::write(
            own.join("tandem/n1/job_9/memory.events"),
            "oom 1\noom_kill 3\n",
        )
        .unwrap();
        assert_eq!(job.oom_kills(), 3);
        fs::write(&procs[0], "11\n").unwrap();
        assert_eq!(job.pids(), vec![11]);
        assert_eq!(tree.leftover_jobs(), vec![9]);
    }

    #[test]
    fn a_job_whose_gpus_cannot_be_hidden_is_not_created() {
        // A plain directory takes no device program (and without root none loads): the
        // job's directory goes again and the error says what could not be done.
        let tmp = tempfile::tempdir().unwrap();
        let tree = Tree::prepare(tmp.path(), "n1").unwrap();
        assert!(tree.device_filter().is_err());
        assert!(!tmp.path().join("tandem/n1/devices_probe").exists());
        let limits = JobLimits {
            deny: vec![plan::CharDevice {
                major: 195,
                minor: 1,
            }],
            ..Default::default()
        };
        let err = tree.create_job(4, &limits).unwrap_err().to_string();
        assert!(err.contains("cannot hide the 1 GPU device(s)"), "{err}");
        assert!(err.contains("BPF_PROG_"), "{err}");
        assert!(!tmp.path().join("tandem/n1/job_4").exists());
        // Nothing to hide: no program needed.
        tree.create_job(5, &JobLimits::default()).unwrap();
        assert!(tmp.path().join("tandem/n1/job_5").is_dir());
    }

    #[test]
    fn without_controllers_no_limit_files_are_written() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = Tree::prepare(tmp.path(), "n1").unwrap();
        assert!(tree.controllers().is_empty());
        tree.create_job(
            1,
            &JobLimits {
                mem_bytes: Some(1 << 20),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!tmp.path().join("tandem/n1/job_1/memory.max").exists());
    }
}
