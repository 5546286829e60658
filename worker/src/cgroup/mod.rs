//! Job isolation as slurmd's cgroup plugins do it: each job in its own cgroup
//! (`tandem/NODE/job_ID`), each step below it (`step_batch`, `step_N`), with the job's
//! memory, CPU and GPU-device limits on the job directory.
//!
//! - `plan`: what limits a job gets (pure).
//! - `detect`: which cgroup versions the node has and where the worker sits (pure parsing).
//! - `v1`, `v2`: the file-system writers, each testable against a directory that mimics
//!   cgroupfs.
//! - `devfilter` (pure) and `bpf` (the system calls): v2's GPU hiding, an eBPF device
//!   program in place of v1's `devices.deny`.
//!
//! Processes join their step's cgroup themselves before they exec the job (see
//! [`crate::launch::exec`]), so nothing a job starts runs outside it, even for an instant.
//! The worker picks v2 when the node's unified hierarchy offers the memory controller and no
//! v1 memory hierarchy is mounted, else v1 when the memory hierarchy is mounted, else runs
//! without cgroups and says so once (`--cgroup=off` does that on purpose; an unprivileged pod
//! gets it when the cgroup files are not writable).

mod bpf;
pub mod detect;
pub mod devfilter;
pub mod dir;
pub mod plan;
pub mod v1;
pub mod v2;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{info, warn};

use dir::Dir;
use plan::{Allocation, CharDevice, GpuDeviceFile};

/// `--cgroup`: which cgroup version to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Mode {
    /// v2 where the node has it with the memory controller, else v1, else none.
    #[default]
    Auto,
    V1,
    V2,
    /// No cgroups: limits are scheduled, not enforced.
    Off,
}

/// The worker's cgroup settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// Where cgroup file systems are mounted (`--cgroup-root`).
    pub root: PathBuf,
    /// Where GPU device files are looked for (`/dev/nvidiaN`).
    pub dev_dir: PathBuf,
    /// This worker's directory under `tandem/`; default: the node name. Workers sharing a
    /// machine need distinct ones.
    pub subtree: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mode: Mode::Auto,
            root: PathBuf::from("/sys/fs/cgroup"),
            dev_dir: PathBuf::from("/dev"),
            subtree: None,
        }
    }
}

#[derive(Debug, Clone)]
enum Tree {
    V1(v1::Tree),
    V2(v2::Tree),
}

/// This node's isolation: a cgroup tree, or none.
#[derive(Debug, Clone)]
pub struct Isolation {
    tree: Option<Tree>,
    node_cpus: u32,
    gpus: Vec<GpuDeviceFile>,
}

/// One job's cgroup.
#[derive(Debug, Clone)]
pub enum JobCgroup {
    V1(v1::Job),
    V2(v2::Job),
}

impl Isolation {
    /// No cgroups at all.
    pub fn off() -> Self {
        Self {
            tree: None,
            node_cpus: 0,
            gpus: Vec::new(),
        }
    }

    /// Detects and prepares the node's tree; falls back to no cgroups, with one log line
    /// saying why, when the node has none or they are not writable. Jobs left by an earlier
    /// worker life are killed and their cgroups removed.
    pub fn setup(settings: &Settings, node: &str, node_cpus: u32) -> Self {
        let gpus = gpu_device_files(&settings.dev_dir);
        let tree = match choose(settings, settings.subtree.as_deref().unwrap_or(node)) {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                info!("cgroups off (--cgroup=off): job memory, CPUs and GPUs are not enforced");
                None
            }
            Err(why) => {
                warn!(
                    %why,
                    "running without cgroups: job memory, CPUs and GPU devices are not enforced"
                );
                None
            }
        };
        let iso = Self {
            tree,
            node_cpus,
            gpus,
        };
        if let Some(t) = &iso.tree {
            let (version, at) = match t {
                Tree::V1(t) => (
                    "v1",
                    t.bases()
                        .iter()
                        .map(|(_, b)| b.path().display().to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                Tree::V2(t) => ("v2", t.base().path().display().to_string()),
            };
            info!(version, at = %at, gpu_device_files = iso.gpus.len(), "jobs isolated in cgroups");
            if let Some(why) = iso.device_filter_problem()
                && !iso.gpus.is_empty()
            {
                warn!(
                    %why,
                    "cgroup v2 device programs cannot be attached here: jobs not given every GPU of the node will fail to launch"
                );
            }
            iso.clean_leftovers();
        }
        iso
    }

    /// `"v1"`, `"v2"` or `"off"`.
    pub fn version(&self) -> &'static str {
        match &self.tree {
            Some(Tree::V1(_)) => "v1",
            Some(Tree::V2(_)) => "v2",
            None => "off",
        }
    }

    pub fn enabled(&self) -> bool {
        self.tree.is_some()
    }

    /// Whether job memory is limited (v1 memory hierarchy, or v2 with `memory` enabled).
    pub fn limits_memory(&self) -> bool {
        match &self.tree {
            Some(Tree::V1(t)) => t.bases().iter().any(|(c, _)| *c == v1::Controller::Memory),
            Some(Tree::V2(t)) => t.controllers().iter().any(|c| c == "memory"),
            None => false,
        }
    }

    /// Whether GPU device files can be hidden: the v1 devices hierarchy, or on v2 an eBPF
    /// device program (probed when the tree was prepared).
    pub fn filters_devices(&self) -> bool {
        match &self.tree {
            Some(Tree::V1(t)) => t.bases().iter().any(|(c, _)| *c == v1::Controller::Devices),
            Some(Tree::V2(t)) => t.device_filter().is_ok(),
            None => false,
        }
    }

    /// On v2, why a device program could not be attached (the kernel's words); `None` on
    /// v1, without cgroups, or when it could.
    pub fn device_filter_problem(&self) -> Option<&str> {
        match &self.tree {
            Some(Tree::V2(t)) => t.device_filter().err(),
            _ => None,
        }
    }

    /// Removes this worker's (empty) subtree when it stops; jobs' cgroups are gone by then.
    pub fn remove_node_dirs(&self) {
        let dirs: Vec<PathBuf> = match &self.tree {
            None => return,
            Some(Tree::V1(t)) => t.bases().iter().map(|(_, b)| b.path()).collect(),
            Some(Tree::V2(t)) => vec![t.base().path()],
        };
        for d in dirs {
            // Not empty (a job cgroup left behind): kept, and cleaned at the next start.
            let _ = fs::remove_dir(d);
        }
    }

    /// Creates job `job_id`'s cgroup with its limits, for its batch script. `Ok(None)`
    /// without cgroups.
    ///
    /// A directory of the same id already there (a job requeued onto this node whose
    /// processes outlived the last cleanup) is cleared and the creation tried once more;
    /// looking for one first would cost every job a `stat` per hierarchy.
    pub fn create_job(&self, job_id: u64, alloc: &Allocation) -> io::Result<Option<JobCgroup>> {
        let limits = plan::job_limits(alloc, self.node_cpus, &self.gpus);
        match self.create(job_id, &limits) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let Some(stale) = self.job_handle(job_id) else {
                    return Err(e);
                };
                warn!(job_id, "clearing a stale cgroup of the same job id");
                destroy_blocking(&stale);
                self.create(job_id, &limits)
            }
            r => r,
        }
    }

    /// The cgroup a step of job `job_id` joins on a node: the job's, made here (without
    /// limits: they are the batch node's) when the job has none yet. `true` when this call
    /// made it. Another step of the job starting here at the same moment may make it first;
    /// then that one is joined, never cleared.
    pub fn job_for_step(&self, job_id: u64) -> io::Result<(Option<JobCgroup>, bool)> {
        if let Some(c) = self.existing_job(job_id) {
            return Ok((Some(c), false));
        }
        let limits = plan::job_limits(&Allocation::default(), self.node_cpus, &self.gpus);
        match self.create(job_id, &limits) {
            Ok(c) => {
                let created = c.is_some();
                Ok((c, created))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Ok((self.existing_job(job_id), false))
            }
            Err(e) => Err(e),
        }
    }

    fn create(&self, job_id: u64, limits: &plan::JobLimits) -> io::Result<Option<JobCgroup>> {
        Ok(match &self.tree {
            None => None,
            Some(Tree::V1(t)) => Some(JobCgroup::V1(t.create_job(job_id, limits)?)),
            // GPUs to hide get an eBPF device program; failing that, an error.
            Some(Tree::V2(t)) => Some(JobCgroup::V2(t.create_job(job_id, limits)?)),
        })
    }

    /// A handle to job `job_id`'s directories, existing or not.
    fn job_handle(&self, job_id: u64) -> Option<JobCgroup> {
        match &self.tree {
            None => None,
            Some(Tree::V1(t)) => Some(JobCgroup::V1(t.job(job_id))),
            Some(Tree::V2(t)) => Some(JobCgroup::V2(t.job(job_id))),
        }
    }

    /// Job `job_id`'s cgroup if it exists on this node (steps of a job whose batch script
    /// runs here join it).
    pub fn existing_job(&self, job_id: u64) -> Option<JobCgroup> {
        match &self.tree {
            None => None,
            Some(Tree::V1(t)) => t.existing_job(job_id).map(JobCgroup::V1),
            Some(Tree::V2(t)) => {
                let job = t.job(job_id);
                job.dir_exists().then_some(JobCgroup::V2(job))
            }
        }
    }

    /// Whether no process of job `job_id` is left in its cgroup on this node: the cgroup is
    /// gone, or its `cgroup.procs` (`tasks` on v1) lists nobody. `true` without cgroups:
    /// the caller judges by process groups then.
    pub fn job_processes_gone(&self, job_id: u64) -> bool {
        self.existing_job(job_id)
            .is_none_or(|c| c.pids().is_empty())
    }

    fn clean_leftovers(&self) {
        let ids = match &self.tree {
            None => return,
            Some(Tree::V1(t)) => t.leftover_jobs(),
            Some(Tree::V2(t)) => t.leftover_jobs(),
        };
        for id in ids {
            let Some(job) = self.job_handle(id) else {
                return;
            };
            info!(
                job_id = id,
                "killing the processes of a job from an earlier worker life"
            );
            destroy_blocking(&job);
        }
    }
}

/// How long a job's processes may take to die before its cgroup is left behind.
const DESTROY_WAIT: Duration = Duration::from_secs(10);
const DESTROY_POLL: Duration = Duration::from_millis(20);

impl JobCgroup {
    fn exists(&self) -> bool {
        match self {
            Self::V1(j) => j.dir_exists(),
            Self::V2(j) => j.dir_exists(),
        }
    }

    /// Creates a step's cgroup; returns the files its processes write themselves into to join
    /// it (`tasks` on v1, see [`v1::Job::add_step`]; `cgroup.procs` on v2).
    pub fn add_step(&self, step: Option<u32>) -> io::Result<Vec<PathBuf>> {
        match self {
            Self::V1(j) => j.add_step(step),
            Self::V2(j) => j.add_step(step),
        }
    }

    pub fn pids(&self) -> Vec<i32> {
        match self {
            Self::V1(j) => j.pids(),
            Self::V2(j) => j.pids(),
        }
    }

    /// Signals every process of the job, those that left its process group included.
    pub fn signal(&self, signal: Signal) -> usize {
        if signal == Signal::SIGKILL {
            self.kill_all();
            return 1;
        }
        match self {
            Self::V1(j) => j.signal(signal),
            Self::V2(j) => j.signal(signal),
        }
    }

    /// Signals the processes of one step (`None`: the batch script's) that left its
    /// process group `pgid` (setsid, setpgid); the caller signals the group itself, which
    /// also reaches a process still on its way into the cgroup. Each process gets the
    /// signal once, so a shell's trap runs once per signal. Other steps are not touched:
    /// they get signals through their own process groups.
    pub fn signal_escaped(&self, step: Option<u32>, pgid: Pid, signal: Signal) -> usize {
        let dirs = match self {
            Self::V1(j) => j.step_dirs(step),
            Self::V2(j) => j.step_dirs(step),
        };
        let mut pids: Vec<i32> = dirs.iter().flat_map(pids_under).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|p| nix::unistd::getpgid(Some(Pid::from_raw(*p))).is_ok_and(|g| g != pgid));
        signal_pids(&pids, signal)
    }

    pub fn kill_all(&self) {
        match self {
            Self::V1(j) => j.kill_all(),
            Self::V2(j) => j.kill_all(),
        }
    }

    /// What the job (`None`) or one of its steps (`Some(None)`: the batch script) used.
    pub fn usage(&self, step: Option<Option<u32>>) -> plan::Usage {
        match self {
            Self::V1(j) => j.usage(step),
            Self::V2(j) => j.usage(step),
        }
    }

    /// Whether the kernel's OOM killer ended a process of the job.
    pub fn out_of_memory(&self) -> bool {
        match self {
            Self::V1(j) => j.oom_kills() > 0,
            Self::V2(j) => j.oom_kills() > 0,
        }
    }

    /// Kills what is left of the job, waits until its cgroup is empty, removes it. Returns
    /// whether it emptied: `false` when processes survived SIGKILL (the cgroup is left
    /// behind, and the node stays held until they are gone).
    pub async fn destroy(&self) -> bool {
        let deadline = tokio::time::Instant::now() + DESTROY_WAIT;
        // Listing the cgroup first: most jobs have no process left by now, and one listing
        // then does.
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                warn!(?pids, "job processes survived SIGKILL; cgroup left behind");
                return false;
            }
            self.kill_all();
            tokio::time::sleep(DESTROY_POLL).await;
        }
        if let Err(e) = self.remove() {
            warn!(error = %e, "cannot remove the job's cgroup");
        }
        true
    }

    /// Ends a step: kills what is left in its cgroup (a task's daemonized children), removes
    /// it, and with `and_job` the job's directories too when no other step uses them (a
    /// node where the job has no batch script).
    pub async fn finish_step(&self, step: Option<u32>, and_job: bool) {
        let dirs = match self {
            Self::V1(j) => j.step_dirs(step),
            Self::V2(j) => j.step_dirs(step),
        };
        let deadline = tokio::time::Instant::now() + DESTROY_WAIT;
        loop {
            let pids: Vec<i32> = dirs.iter().flat_map(pids_under).collect();
            if pids.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                warn!(?pids, "step processes survived SIGKILL; cgroup left behind");
                return;
            }
            signal_pids(&pids, Signal::SIGKILL);
            tokio::time::sleep(DESTROY_POLL).await;
        }
        for d in &dirs {
            let _ = remove_tree(d);
        }
        if and_job {
            let jobs = match self {
                Self::V1(j) => j.dirs(),
                Self::V2(j) => j.dirs(),
            };
            for d in jobs {
                // Another step still running keeps it.
                let _ = d.remove();
            }
        }
    }

    fn remove(&self) -> io::Result<()> {
        match self {
            Self::V1(j) => j.remove(),
            Self::V2(j) => j.remove(),
        }
    }
}

/// [`JobCgroup::destroy`] for the worker's start, before its runtime serves jobs.
fn destroy_blocking(job: &JobCgroup) {
    if !job.exists() {
        return;
    }
    let deadline = std::time::Instant::now() + DESTROY_WAIT;
    while !job.pids().is_empty() && std::time::Instant::now() < deadline {
        job.kill_all();
        std::thread::sleep(DESTROY_POLL);
    }
    if let Err(e) = job.remove() {
        warn!(error = %e, "cannot remove a stale job cgroup");
    }
}

/// The tree `settings` asks for, `Ok(None)` when off, `Err(why)` when unusable.
fn choose(settings: &Settings, node: &str) -> Result<Option<Tree>, String> {
    if settings.mode == Mode::Off {
        return Ok(None);
    }
    let mounts_text = fs::read_to_string("/proc/self/mounts")
        .map_err(|e| format!("cannot read /proc/self/mounts: {e}"))?;
    let self_text = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let mounts = detect::parse_mounts(&mounts_text, &settings.root);
    let me = detect::parse_self_cgroup(&self_text);
    let v2_own = mounts
        .v2
        .as_ref()
        .map(|m| detect::join(m, me.v2.as_deref().unwrap_or("/")));
    let v2_has_memory = v2_own
        .as_ref()
        .and_then(|d| fs::read_to_string(d.join("cgroup.controllers")).ok())
        .is_some_and(|c| c.split_whitespace().any(|x| x == "memory"));
    let use_v2 = match settings.mode {
        Mode::V2 => true,
        Mode::V1 => false,
        _ => v2_has_memory && !mounts.v1.contains_key("memory"),
    };
    if use_v2 {
        let own = v2_own.ok_or_else(|| {
            format!(
                "no cgroup2 file system mounted under {}",
                settings.root.display()
            )
        })?;
        let tree = v2::Tree::prepare(&own, node)
            .map_err(|e| format!("cgroup v2 tree under {} not writable: {e}", own.display()))?;
        return Ok(Some(Tree::V2(tree)));
    }
    if !mounts.v1.contains_key("memory") && settings.mode == Mode::Auto {
        return Err(format!(
            "no cgroup v1 memory hierarchy and no cgroup v2 with the memory controller under {}",
            settings.root.display()
        ));
    }
    let bases: Vec<(v1::Controller, PathBuf)> = v1::Controller::ALL
        .iter()
        .filter_map(|c| {
            let mount = mounts.v1.get(c.name())?;
            let own = me.v1.get(c.name()).map_or("/", String::as_str);
            Some((*c, detect::join(mount, own).join("tandem").join(node)))
        })
        .collect();
    if bases.is_empty() {
        return Err(format!(
            "no cgroup v1 hierarchy mounted under {}",
            settings.root.display()
        ));
    }
    let tree =
        v1::Tree::prepare(bases).map_err(|e| format!("cgroup v1 hierarchies not writable: {e}"))?;
    Ok(Some(Tree::V1(tree)))
}

/// The node's GPU device files (`nvidiaN`, character devices) in `dev_dir`.
pub fn gpu_device_files(dev_dir: &Path) -> Vec<GpuDeviceFile> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(entries) = fs::read_dir(dev_dir) else {
        return Vec::new();
    };
    let mut gpus: Vec<GpuDeviceFile> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let index = plan::gpu_index_of(e.file_name().to_str()?)?;
            let meta = fs::metadata(e.path()).ok()?;
            if !meta.file_type().is_char_device() {
                return None;
            }
            let rdev = meta.rdev();
            Some(GpuDeviceFile {
                index,
                device: CharDevice {
                    major: nix::sys::stat::major(rdev),
                    minor: nix::sys::stat::minor(rdev),
                },
            })
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    gpus
}

/// Job ids of the `job_N` directories in `dir`.
fn job_ids_in(dir: &Dir) -> Vec<u64> {
    dir.list_dirs()
        .iter()
        .filter_map(|n| n.strip_prefix("job_")?.parse().ok())
        .collect()
}

/// `dir` and every directory below it, parents first.
fn dirs_under(dir: &Dir) -> Vec<Dir> {
    let mut out = vec![dir.clone()];
    let mut i = 0;
    while i < out.len() {
        let children = subdirs(&out[i]);
        out.extend(children);
        i += 1;
    }
    out
}

/// The directories in `dir`. A cgroup directory lists every control file of its
/// controllers, so the listing is skipped where the link count tells enough: cgroupfs (like
/// ext4 and tmpfs) counts a directory's subdirectories in it (2 + n), so 2 means none, and
/// 3 with the batch step's directory present means that one alone: a job's usual shape.
/// A count below 2 (file systems that do not keep it) means unknown: list.
fn subdirs(dir: &Dir) -> Vec<Dir> {
    match dir.link_count() {
        None | Some(2) => return Vec::new(),
        Some(3) => {
            let batch = dir.join(plan::step_dir(None).as_str());
            if batch.is_dir() {
                return vec![batch];
            }
        }
        Some(_) => {}
    }
    dir.list_dirs().iter().map(|n| dir.join(n)).collect()
}

/// Every pid in `cgroup.procs` of `dir` and below.
fn pids_under(dir: &Dir) -> Vec<i32> {
    let mut pids: Vec<i32> = dirs_under(dir)
        .iter()
        .filter_map(|d| d.read("cgroup.procs").ok())
        .flat_map(|t| plan::parse_pids(&t))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn signal_pids(pids: &[i32], signal: Signal) -> usize {
    pids.iter()
        .filter(|p| kill(Pid::from_raw(**p), signal).is_ok())
        .count()
}

/// A step's directory: new, or, as `mkdir -p` would, one already there (left behind by an
/// earlier run of a requeued job).
fn create_step(d: &Dir) -> io::Result<()> {
    match d.create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// Removes a cgroup directory and its children, deepest first (cgroupfs removes a
/// directory's control files with it; `rmdir` is all it takes).
fn remove_tree(dir: &Dir) -> io::Result<()> {
    // Almost every job leaves only its batch step's directory (steps remove their own as they
    // end): two `rmdir`s then, and no listing, which in a cgroup directory names every
    // control file and cost more than the removals. Anything else there makes the `rmdir`
    // fail (EBUSY, ENOTEMPTY) and the walk below removes it.
    let _ = dir.join(plan::step_dir(None).as_str()).remove();
    match dir.remove() {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    let mut dirs = dirs_under(dir);
    dirs.reverse();
    for d in dirs {
        d.remove()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_under_finds_every_shape_parents_first() {
        let tmp = tempfile::tempdir().unwrap();
        let base = Dir::open(tmp.path()).unwrap();
        let under = |job: &str| -> Vec<String> {
            dirs_under(&base.join(job))
                .iter()
                .map(|d| {
                    d.path()
                        .strip_prefix(tmp.path())
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        };
        for d in [
            "batch_only/step_batch",
            "step_only/step_0",
            "leaf",
            "nested/step_batch/inner",
            "nested/step_1",
        ] {
            fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        // Files beside the directories (a cgroup's control files) are not directories.
        fs::write(tmp.path().join("batch_only/cgroup.procs"), "").unwrap();
        assert_eq!(under("batch_only"), ["batch_only", "batch_only/step_batch"]);
        assert_eq!(under("step_only"), ["step_only", "step_only/step_0"]);
        assert_eq!(under("leaf"), ["leaf"]);
        let mut nested = under("nested");
        assert_eq!(nested[0], "nested");
        nested[1..3].sort();
        assert_eq!(
            nested,
            [
                "nested",
                "nested/step_1",
                "nested/step_batch",
                "nested/step_batch/inner"
            ]
        );
        assert_eq!(under("missing"), ["missing"]);
    }

    #[test]
    fn finds_leftover_jobs_and_nested_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        for d in ["job_3/step_batch", "job_12", "other", "job_x"] {
            fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        let base = Dir::open(tmp.path()).unwrap();
        let mut ids = job_ids_in(&base);
        ids.sort_unstable();
        assert_eq!(ids, vec![3, 12]);
        let dirs = dirs_under(&base.join("job_3"));
        assert_eq!(dirs.len(), 2);
        remove_tree(&base.join("job_3")).unwrap();
        assert!(!tmp.path().join("job_3").exists());
        // More than the batch step (a step's own cgroups, nested): the walk removes it all.
        for d in [
            "job_4/step_batch",
            "job_4/step_0/inner/deeper",
            "job_4/step_1",
        ] {
            fs::create_dir_all(tmp.path().join(d)).unwrap();
        }
        remove_tree(&base.join("job_4")).unwrap();
        assert!(!tmp.path().join("job_4").exists());
        // Gone already: nothing to do.
        remove_tree(&base.join("job_4")).unwrap();
        remove_tree(&base.join("step_9")).unwrap();
    }

    /// Isolation of node `n1` in v1 hierarchies made of plain directories under `root`.
    fn v1_isolation(root: &Path) -> Isolation {
        Isolation {
            tree: Some(Tree::V1(v1::tree_under(root))),
            node_cpus: 4,
            gpus: Vec::new(),
        }
    }

    #[test]
    fn a_stale_job_directory_is_cleared_and_the_job_created_anew() {
        let tmp = tempfile::tempdir().unwrap();
        let iso = v1_isolation(tmp.path());
        let alloc = Allocation::default();
        iso.create_job(5, &alloc).unwrap().unwrap();
        // The same id again (a requeued job whose cleanup here did not finish): cleared,
        // made anew.
        let stale_step = tmp.path().join("memory/tandem/n1/job_5/step_batch");
        fs::create_dir_all(&stale_step).unwrap();
        iso.create_job(5, &alloc).unwrap().unwrap();
        assert!(!stale_step.exists());
        assert!(tmp.path().join("memory/tandem/n1/job_5").is_dir());
        // One that cannot be cleared is an error, not a cgroup shared with what is left.
        fs::write(tmp.path().join("freezer/tandem/n1/job_5/leftover"), "").unwrap();
        let err = iso.create_job(5, &alloc).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(err.to_string().contains("freezer/tandem/n1/job_5"), "{err}");
    }

    #[test]
    fn a_step_joins_the_jobs_cgroup_and_never_clears_it() {
        let tmp = tempfile::tempdir().unwrap();
        let iso = v1_isolation(tmp.path());
        // The first step on a node without the batch script makes the job's cgroup.
        let (first, created) = iso.job_for_step(6).unwrap();
        assert!(first.is_some() && created);
        first.unwrap().add_step(Some(0)).unwrap();
        let running = tmp.path().join("memory/tandem/n1/job_6/step_0");
        assert!(running.is_dir());
        // A second one joins it; the first step's directory stays.
        let (second, created) = iso.job_for_step(6).unwrap();
        assert!(second.is_some() && !created);
        assert!(running.is_dir());
        // Without cgroups, nothing to join or make.
        let (none, created) = Isolation::off().job_for_step(6).unwrap();
        assert!(none.is_none() && !created);
    }

    #[test]
    fn gpu_device_files_need_char_devices() {
        let tmp = tempfile::tempdir().unwrap();
        // Regular files named like GPUs are not devices.
        fs::write(tmp.path().join("nvidia0"), "").unwrap();
        assert!(gpu_device_files(tmp.path()).is_empty());
        assert!(gpu_device_files(Path::new("/nonexistent-dev")).is_empty());
    }
}
