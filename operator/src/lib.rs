//! The Tandem operator: `TandemCluster`, `WorkerSet` and `LoginSet` custom resources run a
//! Tandem batch cluster as pods, and keep it as declared.
//!
//! # Layout
//!
//! ```text
//!   watch events ─▶ reconcile::{cluster, workerset, loginset}   thin async shells
//!                        │ observe (kube API, BatchControl)
//!                        ▼
//!                   plan / accounting / status        pure: (spec, observed, now) -> actions
//!                        │
//!                        ▼
//!                   render::*                          pure: CR -> Pod / Service / ConfigMap ...
//!                        │ apply actions (kube API, BatchControl), Events
//! ```
//!
//! - [`crd`]: the resource types; `tandem-operator crds` prints their CRDs.
//! - [`validate`]: static checks of a spec (the CEL rules' Rust twin).
//! - [`plan`]: worker-set decisions: scale out, victims, drain, deadline, replacement,
//!   rollout, deletion. [`accounting`]: spec -> Accounting RPCs, only for managed entities.
//!   [`partitions`]: which partitions to keep while jobs reference them.
//! - [`batch`]: the controller as the operator sees it ([`batch::BatchControl`]);
//!   [`connections`]: one connection per cluster, made through [`connections::Connect`].
//! - [`reconcile`]: the three reconcilers, each a list of named steps; [`daemon`]: the
//!   watches and controllers that run them; [`events`], [`secrets`]: what they share.
//! - [`rbac`]: every API call the operator makes, and the RBAC rules derived from it.
//!
//! # Invariants
//!
//! - A worker pod is deleted only when its node is drained and idle in a successful
//!   controller lookup, or its drain deadline passed (and its node was set DOWN first: batch
//!   jobs requeued or NODE_FAIL, bridged pods evicted, the node held until they are gone).
//! - The operator clears only drains whose reason starts with
//!   [`labels::DRAIN_REASON_PREFIX`].
//! - The cluster key lives only in a Secret and reaches pods as a mounted file.

pub mod accounting;
pub mod batch;
pub mod connections;
pub mod crd;
pub mod daemon;
pub mod defaults;
pub mod events;
/// The API clients (with `TCP_NODELAY`), shared with the bridge.
pub use tandem_kubeclient::client as kubeclient;
/// Every label, annotation and taint name the operator writes (shared with the bridge).
pub use tandem_kubeclient::labels;
pub mod partitions;
pub mod plan;
pub mod rbac;
pub mod reconcile;
pub mod render;
pub mod secrets;
pub mod status;
pub mod validate;
