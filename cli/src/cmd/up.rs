//! `tandem up`: an all-in-one cluster on this machine.
//!
//! Creates the cluster key, starts `tandem controller` and N `tandem worker` processes (this
//! same binary) in their own process groups so they outlive this command and a ctrl-c in the
//! terminal, and returns once every node has registered. Everything lives in the state dir:
//!
//! ```text
//! DIR/cluster.key        the key (mode 0600)
//! DIR/cluster.json       how clients find the cluster ($TANDEM_CONFIG)
//! DIR/authd.sock         the identity agent's socket (mode 0666): users get credentials
//!                        there without reading the key; DIR/authd.pid, DIR/authd.log
//! DIR/controller/        the controller's durable store
//! DIR/controller.pid     pid of the controller
//! DIR/controller.args    its arguments, one per line (to restart it by hand or in tests)
//! DIR/controller.log     its log
//! DIR/workers/NAME/      a worker's state; DIR/workers/NAME.pid, DIR/workers/NAME.log
//! DIR/workers/spool-root where the workers' batch-script spools are: a private directory
//!                        under /dev/shm, removed by `tandem down` (see `local_spool`);
//!                        without /dev/shm, DIR/workers/NAME/spool
//! DIR/tls/ca/            the cluster CA: ca.crt (0644, named in cluster.json) and ca.key
//!                        (0600), made once (ECDSA P-256) and kept across restarts
//! DIR/tls/controller/    the controller's certificate (tls.crt, tls.key 0600, ca.crt),
//!                        re-issued at every `tandem up`, for 127.0.0.1, ::1, localhost,
//!                        this host's name and the listen address
//! DIR/tls/workers/NAME/  each worker's step-service certificate (also naming NAME)
//! ```
//!
//! `--insecure-plaintext` skips TLS (loopback addresses only: the daemons refuse it
//! elsewhere).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tandem_net::auth::ClusterKey;
use tandem_net::endpoint::ClusterFile;
use tandem_proto::v1::nodes_client::NodesClient;
use tandem_proto::v1::{ClusterInfoRequest, ListNodesRequest};

use super::local_cluster::{default_state_dir, home_cluster_file};
use crate::Exit;

/// Start a local cluster: one controller and N workers as background processes.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Number of worker nodes.
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// GPUs each node declares (the machine's real GPUs are not needed).
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Let each worker find the machine's GPUs by NVML instead of declaring --gpus-per-node.
    #[arg(long, conflicts_with = "gpus_per_node")]
    pub detect_gpus: bool,
    /// CPUs each node offers. Default: the CPUs of this machine.
    #[arg(long)]
    pub cpus_per_node: Option<u32>,
    /// Memory each node offers (64G, 4096). Default: this machine's memory.
    #[arg(long)]
    pub mem_per_node: Option<String>,
    /// GPU type the nodes declare (e.g. h100).
    #[arg(long)]
    pub gpu_type: Option<String>,
    /// Where the cluster keeps its state, logs and pids. Default: ~/.tandem/local.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Controller address; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Do not write ~/.tandem/cluster.json (clients then need TANDEM_CONFIG=DIR/cluster.json).
    #[arg(long)]
    pub no_default_config: bool,
    /// Controller TOML file (partitions, QOS, accounts).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL at a time limit or cancel.
    #[arg(long, value_name = "DURATION")]
    pub kill_wait: Option<String>,
    /// How long a job's processes may outlive the kill before their node is drained "Kill
    /// task failed" (Slurm's UnkillableStepTimeout; the controller's default: 60s).
    #[arg(long, value_name = "DURATION")]
    pub unkillable_step_timeout: Option<String>,
    /// Heartbeat period of the workers (e.g. 500ms).
    #[arg(long, value_name = "DURATION")]
    pub heartbeat_interval: Option<String>,
    /// A worker silent this long is lost.
    #[arg(long, value_name = "DURATION")]
    pub node_timeout: Option<String>,
    /// When the controller acknowledges a submit: full (fsync each group commit) or process
    /// (survives a controller crash but not a power loss; much faster).
    #[arg(long, value_name = "full|process")]
    pub durability: Option<String>,
    /// Administrators besides root (user names or uids, comma-separated): they control every
    /// job and node and run sacctmgr changes.
    #[arg(long, value_delimiter = ',')]
    pub admins: Vec<String>,
    /// How long to wait for the cluster to be ready, in seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// No TLS: every daemon speaks plain text (development; loopback addresses only).
    #[arg(long)]
    pub insecure_plaintext: bool,
}

pub fn node_name(i: u32) -> String {
    format!("node-{i}")
}

/// What `tandem up` left behind: where the cluster is.
#[derive(Debug, Clone)]
pub struct Started {
    pub state_dir: PathBuf,
    pub cluster_file: PathBuf,
    pub controller: String,
}

pub async fn run(args: Args) -> Exit {
    let started = start(&args).await?;
    let gpus = if args.detect_gpus {
        "GPUs as detected".to_string()
    } else {
        format!("{} GPUs each", args.gpus_per_node)
    };
    println!(
        "tandem: cluster up: controller {} with {} nodes ({gpus})",
        started.controller, args.nodes
    );
    println!(
        "tandem: clients find it through {}{}",
        started.cluster_file.display(),
        if args.no_default_config {
            " (set TANDEM_CONFIG to it)"
        } else {
            ""
        }
    );
    println!(
        "tandem: stop it with `tandem down{}`",
        state_dir_flag(&args.state_dir)
    );
    Ok(0)
}

fn state_dir_flag(dir: &Option<PathBuf>) -> String {
    dir.as_ref()
        .map(|d| format!(" --state-dir {}", d.display()))
        .unwrap_or_default()
}

/// Starts the cluster and waits for it; on failure stops what it started.
pub async fn start(args: &Args) -> anyhow::Result<Started> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let dir = match &args.state_dir {
        Some(d) => std::path::absolute(d).context("invalid --state-dir")?,
        None => default_state_dir()?,
    };
    std::fs::create_dir_all(dir.join("workers"))
        .with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some(pid) = super::local_cluster::running_controller(&dir) {
        bail!(
            "a cluster is already running in {} (controller pid {pid}); stop it with `tandem down{}`",
            dir.display(),
            state_dir_flag(&args.state_dir)
        );
    }
    let key_file = dir.join("cluster.key");
    let key = ClusterKey::load_or_create(&key_file)
        .with_context(|| format!("cannot create the cluster key {}", key_file.display()))?;

    // The identity agent first: clients (and other local users) need it as soon as the
    // cluster file names it.
    let socket = super::authd::default_socket(&key_file);
    let aargs: Vec<String> = vec![
        "authd".into(),
        "--key-file".into(),
        key_file.to_string_lossy().into_owned(),
        "--socket".into(),
        socket.to_string_lossy().into_owned(),
    ];
    let mut authd = spawn_daemon(&exe_path()?, &aargs, &dir.join("authd.log"))?;
    write_pid(&dir.join("authd.pid"), authd.id())?;
    if let Err(e) = wait_agent(&socket, &mut authd, &dir.join("authd.log")).await {
        super::local_cluster::stop(&dir, Duration::from_secs(5));
        return Err(e);
    }

    let mut addr = resolve_listen(args.listen)?;
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let tls = if args.insecure_plaintext {
        None
    } else {
        Some(Certificates::make(&dir, addr, args.nodes)?)
    };
    let tls_flag = |dir: &Path| -> Vec<String> {
        match &tls {
            Some(_) => vec!["--tls-dir".into(), dir.to_string_lossy().into_owned()],
            None => vec!["--insecure-plaintext".into()],
        }
    };

    let mut cargs: Vec<String> = vec![
        "controller".into(),
        "--listen".into(),
        addr.to_string(),
        "--state-dir".into(),
        dir.join("controller").to_string_lossy().into_owned(),
        "--key-file".into(),
        key_file.to_string_lossy().into_owned(),
    ];
    cargs.extend(tls_flag(&Certificates::controller_dir(&dir)));
    // Clients on this machine skip TCP, TLS and the agent there. The state directory is
    // writable by this user only, so no one else can put a socket in its place.
    let local_socket = Some(dir.join("controller.sock"))
        .filter(|p| p.as_os_str().len() <= tandem_net::net::MAX_SOCKET_PATH);
    if let Some(p) = &local_socket {
        cargs.push("--local-socket".into());
        cargs.push(p.to_string_lossy().into_owned());
    }
    for (flag, v) in [
        ("--kill-wait", &args.kill_wait),
        ("--unkillable-step-timeout", &args.unkillable_step_timeout),
        ("--heartbeat-interval", &args.heartbeat_interval),
        ("--node-timeout", &args.node_timeout),
        ("--durability", &args.durability),
    ] {
        if let Some(v) = v {
            cargs.push(flag.into());
            cargs.push(v.clone());
        }
    }
    if !args.admins.is_empty() {
        cargs.push("--admins".into());
        cargs.push(args.admins.join(","));
    }
    if let Some(c) = &args.config {
        cargs.push("--config".into());
        cargs.push(std::path::absolute(c)?.to_string_lossy().into_owned());
    }
    let clog = dir.join("controller.log");
    let mut attempt = 1;
    let mut controller = loop {
        std::fs::write(dir.join("controller.args"), cargs.join("\n") + "\n")
            .context("cannot write controller.args")?;
        let mut child = spawn_daemon(&exe, &cargs, &clog)?;
        write_pid(&dir.join("controller.pid"), child.id())?;
        // Port 0 was resolved by binding and letting go: another process may take the port
        // before the controller binds it. The controller then stops at once, and another
        // free port is tried (the certificates name the address, not the port).
        if listening(addr, &mut child, Duration::from_secs(args.timeout)).await?
            || args.listen.port() != 0
            || attempt == LISTEN_ATTEMPTS
            || !log_tail(&clog, 5).contains("Address already in use")
        {
            break child;
        }
        attempt += 1;
        addr = resolve_listen(args.listen)?;
        cargs[2] = addr.to_string();
    };
    let controller_url = match &tls {
        Some(_) => format!("https://{addr}"),
        None => format!("http://{addr}"),
    };
    let security = tandem_net::endpoint::security_for(
        &controller_url,
        tls.as_ref().map(|t| t.ca_file.as_path()),
    )?;

    let spool_root = super::local_spool::prepare(&dir);
    let mut workers = Vec::new();
    for i in 1..=args.nodes {
        let name = node_name(i);
        let mut wargs: Vec<String> = vec![
            "worker".into(),
            "--controller".into(),
            controller_url.clone(),
            "--key-file".into(),
            key_file.to_string_lossy().into_owned(),
            "--name".into(),
            name.clone(),
            "--gpus".into(),
            args.gpus_per_node.to_string(),
            "--state-dir".into(),
            dir.join("workers")
                .join(&name)
                .to_string_lossy()
                .into_owned(),
            // Clusters on one machine reuse node names: their job cgroups must not meet
            // (a worker kills what it finds in its subtree when it starts).
            "--cgroup-subtree".into(),
            cgroup_subtree(&dir, &name),
        ];
        if let Some(root) = &spool_root {
            wargs.push("--spool-dir".into());
            wargs.push(root.join(&name).to_string_lossy().into_owned());
        }
        wargs.extend(tls_flag(&Certificates::worker_dir(&dir, &name)));
        if let Some(c) = args.cpus_per_node {
            wargs.push("--cpus".into());
            wargs.push(c.to_string());
        }
        if let Some(m) = &args.mem_per_node {
            wargs.push("--mem".into());
            wargs.push(m.clone());
        }
        if let Some(t) = &args.gpu_type {
            wargs.push("--gpu-type".into());
            wargs.push(t.clone());
        }
        let log = dir.join("workers").join(format!("{name}.log"));
        let child = spawn_daemon(&exe, &wargs, &log)?;
        write_pid(&dir.join("workers").join(format!("{name}.pid")), child.id())?;
        workers.push((name, child, log));
    }

    let cluster_file = dir.join("cluster.json");
    let ready = wait_ready(
        (&controller_url, &security),
        &key,
        args.nodes as usize,
        Duration::from_secs(args.timeout),
        &mut controller,
        &dir.join("controller.log"),
        &mut workers,
    )
    .await;
    let cluster_name = match ready {
        Ok(name) => name,
        Err(e) => {
            super::local_cluster::stop(&dir, Duration::from_secs(5));
            return Err(e);
        }
    };
    let file = ClusterFile {
        cluster_name,
        controller: controller_url.clone(),
        key_file: key_file.clone(),
        auth_socket: Some(socket),
        ca_file: tls.map(|t| t.ca_file),
        local_socket,
    };
    file.write(&cluster_file)?;
    if !args.no_default_config
        && let Some(home) = home_cluster_file()
    {
        if let Some(parent) = home.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        file.write(&home)?;
    }
    Ok(Started {
        state_dir: dir,
        cluster_file,
        controller: controller_url,
    })
}

/// The cluster CA and the daemons' certificates under `DIR/tls`.
struct Certificates {
    ca_file: PathBuf,
}

impl Certificates {
    fn controller_dir(dir: &Path) -> PathBuf {
        dir.join("tls").join("controller")
    }

    fn worker_dir(dir: &Path, name: &str) -> PathBuf {
        dir.join("tls").join("workers").join(name)
    }

    /// Loads or makes the CA and issues the controller's and each worker's certificate for
    /// every name a client on this machine may dial.
    fn make(dir: &Path, listen: std::net::SocketAddr, nodes: u32) -> anyhow::Result<Self> {
        use tandem_net::tls::ca::ClusterCa;
        let ca_dir = dir.join("tls").join("ca");
        let ca = ClusterCa::load_or_create(&ca_dir)
            .with_context(|| format!("cannot make the cluster CA in {}", ca_dir.display()))?;
        let mut local: Vec<String> = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
        let host = crate::client::hostname();
        if rcgen_name_ok(&host) {
            local.push(host);
        }
        let mut names = local.clone();
        if !listen.ip().is_unspecified() {
            names.push(listen.ip().to_string());
        }
        names.dedup();
        let cdir = Self::controller_dir(dir);
        ca.write_server_dir(&cdir, &names)
            .with_context(|| format!("cannot issue {}", cdir.display()))?;
        for i in 1..=nodes {
            let name = node_name(i);
            let mut names = local.clone();
            names.push(name.clone());
            let wdir = Self::worker_dir(dir, &name);
            ca.write_server_dir(&wdir, &names)
                .with_context(|| format!("cannot issue {}", wdir.display()))?;
        }
        Ok(Certificates {
            ca_file: ClusterCa::cert_path(&ca_dir),
        })
    }
}

/// A host name usable as a certificate's DNS name (some hosts report odd ones).
fn rcgen_name_ok(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

fn exe_path() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("cannot find this binary's path")
}

/// Waits until the identity agent answers on `socket`.
async fn wait_agent(
    socket: &Path,
    authd: &mut std::process::Child,
    log: &Path,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = authd.try_wait()? {
            bail!(
                "the identity agent exited ({status}) during startup; log {}: {}",
                log.display(),
                log_tail(log, 5)
            );
        }
        if tandem_net::auth::agent::request(socket).is_ok() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the identity agent did not answer on {} within 30s; log {}: {}",
                socket.display(),
                log.display(),
                log_tail(log, 5)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Controllers started before `tandem up` gives up on finding a free port.
const LISTEN_ATTEMPTS: u32 = 5;

/// Whether the controller accepts connections on `addr`; false once it has exited. Past
/// `timeout`, true: [`wait_ready`] says what is wrong.
async fn listening(
    addr: std::net::SocketAddr,
    child: &mut std::process::Child,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let mut probe = addr;
    if probe.ip().is_unspecified() {
        probe.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if child.try_wait()?.is_some() {
            return Ok(false);
        }
        if tokio::net::TcpStream::connect(probe).await.is_ok() {
            // The port may have been taken by the process that raced us: the controller's
            // exit, if it comes, is seen here before the cluster is declared up.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Ok(child.try_wait()?.is_none());
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fixed address: port 0 is resolved here, once, so a restarted controller comes back on
/// the same port and its workers find it again.
fn resolve_listen(listen: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    if listen.port() != 0 {
        return Ok(listen);
    }
    let probe =
        std::net::TcpListener::bind(listen).with_context(|| format!("cannot bind {listen}"))?;
    Ok(probe.local_addr()?)
}

fn spawn_daemon(exe: &Path, args: &[String], log: &Path) -> anyhow::Result<std::process::Child> {
    use std::os::unix::process::CommandExt as _;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    let err = out.try_clone()?;
    std::process::Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group: a ctrl-c meant for the terminal's foreground job does not
        // reach the daemons.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {} {}", exe.display(), args.join(" ")))
}

fn write_pid(path: &Path, pid: u32) -> anyhow::Result<()> {
    std::fs::write(path, format!("{pid}\n"))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The last lines of a log, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

/// The controller: its URL and how to reach it (TLS against the new CA, or plain text).
async fn wait_ready(
    (url, security): (&str, &tandem_net::net::ClientSecurity),
    key: &ClusterKey,
    nodes: usize,
    timeout: Duration,
    controller: &mut std::process::Child,
    controller_log: &Path,
    workers: &mut [(String, std::process::Child, PathBuf)],
) -> anyhow::Result<String> {
    let identity = crate::client::current_identity();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut registered = 0;
    loop {
        if let Some(status) = controller.try_wait()? {
            bail!(
                "the controller exited ({status}) during startup; log {}: {}",
                controller_log.display(),
                log_tail(controller_log, 5)
            );
        }
        for (name, child, log) in workers.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "worker {name} exited ({status}) during startup; log {}: {}",
                    log.display(),
                    log_tail(log, 5)
                );
            }
        }
        if let Ok(channel) = tandem_net::endpoint::connect_as(url, security, key, &identity).await {
            let mut client = NodesClient::new(channel);
            if let Ok(resp) = client.list_nodes(ListNodesRequest::default()).await {
                let up = resp.into_inner().nodes;
                registered = up
                    .iter()
                    .filter(|n| !n.state.to_ascii_uppercase().starts_with("DOWN"))
                    .count();
                if registered >= nodes {
                    let info = client
                        .cluster_info(ClusterInfoRequest {})
                        .await
                        .map(|r| r.into_inner().cluster_name)
                        .unwrap_or_default();
                    return Ok(if info.is_empty() {
                        tandem_net::endpoint::DEFAULT_CLUSTER_NAME.to_string()
                    } else {
                        info
                    });
                }
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "only {registered} of {nodes} nodes registered within {}s; controller log {}: {}",
                timeout.as_secs(),
                controller_log.display(),
                log_tail(controller_log, 5)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `NAME-HASH`: the node's name and a digest of the cluster's state directory, stable across
/// restarts of the same cluster.
fn cgroup_subtree(dir: &std::path::Path, name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    format!("{name}-{:016x}", h.finish())
}
