//! The `--config` TOML file: the scheduling configuration (partitions, QOS, accounts,
//! priority weights) in a friendly spelling, converted into the core's `ClusterConfig`. Apart
//! from the command line because it is a format of its own, with serde's rules and Slurm's
//! time strings, read once at start and never again.

use std::path::Path;

use serde::Deserialize;
use tandem_sched::config::ClusterConfig;

use super::ConfigError;

/// The `--config` file. Times are Slurm strings (`"1-00:00:00"`, `"30"` = 30 minutes,
/// `"UNLIMITED"`), except a QOS's `grace_time`: whole seconds, an integer, as Slurm's
/// `GraceTime` (and `sacctmgr ... GraceTime=`) counts it.
///
/// `[[qos]]`, `[[account]]` and `[[user]]` seed the store on the first start; from then on
/// the store (changed with `sacctmgr`) is authoritative and later edits of those sections
/// are logged and ignored, as Slurm keeps associations in its accounting database.
///
/// ```toml
/// cluster_name = "research"
/// [[partition]]
/// name = "gpu"
/// default = true
/// max_time = "2-00:00:00"
/// [[qos]]
/// name = "high"
/// priority = 1000
/// preempt = ["normal"]
/// [[qos]]
/// name = "normal"
/// grace_time = 120   # seconds a preempted job keeps running after its SIGTERM notice
/// [[account]]
/// name = "physics"
/// shares = 70
/// [[user]]
/// user = "alice"
/// account = "physics"
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub cluster_name: Option<String>,
    #[serde(default)]
    pub partition: Vec<PartitionFile>,
    #[serde(default)]
    pub qos: Vec<QosFile>,
    #[serde(default)]
    pub account: Vec<AccountFile>,
    #[serde(default)]
    pub user: Vec<UserFile>,
    pub default_mem_per_cpu_mb: Option<u64>,
    pub job_requeue: Option<bool>,
    pub max_array_size: Option<u32>,
    pub enforce_associations: Option<bool>,
    pub backfill: Option<bool>,
    /// Most distinct job shapes that get a backfill reservation per pass; 0 = no bound.
    pub backfill_max_reservations: Option<u32>,
    pub priority_max_age: Option<String>,
    pub priority_favor_small: Option<bool>,
    pub fairshare_half_life: Option<String>,
    pub priority_weights: Option<WeightsFile>,
    pub billing_weights: Option<BillingFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionFile {
    pub name: String,
    #[serde(default)]
    pub default: bool,
    pub nodes: Option<String>,
    pub max_time: Option<String>,
    pub default_time: Option<String>,
    pub max_nodes: Option<u32>,
    #[serde(default)]
    pub allowed_accounts: Vec<String>,
    pub priority_tier: Option<u16>,
    pub priority_job_factor: Option<u16>,
    /// UP, DOWN, DRAIN, INACTIVE
    pub state: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosFile {
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    #[serde(default)]
    pub preempt: Vec<String>,
    /// "requeue" (default) or "cancel".
    pub preempt_mode: Option<String>,
    /// Seconds (Slurm's `GraceTime` unit, not a time string): how long a job of this QOS
    /// keeps running after it is selected for preemption and sent SIGTERM as notice.
    #[serde(default, deserialize_with = "grace_seconds")]
    pub grace_time: Option<u32>,
    pub max_jobs_per_user: Option<u32>,
    pub max_submit_per_user: Option<u32>,
    pub max_jobs_per_account: Option<u32>,
    pub max_submit_per_account: Option<u32>,
    pub max_gpus_per_user: Option<u32>,
    pub max_wall: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountFile {
    pub name: String,
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub shares: u32,
    pub grp_gpus: Option<u32>,
    pub grp_jobs: Option<u32>,
    pub max_jobs_per_user: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserFile {
    pub user: String,
    pub account: String,
    #[serde(default = "one")]
    pub shares: u32,
    /// Defaults to true for a user's first association.
    pub default: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsFile {
    pub age: Option<u32>,
    pub fairshare: Option<u32>,
    pub job_size: Option<u32>,
    pub partition: Option<u32>,
    pub qos: Option<u32>,
    pub tres_cpu: Option<u32>,
    pub tres_mem: Option<u32>,
    pub tres_gpu: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillingFile {
    pub cpu: Option<f64>,
    pub mem_gb: Option<f64>,
    pub gpu: Option<f64>,
}

fn one() -> u32 {
    1
}

/// `grace_time`: an integer of seconds. A string is refused with a message that says why,
/// since every other time in the file is a Slurm string where `"30"` means 30 minutes.
fn grace_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Seconds(i64),
        Text(String),
        Other(serde::de::IgnoredAny),
    }
    match Raw::deserialize(d)? {
        Raw::Seconds(n) => u32::try_from(n).map(Some).map_err(|_| {
            D::Error::custom(format!(
                "grace_time: {n} is not a number of seconds (0 to {})",
                u32::MAX
            ))
        }),
        Raw::Text(s) => Err(D::Error::custom(format!(
            "grace_time: whole seconds as an integer (grace_time = 30), as Slurm's GraceTime; \
             not the time string {s:?}"
        ))),
        Raw::Other(_) => Err(D::Error::custom(
            "grace_time: whole seconds as an integer (grace_time = 30)",
        )),
    }
}

impl ConfigFile {
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    /// Converts into the core's config and validates it.
    pub fn into_cluster(self, path: &Path) -> Result<ClusterConfig, ConfigError> {
        self.into_core().map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub(super) fn into_core(self) -> Result<ClusterConfig, String> {
        use tandem_sched::account::{AccountConfig, AssocLimits, UserConfig};
        use tandem_sched::job::PreemptMode;
        use tandem_sched::partition::{Partition, PartitionState};
        use tandem_sched::qos::{DEFAULT_QOS, Qos, QosLimits};

        let dur = |what: &str, s: &Option<String>| -> Result<Option<u64>, String> {
            match s {
                None => Ok(None),
                Some(s) => {
                    tandem_sched::time::parse_duration(s).map_err(|e| format!("{what}: {e}"))
                }
            }
        };
        let mut c = ClusterConfig::default();
        if let Some(n) = self.cluster_name {
            c.cluster_name = n;
        }
        if !self.partition.is_empty() {
            c.partitions.clear();
            let any_default = self.partition.iter().any(|p| p.default);
            for (i, p) in self.partition.into_iter().enumerate() {
                let mut part = Partition::new(&p.name);
                // With no partition marked default, the first one is (as in slurm.conf
                // practice of listing the default first).
                part.default = p.default || (!any_default && i == 0);
                part.nodes = p.nodes;
                part.max_time = dur(&format!("partition {} max_time", p.name), &p.max_time)?;
                part.default_time = dur(
                    &format!("partition {} default_time", p.name),
                    &p.default_time,
                )?;
                part.max_nodes = p.max_nodes;
                part.allowed_accounts = p.allowed_accounts;
                if let Some(t) = p.priority_tier {
                    part.priority_tier = t;
                }
                if let Some(f) = p.priority_job_factor {
                    part.priority_job_factor = f;
                }
                part.state = match p.state.as_deref().map(str::to_ascii_uppercase).as_deref() {
                    None | Some("UP") => PartitionState::Up,
                    Some("DOWN") => PartitionState::Down,
                    Some("DRAIN") => PartitionState::Drain,
                    Some("INACTIVE") => PartitionState::Inactive,
                    Some(other) => {
                        return Err(format!(
                            "partition {}: unknown state {other:?} (UP, DOWN, DRAIN, INACTIVE)",
                            p.name
                        ));
                    }
                };
                c.partitions.push(part);
            }
        }
        for q in self.qos {
            let mut qos = Qos::new(&q.name);
            qos.priority = q.priority;
            qos.preempt = q.preempt;
            qos.preempt_mode = match q
                .preempt_mode
                .as_deref()
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                None | Some("requeue") => PreemptMode::Requeue,
                Some("cancel") => PreemptMode::Cancel,
                Some(other) => {
                    return Err(format!(
                        "qos {}: unknown preempt_mode {other:?} (requeue or cancel)",
                        q.name
                    ));
                }
            };
            qos.grace_time_s = q.grace_time.unwrap_or(0);
            qos.limits = QosLimits {
                max_jobs_per_user: q.max_jobs_per_user,
                max_submit_per_user: q.max_submit_per_user,
                max_jobs_per_account: q.max_jobs_per_account,
                max_submit_per_account: q.max_submit_per_account,
                max_gpus_per_user: q.max_gpus_per_user,
                max_wall: dur(&format!("qos {} max_wall", q.name), &q.max_wall)?,
            };
            // A file entry for `normal` replaces the built-in one.
            c.qos
                .retain(|x| x.name != qos.name || qos.name != DEFAULT_QOS);
            c.qos.push(qos);
        }
        for a in self.account {
            c.accounts.push(AccountConfig {
                name: a.name,
                parent: a.parent.filter(|p| p != "root"),
                shares: a.shares,
                limits: AssocLimits {
                    grp_gpus: a.grp_gpus,
                    grp_jobs: a.grp_jobs,
                    max_jobs_per_user: a.max_jobs_per_user,
                },
                description: String::new(),
                organization: String::new(),
            });
        }
        for u in self.user {
            let first = !c.users.iter().any(|x| x.user == u.user);
            c.users.push(UserConfig {
                default: u.default.unwrap_or(first),
                user: u.user,
                account: u.account,
                shares: u.shares,
            });
        }
        let s = &mut c.sched;
        if let Some(v) = self.default_mem_per_cpu_mb {
            s.default_mem_per_cpu_mb = v;
        }
        if let Some(v) = self.job_requeue {
            s.job_requeue = v;
        }
        if let Some(v) = self.max_array_size {
            s.max_array_size = v;
        }
        if let Some(v) = self.enforce_associations {
            s.enforce_associations = v;
        }
        if let Some(v) = self.backfill {
            s.backfill = v;
        }
        if let Some(v) = self.backfill_max_reservations {
            s.max_reservations = v;
        }
        if let Some(age) = dur("priority_max_age", &self.priority_max_age)? {
            c.priority.max_age_s = age;
        }
        if let Some(v) = self.priority_favor_small {
            c.priority.favor_small = v;
        }
        if let Some(h) = &self.fairshare_half_life {
            c.fairshare.half_life_s = dur("fairshare_half_life", &Some(h.clone()))?.unwrap_or(0);
        }
        if let Some(w) = self.priority_weights {
            let pw = &mut c.priority.weights;
            let set = |dst: &mut u32, v: Option<u32>| {
                if let Some(v) = v {
                    *dst = v;
                }
            };
            set(&mut pw.age, w.age);
            set(&mut pw.fairshare, w.fairshare);
            set(&mut pw.job_size, w.job_size);
            set(&mut pw.partition, w.partition);
            set(&mut pw.qos, w.qos);
            set(&mut pw.tres_cpu, w.tres_cpu);
            set(&mut pw.tres_mem, w.tres_mem);
            set(&mut pw.tres_gpu, w.tres_gpu);
        }
        if let Some(b) = self.billing_weights {
            let bw = &mut c.fairshare.billing;
            for (dst, v, name) in [
                (&mut bw.cpu, b.cpu, "cpu"),
                (&mut bw.mem_gb, b.mem_gb, "mem_gb"),
                (&mut bw.gpu, b.gpu, "gpu"),
            ] {
                if let Some(v) = v {
                    if !v.is_finite() || v < 0.0 {
                        return Err(format!(
                            "billing_weights.{name} must be a non-negative number"
                        ));
                    }
                    *dst = v;
                }
            }
        }
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}
