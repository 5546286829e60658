//! cgroup v1: one directory per controller hierarchy (`memory`, `cpu`, `devices`,
//! `freezer`), `tandem/NODE/job_ID` in each, and `job_ID/step_S` where a step's own
//! directory serves a purpose.
//!
//! Limits are written on the job directory (v1 charges and limits hierarchically). A step's
//! processes join its directory in the memory hierarchy, which counts and limits per step
//! (sacct's MaxRSS, the OOM kill of a step) and is where the worker finds a step's
//! processes; in the cpu hierarchy too where `cpuacct` counts CPU time there. In the others
//! they join the job's directory: the freezer freezes a job as a whole and the devices
//! rules are the job's, so a step directory there would only cost a `mkdir` and an `rmdir`
//! per step. (Without a memory hierarchy, the freezer's step directories track steps.)
//! Killing freezes the job first, so a process cannot fork new ones between reading
//! `cgroup.procs` and the signal.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::dir::Dir;
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
    /// Controller -> `.../tandem/NODE`, held open; one entry per controller the node has
    /// mounted.
    bases: Vec<(Controller, Dir)>,
    /// Whether the cpu hierarchy counts CPU time (`cpuacct` mounted with it).
    cpu_accounting: bool,
}

/// One job's directories, one per controller.
#[derive(Debug, Clone)]
pub struct Job {
    dirs: Vec<(Controller, Dir)>,
    /// Whether the job has a `devices` directory (see [`Tree::create_job`]); the others
    /// it always has.
    devices: bool,
    /// Whether the cpu hierarchy counts CPU time. Only then do steps get directories of
    /// their own there: the CPU limit is the job's, so without `cpuacct` beside it a step
    /// directory would limit and count nothing and cost a `mkdir` and an `rmdir` per step;
    /// the step's processes join the job's directory instead.
    cpu_accounting: bool,
}

impl Tree {
    /// Creates the node's subtree in each hierarchy (controller -> `.../tandem/NODE`) and
    /// opens it; an error means this node cannot use cgroups.
    pub fn prepare(bases: Vec<(Controller, PathBuf)>) -> io::Result<Self> {
        let bases = bases
            .into_iter()
            .map(|(c, path)| {
                fs::create_dir_all(&path)?;
                Ok((c, Dir::open(&path)?))
            })
            .collect::<io::Result<Vec<(Controller, Dir)>>>()?;
        let cpu_accounting = bases
            .iter()
            .any(|(c, b)| *c == Controller::Cpu && b.has("cpuacct.stat"));
        Ok(Self {
            bases,
            cpu_accounting,
        })
    }

    pub fn bases(&self) -> &[(Controller, Dir)] {
        &self.bases
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
                .map(|(c, b)| (*c, b.join(&plan::job_dir(job_id))))
                .collect(),
            devices: true,
            cpu_accounting: self.cpu_accounting,
        }
    }

    /// Job `job_id`'s directories if it has any (a step joining a job that runs here).
    pub fn existing_job(&self, job_id: u64) -> Option<Job> {
        let mut job = self.job(job_id);
        if !job.dir_exists() {
            return None;
        }
        job.devices = job.dir(Controller::Devices).is_some_and(Dir::is_dir);
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
            // Not `create_dir_all`: an existing directory is a stale one, which the caller
            // clears (see `Isolation::create_job`).
            dir.create()?;
            match c {
                Controller::Memory => {
                    if let Some(bytes) = limits.mem_bytes {
                        dir.write("memory.limit_in_bytes", bytes.to_string())?;
                        // With swap accounting, swap counts too (else a job swaps past its
                        // limit). Absent without swap accounting: nothing to write.
                        if dir.has("memory.memsw.limit_in_bytes") {
                            let _ = dir.write("memory.memsw.limit_in_bytes", bytes.to_string());
                        }
                    }
                }
                Controller::Cpu => {
                    if let Some(quota) = limits.cpu_quota_us {
                        // A new cgroup's period is the kernel's default, the
                        // `plan::CPU_PERIOD_US` the quota is counted in: only the quota
                        // needs writing.
                        dir.write("cpu.cfs_quota_us", quota.to_string())?;
                    }
                }
                Controller::Devices => {
                    for d in &limits.deny {
                        // One rule per write: the kernel parses one exception at a time.
                        dir.write("devices.deny", format!("c {}:{} rwm", d.major, d.minor))?;
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
    fn joined(&self) -> impl Iterator<Item = &(Controller, Dir)> {
        self.dirs
            .iter()
            .filter(|(c, _)| self.devices || *c != Controller::Devices)
    }

    /// Creates a step's directories (which inherit the job's limits); returns the files its
    /// processes write themselves into: `tasks`, not `cgroup.procs`. A `0` in `cgroup.procs`
    /// moves the writer's whole thread group, under the kernel's global lock against forks
    /// and exits, whose taking waits for an RCU grace period when no migration happened
    /// moments before: 14 ms a job start on the 2-core VM, against 0.45 ms for a `0` in
    /// `tasks`, which moves the calling thread alone and skips that lock. The writer is
    /// always single-threaded (the child between clone and `exec`, or the launcher before
    /// it starts a thread), so its thread is its whole process.
    pub fn add_step(&self, step: Option<u32>) -> io::Result<Vec<PathBuf>> {
        let name = plan::step_dir(step);
        let mut procs = Vec::with_capacity(self.dirs.len());
        for (c, dir) in self.joined() {
            let d = if self.has_step_dir(*c) {
                let d = dir.join(&name);
                super::create_step(&d)?;
                d
            } else {
                dir.clone()
            };
            procs.push(d.path().join("tasks"));
        }
        Ok(procs)
    }

    /// Whether steps get a directory of their own in `c` (see the module's notes).
    fn has_step_dir(&self, c: Controller) -> bool {
        match c {
            Controller::Memory => true,
            Controller::Cpu => self.cpu_accounting,
            Controller::Freezer => self.dir(Controller::Memory).is_none(),
            Controller::Devices => false,
        }
    }

    /// A step's directories, one per controller that gives steps their own.
    pub fn step_dirs(&self, step: Option<u32>) -> Vec<Dir> {
        let name = plan::step_dir(step);
        self.joined()
            .filter(|(c, _)| self.has_step_dir(*c))
            .map(|(_, d)| d.join(&name))
            .collect()
    }

    /// The directories of the job itself.
    pub fn dirs(&self) -> Vec<Dir> {
        self.joined().map(|(_, d)| d.clone()).collect()
    }

    fn dir(&self, c: Controller) -> Option<&Dir> {
        self.dirs.iter().find(|(x, _)| *x == c).map(|(_, d)| d)
    }

    /// Every process of the job (its steps included): read from the freezer hierarchy, or
    /// the first one when the node has no freezer.
    pub fn pids(&self) -> Vec<i32> {
        let dir = self
            .dir(Controller::Freezer)
            .or_else(|| self.dirs.first().map(|(_, d)| d));
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
        let freezer = self.dir(Controller::Freezer);
        if let Some(f) = freezer
            && f.write(FREEZER_STATE, "FROZEN").is_ok()
        {
            wait_frozen(f, Duration::from_millis(500));
        }
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(f) = freezer {
            // A frozen process cannot act on SIGKILL; thawed, it dies at once.
            let _ = f.write(FREEZER_STATE, "THAWED");
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
            .filter_map(|d| d.read("memory.oom_control").ok())
            .filter_map(|t| plan::oom_kills(&t))
            .sum()
    }

    /// CPU time (`cpuacct.stat`, in the cpu hierarchy where cpuacct shares it) and peak
    /// memory (`memory.max_usage_in_bytes`) of the job, or of one of its steps.
    pub fn usage(&self, step: Option<Option<u32>>) -> plan::Usage {
        let at = |c: Controller| {
            self.dir(c).map(|d| match step {
                Some(s) => d.join(&plan::step_dir(s)),
                None => d.clone(),
            })
        };
        let read = |c: Controller, file: &str| at(c).and_then(|d| d.read(file).ok());
        let cpu_usec = self
            .cpu_accounting
            .then(|| read(Controller::Cpu, "cpuacct.stat"))
            .flatten()
            .and_then(|t| plan::cpuacct_stat_usec(&t));
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
            .and_then(|d| d.read("memory.failcnt").ok())
            .and_then(|t| t.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    }

    /// Removes the job's directories (steps first); they must hold no process.
    pub fn remove(&self) -> io::Result<()> {
        let mut first_err = None;
        for (c, dir) in self.joined() {
            // Where steps have no directory of their own, the job's usually comes away
            // alone; the walk is for what someone else put there.
            let removed = if self.has_step_dir(*c) {
                super::remove_tree(dir)
            } else {
                dir.remove().or_else(|_| super::remove_tree(dir))
            };
            if let Err(e) = removed
                && first_err.is_none()
            {
                first_err = Some(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

const FREEZER_STATE: &str = "freezer.state";

fn wait_frozen(freezer: &Dir, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match freezer.read(FREEZER_STATE) {
            Ok(s) if s.trim() == "FROZEN" => return,
            Ok(_) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return,
        }
    }
}

/// Node `n1`'s tree with all four hierarchies as plain directories under `root`.
#[cfg(test)]
pub(super) fn tree_under(root: &std::path::Path) -> Tree {
    Tree::prepare(
        Controller::ALL
            .iter()
            .map(|c| (*c, root.join(c.name()).join("tandem/n1")))
            .collect(),
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::plan::CharDevice;

    #[test]
    fn writes_the_limits_into_each_hierarchy() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tree_under(tmp.path());
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
        // The step's own directory in the memory hierarchy; the job's in the others (no
        // cpuacct in this cpu hierarchy).
        let mut joined: Vec<String> = procs
            .iter()
            .map(|p| p.strip_prefix(tmp.path()).unwrap().display().to_string())
            .collect();
        joined.sort();
        assert_eq!(
            joined,
            [
                "cpu/tandem/n1/job_7/tasks",
                "devices/tandem/n1/job_7/tasks",
                "freezer/tandem/n1/job_7/tasks",
                "memory/tandem/n1/job_7/step_batch/tasks",
            ]
        );
        assert!(
            !tmp.path()
                .join("freezer/tandem/n1/job_7/step_batch")
                .exists()
        );
        assert_eq!(job.step_dirs(None).len(), 1);
        // pids come from the freezer hierarchy, steps included.
        fs::write(
            tmp.path().join("freezer/tandem/n1/job_7/cgroup.procs"),
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
        let t = tree_under(tmp.path());
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
            d.remove().unwrap();
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
        let procs = step_job.add_step(Some(0)).unwrap();
        assert_eq!(procs.len(), 4);
        // The job's device rules hold its steps: they join its directory there.
        assert!(procs.contains(&tmp.path().join("devices/tandem/n1/job_4/tasks")));
        assert!(!tmp.path().join("devices/tandem/n1/job_4/step_0").exists());
    }

    #[test]
    fn steps_get_a_cpu_directory_only_where_cpu_time_is_counted() {
        for accounting in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let cpu_base = tmp.path().join("cpu/tandem/n1");
            fs::create_dir_all(&cpu_base).unwrap();
            if accounting {
                fs::write(cpu_base.join("cpuacct.stat"), "user 0\nsystem 0\n").unwrap();
            }
            let t = tree_under(tmp.path());
            let job = t.create_job(2, &JobLimits::default()).unwrap();
            let procs = job.add_step(None).unwrap();
            let step_cpu = cpu_base.join("job_2/step_batch");
            let joins = |p: &std::path::Path| procs.contains(&p.join("tasks"));
            assert_eq!(step_cpu.is_dir(), accounting);
            let job_cpu = cpu_base.join("job_2");
            assert!(joins(if accounting { &step_cpu } else { &job_cpu }));
            assert_eq!(job.step_dirs(None).len(), if accounting { 2 } else { 1 });
            // What the step counted is read where it was counted.
            if accounting {
                fs::write(step_cpu.join("cpuacct.stat"), "user 150\nsystem 50\n").unwrap();
            }
            let usage = job.usage(Some(None));
            assert_eq!(usage.cpu_usec.is_some(), accounting);
            if accounting {
                // cgroupfs removes its files with the directory; a plain one needs help.
                fs::remove_file(step_cpu.join("cpuacct.stat")).unwrap();
            }
            job.remove()
                .unwrap_or_else(|e| panic!("accounting {accounting}: {e}"));
            assert!(!cpu_base.join("job_2").exists());
        }
    }

    #[test]
    fn without_a_memory_hierarchy_the_freezer_tracks_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let t = Tree::prepare(
            [Controller::Cpu, Controller::Freezer]
                .iter()
                .map(|c| (*c, tmp.path().join(c.name()).join("tandem/n1")))
                .collect(),
        )
        .unwrap();
        let job = t.create_job(8, &JobLimits::default()).unwrap();
        let procs = job.add_step(Some(1)).unwrap();
        let step = tmp.path().join("freezer/tandem/n1/job_8/step_1");
        assert!(procs.contains(&step.join("tasks")), "{procs:?}");
        assert_eq!(
            job.step_dirs(Some(1))
                .iter()
                .map(Dir::path)
                .collect::<Vec<_>>(),
            [step]
        );
    }

    #[test]
    fn no_limits_write_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tree_under(tmp.path());
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
