//! Controller configuration: command-line [`Args`] (clap) validated into a [`Config`].
//!
//! Two levels, as ripgrep splits low- and high-level arguments: `Args` is what the user
//! typed, `Config` is what `run` needs, every value checked and defaults resolved. The
//! scheduling configuration (partitions, QOS, accounts) comes from an optional TOML file
//! (`--config`) in a friendly spelling ([`ConfigFile`]: Slurm time strings, omitted fields
//! default), converted into the scheduling core's `ClusterConfig`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::store::Durability;
use serde::Deserialize;
use tandem_sched::config::ClusterConfig;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(transparent)]
    Tls(#[from] tandem_proto::tls::TlsError),
    #[error("invalid {field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        message: message.into(),
    }
}

/// `tandem controller` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Address to listen on for gRPC (clients, workers).
    #[arg(long, default_value = "127.0.0.1:6817")]
    pub listen: SocketAddr,
    /// Directory of the durable store (created if missing).
    #[arg(long)]
    pub state_dir: PathBuf,
    /// Cluster name (overrides the config file's).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Cluster key file; created with mode 0600 if missing. Default: STATE_DIR/cluster.key.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// TOML file with partitions, QOS, accounts and scheduling parameters.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Heartbeat period asked of workers (e.g. 500ms, 2s).
    #[arg(long, default_value = "2s", value_parser = parse_duration_arg)]
    pub heartbeat_interval: Duration,
    /// A worker silent this long is lost: its node goes DOWN and its jobs fail or requeue.
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    pub node_timeout: Duration,
    /// Time between SIGTERM and SIGKILL at a time limit or cancel (Slurm's KillWait).
    #[arg(long, default_value = "30s", value_parser = parse_duration_arg)]
    pub kill_wait: Duration,
    /// How long a job's processes may outlive the kill (after the kill wait) before their
    /// node is drained with reason "Kill task failed" (Slurm's UnkillableStepTimeout). The
    /// job keeps the node (COMPLETING) until they are gone.
    #[arg(long, default_value = "60s", value_parser = parse_duration_arg)]
    pub unkillable_step_timeout: Duration,
    /// Serve Prometheus/OpenMetrics text at /metrics over HTTP on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve KEDA's external scaler gRPC service (shape-aware worker demand; read-only, no
    /// credential) on this address. Off unless given.
    #[arg(long)]
    pub scaler_listen: Option<SocketAddr>,
    /// Period of the safety-net scheduling pass (begin times, time limits); passes are
    /// otherwise triggered by events.
    #[arg(long, default_value = "5s", value_parser = parse_duration_arg)]
    pub sched_interval: Duration,
    /// When a submit is acknowledged: `full` fsyncs every group commit (survives power
    /// loss); `process` leaves the write in the OS page cache (survives any controller
    /// crash, including SIGKILL, but not a power loss), for much higher submit rates.
    #[arg(long, value_enum, default_value_t = Durability::Full)]
    pub durability: Durability,
    /// Administrators besides root, comma-separated user names or uids (Slurm's
    /// AdminLevel): they control every job and node and run `sacctmgr` changes.
    #[arg(long, value_delimiter = ',')]
    pub admins: Vec<String>,
    /// Share of the machine's CPU that listings (`squeue`, `sacct`, `sinfo` ...) may average
    /// while a crowd keeps them busy, from 0.01 to 1; each may first spend 2 CPU-seconds at
    /// once, so occasional listings never wait.
    #[arg(long, default_value_t = crate::api::reads::DEFAULT_CPU_SHARE)]
    pub listing_cpu_share: f64,
    /// Also serve on this Unix socket, for clients on this host: no TCP or TLS, and the
    /// kernel names each caller, so they need no credential. Put it in a directory only
    /// the controller's user can write (clients trust whoever listens there).
    #[arg(long, value_name = "PATH")]
    pub local_socket: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The TLS flags of the gRPC listeners (`--listen`, `--scaler-listen`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// Server certificate chain (PEM) for the gRPC listeners; its SANs must name the address
    /// clients and workers dial.
    #[arg(long, value_name = "FILE", env = "TANDEM_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", env = "TANDEM_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// A directory with tls.crt and tls.key (a mounted kubernetes.io/tls Secret), instead
    /// of --tls-cert and --tls-key.
    #[arg(long, value_name = "DIR", env = "TANDEM_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Serve gRPC in plain text. Development only: refused unless every listener is on a
    /// loopback address.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

impl TlsArgs {
    pub fn options(&self) -> tandem_proto::tls::Options {
        tandem_proto::tls::Options {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: None,
            dir: self.tls_dir.clone(),
            insecure_plaintext: self.insecure_plaintext,
        }
    }
}

/// Parses `500ms`, `2s`, `1m`, or a plain number of seconds.
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 2s, 1m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// See [`Config::quick_pass`].
pub const DEFAULT_QUICK_PASS: Duration = Duration::from_micros(300);

/// Validated controller configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub state_dir: PathBuf,
    pub key_file: PathBuf,
    pub cluster: ClusterConfig,
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
    pub kill_wait: Duration,
    /// `--unkillable-step-timeout` (Slurm's UnkillableStepTimeout).
    pub unkillable_step_timeout: Duration,
    pub sched_interval: Duration,
    pub metrics_listen: Option<SocketAddr>,
    pub scaler_listen: Option<SocketAddr>,
    pub durability: Durability,
    /// Users raised to administrator (root always is).
    pub admins: tandem_proto::auth::Admins,
    /// How the gRPC listeners (Tandem's services and the KEDA scaler) are secured.
    pub tls: tandem_proto::net::ServerSecurity,
    /// `--listing-cpu-share`.
    pub listing_cpu_share: f64,
    /// `--local-socket`.
    pub local_socket: Option<PathBuf>,
    /// A pass due when commands are flushed runs first, its writes in their commit (one
    /// transaction, one fsync, for a submit and the start it allows), while the last pass
    /// took at most this. The commands' callers wait for the pass, so the default is a
    /// small fraction of a commit with its fsync. Not a flag: tests raise it to make the
    /// grouping exact on a slow build.
    pub quick_pass: Duration,
}

impl Config {
    /// Defaults for `state_dir`: the default cluster config, key in the state dir, Slurm-like
    /// timings. Tests shorten the timings.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        let state_dir = state_dir.into();
        Self {
            key_file: state_dir.join("cluster.key"),
            state_dir,
            cluster: ClusterConfig::default(),
            heartbeat_interval: Duration::from_secs(2),
            node_timeout: Duration::from_secs(10),
            kill_wait: Duration::from_secs(30),
            unkillable_step_timeout: Duration::from_secs(60),
            sched_interval: Duration::from_secs(5),
            metrics_listen: None,
            scaler_listen: None,
            durability: Durability::Full,
            admins: tandem_proto::auth::Admins::default(),
            // Library callers (tests) choose; `tandem controller` insists on TLS or an
            // explicit --insecure-plaintext on loopback (`Args::into_config`).
            tls: tandem_proto::net::ServerSecurity::Plaintext,
            listing_cpu_share: crate::api::reads::DEFAULT_CPU_SHARE,
            local_socket: None,
            quick_pass: DEFAULT_QUICK_PASS,
        }
    }
}

impl Args {
    /// Reads the config file (if any) and validates everything.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let mut cluster = match &self.config_file {
            Some(path) => ConfigFile::read(path)?.into_cluster(path)?,
            None => ClusterConfig::default(),
        };
        if let Some(name) = self.cluster_name {
            cluster.cluster_name = name;
        }
        validate_cluster_name(&cluster.cluster_name)?;
        if self.heartbeat_interval.is_zero() {
            return Err(invalid("--heartbeat-interval", "must be above zero"));
        }
        if self.node_timeout <= self.heartbeat_interval {
            return Err(invalid(
                "--node-timeout",
                format!(
                    "{:?} must exceed --heartbeat-interval {:?}",
                    self.node_timeout, self.heartbeat_interval
                ),
            ));
        }
        if self.sched_interval.is_zero() {
            return Err(invalid("--sched-interval", "must be above zero"));
        }
        if !(0.01..=1.0).contains(&self.listing_cpu_share) {
            return Err(invalid(
                "--listing-cpu-share",
                format!("{} is not between 0.01 and 1", self.listing_cpu_share),
            ));
        }
        if let Some(path) = &self.local_socket
            && path.as_os_str().len() > tandem_proto::net::MAX_SOCKET_PATH
        {
            return Err(invalid(
                "--local-socket",
                format!(
                    "{} is longer than the {} bytes a socket path may have",
                    path.display(),
                    tandem_proto::net::MAX_SOCKET_PATH
                ),
            ));
        }
        let listeners: Vec<SocketAddr> = std::iter::once(self.listen)
            .chain(self.scaler_listen)
            .collect();
        let tls = self.tls.options().server(&listeners)?;
        Ok(Config {
            key_file: self
                .key_file
                .unwrap_or_else(|| self.state_dir.join("cluster.key")),
            state_dir: self.state_dir,
            cluster,
            heartbeat_interval: self.heartbeat_interval,
            node_timeout: self.node_timeout,
            kill_wait: self.kill_wait,
            unkillable_step_timeout: self.unkillable_step_timeout,
            sched_interval: self.sched_interval,
            metrics_listen: self.metrics_listen,
            scaler_listen: self.scaler_listen,
            durability: self.durability,
            admins: tandem_proto::auth::Admins::parse(&self.admins),
            tls,
            listing_cpu_share: self.listing_cpu_share,
            local_socket: self.local_socket,
            quick_pass: DEFAULT_QUICK_PASS,
        })
    }
}

fn validate_cluster_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(
            "cluster name",
            format!("{name:?}: use 1-64 letters, digits, '-' or '_'"),
        ));
    }
    Ok(())
}

// === The TOML file ===

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

    fn into_core(self) -> Result<ClusterConfig, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["--insecure-plaintext"];
        argv.extend_from_slice(extra);
        args_tls(&argv)
    }

    fn args_tls(extra: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["tandem", "--state-dir", "/tmp/x"];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.args.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn tls_is_required_unless_plain_text_is_asked_for_on_loopback() {
        let e = args_tls(&[]).unwrap_err();
        assert!(
            e.contains("--tls-cert") && e.contains("--insecure-plaintext"),
            "{e}"
        );
        let e = args(&["--listen", "0.0.0.0:6817"]).unwrap_err();
        assert!(e.contains("0.0.0.0:6817"), "{e}");
        // The scaler listener counts too.
        let e = args(&["--scaler-listen", "10.0.0.1:9"]).unwrap_err();
        assert!(e.contains("10.0.0.1:9"), "{e}");
        assert!(matches!(
            args(&[]).unwrap().tls,
            tandem_proto::net::ServerSecurity::Plaintext
        ));

        let dir = tempfile::tempdir().unwrap();
        let ca = tandem_proto::tls::ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
        let srv = dir.path().join("srv");
        ca.write_server_dir(&srv, &["127.0.0.1".into()]).unwrap();
        let c = args_tls(&[
            "--listen",
            "0.0.0.0:6817",
            "--tls-dir",
            srv.to_str().unwrap(),
        ])
        .unwrap();
        assert!(matches!(c.tls, tandem_proto::net::ServerSecurity::Tls(_)));
        let (cert, key) = (srv.join("tls.crt"), srv.join("tls.key"));
        let c = args_tls(&[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ])
        .unwrap();
        assert!(matches!(c.tls, tandem_proto::net::ServerSecurity::Tls(_)));
        let e = args_tls(&["--tls-cert", cert.to_str().unwrap()]).unwrap_err();
        assert!(e.contains("--tls-key"), "{e}");
        let e = args(&["--tls-dir", srv.to_str().unwrap()]).unwrap_err();
        assert!(e.contains("cannot be combined"), "{e}");
    }

    #[test]
    fn defaults_are_slurm_like() {
        let c = args(&[]).unwrap();
        assert_eq!(c.cluster.cluster_name, "tandem");
        assert_eq!(c.key_file, PathBuf::from("/tmp/x/cluster.key"));
        assert_eq!(c.kill_wait, Duration::from_secs(30));
        // Slurm's UnkillableStepTimeout default.
        assert_eq!(c.unkillable_step_timeout, Duration::from_secs(60));
        assert_eq!(c.node_timeout, Duration::from_secs(10));
        assert_eq!(c.cluster.default_partition().name, "batch");
    }

    #[test]
    fn durations_accept_units() {
        let c = args(&[
            "--node-timeout",
            "1500ms",
            "--heartbeat-interval",
            "0.2",
            "--kill-wait",
            "1",
        ])
        .unwrap();
        assert_eq!(c.node_timeout, Duration::from_millis(1500));
        assert_eq!(c.heartbeat_interval, Duration::from_millis(200));
        assert_eq!(c.kill_wait, Duration::from_secs(1));
        for bad in ["-1s", "5 parsecs", "", "1e99h"] {
            assert!(parse_duration_arg(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn inconsistent_timings_and_names_are_rejected() {
        let e = args(&["--node-timeout", "1s", "--heartbeat-interval", "2s"]).unwrap_err();
        assert!(e.contains("--node-timeout"), "{e}");
        let e = args(&["--cluster-name", "bad name"]).unwrap_err();
        assert!(e.contains("cluster name"), "{e}");
    }

    #[test]
    fn the_listing_cpu_share_is_a_fraction_of_the_machine() {
        assert_eq!(
            args(&[]).unwrap().listing_cpu_share,
            crate::api::reads::DEFAULT_CPU_SHARE
        );
        assert_eq!(
            args(&["--listing-cpu-share", "0.5"])
                .unwrap()
                .listing_cpu_share,
            0.5
        );
        for bad in ["0", "1.5", "-0.1", "NaN"] {
            let e = args(&[&format!("--listing-cpu-share={bad}")]).unwrap_err();
            assert!(e.contains("--listing-cpu-share"), "{bad}: {e}");
        }
        assert!(args(&["--listing-cpu-share", "lots"]).is_err());
    }

    #[test]
    fn a_local_socket_path_must_fit_the_kernels_limit() {
        let ok = args(&["--local-socket", "/run/tandem/controller.sock"]).unwrap();
        assert_eq!(
            ok.local_socket.as_deref(),
            Some(std::path::Path::new("/run/tandem/controller.sock"))
        );
        let long = format!("/{}", "d".repeat(120));
        let e = args(&["--local-socket", &long]).unwrap_err();
        assert!(e.contains("--local-socket"), "{e}");
    }

    #[test]
    fn toml_file_maps_to_core_config() {
        let f = ConfigFile::parse(
            r#"
            cluster_name = "research"
            default_mem_per_cpu_mb = 1024
            [[partition]]
            name = "gpu"
            max_time = "2-00:00:00"
            default_time = "1:00:00"
            max_nodes = 4
            [[partition]]
            name = "debug"
            state = "drain"
            [[qos]]
            name = "high"
            priority = 100
            preempt = ["normal"]
            preempt_mode = "cancel"
            max_wall = "60"
            grace_time = 90
            [[account]]
            name = "physics"
            shares = 70
            [[user]]
            user = "alice"
            account = "physics"
            "#,
        )
        .unwrap();
        let c = f.into_core().unwrap();
        assert_eq!(c.cluster_name, "research");
        assert_eq!(c.default_partition().name, "gpu");
        let gpu = c.partition("gpu").unwrap();
        assert_eq!(gpu.max_time, Some(172_800));
        assert_eq!(gpu.default_time, Some(3600));
        assert_eq!(gpu.max_nodes, Some(4));
        let high = c.qos("high").unwrap();
        assert_eq!(high.limits.max_wall, Some(3600));
        // GraceTime is seconds, while other times are Slurm strings where "60" is minutes.
        assert_eq!(high.grace_time_s, 90);
        assert!(c.qos("normal").is_some());
        assert_eq!(c.accounts[0].shares, 70);
        assert!(c.users[0].default);
        assert_eq!(c.sched.default_mem_per_cpu_mb, 1024);
    }

    #[test]
    fn bad_toml_names_the_problem() {
        let cases = [
            ("[[partition]]\nname = \"a\"\nmax_time = \"-5\"", "max_time"),
            (
                "[[partition]]\nname = \"a\"\nsate = \"UP\"",
                "unknown field",
            ),
            ("[[qos]]\nname = \"q\"\npreempt = [\"ghost\"]", "ghost"),
            (
                "[[qos]]\nname = \"q\"\npreempt_mode = \"suspend\"",
                "preempt_mode",
            ),
            // Seconds as an integer; a time string is refused, not read as minutes.
            ("[[qos]]\nname = \"q\"\ngrace_time = \"0:30\"", "grace_time"),
            ("[[qos]]\nname = \"q\"\ngrace_time = -1", "grace_time"),
            ("[[qos]]\nname = \"q\"\ngrace_time = 1.5", "grace_time"),
            (
                "[[partition]]\nname = \"a\"\ndefault = true\n[[partition]]\nname = \"b\"\ndefault = true",
                "exactly one",
            ),
        ];
        for (text, want) in cases {
            let err = match ConfigFile::parse(text) {
                Err(e) => e,
                Ok(f) => f.into_core().unwrap_err(),
            };
            assert!(err.contains(want), "{want}: {err}");
        }
    }
}
