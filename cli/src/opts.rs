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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, Parser};
use tandem_proto::v1::JobSpec;
use thiserror::Error;

use crate::directives::Directive;

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

    /// The working directory the job will run in.
    pub fn workdir(&self, cwd: &Path) -> PathBuf {
        match &self.chdir {
            Some(d) => cwd.join(d),
            None => cwd.to_path_buf(),
        }
    }

    /// The variables Slurm's sbatch adds to the environment it sends, repeating the request
    /// as it was made: `SLURM_GPUS` for `--gpus`, `SLURM_GPUS_PER_NODE` for
    /// `--gpus-per-node` (not `--gres`), `SLURM_GPUS_PER_TASK` for `--gpus-per-task`; and
    /// for an `--export` other than `ALL`, `SLURM_EXPORT_ENV` (which an `srun` inside the
    /// job takes as its own `--export`) and `SLURM_GET_USER_ENV=1`.
    fn request_environment(
        &self,
        mut env: BTreeMap<String, String>,
    ) -> std::collections::HashMap<String, String> {
        if let Some(export) = &self.export
            && *export != Export::All(Vec::new())
        {
            env.insert("SLURM_EXPORT_ENV".to_owned(), export.to_string());
            env.insert("SLURM_GET_USER_ENV".to_owned(), "1".to_owned());
        }
        for (name, req) in [
            ("SLURM_GPUS", &self.gpus),
            ("SLURM_GPUS_PER_NODE", &self.gpus_per_node),
            ("SLURM_GPUS_PER_TASK", &self.gpus_per_task),
        ] {
            if let Some(r) = req {
                let value = match &r.gpu_type {
                    Some(t) => format!("{t}:{}", r.count),
                    None => r.count.to_string(),
                };
                env.insert(name.to_owned(), value);
            }
        }
        env.into_iter().collect()
    }

    /// Validates the merged options and builds the spec. `script` is the batch script text
    /// (already checked for `#!`), `default_name` the name used without `-J`.
    pub fn to_spec(
        &self,
        script: String,
        argv: Vec<String>,
        default_name: &str,
        ctx: &SubmitContext,
    ) -> Result<JobSpec, OptsError> {
        if self.mem.is_some() && self.mem_per_cpu.is_some() {
            return Err(OptsError::MemConflict);
        }
        if self.requeue && self.no_requeue {
            return Err(OptsError::RequeueConflict);
        }
        let nodes = self.nodes.unwrap_or(NodeRange { min: 0, max: 0 });
        if let Some(ntasks) = self.ntasks
            && nodes.min > ntasks
        {
            return Err(OptsError::NodesOverTasks {
                min: nodes.min,
                ntasks,
            });
        }
        let gpu_type = self.gpu_type()?;
        let begin_time = match &self.begin {
            None => 0,
            Some(b) => {
                let offset = ctx
                    .utc_offset_s
                    .unwrap_or_else(crate::clock::local_utc_offset);
                tandem_sched::time::parse_begin_with_offset(b, ctx.now, offset)
                    .map_err(|e| OptsError::Begin(e.to_string()))?
            }
        };
        let workdir = self.workdir(&ctx.cwd);
        // Relative output paths are relative to the job's working directory, not to wherever
        // the worker happens to run; making them absolute here removes the ambiguity.
        let path_in_workdir = |p: &Option<String>| match p {
            None => String::new(),
            Some(p) if p.is_empty() || Path::new(p).is_absolute() => p.clone(),
            Some(p) => workdir.join(p).to_string_lossy().into_owned(),
        };
        let gpus_per_node = self
            .gpus_per_node
            .as_ref()
            .or(self.gres.as_ref())
            .map_or(0, |g| g.count);
        Ok(JobSpec {
            name: self
                .job_name
                .clone()
                .unwrap_or_else(|| default_name.to_string()),
            script,
            argv,
            workdir: workdir.to_string_lossy().into_owned(),
            environment: self.request_environment(build_environment(
                self.export.as_ref().unwrap_or(&Export::All(Vec::new())),
                &ctx.env,
            )),
            stdout: path_in_workdir(&self.output),
            stderr: path_in_workdir(&self.error),
            partition: self.partition.clone().unwrap_or_default(),
            account: self.account.clone().unwrap_or_default(),
            qos: self.qos.clone().unwrap_or_default(),
            // UNLIMITED and "not given" both travel as 0: the partition's limit applies, and
            // a partition without one is unlimited.
            time_limit_s: self.time.and_then(|t| t.0).unwrap_or(0),
            time_min_s: self.time_min.and_then(|t| t.0).unwrap_or(0),
            nodes_min: nodes.min,
            nodes_max: nodes.max,
            ntasks: self.ntasks.unwrap_or(0),
            ntasks_per_node: self.ntasks_per_node.unwrap_or(0),
            cpus_per_task: self.cpus_per_task.unwrap_or(0),
            mem_per_node_mb: self.mem.unwrap_or(0),
            mem_per_cpu_mb: self.mem_per_cpu.unwrap_or(0),
            gpus: self.gpus.as_ref().map_or(0, |g| g.count),
            gpus_per_node,
            gpus_per_task: self.gpus_per_task.as_ref().map_or(0, |g| g.count),
            gpu_type: gpu_type.unwrap_or_default(),
            array: self.array.clone().unwrap_or_default(),
            dependency: self.dependency.clone().unwrap_or_default(),
            exclusive: self.exclusive.is_some(),
            constraint: self.constraint.clone().unwrap_or_default(),
            hold: self.hold,
            begin_time,
            requeue: self.requeue,
            no_requeue: self.no_requeue,
            submit_host: ctx.hostname.clone(),
            alloc_sid: ctx.sid,
            umask: Some(ctx.umask),
            comment: self.comment.clone().unwrap_or_default(),
            nodelist: self.nodelist.clone().unwrap_or_default(),
            exclude: self.exclude.clone().unwrap_or_default(),
            priority_nice: self.nice.unwrap_or(0),
            signal_number: self.signal.map_or(0, |w| w.number),
            signal_before_s: self.signal.map_or(0, |w| w.before_s),
            signal_batch_only: self.signal.is_some_and(|w| w.batch_only),
            open_mode_append: self.open_mode == Some(OpenMode::Append),
            stdin: path_in_workdir(&self.input),
            ..JobSpec::default()
        })
    }

    /// The one GPU type the job asks for, if any; two different types are an error.
    fn gpu_type(&self) -> Result<Option<String>, OptsError> {
        let mut found: Option<&String> = None;
        for t in [
            &self.gpus,
            &self.gpus_per_node,
            &self.gpus_per_task,
            &self.gres,
        ]
        .into_iter()
        .flatten()
        .filter_map(|g| g.gpu_type.as_ref())
        {
            match found {
                Some(a) if a != t => {
                    return Err(OptsError::GpuTypeConflict {
                        a: a.clone(),
                        b: t.clone(),
                    });
                }
                _ => found = Some(t),
            }
        }
        Ok(found.cloned())
    }
}

/// The job's environment under `--export`.
///
/// `NONE` cannot load the user's login environment on the node as Slurm's `--get-user-env`
/// does; instead the job gets `HOME`, `USER`, `LOGNAME`, `SHELL` from the submitter and a
/// standard `PATH`, which is what a login shell would start from.
pub fn build_environment(export: &Export, env: &[(String, String)]) -> BTreeMap<String, String> {
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let slurm_vars = || {
        env.iter()
            .filter(|(k, _)| k.starts_with("SLURM_"))
            .cloned()
            .collect::<BTreeMap<_, _>>()
    };
    let apply = |out: &mut BTreeMap<String, String>, list: &[(String, Option<String>)]| {
        for (k, v) in list {
            match v {
                Some(v) => {
                    out.insert(k.clone(), v.clone());
                }
                None => {
                    if let Some(v) = lookup(k) {
                        out.insert(k.clone(), v);
                    }
                }
            }
        }
    };
    match export {
        Export::All(extra) => {
            let mut out: BTreeMap<_, _> = env.iter().cloned().collect();
            apply(&mut out, extra);
            out
        }
        Export::Only(list) => {
            let mut out = slurm_vars();
            apply(&mut out, list);
            out
        }
        Export::None => {
            let mut out = slurm_vars();
            for k in ["HOME", "USER", "LOGNAME", "SHELL"] {
                if let Some(v) = lookup(k) {
                    out.insert(k.to_string(), v);
                }
            }
            out.insert(
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            );
            out
        }
    }
}

/// The script `--wrap` generates.
pub fn wrap_script(command: &str) -> String {
    format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n")
}

/// The first line of a clap error, without clap's `error: ` prefix and usage text.
pub fn clap_one_line(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments").trim();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

// === value parsers (clap calls these; each error is one line naming the value) ===

fn parse_time_limit(s: &str) -> Result<TimeLimit, String> {
    tandem_sched::time::parse_duration(s)
        .map(TimeLimit)
        .map_err(|e| e.to_string())
}

fn parse_count(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(0) | Err(_) => Err(format!("expected a positive whole number, got {s:?}")),
        Ok(n) => Ok(n),
    }
}

fn parse_nodes(s: &str) -> Result<NodeRange, String> {
    let (min, max) = match s.split_once('-') {
        Some((a, b)) => (parse_count(a)?, parse_count(b)?),
        None => {
            let n = parse_count(s)?;
            (n, n)
        }
    };
    if min > max {
        return Err(format!(
            "node range {s:?} has its minimum above its maximum"
        ));
    }
    Ok(NodeRange { min, max })
}

fn parse_mem(s: &str) -> Result<u64, String> {
    tandem_sched::tres::parse_mem_mb(s).map_err(|e| e.to_string())
}

/// `N` or `TYPE:N`.
fn parse_gpus(s: &str) -> Result<GpuReq, String> {
    let (ty, n) = match s.rsplit_once(':') {
        Some((t, n)) => (Some(t), n),
        None => (None, s),
    };
    if let Some(t) = ty
        && (t.is_empty() || t.contains(':'))
    {
        return Err(format!("invalid GPU request {s:?}: expected [TYPE:]N"));
    }
    let count = n
        .parse::<u32>()
        .map_err(|_| format!("invalid GPU request {s:?}: expected [TYPE:]N"))?;
    Ok(GpuReq {
        gpu_type: ty.map(str::to_string),
        count,
    })
}

/// `gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N`; a comma list may only name gpu once.
fn parse_gres(s: &str) -> Result<GpuReq, String> {
    let mut found = None;
    for item in s.split(',') {
        let mut parts = item.split(':');
        let name = parts.next().unwrap_or_default();
        if name != "gpu" {
            return Err(format!(
                "unsupported generic resource {name:?} in --gres={s}: only gpu is available"
            ));
        }
        let rest: Vec<&str> = parts.collect();
        let bad = || format!("invalid --gres={s}: expected gpu[:TYPE][:N]");
        let req = match rest.as_slice() {
            [] => GpuReq {
                gpu_type: None,
                count: 1,
            },
            [one] => match one.parse::<u32>() {
                Ok(n) => GpuReq {
                    gpu_type: None,
                    count: n,
                },
                Err(_) if !one.is_empty() => GpuReq {
                    gpu_type: Some((*one).to_string()),
                    count: 1,
                },
                Err(_) => return Err(bad()),
            },
            [ty, n] if !ty.is_empty() => GpuReq {
                gpu_type: Some((*ty).to_string()),
                count: n.parse().map_err(|_| bad())?,
            },
            _ => return Err(bad()),
        };
        if found.replace(req).is_some() {
            return Err(format!("--gres={s} names gpu twice"));
        }
    }
    found.ok_or_else(|| format!("invalid --gres={s:?}"))
}

pub(crate) fn parse_export(s: &str) -> Result<Export, String> {
    let items: Vec<&str> = s.split(',').map(str::trim).collect();
    if items.len() == 1 && items[0].eq_ignore_ascii_case("NONE") {
        return Ok(Export::None);
    }
    let mut all = false;
    let mut list = Vec::new();
    for item in items {
        if item.eq_ignore_ascii_case("ALL") {
            all = true;
            continue;
        }
        if item.eq_ignore_ascii_case("NONE") {
            return Err(format!(
                "invalid --export={s}: NONE cannot be combined with variables"
            ));
        }
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (item, None),
        };
        let valid = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid --export={s}: {k:?} is not a variable name"
            ));
        }
        list.push((k.to_string(), v));
    }
    Ok(if all {
        Export::All(list)
    } else {
        Export::Only(list)
    })
}

fn parse_nice(s: &str) -> Result<u32, String> {
    s.parse::<u32>().map_err(|_| {
        format!("invalid --nice={s}: expected a non-negative number (raising priority is an operator's job)")
    })
}

/// Slurm's default lead time for `--signal` without `@TIME`.
const DEFAULT_WARN_BEFORE_S: u32 = 60;

/// `[{R|B}:]SIG[@TIME]`. `R:` (may overlap a reservation's start delay) is accepted and has
/// no effect here: Tandem has no reservations of that kind.
fn parse_warn_signal(s: &str) -> Result<WarnSignal, String> {
    let bad = |why: &str| format!("invalid --signal={s}: {why}");
    let (flags, rest) = match s.split_once(':') {
        Some((f, r)) => (Some(f), r),
        None => (None, s),
    };
    let mut batch_only = false;
    if let Some(flags) = flags {
        let mut seen_r = false;
        if flags.is_empty() {
            return Err(bad("expected R: or B: before the signal"));
        }
        for c in flags.chars() {
            match c.to_ascii_uppercase() {
                'B' if !batch_only => batch_only = true,
                'R' if !seen_r => seen_r = true,
                _ => return Err(bad("expected R: or B: before the signal")),
            }
        }
    }
    let (sig, time) = match rest.split_once('@') {
        Some((a, b)) => (a, Some(b)),
        None => (rest, None),
    };
    let number = crate::cmd::scancel::parse_signal(sig).map_err(|e| bad(&e.to_string()))?;
    let before_s = match time {
        None => DEFAULT_WARN_BEFORE_S,
        Some(t) => t
            .parse::<u16>()
            .map(u32::from)
            .map_err(|_| bad("the time must be a whole number of seconds from 0 to 65535"))?,
    };
    Ok(WarnSignal {
        number,
        before_s,
        batch_only,
    })
}

/// `append`/`truncate`, or their first letters.
fn parse_open_mode(s: &str) -> Result<OpenMode, String> {
    match s.to_ascii_lowercase().as_str() {
        "a" | "append" => Ok(OpenMode::Append),
        "t" | "truncate" => Ok(OpenMode::Truncate),
        _ => Err(format!(
            "invalid --open-mode={s}: expected append or truncate"
        )),
    }
}

fn parse_hostlist(s: &str) -> Result<String, String> {
    tandem_sched::hostlist::expand(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// Array specs and dependencies are checked with the scheduling core's parsers so a typo
/// fails before anything is sent; the controller parses them again and trusts nothing.
fn parse_array(s: &str) -> Result<String, String> {
    tandem_sched::array::ArraySpec::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}

fn parse_dependency(s: &str) -> Result<String, String> {
    tandem_sched::dependency::Dependency::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
