//! cgroup v1: one directory per controller hierarchy (`memory`, `cpu`, `devices`,
//! `freezer`), the same `tandem/NODE/job_ID/step_S` tree in each.
//!
//! Limits are written on the job directory (v1 charges and limits hierarchically), processes
//! join the step directories. Killing freezes the job first (the freezer hierarchy), so a
//! process cannot fork new ones between reading `cgroup.procs` and the signal.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::plan::{self, JobLimits};

/// The v1 controllers a job's processes join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Cpu,
    Devices,
    Freezer,
}

impl Controller {
    pub const ALL: [Controller; 4] = [Self::Memory, Self::Cpu, Self::Devices, Self::Freezer];

    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
            Self::Devices => "devices",
            Self::Freezer => "freezer",
        }
    }
}

/// This node's subtree in each hierarchy.
#[derive(Debug, Clone)]
pub struct Tree {
    /// Controller -> `.../tandem/NODE`; one entry per controller the node has mounted.
    bases: Vec<(Controller, PathBuf)>,
}

/// One job's directories, one per controller.
#[derive(Debug, Clone)]
pub struct Job {
    dirs: Vec<(Controller, PathBuf)>,
    /// Whether the job has a `devices` directory (see [`Tree::create_job`]); the others
    /// it always has.
    devices: bool,
}

impl Tree {
    pub fn new(bases: Vec<(Controller, PathBuf)>) -> Self {
        Self { bases }
    }

    pub fn bases(&self) -> &[(Controller, PathBuf)] {
        &self.bases
    }

    /// Creates the node's subtree; an error means this node cannot use cgroups.
    pub fn prepare(&self) -> io::Result<()> {
        for (_, base) in &self.bases {
            fs::create_dir_all(base)?;
        }
        Ok(())
    }

    /// Ids of job directories left by an earlier worker life.
    pub fn leftover_jobs(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .bases
            .iter()
            .flat_map(|(_, b)| super::job_ids_in(b))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// A handle to job `job_id`'s directories (existing or not), all of them.
    pub fn job(&self, job_id: u64) -> Job {
        Job {
            dirs: self
                .bases
                .iter()
                .map(|(c, b)| (*c, b.join(plan::job_dir(job_id))))
                .collect(),
            devices: true,
        }
    }

    /// Job `job_id`'s directories if it has any (a step joining a job that runs here).
    pub fn existing_job(&self, job_id: u64) -> Option<Job> {
        let mut job = self.job(job_id);
        if !job.dir_exists() {
            return None;
        }
        job.devices = job.dir(Controller::Devices).is_some_and(Path::is_dir);
        Some(job)
    }

    /// Creates job `job_id`'s directories and writes its limits.
    ///
    /// With no device to deny, the job stays out of the `devices` hierarchy: a cgroup
    /// there without rules allows what its parent allows, so it would restrict nothing
    /// and cost a `mkdir` and an `rmdir` per job and step (most jobs on a node without
    /// GPU device files, or holding all of its GPUs).
    pub fn create_job(&self, job_id: u64, limits: &JobLimits) -> io::Result<Job> {
        let mut job = self.job(job_id);
        job.devices = !limits.deny.is_empty();
        for (c, dir) in job.joined() {
            fs::create_dir_all(dir)?;
            match c {
                Controller::Memory => {
                    if let Some(bytes) = limits.mem_bytes {
                        fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                        // With swap accounting, swap counts too (else a job swaps past its
                        // limit). Absent without swap accounting: the open fails, fine.
                        let _ = fs::OpenOptions::new()
                            .write(true)
                            .open(dir.join("memory.memsw.limit_in_bytes"))
                            .and_then(|mut f| {
                                io::Write::write_all(&mut f, bytes.to_string().as_bytes())
                            });
                    }
                }
                Controller::Cpu => {
                    if let Some(quota) = limits.cpu_quota_us {
                        // A new cgroup's period is the kernel's default, the
                        // `plan::CPU_PERIOD_US` the quota is counted in: only the quota
                        // needs writing.
                        fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                    }
                }
                Controller::Devices => {
                    for d in &limits.deny {
                        // One rule per write: the kernel parses one exception at a time.
                        fs::write(
                            dir.join("devices.deny"),
                            format!("c {}:{} rwm", d.major, d.minor),
                        )?;
                    }
                }
                Controller::Freezer => {}
            }
        }
        Ok(job)
    }
}

impl Job {
    pub fn dir_exists(&self) -> bool {
        self.dirs.iter().any(|(_, d)| d.is_dir())
    }

    /// The hierarchies the job's processes join, with its directory in each.
    fn joined(&self) -> impl Iterator<Item = &(Controller, PathBuf)> {
        self.dirs
            .iter()
            .filter(|(c, _)| self.devices || *c != Controller::Devices)
    }

    /// Creates a step's directories (which inherit the job's limits); returns the
    /// `cgroup.procs` files its processes write themselves into.
    pub fn add_step(&self, step: Option<u32>) -> io::Result<Vec<PathBuf>> {
        let name = plan::step_dir(step);
        let mut procs = Vec::with_capacity(self.dirs.len());
        for (_, dir) in self.joined() {
            let d = dir.join(&name);
            fs::create_dir_all(&d)?;
            procs.push(d.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// A step's directories, one per controller.
    pub fn step_dirs(&self, step: Option<u32>) -> Vec<PathBuf> {
        let name = plan::step_dir(step);
        self.joined().map(|(_, d)| d.join(&name)).collect()
    }

    /// The directories of the job itself.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.joined().map(|(_, d)| d.clone()).collect()
    }

    fn dir(&self, c: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, d)| d.as_path())
    }

    /// Every process of the job (its steps included): read from the freezer hierarchy, or
    /// the first one when the node has no freezer.
    pub fn pids(&self) -> Vec<i32> {
        let dir = self
            .dir(Controller::Freezer)
            .or_else(|| self.dirs.first().map(|(_, d)| d.as_path()));
        dir.map(super::pids_under).unwrap_or_default()
    }

    /// Sends `signal` to every process of the job; returns how many got it.
    pub fn signal(&self, signal: Signal) -> usize {
        super::signal_pids(&self.pids(), signal)
    }

    /// SIGKILL to every process, frozen first so none forks meanwhile.
    pub fn kill_all(&self) {
        // Most jobs have ended by themselves when the worker cleans up. Freezing and
        // thawing an empty cgroup would buy nothing and costs a freezer state change each
        // way (the kernel flips a static key on the first freeze and the last thaw: code
        // patching with an IPI to every CPU); a job with no process cannot fork either.
        if self.pids().is_empty() {
            return;
        }
        let frozen = self
            .dir(Controller::Freezer)
            .map(|d| d.join("freezer.state"));
        if let Some(state) = &frozen
            && fs::write(state, "FROZEN").is_ok()
        {
            wait_frozen(state, Duration::from_millis(500));
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(state) = &frozen {
            // A frozen process cannot act on SIGKILL; thawed, it dies at once.
            let _ = fs::write(state, "THAWED");
        }
    }

    /// OOM kills in the job: the kernel counts each in the victim's own memory cgroup
    /// (the step's), so the job's and its steps' counters are summed.
    pub fn oom_kills(&self) -> u64 {
        let Some(dir) = self.dir(Controller::Memory) else {
            return 0;
        };
        super::dirs_under(dir)
            .iter()
            .filter_map(|d| fs::read_to_string(d.join("memory.oom_control")).ok())
            .filter_map(|t| plan::oom_kills(&t))
            .sum()
    }

    /// CPU time (`cpuacct.stat`, in the cpu hierarchy where cpuacct shares it) and peak
    /// memory (`memory.max_usage_in_bytes`) of the job, or of one of its steps.
    pub fn usage(&self, step: Option<Option<u32>>) -> plan::Usage {
        let at = |c: Controller| {
            self.dir(c).map(|d| match step {
                Some(s) => d.join(plan::step_dir(s)),
                None => d.to_path_buf(),
            })
        };
        let read =
            |c: Controller, file: &str| at(c).and_then(|d| fs::read_to_string(d.join(file)).ok());
        let cpu_usec =
            read(Controller::Cpu, "cpuacct.stat").and_then(|t| plan::cpuacct_stat_usec(&t));
        plan::Usage {
            cpu_usec,
            max_rss_bytes: read(Controller::Memory, "memory.max_usage_in_bytes")
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    /// Whether the memory limit was ever hit (kernels before 4.13 lack `oom_kill`).
    pub fn hit_memory_limit(&self) -> bool {
        self.dir(Controller::Memory)
            .and_then(|d| fs::read_to_string(d.join("memory.failcnt")).ok())
            .and_then(|t| t.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    }

    /// Removes the job's directories (steps first); they must hold no process.
    pub fn remove(&self) -> io::Result<()> {
        let mut first_err = None;
        for (_, dir) in self.joined() {
            if let Err(e) = super::remove_tree(dir)
                && first_err.is_none()
            {
                first_err = Some(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn wait_frozen(state: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match fs::read_to_string(state) {
            Ok(s) if s.trim() == "FROZEN" => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::plan::CharDevice;

    fn tree(root: &Path) -> Tree {
        Tree::new(
            Controller::ALL
                .iter()
                .map(|c| (*c, root.join(c.name()).join("tandem/n1")))
                .collect(),
        )
    }

    #[test]
    fn writes_the_limits_into_each_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tree(tmp.path());
        t.prepare().unwrap();
        let limits = JobLimits {
            mem_bytes: Some(32 << 20),
            cpu_quota_us: Some(200_000),
            deny: vec![CharDevice {
                major: 195,
                minor: 1,
            }],
        };
        let job = t.create_job(7, &limits).unwrap();
        let read = |p: &str| fs::read_to_string(tmp.path().join(p)).unwrap();
        assert_eq!(
            read("memory/tandem/n1/job_7/memory.limit_in_bytes"),
            "33554432"
        );
        assert_eq!(read("cpu/tandem/n1/job_7/cpu.cfs_quota_us"), "200000");
        // The period is the new cgroup's default (the kernel's, which the quota assumes).
        assert!(
            !tmp.path()
                .join("cpu/tandem/n1/job_7/cpu.cfs_period_us")
                .exists()
        );
        assert_eq!(read("devices/tandem/n1/job_7/devices.deny"), "c 195:1 rwm");
        let procs = job.add_step(None).unwrap();
        assert_eq!(procs.len(), 4);
        assert!(
            procs.contains(
                &tmp.path()
                    .join("freezer/tandem/n1/job_7/step_batch/cgroup.procs")
            )
        );
        // pids come from the freezer hierarchy, steps included.
        fs::write(
            tmp.path()
                .join("freezer/tandem/n1/job_7/step_batch/cgroup.procs"),
            "4242\n4243\n",
        )
        .unwrap();
        let mut pids = job.pids();
        pids.sort_unstable();
        assert_eq!(pids, vec![4242, 4243]);
        fs::write(
            tmp.path()
                .join("memory/tandem/n1/job_7/step_batch/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        assert_eq!(job.oom_kills(), 1);
        assert_eq!(t.leftover_jobs(), vec![7]);
    }

    #[test]
    fn a_job_that_denies_no_device_stays_out_of_the_devices_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tree(tmp.path());
        t.prepare().unwrap();
        let job = t.create_job(3, &JobLimits::default()).unwrap();
        let procs = job.add_step(None).unwrap();
        assert_eq!(procs.len(), 3);
        assert!(!tmp.path().join("devices/tandem/n1/job_3").exists());
        // A step of that job joins the same three.
        let step_job = t.existing_job(3).unwrap();
        assert_eq!(step_job.add_step(Some(0)).unwrap().len(), 3);
        assert!(!tmp.path().join("devices/tandem/n1/job_3").exists());
        // Steps remove their own directories as they end.
        for d in step_job.step_dirs(Some(0)) {
            fs::remove_dir(d).unwrap();
        }
        job.remove().unwrap();
        assert_eq!(t.leftover_jobs(), Vec::<u64>::new());
        assert!(t.existing_job(3).is_none());

        // With a device to deny, the job and its steps are in all four.
        let deny = JobLimits {
            deny: vec![CharDevice {
                major: 195,
                minor: 0,
            }],
            ..JobLimits::default()
        };
        t.create_job(4, &deny).unwrap();
        let step_job = t.existing_job(4).unwrap();
        assert_eq!(step_job.add_step(Some(0)).unwrap().len(), 4);
        assert!(tmp.path().join("devices/tandem/n1/job_4/step_0").is_dir());
    }

    #[test]
    fn no_limits_write_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tree(tmp.path());
        t.prepare().unwrap();
        t.create_job(1, &JobLimits::default()).unwrap();
        let dir = tmp.path().join("memory/tandem/n1/job_1");
        assert!(dir.is_dir());
        assert!(!dir.join("memory.limit_in_bytes").exists());
        assert!(
            !tmp.path()
                .join("devices/tandem/n1/job_1/devices.deny")
                .exists()
        );
    }
}
