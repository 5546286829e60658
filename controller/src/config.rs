//! Controller configuration: command-line [`Args`] (clap) validated into a [`Config`].
//!
//! Two levels, as ripgrep splits low- and high-level arguments: `Args` is what the user
//! typed, `Config` is what `run` needs, every value checked and defaults resolved. The
//! scheduling configuration (partitions, QOS, accounts) comes from an optional TOML file
//! (`--config`) in a friendly spelling ([`ConfigFile`]: Slurm time strings, omitted fields
//! default, see `file`), converted into the scheduling core's `ClusterConfig`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::store::Durability;
use tandem_sched::config::ClusterConfig;

mod file;

pub use file::{
    AccountFile, BillingFile, ConfigFile, PartitionFile, QosFile, UserFile, WeightsFile,
};

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
    Tls(#[from] tandem_net::tls::TlsError),
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
    #[arg(long, default_value_t = DEFAULT_LISTING_CPU_SHARE)]
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
    pub fn options(&self) -> tandem_net::tls::Options {
        tandem_net::tls::Options {
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

/// `--listing-cpu-share`'s default: listings may average an eighth of the machine's CPU
/// when a crowd keeps them busy (a quarter of one core on two cores).
pub const DEFAULT_LISTING_CPU_SHARE: f64 = 0.125;

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
    pub admins: tandem_net::auth::Admins,
    /// How the gRPC listeners (Tandem's services and the KEDA scaler) are secured.
    pub tls: tandem_net::net::ServerSecurity,
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
            admins: tandem_net::auth::Admins::default(),
            // Library callers (tests) choose; `tandem controller` insists on TLS or an
            // explicit --insecure-plaintext on loopback (`Args::into_config`).
            tls: tandem_net::net::ServerSecurity::Plaintext,
            listing_cpu_share: DEFAULT_LISTING_CPU_SHARE,
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
            && path.as_os_str().len() > tandem_net::net::MAX_SOCKET_PATH
        {
            return Err(invalid(
                "--local-socket",
                format!(
                    "{} is longer than the {} bytes a socket path may have",
                    path.display(),
                    tandem_net::net::MAX_SOCKET_PATH
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
            admins: tandem_net::auth::Admins::parse(&self.admins),
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
            tandem_net::net::ServerSecurity::Plaintext
        ));

        let dir = tempfile::tempdir().unwrap();
        let ca = tandem_net::tls::ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
        let srv = dir.path().join("srv");
        ca.write_server_dir(&srv, &["127.0.0.1".into()]).unwrap();
        let c = args_tls(&[
            "--listen",
            "0.0.0.0:6817",
            "--tls-dir",
            srv.to_str().unwrap(),
        ])
        .unwrap();
        assert!(matches!(c.tls, tandem_net::net::ServerSecurity::Tls(_)));
        let (cert, key) = (srv.join("tls.crt"), srv.join("tls.key"));
        let c = args_tls(&[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ])
        .unwrap();
        assert!(matches!(c.tls, tandem_net::net::ServerSecurity::Tls(_)));
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
            DEFAULT_LISTING_CPU_SHARE
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
