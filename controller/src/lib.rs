//! Tandem's batch controller daemon: gRPC API, durable store, scheduling loop, accounting.
//!
//! ```text
//!  sbatch/squeue/...  workers (WorkerLink streams)
//!        │                 │  ▲
//!        ▼                 ▼  │ LaunchJob / SignalJob / AbandonJob
//!  api/ (tonic services, auth interceptor, convert + validate, authz)
//!        │ Command + oneshot reply
//!        ▼
//!  state actor (one thread owns tandem_sched::State)
//!        │  apply commands ─▶ take_changes ─▶ Batch ──────────┐
//!        │  scheduling pass (event driven) ─▶ Batch + launches │
//!        ▼                                                    ▼
//!  committer thread: group commit to SQLite (store/), then effects in order:
//!  replies to callers, launches and signals to workers
//! ```
//!
//! # Layout
//!
//! - [`config`]: `Args` (clap) -> validated [`Config`], the TOML cluster file.
//! - `server`: [`run`], which wires everything and shuts down in order.
//! - `state`: the actor: commands, flush (persist), pass, timers.
//! - [`store`]: SQLite schema, group commit, recovery.
//! - [`api`]: the gRPC services; `convert` (proto <-> core) and `authz` (pure rules).
//! - `workers`: connected worker streams and liveness.
//! - [`launch`]: payloads, the `SLURM_*` environment, output paths (pure).
//! - `steps`: step placement and records (pure).
//! - [`metrics`]: the Prometheus registry (Slurm openmetrics names) served at `/metrics`, and
//!   the demand snapshots the actor publishes after passes for [`api::scaler`] (KEDA).
//!
//! # Invariants
//!
//! - Nothing is acknowledged before it is durable; nothing is launched before the pass that
//!   started it is durable.
//! - Only the state actor changes the model and only the committer writes the store.
//! - A pending job costs the controller its core record only; scripts, environments and
//!   other payload stay in the store until launch.

pub mod api;
pub mod config;
pub mod idle;
pub mod launch;
pub mod metrics;
mod server;
mod state;
mod steps;
pub mod store;
mod workers;

pub use config::{Args, Config, ConfigError};
pub use server::run;

use std::path::PathBuf;

/// Why the controller could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Key(#[from] tandem_net::auth::KeyError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("cannot recover the controller state from {path}")]
    Recover {
        path: PathBuf,
        #[source]
        source: store::recover::RecoverError,
    },
    #[error("cannot start the {what} thread")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot serve the local socket")]
    BindLocal(#[source] std::io::Error),
    #[error("gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
    #[error("controller stopped: {0}")]
    Stopped(String),
}
