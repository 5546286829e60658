//! A job's wire record (`JobInfo`): read masks, the fields built from the core's `Job`, and
//! those read from its stored payload. Kept apart from the inbound checks because listings
//! and accounting records build it for every job, so its cost is what squeue pays.

use tandem_proto::v1;
use tandem_sched::job::{Hold, Job, JobState};
use tandem_sched::{State, Tres};
use tonic::Status;

use super::{bad, mode_to_proto, state_to_proto, tres};
use crate::launch::Payload;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
