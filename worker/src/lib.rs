//! Tandem's node agent (like slurmd): registers the node's resources with the controller,
//! launches batch scripts and step tasks as processes, enforces time limits, reports ends.
//!
//! The `tandem` binary calls [`run`] for `tandem worker ...`:
//!
//! ```text
//! let config = tandem_worker::Args::parse().into_config()?;
//! tandem_worker::run(config, ctrl_c()).await?;
//! ```
//!
//! # Layout
//!
//! ```text
//!  config ──▶ run ──┬─▶ session (WorkerLink.Attach, reconnect) ◀──JobEvent── jobs (supervisors)
//!                   │        │ LaunchJob/SignalJob/AbandonJob ──────────────▶ │
//!                   │        └─ outbox (ends until delivered)                 ▼
//!                   │                                                launch/ (process, env,
//!                   └─▶ step (StepLauncher gRPC for srun) ─▶ registry ◀── output, limits)
//! ```
//!
//! - `config`, `error`: flags -> validated [`Config`]; the crate's [`Error`].
//! - `resources`, `gpu`: what the node offers (flags, `/proc`, NVML).
//! - `session`, `outbox`: the controller link; `jobs`: the batch job table; `journal`:
//!   running pids and undelivered ends on disk, replayed after a worker restart.
//! - `launch/`: `env`, `output`, `limits` are pure; `process` spawns the script.
//! - `step/`: the `StepLauncher` service, its authorization and task processes.
//! - `cgroup/`: each job's and step's cgroup and limits (memory, CPU, GPU devices) on v1
//!   and v2. GPUs not given to a job are hidden on both: `devices.deny` on v1, an eBPF
//!   device program on v2 (`BPF_PROG_TYPE_CGROUP_DEVICE`, assembled by `devfilter`,
//!   attached by `bpf`); where the kernel refuses the program, a job with GPUs to hide
//!   fails to launch rather than run unfiltered.
//!
//! # Invariants
//!
//! - Every launched job produces exactly one `JobEnded`. It is journaled before it is
//!   reported and stays in the outbox (and the journal) until a stream that carried it
//!   outlived the confirmation window; a job that ends while the controller is away is
//!   reported in the next `Register`, also by the next worker life if this one dies.
//! - Jobs keep running while the controller is away; the worker never kills a job because
//!   the link broke. It kills them when it stops, when the controller abandons them, and,
//!   after a crash, when it starts again: it cannot re-adopt processes that are not its
//!   children, so it could never report their real exit.
//! - Only the job's supervisor signals the job's process group (steps on nodes where the
//!   job has no batch script are signalled through the step registry).
//!
//! # Not done (yet)
//!
//! Step tasks on nodes without the job's batch script get a job cgroup without memory or
//! CPU limits (the step request carries no memory size; `cgroup::Isolation::job_for_step`),
//! and every GPU device file of such a node is hidden from them.

pub mod cgroup;
pub mod config;
pub mod error;
pub mod gpu;
mod host;
mod jobs;
mod journal;
pub mod launch;
mod outbox;
pub mod resources;
mod session;
pub mod step;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tandem_net::auth::{ClusterKey, Identity, ServerAuth, unix_now};
use tandem_proto::v1::Register;
use tandem_proto::v1::Tres;
use tandem_proto::v1::step_launcher_server::StepLauncherServer;
use tokio::sync::watch;
use tracing::{info, warn};

pub use config::{Args, Config, Transport};
pub use error::Error;
pub use jobs::processes_gone;

use jobs::{Jobs, NodeFacts};
use journal::Journal;
use launch::limits::DEFAULT_KILL_WAIT;
use session::{LinkConfig, Session};
use step::StepService;
use step::registry::StepRegistry;

/// How long a stopping worker waits for its killed jobs to be reaped.
const STOP_REAP_WAIT: Duration = Duration::from_secs(5);

/// Runs the worker until `shutdown` completes; then kills its jobs, reports their ends if
/// the controller is reachable, and returns.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let key = ClusterKey::load(&config.key_file)?;
    let state_err = |source| Error::StateDir {
        path: config.state_dir.clone(),
        source,
    };
    std::fs::create_dir_all(&config.state_dir).map_err(state_err)?;
    let spool =
        launch::process::prepare_spool(&config.spool_dir).map_err(|source| Error::SpoolDir {
            path: config.spool_dir.clone(),
            source,
        })?;
    let exec_dir = launch::exec::prepare_dir(&config.state_dir).map_err(state_err)?;
    let isolation = {
        let (settings, node, cpus) = (config.cgroup.clone(), config.node_name.clone(), config.cpus);
        // Kills what an earlier life left in its cgroups: off the runtime.
        tokio::task::spawn_blocking(move || cgroup::Isolation::setup(&settings, &node, cpus))
            .await
            .unwrap_or_else(|_| cgroup::Isolation::off())
    };
    let journal = Journal::open(&config.state_dir).map_err(state_err)?;
    let recovered = journal.recover();
    if !recovered.is_empty() {
        info!(
            jobs = recovered.len(),
            "reporting job ends from before this worker started"
        );
    }

    // dlopen and NVML's init can take a while on a GPU machine; keep them off the runtime.
    let detected = tokio::task::spawn_blocking(gpu::detect)
        .await
        .unwrap_or_else(|e| Err(format!("GPU detection failed: {e}")));
    if let Err(why) = &detected {
        info!(%why, declared = ?config.gpus, "no GPU detection; using declared GPUs");
    }
    let gpus = gpu::resolve(config.gpus, config.gpu_type.as_deref(), &detected);

    let listener = tandem_net::net::bind(config.step_listen)
        .await
        .map_err(|source| Error::BindStepListener {
            addr: config.step_listen,
            source,
        })?;
    let step_addr = listener
        .local_addr()
        .map_err(|source| Error::BindStepListener {
            addr: config.step_listen,
            source,
        })?;
    let step_address = advertised(step_addr, &config.node_name);

    let worker_uid = nix::unistd::getuid().as_raw();
    let worker_gid = nix::unistd::getgid().as_raw();
    let registry = Arc::new(StepRegistry::default());
    let (jobs, events) = Jobs::new(
        NodeFacts {
            name: config.node_name.clone(),
            cpus: config.cpus,
            spool,
            worker_uid,
            kill_wait: config.kill_wait,
            isolation: isolation.clone(),
            launcher: config.launcher.clone(),
            exec_dir: exec_dir.clone(),
        },
        Arc::clone(&registry),
        journal.clone(),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let service = StepService {
        node_name: config.node_name.clone(),
        cpus: config.cpus,
        worker_uid,
        kill_wait: config.kill_wait.unwrap_or(DEFAULT_KILL_WAIT),
        key: Arc::new(key.clone()),
        registry,
        placement: Arc::new(step::tasks::Placement {
            isolation: isolation.clone(),
            launcher: config.launcher.clone(),
            exec_dir: exec_dir.clone(),
        }),
    };
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(StepLauncherServer::with_interceptor(
                service,
                ServerAuth::new(Arc::new(key.clone())),
            ))
            .serve_with_incoming_shutdown(
                listener.incoming(config.transport.server.clone()),
                async move {
                    let _ = server_stop.wait_for(|stop| *stop).await;
                },
            ),
    );

    let host = host::Host::read();
    let register = Register {
        node_name: config.node_name.clone(),
        resources: Some(Tres {
            cpus: config.cpus,
            mem_mb: config.mem_mb,
            gpus: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
            gpu_type: gpu::common_type(&gpus),
        }),
        features: config.features.clone(),
        step_address: step_address.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        gpus,
        boot_time: unix_now(),
        partitions: config.partitions.clone(),
        arch: host.arch,
        os: host.os,
        machine_boot_time: host.boot_time,
        hostname: host.hostname,
        ..Default::default()
    };
    info!(
        node = %config.node_name,
        controller = %config.controller,
        %step_address,
        cpus = config.cpus,
        mem_mb = config.mem_mb,
        gpus = register.gpus.len(),
        "worker starting"
    );
    let link = LinkConfig {
        controller: config.controller.clone(),
        security: config.transport.client.clone(),
        key,
        identity: Identity::worker(config.node_name.clone(), worker_uid, worker_gid),
        register,
    };
    let (session_stop_tx, session_stop_rx) = watch::channel(false);
    let session = tokio::spawn(
        Session::new(link, jobs.clone(), events, journal, recovered).run(session_stop_rx),
    );

    tokio::pin!(server);
    let server_result = tokio::select! {
        () = shutdown => None,
        r = &mut server => Some(r),
    };
    info!("worker stopping: killing its jobs");
    jobs.kill_all(STOP_REAP_WAIT).await;
    isolation.remove_node_dirs();
    let _ = session_stop_tx.send(true);
    if let Err(e) = session.await {
        warn!(error = %e, "controller session task failed");
    }
    let _ = stop_tx.send(true);
    let server_result = match server_result {
        Some(r) => r,
        None => server.await,
    };
    match server_result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::StepServer(e)),
        Err(join) => {
            warn!(error = %join, "step server task failed");
            Ok(())
        }
    }
}

/// The step address the controller hands to srun: a wildcard bind is reached by node name.
fn advertised(addr: SocketAddr, node_name: &str) -> String {
    if addr.ip().is_unspecified() {
        format!("{node_name}:{}", addr.port())
    } else {
        addr.to_string()
    }
}
