//! The time partition, judged from the processes: a harness node never runs a batch job's
//! process and a (non-Tandem) pod's container process at the same moment.
//!
//! [`bridgekit`](crate::bridgekit)'s `PartitionWatch` judges from what the controller and
//! the API server say; this checker reads `/proc`, so it also sees what they do not: a pod
//! whose object is gone while its containers still run, a job whose processes outlive its
//! record, a kill that missed a process.
//!
//! # Marks
//! The harness runs several "nodes" on one machine, so a process's node comes from marks
//! the harness (never the product) puts in the environment of what it starts:
//! - the process kubelet starts every container with [`NODE_VAR`] (`<harness>/<node>`),
//!   [`POD_VAR`] (`<namespace>/<pod>/<container>`) and [`POD_OWNER_VAR`] (the pod's
//!   `app.kubernetes.io/managed-by` and `.../component` labels, so Tandem's own controller,
//!   worker and login pods can be told apart);
//! - the bridge kit starts each `tandem worker` with [`NODE_VAR`] naming its node.
//!
//! `<harness>` is one [`InvariantChecker`]'s id: tests run in parallel threads of one
//! process, often with the same node names, and each checker counts only its own.
//!
//! # What is what
//! - A **batch process** has `SLURM_JOB_ID` in its environment: the worker starts batch
//!   scripts and step tasks with exactly the job's environment, which always has it, and
//!   every process they start inherits it. Its node is that of its nearest ancestor without
//!   `SLURM_JOB_ID` (the worker, or the worker pod's container), read from that ancestor's
//!   [`NODE_VAR`]: never its own marks, which are the submitter's (`sbatch` exports its
//!   environment; from a login pod that includes the login pod's marks). Once known, a
//!   process keeps its node, so a job orphaned by a killed worker (reparented to init) and
//!   its later children stay attributed.
//! - A **pod process** has [`POD_VAR`] and no `SLURM_JOB_ID`; its node is its own
//!   [`NODE_VAR`]. Processes of Tandem's own pods ([`tandem_owned`]) are Tandem workers,
//!   which legitimately run on any node, and are not counted.
//! - Zombies are not counted: they hold nothing.
//!
//! # Sampling
//! One thread per test process samples every [`PERIOD`] for every live checker: it lists
//! `/proc` and reads each process's `stat` (parent, state, start time); `environ` and
//! `cmdline` only for a process not seen before, one whose command changed (an `exec`) and,
//! for [`FRESH`] after it was first seen, on every sample (a child between `fork` and
//! `exec` still shows its parent's environment). A sample that finds both kinds on one
//! node reads the `stat` of every process involved again: each was alive when first read
//! and again after all reads, so all were alive at the same moment (the latest first read)
//! and a violation is never an artefact of a scan that is not instantaneous. The thread
//! ends when the last checker stops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

/// The harness node of a process: `<harness>/<node>`.
pub const NODE_VAR: &str = "TANDEM_E2E_NODE";
/// The container a process belongs to: `<namespace>/<pod>/<container>`.
pub const POD_VAR: &str = "TANDEM_E2E_POD";
/// The pod's `app.kubernetes.io/managed-by` and `app.kubernetes.io/component` labels,
/// `<managed-by>/<component>` (empty where a label is absent).
pub const POD_OWNER_VAR: &str = "TANDEM_E2E_POD_OWNER";
/// What makes a process a batch job's (the worker sets it in every job process).
pub const JOB_VAR: &str = "SLURM_JOB_ID";

/// How often the processes are sampled.
pub const PERIOD: Duration = Duration::from_millis(50);
/// How long after a process is first seen its environment is read on every sample.
pub const FRESH: Duration = Duration::from_secs(1);
/// Distinct (node, batch process, pod process) violations kept; more are only counted.
const MAX_VIOLATIONS: usize = 100;
/// Ancestors walked to find a batch process's node (a deeper tree is not a job's).
const MAX_DEPTH: usize = 64;
/// Characters of a command line kept for a report.
const CMDLINE_CHARS: usize = 200;

/// The operator's `app.kubernetes.io/managed-by` value and the components whose pods are
/// Tandem's own: they run the batch side itself, on any node.
const TANDEM_MANAGER: &str = "tandem-operator";
const TANDEM_COMPONENTS: [&str; 3] = ["controller", "worker", "login"];

/// The marks the process kubelet gives one container's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerMark {
    /// `<harness>/<node>`.
    pub node: String,
    /// `<namespace>/<pod>/<container>`.
    pub pod: String,
    /// `<managed-by>/<component>`.
    pub owner: String,
}

impl ContainerMark {
    /// The mark of container `container` of pod `namespace/pod` (with `labels`) on `node`
    /// of the harness `harness`.
    pub fn new(
        harness: &str,
        node: &str,
        namespace: &str,
        pod: &str,
        container: &str,
        labels: Option<&BTreeMap<String, String>>,
    ) -> Self {
        let label = |k: &str| {
            labels
                .and_then(|l| l.get(k))
                .map(String::as_str)
                .unwrap_or("")
        };
        Self {
            node: format!("{harness}/{node}"),
            pod: format!("{namespace}/{pod}/{container}"),
            owner: format!(
                "{}/{}",
                label("app.kubernetes.io/managed-by"),
                label("app.kubernetes.io/component")
            ),
        }
    }

    /// The environment variables that carry the mark.
    pub fn env(&self) -> [(String, String); 3] {
        [
            (NODE_VAR.to_owned(), self.node.clone()),
            (POD_VAR.to_owned(), self.pod.clone()),
            (POD_OWNER_VAR.to_owned(), self.owner.clone()),
        ]
    }
}

/// The [`NODE_VAR`] entry that places a process (and, for a worker, its jobs) on `node` of
/// the harness `harness`.
pub fn node_mark(harness: &str, node: &str) -> (&'static str, String) {
    (NODE_VAR, format!("{harness}/{node}"))
}

/// Whether a pod with this [`POD_OWNER_VAR`] value is one of Tandem's own (controller,
/// worker, login), whose processes are the batch side itself, or the bridge's GPU holder
/// (`sleep`, holding a batch node's GPUs: no user code).
pub fn tandem_owned(owner: &str) -> bool {
    owner.split_once('/').is_some_and(|(by, comp)| {
        (by == TANDEM_MANAGER && TANDEM_COMPONENTS.contains(&comp))
            || (by == "tandem-bridge" && comp == "gpu-holder")
    })
}

// === the record of one checker ===

/// One process of a violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    pub pid: u32,
    /// The job id (batch) or `<namespace>/<pod>/<container>` (pod).
    pub what: String,
    pub cmdline: String,
}

/// A batch process and a pod process seen on one node at the same moment, over one or more
/// samples.
#[derive(Debug, Clone)]
pub struct Violation {
    pub node: String,
    pub batch: Side,
    pub pod: Side,
    pub first: Timestamp,
    pub last: Timestamp,
    /// Since the checker started.
    pub first_ms: u128,
    pub last_ms: u128,
    pub samples: u64,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {}: batch job {} (pid {}: {}) and pod container {} (pid {}: {}) ran at once, \
             first seen {} (+{} ms), last seen {} (+{} ms), in {} samples",
            self.node,
            self.batch.what,
            self.batch.pid,
            self.batch.cmdline,
            self.pod.what,
            self.pod.pid,
            self.pod.cmdline,
            self.first,
            self.first_ms,
            self.last,
            self.last_ms,
            self.samples
        )
    }
}

/// What a checker saw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Samples taken since the checker started.
    pub samples: u64,
    /// Nodes seen running batch processes, and pod processes (at any time).
    pub batch_nodes: BTreeSet<String>,
    pub pod_nodes: BTreeSet<String>,
    pub violations: Vec<Violation>,
    /// Violations beyond the [`MAX_VIOLATIONS`] kept.
    pub more: u64,
    /// The longest one sample took (its cost).
    pub slowest: Duration,
}

impl Report {
    /// The failure message, if any violation was seen.
    pub fn failure(&self) -> Option<String> {
        if self.violations.is_empty() && self.more == 0 {
            return None;
        }
        let mut msg = format!(
            "the time partition was broken: a node ran a batch job and a pod that is not a \
             Tandem worker at the same moment ({} samples of /proc):\n",
            self.samples
        );
        for v in &self.violations {
            msg += &format!("  {v}\n");
        }
        if self.more > 0 {
            msg += &format!("  ... and {} more\n", self.more);
        }
        Some(msg)
    }

    /// Panics with every violation, if any was seen.
    pub fn assert_none(&self) {
        if let Some(msg) = self.failure() {
            panic!("{msg}");
        }
    }
}

#[derive(Debug)]
struct Record {
    started: Instant,
    report: Report,
    /// Index in `report.violations` of each (node, batch pid, pod pid) kept.
    index: HashMap<(String, u32, u32), usize>,
    /// Set when the checker stops: a sample in flight then writes nothing.
    closed: bool,
}

impl Record {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            report: Report::default(),
            index: HashMap::new(),
            closed: false,
        }
    }

    fn add(&mut self, node: &str, batch: &Side, pod: &Side, at: (Instant, Timestamp)) {
        let ms = at.0.saturating_duration_since(self.started).as_millis();
        let key = (node.to_owned(), batch.pid, pod.pid);
        if let Some(&i) = self.index.get(&key) {
            let v = &mut self.report.violations[i];
            v.last = at.1;
            v.last_ms = ms;
            v.samples += 1;
            return;
        }
        if self.report.violations.len() >= MAX_VIOLATIONS {
            self.report.more += 1;
            return;
        }
        self.index.insert(key, self.report.violations.len());
        self.report.violations.push(Violation {
            node: node.to_owned(),
            batch: batch.clone(),
            pod: pod.clone(),
            first: at.1,
            last: at.1,
            first_ms: ms,
            last_ms: ms,
            samples: 1,
        });
    }
}

// === the shared sampler ===

#[derive(Default)]
struct Registry {
    /// Live checkers by harness id.
    checkers: BTreeMap<String, Arc<Mutex<Record>>>,
    /// Whether the sampling thread runs (it clears this, under the lock, as it ends).
    running: bool,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    checkers: BTreeMap::new(),
    running: false,
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock(r: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    r.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Watches the processes of one harness (a [`crate::testkit::TestCluster`]) for a node
/// running batch work and a pod at once, from its start until it is stopped or dropped.
#[derive(Debug)]
pub struct InvariantChecker {
    harness: String,
    record: Arc<Mutex<Record>>,
}

impl InvariantChecker {
    /// Starts checking the processes marked with a new harness id ([`Self::harness`]).
    pub fn start() -> Self {
        let harness = format!("h{:016x}", rand::random::<u64>());
        let record = Arc::new(Mutex::new(Record::new()));
        let mut reg = registry();
        reg.checkers.insert(harness.clone(), record.clone());
        if !reg.running {
            match std::thread::Builder::new()
                .name("tandem-e2e-invariant".into())
                .spawn(sample_loop)
            {
                Ok(_) => reg.running = true,
                // Without the thread nothing is sampled; the checker's tests catch that
                // (`samples` stays 0), and a harness that cannot spawn a thread fails soon.
                Err(e) => tracing::error!(error = %e, "cannot start the invariant sampler"),
            }
        }
        Self { harness, record }
    }

    /// The id in this harness's marks.
    pub fn harness(&self) -> &str {
        &self.harness
    }

    /// The [`NODE_VAR`] entry that places a process (and, for a worker, its jobs) on
    /// `node` of this harness.
    pub fn node_env(&self, node: &str) -> (&'static str, String) {
        node_mark(&self.harness, node)
    }

    /// What was seen so far.
    pub fn report(&self) -> Report {
        lock(&self.record).report.clone()
    }

    /// Waits (at most `timeout`) until the report satisfies `cond`, sampling going on; the
    /// last report either way.
    pub async fn until(&self, timeout: Duration, cond: impl Fn(&Report) -> bool) -> Report {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let r = self.report();
            if cond(&r) || tokio::time::Instant::now() >= deadline {
                return r;
            }
            tokio::time::sleep(PERIOD).await;
        }
    }

    /// Stops sampling for this harness (for good; a second call changes nothing); what was
    /// seen.
    pub fn finish(&self) -> Report {
        registry().checkers.remove(&self.harness);
        let mut r = lock(&self.record);
        r.closed = true;
        r.report.clone()
    }
}

impl Drop for InvariantChecker {
    fn drop(&mut self) {
        self.finish();
    }
}

fn sample_loop() {
    let mut table = ProcTable::default();
    loop {
        let checkers: Vec<(String, Arc<Mutex<Record>>)> = {
            let mut reg = registry();
            if reg.checkers.is_empty() {
                reg.running = false;
                return;
            }
            reg.checkers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let began = Instant::now();
        table.scan(Path::new("/proc"), began);
        let found = table.classify();
        for (harness, record) in checkers {
            let mine: Vec<&Held> = found.iter().filter(|h| h.harness == harness).collect();
            let overlaps = confirmed_overlaps(Path::new("/proc"), &mine);
            let at = (Instant::now(), Timestamp::now());
            let took = began.elapsed();
            let mut r = lock(&record);
            if r.closed {
                continue;
            }
            r.report.samples += 1;
            r.report.slowest = r.report.slowest.max(took);
            for h in &mine {
                let nodes = match h.kind {
                    Kind::Batch => &mut r.report.batch_nodes,
                    Kind::Pod => &mut r.report.pod_nodes,
                };
                if !nodes.contains(&h.node) {
                    nodes.insert(h.node.clone());
                }
            }
            for (node, batch, pod) in &overlaps {
                r.add(node, batch, pod, at);
            }
        }
        std::thread::sleep(PERIOD.saturating_sub(began.elapsed()));
    }
}

// === /proc ===

/// What `/proc/<pid>/stat` says that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    comm: String,
    ppid: u32,
    /// Zombie or dead: holds nothing any more.
    gone: bool,
    /// Start time (clock ticks after boot): with the pid, a process's identity.
    start: u64,
}

/// Parses a `stat` line; the command may itself hold spaces and parentheses.
fn parse_stat(line: &str) -> Option<Stat> {
    let (head, rest) = line.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state (field 3 of proc(5)), ppid (4), ..., starttime (22).
    let state = fields.first()?;
    Some(Stat {
        comm,
        ppid: fields.get(1)?.parse().ok()?,
        gone: matches!(*state, "Z" | "X" | "x"),
        start: fields.get(19)?.parse().ok()?,
    })
}

fn read_stat(proc_root: &Path, pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text)
}

/// The marks in one process's environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Marks {
    job: Option<String>,
    node: Option<String>,
    pod: Option<String>,
    owner: Option<String>,
}

fn parse_environ(environ: &[u8]) -> Marks {
    let mut m = Marks::default();
    for kv in environ.split(|b| *b == 0) {
        let Some(eq) = kv.iter().position(|b| *b == b'=') else {
            continue;
        };
        let slot = match &kv[..eq] {
            k if k == JOB_VAR.as_bytes() => &mut m.job,
            k if k == NODE_VAR.as_bytes() => &mut m.node,
            k if k == POD_VAR.as_bytes() => &mut m.pod,
            k if k == POD_OWNER_VAR.as_bytes() => &mut m.owner,
            _ => continue,
        };
        *slot = Some(String::from_utf8_lossy(&kv[eq + 1..]).into_owned());
    }
    m
}

fn cmdline_of(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).replace('\0', " ");
    let text = text.trim();
    match text.char_indices().nth(CMDLINE_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

#[derive(Debug, Clone)]
struct Entry {
    stat: Stat,
    first_seen: Instant,
    marks: Marks,
    cmdline: String,
    /// A batch process's node once resolved (`<harness>/<node>`); kept for its life.
    batch_node: Option<String>,
}

/// Every process of the machine, as of the last scan.
#[derive(Debug, Default)]
struct ProcTable {
    procs: HashMap<u32, Entry>,
}

impl ProcTable {
    fn scan(&mut self, root: &Path, now: Instant) {
        let Ok(dir) = std::fs::read_dir(root) else {
            tracing::warn!(root = %root.display(), "cannot list processes");
            return;
        };
        let mut next = HashMap::with_capacity(self.procs.len() + 16);
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // Gone since the listing: nothing to count.
            let Some(stat) = read_stat(root, pid) else {
                continue;
            };
            let prev = self
                .procs
                .remove(&pid)
                .filter(|old| old.stat.start == stat.start);
            let entry = match prev {
                Some(mut old)
                    if old.stat.comm == stat.comm
                        && now.saturating_duration_since(old.first_seen) > FRESH =>
                {
                    old.stat = stat;
                    old
                }
                prev => {
                    let dir = root.join(pid.to_string());
                    // An unreadable environment (a kernel thread, another user's process)
                    // carries no mark.
                    let marks = std::fs::read(dir.join("environ"))
                        .map(|e| parse_environ(&e))
                        .unwrap_or_default();
                    let cmdline = std::fs::read(dir.join("cmdline"))
                        .map(|c| cmdline_of(&c))
                        .unwrap_or_default();
                    let (first_seen, batch_node) = match prev {
                        Some(old) => (
                            old.first_seen,
                            old.batch_node.filter(|_| marks.job.is_some()),
                        ),
                        None => (now, None),
                    };
                    Entry {
                        stat,
                        first_seen,
                        marks,
                        cmdline,
                        batch_node,
                    }
                }
            };
            next.insert(pid, entry);
        }
        self.procs = next;
    }

    /// The node of batch process `pid`: a known one, else that of its nearest ancestor
    /// without a job (the worker), walking up through batch ancestors (their own known node
    /// first).
    fn batch_node_of(&self, pid: u32) -> Option<String> {
        let mut cur = self.procs.get(&pid)?;
        for _ in 0..MAX_DEPTH {
            if cur.marks.job.is_none() {
                return cur.marks.node.clone();
            }
            if let Some(n) = &cur.batch_node {
                return Some(n.clone());
            }
            cur = self.procs.get(&cur.stat.ppid)?;
        }
        None
    }

    /// Every live batch and (non-Tandem) pod process with a known node; batch processes
    /// keep the node found.
    fn classify(&mut self) -> Vec<Held> {
        let resolved: Vec<(u32, String)> = self
            .procs
            .iter()
            .filter(|(_, e)| e.marks.job.is_some() && e.batch_node.is_none())
            .filter_map(|(pid, _)| self.batch_node_of(*pid).map(|n| (*pid, n)))
            .collect();
        for (pid, node) in resolved {
            if let Some(e) = self.procs.get_mut(&pid) {
                e.batch_node = Some(node);
            }
        }
        let mut out = Vec::new();
        for (pid, e) in &self.procs {
            if e.stat.gone {
                continue;
            }
            let (kind, mark, what) = match (&e.marks.job, &e.marks.pod) {
                (Some(job), _) => match &e.batch_node {
                    Some(n) => (Kind::Batch, n, job),
                    None => {
                        tracing::debug!(pid, job, "a batch process with no known node");
                        continue;
                    }
                },
                (None, Some(pod)) => {
                    if e.marks.owner.as_deref().is_some_and(tandem_owned) {
                        continue;
                    }
                    let Some(n) = &e.marks.node else {
                        continue;
                    };
                    (Kind::Pod, n, pod)
                }
                (None, None) => continue,
            };
            let Some((harness, node)) = mark.split_once('/') else {
                continue;
            };
            out.push(Held {
                harness: harness.to_owned(),
                node: node.to_owned(),
                kind,
                side: Side {
                    pid: *pid,
                    what: what.clone(),
                    cmdline: e.cmdline.clone(),
                },
                start: e.stat.start,
            });
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Batch,
    Pod,
}

/// One counted process of one sample.
#[derive(Debug, Clone)]
struct Held {
    harness: String,
    node: String,
    kind: Kind,
    side: Side,
    start: u64,
}

/// The (node, batch, pod) pairs of `held` (one harness) that shared a node, each process
/// read again after the whole scan and still alive with the same identity (so all were
/// alive at one moment).
fn confirmed_overlaps(root: &Path, held: &[&Held]) -> Vec<(String, Side, Side)> {
    let mut by_node: BTreeMap<&str, (Vec<&Held>, Vec<&Held>)> = BTreeMap::new();
    for h in held {
        let slot = by_node.entry(&h.node).or_default();
        match h.kind {
            Kind::Batch => slot.0.push(h),
            Kind::Pod => slot.1.push(h),
        }
    }
    let still =
        |h: &Held| read_stat(root, h.side.pid).is_some_and(|s| !s.gone && s.start == h.start);
    let mut out = Vec::new();
    for (node, (batch, pods)) in by_node {
        if batch.is_empty() || pods.is_empty() {
            continue;
        }
        let batch: Vec<&Held> = batch.into_iter().filter(|h| still(h)).collect();
        let pods: Vec<&Held> = pods.into_iter().filter(|h| still(h)).collect();
        for b in &batch {
            for p in &pods {
                out.push((node.to_owned(), b.side.clone(), p.side.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
