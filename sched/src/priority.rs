//! Slurm's multifactor job priority.
//!
//! ```text
//! priority = PriorityWeightAge       * age_factor
//!          + PriorityWeightFairshare * fairshare_factor
//!          + PriorityWeightJobSize   * job_size_factor
//!          + PriorityWeightPartition * partition_factor
//!          + PriorityWeightQOS       * qos_factor
//!          + sum(PriorityWeightTRES[t] * tres_factor[t])
//!          - nice
//! ```
//!
//! Every factor lies in `[0, 1]`:
//! - age: time eligible over `PriorityMaxAge`, capped at 1;
//! - fair share: the job's association factor from a
//!   [`FairShareTable`](crate::fairshare::FairShareTable), computed once per
//!   pass and looked up per job;
//! - job size: the larger of the job's node and CPU fractions of the cluster
//!   (`1 -` that with `PriorityFavorSmall`);
//! - partition: the partition's `PriorityJobFactor` over the largest one;
//! - QOS: the QOS priority over the largest QOS priority;
//! - TRES: requested amount over the cluster (or partition) total per TRES.
//!
//! The total is truncated to an integer and kept at least 1, because Slurm
//! reserves priority 0 for held jobs.
//!
//! # Invariants
//!
//! - [`priority`] is a pure function of its three arguments: O(1), no
//!   allocation, so a pass can call it for every pending job.
//! - A [`PriorityContext`] is built once per pass (it holds `now` and the
//!   cluster totals); a [`PriorityInput`] is a job's view, built by the caller.

use serde::{Deserialize, Serialize};

/// Slurm's default `PriorityMaxAge` (7 days).
pub const DEFAULT_MAX_AGE_S: u64 = 7 * 24 * 3600;

/// Weights of the factors (Slurm `PriorityWeight*`). Defaults favour fair share,
/// then age, as most sites configure it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorityWeights {
    pub age: u32,
    pub fairshare: u32,
    pub job_size: u32,
    pub partition: u32,
    pub qos: u32,
    /// `PriorityWeightTRES=CPU=..`
    pub tres_cpu: u32,
    /// `PriorityWeightTRES=Mem=..`
    pub tres_mem: u32,
    /// `PriorityWeightTRES=GRES/gpu=..`
    pub tres_gpu: u32,
}

impl Default for PriorityWeights {
    fn default() -> Self {
        Self {
            age: 1_000,
            fairshare: 10_000,
            job_size: 100,
            partition: 1_000,
            qos: 2_000,
            tres_cpu: 0,
            tres_mem: 0,
            tres_gpu: 0,
        }
    }
}

/// Priority configuration from the cluster config.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorityConfig {
    pub weights: PriorityWeights,
    /// `PriorityMaxAge`: age at which the age factor reaches 1.
    pub max_age_s: u64,
    /// `PriorityFavorSmall`: smaller jobs get the larger job-size factor.
    pub favor_small: bool,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            weights: PriorityWeights::default(),
            max_age_s: DEFAULT_MAX_AGE_S,
            favor_small: false,
        }
    }
}

/// What is the same for every job of one pass.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorityContext {
    /// The pass's time (unix seconds).
    pub now: i64,
    /// Totals of the cluster (or partition) the job sizes are measured against.
    pub total_nodes: u32,
    pub total_cpus: u64,
    pub total_mem_mb: u64,
    pub total_gpus: u64,
    /// Largest `PriorityJobFactor` of any partition.
    pub max_partition_factor: u16,
    /// Largest priority of any QOS.
    pub max_qos_priority: u32,
}

/// One pending job as the priority calculation sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorityInput {
    /// When the job became eligible (submit, `--begin`, or when its
    /// dependencies were met); age counts from here.
    pub eligible_at: i64,
    /// The job's association fair-share factor, in `[0, 1]`.
    pub fairshare: f64,
    pub nodes: u32,
    pub cpus: u64,
    pub mem_mb: u64,
    pub gpus: u64,
    /// `PriorityJobFactor` of the job's partition.
    pub partition_factor: u16,
    /// Priority of the job's QOS.
    pub qos_priority: u32,
    /// `--nice`: subtracted from the total (negative nice raises it).
    pub nice: i32,
}

/// The factors, each in `[0, 1]`, before weighting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Factors {
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub partition: f64,
    pub qos: f64,
    pub tres_cpu: f64,
    pub tres_mem: f64,
    pub tres_gpu: f64,
}

/// A job's priority and its weighted parts: the columns `sprio` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PriorityBreakdown {
    /// The unweighted factors.
    pub factors: Factors,
    /// Weighted parts (`sprio`'s AGE, FAIRSHARE, JOBSIZE, PARTITION, QOS, TRES).
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub partition: f64,
    pub qos: f64,
    pub tres: f64,
    /// `NICE` column: the job's nice value (subtracted).
    pub nice: i32,
    /// The job's priority: the sum, truncated, at least 1.
    pub total: u32,
}

/// The multifactor priority of one job, with its breakdown.
pub fn priority(
    cfg: &PriorityConfig,
    ctx: &PriorityContext,
    job: &PriorityInput,
) -> PriorityBreakdown {
    let w = &cfg.weights;
    let factors = factors(cfg, ctx, job);
    let age = f64::from(w.age) * factors.age;
    let fairshare = f64::from(w.fairshare) * factors.fairshare;
    let job_size = f64::from(w.job_size) * factors.job_size;
    let partition = f64::from(w.partition) * factors.partition;
    let qos = f64::from(w.qos) * factors.qos;
    let tres = f64::from(w.tres_cpu) * factors.tres_cpu
        + f64::from(w.tres_mem) * factors.tres_mem
        + f64::from(w.tres_gpu) * factors.tres_gpu;
    let sum = age + fairshare + job_size + partition + qos + tres - f64::from(job.nice);
    // Held jobs have priority 0; a schedulable job never drops to it.
    let total = sum.clamp(1.0, f64::from(u32::MAX)) as u32;
    PriorityBreakdown {
        factors,
        age,
        fairshare,
        job_size,
        partition,
        qos,
        tres,
        nice: job.nice,
        total,
    }
}

/// The unweighted factors of one job.
pub fn factors(cfg: &PriorityConfig, ctx: &PriorityContext, job: &PriorityInput) -> Factors {
    let waited = (ctx.now - job.eligible_at).max(0) as f64;
    let age = if cfg.max_age_s == 0 {
        1.0
    } else {
        (waited / cfg.max_age_s as f64).min(1.0)
    };
    let size = fraction(u64::from(job.nodes), u64::from(ctx.total_nodes))
        .max(fraction(job.cpus, ctx.total_cpus));
    let job_size = if cfg.favor_small { 1.0 - size } else { size };
    Factors {
        age,
        fairshare: job.fairshare.clamp(0.0, 1.0),
        job_size,
        partition: fraction(
            u64::from(job.partition_factor),
            u64::from(ctx.max_partition_factor),
        ),
        qos: fraction(u64::from(job.qos_priority), u64::from(ctx.max_qos_priority)),
        tres_cpu: fraction(job.cpus, ctx.total_cpus),
        tres_mem: fraction(job.mem_mb, ctx.total_mem_mb),
        tres_gpu: fraction(job.gpus, ctx.total_gpus),
    }
}

/// `part / whole` in `[0, 1]`; 0 when the whole is 0 (no such resource).
fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).min(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> PriorityContext {
        PriorityContext {
            now: 10_000,
            total_nodes: 10,
            total_cpus: 640,
            total_mem_mb: 10 * 512 * 1024,
            total_gpus: 80,
            max_partition_factor: 10,
            max_qos_priority: 100,
        }
    }

    fn job() -> PriorityInput {
        PriorityInput {
            eligible_at: 10_000,
            fairshare: 0.0,
            nodes: 1,
            cpus: 64,
            mem_mb: 0,
            gpus: 0,
            partition_factor: 0,
            qos_priority: 0,
            nice: 0,
        }
    }

    /// Each factor worked out by hand with weights age 1000, fairshare 10000,
    /// job size 100, partition 1000, qos 2000, GPU TRES 500:
    /// - age: waited 3.5 days of a 7-day max age -> 0.5 -> 500
    /// - fair share 0.25 -> 2500
    /// - size: 2 of 10 nodes = 0.2, 128 of 640 CPUs = 0.2 -> 0.2 -> 20
    /// - partition 5 of 10 -> 0.5 -> 500
    /// - qos 100 of 100 -> 1 -> 2000
    /// - gpus 8 of 80 -> 0.1 -> 50
    /// - nice 70
    ///   total = 500 + 2500 + 20 + 500 + 2000 + 50 - 70 = 5500
    #[test]
    fn sums_weighted_factors() {
        let cfg = PriorityConfig {
            weights: PriorityWeights {
                tres_gpu: 500,
                ..PriorityWeights::default()
            },
            ..PriorityConfig::default()
        };
        let j = PriorityInput {
            eligible_at: 10_000 - 302_400,
            fairshare: 0.25,
            nodes: 2,
            cpus: 128,
            gpus: 8,
            partition_factor: 5,
            qos_priority: 100,
            nice: 70,
            ..job()
        };
        let p = priority(&cfg, &ctx(), &j);
        assert_eq!(p.factors.age, 0.5);
        assert_eq!(p.age, 500.0);
        assert_eq!(p.fairshare, 2500.0);
        assert!((p.job_size - 20.0).abs() < 1e-9);
        assert_eq!(p.partition, 500.0);
        assert_eq!(p.qos, 2000.0);
        assert!((p.tres - 50.0).abs() < 1e-9);
        assert_eq!(p.total, 5500);
    }

    #[test]
    fn age_caps_at_max_age_and_ignores_future_eligibility() {
        let cfg = PriorityConfig::default();
        let old = PriorityInput {
            eligible_at: 10_000 - 30 * 24 * 3600,
            ..job()
        };
        assert_eq!(factors(&cfg, &ctx(), &old).age, 1.0);
        let future = PriorityInput {
            eligible_at: 20_000,
            ..job()
        };
        assert_eq!(factors(&cfg, &ctx(), &future).age, 0.0);
    }

    #[test]
    fn favor_small_flips_job_size() {
        let big = PriorityInput { nodes: 10, ..job() };
        let small = PriorityInput {
            nodes: 1,
            cpus: 1,
            ..job()
        };
        let cfg = PriorityConfig::default();
        assert!(factors(&cfg, &ctx(), &big).job_size > factors(&cfg, &ctx(), &small).job_size);
        let cfg = PriorityConfig {
            favor_small: true,
            ..cfg
        };
        assert!(factors(&cfg, &ctx(), &big).job_size < factors(&cfg, &ctx(), &small).job_size);
    }

    #[test]
    fn total_never_drops_to_held() {
        let cfg = PriorityConfig::default();
        let nice = PriorityInput {
            nice: 1_000_000,
            ..job()
        };
        assert_eq!(priority(&cfg, &ctx(), &nice).total, 1);
    }

    #[test]
    fn missing_totals_give_zero_factors() {
        let cfg = PriorityConfig::default();
        let empty = PriorityContext {
            total_nodes: 0,
            total_cpus: 0,
            total_mem_mb: 0,
            total_gpus: 0,
            max_partition_factor: 0,
            max_qos_priority: 0,
            ..ctx()
        };
        let f = factors(&cfg, &empty, &PriorityInput { gpus: 4, ..job() });
        assert_eq!(f.job_size, 0.0);
        assert_eq!(f.tres_gpu, 0.0);
        assert_eq!(f.qos, 0.0);
    }

    /// More fair share, older, higher QOS: each alone raises the total.
    #[test]
    fn each_factor_is_monotone() {
        let cfg = PriorityConfig::default();
        let base = priority(&cfg, &ctx(), &job()).total;
        for better in [
            PriorityInput {
                fairshare: 0.5,
                ..job()
            },
            PriorityInput {
                eligible_at: 0,
                ..job()
            },
            PriorityInput {
                qos_priority: 50,
                ..job()
            },
            PriorityInput {
                partition_factor: 3,
                ..job()
            },
            PriorityInput {
                nice: -100,
                ..job()
            },
        ] {
            assert!(priority(&cfg, &ctx(), &better).total > base, "{better:?}");
        }
    }
}
