//! Display models: what the commands show about jobs, nodes and partitions, derived once from
//! the wire types. The human columns and the JSON output ([`super::slurm_json`]) both read
//! these, so they cannot disagree about a state name, a time or an id.

use tandem_proto::v1::{JobInfo, JobState, NodeInfo, PartitionInfo, StepInfo};
use tandem_sched::time::{format_duration, format_timestamp};

/// A job, an array task, a folded pending array record, or a step (sacct). Borrows its
/// strings from the wire record: squeue over 100,000 jobs should not copy each name twice.
#[derive(Debug, Clone)]
pub struct JobView<'a> {
    /// `12`, `12_3`, `12_[6-99]`, or `12.batch` / `12.0` for steps.
    pub job_id: String,
    /// The numeric id of the job record.
    pub job_id_raw: u64,
    pub array_job_id: Option<u64>,
    /// Task index, or the folded pending indices.
    pub array_task_id: Option<String>,
    pub step_id: Option<&'a str>,
    pub name: &'a str,
    pub user: &'a str,
    pub uid: u32,
    pub account: &'a str,
    pub partition: &'a str,
    pub qos: &'a str,
    /// Slurm's full state name (`RUNNING`).
    pub state: &'static str,
    /// Slurm's compact state code (`R`).
    pub state_compact: &'static str,
    pub reason: &'a str,
    pub priority: u64,
    pub submit_time: Option<i64>,
    pub eligible_time: Option<i64>,
    pub start_time: Option<i64>,
    pub end_time: Option<i64>,
    /// Seconds the job has run (to `now` while running).
    pub elapsed_s: u64,
    /// `None` = UNLIMITED.
    pub time_limit_s: Option<u64>,
    pub nodes: u32,
    pub nodelist: &'a str,
    pub cpus: u32,
    pub tasks: u32,
    pub cpus_per_task: u32,
    /// `--ntasks-per-node`; 0 when not asked.
    pub ntasks_per_node: u32,
    pub mem_mb: u64,
    pub gpus: u32,
    pub gpu_type: &'a str,
    /// `cpu=4,mem=1G,node=1,gres/gpu=2` (sacct's AllocTRES).
    pub tres: AllocTres,
    /// `exit:signal`.
    pub exit_code: ExitCode,
    /// sacct's DerivedExitCode of an allocation row: the highest exit of the job's steps
    /// (srun's, not the batch script's). `None` elsewhere, shown blank as Slurm does.
    pub derived_exit_code: Option<ExitCode>,
    pub workdir: &'a str,
    pub stdout: &'a str,
    pub stderr: &'a str,
    pub command: &'a str,
    pub dependency: &'a str,
    pub comment: &'a str,
    pub constraint: &'a str,
    /// Pending: when and where the scheduler's plan expects the job to start (`squeue
    /// --start`, scontrol's `StartTime` and `SchedNodeList`); `None` and empty without one.
    pub expected_start: Option<i64>,
    pub sched_nodes: &'a str,
    /// `-w` and `-x` as sorted host lists, empty when not given.
    pub req_nodelist: &'a str,
    pub exc_nodelist: &'a str,
    /// The uid whose cancel ended the job (not set on step rows).
    pub cancelled_by: Option<u32>,
    pub exclusive: bool,
    pub requeue: bool,
    pub restarts: u32,
    pub submit_host: &'a str,
    pub gid: u32,
    pub nice: i32,
    /// `--input` as submitted; empty = none.
    pub stdin: &'a str,
    /// Session id of the submitting process (`AllocNode:Sid`); 0 = unknown.
    pub alloc_sid: u32,
    /// `--mem-per-cpu`; 0 when the job asked for memory per node (or none).
    pub mem_per_cpu_mb: u64,
    /// CPU time and peak memory the worker measured as the job or step ended.
    pub usage: Option<&'a tandem_proto::v1::ResourceUsage>,
}

/// Slurm's name for a state: the proto enum names are Slurm's with a prefix.
pub fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Unspecified => "UNKNOWN",
        JobState::Pending => "PENDING",
        JobState::Running => "RUNNING",
        JobState::Completed => "COMPLETED",
        JobState::Failed => "FAILED",
        JobState::Cancelled => "CANCELLED",
        JobState::Timeout => "TIMEOUT",
        JobState::Preempted => "PREEMPTED",
        JobState::NodeFail => "NODE_FAIL",
        JobState::Suspended => "SUSPENDED",
        JobState::Completing => "COMPLETING",
        JobState::OutOfMemory => "OUT_OF_MEMORY",
        JobState::Requeued => "REQUEUED",
    }
}

/// squeue's two-letter codes.
pub fn state_compact(s: JobState) -> &'static str {
    match s {
        JobState::Unspecified => "??",
        JobState::Pending => "PD",
        JobState::Running => "R",
        JobState::Completed => "CD",
        JobState::Failed => "F",
        JobState::Cancelled => "CA",
        JobState::Timeout => "TO",
        JobState::Preempted => "PR",
        JobState::NodeFail => "NF",
        JobState::Suspended => "S",
        JobState::Completing => "CG",
        JobState::OutOfMemory => "OOM",
        JobState::Requeued => "RQ",
    }
}

/// Parses a state as users type it for `-t`: full name or code, any case.
pub fn parse_state(s: &str) -> Option<JobState> {
    let up = s.trim().to_ascii_uppercase();
    let all = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::Preempted,
        JobState::NodeFail,
        JobState::Suspended,
        JobState::Completing,
        JobState::OutOfMemory,
        JobState::Requeued,
    ];
    all.into_iter()
        .find(|st| state_name(*st) == up || state_compact(*st) == up)
        .or_else(|| (up == "CANCELED").then_some(JobState::Cancelled))
}

fn opt_time(t: i64) -> Option<i64> {
    (t > 0).then_some(t)
}

/// Seconds a job or step has run: to its end, or to `now` while it runs.
pub fn elapsed_s(start_time: i64, end_time: i64, now: i64) -> u64 {
    match (opt_time(start_time), opt_time(end_time)) {
        (Some(s), Some(e)) => (e - s).max(0) as u64,
        (Some(s), None) => (now - s).max(0) as u64,
        _ => 0,
    }
}

/// What a job or step holds: scontrol's `TRES=` (`cpu=4,mem=2G,node=1,billing=4,gres/gpu=2`,
/// Slurm's TRES order) and sacct's AllocTRES (the same names sorted:
/// `billing=4,cpu=4,gres/gpu=2,mem=2G,node=1`). Formatted only when shown: squeue over many
/// jobs never needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocTres {
    pub cpus: u32,
    pub mem_mb: u64,
    pub nodes: u32,
    pub gpus: u32,
    /// The job's billing TRES, which only the job's own record carries (a step's is
    /// `None`): the controller's figure, weighted as fair share charges the job.
    pub billing: Option<u64>,
}

impl AllocTres {
    /// `name=value` pairs in Slurm's TRES order. Memory is left out when the job holds
    /// none (Slurm never writes `mem=0M`); a step without memory says `mem=0`, as 22.05.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![("cpu", self.cpus.to_string())];
        match (self.mem_mb, self.billing.is_some()) {
            (0, true) => {}
            (0, false) => v.push(("mem", "0".to_owned())),
            (mb, _) => v.push(("mem", tandem_sched::tres::format_mem_mb(mb))),
        }
        v.push(("node", self.nodes.to_string()));
        if let Some(b) = self.billing {
            v.push(("billing", b.to_string()));
        }
        if self.gpus > 0 {
            v.push(("gres/gpu", self.gpus.to_string()));
        }
        v
    }

    /// sacct's AllocTRES: the pairs sorted by name (Slurm 22.05:
    /// `billing=2,cpu=2,gres/gpu=2,node=1`, a step `cpu=2,gres/gpu=2,mem=0,node=1`).
    pub fn sorted(&self) -> String {
        let mut v = self.pairs();
        v.sort_by_key(|(k, _)| *k);
        join_pairs(&v)
    }
}

fn join_pairs(v: &[(&str, String)]) -> String {
    v.iter()
        .map(|(k, x)| format!("{k}={x}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl std::fmt::Display for AllocTres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&join_pairs(&self.pairs()))
    }
}

/// `exit:signal`, as Slurm prints ExitCode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitCode {
    pub code: i32,
    pub signal: i32,
}

impl ExitCode {
    /// The exit as a wait(2) status (`code << 8 | signal`): Slurm compares steps' exits in
    /// this form, so an exit code outranks any signal.
    pub fn wait_status(self) -> i64 {
        (i64::from(self.code) << 8) | i64::from(self.signal)
    }
}

impl std::fmt::Display for ExitCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.code, self.signal)
    }
}

impl<'a> JobView<'a> {
    pub fn from_job(j: &'a JobInfo, now: i64) -> JobView<'a> {
        let state = j.state();
        let tres = j.tres.as_ref();
        let (job_id, array_job_id, array_task_id) = if !j.array_pending.is_empty() {
            let base = if j.array_job_id > 0 {
                j.array_job_id
            } else {
                j.job_id
            };
            (
                format!("{base}_[{}]", j.array_pending),
                Some(base),
                Some(j.array_pending.clone()),
            )
        } else if j.array_task_id >= 0 {
            (
                format!("{}_{}", j.array_job_id, j.array_task_id),
                Some(j.array_job_id),
                Some(j.array_task_id.to_string()),
            )
        } else {
            (j.job_id.to_string(), None, None)
        };
        let elapsed_s = elapsed_s(j.start_time, j.end_time, now);
        JobView {
            job_id,
            job_id_raw: j.job_id,
            array_job_id,
            array_task_id,
            step_id: None,
            name: &j.name,
            user: &j.user,
            uid: j.uid,
            account: &j.account,
            partition: &j.partition,
            qos: &j.qos,
            state: state_name(state),
            state_compact: state_compact(state),
            reason: if j.reason.is_empty() {
                "None"
            } else {
                &j.reason
            },
            priority: j.priority,
            submit_time: opt_time(j.submit_time),
            eligible_time: opt_time(j.eligible_time),
            start_time: opt_time(j.start_time),
            end_time: opt_time(j.end_time),
            elapsed_s,
            time_limit_s: (j.time_limit_s > 0).then_some(j.time_limit_s),
            nodes: j.num_nodes,
            nodelist: &j.nodelist,
            cpus: j.num_cpus,
            tasks: j.num_tasks,
            cpus_per_task: j.cpus_per_task,
            ntasks_per_node: j.ntasks_per_node,
            mem_mb: tres.map_or(0, |t| t.mem_mb),
            gpus: tres.map_or(0, |t| t.gpus),
            gpu_type: tres.map_or("", |t| t.gpu_type.as_str()),
            tres: AllocTres {
                cpus: j.num_cpus,
                mem_mb: tres.map_or(0, |t| t.mem_mb),
                nodes: j.num_nodes,
                gpus: tres.map_or(0, |t| t.gpus),
                // A record written before the controller sent billing: Slurm's
                // unweighted billing, one unit per CPU.
                billing: Some(j.billing.unwrap_or_else(|| u64::from(j.num_cpus))),
            },
            exit_code: ExitCode {
                code: j.exit_code,
                signal: j.exit_signal,
            },
            derived_exit_code: None,
            workdir: &j.workdir,
            stdout: &j.stdout,
            stderr: &j.stderr,
            command: &j.command,
            dependency: &j.dependency,
            comment: &j.comment,
            constraint: &j.constraint,
            expected_start: opt_time(j.expected_start),
            sched_nodes: &j.sched_nodes,
            req_nodelist: &j.req_nodelist,
            exc_nodelist: &j.exc_nodelist,
            cancelled_by: j.cancelled_by,
            exclusive: j.exclusive,
            requeue: j.requeue,
            restarts: j.restarts,
            submit_host: &j.submit_host,
            gid: j.gid,
            nice: j.nice,
            stdin: &j.stdin,
            alloc_sid: j.alloc_sid,
            mem_per_cpu_mb: j.mem_per_cpu_mb,
            usage: j.usage.as_ref(),
        }
    }

    /// The node that runs the batch script (the first of the job's nodes), once it has any.
    pub fn batch_host(&self) -> Option<String> {
        tandem_sched::hostlist::first(self.nodelist)
    }

    /// A step row for sacct: it inherits the job's identity and reports its own use.
    pub fn from_step(job: &JobView<'a>, s: &'a StepInfo, now: i64) -> JobView<'a> {
        let tres = s.tres.clone().unwrap_or_default();
        let elapsed_s = elapsed_s(s.start_time, s.end_time, now);
        let nodes = if s.nodelist.is_empty() {
            0
        } else {
            tandem_sched::hostlist::expand(&s.nodelist).map_or(0, |v| v.len() as u32)
        };
        JobView {
            job_id: format!("{}.{}", job.job_id, s.step_id),
            step_id: Some(&s.step_id),
            name: if s.name.is_empty() {
                &s.step_id
            } else {
                &s.name
            },
            state: state_name(s.state()),
            state_compact: state_compact(s.state()),
            start_time: opt_time(s.start_time),
            end_time: opt_time(s.end_time),
            elapsed_s,
            nodes,
            nodelist: &s.nodelist,
            cpus: tres.cpus,
            tasks: s.ntasks,
            mem_mb: tres.mem_mb,
            gpus: tres.gpus,
            tres: AllocTres {
                cpus: tres.cpus,
                mem_mb: tres.mem_mb,
                nodes,
                gpus: tres.gpus,
                billing: None,
            },
            exit_code: ExitCode {
                code: s.exit_code,
                signal: s.signal,
            },
            derived_exit_code: None,
            cancelled_by: None,
            expected_start: None,
            sched_nodes: "",
            usage: s.usage.as_ref(),
            ..job.clone()
        }
    }

    pub fn is_pending(&self) -> bool {
        self.state == "PENDING"
    }

    /// The end Slurm shows: a finished job's end; else its start (a pending job's planned
    /// one) plus its time limit, the end it is expected by; none without a limit.
    pub fn shown_end(&self) -> Option<i64> {
        if self.end_time.is_some() {
            return self.end_time;
        }
        let start = if self.is_pending() {
            self.expected_start
        } else {
            self.start_time
        };
        start
            .zip(self.time_limit_s)
            .map(|(t, limit)| t.saturating_add(i64::try_from(limit).unwrap_or(i64::MAX)))
    }

    /// squeue's `%R`: why a job waits, or why it failed (FAILED, TIMEOUT and OUT_OF_MEMORY
    /// print their reason, as Slurm's squeue does: `(NonZeroExitCode)`), else the nodes it
    /// holds or held.
    pub fn reason_or_nodes(&self) -> String {
        let failed = matches!(self.state, "FAILED" | "TIMEOUT" | "OUT_OF_MEMORY");
        if self.is_pending() || failed || self.nodelist.is_empty() {
            format!("({})", self.reason)
        } else {
            self.nodelist.to_string()
        }
    }

    pub fn time_used(&self) -> String {
        format_duration(Some(self.elapsed_s))
    }

    /// GPUs on each node of the job as Slurm's TRES string (`gres/gpu:2`,
    /// `gres/gpu:h100:2`), `None` without GPUs. `gpus` is the whole job's; every node of a
    /// job gets the same share, so the per-node figure is the total over the nodes.
    pub fn tres_per_node(&self) -> Option<String> {
        let per_node = self.gpus / self.nodes.max(1);
        match (self.gpus, self.gpu_type) {
            (0, _) => None,
            (_, "") => Some(format!("gres/gpu:{per_node}")),
            (_, t) => Some(format!("gres/gpu:{t}:{per_node}")),
        }
    }

    pub fn time_limit(&self) -> String {
        format_duration(self.time_limit_s)
    }

    pub fn time_left(&self) -> String {
        match self.time_limit_s {
            None => "UNLIMITED".to_string(),
            Some(l) => format_duration(Some(l.saturating_sub(self.elapsed_s))),
        }
    }
}

/// Prints optional timestamps as Slurm does (`Unknown` when unset).
pub fn timestamp(t: Option<i64>, utc_offset_s: i32) -> String {
    match t {
        Some(t) => format_timestamp(t, utc_offset_s),
        None => "Unknown".to_string(),
    }
}

/// A node as sinfo and scontrol show it.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub name: String,
    /// Slurm's long state, upper case (`IDLE`, `MIXED`, `ALLOCATED`, `DOWN`, `DRAINED`).
    pub state: String,
    pub mode: &'static str,
    pub cpus: u32,
    pub cpus_alloc: u32,
    pub mem_mb: u64,
    pub mem_alloc_mb: u64,
    pub gpus: u32,
    pub gpus_alloc: u32,
    pub gpu_type: String,
    pub partitions: Vec<String>,
    pub features: Vec<String>,
    pub reason: String,
    /// Who gave the reason and when (sinfo -R); `None` when unknown.
    pub reason_by: Option<(String, i64)>,
    /// The worker's step service, `host:port` (`[v6]:port`); empty when not heard from.
    pub address: String,
    /// When the machine booted and when its worker started.
    pub boot_time: Option<i64>,
    pub worker_start_time: Option<i64>,
    pub last_heartbeat: Option<i64>,
    pub running_jobs: Vec<u64>,
    pub version: String,
    /// `uname`'s machine, and system, release and version; empty when not heard from.
    pub arch: String,
    pub os: String,
    pub hostname: String,
}

impl NodeView {
    pub fn from_node(n: &NodeInfo) -> NodeView {
        let total = n.total.clone().unwrap_or_default();
        let alloc = n.allocated.clone().unwrap_or_default();
        NodeView {
            name: n.name.clone(),
            state: n.state.to_ascii_uppercase(),
            mode: match n.mode() {
                tandem_proto::v1::NodeMode::Kube => "kube",
                _ => "batch",
            },
            cpus: total.cpus,
            cpus_alloc: alloc.cpus,
            mem_mb: total.mem_mb,
            mem_alloc_mb: alloc.mem_mb,
            gpus: total.gpus,
            gpus_alloc: alloc.gpus,
            gpu_type: total.gpu_type.clone(),
            partitions: n.partitions.clone(),
            features: n.features.clone(),
            reason: n.reason.clone(),
            reason_by: (!n.reason_user.is_empty() && n.reason_time > 0)
                .then(|| (n.reason_user.clone(), n.reason_time)),
            address: n.address.clone(),
            boot_time: opt_time(n.boot_time),
            worker_start_time: opt_time(n.worker_start_time),
            last_heartbeat: opt_time(n.last_heartbeat),
            running_jobs: n.running_jobs.clone(),
            version: n.worker_version.clone(),
            arch: n.arch.clone(),
            os: n.os.clone(),
            hostname: n.hostname.clone(),
        }
    }

    /// The state without the drain flag, as Slurm keeps it (`IDLE`, `MIXED`, `ALLOCATED`,
    /// `DOWN`, ...: a draining or drained node is still idle, mixed or allocated), and whether
    /// it drains.
    pub fn base_state(&self) -> (&'static str, bool) {
        let s = self.state.as_str();
        let base = s.split('+').next().unwrap_or(s);
        let busy = if self.cpus_alloc >= self.cpus && self.cpus > 0 {
            "ALLOCATED"
        } else if self.cpus_alloc > 0 || self.gpus_alloc > 0 {
            "MIXED"
        } else {
            "IDLE"
        };
        let (state, drain) = match base {
            "IDLE" => ("IDLE", false),
            "MIXED" => ("MIXED", false),
            "ALLOCATED" => ("ALLOCATED", false),
            "DOWN" => ("DOWN", false),
            "DRAINED" | "DRAINING" | "DRAIN" => (busy, true),
            "COMPLETING" => ("COMPLETING", false),
            "FUTURE" => ("FUTURE", false),
            _ => ("UNKNOWN", false),
        };
        (state, drain || s.contains("+DRAIN"))
    }

    /// scontrol's `State=`: the base state and its flags, `IDLE+DRAIN`, `MIXED+DRAIN`.
    pub fn state_with_flags(&self) -> String {
        match self.base_state() {
            (base, true) => format!("{base}+DRAIN"),
            (base, false) => base.to_string(),
        }
    }

    /// The step service's host and port, split as scontrol prints them (`NodeAddr=`,
    /// `Port=`); `None` when the address is unknown or has no port.
    pub fn host_and_port(&self) -> Option<(&str, &str)> {
        let (host, port) = self.address.rsplit_once(':')?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        (!host.is_empty() && !port.is_empty()).then_some((host, port))
    }

    /// sinfo's compact state (`idle`, `mix`, `alloc`, `down`, `drain`, `drng`).
    pub fn state_compact(&self) -> String {
        let s = self.state.as_str();
        let base = s.split('+').next().unwrap_or(s);
        let short = match base {
            "IDLE" => "idle",
            "MIXED" => "mix",
            "ALLOCATED" => "alloc",
            "DOWN" => "down",
            "DRAINED" => "drain",
            "DRAINING" => "drng",
            "COMPLETING" => "comp",
            "UNKNOWN" => "unk",
            "FUTURE" => "futr",
            other => return other.to_ascii_lowercase(),
        };
        short.to_string()
    }

    /// `gpu:8` or `gpu:h100:8`, `(null)` without GPUs (sinfo `%G`, scontrol `Gres=`).
    pub fn gres(&self) -> String {
        match (self.gpus, self.gpu_type.as_str()) {
            (0, _) => "(null)".to_string(),
            (n, "") => format!("gpu:{n}"),
            (n, t) => format!("gpu:{t}:{n}"),
        }
    }
}

/// A partition as sinfo and scontrol show it.
#[derive(Debug, Clone)]
pub struct PartitionView {
    pub name: String,
    pub is_default: bool,
    /// `UP`, `DOWN`, `DRAIN`, `INACTIVE`.
    pub state: String,
    pub max_time_s: Option<u64>,
    pub default_time_s: Option<u64>,
    pub max_nodes: Option<u32>,
    pub nodes: Vec<String>,
    pub total_cpus: u32,
    pub total_gpus: u32,
    pub total_mem_mb: u64,
    /// `OFF`, or the mode preempted jobs get unless their QOS names one.
    pub preempt_mode: String,
    /// `DefMemPerCPU`, MB; `None` when jobs without `--mem` reserve none.
    pub default_mem_per_cpu_mb: Option<u64>,
    pub priority_tier: u32,
    pub priority_job_factor: u32,
    pub allowed_accounts: Vec<String>,
}

impl PartitionView {
    pub fn from_partition(p: &PartitionInfo) -> PartitionView {
        PartitionView {
            name: p.name.clone(),
            is_default: p.is_default,
            state: if p.state.is_empty() {
                "UP".to_string()
            } else {
                p.state.to_ascii_uppercase()
            },
            max_time_s: (p.max_time_s > 0).then_some(p.max_time_s),
            default_time_s: (p.default_time_s > 0).then_some(p.default_time_s),
            max_nodes: (p.max_nodes > 0).then_some(p.max_nodes),
            nodes: p.nodes.clone(),
            total_cpus: p.total_cpus,
            total_gpus: p.total_gpus,
            total_mem_mb: p.total_mem_mb,
            preempt_mode: if p.preempt_mode.is_empty() {
                "OFF".to_string()
            } else {
                p.preempt_mode.clone()
            },
            default_mem_per_cpu_mb: (p.default_mem_per_cpu_mb > 0)
                .then_some(p.default_mem_per_cpu_mb),
            priority_tier: p.priority_tier,
            priority_job_factor: p.priority_job_factor,
            allowed_accounts: p.allowed_accounts.clone(),
        }
    }

    /// sinfo's TIMELIMIT: `infinite` or `D-HH:MM:SS`.
    pub fn time_limit(&self) -> String {
        match self.max_time_s {
            None => "infinite".to_string(),
            Some(s) => {
                let (d, h, m, sec) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
                if d > 0 {
                    format!("{d}-{h:02}:{m:02}:{sec:02}")
                } else {
                    format!("{h}:{m:02}:{sec:02}")
                }
            }
        }
    }

    /// Name with `*` for the default partition, as sinfo marks it.
    pub fn display_name(&self) -> String {
        if self.is_default {
            format!("{}*", self.name)
        } else {
            self.name.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_proto::v1::Tres;

    pub(crate) fn job(id: u64, state: JobState) -> JobInfo {
        JobInfo {
            job_id: id,
            array_task_id: -1,
            name: "train".into(),
            user: "alice".into(),
            partition: "batch".into(),
            state: state as i32,
            num_nodes: 1,
            num_cpus: 4,
            tres: Some(Tres {
                cpus: 4,
                mem_mb: 2048,
                gpus: 2,
                gpu_type: String::new(),
            }),
            ..JobInfo::default()
        }
    }

    #[test]
    fn ids_of_plain_jobs_array_tasks_and_folded_arrays() {
        let info = job(7, JobState::Running);
        let plain = JobView::from_job(&info, 0);
        assert_eq!(plain.job_id, "7");
        let task = JobInfo {
            array_job_id: 12,
            array_task_id: 3,
            ..job(15, JobState::Running)
        };
        assert_eq!(JobView::from_job(&task, 0).job_id, "12_3");
        let folded = JobInfo {
            array_job_id: 12,
            array_pending: "6-99%4".into(),
            ..job(12, JobState::Pending)
        };
        assert_eq!(JobView::from_job(&folded, 0).job_id, "12_[6-99%4]");
    }

    #[test]
    fn times_and_reasons() {
        let running = JobInfo {
            start_time: 1000,
            time_limit_s: 3600,
            nodelist: "node-1".into(),
            ..job(1, JobState::Running)
        };
        let v = JobView::from_job(&running, 1000 + 65);
        assert_eq!(
            (v.time_used(), v.time_limit(), v.time_left()),
            ("1:05".into(), "1:00:00".into(), "58:55".into())
        );
        assert_eq!(v.reason_or_nodes(), "node-1");
        assert_eq!(
            v.tres.to_string(),
            "cpu=4,mem=2G,node=1,billing=4,gres/gpu=2"
        );
        assert_eq!(v.tres.sorted(), "billing=4,cpu=4,gres/gpu=2,mem=2G,node=1");
        let pending = JobInfo {
            reason: "Resources".into(),
            ..job(2, JobState::Pending)
        };
        let v = JobView::from_job(&pending, 5);
        assert_eq!(
            (v.reason_or_nodes(), v.time_used(), v.time_limit()),
            ("(Resources)".into(), "0:00".into(), "UNLIMITED".into())
        );
    }

    /// Issue 29: billing is the controller's weighted figure, not the CPU count; only a
    /// record from before the controller sent it falls back to one unit per CPU.
    #[test]
    fn billing_is_the_controllers_weighted_figure() {
        let weighted = JobInfo {
            billing: Some(36),
            ..job(3, JobState::Running)
        };
        let v = JobView::from_job(&weighted, 0);
        assert_eq!(v.tres.sorted(), "billing=36,cpu=4,gres/gpu=2,mem=2G,node=1");
        assert_eq!(
            v.tres.to_string(),
            "cpu=4,mem=2G,node=1,billing=36,gres/gpu=2"
        );
        let unweighted = job(4, JobState::Running);
        let old = JobView::from_job(&unweighted, 0);
        assert!(old.tres.sorted().starts_with("billing=4,"), "{}", old.tres);
        // A step carries no billing, and says mem=0 when it holds none.
        let step = AllocTres {
            cpus: 2,
            mem_mb: 0,
            nodes: 1,
            gpus: 0,
            billing: None,
        };
        assert_eq!(step.sorted(), "cpu=2,mem=0,node=1");
    }

    #[test]
    fn states_parse_by_name_and_code() {
        assert_eq!(parse_state("pd"), Some(JobState::Pending));
        assert_eq!(parse_state("RUNNING"), Some(JobState::Running));
        assert_eq!(parse_state("canceled"), Some(JobState::Cancelled));
        assert_eq!(parse_state("nope"), None);
    }
}
