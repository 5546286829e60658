//! Autoscaling demand: how many workers of one shape the queue needs.
//!
//! Two halves, both pure:
//!
//! - [`Snapshot::capture`] condenses the cluster after a scheduling pass into what any
//!   autoscaling question needs: pending work grouped by identical request
//!   ([`PendingGroup`]: partition, per-node TRES, node count, exclusivity, GPU type,
//!   constraint, with a count), nodes grouped by shape ([`NodeGroup`]), and per-partition
//!   and per-state counts for metrics. One walk over the pending and running sets and the
//!   node table, which the pass walks anyway. An array counts its pending tasks that could
//!   start (its `%N` throttle respected) as one group entry with a count: a million-task
//!   array is one `u64`, never a million objects.
//! - [`demand`] answers for one [`WorkerShape`] (a worker set: partition, GPUs, GPU type,
//!   CPUs, memory, features): the workers the pending jobs that could run on such workers
//!   need, packed first-fit-decreasing over *groups* (see [`pack`]), plus the workers of that
//!   shape that run jobs now.
//!
//! Pending work a new node cannot help is not demand: held jobs, a begin time in the future,
//! dependencies, partition limits (time, node count, down/inactive), QOS and association
//! limits, an array at its throttle, jobs naming nodes with `-w` (a new worker is never the
//! named node). Jobs pending for `Resources` or `Priority` (or not yet looked at by a pass)
//! are demand.
//!
//! Limitations, on purpose: a multi-node job gets fresh workers (its per-node request on
//! each); later single-node work may fill what they leave. A QOS/association limit only
//! stops demand once the pass has reported it as a job's reason (with no nodes, a pass starts
//! nothing, so `MaxJobsPerUser=4` does not yet cap demand at 4 jobs). The worker count
//! saturates at [`MAX_WORKERS`].

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use serde::{Deserialize, Serialize};

use crate::Tres;
use crate::constraint::Constraint;
use crate::job::{Hold, Job, Reason};
use crate::node::{Health, NodeMode, NodeState};
use crate::state::State;

/// Most workers one answer reports; beyond this the answer is "at least this many". Far above
/// any worker set's `maxReplicaCount`, and it keeps the arithmetic in range.
pub const MAX_WORKERS: u64 = 1_000_000;

/// Most bin classes the packer tracks for reuse (see [`pack`]). Bins beyond it are still
/// counted; their leftover capacity is not offered to later jobs.
const MAX_CLASSES: usize = 4096;

/// A worker set's shape, as the scaler's metadata gives it. `None` = not given: that
/// dimension does not limit packing (give `cpus` for CPU-only queues, or every CPU job fits
/// one worker).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerShape {
    pub partition: String,
    pub gpus: Option<u32>,
    /// A job that requires a GPU type fits only a shape of that type.
    pub gpu_type: Option<String>,
    pub cpus: Option<u32>,
    pub mem_mb: Option<u64>,
    /// Node features the workers carry (a job's `--constraint` is matched against them).
    pub features: Vec<String>,
}

/// Identical pending work: `count` jobs (array tasks counted), each asking for `nodes`
/// nodes with `per_node` on each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingGroup {
    pub partition: String,
    pub per_node: Tres,
    pub nodes: u32,
    pub exclusive: bool,
    pub gpu_type: Option<String>,
    pub constraint: Option<Constraint>,
    pub count: u64,
}

/// Nodes alike for matching a worker shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGroup {
    pub partitions: Vec<String>,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub features: Vec<String>,
    /// Nodes of this group.
    pub count: u64,
    /// Of which up (or not yet re-registered) and running at least one job.
    pub busy: u64,
}

/// Node counts by sinfo state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStates {
    pub idle: u64,
    pub mixed: u64,
    pub alloc: u64,
    pub down: u64,
    pub drained: u64,
    pub draining: u64,
    pub unknown: u64,
    /// Holding an ended job's processes (COMPLETING).
    #[serde(default)]
    pub completing: u64,
}

impl NodeStates {
    fn add(&mut self, s: NodeState) {
        let c = match s {
            NodeState::Idle => &mut self.idle,
            NodeState::Mixed => &mut self.mixed,
            NodeState::Allocated => &mut self.alloc,
            NodeState::Down => &mut self.down,
            NodeState::Drained => &mut self.drained,
            NodeState::Draining => &mut self.draining,
            NodeState::Unknown => &mut self.unknown,
            NodeState::Completing => &mut self.completing,
        };
        *c += 1;
    }

    pub fn total(&self) -> u64 {
        self.idle
            + self.mixed
            + self.alloc
            + self.down
            + self.drained
            + self.draining
            + self.unknown
            + self.completing
    }

    /// `(Slurm openmetrics suffix, count)` pairs: `idle`, `mixed`, `alloc`, ...
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("idle", self.idle),
            ("mixed", self.mixed),
            ("alloc", self.alloc),
            ("down", self.down),
            ("drained", self.drained),
            ("draining", self.draining),
            ("unknown", self.unknown),
            ("completing", self.completing),
        ]
    }
}

/// Per-partition counts (Slurm's `slurm_partition_*` family).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStats {
    /// Pending jobs, array tasks counted one by one.
    pub jobs_pending: u64,
    /// Of which held.
    pub jobs_hold: u64,
    pub jobs_running: u64,
    /// Resources the pending jobs ask for in total.
    pub cpus_pending: u64,
    pub gpus_pending: u64,
    pub nodes_pending: u64,
    pub nodes: NodeStates,
}

/// The cluster condensed for autoscaling and metrics; see the module docs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Pending work a new node could run, grouped.
    pub pending: Vec<PendingGroup>,
    pub nodes: Vec<NodeGroup>,
    /// Every configured partition (also those with nothing in them).
    pub partitions: BTreeMap<String, PartitionStats>,
    pub node_states: NodeStates,
    pub nodes_batch: u64,
    pub nodes_kube: u64,
}

/// Whether a pending job's reason is one a new node cannot fix.
fn reason_blocks(r: Reason) -> bool {
    !matches!(r, Reason::None | Reason::Priority | Reason::Resources)
}

/// How many runs of a pending record a new node could start now: 1, or an array's pending
/// tasks up to its throttle; 0 when something other than resources holds it back.
pub fn startable(job: &Job, now: i64) -> u64 {
    if job.hold != Hold::None
        || job.spec.begin.is_some_and(|b| b > now)
        || reason_blocks(job.reason)
        || !job.spec.nodelist.is_empty()
    {
        return 0;
    }
    crate::cycle::start_budget(job)
}

/// FxHash (rustc's multiply-rotate hash): the capture hashes a key per pending job and per
/// node after every pass, where SipHash's DoS resistance buys nothing (keys are the
/// controller's own records, counted, never stored per key from outside).
#[derive(Default)]
struct Fx(u64);

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// Hashes a constraint by value (the type is not `Hash`; its parts are).
#[derive(PartialEq, Eq)]
struct ConstraintKey<'a>(Option<&'a Constraint>);

impl Hash for ConstraintKey<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        match self.0 {
            None => 0u8.hash(h),
            Some(Constraint::All(v)) => (1u8, v).hash(h),
            Some(Constraint::Any(v)) => (2u8, v).hash(h),
        }
    }
}

#[derive(PartialEq, Eq, Hash)]
struct GroupKey<'a> {
    partition: &'a str,
    per_node: Tres,
    nodes: u32,
    exclusive: bool,
    gpu_type: Option<&'a str>,
    constraint: ConstraintKey<'a>,
}

#[derive(PartialEq, Eq, Hash)]
struct NodeKey<'a> {
    partitions: &'a [String],
    gpus: u32,
    gpu_type: Option<&'a str>,
    features: &'a [String],
}

impl Snapshot {
    /// Condenses `st` as it is after a pass at `now`.
    pub fn capture(st: &State, now: i64) -> Snapshot {
        let mut partitions: BTreeMap<String, PartitionStats> = st
            .config()
            .partitions
            .iter()
            .map(|p| (p.name.clone(), PartitionStats::default()))
            .collect();
        let mut groups: FxMap<GroupKey<'_>, u64> = FxMap::default();
        for job in st.pending_jobs() {
            let tasks = job.array.as_ref().map_or(1, |a| a.pending.len());
            // Jobs of a partition removed from the config still show, under its name.
            let p = match partitions.get_mut(&job.spec.partition) {
                Some(p) => p,
                None => partitions.entry(job.spec.partition.clone()).or_default(),
            };
            let total = job.shape.total();
            p.jobs_pending += tasks;
            if job.hold != Hold::None {
                p.jobs_hold += tasks;
            }
            p.cpus_pending = p
                .cpus_pending
                .saturating_add(tasks.saturating_mul(u64::from(total.cpus)));
            p.gpus_pending = p
                .gpus_pending
                .saturating_add(tasks.saturating_mul(u64::from(total.gpus)));
            p.nodes_pending = p
                .nodes_pending
                .saturating_add(tasks.saturating_mul(u64::from(job.shape.nodes)));
            let n = startable(job, now);
            if n == 0 {
                continue;
            }
            let key = GroupKey {
                partition: &job.spec.partition,
                per_node: job.shape.per_node,
                nodes: job.shape.nodes,
                exclusive: job.shape.exclusive,
                gpu_type: job.spec.gpu_type.as_deref(),
                constraint: ConstraintKey(job.spec.constraint.as_deref()),
            };
            let c = groups.entry(key).or_default();
            *c = c.saturating_add(n);
        }
        for job in st.running_jobs() {
            if let Some(p) = partitions.get_mut(&job.spec.partition) {
                p.jobs_running += 1;
            }
        }
        let mut node_groups: FxMap<NodeKey<'_>, (u64, u64)> = FxMap::default();
        // Nodes of one worker set register together and are alike: the previous node's
        // group is checked before hashing.
        let mut prev: Option<NodeKey<'_>> = None;
        let mut prev_count = (0u64, 0u64);
        let mut node_states = NodeStates::default();
        let (mut nodes_batch, mut nodes_kube) = (0, 0);
        for n in st.nodes() {
            let state = n.state();
            node_states.add(state);
            match n.mode {
                NodeMode::Batch => nodes_batch += 1,
                NodeMode::Kube => nodes_kube += 1,
            }
            for pname in &n.partitions {
                if let Some(p) = partitions.get_mut(pname) {
                    p.nodes.add(state);
                }
            }
            let key = NodeKey {
                partitions: &n.partitions,
                gpus: n.total.gpus,
                gpu_type: n.gpu_type.as_deref(),
                features: &n.features,
            };
            if prev.as_ref() != Some(&key) {
                if let Some(k) = prev.take() {
                    let g = node_groups.entry(k).or_default();
                    g.0 += prev_count.0;
                    g.1 += prev_count.1;
                }
                prev = Some(key);
                prev_count = (0, 0);
            }
            prev_count.0 += 1;
            if n.health != Health::Down && !n.is_empty() {
                prev_count.1 += 1;
            }
        }
        if let Some(k) = prev {
            let g = node_groups.entry(k).or_default();
            g.0 += prev_count.0;
            g.1 += prev_count.1;
        }
        let mut pending: Vec<PendingGroup> = groups
            .into_iter()
            .map(|(k, count)| PendingGroup {
                partition: k.partition.to_owned(),
                per_node: k.per_node,
                nodes: k.nodes,
                exclusive: k.exclusive,
                gpu_type: k.gpu_type.map(str::to_owned),
                constraint: k.constraint.0.cloned(),
                count,
            })
            .collect();
        // Deterministic order (the map's is not): answers must not depend on hashing.
        pending.sort_by(|a, b| {
            (
                &a.partition,
                a.nodes,
                a.per_node.gpus,
                a.per_node.cpus,
                a.per_node.mem_mb,
            )
                .cmp(&(
                    &b.partition,
                    b.nodes,
                    b.per_node.gpus,
                    b.per_node.cpus,
                    b.per_node.mem_mb,
                ))
                .then(a.exclusive.cmp(&b.exclusive))
                .then(a.gpu_type.cmp(&b.gpu_type))
                .then(
                    a.constraint
                        .as_ref()
                        .map(|c| c.to_string())
                        .cmp(&b.constraint.as_ref().map(|c| c.to_string())),
                )
        });
        let mut nodes: Vec<NodeGroup> = node_groups
            .into_iter()
            .map(|(k, (count, busy))| NodeGroup {
                partitions: k.partitions.to_vec(),
                gpus: k.gpus,
                gpu_type: k.gpu_type.map(str::to_owned),
                features: k.features.to_vec(),
                count,
                busy,
            })
            .collect();
        nodes.sort_by(|a, b| {
            (&a.partitions, a.gpus, &a.gpu_type, &a.features).cmp(&(
                &b.partitions,
                b.gpus,
                &b.gpu_type,
                &b.features,
            ))
        });
        Snapshot {
            pending,
            nodes,
            partitions,
            node_states,
            nodes_batch,
            nodes_kube,
        }
    }

    pub fn has_partition(&self, name: &str) -> bool {
        self.partitions.contains_key(name)
    }
}

/// What a worker shape is asked for; see [`demand`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShapeDemand {
    /// Workers of the shape running jobs now (nodes of the partition with that GPU count,
    /// GPU type and features, up, with at least one job).
    pub busy: u64,
    /// Workers the pending jobs that fit the shape need, on top of the busy ones.
    pub pending: u64,
    /// Pending jobs (array tasks counted) that fit the shape.
    pub jobs_fitting: u64,
    /// Pending jobs of the partition that no worker of this shape could ever run (too big,
    /// other GPU type, missing features).
    pub jobs_unfit: u64,
}

impl ShapeDemand {
    /// Workers the set should have: the busy ones plus those the queue needs, capped at
    /// [`MAX_WORKERS`]. With a target of 1 per worker, KEDA's HPA sets replicas to this.
    pub fn workers(&self) -> u64 {
        self.busy.saturating_add(self.pending).min(MAX_WORKERS)
    }

    /// Scale-to-zero only when nothing waits for and nothing runs on such workers.
    pub fn active(&self) -> bool {
        self.workers() > 0
    }
}

/// A worker's capacity; `u64::MAX` = not limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cap {
    cpus: u64,
    mem_mb: u64,
    gpus: u64,
}

impl Cap {
    pub(crate) fn of(shape: &WorkerShape) -> Cap {
        Cap {
            cpus: shape.cpus.map_or(u64::MAX, u64::from),
            mem_mb: shape.mem_mb.unwrap_or(u64::MAX),
            gpus: shape.gpus.map_or(u64::MAX, u64::from),
        }
    }

    fn fits(&self, t: &Tres) -> bool {
        u64::from(t.cpus) <= self.cpus && t.mem_mb <= self.mem_mb && u64::from(t.gpus) <= self.gpus
    }

    /// How many `t` fit; `u64::MAX` when `t` asks for nothing this cap limits.
    fn how_many(&self, t: &Tres) -> u64 {
        let mut k = u64::MAX;
        for (have, need) in [
            (self.cpus, u64::from(t.cpus)),
            (self.mem_mb, t.mem_mb),
            (self.gpus, u64::from(t.gpus)),
        ] {
            if need > 0 && have != u64::MAX {
                k = k.min(have / need);
            }
        }
        k
    }

    /// `self` less `k` times `t` (unlimited dimensions stay unlimited).
    fn less(&self, t: &Tres, k: u64) -> Cap {
        let sub = |have: u64, need: u64| {
            if have == u64::MAX {
                have
            } else {
                have.saturating_sub(need.saturating_mul(k))
            }
        };
        Cap {
            cpus: sub(self.cpus, u64::from(t.cpus)),
            mem_mb: sub(self.mem_mb, t.mem_mb),
            gpus: sub(self.gpus, u64::from(t.gpus)),
        }
    }

    const ZERO: Cap = Cap {
        cpus: 0,
        mem_mb: 0,
        gpus: 0,
    };
}

/// Whether one node of `shape` could ever run `g`'s per-node part.
fn fits_shape(g: &PendingGroup, shape: &WorkerShape, cap: &Cap) -> bool {
    if g.partition != shape.partition || !cap.fits(&g.per_node) {
        return false;
    }
    if let Some(t) = &g.gpu_type
        && shape.gpu_type.as_deref() != Some(t.as_str())
    {
        return false;
    }
    if let Some(c) = &g.constraint
        && !c.matches(&shape.features)
    {
        return false;
    }
    true
}

/// Whether a node group is made of workers of `shape`.
fn node_is_shape(n: &NodeGroup, shape: &WorkerShape) -> bool {
    n.partitions.contains(&shape.partition)
        && shape.gpus.is_none_or(|g| g == n.gpus)
        && shape
            .gpu_type
            .as_ref()
            .is_none_or(|t| n.gpu_type.as_ref() == Some(t))
        && shape.features.iter().all(|f| n.features.contains(f))
}

/// The demand for workers of `shape` in `snap`.
pub fn demand(snap: &Snapshot, shape: &WorkerShape) -> ShapeDemand {
    let cap = Cap::of(shape);
    let mut out = ShapeDemand::default();
    let mut items: Vec<Item> = Vec::new();
    for g in snap
        .pending
        .iter()
        .filter(|g| g.partition == shape.partition)
    {
        if fits_shape(g, shape, &cap) {
            out.jobs_fitting = out.jobs_fitting.saturating_add(g.count);
            items.push(Item {
                per_node: g.per_node,
                nodes: g.nodes.max(1),
                exclusive: g.exclusive,
                count: g.count,
            });
        } else {
            out.jobs_unfit = out.jobs_unfit.saturating_add(g.count);
        }
    }
    out.pending = pack(cap, &mut items);
    out.busy = snap
        .nodes
        .iter()
        .filter(|n| node_is_shape(n, shape))
        .map(|n| n.busy)
        .sum();
    out
}

/// `count` identical jobs for [`pack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub per_node: Tres,
    pub nodes: u32,
    pub exclusive: bool,
    pub count: u64,
}

/// Bins alike: `mult` workers each with `free` left.
#[derive(Clone, Copy, Debug)]
struct Class {
    free: Cap,
    mult: u64,
}

/// First-fit-decreasing bin count over groups of identical items, without expanding them.
///
/// Items go in decreasing order (node count, then GPUs, CPUs, memory per node). A job of
/// `nodes > 1`, or an exclusive one, opens `nodes` fresh workers per job (each keeps what
/// the job leaves, unless exclusive). A single-node item fills the existing workers in
/// creation order, each to as many copies as fit, then opens new ones. Workers are kept as
/// runs of identical workers (classes, in creation order), so a group of `c` copies costs
/// O(classes), not O(c): the result equals item-by-item first fit with the same order
/// (the property test checks this). Every item must fit `cap` (see [`demand`]).
pub(crate) fn pack(cap: Cap, items: &mut [Item]) -> u64 {
    items.sort_by(|a, b| {
        let key = |i: &Item| (i.nodes, i.per_node.gpus, i.per_node.cpus, i.per_node.mem_mb);
        key(b).cmp(&key(a)).then(b.exclusive.cmp(&a.exclusive))
    });
    let mut classes: Vec<Class> = Vec::new();
    let mut overflow: u64 = 0;
    let mut total: u64 = 0;
    let add = |classes: &mut Vec<Class>, overflow: &mut u64, c: Class| {
        if c.mult == 0 {
            return;
        }
        if let Some(last) = classes.last_mut()
            && last.free == c.free
        {
            last.mult = last.mult.saturating_add(c.mult);
        } else if classes.len() < MAX_CLASSES {
            classes.push(c);
        } else {
            *overflow = overflow.saturating_add(c.mult);
        }
    };
    for it in items.iter() {
        if it.count == 0 {
            continue;
        }
        if total >= MAX_WORKERS {
            break;
        }
        if it.nodes > 1 || it.exclusive {
            let n = it.count.saturating_mul(u64::from(it.nodes));
            let free = if it.exclusive {
                Cap::ZERO
            } else {
                cap.less(&it.per_node, 1)
            };
            total = total.saturating_add(n);
            add(&mut classes, &mut overflow, Class { free, mult: n });
            continue;
        }
        let mut left = it.count;
        let mut next: Vec<Class> = Vec::with_capacity(classes.len() + 2);
        for c in classes.drain(..) {
            if left == 0 {
                next.push(c);
                continue;
            }
            let k = c.free.how_many(&it.per_node);
            if k == 0 {
                next.push(c);
                continue;
            }
            let take = left.min(k.saturating_mul(c.mult));
            left -= take;
            let full = take / k;
            let rem = take % k;
            let mut parts = [
                Class {
                    free: c.free.less(&it.per_node, k),
                    mult: full,
                },
                Class {
                    free: c.free.less(&it.per_node, rem),
                    mult: u64::from(rem > 0),
                },
                Class {
                    free: c.free,
                    mult: c.mult - full - u64::from(rem > 0),
                },
            ];
            for p in parts.iter_mut() {
                add(&mut next, &mut overflow, *p);
            }
        }
        classes = next;
        if left > 0 {
            let k = cap.how_many(&it.per_node).max(1);
            let full = left / k;
            let rem = left % k;
            total = total.saturating_add(full + u64::from(rem > 0));
            add(
                &mut classes,
                &mut overflow,
                Class {
                    free: cap.less(&it.per_node, k),
                    mult: full,
                },
            );
            add(
                &mut classes,
                &mut overflow,
                Class {
                    free: cap.less(&it.per_node, rem),
                    mult: u64::from(rem > 0),
                },
            );
        }
    }
    total.min(MAX_WORKERS)
}

#[cfg(test)]
mod tests;
