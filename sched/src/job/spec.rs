//! What a user asks for: [`JobSpec`] (the scheduling half of `sbatch`'s options), its
//! intrinsic validation ([`SpecError`], the bounds on counts), and its resolution against a
//! partition's largest node into a per-node request ([`Shape`]). Nothing here looks at the
//! cluster's state; the controller validates a spec before anything else.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Tres;
use crate::array::ArraySpec;
use crate::constraint::Constraint;
use crate::dependency::Dependency;
use crate::node::NodeMode;
use crate::time::MAX_DURATION_S;

/// Upper bounds on counts in a spec: large enough for any real cluster, small enough that
/// every product of them fits the integer types used in the arithmetic.
pub const MAX_NODES_PER_JOB: u32 = 100_000;
pub const MAX_TASKS_PER_JOB: u32 = 10_000_000;
pub const MAX_CPUS_PER_TASK: u32 = 100_000;
pub const MAX_GPUS_PER_JOB: u32 = 1_000_000;
pub const MAX_NAME_LEN: usize = 256;
pub const MAX_NICE: i32 = 10_000;

/// What a user asked for: the scheduling half of `sbatch`'s options.
///
/// "Not given" is `0`, `None` or empty, so the controller's proto conversion is direct.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    /// Empty: the user's default account (see `ClusterConfig::users`), else `root`.
    pub account: String,
    /// Empty: the default partition.
    pub partition: String,
    /// Empty: the default QOS (`normal`).
    pub qos: String,
    /// Seconds. `None` = not given: the partition's DefaultTime, else its MaxTime, else no
    /// limit. (`--time=UNLIMITED` therefore also falls back to the partition's limits.)
    pub time_limit: Option<u64>,
    /// `-N` minimum; 0 = not given (derived from tasks and GPUs).
    pub nodes_min: u32,
    /// `-N min-max`; 0 = same as the minimum. Tandem allocates the minimum.
    pub nodes_max: u32,
    /// `-n`; 0 = one task per node.
    pub ntasks: u32,
    pub ntasks_per_node: u32,
    /// `-c`; 0 = 1.
    pub cpus_per_task: u32,
    pub mem_per_node_mb: Option<u64>,
    pub mem_per_cpu_mb: Option<u64>,
    /// `-G`: total GPUs, spread evenly over the nodes (rounded up per node).
    pub gpus: u32,
    pub gpus_per_node: u32,
    pub gpus_per_task: u32,
    /// Required GPU type (`--gres=gpu:h100:8`, `--gpus=h100:8`).
    pub gpu_type: Option<String>,
    /// Whole nodes.
    pub exclusive: bool,
    pub constraint: Option<Box<Constraint>>,
    /// `-w`: nodes that must be part of the allocation (expanded names).
    pub nodelist: Vec<String>,
    /// `-x`: nodes that must not be used.
    pub exclude: Vec<String>,
    pub dependency: Option<Box<Dependency>>,
    pub array: Option<Box<ArraySpec>>,
    /// Submitted held (`--hold`).
    pub hold: bool,
    /// Not eligible before this time (`--begin`).
    pub begin: Option<i64>,
    /// `--requeue` / `--no-requeue`; `None` = the cluster default.
    pub requeue: Option<bool>,
    pub mode: NodeMode,
    /// A `kube`-mode placeholder's pod group (its UID): the bridge finds the job by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_uid: Option<String>,
    /// `--nice`: subtracted from the priority.
    pub nice: i32,
    /// Administrator's fixed priority (`scontrol update Priority=`).
    pub priority: Option<u64>,
}

/// A spec that is wrong on its face, before looking at the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    #[error("{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: String,
    },
}

fn invalid(field: &'static str, problem: impl Into<String>) -> SpecError {
    SpecError::Invalid {
        field,
        problem: problem.into(),
    }
}

impl JobSpec {
    /// Intrinsic checks: bounds, mutually exclusive options, names.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.user.is_empty() {
            return Err(invalid("user", "missing"));
        }
        for (field, v) in [
            ("job name", &self.name),
            ("user", &self.user),
            ("account", &self.account),
            ("partition", &self.partition),
            ("qos", &self.qos),
        ] {
            if v.len() > MAX_NAME_LEN {
                return Err(invalid(
                    field,
                    format!("longer than {MAX_NAME_LEN} characters"),
                ));
            }
            if v.chars().any(char::is_control) {
                return Err(invalid(field, "contains control characters"));
            }
        }
        if let Some(t) = self.time_limit
            && t > MAX_DURATION_S
        {
            return Err(invalid("time", "longer than 100 years"));
        }
        if self.nodes_min > MAX_NODES_PER_JOB || self.nodes_max > MAX_NODES_PER_JOB {
            return Err(invalid("nodes", format!("more than {MAX_NODES_PER_JOB}")));
        }
        if self.nodes_max != 0 && self.nodes_max < self.nodes_min {
            return Err(invalid(
                "nodes",
                format!(
                    "maximum {} is below minimum {}",
                    self.nodes_max, self.nodes_min
                ),
            ));
        }
        if self.ntasks > MAX_TASKS_PER_JOB || self.ntasks_per_node > MAX_TASKS_PER_JOB {
            return Err(invalid("ntasks", format!("more than {MAX_TASKS_PER_JOB}")));
        }
        if self.cpus_per_task > MAX_CPUS_PER_TASK {
            return Err(invalid(
                "cpus-per-task",
                format!("more than {MAX_CPUS_PER_TASK}"),
            ));
        }
        if self.mem_per_node_mb.is_some() && self.mem_per_cpu_mb.is_some() {
            return Err(invalid(
                "mem",
                "--mem and --mem-per-cpu are mutually exclusive",
            ));
        }
        let gpu_forms = [self.gpus, self.gpus_per_node, self.gpus_per_task]
            .iter()
            .filter(|g| **g > 0)
            .count();
        if gpu_forms > 1 {
            return Err(invalid(
                "gpus",
                "give only one of --gpus, --gpus-per-node, --gpus-per-task",
            ));
        }
        if self.gpus > MAX_GPUS_PER_JOB
            || self.gpus_per_node > MAX_GPUS_PER_JOB
            || self.gpus_per_task > MAX_GPUS_PER_JOB
        {
            return Err(invalid("gpus", format!("more than {MAX_GPUS_PER_JOB}")));
        }
        if let Some(t) = &self.gpu_type {
            if gpu_forms == 0 {
                return Err(invalid(
                    "gpus",
                    format!("GPU type {t:?} given without a GPU count"),
                ));
            }
            if t.is_empty()
                || t.len() > 64
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            {
                return Err(invalid("gpus", format!("bad GPU type {t:?}")));
            }
        }
        if self.nice.abs() > MAX_NICE {
            return Err(invalid(
                "nice",
                format!("must be within -{MAX_NICE}..={MAX_NICE}"),
            ));
        }
        if self.ntasks > 0 && self.ntasks_per_node > 0 && self.nodes_min > 0 {
            let fit = u64::from(self.ntasks_per_node) * u64::from(self.nodes_min);
            if u64::from(self.ntasks) > fit {
                return Err(invalid(
                    "ntasks",
                    format!(
                        "{} tasks do not fit {} nodes at {} per node",
                        self.ntasks, self.nodes_min, self.ntasks_per_node
                    ),
                ));
            }
        }
        if self.nodelist.iter().any(|n| self.exclude.contains(n)) {
            return Err(invalid(
                "nodelist",
                "a node is both required (-w) and excluded (-x)",
            ));
        }
        Ok(())
    }

    /// Computes the per-node request. `caps` describes the largest node of the partition and
    /// is used only when the user did not give `-N`: then the node count grows until tasks
    /// and GPUs fit (Slurm spreads `-n 64` over as many nodes as it takes).
    pub fn shape(&self, caps: NodeCaps, default_mem_per_cpu_mb: u64) -> Shape {
        let cpt = self.cpus_per_task.max(1);
        let mut nodes = self
            .nodes_min
            .max(1)
            .max(u32::try_from(self.nodelist.len()).unwrap_or(u32::MAX));
        if self.nodes_min == 0 {
            if self.ntasks > 0 && self.ntasks_per_node > 0 {
                nodes = nodes.max(self.ntasks.div_ceil(self.ntasks_per_node));
            } else if self.ntasks > 0 && caps.cpus > 0 && !self.exclusive {
                let mut tasks_fit = caps.cpus / cpt;
                // `-n4 --gpus-per-task=4` on 8-GPU nodes needs two nodes, as in Slurm.
                if self.gpus_per_task > 0 && caps.gpus > 0 {
                    tasks_fit = tasks_fit.min(caps.gpus / self.gpus_per_task);
                }
                nodes = nodes.max(self.ntasks.div_ceil(tasks_fit.max(1)));
            }
            if self.gpus > 0 && caps.gpus > 0 {
                nodes = nodes.max(self.gpus.div_ceil(caps.gpus));
            }
        }
        let nodes = nodes.min(MAX_NODES_PER_JOB);
        let tasks_per_node = if self.ntasks_per_node > 0 {
            self.ntasks_per_node
        } else if self.ntasks > 0 {
            self.ntasks.div_ceil(nodes)
        } else {
            1
        };
        let ntasks = if self.ntasks > 0 {
            self.ntasks
        } else {
            tasks_per_node.saturating_mul(nodes)
        };
        let cpus = tasks_per_node.saturating_mul(cpt);
        let gpus = if self.gpus_per_node > 0 {
            self.gpus_per_node
        } else if self.gpus_per_task > 0 {
            self.gpus_per_task.saturating_mul(tasks_per_node)
        } else if self.gpus > 0 {
            self.gpus.div_ceil(nodes)
        } else {
            0
        };
        let mem_mb = match (self.mem_per_node_mb, self.mem_per_cpu_mb) {
            (Some(m), _) => m,
            (None, Some(m)) => m.saturating_mul(u64::from(cpus)),
            (None, None) => default_mem_per_cpu_mb.saturating_mul(u64::from(cpus)),
        };
        Shape {
            nodes,
            tasks_per_node,
            ntasks,
            per_node: Tres { cpus, mem_mb, gpus },
            exclusive: self.exclusive,
        }
    }

    /// Requeue allowed, given the cluster default.
    pub fn requeue_allowed(&self, cluster_default: bool) -> bool {
        self.requeue.unwrap_or(cluster_default)
    }
}

/// The largest node of a partition, for deriving node counts (see [`JobSpec::shape`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCaps {
    pub cpus: u32,
    pub gpus: u32,
}

/// A job's resolved request: how many nodes, and what it needs on each.
///
/// Every node of a job gets the same `per_node` amounts (Slurm's common case and what
/// launchers like torchrun assume). An exclusive job is given whole nodes at start; its
/// `per_node` is what it asked for and is used to decide which nodes could host it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub nodes: u32,
    pub tasks_per_node: u32,
    pub ntasks: u32,
    pub per_node: Tres,
    pub exclusive: bool,
}

impl Shape {
    pub fn total(&self) -> Tres {
        self.per_node.saturating_mul(self.nodes)
    }
}
