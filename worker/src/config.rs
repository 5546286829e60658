//! `tandem worker` flags ([`Args`]) and the validated [`Config`] that [`crate::run`] takes.
//!
//! Parsing is split as in ripgrep: clap produces raw values, [`Args::into_config`] validates
//! them and fills machine defaults (hostname, CPU count, memory), so `run` never sees an
//! unchecked value and tests build a `Config` directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tandem_net::endpoint;

use crate::cgroup;
use crate::error::Error;
use crate::launch::exec::Launcher;
use crate::resources;

/// Node agent: registers this machine with the controller and runs its jobs.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "tandem worker", args_override_self = true)]
pub struct Args {
    /// Controller address (http://HOST:PORT). Default: the cluster file (`tandem up`).
    #[arg(long, env = "TANDEM_CONTROLLER")]
    pub controller: Option<String>,
    /// Cluster key file (mode 0600). Default: the one named in the cluster file.
    #[arg(long, env = "TANDEM_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Node name. Default: the host name.
    #[arg(long)]
    pub name: Option<String>,
    /// CPUs to offer. Default: the CPUs this process may use.
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Memory to offer, in MiB or with a unit (64G). Default: the machine's total.
    #[arg(long)]
    pub mem: Option<String>,
    /// GPUs to offer; overrides NVML detection (declare GPUs on a machine without any).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// GPU type name (`--gres=gpu:TYPE:N`). Default: derived from the NVML device name.
    #[arg(long)]
    pub gpu_type: Option<String>,
    /// Node features for `--constraint`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub features: Vec<String>,
    /// Partitions this node joins, comma-separated. Default: the controller's choice.
    #[arg(long, value_delimiter = ',')]
    pub partitions: Vec<String>,
    /// The worker's state (journal, certificates, spool). Default: $TMPDIR/tandem-worker-NAME.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Where batch scripts are written while their jobs run (Slurm's SlurmdSpoolDir).
    /// Default: STATE_DIR/spool. A memory file system (tmpfs) makes each job's start and
    /// end cheaper; the scripts need not outlive a reboot, which their jobs do not either.
    #[arg(long)]
    pub spool_dir: Option<PathBuf>,
    /// Address of this worker's step launch service (srun connects here).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub step_listen: SocketAddr,
    /// Seconds between SIGTERM and SIGKILL; overrides the controller's KillWait.
    #[arg(long)]
    pub kill_wait: Option<u64>,
    /// Job isolation in cgroups: auto (v2 with the memory controller, else v1, else none),
    /// v1, v2 or off. GPUs not given to a job are hidden by the devices controller on v1,
    /// by an eBPF device program on v2 (a job fails to launch if the kernel refuses it).
    #[arg(long, value_enum, default_value_t = cgroup::Mode::Auto)]
    pub cgroup: cgroup::Mode,
    /// Where the cgroup file systems are mounted.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// This worker's cgroup directory under `tandem/`. Default: the node name; workers of
    /// different clusters on one machine need distinct ones.
    #[arg(long)]
    pub cgroup_subtree: Option<String>,
    /// Certificate chain (PEM) of the step launch service; its SANs must name the node name
    /// (--name), which srun verifies whatever address it dials (checked at start).
    #[arg(long, value_name = "FILE", env = "TANDEM_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", env = "TANDEM_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM) the controller's certificate must chain to. Default: DIR/ca.crt
    /// of --tls-dir, else the cluster file's ca_file.
    #[arg(long, value_name = "FILE", env = "TANDEM_CA_FILE")]
    pub tls_ca: Option<PathBuf>,
    /// A directory with tls.crt, tls.key and ca.crt (a mounted kubernetes.io/tls Secret):
    /// the step service's certificate, for the node name (the operator issues one per
    /// worker pod), and the CA the controller's certificate must chain to.
    #[arg(long, value_name = "DIR", env = "TANDEM_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Plain text to the controller and on the step service. Development only: refused
    /// unless both are loopback addresses.
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// The cluster CA (DIR/ca.crt, DIR/ca.key): at start, issue the step service's
    /// certificate for the node name and the address this worker advertises into the state
    /// directory, and verify the controller against DIR/ca.crt. For machines that hold the
    /// CA (`tandem up`); the operator's worker pods get their certificate through --tls-dir
    /// instead and never see the CA key.
    #[arg(
        long,
        value_name = "DIR",
        env = "TANDEM_TLS_ISSUE_FROM",
        conflicts_with_all = ["tls_cert", "tls_key", "tls_dir", "insecure_plaintext"]
    )]
    pub tls_issue_from: Option<PathBuf>,
}

/// How the worker's connections are secured.
#[derive(Debug, Clone)]
pub struct Transport {
    /// The step launch service (srun connects to it).
    pub server: tandem_net::net::ServerSecurity,
    /// The link to the controller.
    pub client: tandem_net::net::ClientSecurity,
}

/// A validated worker configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `http://HOST:PORT` of the controller.
    pub controller: String,
    pub key_file: PathBuf,
    pub node_name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    /// Declared GPU count; `None` = what NVML finds.
    pub gpus: Option<u32>,
    pub gpu_type: Option<String>,
    pub features: Vec<String>,
    /// Empty = let the controller decide.
    pub partitions: Vec<String>,
    pub state_dir: PathBuf,
    /// Batch scripts of running jobs (`--spool-dir`).
    pub spool_dir: PathBuf,
    pub step_listen: SocketAddr,
    pub kill_wait: Option<Duration>,
    /// Job cgroups (`--cgroup`, `--cgroup-root`).
    pub cgroup: cgroup::Settings,
    /// How job processes are started in their cgroup and as their user: this binary as
    /// `tandem __job-exec` by default. `None`: spawned directly (no supplementary groups).
    pub launcher: Option<Launcher>,
    /// TLS (or, with --insecure-plaintext on loopback, plain text) both ways.
    pub transport: Transport,
}

impl Args {
    /// Validates the flags and fills defaults from the machine and the cluster file.
    pub fn into_config(self) -> Result<Config, Error> {
        let node_name = match self.name {
            Some(n) => n,
            None => nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .map(|h| h.split('.').next().unwrap_or_default().to_owned())
                .unwrap_or_default(),
        };
        validate_name("--name", &node_name)?;
        let state_dir = self
            .state_dir
            .unwrap_or_else(|| std::env::temp_dir().join(format!("tandem-worker-{node_name}")));

        let mut tls = tandem_net::tls::Options {
            cert: self.tls_cert,
            key: self.tls_key,
            ca: self.tls_ca,
            dir: self.tls_dir,
            insecure_plaintext: self.insecure_plaintext,
        };
        if let Some(ca_dir) = &self.tls_issue_from {
            let dir = issue_step_certificate(ca_dir, &state_dir, self.step_listen, &node_name)?;
            tls.ca = tls
                .ca
                .or_else(|| Some(ca_dir.join(tandem_net::tls::CA_FILE)));
            tls.dir = Some(dir);
        }
        let ca_given = tls.ca.is_some() || tls.dir.is_some() || tls.insecure_plaintext;
        let (controller, key_file, file_ca) = match (self.controller, self.key_file) {
            // Both given: a cluster file, if any, can still supply the CA.
            (Some(c), Some(k)) => {
                let ca = if ca_given {
                    None
                } else {
                    endpoint::discover().ok().and_then(|f| f.ca_file)
                };
                (c, k, ca)
            }
            (c, k) => {
                let found = endpoint::discover()?;
                (
                    c.unwrap_or(found.controller),
                    k.unwrap_or(found.key_file),
                    found.ca_file,
                )
            }
        };
        let controller = endpoint::normalize_address(&controller)?;
        let transport = Transport {
            // srun verifies the step service as the node it launches on, at whatever
            // address: a certificate that does not name the node is refused here, at start.
            server: tls.server_named(&[self.step_listen], Some(&node_name))?,
            client: tls.client(&controller, file_ca.as_deref())?,
        };

        let cpus = self.cpus.unwrap_or_else(resources::machine_cpus);
        if cpus == 0 {
            return Err(Error::invalid("--cpus", "must be at least 1"));
        }
        let mem_mb = match self.mem {
            // Slurm's units and rounding, shared with sbatch --mem (tandem_sched::tres).
            Some(m) => match tandem_sched::tres::parse_mem_mb(&m) {
                Ok(0) => return Err(Error::invalid("--mem", "must be at least 1 MiB")),
                Ok(mb) => mb,
                Err(e) => return Err(Error::invalid("--mem", format!("{m:?}: {}", e.problem))),
            },
            None => resources::machine_mem_mb().ok_or_else(|| {
                Error::invalid("--mem", "cannot read /proc/meminfo; give --mem explicitly")
            })?,
        };
        if let Some(t) = &self.gpu_type {
            validate_name("--gpu-type", t)?;
        }
        for f in &self.features {
            validate_name("--features", f)?;
        }
        for p in &self.partitions {
            validate_name("--partitions", p)?;
        }
        if let Some(t) = &self.cgroup_subtree {
            validate_name("--cgroup-subtree", t)?;
        }
        Ok(Config {
            controller,
            key_file,
            node_name,
            cpus,
            mem_mb,
            gpus: self.gpus,
            gpu_type: self.gpu_type,
            features: self.features,
            partitions: self.partitions,
            spool_dir: self.spool_dir.unwrap_or_else(|| state_dir.join("spool")),
            state_dir,
            step_listen: self.step_listen,
            kill_wait: self.kill_wait.map(Duration::from_secs),
            cgroup: cgroup::Settings {
                mode: self.cgroup,
                root: self.cgroup_root,
                subtree: self.cgroup_subtree,
                ..Default::default()
            },
            launcher: Launcher::for_this_binary().ok(),
            transport,
        })
    }
}

/// The names an issued step certificate carries: the node name (what srun verifies) and
/// the advertised address (see `crate::advertised`; what older clients verified).
pub(crate) fn step_certificate_names(step_listen: SocketAddr, node_name: &str) -> Vec<String> {
    let mut names = Vec::new();
    if !step_listen.ip().is_unspecified() {
        names.push(step_listen.ip().to_string());
    }
    names.push(node_name.to_owned());
    names
}

/// `--tls-issue-from`: a fresh step certificate from the CA in `ca_dir`, written as a
/// `--tls-dir` under the state directory (`tls/`, key 0600). Issued at every start, so a
/// new address never meets an old certificate.
fn issue_step_certificate(
    ca_dir: &std::path::Path,
    state_dir: &std::path::Path,
    step_listen: SocketAddr,
    node_name: &str,
) -> Result<PathBuf, Error> {
    let ca = tandem_net::tls::ca::ClusterCa::load(ca_dir)?;
    let dir = state_dir.join("tls");
    ca.write_server_dir(&dir, &step_certificate_names(step_listen, node_name))?;
    Ok(dir)
}

/// Node names, features, partitions and GPU types: letters, digits, `-`, `_`, `.`.
fn validate_name(flag: &'static str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::invalid(flag, "must not be empty"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(Error::invalid(
            flag,
            format!("{value:?} contains {c:?} (allowed: letters, digits, '-', '_', '.')"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> Result<Config, Error> {
        let base = [
            "tandem worker",
            "--controller",
            "127.0.0.1:7000",
            "--key-file",
            "/k",
            "--name",
            "n1",
            "--insecure-plaintext",
        ];
        let argv: Vec<&str> = base.iter().chain(extra).copied().collect();
        Args::try_parse_from(argv).unwrap().into_config()
    }

    #[test]
    fn declared_resources_are_taken_as_given() {
        let c = args(&[
            "--cpus",
            "16",
            "--mem",
            "64G",
            "--gpus",
            "8",
            "--gpu-type",
            "h100",
            "--features",
            "ib,nvlink",
            "--partitions",
            "gpu",
            "--kill-wait",
            "5",
        ])
        .unwrap();
        assert_eq!(c.controller, "http://127.0.0.1:7000");
        assert_eq!((c.cpus, c.mem_mb, c.gpus), (16, 65_536, Some(8)));
        // Slurm's rounding: kibibytes round up to whole MiB.
        assert_eq!(args(&["--mem", "4K"]).unwrap().mem_mb, 1);
        assert_eq!(c.features, ["ib", "nvlink"]);
        assert_eq!(c.partitions, ["gpu"]);
        assert_eq!(c.kill_wait, Some(Duration::from_secs(5)));
        assert_eq!(c.step_listen.ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn machine_defaults_fill_the_gaps() {
        let c = args(&[]).unwrap();
        assert!(c.cpus >= 1 && c.mem_mb > 0);
        assert_eq!(c.gpus, None);
        assert!(c.state_dir.ends_with("tandem-worker-n1"));
        assert_eq!(c.spool_dir, c.state_dir.join("spool"));
        let c = args(&["--spool-dir", "/dev/shm/s/n1"]).unwrap();
        assert_eq!(c.spool_dir, std::path::Path::new("/dev/shm/s/n1"));
    }

    #[test]
    fn a_worker_issues_its_step_certificate_for_its_advertised_address() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let ca = tandem_net::tls::ca::ClusterCa::load_or_create(&ca_dir).unwrap();
        let state = dir.path().join("spool");
        let argv = [
            "tandem worker",
            "--controller",
            "https://10.96.0.10:6817",
            "--key-file",
            "/k",
            "--name",
            "kn-1",
            "--step-listen",
            "127.0.0.9:0",
            "--state-dir",
            state.to_str().unwrap(),
            "--tls-issue-from",
            ca_dir.to_str().unwrap(),
        ];
        let c = Args::try_parse_from(argv).unwrap().into_config().unwrap();
        assert!(matches!(
            c.transport.server,
            tandem_net::net::ServerSecurity::Tls(_)
        ));
        assert!(c.transport.client.is_tls(), "the controller is verified");
        assert_eq!(
            std::fs::read_to_string(state.join("tls/ca.crt")).unwrap(),
            ca.cert_pem()
        );
        assert_eq!(
            step_certificate_names("127.0.0.9:6818".parse().unwrap(), "kn-1"),
            ["127.0.0.9", "kn-1"]
        );
        assert_eq!(
            step_certificate_names("0.0.0.0:6818".parse().unwrap(), "kn-1"),
            ["kn-1"]
        );
        let both = Args::try_parse_from(argv.iter().copied().chain(["--insecure-plaintext"]));
        assert!(both.is_err(), "issuing and plain text exclude each other");
    }

    /// What the operator's worker pods do: the step certificate, issued for the node name
    /// alone, comes from a mounted Secret (`--tls-dir`); no CA key in sight. A certificate
    /// for another node is refused at start.
    #[test]
    fn a_worker_takes_a_step_certificate_for_its_node_name_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let ca = tandem_net::tls::ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
        let secret = dir.path().join("step-tls");
        ca.write_server_dir(&secret, &["kn-1".into()]).unwrap();
        let argv = |name: &'static str| {
            [
                "tandem worker",
                "--controller",
                "https://10.96.0.10:6817",
                "--key-file",
                "/k",
                "--name",
                name,
                "--step-listen",
                "10.244.1.7:6818",
                "--state-dir",
                dir.path().join("state").to_str().unwrap(),
                "--tls-dir",
                secret.to_str().unwrap(),
            ]
            .map(str::to_owned)
        };
        let c = Args::try_parse_from(argv("kn-1"))
            .unwrap()
            .into_config()
            .unwrap();
        assert!(matches!(
            c.transport.server,
            tandem_net::net::ServerSecurity::Tls(_)
        ));
        assert!(c.transport.client.is_tls(), "the controller is verified");
        let err = Args::try_parse_from(argv("kn-2"))
            .unwrap()
            .into_config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("kn-2"), "{err}");
        assert!(
            !dir.path().join("state/tls").exists(),
            "nothing was issued without --tls-issue-from"
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: [(&[&str], &str); 7] = [
            (&["--mem", "lots"], "--mem"),
            (&["--mem", "0"], "--mem"),
            (&["--mem", "64X"], "--mem"),
            (&["--cpus", "0"], "--cpus"),
            (&["--features", "a,b c"], "--features"),
            (&["--gpu-type", ""], "--gpu-type"),
            (&["--name", "bad/name"], "--name"),
        ];
        for (extra, flag) in cases {
            let msg = args(extra).unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("invalid {flag}")),
                "{extra:?}: {msg}"
            );
        }
        let err = Args::try_parse_from([
            "tandem worker",
            "--controller",
            "nohostport",
            "--key-file",
            "/k",
        ])
        .unwrap()
        .into_config()
        .unwrap_err();
        assert!(matches!(err, Error::Endpoint(_)), "{err}");
    }
}
