//! The bridge: Tandem's controller as a Kubernetes scheduler.
//!
//! Pods that name the scheduler `tandem` are grouped (a PodGroup, a whole JobSet, a
//! LeaderWorkerSet group, an indexed Job, or a single pod), each group becomes one
//! placeholder job in the controller's queue, and when the controller allocates, every pod
//! of the group is bound to the Kubernetes nodes behind the allocated batch nodes, all or
//! none. The same queue, priorities and Fair Tree then order training and serving.
//!
//! # Layout
//!
//! ```text
//!   pods, nodes (watch) ─▶ group        pod -> group key, expected members      pure
//!                          annotations  tandem.dev/* on the pod                  pure
//!                          resources    the pod's effective requests            pure
//!                          policy       annotation > namespace default > cluster pure
//!                          request      group -> placeholder job request         pure
//!                          decide       (group, job) -> Submit | Bind | Evict ... pure
//!                          nodes        (node, controller's mode) -> label/taint pure
//!                          holder       (node, mode, GPU holder) -> create/delete pure
//! ```
//!
//! The I/O half: [`scheduler`] (watches, the placeholder stream, operations of up to 256
//! groups in flight, one per group at a time), [`apply`] (bindings, evictions, status
//! writes), [`batch`] (the controller client), [`leader`] (the Lease: only the leader
//! schedules) and [`webhook`] (admission, served by every replica).
//!
//! # Invariants
//!
//! - A group is bound all at once or not at all: [`decide`] returns a complete assignment
//!   for every unbound member, or none.
//! - Every check fails closed: an unknown job state never evicts or deletes a pod.
//! - A terminating pod keeps its slot until its containers have really stopped.

pub mod annotations;
pub mod apply;
pub mod batch;
pub mod cluster;
pub mod decide;
pub mod fit;
pub mod group;
pub mod holder;
pub mod labels;
pub mod leader;
pub mod nodes;
pub mod policy;
pub mod quantity;
pub mod rbac;
pub mod request;
pub mod resources;
pub mod scheduler;
pub mod webhook;
