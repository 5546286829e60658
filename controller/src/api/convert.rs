//! Every conversion between the wire (`tandem_proto::v1`) and the scheduling core
//! (`tandem_sched`), in one place.
//!
//! Inbound conversions are also validation: nothing from the network reaches the core
//! unchecked. A bad field becomes `Status::invalid_argument` with one line naming the field
//! and the problem, before anything is created.

use tandem_proto::auth::Identity;
use tandem_proto::v1;
use tandem_sched::array::ArraySpec;
use tandem_sched::constraint::Constraint;
use tandem_sched::dependency::Dependency;
use tandem_sched::job::{Hold, Job, JobSpec, JobState};
use tandem_sched::node::{Node, NodeMode};
use tandem_sched::partition::Partition;
use tandem_sched::state::{JobSelector, JobUpdate};
use tandem_sched::{JobId, State, Tres};
use tonic::Status;

use crate::launch::Payload;
use crate::workers::Reported;

/// Slurm's default `max_script_size` is 4 MB.
pub const MAX_SCRIPT_BYTES: usize = 4 << 20;
/// Environment of one job, all entries together.
pub const MAX_ENV_BYTES: usize = 1 << 20;
pub const MAX_ENV_ENTRIES: usize = 10_000;
pub const MAX_ARGV_BYTES: usize = 1 << 20;
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_TEXT_BYTES: usize = 1024;
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

fn bad(field: &str, problem: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

fn no_nul(field: &str, s: &str) -> Result<(), Status> {
    if s.contains('\0') {
        return Err(bad(field, "contains a NUL byte"));
    }
    Ok(())
}

fn text(field: &str, s: &str, max: usize) -> Result<(), Status> {
    if s.len() > max {
        return Err(bad(field, format!("longer than {max} bytes")));
    }
    no_nul(field, s)
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn hosts(field: &str, expr: &str) -> Result<Vec<String>, Status> {
    if expr.trim().is_empty() {
        return Ok(Vec::new());
    }
    text(field, expr, MAX_TEXT_BYTES * 16)?;
    tandem_sched::hostlist::expand(expr).map_err(|e| bad(field, e))
}

/// Validates a submission and splits it into the scheduling spec and the stored payload.
/// The job's user is the caller's verified identity, whatever the request says.
pub fn submit_from_proto(
    spec: v1::JobSpec,
    who: &Identity,
    max_array_size: u32,
) -> Result<(JobSpec, Payload), Status> {
    if spec.script.len() > MAX_SCRIPT_BYTES {
        return Err(bad(
            "script",
            format!("larger than {} MB", MAX_SCRIPT_BYTES >> 20),
        ));
    }
    no_nul("script", &spec.script)?;
    let argv_bytes: usize = spec.argv.iter().map(String::len).sum();
    if argv_bytes > MAX_ARGV_BYTES {
        return Err(bad("argv", "larger than 1 MB"));
    }
    for a in &spec.argv {
        no_nul("argv", a)?;
    }
    if spec.environment.len() > MAX_ENV_ENTRIES {
        return Err(bad(
            "environment",
            format!("more than {MAX_ENV_ENTRIES} variables"),
        ));
    }
    let env_bytes: usize = spec
        .environment
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(bad("environment", "larger than 1 MB"));
    }
    for (k, v) in &spec.environment {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(bad(
                "environment",
                format!(
                    "bad variable name {:?}",
                    k.chars().take(64).collect::<String>()
                ),
            ));
        }
        no_nul("environment", v)?;
    }
    if spec.workdir.is_empty() {
        return Err(bad(
            "workdir",
            "missing (sbatch sends its working directory)",
        ));
    }
    if !spec.workdir.starts_with('/') {
        return Err(bad(
            "workdir",
            format!("{:?} is not an absolute path", spec.workdir),
        ));
    }
    text("workdir", &spec.workdir, MAX_PATH_BYTES)?;
    text("output", &spec.stdout, MAX_PATH_BYTES)?;
    text("error", &spec.stderr, MAX_PATH_BYTES)?;
    text("input", &spec.stdin, MAX_PATH_BYTES)?;
    text("script path", &spec.script_path, MAX_PATH_BYTES)?;
    no_nul("script path", &spec.script_path)?;
    let warn_signal = crate::launch::WarnSignal::from_proto(
        spec.signal_number,
        spec.signal_before_s,
        spec.signal_batch_only,
    )
    .map_err(|e| bad("signal", e))?;
    if let Some(m) = spec.umask.filter(|m| *m > 0o777) {
        return Err(bad(
            "umask",
            format!("{m:o} is not a file-creation mask (at most 777)"),
        ));
    }
    text("comment", &spec.comment, MAX_TEXT_BYTES)?;
    text("submit host", &spec.submit_host, 256)?;
    text(
        "idempotency key",
        &spec.idempotency_key,
        MAX_IDEMPOTENCY_KEY,
    )?;
    if spec.requeue && spec.no_requeue {
        return Err(bad(
            "requeue",
            "--requeue and --no-requeue are mutually exclusive",
        ));
    }
    if spec.script.is_empty() && spec.argv.is_empty() {
        return Err(bad("script", "empty (give a batch script or --wrap)"));
    }

    let array = if spec.array.trim().is_empty() {
        None
    } else {
        text("array", &spec.array, MAX_TEXT_BYTES)?;
        Some(Box::new(
            ArraySpec::parse_with_max(&spec.array, max_array_size).map_err(|e| bad("array", e))?,
        ))
    };
    let dependency = if spec.dependency.trim().is_empty() {
        None
    } else {
        text("dependency", &spec.dependency, MAX_TEXT_BYTES)?;
        Some(Box::new(
            Dependency::parse(&spec.dependency).map_err(|e| bad("dependency", e))?,
        ))
    };
    let constraint = if spec.constraint.trim().is_empty() {
        None
    } else {
        text("constraint", &spec.constraint, MAX_TEXT_BYTES)?;
        Some(Box::new(
            Constraint::parse(&spec.constraint).map_err(|e| bad("constraint", e))?,
        ))
    };
    let mode = match v1::NodeMode::try_from(spec.mode) {
        Ok(v1::NodeMode::Kube) => NodeMode::Kube,
        Ok(_) => NodeMode::Batch,
        Err(_) => return Err(bad("mode", format!("unknown node mode {}", spec.mode))),
    };
    let nice = i32::try_from(spec.priority_nice).map_err(|_| bad("nice", "too large"))?;
    if spec.begin_time < 0 {
        return Err(bad("begin", "negative time"));
    }
    let sched = JobSpec {
        name: spec.name,
        user: who.user.clone(),
        uid: who.uid,
        gid: who.gid,
        account: spec.account,
        partition: spec.partition,
        qos: spec.qos,
        time_limit: (spec.time_limit_s > 0).then_some(spec.time_limit_s),
        nodes_min: spec.nodes_min,
        nodes_max: spec.nodes_max,
        ntasks: spec.ntasks,
        ntasks_per_node: spec.ntasks_per_node,
        cpus_per_task: spec.cpus_per_task,
        mem_per_node_mb: (spec.mem_per_node_mb > 0).then_some(spec.mem_per_node_mb),
        mem_per_cpu_mb: (spec.mem_per_cpu_mb > 0).then_some(spec.mem_per_cpu_mb),
        gpus: spec.gpus,
        gpus_per_node: spec.gpus_per_node,
        gpus_per_task: spec.gpus_per_task,
        gpu_type: opt(&spec.gpu_type),
        exclusive: spec.exclusive,
        constraint,
        nodelist: hosts("nodelist", &spec.nodelist)?,
        exclude: hosts("exclude", &spec.exclude)?,
        dependency,
        array,
        hold: spec.hold,
        begin: (spec.begin_time > 0).then_some(spec.begin_time),
        requeue: if spec.requeue {
            Some(true)
        } else if spec.no_requeue {
            Some(false)
        } else {
            None
        },
        mode,
        // Only the bridge's placeholders belong to a pod group (`api/bridge.rs`).
        group_uid: None,
        nice,
        priority: None,
    };
    sched
        .validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    // The spec is ours now: move its payload instead of copying it.
    let payload = Payload {
        script: spec.script,
        script_path: spec.script_path,
        argv: spec.argv,
        workdir: spec.workdir,
        environment: spec.environment.into_iter().collect(),
        stdout: spec.stdout,
        stderr: spec.stderr,
        submit_host: spec.submit_host,
        comment: spec.comment,
        stdin: spec.stdin,
        alloc_sid: spec.alloc_sid,
        open_append: spec.open_mode_append,
        signal: warn_signal,
        umask: spec.umask,
    };
    Ok((sched, payload))
}

/// `12`, `12_3`, `12_[3-5]` from the wire form.
pub fn selector(r: &v1::JobRef) -> Result<JobSelector, Status> {
    if r.job_id == 0 {
        return Err(bad("job id", "0 is not a job id"));
    }
    let tasks = r
        .array_tasks
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if tasks.is_empty() {
        return Ok(JobSelector::job(JobId(r.job_id)));
    }
    text("array tasks", tasks, MAX_TEXT_BYTES)?;
    JobSelector::parse(&format!("{}_{}", r.job_id, tasks))
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

pub fn job_update(u: &v1::JobUpdate) -> Result<JobUpdate, Status> {
    let mut out = JobUpdate {
        time_limit: u.time_limit_s.map(|t| (t > 0).then_some(t)),
        partition: u.partition.clone(),
        name: u.name.clone(),
        account: u.account.clone(),
        qos: u.qos.clone(),
        nice: u
            .nice
            .map(|n| i32::try_from(n).map_err(|_| bad("nice", "too large")))
            .transpose()?,
        dependency: None,
        priority: u.priority.map(|p| (p > 0).then_some(p)),
    };
    for (field, v) in [
        ("partition", &out.partition),
        ("name", &out.name),
        ("account", &out.account),
        ("qos", &out.qos),
    ] {
        if let Some(v) = v {
            text(field, v, 256)?;
        }
    }
    if let Some(d) = &u.dependency {
        out.dependency = Some(if d.trim().is_empty() {
            None
        } else {
            text("dependency", d, MAX_TEXT_BYTES)?;
            Some(Dependency::parse(d).map_err(|e| bad("dependency", e))?)
        });
    }
    Ok(out)
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

// === read masks ===

macro_rules! job_info_fields {
    ($($konst:ident = $number:literal $name:literal,)*) => {
        /// Proto field numbers of `JobInfo` (jobs.proto).
        pub mod job_field {
            $(pub const $konst: u32 = $number;)*
        }

        /// Every `JobInfo` field by proto name and number: what a `ListJobs` read mask names.
        pub const JOB_INFO_FIELDS: &[(&str, u32)] = &[$(($name, $number),)*];
    };
}

job_info_fields! {
    JOB_ID = 1 "job_id",
    ARRAY_JOB_ID = 2 "array_job_id",
    ARRAY_TASK_ID = 3 "array_task_id",
    ARRAY_PENDING = 4 "array_pending",
    NAME = 5 "name",
    USER = 6 "user",
    UID = 7 "uid",
    GID = 8 "gid",
    ACCOUNT = 9 "account",
    PARTITION = 10 "partition",
    QOS = 11 "qos",
    STATE = 12 "state",
    REASON = 13 "reason",
    PRIORITY = 14 "priority",
    SUBMIT_TIME = 15 "submit_time",
    ELIGIBLE_TIME = 16 "eligible_time",
    START_TIME = 17 "start_time",
    END_TIME = 18 "end_time",
    TIME_LIMIT_S = 19 "time_limit_s",
    NODELIST = 20 "nodelist",
    NUM_NODES = 21 "num_nodes",
    NUM_CPUS = 22 "num_cpus",
    NUM_TASKS = 23 "num_tasks",
    CPUS_PER_TASK = 24 "cpus_per_task",
    TRES = 25 "tres",
    EXIT_CODE = 26 "exit_code",
    EXIT_SIGNAL = 27 "exit_signal",
    WORKDIR = 28 "workdir",
    STDOUT = 29 "stdout",
    STDERR = 30 "stderr",
    DEPENDENCY = 31 "dependency",
    COMMAND = 32 "command",
    REQUEUE = 33 "requeue",
    RESTARTS = 34 "restarts",
    CONSTRAINT = 35 "constraint",
    EXCLUSIVE = 36 "exclusive",
    MODE = 37 "mode",
    STEPS = 38 "steps",
    SUBMIT_HOST = 39 "submit_host",
    GPU_BINDING = 40 "gpu_binding",
    PREEMPT_TIME = 41 "preempt_time",
    COMMENT = 42 "comment",
    MEM_PER_NODE_MB = 43 "mem_per_node_mb",
    NTASKS_PER_NODE = 44 "ntasks_per_node",
    REQ_NODELIST = 45 "req_nodelist",
    EXC_NODELIST = 46 "exc_nodelist",
    CANCELLED_BY = 47 "cancelled_by",
    NICE = 48 "nice",
    STDIN = 49 "stdin",
    ALLOC_SID = 50 "alloc_sid",
    MEM_PER_CPU_MB = 51 "mem_per_cpu_mb",
    EXPECTED_START = 52 "expected_start",
    SCHED_NODES = 53 "sched_nodes",
    USAGE = 54 "usage",
    BILLING = 55 "billing",
}

// A mask is one u64 with a bit per field number.
const _: () = {
    let mut i = 0;
    while i < JOB_INFO_FIELDS.len() {
        assert!(
            JOB_INFO_FIELDS[i].1 < 64,
            "JobInfo field numbers must stay below 64"
        );
        i += 1;
    }
};

/// Which `JobInfo` fields a reply carries (`ListJobsRequest.fields`): bit n is proto field n.
///
/// squeue prints a handful of columns: over 100,000 pending jobs its mask shrinks the reply
/// from 10.6 to 5.9 MB and skips cloning most strings of every job on the state actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobFields(u64);

impl JobFields {
    pub const ALL: JobFields = JobFields(u64::MAX);

    /// A row is always identifiable and has a state, whatever the mask says.
    const ALWAYS: [u32; 5] = [
        job_field::JOB_ID,
        job_field::ARRAY_JOB_ID,
        job_field::ARRAY_TASK_ID,
        job_field::ARRAY_PENDING,
        job_field::STATE,
    ];

    /// The mask of a request: every field when `names` is empty.
    pub fn from_names(names: &[String]) -> Result<JobFields, Status> {
        if names.is_empty() {
            return Ok(Self::ALL);
        }
        let mut bits = Self::ALWAYS.iter().fold(0u64, |b, n| b | 1 << n);
        for name in names {
            let (_, number) = JOB_INFO_FIELDS
                .iter()
                .find(|(f, _)| f == name)
                .ok_or_else(|| bad("fields", format_args!("JobInfo has no field {name:?}")))?;
            bits |= 1 << number;
        }
        Ok(JobFields(bits))
    }

    pub fn has(self, number: u32) -> bool {
        self.0 & (1 << number) != 0
    }

    /// `value()` when the field is wanted, its default (not sent on the wire) otherwise.
    fn get<T: Default>(self, number: u32, value: impl FnOnce() -> T) -> T {
        if self.has(number) {
            value()
        } else {
            T::default()
        }
    }
}

/// The wire view of a job record (without payload fields, which the caller may add).
pub fn job_info(st: &State, job: &Job) -> v1::JobInfo {
    job_info_with(st, job, JobFields::ALL)
}

/// [`job_info`] filling only the fields in `want`; the others keep their defaults.
pub fn job_info_with(st: &State, job: &Job, want: JobFields) -> v1::JobInfo {
    use job_field as f;
    let alloc = job.alloc.as_deref();
    let total = || alloc.map_or_else(|| job.shape.total(), |a| a.total());
    let array_pending = job
        .array
        .as_ref()
        .map(|a| {
            let mut s = a.pending.to_string();
            if let Some(t) = job.spec.array.as_ref().and_then(|s| s.throttle) {
                s.push_str(&format!("%{t}"));
            }
            s
        })
        .unwrap_or_default();
    let reason = || reason_name(job).to_owned();
    v1::JobInfo {
        job_id: job.id.0,
        array_job_id: job
            .array_job_id
            .map(|a| a.0)
            .or_else(|| job.array.as_ref().map(|_| job.id.0))
            .unwrap_or(0),
        array_task_id: job.array_task_id.map_or(-1, i64::from),
        array_pending,
        name: want.get(f::NAME, || job.spec.name.clone()),
        user: want.get(f::USER, || job.spec.user.clone()),
        uid: want.get(f::UID, || job.spec.uid),
        gid: want.get(f::GID, || job.spec.gid),
        account: want.get(f::ACCOUNT, || job.spec.account.clone()),
        partition: want.get(f::PARTITION, || job.spec.partition.clone()),
        qos: want.get(f::QOS, || job.spec.qos.clone()),
        // COMPLETING while an ended run's processes are awaited on a node (squeue CG,
        // scontrol JobState=COMPLETING); sacct's records keep the final state.
        state: state_to_proto(job.shown_state()) as i32,
        reason: want.get(f::REASON, reason),
        priority: want.get(f::PRIORITY, || job.priority),
        submit_time: want.get(f::SUBMIT_TIME, || job.submit_time),
        eligible_time: want.get(f::ELIGIBLE_TIME, || job.eligible_time.unwrap_or(0)),
        start_time: want.get(f::START_TIME, || job.start_time.unwrap_or(0)),
        end_time: want.get(f::END_TIME, || job.end_time.unwrap_or(0)),
        time_limit_s: want.get(f::TIME_LIMIT_S, || job.time_limit.unwrap_or(0)),
        nodelist: want.get(f::NODELIST, || {
            alloc.map(|_| st.nodelist(job)).unwrap_or_default()
        }),
        num_nodes: want.get(f::NUM_NODES, || {
            alloc.map_or(job.shape.nodes, |a| {
                u32::try_from(a.nodes.len()).unwrap_or(u32::MAX)
            })
        }),
        num_cpus: want.get(f::NUM_CPUS, || total().cpus),
        num_tasks: want.get(f::NUM_TASKS, || job.shape.ntasks),
        cpus_per_task: want.get(f::CPUS_PER_TASK, || job.spec.cpus_per_task.max(1)),
        tres: want.get(f::TRES, || {
            Some(tres(&total(), job.spec.gpu_type.as_deref()))
        }),
        exit_code: want.get(f::EXIT_CODE, || job.exit_code),
        exit_signal: want.get(f::EXIT_SIGNAL, || job.signal),
        workdir: String::new(),
        stdout: String::new(),
        stderr: String::new(),
        dependency: want.get(f::DEPENDENCY, || {
            job.spec
                .dependency
                .as_ref()
                .map(|d| d.to_string())
                .unwrap_or_default()
        }),
        command: String::new(),
        requeue: want.get(f::REQUEUE, || {
            job.spec.requeue_allowed(st.config().sched.job_requeue)
        }),
        restarts: want.get(f::RESTARTS, || job.restarts),
        constraint: want.get(f::CONSTRAINT, || {
            job.spec
                .constraint
                .as_ref()
                .map(|c| c.to_string())
                .unwrap_or_default()
        }),
        exclusive: want.get(f::EXCLUSIVE, || job.shape.exclusive),
        mode: want.get(f::MODE, || mode_to_proto(job.spec.mode) as i32),
        steps: Vec::new(),
        submit_host: String::new(),
        gpu_binding: want.get(f::GPU_BINDING, || {
            alloc.map(|a| gpu_binding(st, job, a)).unwrap_or_default()
        }),
        preempt_time: want.get(f::PREEMPT_TIME, || job.preempt_time.unwrap_or(0)),
        comment: String::new(),
        mem_per_node_mb: want.get(f::MEM_PER_NODE_MB, || job.shape.per_node.mem_mb),
        ntasks_per_node: want.get(f::NTASKS_PER_NODE, || job.shape.tasks_per_node),
        req_nodelist: want.get(f::REQ_NODELIST, || {
            tandem_sched::hostlist::compress(&job.spec.nodelist)
        }),
        exc_nodelist: want.get(f::EXC_NODELIST, || {
            tandem_sched::hostlist::compress(&job.spec.exclude)
        }),
        cancelled_by: want.get(f::CANCELLED_BY, || job.cancelled_by),
        nice: want.get(f::NICE, || job.spec.nice),
        stdin: String::new(),
        alloc_sid: 0,
        mem_per_cpu_mb: want.get(f::MEM_PER_CPU_MB, || job.spec.mem_per_cpu_mb.unwrap_or(0)),
        // The pass's plan, not the job's: the read view adds them with the pending facts.
        expected_start: 0,
        sched_nodes: String::new(),
        // Measured as a run ends: accounting records only.
        usage: None,
        billing: want.get(f::BILLING, || Some(billing(st, &total()))),
    }
}

/// A job's billing TRES: the rate fair share charges it per second (one definition, the
/// configured billing weights), truncated as Slurm stores its `billing=` count (22.05 with
/// `TRESBillingWeights=CPU=1.5,GRES/gpu=4`: 3 CPUs and 2 GPUs show `billing=12`). `as`
/// saturates, so absurd weights cannot wrap.
fn billing(st: &State, t: &Tres) -> u64 {
    st.config()
        .fairshare
        .billing
        .rate(u64::from(t.cpus), t.mem_mb, u64::from(t.gpus)) as u64
}

/// What squeue's REASON column shows for a job.
pub fn reason_name(job: &Job) -> &'static str {
    if job.state == JobState::Pending && job.hold != Hold::None {
        match job.hold {
            Hold::Admin => "JobHeldAdmin",
            _ => "JobHeldUser",
        }
    } else {
        job.reason.name()
    }
}

/// Per-node GPU indices given to a running job: `node1=0,1;node2=2,3`.
fn gpu_binding(st: &State, job: &Job, alloc: &tandem_sched::job::Allocation) -> String {
    let names = st.node_names(job);
    alloc
        .nodes
        .iter()
        .zip(&names)
        .filter(|(na, _)| !na.gpus.is_empty())
        .map(|(na, name)| {
            let ids: Vec<String> = na.gpus.iter().map(u32::to_string).collect();
            format!("{name}={}", ids.join(","))
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Fills the payload-backed fields of a job's wire view (one job shown in detail).
pub fn add_payload(info: &mut v1::JobInfo, p: &Payload, want: JobFields) {
    use job_field as f;
    info.workdir = want.get(f::WORKDIR, || p.workdir.clone());
    info.stdout = want.get(f::STDOUT, || p.stdout.clone());
    info.stderr = want.get(f::STDERR, || p.stderr.clone());
    info.submit_host = want.get(f::SUBMIT_HOST, || p.submit_host.clone());
    info.comment = want.get(f::COMMENT, || p.comment.clone());
    info.stdin = want.get(f::STDIN, || p.stdin.clone());
    info.command = want.get(f::COMMAND, || command_line(p));
    info.alloc_sid = want.get(f::ALLOC_SID, || p.alloc_sid);
}

/// Slurm's `Command` of a job: the script's path and arguments as sbatch saw them, empty
/// (Slurm's `(null)`) for `--wrap` and a script read from standard input, the command line
/// of a job with no script (an `srun` allocation).
fn command_line(p: &Payload) -> String {
    if p.script.is_empty() {
        return p.argv.join(" ");
    }
    if p.script_path.is_empty() {
        return String::new();
    }
    std::iter::once(p.script_path.as_str())
        .chain(p.argv.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `JobInfo` fields kept in the stored payload rather than in memory.
pub const PAYLOAD_FIELDS: [u32; 8] = [
    job_field::WORKDIR,
    job_field::STDOUT,
    job_field::STDERR,
    job_field::COMMAND,
    job_field::SUBMIT_HOST,
    job_field::COMMENT,
    job_field::STDIN,
    job_field::ALLOC_SID,
];

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

/// sacct's `JOBID.batch` line of a started job: the batch script's own step, on the batch
/// host, with what the job holds there, in the job's state and with its exit.
pub fn batch_step(
    info: &v1::JobInfo,
    host: &str,
    tres: Option<v1::Tres>,
    usage: Option<v1::ResourceUsage>,
) -> v1::StepInfo {
    v1::StepInfo {
        step_id: "batch".into(),
        name: "batch".into(),
        state: info.state,
        nodelist: host.to_owned(),
        ntasks: 1,
        start_time: info.start_time,
        end_time: info.end_time,
        exit_code: info.exit_code,
        signal: info.exit_signal,
        tres,
        usage,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }

    fn spec() -> v1::JobSpec {
        v1::JobSpec {
            name: "j".into(),
            script: "#!/bin/sh\necho hi\n".into(),
            workdir: "/tmp".into(),
            ..Default::default()
        }
    }

    #[test]
    fn command_is_what_slurm_shows() {
        let p = |script: &str, path: &str, argv: &[&str]| Payload {
            script: script.into(),
            script_path: path.into(),
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
            ..Payload::default()
        };
        let sh = "#!/bin/sh\ntrue\n";
        assert_eq!(
            command_line(&p(sh, "/w/job.sh", &["a", "b c"])),
            "/w/job.sh a b c"
        );
        assert_eq!(command_line(&p(sh, "./job.sh", &[])), "./job.sh");
        // --wrap and stdin: nothing to name (Slurm's `(null)`), arguments or not.
        assert_eq!(command_line(&p(sh, "", &[])), "");
        // srun's allocation names its program.
        assert_eq!(command_line(&p(sh, "sleep", &[])), "sleep");
        // A job with no script at all shows its command line.
        assert_eq!(command_line(&p("", "", &["hostname", "-s"])), "hostname -s");
    }

    #[test]
    fn a_script_path_with_a_nul_or_past_path_max_is_refused() {
        for bad_path in ["/w/a\0b".to_owned(), format!("/{}", "x".repeat(5000))] {
            let s = v1::JobSpec {
                script_path: bad_path,
                ..spec()
            };
            let err = submit_from_proto(s, &alice(), 1000).unwrap_err();
            assert!(
                err.message().starts_with("script path: "),
                "{}",
                err.message()
            );
        }
    }

    #[test]
    fn identity_wins_over_the_request_and_payload_is_split_off() {
        let mut s = spec();
        s.environment.insert("A".into(), "1".into());
        s.time_limit_s = 60;
        s.gpus_per_node = 2;
        s.array = "0-9%2".into();
        s.dependency = "afterok:1".into();
        s.nodelist = "n[1-2]".into();
        let (j, p) = submit_from_proto(s.clone(), &alice(), 1001).unwrap();
        assert_eq!((j.user.as_str(), j.uid), ("alice", 1000));
        assert_eq!(j.time_limit, Some(60));
        assert_eq!(j.gpus_per_node, 2);
        assert_eq!(j.array.unwrap().throttle, Some(2));
        assert_eq!(j.nodelist, vec!["n1", "n2"]);
        assert!(j.dependency.is_some());
        assert_eq!(p.environment["A"], "1");
        assert_eq!(p.script, s.script);
    }

    #[test]
    fn hostile_input_names_the_field() {
        type Mutate = Box<dyn Fn(&mut v1::JobSpec)>;
        let cases: Vec<(Mutate, &str)> = vec![
            (Box::new(|s| s.workdir = "rel".into()), "workdir"),
            (Box::new(|s| s.workdir.clear()), "workdir"),
            (
                Box::new(|s| s.script = "x".repeat(MAX_SCRIPT_BYTES + 1)),
                "script",
            ),
            (
                Box::new(|s| {
                    s.script.clear();
                }),
                "script",
            ),
            (Box::new(|s| s.script = "a\0b".into()), "NUL"),
            (
                Box::new(|s| {
                    s.environment.insert("A=B".into(), "x".into());
                }),
                "environment",
            ),
            (Box::new(|s| s.array = "5-1".into()), "array"),
            (Box::new(|s| s.array = "0-10".into()), "array"),
            (
                Box::new(|s| s.dependency = "afterwards:1".into()),
                "dependency",
            ),
            (Box::new(|s| s.nodelist = "n[1-".into()), "nodelist"),
            (Box::new(|s| s.mode = 99), "mode"),
            (
                Box::new(|s| {
                    s.requeue = true;
                    s.no_requeue = true;
                }),
                "requeue",
            ),
            (
                Box::new(|s| {
                    s.gpus = 1;
                    s.gpus_per_node = 1;
                }),
                "gpus",
            ),
            (Box::new(|s| s.name = "x".repeat(300)), "name"),
            (Box::new(|s| s.begin_time = -5), "begin"),
            (Box::new(|s| s.umask = Some(0o1777)), "umask"),
        ];
        for (mutate, want) in cases {
            let mut s = spec();
            mutate(&mut s);
            let err = submit_from_proto(s, &alice(), 10).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(want), "{want}: {}", err.message());
            assert!(!err.message().contains('\n'), "one line: {}", err.message());
        }
    }

    #[test]
    fn selectors_and_states_round_trip() {
        let s = selector(&v1::JobRef {
            job_id: 12,
            array_tasks: "[3-5]".into(),
        })
        .unwrap();
        assert_eq!(s.to_string(), "12_[3-5]");
        assert!(
            selector(&v1::JobRef {
                job_id: 0,
                array_tasks: String::new()
            })
            .is_err()
        );
        for st in JobState::ALL {
            assert_eq!(state_from_proto(state_to_proto(st) as i32).unwrap(), st);
        }
        assert!(state_from_proto(0).is_err());
        assert!(state_from_proto(999).is_err());
    }

    #[test]
    fn updates_convert_zero_to_unlimited() {
        let u = job_update(&v1::JobUpdate {
            time_limit_s: Some(0),
            dependency: Some(String::new()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(u.time_limit, Some(None));
        assert_eq!(u.dependency, Some(None));
        assert!(
            job_update(&v1::JobUpdate {
                dependency: Some("bogus".into()),
                ..Default::default()
            })
            .is_err()
        );
    }
}
