//! Every conversion between the wire (`tandem_proto::v1`) and the scheduling core
//! (`tandem_sched`), in one place.
//!
//! Inbound conversions are also validation: nothing from the network reaches the core
//! unchecked. A bad field becomes `Status::invalid_argument` with one line naming the field
//! and the problem, before anything is created.
//!
//! - [`inbound`]: requests into the core's types (submit, selectors, updates), with limits.
//! - [`job_info`]: a job's wire record (`JobInfo`), its read masks and payload fields.
//! - here: the small enums and records both directions share, nodes and partitions.

use tandem_net::auth::Identity;
use tandem_proto::v1;
use tandem_sched::job::JobState;
use tandem_sched::node::{Node, NodeMode};
use tandem_sched::partition::Partition;
use tandem_sched::state::Requester;
use tandem_sched::{State, Tres};
use tonic::Status;

use crate::workers::Reported;

pub mod inbound;
pub mod job_info;

pub use inbound::{
    MAX_ARGV_BYTES, MAX_ENV_BYTES, MAX_ENV_ENTRIES, MAX_IDEMPOTENCY_KEY, MAX_PATH_BYTES,
    MAX_SCRIPT_BYTES, MAX_TEXT_BYTES, job_update, selector, submit_from_proto,
};
pub use job_info::{
    JOB_INFO_FIELDS, JobFields, PAYLOAD_FIELDS, add_payload, batch_step, job_field, job_info,
    job_info_with, reason_name,
};

/// The core's requester for a verified identity: its user, uid and whether it is an admin.
pub fn requester(who: &Identity) -> Requester {
    Requester {
        user: who.user.clone(),
        admin: who.is_admin(),
        uid: Some(who.uid),
    }
}

fn bad(field: &str, problem: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

pub fn state_to_proto(s: JobState) -> v1::JobState {
    match s {
        JobState::Pending => v1::JobState::Pending,
        JobState::Running => v1::JobState::Running,
        JobState::Suspended => v1::JobState::Suspended,
        JobState::Completing => v1::JobState::Completing,
        JobState::Completed => v1::JobState::Completed,
        JobState::Cancelled => v1::JobState::Cancelled,
        JobState::Failed => v1::JobState::Failed,
        JobState::Timeout => v1::JobState::Timeout,
        JobState::Preempted => v1::JobState::Preempted,
        JobState::NodeFail => v1::JobState::NodeFail,
        JobState::OutOfMemory => v1::JobState::OutOfMemory,
        JobState::Requeued => v1::JobState::Requeued,
    }
}

/// Unknown or unspecified states are an error, not a silent "match nothing".
pub fn state_from_proto(s: i32) -> Result<JobState, Status> {
    let p =
        v1::JobState::try_from(s).map_err(|_| bad("state", format!("unknown job state {s}")))?;
    Ok(match p {
        v1::JobState::Unspecified => return Err(bad("state", "unspecified job state")),
        v1::JobState::Pending => JobState::Pending,
        v1::JobState::Running => JobState::Running,
        v1::JobState::Completed => JobState::Completed,
        v1::JobState::Failed => JobState::Failed,
        v1::JobState::Cancelled => JobState::Cancelled,
        v1::JobState::Timeout => JobState::Timeout,
        v1::JobState::Preempted => JobState::Preempted,
        v1::JobState::NodeFail => JobState::NodeFail,
        v1::JobState::Suspended => JobState::Suspended,
        v1::JobState::Completing => JobState::Completing,
        v1::JobState::OutOfMemory => JobState::OutOfMemory,
        v1::JobState::Requeued => JobState::Requeued,
    })
}

pub fn mode_to_proto(m: NodeMode) -> v1::NodeMode {
    match m {
        NodeMode::Batch => v1::NodeMode::Batch,
        NodeMode::Kube => v1::NodeMode::Kube,
    }
}

pub fn tres(t: &Tres, gpu_type: Option<&str>) -> v1::Tres {
    v1::Tres {
        cpus: t.cpus,
        mem_mb: t.mem_mb,
        gpus: t.gpus,
        gpu_type: gpu_type.unwrap_or_default().to_owned(),
    }
}

pub fn node_info(n: &Node, reported: Option<&Reported>) -> v1::NodeInfo {
    let about = reported.cloned().unwrap_or_default();
    v1::NodeInfo {
        name: n.name.clone(),
        state: n.state().name().to_owned(),
        mode: mode_to_proto(n.mode) as i32,
        total: Some(tres(&n.total, n.gpu_type.as_deref())),
        allocated: Some(tres(&n.alloc, n.gpu_type.as_deref())),
        partitions: n.partitions.clone(),
        features: n.features.clone(),
        reason: n.reason.clone().unwrap_or_default(),
        reason_user: n
            .reason_by
            .as_ref()
            .map(|(u, _)| u.clone())
            .unwrap_or_default(),
        reason_time: n.reason_by.as_ref().map_or(0, |(_, t)| *t),
        boot_time: about.machine_boot_time,
        last_heartbeat: n.last_seen,
        address: about.step_address,
        running_jobs: n.jobs.iter().map(|j| j.0).collect(),
        worker_version: about.version,
        arch: about.arch,
        os: about.os,
        hostname: about.hostname,
        worker_start_time: about.started,
        drain: n.drain,
        // Needs the jobs; filled by the state actor's node listing.
        busy_until: 0,
    }
}

pub fn partition_info(st: &State, p: &Partition) -> v1::PartitionInfo {
    let nodes: Vec<&Node> = st.partition_nodes(&p.name).collect();
    v1::PartitionInfo {
        name: p.name.clone(),
        is_default: p.default,
        state: p.state.name().to_owned(),
        max_time_s: p.max_time.unwrap_or(0),
        default_time_s: p.default_limit().unwrap_or(0),
        max_nodes: p.max_nodes.unwrap_or(0),
        nodes: nodes.iter().map(|n| n.name.clone()).collect(),
        allowed_accounts: p.allowed_accounts.clone(),
        priority_tier: u32::from(p.priority_tier),
        priority_job_factor: u32::from(p.priority_job_factor),
        total_cpus: nodes.iter().map(|n| n.total.cpus).sum(),
        total_gpus: nodes.iter().map(|n| n.total.gpus).sum(),
        total_mem_mb: nodes.iter().map(|n| n.total.mem_mb).sum(),
        preempt_mode: if st.config().qos.iter().any(|q| !q.preempt.is_empty()) {
            "REQUEUE"
        } else {
            "OFF"
        }
        .to_owned(),
        default_mem_per_cpu_mb: st.config().sched.default_mem_per_cpu_mb,
    }
}
