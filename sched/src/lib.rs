//! Tandem's scheduling core: a pure, deterministic model of a batch cluster — jobs, arrays,
//! nodes, TRES, partitions, QOS, accounts, multifactor priority, Fair Tree fair share,
//! backfill, preemption and node modes. No I/O, no clock, no async: time is an argument
//! (`now`, unix seconds; durations in seconds, `None` = UNLIMITED).
//!
//! # Use
//!
//! ```text
//!   controller                         tandem-sched
//!   ──────────                         ────────────
//!   request / worker event ──────────► State::submit / cancel / job_ended / register_node ...
//!                                        validates first; on error nothing changed
//!                          ◄────────── Result<.., Effect list>  (terminate, abandon, run ended)
//!   trigger (coalesced)    ──────────► State::schedule(now) -> Plan
//!                                        phases 0-5 (cycle.rs); starts are RUNNING already
//!   take_changes() ──► persist job/node/config/tree records ──► launch starts, signal victims
//! ```
//!
//! After a restart the controller rebuilds with [`State::restore`] from the persisted records
//! (jobs, nodes with their ids, config, account tree, next job id); running jobs stay running
//! on their nodes, which are UNKNOWN until their workers register again and report what they
//! still run ([`State::register_node`] reconciles both ways).
//!
//! # Layout
//!
//! - Slurm vocabulary, pure parsers: `time` (durations, `--begin`, timestamps), `hostlist`,
//!   `array` (compact index sets), `dependency`, `constraint`, `tres` (amounts, memory sizes).
//! - Domain records: `ids`, `job` (spec, state, reason, record), `node`, `partition`, `qos`,
//!   `account`, `config`, `effect`.
//! - The model: `state` (events, indexes, change tracking, recovery).
//! - The pass: `cycle` (phases), `select` (node choice, the planner's view), `backfill`
//!   (reservation timeline), `profile` (a node's free resources over time), `preempt` (victims); `priority` and `fairshare` (multifactor and
//!   Fair Tree) and `ranking` (the seam: builds a `PriorityInput` per job from `State` and calls
//!   `priority::priority`; the pass and sprio share it); `sim` (trace simulator).
//! - `demand`: autoscaling demand (how many workers of a shape the queue needs), from a
//!   snapshot taken after each pass.
//! - `fixtures`: fluent builders (`JobSpec::test().gpus(8).nodes(2)`) for tests and benches.
//!
//! # Invariants
//!
//! - Event methods validate before changing anything; an `Err` leaves `State` untouched.
//! - Every change to a field an index depends on (state, allocation, array indices, user,
//!   account, QOS) goes through `State::with_job`, which keeps the pending/running indexes and
//!   submit counters right and records the job in `Changes`. The pass sets
//!   `eligible_time` in place (recorded when it changes: the age factor counts from it, so it
//!   must survive a restart; a job eligible at submit gets it then) and `reason` and
//!   `priority` in place without recording them: they are recomputed every pass, the first
//!   after a restart included, so persisting them would rewrite every pending job.
//! - A node's `alloc`, `gpus_in_use` and `jobs` are exactly the sum of the allocations of the
//!   RUNNING jobs that name it; `restore` recomputes them from the jobs.
//! - An array is one record (its meta) until tasks start; each started task is its own job
//!   with a new id, `array_job_id` = the meta's id, `array_task_id` = its index.
//! - A node serves one mode at a time and switches only when empty.
//! - Within a pass resources only shrink (starts and reservations), so a job shape that could
//!   not start stays unable to start for the rest of the pass; the pass relies on this to skip
//!   identical jobs cheaply.

pub mod account;
pub mod array;
mod backfill;
pub mod config;
pub mod constraint;
pub mod cycle;
pub mod demand;
pub mod dependency;
pub mod effect;
pub mod fairshare;
mod fixtures;
pub mod hostlist;
mod ids;
pub mod job;
pub mod node;
pub mod partition;
mod preempt;
pub mod priority;
mod profile;
pub mod qos;
mod quote;
pub mod ranking;
mod select;
pub mod sim;
pub mod state;
pub mod time;
pub mod tres;

#[cfg(test)]
mod tests;

pub use config::ClusterConfig;
pub use cycle::{Plan, Reservation, Start, StartNode};
pub use effect::{Effect, Preempt, RunRecord};
pub use ids::{JobId, NodeId};
pub use job::{Job, JobOutcome, JobSpec, JobState, Reason};
pub use node::{Node, NodeMode};
pub use state::{Changes, JobSelector, NodeRegistration, Requester, State, WillRun};
pub use tres::Tres;
