//! Slurm 22.05's `--json` shapes, so scripts written against Slurm parse Tandem's answers:
//! `squeue`, `sinfo` and `scontrol show` as the OpenAPI v0.0.38 job, node and partition
//! objects, `sacct` as the accounting (dbv0.0.38) job with nested `state`, `time`,
//! `exit_code` and `steps`. Every document is `{"meta", "errors", <list>}`.
//!
//! Built from the same views as the tables. Fields Tandem has no value for are left out
//! rather than filled with made-up ones; Slurm's "unset" encodings are kept where Tandem has
//! the same notion (times are `0` until they happen, an unlimited time limit is `null`).

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::columns::SinfoRow;
use super::view::{AllocTres, ExitCode, JobView, NodeView, PartitionView};

/// The Slurm release whose JSON these shapes follow.
const SLURM_MAJOR: u32 = 22;
const SLURM_MINOR: u32 = 5;
/// The openapi plugin of that release whose objects squeue, sinfo and scontrol print.
pub const PLUGIN_V0038: &str = "openapi/v0.0.38";
/// The accounting one, for sacct.
pub const PLUGIN_DBV0038: &str = "openapi/dbv0.0.38";

/// `meta`: who answered. Tandem says so by name; `Slurm.version` is the release whose
/// output it mimics, so scripts that check it keep working.
#[derive(Debug, Serialize)]
pub struct Meta {
    pub plugin: Plugin,
    #[serde(rename = "Slurm")]
    pub slurm: SlurmRelease,
}

#[derive(Debug, Serialize)]
pub struct Plugin {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct SlurmRelease {
    pub version: Version,
    /// `22.05 (tandem 0.1.0)`: the shape's release and the program that printed it.
    pub release: String,
}

#[derive(Debug, Serialize)]
pub struct Version {
    pub major: u32,
    pub micro: u32,
    pub minor: u32,
}

impl Meta {
    pub fn new(plugin: &'static str) -> Meta {
        let tandem = env!("CARGO_PKG_VERSION");
        Meta {
            plugin: Plugin {
                kind: plugin,
                name: "tandem".to_string(),
            },
            slurm: SlurmRelease {
                version: Version {
                    major: SLURM_MAJOR,
                    micro: 0,
                    minor: SLURM_MINOR,
                },
                release: format!("{SLURM_MAJOR}.{SLURM_MINOR:02} (tandem {tandem})"),
            },
        }
    }
}

/// `{"meta": .., "errors": [], key: items}`, serialized straight from the items: squeue over
/// 100,000 jobs should not build a `serde_json::Value` tree first.
pub struct Document<'a, T> {
    pub plugin: &'static str,
    pub key: &'static str,
    pub items: &'a [T],
}

impl<T: Serialize> Serialize for Document<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("meta", &Meta::new(self.plugin))?;
        // Errors end the command with a one-line message instead; a printed document
        // is always a successful answer.
        m.serialize_entry("errors", &[] as &[String])?;
        m.serialize_entry(self.key, self.items)?;
        m.end()
    }
}

fn unset_zero(t: Option<i64>) -> i64 {
    t.unwrap_or(0)
}

/// Slurm's time limits are minutes; `null` is unlimited.
fn minutes(s: Option<u64>) -> Option<u64> {
    s.map(|s| s.div_ceil(60))
}

/// The array fields of a job record: (array_job_id, array_task_id, array_task_string).
/// A folded pending record carries its indices (`6-99%4`) where a task carries its number.
fn array_of<'v>(v: &'v JobView<'_>) -> (u64, Option<u64>, &'v str) {
    match (v.array_job_id, v.array_task_id.as_deref()) {
        (Some(base), Some(t)) => match t.parse::<u64>() {
            Ok(task) => (base, Some(task), ""),
            Err(_) => (base, None, t),
        },
        (Some(base), None) => (base, None, ""),
        (None, _) => (0, None, ""),
    }
}

/// A job as squeue and scontrol show it (v0.0.38 `job_response_properties`).
#[derive(Debug, Serialize)]
pub struct Job<'a> {
    pub account: &'a str,
    /// 0 outside arrays.
    pub array_job_id: u64,
    /// `null` outside arrays and for the folded record of pending tasks.
    pub array_task_id: Option<u64>,
    /// The folded pending indices (`6-99%4`), else empty.
    pub array_task_string: &'a str,
    /// The node that runs the batch script; empty before the job starts.
    pub batch_host: String,
    pub command: &'a str,
    pub comment: &'a str,
    pub cpus: u32,
    pub cpus_per_task: Option<u32>,
    pub current_working_directory: &'a str,
    pub dependency: &'a str,
    pub eligible_time: i64,
    pub end_time: i64,
    /// The wait status, as Slurm stores it: exit code in the high byte, signal in the low.
    pub exit_code: i64,
    /// `-x`, as a host list.
    pub excluded_nodes: &'a str,
    pub features: &'a str,
    pub group_id: u32,
    pub job_id: u64,
    pub job_state: &'static str,
    /// `--mem-per-cpu` in MB, `null` when the job asked memory per node.
    pub memory_per_cpu: Option<u64>,
    /// Memory per node in MB, `null` when asked per CPU (or not at all).
    pub memory_per_node: Option<u64>,
    pub name: &'a str,
    pub node_count: u32,
    pub nodes: &'a str,
    pub partition: &'a str,
    pub priority: u64,
    pub qos: &'a str,
    pub requeue: bool,
    /// `-w`, as a host list.
    pub required_nodes: &'a str,
    pub restart_cnt: u32,
    pub standard_error: &'a str,
    pub standard_output: &'a str,
    pub start_time: i64,
    pub state_reason: &'a str,
    pub submit_time: i64,
    pub tasks: u32,
    /// Minutes, `null` = UNLIMITED.
    pub time_limit: Option<u64>,
    /// What the job holds; empty until it starts.
    pub tres_alloc_str: String,
    pub tres_req_str: String,
    pub user_id: u32,
    pub user_name: &'a str,
}

impl<'a> Job<'a> {
    pub fn from_view(v: &'a JobView<'_>) -> Job<'a> {
        let (array_job_id, array_task_id, array_task_string) = array_of(v);
        let tres = v.tres.to_string();
        Job {
            account: v.account,
            array_job_id,
            array_task_id,
            array_task_string,
            batch_host: v.batch_host().unwrap_or_default(),
            command: v.command,
            comment: v.comment,
            cpus: v.cpus,
            cpus_per_task: (v.cpus_per_task > 0).then_some(v.cpus_per_task),
            current_working_directory: v.workdir,
            dependency: v.dependency,
            eligible_time: unset_zero(v.eligible_time),
            end_time: unset_zero(v.end_time),
            exit_code: wait_status(v.exit_code),
            excluded_nodes: v.exc_nodelist,
            features: v.constraint,
            group_id: v.gid,
            job_id: v.job_id_raw,
            job_state: v.state,
            memory_per_cpu: (v.mem_per_cpu_mb > 0).then_some(v.mem_per_cpu_mb),
            memory_per_node: (v.mem_per_cpu_mb == 0 && v.mem_mb > 0).then_some(v.mem_mb),
            name: v.name,
            node_count: v.nodes,
            nodes: v.nodelist,
            partition: v.partition,
            priority: v.priority,
            qos: v.qos,
            requeue: v.requeue,
            required_nodes: v.req_nodelist,
            restart_cnt: v.restarts,
            standard_error: v.stderr,
            standard_output: v.stdout,
            start_time: unset_zero(v.start_time),
            state_reason: v.reason,
            submit_time: unset_zero(v.submit_time),
            tasks: v.tasks,
            time_limit: minutes(v.time_limit_s),
            tres_alloc_str: if v.start_time.is_some() && !v.is_pending() {
                tres.clone()
            } else {
                String::new()
            },
            tres_req_str: tres,
            user_id: v.uid,
            user_name: v.user,
        }
    }
}

/// A job as sacct shows it (dbv0.0.38 `job`), with its steps nested.
#[derive(Debug, Serialize)]
pub struct AcctJob<'a> {
    pub account: &'a str,
    /// Nodes the job holds or held; 0 before it starts.
    pub allocation_nodes: u32,
    pub array: AcctArray<'a>,
    pub comment: AcctComment<'a>,
    pub constraints: &'a str,
    /// The highest exit of the job's steps; SUCCESS without steps, as Slurm prints it.
    pub derived_exit_code: AcctExit,
    pub exit_code: AcctExit,
    pub job_id: u64,
    pub name: &'a str,
    /// `None assigned` before it starts, as sacct says.
    pub nodes: &'a str,
    pub partition: &'a str,
    pub priority: u64,
    pub qos: &'a str,
    pub required: Required,
    pub state: AcctState<'a>,
    pub steps: Vec<AcctStep<'a>>,
    pub time: AcctTime,
    pub tres: AcctTres,
    pub user: &'a str,
    pub working_directory: &'a str,
}

#[derive(Debug, Serialize)]
pub struct AcctArray<'a> {
    /// 0 outside arrays.
    pub job_id: u64,
    /// The folded pending indices, `null` otherwise.
    pub task: Option<&'a str>,
    pub task_id: Option<u64>,
}

/// Only the user's comment: Tandem keeps no admin or system comments.
#[derive(Debug, Serialize)]
pub struct AcctComment<'a> {
    pub job: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct Required {
    #[serde(rename = "CPUs")]
    pub cpus: u32,
}

#[derive(Debug, Serialize)]
pub struct AcctState<'a> {
    pub current: &'static str,
    pub reason: &'a str,
}

#[derive(Debug, Serialize)]
pub struct AcctTime {
    pub elapsed: u64,
    pub eligible: i64,
    pub end: i64,
    /// Minutes, `null` = UNLIMITED.
    pub limit: Option<u64>,
    pub start: i64,
    pub submission: i64,
}

/// `{"status": "SUCCESS"|"FAILED"|"SIGNALED", "return_code": n, "signal": {..}}`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct AcctExit {
    pub status: &'static str,
    /// `null` when a signal ended the job.
    pub return_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<Signal>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Signal {
    pub signal_id: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'static str>,
}

impl AcctExit {
    pub fn from_exit(e: ExitCode) -> AcctExit {
        if e.signal > 0 {
            return AcctExit {
                status: "SIGNALED",
                return_code: None,
                signal: Some(Signal {
                    signal_id: e.signal,
                    name: signal_name(e.signal),
                }),
            };
        }
        AcctExit {
            status: if e.code == 0 { "SUCCESS" } else { "FAILED" },
            return_code: Some(e.code),
            signal: None,
        }
    }
}

/// The C library's description of the signals jobs usually die of (what Slurm prints).
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "Hangup",
        2 => "Interrupt",
        3 => "Quit",
        4 => "Illegal instruction",
        5 => "Trace/breakpoint trap",
        6 => "Aborted",
        7 => "Bus error",
        8 => "Floating point exception",
        9 => "Killed",
        10 => "User defined signal 1",
        11 => "Segmentation fault",
        12 => "User defined signal 2",
        13 => "Broken pipe",
        14 => "Alarm clock",
        15 => "Terminated",
        24 => "CPU time limit exceeded",
        _ => return None,
    })
}

/// The wait status Slurm keeps for a job: exit code in the high byte, signal in the low.
fn wait_status(e: ExitCode) -> i64 {
    if e.signal > 0 {
        i64::from(e.signal & 0x7f)
    } else {
        i64::from(e.code & 0xff) << 8
    }
}

#[derive(Debug, Serialize)]
pub struct AcctTres {
    /// Empty until the job starts.
    pub allocated: Vec<TresCount>,
    pub requested: Vec<TresCount>,
}

/// One TRES of a list. Slurm's database ids are left out: Tandem has no TRES table.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct TresCount {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub name: Option<&'static str>,
    pub count: u64,
}

/// cpu, mem (MB), node, billing (a job's, not a step's) and gres/gpu, in Slurm's TRES order;
/// GPUs only when there are some. (22.05: `{"type": "billing", "count": 12}` after node.)
fn tres_list(t: &AllocTres) -> Vec<TresCount> {
    let plain = |kind, count| TresCount {
        kind,
        name: None,
        count,
    };
    let mut v = vec![
        plain("cpu", u64::from(t.cpus)),
        plain("mem", t.mem_mb),
        plain("node", u64::from(t.nodes)),
    ];
    if let Some(b) = t.billing {
        v.push(plain("billing", b));
    }
    if t.gpus > 0 {
        v.push(TresCount {
            kind: "gres",
            name: Some("gpu"),
            count: u64::from(t.gpus),
        });
    }
    v
}

/// A step of a sacct job.
#[derive(Debug, Serialize)]
pub struct AcctStep<'a> {
    pub exit_code: AcctExit,
    pub nodes: StepNodes<'a>,
    pub state: &'static str,
    pub step: StepId<'a>,
    pub tasks: StepTasks,
    pub time: StepTime,
    pub tres: StepTres,
}

#[derive(Debug, Serialize)]
pub struct StepNodes<'a> {
    pub count: u32,
    pub range: &'a str,
}

#[derive(Debug, Serialize)]
pub struct StepId<'a> {
    pub job_id: u64,
    /// `"batch"`, `"extern"`, or a number for srun's steps: Slurm 22.05 prints
    /// `"id": "batch"` and `"id": 0`.
    pub id: StepNumber<'a>,
    pub name: &'a str,
}

/// A step id as Slurm's JSON writes it: a number where it is one.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum StepNumber<'a> {
    Number(u64),
    Name(&'a str),
}

impl<'a> StepNumber<'a> {
    pub fn of(id: &'a str) -> StepNumber<'a> {
        id.parse().map_or(StepNumber::Name(id), StepNumber::Number)
    }
}

#[derive(Debug, Serialize)]
pub struct StepTasks {
    pub count: u32,
}

#[derive(Debug, Serialize)]
pub struct StepTime {
    pub elapsed: u64,
    pub end: i64,
    pub start: i64,
}

#[derive(Debug, Serialize)]
pub struct StepTres {
    pub allocated: Vec<TresCount>,
}

impl<'a> AcctJob<'a> {
    /// `v` is a job row (no step id); its steps come from sacct's following rows.
    pub fn from_view(v: &'a JobView<'_>) -> AcctJob<'a> {
        let (array_job_id, task_id, task) = array_of(v);
        let started = v.start_time.is_some();
        AcctJob {
            account: v.account,
            allocation_nodes: if started { v.nodes } else { 0 },
            array: AcctArray {
                job_id: array_job_id,
                task: (!task.is_empty()).then_some(task),
                task_id,
            },
            comment: AcctComment {
                job: (!v.comment.is_empty()).then_some(v.comment),
            },
            constraints: v.constraint,
            derived_exit_code: AcctExit::from_exit(
                v.derived_exit_code
                    .unwrap_or(ExitCode { code: 0, signal: 0 }),
            ),
            exit_code: AcctExit::from_exit(v.exit_code),
            job_id: v.job_id_raw,
            name: v.name,
            nodes: if v.nodelist.is_empty() {
                "None assigned"
            } else {
                v.nodelist
            },
            partition: v.partition,
            priority: v.priority,
            qos: v.qos,
            required: Required { cpus: v.cpus },
            state: AcctState {
                current: v.state,
                reason: v.reason,
            },
            steps: Vec::new(),
            time: AcctTime {
                elapsed: v.elapsed_s,
                eligible: unset_zero(v.eligible_time),
                end: unset_zero(v.end_time),
                limit: minutes(v.time_limit_s),
                start: unset_zero(v.start_time),
                submission: unset_zero(v.submit_time),
            },
            tres: AcctTres {
                allocated: if started {
                    tres_list(&v.tres)
                } else {
                    Vec::new()
                },
                requested: tres_list(&v.tres),
            },
            user: v.user,
            working_directory: v.workdir,
        }
    }
}

impl<'a> AcctStep<'a> {
    pub fn from_view(v: &'a JobView<'_>, step_id: &'a str) -> AcctStep<'a> {
        AcctStep {
            exit_code: AcctExit::from_exit(v.exit_code),
            nodes: StepNodes {
                count: v.nodes,
                range: v.nodelist,
            },
            state: v.state,
            step: StepId {
                job_id: v.job_id_raw,
                id: StepNumber::of(step_id),
                name: v.name,
            },
            tasks: StepTasks { count: v.tasks },
            time: StepTime {
                elapsed: v.elapsed_s,
                end: unset_zero(v.end_time),
                start: unset_zero(v.start_time),
            },
            tres: StepTres {
                allocated: tres_list(&v.tres),
            },
        }
    }
}

/// sacct's rows (each job followed by its steps) regrouped into jobs with nested steps.
pub fn acct_jobs<'a>(rows: &'a [JobView<'_>]) -> Vec<AcctJob<'a>> {
    let mut jobs: Vec<AcctJob<'a>> = Vec::new();
    for r in rows {
        match (r.step_id, jobs.last_mut()) {
            (Some(id), Some(job)) => job.steps.push(AcctStep::from_view(r, id)),
            // A step without its job cannot be placed; sacct never sends one.
            (Some(_), None) => {}
            (None, _) => jobs.push(AcctJob::from_view(r)),
        }
    }
    jobs
}

/// A node as sinfo and scontrol show it (v0.0.38 `node`).
#[derive(Debug, Serialize)]
pub struct Node<'a> {
    pub active_features: String,
    pub address: &'a str,
    pub alloc_cpus: u32,
    pub alloc_memory: u64,
    /// `uname -m` as the worker reported it; empty until it registers.
    pub architecture: &'a str,
    pub boards: u32,
    pub boot_time: i64,
    /// Cores per socket: Slurm's inference for a node declared by CPU count (see `sockets`).
    pub cores: u32,
    pub cpus: u32,
    pub features: String,
    /// `gpu:8`, `gpu:h100:8`; empty without GPUs.
    pub gres: String,
    pub gres_used: String,
    pub hostname: &'a str,
    pub idle_cpus: u32,
    /// Tandem's time partition, `batch` or `kube` (not in Slurm's schema).
    pub mode: &'static str,
    pub name: &'a str,
    pub operating_system: &'a str,
    pub partitions: &'a [String],
    /// The worker's step-service port; 0 until it registers.
    pub port: u32,
    pub real_memory: u64,
    pub reason: &'a str,
    /// When the worker started (`0` unknown).
    pub slurmd_start_time: i64,
    /// The worker's version: Tandem's node daemon stands where slurmd would.
    pub slurmd_version: &'a str,
    /// One socket per CPU, one core and one thread each: Tandem keeps no CPU topology.
    pub sockets: u32,
    /// Base state, lower case: `idle`, `mixed`, `allocated`, `down`.
    pub state: &'static str,
    /// `DRAIN` while draining or drained.
    pub state_flags: Vec<&'static str>,
    pub temporary_disk: u32,
    pub threads: u32,
    pub tres: String,
    /// `null` when nothing is allocated.
    pub tres_used: Option<String>,
    pub weight: u32,
}

/// `gpu:N` or `gpu:TYPE:N`.
fn gpu_gres(count: u32, gpu_type: &str) -> String {
    match gpu_type {
        "" => format!("gpu:{count}"),
        t => format!("gpu:{t}:{count}"),
    }
}

/// `cpu=64,mem=250G,gres/gpu=8`, leaving out what is zero.
fn node_tres(cpus: u32, mem_mb: u64, gpus: u32) -> String {
    let mut parts = Vec::new();
    if cpus > 0 {
        parts.push(format!("cpu={cpus}"));
    }
    if mem_mb > 0 {
        parts.push(format!("mem={}", tandem_sched::tres::format_mem_mb(mem_mb)));
    }
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    parts.join(",")
}

impl<'a> Node<'a> {
    pub fn from_view(n: &'a NodeView) -> Node<'a> {
        // Slurm keeps draining as a flag on the state the node's use gives it.
        let (base, drain) = n.base_state();
        let state = match base {
            "IDLE" => "idle",
            "MIXED" => "mixed",
            "ALLOCATED" => "allocated",
            "DOWN" => "down",
            "COMPLETING" => "completing",
            "FUTURE" => "future",
            _ => "unknown",
        };
        let used = node_tres(n.cpus_alloc, n.mem_alloc_mb, n.gpus_alloc);
        let (host, port) = n.host_and_port().unwrap_or((n.address.as_str(), ""));
        Node {
            active_features: n.features.join(","),
            address: host,
            alloc_cpus: n.cpus_alloc,
            alloc_memory: n.mem_alloc_mb,
            architecture: &n.arch,
            boards: 1,
            boot_time: unset_zero(n.boot_time),
            cores: 1,
            cpus: n.cpus,
            features: n.features.join(","),
            gres: if n.gpus > 0 {
                gpu_gres(n.gpus, &n.gpu_type)
            } else {
                String::new()
            },
            gres_used: if n.gpus > 0 {
                gpu_gres(n.gpus_alloc, &n.gpu_type)
            } else {
                String::new()
            },
            hostname: if n.hostname.is_empty() {
                &n.name
            } else {
                &n.hostname
            },
            idle_cpus: n.cpus.saturating_sub(n.cpus_alloc),
            mode: n.mode,
            name: &n.name,
            operating_system: &n.os,
            partitions: &n.partitions,
            port: port.parse().unwrap_or(0),
            real_memory: n.mem_mb,
            reason: &n.reason,
            slurmd_start_time: unset_zero(n.worker_start_time),
            slurmd_version: &n.version,
            sockets: n.cpus,
            state,
            state_flags: if drain { vec!["DRAIN"] } else { Vec::new() },
            temporary_disk: 0,
            threads: 1,
            tres: node_tres(n.cpus, n.mem_mb, n.gpus),
            tres_used: (!used.is_empty()).then_some(used),
            weight: 1,
        }
    }
}

/// sinfo's nodes: each node once.
pub fn sinfo_nodes(rows: &[SinfoRow]) -> Vec<Node<'_>> {
    let mut seen = std::collections::HashSet::new();
    let mut nodes: Vec<&NodeView> = rows
        .iter()
        .flat_map(|r| &r.nodes)
        .filter(|n| seen.insert(n.name.as_str()))
        .collect();
    // By name (node-2 before node-10), as Slurm lists its node table, not in the rows'
    // state order.
    nodes.sort_by(|a, b| {
        crate::cmd::sinfo::name_key(&a.name).cmp(&crate::cmd::sinfo::name_key(&b.name))
    });
    nodes.into_iter().map(Node::from_view).collect()
}

/// A partition as scontrol shows it (v0.0.38 `partition`).
#[derive(Debug, Serialize)]
pub struct Partition<'a> {
    /// `null`: every account may use it.
    pub allowed_accounts: Option<String>,
    /// Minutes, `null` when unset.
    pub default_time_limit: Option<u64>,
    /// `default` on the default partition.
    pub flags: Vec<&'static str>,
    /// Minutes, `null` = UNLIMITED.
    pub max_time_limit: Option<u64>,
    pub maximum_nodes_per_job: Option<u32>,
    pub name: &'a str,
    pub nodes: String,
    pub priority_job_factor: u32,
    pub priority_tier: u32,
    pub state: &'a str,
    pub total_cpus: u32,
    pub total_nodes: u32,
}

impl<'a> Partition<'a> {
    pub fn from_view(p: &'a PartitionView) -> Partition<'a> {
        let names: Vec<&str> = p.nodes.iter().map(String::as_str).collect();
        Partition {
            allowed_accounts: (!p.allowed_accounts.is_empty())
                .then(|| p.allowed_accounts.join(",")),
            default_time_limit: minutes(p.default_time_s),
            flags: if p.is_default {
                vec!["default"]
            } else {
                Vec::new()
            },
            max_time_limit: minutes(p.max_time_s),
            maximum_nodes_per_job: p.max_nodes,
            name: &p.name,
            nodes: tandem_sched::hostlist::compress(&names),
            priority_job_factor: p.priority_job_factor,
            priority_tier: p.priority_tier,
            state: &p.state,
            total_cpus: p.total_cpus,
            total_nodes: p.nodes.len() as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Json, Output};
    use serde_json::{Value, json};
    use tandem_proto::v1::{JobInfo, JobState, NodeInfo, PartitionInfo, StepInfo, Tres};

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    fn job(id: u64, state: JobState) -> JobInfo {
        JobInfo {
            job_id: id,
            array_task_id: -1,
            name: "train".into(),
            user: "alice".into(),
            uid: 1000,
            gid: 100,
            account: "physics".into(),
            partition: "batch".into(),
            qos: "normal".into(),
            state: state as i32,
            priority: 4242,
            submit_time: 1_700_000_000,
            time_limit_s: 90 * 60,
            num_nodes: 1,
            num_cpus: 4,
            num_tasks: 1,
            workdir: "/home/alice".into(),
            stdout: "/home/alice/slurm-%j.out".into(),
            tres: Some(Tres {
                cpus: 4,
                mem_mb: 2048,
                gpus: 2,
                gpu_type: String::new(),
            }),
            ..JobInfo::default()
        }
    }

    fn squeue(jobs: &[JobInfo]) -> Value {
        let views: Vec<JobView> = jobs.iter().map(|j| JobView::from_job(j, 0)).collect();
        parse(&Json.jobs(&views).unwrap())
    }

    #[test]
    fn documents_carry_meta_and_errors() {
        let v = squeue(&[job(1, JobState::Pending)]);
        assert_eq!(v["meta"]["plugin"]["name"], "tandem");
        assert_eq!(v["meta"]["plugin"]["type"], "openapi/v0.0.38");
        assert_eq!(v["meta"]["Slurm"]["version"]["major"], 22);
        assert_eq!(v["meta"]["Slurm"]["version"]["minor"], 5);
        assert!(
            v["meta"]["Slurm"]["release"]
                .as_str()
                .unwrap()
                .contains("tandem")
        );
        assert_eq!(v["errors"], json!([]));
    }

    #[test]
    fn squeue_jobs_use_slurm_names_and_types() {
        let running = JobInfo {
            start_time: 1_700_000_100,
            nodelist: "node-1".into(),
            ..job(7, JobState::Running)
        };
        let task = JobInfo {
            array_job_id: 12,
            array_task_id: 3,
            start_time: 1_700_000_100,
            nodelist: "node-2".into(),
            ..job(15, JobState::Running)
        };
        let folded = JobInfo {
            array_job_id: 12,
            array_pending: "4-99%4".into(),
            reason: "JobArrayTaskLimit".into(),
            time_limit_s: 0,
            ..job(12, JobState::Pending)
        };
        let v = squeue(&[running, task, folded]);
        let jobs = v["jobs"].as_array().unwrap();
        let r = &jobs[0];
        assert_eq!(r["job_id"], 7);
        assert_eq!(r["job_state"], "RUNNING");
        assert_eq!(r["state_reason"], "None");
        assert_eq!(r["user_name"], "alice");
        assert_eq!(r["user_id"], 1000);
        assert_eq!(r["account"], "physics");
        assert_eq!(r["nodes"], "node-1");
        assert_eq!(r["node_count"], 1);
        assert_eq!(r["cpus"], 4);
        assert_eq!(r["time_limit"], 90, "minutes");
        assert_eq!(r["submit_time"], 1_700_000_000);
        assert_eq!(r["start_time"], 1_700_000_100);
        assert_eq!(r["end_time"], 0, "unset times are 0");
        assert_eq!(r["priority"], 4242);
        assert_eq!(r["array_job_id"], 0);
        assert_eq!(r["array_task_id"], Value::Null);
        assert_eq!(r["current_working_directory"], "/home/alice");
        assert_eq!(r["standard_output"], "/home/alice/slurm-%j.out");
        // 22.05: `"tres_req_str": "cpu=2,mem=1M,node=1,billing=2,gres/gpu=2"`.
        assert_eq!(
            r["tres_req_str"],
            "cpu=4,mem=2G,node=1,billing=4,gres/gpu=2"
        );
        assert_eq!(
            r["tres_alloc_str"],
            "cpu=4,mem=2G,node=1,billing=4,gres/gpu=2"
        );
        assert!(r.get("state").is_none() && r.get("reason").is_none());
        // The reference: `batch_host` the first node ("" while pending), `group_id`, and
        // memory per node or per CPU, the other one `null`.
        assert_eq!(r["batch_host"], "node-1");
        assert_eq!(r["group_id"], 100);
        assert_eq!(r["memory_per_node"], 2048);
        assert_eq!(r["memory_per_cpu"], Value::Null);

        let t = &jobs[1];
        assert_eq!(
            (&t["job_id"], &t["array_job_id"], &t["array_task_id"]),
            (&json!(15), &json!(12), &json!(3))
        );
        assert_eq!(t["array_task_string"], "");

        let f = &jobs[2];
        assert_eq!(f["job_id"], 12);
        assert_eq!(f["array_job_id"], 12);
        assert_eq!(f["array_task_id"], Value::Null);
        assert_eq!(f["array_task_string"], "4-99%4");
        assert_eq!(f["state_reason"], "JobArrayTaskLimit");
        assert_eq!(f["time_limit"], Value::Null, "UNLIMITED");
        assert_eq!(f["tres_alloc_str"], "", "nothing allocated while pending");
        assert_eq!(f["start_time"], 0);
        assert_eq!(f["batch_host"], "");

        let per_cpu = JobInfo {
            mem_per_cpu_mb: 100,
            ..job(20, JobState::Pending)
        };
        let v = squeue(&[per_cpu]);
        assert_eq!(v["jobs"][0]["memory_per_cpu"], 100);
        assert_eq!(v["jobs"][0]["memory_per_node"], Value::Null);
    }

    #[test]
    fn sacct_jobs_nest_state_time_exit_and_steps() {
        let done = JobInfo {
            start_time: 1_700_000_100,
            end_time: 1_700_000_160,
            nodelist: "node-1".into(),
            exit_code: 7,
            reason: "NonZeroExitCode".into(),
            steps: vec![StepInfo {
                step_id: "batch".into(),
                name: "batch".into(),
                state: JobState::Failed as i32,
                nodelist: "node-1".into(),
                ntasks: 1,
                start_time: 1_700_000_100,
                end_time: 1_700_000_160,
                exit_code: 7,
                signal: 0,
                tres: Some(Tres {
                    cpus: 4,
                    mem_mb: 2048,
                    gpus: 0,
                    gpu_type: String::new(),
                }),
                usage: None,
            }],
            ..job(9, JobState::Failed)
        };
        let killed = JobInfo {
            start_time: 1_700_000_100,
            end_time: 1_700_000_110,
            nodelist: "node-2".into(),
            exit_signal: 9,
            ..job(10, JobState::Cancelled)
        };
        let pending = job(11, JobState::Pending);
        let mut rows = Vec::new();
        for j in [&done, &killed, &pending] {
            let v = JobView::from_job(j, 1_700_000_200);
            let steps: Vec<JobView> = j
                .steps
                .iter()
                .map(|s| JobView::from_step(&v, s, 1_700_000_200))
                .collect();
            rows.push(v);
            rows.extend(steps);
        }
        let v = parse(&Json.records(&rows).unwrap());
        assert_eq!(v["meta"]["plugin"]["type"], "openapi/dbv0.0.38");
        let jobs = v["jobs"].as_array().unwrap();
        assert_eq!(jobs.len(), 3, "steps nest inside their job");
        let d = &jobs[0];
        assert_eq!(d["job_id"], 9);
        assert_eq!(
            d["state"],
            json!({"current": "FAILED", "reason": "NonZeroExitCode"})
        );
        assert_eq!(
            d["exit_code"],
            json!({"status": "FAILED", "return_code": 7})
        );
        assert_eq!(
            d["time"],
            json!({
                "elapsed": 60, "eligible": 0, "end": 1_700_000_160, "limit": 90,
                "start": 1_700_000_100, "submission": 1_700_000_000
            })
        );
        assert_eq!(d["user"], "alice");
        assert_eq!(d["working_directory"], "/home/alice");
        assert_eq!(d["allocation_nodes"], 1);
        assert_eq!(d["array"]["job_id"], 0);
        assert_eq!(d["array"]["task_id"], Value::Null);
        assert_eq!(
            d["tres"]["allocated"],
            json!([
                {"type": "cpu", "name": null, "count": 4},
                {"type": "mem", "name": null, "count": 2048},
                {"type": "node", "name": null, "count": 1},
                {"type": "billing", "name": null, "count": 4},
                {"type": "gres", "name": "gpu", "count": 2},
            ])
        );
        let steps = d["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 1);
        assert_eq!(
            steps[0]["step"],
            json!({"job_id": 9, "id": "batch", "name": "batch"})
        );
        assert_eq!(steps[0]["state"], "FAILED");
        assert_eq!(steps[0]["nodes"], json!({"count": 1, "range": "node-1"}));
        assert_eq!(steps[0]["time"]["elapsed"], 60);

        let k = &jobs[1];
        assert_eq!(
            k["exit_code"],
            json!({"status": "SIGNALED", "return_code": null,
                   "signal": {"signal_id": 9, "name": "Killed"}})
        );
        assert_eq!(k["steps"], json!([]));

        let p = &jobs[2];
        assert_eq!(p["state"]["current"], "PENDING");
        assert_eq!(p["nodes"], "None assigned");
        assert_eq!(p["time"]["start"], 0);
        assert_eq!(p["allocation_nodes"], 0);
        assert_eq!(p["tres"]["allocated"], json!([]));
        assert_eq!(
            p["tres"]["requested"][0],
            json!({"type": "cpu", "name": null, "count": 4})
        );
        // Billing after node, as 22.05 lists it: the controller's weighted figure.
        let billed = JobInfo {
            billing: Some(70),
            ..job(9, JobState::Pending)
        };
        let v = JobView::from_job(&billed, 0);
        let listed: Vec<(&str, u64)> = tres_list(&v.tres)
            .iter()
            .map(|t| (t.kind, t.count))
            .collect();
        assert_eq!(
            listed,
            [
                ("cpu", 4),
                ("mem", 2048),
                ("node", 1),
                ("billing", 70),
                ("gres", 2)
            ]
        );
    }

    #[test]
    fn squeue_exit_code_is_the_wait_status() {
        assert_eq!(wait_status(ExitCode { code: 1, signal: 0 }), 256);
        assert_eq!(wait_status(ExitCode { code: 0, signal: 9 }), 9);
        assert_eq!(wait_status(ExitCode { code: 0, signal: 0 }), 0);
    }

    fn node(name: &str, state: &str, cpus_alloc: u32, gpus_alloc: u32) -> NodeView {
        NodeView::from_node(&NodeInfo {
            name: name.into(),
            state: state.into(),
            total: Some(Tres {
                cpus: 64,
                mem_mb: 256 * 1024,
                gpus: 8,
                gpu_type: "h100".into(),
            }),
            allocated: Some(Tres {
                cpus: cpus_alloc,
                mem_mb: 0,
                gpus: gpus_alloc,
                gpu_type: String::new(),
            }),
            partitions: vec!["batch".into(), "gpu".into()],
            address: "10.0.0.1:6818".into(),
            worker_version: "0.1.0".into(),
            arch: "x86_64".into(),
            os: "Linux 6.8.0".into(),
            worker_start_time: 1_796_456_415,
            ..NodeInfo::default()
        })
    }

    #[test]
    fn sinfo_lists_each_node_once_with_slurm_states() {
        let nodes = vec![
            node("node-1", "MIXED", 2, 1),
            node("node-2", "DRAINED", 0, 0),
            node("node-3", "DRAINING", 64, 8),
        ];
        let part = |name: &str| {
            PartitionView::from_partition(&PartitionInfo {
                name: name.into(),
                nodes: nodes.iter().map(|n| n.name.clone()).collect(),
                ..PartitionInfo::default()
            })
        };
        let rows = crate::cmd::sinfo::group(
            &[part("batch"), part("gpu")],
            &nodes,
            &[],
            &[],
            crate::cmd::sinfo::Grouping::State,
        );
        let v = parse(&Json.sinfo(&rows).unwrap());
        assert!(v.get("sinfo").is_none());
        let got = v["nodes"].as_array().unwrap();
        let names: Vec<&str> = got.iter().map(|n| n["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["node-1", "node-2", "node-3"],
            "once, not per partition"
        );
        let n1 = &got[0];
        assert_eq!(n1["state"], "mixed");
        assert_eq!(n1["state_flags"], json!([]));
        assert_eq!(n1["mode"], "batch");
        assert_eq!(n1["cpus"], 64);
        assert_eq!(n1["alloc_cpus"], 2);
        assert_eq!(n1["idle_cpus"], 62);
        assert_eq!(n1["real_memory"], 256 * 1024);
        // v0.0.38's machine fields: the worker's report, and Slurm's values for what Tandem
        // does not keep (no topology: a socket per CPU).
        assert_eq!(n1["address"], "10.0.0.1");
        assert_eq!(n1["port"], 6818);
        assert_eq!(n1["hostname"], "node-1");
        assert_eq!(n1["architecture"], "x86_64");
        assert_eq!(n1["operating_system"], "Linux 6.8.0");
        assert_eq!(n1["slurmd_start_time"], 1_796_456_415);
        assert_eq!(
            (&n1["sockets"], &n1["cores"], &n1["threads"], &n1["boards"]),
            (&json!(64), &json!(1), &json!(1), &json!(1))
        );
        assert_eq!(
            (&n1["weight"], &n1["temporary_disk"]),
            (&json!(1), &json!(0))
        );
        assert_eq!(n1["gres"], "gpu:h100:8");
        assert_eq!(n1["gres_used"], "gpu:h100:1");
        assert_eq!(n1["tres"], "cpu=64,mem=256G,gres/gpu=8");
        assert_eq!(n1["tres_used"], "cpu=2,gres/gpu=1");
        assert_eq!(n1["partitions"], json!(["batch", "gpu"]));
        assert_eq!(n1["slurmd_version"], "0.1.0");
        assert_eq!(
            (
                &got[1]["state"],
                &got[1]["state_flags"],
                &got[1]["tres_used"]
            ),
            (&json!("idle"), &json!(["DRAIN"]), &Value::Null)
        );
        assert_eq!(
            (&got[2]["state"], &got[2]["state_flags"]),
            (&json!("allocated"), &json!(["DRAIN"]))
        );
    }

    #[test]
    fn partitions_use_slurm_names_and_minutes() {
        let p = PartitionView::from_partition(&PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            max_time_s: 2 * 86_400,
            nodes: vec!["node-1".into(), "node-2".into()],
            total_cpus: 128,
            ..PartitionInfo::default()
        });
        let v = parse(&Json.partition_details(&[p]));
        let got = &v["partitions"][0];
        assert_eq!(got["name"], "batch");
        assert_eq!(got["flags"], json!(["default"]));
        assert_eq!(got["max_time_limit"], 2 * 1440);
        assert_eq!(got["default_time_limit"], Value::Null);
        assert_eq!(got["nodes"], "node-[1-2]");
        assert_eq!(got["total_nodes"], 2);
        assert_eq!(got["total_cpus"], 128);
        assert_eq!(got["state"], "UP");
        assert_eq!(got["allowed_accounts"], Value::Null);
    }
}
