//! The job options shared by `sbatch`, `srun` and `#SBATCH` lines, and their translation into
//! a [`JobSpec`].
//!
//! # Layers
//!
//! 1. Raw options ([`JobOpts`]) come from clap: once for the command line, once per `#SBATCH`
//!    line. Every field is optional so that "not given" is distinguishable from a default.
//! 2. [`JobOpts::merge`] lays them over each other: script lines in order (a later line wins),
//!    then the command line over all of them, as Slurm does.
//! 3. [`JobOpts::to_spec`] validates the merged options and builds the wire [`JobSpec`]. It
//!    needs the caller's environment, working directory and clock, passed in as a
//!    [`SubmitContext`] so the whole translation stays pure and table-testable.
//!
//! Resolving names against the cluster (does partition `gpu` exist, does a node have 8 GPUs)
//! is the controller's job; it rejects such a spec before anything is stored.
//!
//! This file holds the options themselves (layers 1 and 2: the clap definitions, the value
//! types, `#SBATCH` lines and `SBATCH_*` variables, merging). Beside it: `values.rs`, the
//! value parsers clap calls for each option; `spec.rs`, layer 3, the translation into a
//! [`JobSpec`] and the job's environment.
//!
//! [`JobSpec`]: tandem_proto::v1::JobSpec

use std::path::PathBuf;

use clap::{Args, Parser};
use thiserror::Error;

use crate::directives::Directive;

mod spec;
mod values;

pub use spec::{build_environment, wrap_script};
pub(crate) use values::parse_export;
use values::{
    parse_array, parse_count, parse_dependency, parse_gpus, parse_gres, parse_hostlist, parse_mem,
    parse_nice, parse_nodes, parse_open_mode, parse_time_limit, parse_warn_signal,
};

/// Everything a job can ask for. Doc comments are the `--help` text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct JobOpts {
    /// Name of the job (default: the script's file name).
    #[arg(short = 'J', long = "job-name", value_name = "NAME")]
    pub job_name: Option<String>,
    /// File for the batch script's standard output (%j %A %a %x %u %N %%).
    #[arg(short = 'o', long, value_name = "PATTERN")]
    pub output: Option<String>,
    /// File for the batch script's standard error (default: with stdout).
    #[arg(short = 'e', long, value_name = "PATTERN")]
    pub error: Option<String>,
    /// Partition to run in (default: the cluster's default partition).
    #[arg(short = 'p', long, value_name = "NAME")]
    pub partition: Option<String>,
    /// Account to charge.
    #[arg(short = 'A', long, value_name = "NAME")]
    pub account: Option<String>,
    /// Quality of service.
    #[arg(short = 'q', long, value_name = "NAME")]
    pub qos: Option<String>,
    /// Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED.
    #[arg(short = 't', long, value_name = "TIME", value_parser = parse_time_limit, allow_hyphen_values = true)]
    pub time: Option<TimeLimit>,
    /// Minimum time limit the job accepts (for backfill).
    #[arg(long = "time-min", value_name = "TIME", value_parser = parse_time_limit, allow_hyphen_values = true)]
    pub time_min: Option<TimeLimit>,
    /// Number of nodes, or a range MIN-MAX.
    #[arg(short = 'N', long, value_name = "N[-M]", value_parser = parse_nodes)]
    pub nodes: Option<NodeRange>,
    /// Number of tasks.
    #[arg(short = 'n', long, value_name = "N", value_parser = parse_count)]
    pub ntasks: Option<u32>,
    /// Tasks per node.
    #[arg(long = "ntasks-per-node", value_name = "N", value_parser = parse_count)]
    pub ntasks_per_node: Option<u32>,
    /// CPUs per task.
    #[arg(short = 'c', long = "cpus-per-task", value_name = "N", value_parser = parse_count)]
    pub cpus_per_task: Option<u32>,
    /// Memory per node, in MiB unless suffixed K, M, G or T.
    #[arg(long, value_name = "SIZE", value_parser = parse_mem, allow_hyphen_values = true)]
    pub mem: Option<u64>,
    /// Memory per allocated CPU, in MiB unless suffixed K, M, G or T.
    #[arg(long = "mem-per-cpu", value_name = "SIZE", value_parser = parse_mem, allow_hyphen_values = true)]
    pub mem_per_cpu: Option<u64>,
    /// GPUs for the whole job: [TYPE:]N.
    #[arg(short = 'G', long, value_name = "[TYPE:]N", value_parser = parse_gpus)]
    pub gpus: Option<GpuReq>,
    /// GPUs per node: [TYPE:]N.
    #[arg(long = "gpus-per-node", value_name = "[TYPE:]N", value_parser = parse_gpus)]
    pub gpus_per_node: Option<GpuReq>,
    /// GPUs per task: [TYPE:]N.
    #[arg(long = "gpus-per-task", value_name = "[TYPE:]N", value_parser = parse_gpus)]
    pub gpus_per_task: Option<GpuReq>,
    /// Generic resources per node; only gpu[:TYPE][:N] exists here.
    #[arg(long, value_name = "gpu[:TYPE]:N", value_parser = parse_gres)]
    pub gres: Option<GpuReq>,
    /// Job array: 0-99, 1,3,5, 0-99:2, with an optional %N throttle.
    #[arg(short = 'a', long, value_name = "SPEC", value_parser = parse_array)]
    pub array: Option<String>,
    /// Start after other jobs: afterok:ID[:ID], afterany, afternotok, after, singleton; ',' = all, '?' = any.
    #[arg(short = 'd', long, value_name = "LIST", value_parser = parse_dependency)]
    pub dependency: Option<String>,
    /// Do not share nodes with other jobs.
    #[arg(long, value_name = "user|mcs", num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub exclusive: Option<String>,
    /// Required node features (&, |).
    #[arg(short = 'C', long, value_name = "LIST")]
    pub constraint: Option<String>,
    /// Run this command line in a generated /bin/sh script instead of a script file.
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    pub wrap: Option<String>,
    /// Working directory of the job (default: the current directory).
    #[arg(short = 'D', long, value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Environment to pass: ALL (default), NONE, or [ALL,]VAR[=VALUE],...
    #[arg(long, value_name = "LIST", value_parser = parse_export)]
    pub export: Option<Export>,
    /// Submit the job held (released with `scontrol release`).
    #[arg(short = 'H', long)]
    pub hold: bool,
    /// Earliest start: now+N[seconds|minutes|hours|days], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]].
    #[arg(short = 'b', long, value_name = "TIME")]
    pub begin: Option<String>,
    /// Requeue the job after a node failure or preemption.
    #[arg(long)]
    pub requeue: bool,
    /// Never requeue the job.
    #[arg(long = "no-requeue")]
    pub no_requeue: bool,
    /// Print only the job id (sbatch).
    #[arg(long)]
    pub parsable: bool,
    /// Wait for the job to end and exit with its exit code (sbatch).
    #[arg(short = 'W', long)]
    pub wait: bool,
    /// Check the job and say when and where it would start, submitting nothing (sbatch).
    #[arg(long)]
    pub test_only: bool,
    /// Nodes the job must run on (host list).
    #[arg(short = 'w', long = "nodelist", value_name = "HOSTS", value_parser = parse_hostlist)]
    pub nodelist: Option<String>,
    /// Nodes the job must not run on (host list).
    #[arg(short = 'x', long = "exclude", value_name = "HOSTS", value_parser = parse_hostlist)]
    pub exclude: Option<String>,
    /// Free-form comment shown by squeue and sacct.
    #[arg(long, value_name = "TEXT")]
    pub comment: Option<String>,
    /// Lower the job's priority by this much (default 100).
    #[arg(long, value_name = "ADJ", num_args = 0..=1, require_equals = true, default_missing_value = "100", value_parser = parse_nice)]
    pub nice: Option<u32>,
    /// Accepted for script compatibility; Tandem sends no mail.
    #[arg(long = "mail-type", value_name = "TYPES")]
    pub mail_type: Option<String>,
    /// Accepted for script compatibility; Tandem sends no mail.
    #[arg(long = "mail-user", value_name = "ADDRESS")]
    pub mail_user: Option<String>,
    /// Send a signal TIME seconds (default 60) before the time limit: to the batch shell
    /// only with B:, otherwise to the job's steps (srun tasks) but not the batch shell.
    #[arg(long, value_name = "[{R|B}:]SIG[@TIME]", value_parser = parse_warn_signal)]
    pub signal: Option<WarnSignal>,
    /// Open output and error files in this mode: truncate (default) or append.
    #[arg(long = "open-mode", value_name = "append|truncate", value_parser = parse_open_mode)]
    pub open_mode: Option<OpenMode>,
    /// File for the batch script's standard input (%j %A %a %x %u %N %%; default /dev/null).
    #[arg(short = 'i', long, value_name = "PATTERN")]
    pub input: Option<String>,
}

/// `--signal`: a signal sent ahead of the time limit, so a job can checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarnSignal {
    pub number: i32,
    /// Seconds before the time limit.
    pub before_s: u32,
    /// `B:`: the batch shell only.
    pub batch_only: bool,
}

/// `--open-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    Truncate,
    Append,
}

/// A `--time` value: `None` = UNLIMITED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeLimit(pub Option<u64>);

/// `-N MIN[-MAX]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRange {
    pub min: u32,
    pub max: u32,
}

/// A GPU count with an optional type, from `--gpus*` or `--gres=gpu...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReq {
    pub gpu_type: Option<String>,
    pub count: u32,
}

/// `--export`: which of the submitter's variables the job sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Export {
    /// The whole environment, plus/overridden by these assignments.
    All(Vec<(String, Option<String>)>),
    /// Only `SLURM_*` and these variables (a value from the environment when none is given).
    Only(Vec<(String, Option<String>)>),
    /// Only `SLURM_*` and a minimal login environment (see [`build_environment`]).
    None,
}

impl std::fmt::Display for Export {
    /// As `--export` takes it (`NONE`, `ALL,FOO=1`, `FOO,BAR=2`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (all, list) = match self {
            Export::None => return f.write_str("NONE"),
            Export::All(list) => (true, list),
            Export::Only(list) => (false, list),
        };
        let items = all
            .then(|| "ALL".to_owned())
            .into_iter()
            .chain(list.iter().map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            }));
        f.write_str(&items.collect::<Vec<_>>().join(","))
    }
}

/// What the translation to a [`JobSpec`] needs from the outside world.
#[derive(Debug, Clone)]
pub struct SubmitContext {
    /// The submitter's environment, in order.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub hostname: String,
    /// Session id of this process (`AllocNode:Sid`).
    pub sid: u32,
    /// This process's file-creation mask: the batch script's (and its output files'), as
    /// in Slurm.
    pub umask: u32,
    pub now: i64,
    /// Offset of the user's time zone, for `--begin` times of day; `None`: the local
    /// zone's, read only when a `--begin` needs it (most submits never do).
    pub utc_offset_s: Option<i32>,
}

/// What a command does when `-w` names more nodes than `-N` allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodelistOverflow {
    /// sbatch: refused before anything is sent.
    Refuse,
    /// srun: an error line, then the first nodes as written are kept.
    Eliminate,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OptsError {
    #[error("line {line}: {message}")]
    Directive { line: usize, message: String },
    #[error("{var}: {message}")]
    Env { var: String, message: String },
    #[error("invalid --begin: {0}")]
    Begin(String),
    #[error("--nodes minimum {min} is more than --ntasks {ntasks}")]
    NodesOverTasks { min: u32, ntasks: u32 },
    /// Slurm 22.05's sbatch words: `-N1 -w n1,n2` is `invalid number of nodes (-N 2-1)`.
    #[error("invalid number of nodes (-N {listed}-{max})")]
    NodelistOverMax { listed: usize, max: u32 },
    #[error("--nodelist: {0}")]
    Nodelist(String),
    #[error("conflicting GPU types {a:?} and {b:?}")]
    GpuTypeConflict { a: String, b: String },
    #[error("--mem and --mem-per-cpu are mutually exclusive")]
    MemConflict,
    #[error("--requeue and --no-requeue are mutually exclusive")]
    RequeueConflict,
}

/// sbatch's input environment variables and the options they stand for (a trailing `=`
/// marks a flag without a value).
const ENV_OPTIONS: &[(&str, &str)] = &[
    ("SBATCH_JOB_NAME", "--job-name"),
    ("SBATCH_PARTITION", "--partition"),
    ("SBATCH_ACCOUNT", "--account"),
    ("SBATCH_QOS", "--qos"),
    ("SBATCH_TIMELIMIT", "--time"),
    ("SBATCH_EXPORT", "--export"),
    ("SBATCH_GRES", "--gres"),
    ("SBATCH_GPUS", "--gpus"),
    ("SBATCH_GPUS_PER_NODE", "--gpus-per-node"),
    ("SBATCH_GPUS_PER_TASK", "--gpus-per-task"),
    ("SBATCH_MEM_PER_CPU", "--mem-per-cpu"),
    ("SBATCH_CONSTRAINT", "--constraint"),
    ("SBATCH_EXCLUSIVE", "--exclusive="),
    ("SBATCH_REQUEUE", "--requeue="),
    ("SBATCH_NO_REQUEUE", "--no-requeue="),
    ("SBATCH_HOLD", "--hold="),
    ("SBATCH_WAIT", "--wait="),
    ("SBATCH_SIGNAL", "--signal"),
    ("SBATCH_OPEN_MODE", "--open-mode"),
];

/// Parses one `#SBATCH` line's arguments.
#[derive(Debug, Parser)]
#[command(
    no_binary_name = true,
    disable_help_flag = true,
    infer_long_args = true,
    args_override_self = true
)]
struct DirectiveLine {
    #[command(flatten)]
    opts: JobOpts,
}

impl JobOpts {
    /// Parses script directives into one `JobOpts`; a later line overrides an earlier one.
    pub fn from_directives(directives: &[Directive]) -> Result<JobOpts, OptsError> {
        let mut acc = JobOpts::default();
        for d in directives {
            let line =
                DirectiveLine::try_parse_from(&d.args).map_err(|e| OptsError::Directive {
                    line: d.line,
                    message: clap_one_line(&e),
                })?;
            acc = acc.merge(line.opts);
        }
        Ok(acc)
    }

    /// Options from `SBATCH_*` input variables. They sit between the script and the command
    /// line: `script.merge(env).merge(command_line)`, as in Slurm.
    pub fn from_env(env: &[(String, String)]) -> Result<JobOpts, OptsError> {
        let mut acc = JobOpts::default();
        for (var, value) in env {
            let Some(flag) = ENV_OPTIONS
                .iter()
                .find(|(name, _)| name == var)
                .map(|(_, flag)| *flag)
            else {
                continue;
            };
            let args = if flag.ends_with('=') {
                // Boolean options: a set variable turns them on.
                vec![flag.trim_end_matches('=').to_string()]
            } else {
                vec![format!("{flag}={value}")]
            };
            let line = DirectiveLine::try_parse_from(&args).map_err(|e| OptsError::Env {
                var: var.clone(),
                message: clap_one_line(&e),
            })?;
            acc = acc.merge(line.opts);
        }
        Ok(acc)
    }

    /// `over` wins wherever it says something.
    pub fn merge(self, over: JobOpts) -> JobOpts {
        // Either requeue flag on the winning side decides; otherwise keep the base's choice.
        let (requeue, no_requeue) = if over.requeue || over.no_requeue {
            (over.requeue, over.no_requeue)
        } else {
            (self.requeue, self.no_requeue)
        };
        JobOpts {
            job_name: over.job_name.or(self.job_name),
            output: over.output.or(self.output),
            error: over.error.or(self.error),
            partition: over.partition.or(self.partition),
            account: over.account.or(self.account),
            qos: over.qos.or(self.qos),
            time: over.time.or(self.time),
            time_min: over.time_min.or(self.time_min),
            nodes: over.nodes.or(self.nodes),
            ntasks: over.ntasks.or(self.ntasks),
            ntasks_per_node: over.ntasks_per_node.or(self.ntasks_per_node),
            cpus_per_task: over.cpus_per_task.or(self.cpus_per_task),
            // --mem and --mem-per-cpu replace each other, as in Slurm.
            mem: if over.mem_per_cpu.is_some() {
                over.mem
            } else {
                over.mem.or(self.mem)
            },
            mem_per_cpu: if over.mem.is_some() {
                over.mem_per_cpu
            } else {
                over.mem_per_cpu.or(self.mem_per_cpu)
            },
            gpus: over.gpus.or(self.gpus),
            gpus_per_node: over.gpus_per_node.or(self.gpus_per_node),
            gpus_per_task: over.gpus_per_task.or(self.gpus_per_task),
            gres: over.gres.or(self.gres),
            array: over.array.or(self.array),
            dependency: over.dependency.or(self.dependency),
            exclusive: over.exclusive.or(self.exclusive),
            constraint: over.constraint.or(self.constraint),
            wrap: over.wrap.or(self.wrap),
            chdir: over.chdir.or(self.chdir),
            export: over.export.or(self.export),
            hold: over.hold || self.hold,
            begin: over.begin.or(self.begin),
            requeue,
            no_requeue,
            parsable: over.parsable || self.parsable,
            wait: over.wait || self.wait,
            test_only: over.test_only || self.test_only,
            nodelist: over.nodelist.or(self.nodelist),
            exclude: over.exclude.or(self.exclude),
            comment: over.comment.or(self.comment),
            nice: over.nice.or(self.nice),
            mail_type: over.mail_type.or(self.mail_type),
            mail_user: over.mail_user.or(self.mail_user),
            signal: over.signal.or(self.signal),
            open_mode: over.open_mode.or(self.open_mode),
            input: over.input.or(self.input),
        }
    }

    /// Settles `-N` against `-n` and `-w` as Slurm 22.05's sbatch and srun do before they ask
    /// for an allocation; returns the lines they print and go on after (`Warning: ...`,
    /// `error: ...`, for `<command>: ` to prefix).
    ///
    /// - Fewer tasks than nodes (`-N` minimum, else the nodes `-w` names): `Warning: can't
    ///   run 1 processes on 2 nodes, setting nnodes to 1`, `-N` becomes the task count and
    ///   `-w` keeps that many of its nodes in host-list order (`-n1 -w n2,n1` runs on n1).
    /// - Else `-w` naming more nodes than `-N` allows: sbatch refuses (`invalid number of
    ///   nodes (-N 2-1)`); srun says `error: Required nodelist includes more nodes than
    ///   permitted by max-node count (2 > 1). Eliminating nodes from the nodelist.` and keeps
    ///   the first ones as written (`-N1 -w n3,n1` runs on n3), counting a node named twice
    ///   twice, as Slurm does.
    pub fn settle_node_count(
        &mut self,
        overflow: NodelistOverflow,
    ) -> Result<Vec<String>, OptsError> {
        let given = match &self.nodelist {
            Some(l) => {
                tandem_sched::hostlist::expand(l).map_err(|e| OptsError::Nodelist(e.to_string()))?
            }
            None => Vec::new(),
        };
        let sorted = if given.is_empty() {
            Vec::new()
        } else {
            tandem_sched::hostlist::expand(&tandem_sched::hostlist::compress(&given))
                .map_err(|e| OptsError::Nodelist(e.to_string()))?
        };
        let listed = u32::try_from(sorted.len()).unwrap_or(u32::MAX);
        let mut lines = Vec::new();
        let nodes = self.nodes.map_or(listed, |r| r.min);
        if let Some(n) = self.ntasks.filter(|n| *n > 0)
            && nodes > n
        {
            lines.push(format!(
                "Warning: can't run {n} processes on {nodes} nodes, setting nnodes to {n}"
            ));
            self.nodes = Some(NodeRange { min: n, max: n });
            if listed > n {
                let keep = usize::try_from(n).unwrap_or(usize::MAX);
                self.nodelist = Some(tandem_sched::hostlist::compress(&sorted[..keep]));
            }
            return Ok(lines);
        }
        let Some(range) = self.nodes.filter(|r| r.max > 0) else {
            return Ok(lines);
        };
        let max = usize::try_from(range.max).unwrap_or(usize::MAX);
        match overflow {
            NodelistOverflow::Refuse if sorted.len() > max => Err(OptsError::NodelistOverMax {
                listed: sorted.len(),
                max: range.max,
            }),
            NodelistOverflow::Eliminate if given.len() > max => {
                lines.push(format!(
                    "error: Required nodelist includes more nodes than permitted by max-node \
                     count ({} > {}). Eliminating nodes from the nodelist.",
                    given.len(),
                    range.max
                ));
                self.nodelist = Some(tandem_sched::hostlist::compress(&given[..max]));
                Ok(lines)
            }
            _ => Ok(lines),
        }
    }
}

/// The first line of a clap error, without clap's `error: ` prefix and usage text.
pub fn clap_one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments").trim();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

#[cfg(test)]
mod tests;
