//! Tandem's gRPC contract (package `tandem.v1`).
//!
//! # Services
//!
//! | service | served by | used by |
//! |---|---|---|
//! | `Jobs` | controller | CLI (sbatch, squeue, scancel, scontrol, srun), bridge |
//! | `Nodes` | controller | CLI (sinfo, scontrol), operator |
//! | `Accounting` | controller | CLI (sacct, sacctmgr, sshare, sprio) |
//! | `WorkerLink` | controller | worker: one bidirectional stream per node |
//! | `StepLauncher` | worker | srun: launches step tasks and streams their output |
//! | `externalscaler.ExternalScaler` | controller (`--scaler-listen`) | KEDA (vendored proto) |
//!
//! This crate holds only the contract: the generated code, and two codecs over it
//! ([`listing`], the `Jobs` server that answers `ListJobs` with bytes encoded beforehand;
//! [`raw`], message bodies as unparsed bytes). It depends on the gRPC stack alone (prost,
//! tonic). How the messages travel (sockets, TLS, credentials, discovery) is `tandem-net`'s;
//! conversions to and from the scheduling core live in the controller (`api/convert.rs`),
//! which is also where hostile input is rejected.

pub mod v1 {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    tonic::include_proto!("tandem.v1");
}

/// KEDA's external scaler contract (package `externalscaler`, vendored from kedacore/keda,
/// Apache-2.0): the controller serves it so KEDA scales worker sets on shape-aware demand.
pub mod externalscaler {
    #![allow(clippy::all, missing_docs, unreachable_pub)]
    tonic::include_proto!("externalscaler");
}

pub mod listing;
pub mod raw;
