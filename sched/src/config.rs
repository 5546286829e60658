//! The cluster configuration the scheduler runs under.

use serde::{Deserialize, Serialize};

use crate::account::{AccountConfig, UserConfig};
use crate::array::DEFAULT_MAX_ARRAY_SIZE;
use crate::fairshare::{BillingWeights, DEFAULT_HALF_LIFE_S};
use crate::partition::Partition;
use crate::priority::PriorityConfig;
use crate::qos::{DEFAULT_QOS, Qos};

/// Name of the partition a default configuration has.
pub const DEFAULT_PARTITION: &str = "batch";
/// Cluster name of a default configuration.
pub const DEFAULT_CLUSTER_NAME: &str = "tandem";

/// Everything configurable about scheduling. The controller persists it; `State` keeps it
/// consistent with the account tree when accounts change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub cluster_name: String,
    /// At least one; exactly one has `default` set (see [`ClusterConfig::validate`]).
    pub partitions: Vec<Partition>,
    /// Always contains [`DEFAULT_QOS`].
    pub qos: Vec<Qos>,
    /// Accounts below `root`, parents before children.
    pub accounts: Vec<AccountConfig>,
    pub users: Vec<UserConfig>,
    pub sched: SchedParams,
    pub priority: PriorityConfig,
    pub fairshare: FairShareParams,
}

/// Knobs of the scheduling pass and of submit-time defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedParams {
    /// Memory a job gets per CPU when it asks for none (Slurm's `DefMemPerCPU`). 0 = memory
    /// is not reserved for such jobs.
    pub default_mem_per_cpu_mb: u64,
    /// Whether jobs are requeued after a node failure or preemption unless they said
    /// `--no-requeue` (Slurm's `JobRequeue=1`).
    pub job_requeue: bool,
    /// `MaxArraySize`: array indices must be below it.
    pub max_array_size: u32,
    /// Reject jobs whose user has no association with the account (Slurm's
    /// `AccountingStorageEnforce=associations`). Off: unknown users are associated on first
    /// submit with default shares.
    pub enforce_associations: bool,
    /// Backfill lower-priority jobs around reservations (off = strict priority order).
    pub backfill: bool,
    /// Most distinct job shapes that get a reservation per pass (like Slurm's
    /// `bf_max_job_test`); every pending job is still tried for a start now, and later shapes
    /// start when they fit without delaying a reservation. A safety bound for queues where
    /// every job differs: on the cycle bench (100k distinct jobs, 10k full 8-GPU nodes) 2000
    /// reservations keep the pass at 0.35-0.45 s on one core, 5000 take it past 1 s (a
    /// reservation costs more the fuller the node profiles get). 0 = no bound
    /// (`backfill_max_reservations = 0` in the cluster config).
    pub max_reservations: u32,
    /// Most GPUs per node accepted at registration (GPU indices are a 64-bit mask).
    pub max_gpus_per_node: u32,
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            default_mem_per_cpu_mb: 0,
            job_requeue: true,
            max_array_size: DEFAULT_MAX_ARRAY_SIZE,
            enforce_associations: false,
            backfill: true,
            max_reservations: 2000,
            max_gpus_per_node: crate::node::MAX_GPUS_PER_NODE,
        }
    }
}

/// Fair-share accounting settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FairShareParams {
    pub billing: BillingWeights,
    /// `PriorityDecayHalfLife`, seconds; 0 = no decay.
    pub half_life_s: u64,
}

impl Default for FairShareParams {
    fn default() -> Self {
        FairShareParams {
            billing: BillingWeights::default(),
            half_life_s: DEFAULT_HALF_LIFE_S,
        }
    }
}

impl Default for ClusterConfig {
    /// Cluster `tandem`, partition `batch` (default, every node), QOS `normal`, no accounts
    /// below `root`.
    fn default() -> Self {
        let mut batch = Partition::new(DEFAULT_PARTITION);
        batch.default = true;
        ClusterConfig {
            cluster_name: DEFAULT_CLUSTER_NAME.to_string(),
            partitions: vec![batch],
            qos: vec![Qos::new(DEFAULT_QOS)],
            accounts: Vec::new(),
            users: Vec::new(),
            sched: SchedParams::default(),
            priority: PriorityConfig::default(),
            fairshare: FairShareParams::default(),
        }
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster config: {0}")]
pub struct ConfigError(pub String);

impl ClusterConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let e = |m: String| Err(ConfigError(m));
        if self.partitions.is_empty() {
            return e("no partitions".into());
        }
        if self.partitions.iter().filter(|p| p.default).count() != 1 {
            return e("exactly one partition must be the default".into());
        }
        for (i, p) in self.partitions.iter().enumerate() {
            if p.name.is_empty() || self.partitions[..i].iter().any(|q| q.name == p.name) {
                return e(format!("partition name {:?} is empty or repeated", p.name));
            }
            if let Some(expr) = &p.nodes
                && let Err(err) = crate::hostlist::expand(expr)
            {
                return e(format!("partition {}: {err}", p.name));
            }
            if let (Some(d), Some(m)) = (p.default_time, p.max_time)
                && d > m
            {
                return e(format!("partition {}: DefaultTime above MaxTime", p.name));
            }
        }
        if !self.qos.iter().any(|q| q.name == DEFAULT_QOS) {
            return e(format!("QOS {DEFAULT_QOS:?} is missing"));
        }
        for q in &self.qos {
            for p in &q.preempt {
                if !self.qos.iter().any(|x| &x.name == p) {
                    return e(format!("QOS {} preempts unknown QOS {p:?}", q.name));
                }
            }
        }
        if self.sched.max_gpus_per_node > crate::node::MAX_GPUS_PER_NODE {
            return e(format!(
                "max_gpus_per_node above {}",
                crate::node::MAX_GPUS_PER_NODE
            ));
        }
        Ok(())
    }

    pub fn default_partition(&self) -> &Partition {
        self.partitions
            .iter()
            .find(|p| p.default)
            .unwrap_or(&self.partitions[0])
    }

    pub fn partition(&self, name: &str) -> Option<&Partition> {
        self.partitions.iter().find(|p| p.name == name)
    }

    pub fn qos(&self, name: &str) -> Option<&Qos> {
        self.qos.iter().find(|q| q.name == name)
    }
}
