//! What a worker needs to run a batch script: the stored payload, the job-wide `SLURM_*`
//! environment, and output paths with the controller's share of `%` patterns expanded.
//!
//! Everything here is pure. The worker adds node-local variables (`SLURMD_NODENAME`,
//! `SLURM_NODEID`, `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_GPUS_ON_NODE`,
//! `CUDA_VISIBLE_DEVICES`) and expands `%N` and `%%`. `SLURM_CPUS_ON_NODE` is set here, from
//! the job's CPUs on the batch node.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;
use tandem_proto::v1;

/// The parts of a submission the scheduler never looks at. Stored in `job_payloads` and read
/// back only to launch the job or to show one job in detail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Payload {
    pub script: String,
    /// Where sbatch read the script (see `JobSpec.script_path`); empty = `--wrap`, stdin.
    pub script_path: String,
    pub argv: Vec<String>,
    pub workdir: String,
    pub environment: BTreeMap<String, String>,
    /// Output patterns as submitted; empty = Slurm's default.
    pub stdout: String,
    pub stderr: String,
    pub submit_host: String,
    pub comment: String,
    /// `--input` pattern as submitted; empty = `/dev/null`.
    pub stdin: String,
    /// Session id of the submitting process (`AllocNode:Sid`).
    pub alloc_sid: u32,
    /// `--open-mode=append`.
    pub open_append: bool,
    /// `--signal`.
    pub signal: Option<WarnSignal>,
    /// The submitter's umask, which the script runs with; `None`: the worker's.
    pub umask: Option<u32>,
}

/// `--signal`: a signal the worker sends ahead of the time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarnSignal {
    pub number: i32,
    pub before_s: u32,
    pub batch_only: bool,
}

/// Linux's highest signal number (`SIGRTMAX`).
const MAX_SIGNAL: i32 = 64;

impl WarnSignal {
    /// From the wire form, where a signal number of 0 means no `--signal`.
    pub fn from_proto(
        number: i32,
        before_s: u32,
        batch_only: bool,
    ) -> Result<Option<WarnSignal>, String> {
        match number {
            0 => Ok(None),
            1..=MAX_SIGNAL => Ok(Some(WarnSignal {
                number,
                before_s,
                batch_only,
            })),
            n => Err(format!("{n} is not a signal number")),
        }
    }
}

impl Payload {
    /// Stored as the payload fields of a prost-encoded `tandem.v1.JobSpec`: compact, no
    /// text escaping on the submit path, and readable with any protobuf tool.
    pub fn into_bytes(self) -> Vec<u8> {
        v1::JobSpec {
            script: self.script,
            script_path: self.script_path,
            argv: self.argv,
            workdir: self.workdir,
            environment: self.environment.into_iter().collect(),
            stdout: self.stdout,
            stderr: self.stderr,
            submit_host: self.submit_host,
            comment: self.comment,
            stdin: self.stdin,
            alloc_sid: self.alloc_sid,
            open_mode_append: self.open_append,
            signal_number: self.signal.map_or(0, |w| w.number),
            signal_before_s: self.signal.map_or(0, |w| w.before_s),
            signal_batch_only: self.signal.is_some_and(|w| w.batch_only),
            umask: self.umask,
            ..Default::default()
        }
        .encode_to_vec()
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, prost::DecodeError> {
        let s = v1::JobSpec::decode(bytes)?;
        // Validated at submit; a stored payload that no longer passes just loses the signal.
        let signal =
            WarnSignal::from_proto(s.signal_number, s.signal_before_s, s.signal_batch_only)
                .ok()
                .flatten();
        Ok(Self {
            script: s.script,
            script_path: s.script_path,
            argv: s.argv,
            workdir: s.workdir,
            environment: s.environment.into_iter().collect(),
            stdout: s.stdout,
            stderr: s.stderr,
            submit_host: s.submit_host,
            comment: s.comment,
            stdin: s.stdin,
            alloc_sid: s.alloc_sid,
            open_append: s.open_mode_append,
            signal,
            // Checked at submit; masked again, should a stored one be off.
            umask: s.umask.map(|m| m & 0o777),
        })
    }
}

/// Array facts of one task, for `SLURM_ARRAY_*` and `%A`/`%a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayFacts {
    pub array_job_id: u64,
    pub task_id: u32,
    pub count: u64,
    pub min: u32,
    pub max: u32,
    pub step: u32,
}

/// The job-wide facts the environment is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchFacts {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub partition: String,
    pub account: String,
    pub qos: String,
    pub cluster_name: String,
    /// Allocated nodes, in allocation order (the first runs the script).
    pub nodes: Vec<String>,
    /// CPUs given on each node, same order as `nodes`.
    pub cpus_per_node: Vec<u32>,
    /// Memory requested per node; 0 = none requested.
    pub mem_per_node_mb: u64,
    /// Tasks of the job, resolved (`-n`, or `--ntasks-per-node` times the nodes, or one per
    /// node).
    pub ntasks: u32,
    pub tasks_per_node: u32,
    /// `-n` or `--ntasks-per-node` was given. Slurm sets `SLURM_NTASKS`/`SLURM_NPROCS` only
    /// then: a job that asked for no task count has none (launchers read its absence).
    pub ntasks_given: bool,
    /// `--ntasks-per-node` was given (`SLURM_NTASKS_PER_NODE` is set only then).
    pub tasks_per_node_given: bool,
    /// `-c` as submitted; 0 = not given, and then `SLURM_CPUS_PER_TASK` is not set.
    pub cpus_per_task: u32,
    /// Total GPUs of the job, and the GPU indices on the first node.
    pub gpus_total: u32,
    pub batch_node_gpus: Vec<u32>,
    pub array: Option<ArrayFacts>,
    pub start_time: i64,
    pub time_limit_s: Option<u64>,
    /// Times the job went back to the queue and ran again (requeue, preemption).
    pub restarts: u32,
}

/// Slurm's compressed count list: `[4,4,8]` -> `4(x2),8`.
pub fn compress_counts(counts: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let mut j = i + 1;
        while j < counts.len() && counts[j] == counts[i] {
            j += 1;
        }
        if j - i > 1 {
            out.push(format!("{}(x{})", counts[i], j - i));
        } else {
            out.push(counts[i].to_string());
        }
        i = j;
    }
    out.join(",")
}

/// Tasks on each allocated node, as Slurm lays them out for `SLURM_TASKS_PER_NODE`: without
/// a task count, as many as the node's CPUs hold (`-c4` on 4 CPUs: 1; `--exclusive` on 64:
/// 64); with one, a task on every node and the rest filling the nodes in order, each up to
/// its CPUs (`-N2 -n3`: `2,1`, as Slurm prints). Tasks beyond every node's CPUs (not
/// reachable through the scheduler) go round robin, so the counts always add up to `ntasks`.
pub fn tasks_on_nodes(ntasks: Option<u32>, cpus: &[u32], cpus_per_task: u32) -> Vec<u32> {
    let cpt = cpus_per_task.max(1);
    let fit: Vec<u32> = cpus.iter().map(|c| (c / cpt).max(1)).collect();
    let Some(ntasks) = ntasks else {
        return fit;
    };
    let mut out: Vec<u32> = (0..cpus.len())
        .map(|i| u32::from(u64::from(ntasks) > i as u64))
        .collect();
    let mut left = ntasks.saturating_sub(out.iter().sum());
    for (n, cap) in out.iter_mut().zip(&fit) {
        let more = cap.saturating_sub(*n).min(left);
        *n += more;
        left -= more;
    }
    let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
    if left > 0 && len > 0 {
        for (i, n) in (0..len).zip(out.iter_mut()) {
            *n += left / len + u32::from(i < left % len);
        }
    }
    out
}

/// The environment of the batch script: the submitted environment, then the job-wide
/// `SLURM_*` variables over it (a stale `SLURM_JOB_ID` exported from a login shell inside an
/// allocation must not leak into a new job).
pub fn job_environment(
    facts: &LaunchFacts,
    payload: &Payload,
    nodelist: &str,
) -> BTreeMap<String, String> {
    let mut env = payload.environment.clone();
    // A first run must not see a count exported from the restarted job that submitted it.
    env.remove("SLURM_RESTART_COUNT");
    // Nor a task count exported from a shell inside another allocation, for a job that set
    // none of its own.
    for k in [
        "SLURM_NTASKS",
        "SLURM_NPROCS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_CPUS_PER_TASK",
    ] {
        env.remove(k);
    }
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    let id = facts.job_id.to_string();
    set("SLURM_JOB_ID", id.clone());
    set("SLURM_JOBID", id);
    set("SLURM_JOB_NAME", facts.name.clone());
    set("SLURM_JOB_NODELIST", nodelist.to_owned());
    set("SLURM_NODELIST", nodelist.to_owned());
    let nnodes = facts.nodes.len().to_string();
    set("SLURM_JOB_NUM_NODES", nnodes.clone());
    set("SLURM_NNODES", nnodes);
    // What Slurm 22.05 sets in a batch job (see `tasks_on_nodes` and the tests below): the
    // task counts only when the job asked for one, SLURM_TASKS_PER_NODE always.
    if facts.ntasks_given {
        set("SLURM_NTASKS", facts.ntasks.to_string());
        set("SLURM_NPROCS", facts.ntasks.to_string());
    }
    if facts.tasks_per_node_given {
        set("SLURM_NTASKS_PER_NODE", facts.tasks_per_node.to_string());
    }
    set(
        "SLURM_TASKS_PER_NODE",
        compress_counts(&tasks_on_nodes(
            facts.ntasks_given.then_some(facts.ntasks),
            &facts.cpus_per_node,
            facts.cpus_per_task,
        )),
    );
    if facts.cpus_per_task > 0 {
        set("SLURM_CPUS_PER_TASK", facts.cpus_per_task.to_string());
    }
    set(
        "SLURM_JOB_CPUS_PER_NODE",
        compress_counts(&facts.cpus_per_node),
    );
    // No cloud nodes, as Slurm 22.05 says it.
    set("SLURM_NODE_ALIASES", "(null)".to_owned());
    // The job's share of the batch node, not the node's size (the worker's fallback) and
    // not a value exported from a submitting shell inside another allocation.
    if let Some(cpus) = facts.cpus_per_node.first() {
        set("SLURM_CPUS_ON_NODE", cpus.to_string());
    }
    if facts.mem_per_node_mb > 0 {
        set("SLURM_MEM_PER_NODE", facts.mem_per_node_mb.to_string());
    }
    set("SLURM_JOB_PARTITION", facts.partition.clone());
    set("SLURM_JOB_ACCOUNT", facts.account.clone());
    set("SLURM_JOB_QOS", facts.qos.clone());
    set("SLURM_SUBMIT_DIR", payload.workdir.clone());
    if !payload.submit_host.is_empty() {
        set("SLURM_SUBMIT_HOST", payload.submit_host.clone());
    }
    set("SLURM_CLUSTER_NAME", facts.cluster_name.clone());
    set("SLURM_JOB_USER", facts.user.clone());
    set("SLURM_JOB_UID", facts.uid.to_string());
    set("SLURM_JOB_GID", facts.gid.to_string());
    set("SLURM_JOB_START_TIME", facts.start_time.to_string());
    // Slurm sets it only on a run after a requeue.
    if facts.restarts > 0 {
        set("SLURM_RESTART_COUNT", facts.restarts.to_string());
    }
    if let Some(limit) = facts.time_limit_s {
        set(
            "SLURM_JOB_END_TIME",
            facts
                .start_time
                .saturating_add(i64::try_from(limit).unwrap_or(i64::MAX))
                .to_string(),
        );
    }
    if let Some(a) = facts.array {
        set("SLURM_ARRAY_JOB_ID", a.array_job_id.to_string());
        set("SLURM_ARRAY_TASK_ID", a.task_id.to_string());
        set("SLURM_ARRAY_TASK_COUNT", a.count.to_string());
        set("SLURM_ARRAY_TASK_MIN", a.min.to_string());
        set("SLURM_ARRAY_TASK_MAX", a.max.to_string());
        set("SLURM_ARRAY_TASK_STEP", a.step.to_string());
    }
    // `SLURM_GPUS`, `SLURM_GPUS_PER_NODE` and `SLURM_GPUS_PER_TASK` repeat the request, and
    // only where it was made: sbatch sets them, as Slurm's does (an `--exclusive` job holds
    // every GPU of its nodes and has none of them).
    if facts.gpus_total > 0 {
        set(
            "SLURM_JOB_GPUS",
            facts
                .batch_node_gpus
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    set("ENVIRONMENT", "BATCH".to_owned());
    env
}

/// Expands `%j %A %a %x %u %J` (with optional zero padding, `%4a`) in an output pattern.
/// `%N`, `%%` and unknown letters are left for the worker, which knows the node.
///
/// The worker expands the result once more, so nothing here may leave a `%` it would read
/// again: `%%` stays `%%` (the worker makes it one `%`), and a `%` inside a job or user name
/// is written as `%%` (a job named `a%N` must not get the node's name in its file name).
pub fn expand_output(pattern: &str, facts: &LaunchFacts) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut width = String::new();
        while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
            width.push(d);
            chars.next();
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            out.push_str(&width);
            break;
        };
        let pad = |v: String| -> String {
            let w: usize = width.parse().unwrap_or(0).min(10);
            format!("{v:0>w$}")
        };
        let (array_job, task) = match facts.array {
            Some(a) => (a.array_job_id, Some(a.task_id)),
            None => (facts.job_id, None),
        };
        match spec {
            '%' if width.is_empty() => out.push_str("%%"),
            'j' | 'J' => out.push_str(&pad(facts.job_id.to_string())),
            'A' => out.push_str(&pad(array_job.to_string())),
            // Slurm prints 4294967294 (NO_VAL) for %a outside arrays; "0" is what a user
            // reading the file name would expect less to trip over.
            'a' => out.push_str(&pad(task.map_or_else(|| "0".to_owned(), |t| t.to_string()))),
            'x' => out.push_str(&facts.name.replace('%', "%%")),
            'u' => out.push_str(&facts.user.replace('%', "%%")),
            other => {
                out.push('%');
                out.push_str(&width);
                out.push(other);
            }
        }
    }
    out
}

/// Output paths of the batch script: the submitted patterns or Slurm's defaults, relative
/// ones resolved against the working directory.
pub fn output_paths(facts: &LaunchFacts, payload: &Payload) -> (String, String) {
    let (stdout, stderr) = output_patterns(facts.array.is_some(), &payload.stdout, &payload.stderr);
    (
        in_workdir(expand_output(stdout, facts), &payload.workdir),
        in_workdir(expand_output(stderr, facts), &payload.workdir),
    )
}

/// The stdout and stderr patterns a batch job writes to: the submitted ones, or Slurm's
/// defaults (`slurm-%j.out`, `slurm-%A_%a.out` in an array; stderr goes with stdout).
/// Shared with `scontrol show job`, which must name the files the launch will write.
pub fn output_patterns<'a>(in_array: bool, stdout: &'a str, stderr: &'a str) -> (&'a str, &'a str) {
    let stdout = match stdout {
        "" if in_array => "slurm-%A_%a.out",
        "" => "slurm-%j.out",
        given => given,
    };
    let stderr = if stderr.is_empty() { stdout } else { stderr };
    (stdout, stderr)
}

/// The batch script's standard input (`--input`), expanded like the output paths; empty
/// stays empty (`/dev/null`).
pub fn input_path(facts: &LaunchFacts, payload: &Payload) -> String {
    if payload.stdin.is_empty() {
        return String::new();
    }
    in_workdir(expand_output(&payload.stdin, facts), &payload.workdir)
}

/// A relative path under the job's working directory (as the launch opens it).
pub fn in_workdir(path: String, workdir: &str) -> String {
    if path.starts_with('/') || workdir.is_empty() {
        path
    } else {
        Path::new(workdir).join(path).to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> LaunchFacts {
        LaunchFacts {
            job_id: 42,
            name: "train".into(),
            user: "alice".into(),
            uid: 1000,
            gid: 100,
            partition: "gpu".into(),
            account: "physics".into(),
            qos: "normal".into(),
            cluster_name: "tandem".into(),
            nodes: vec!["gpu-01".into(), "gpu-02".into()],
            cpus_per_node: vec![8, 8],
            mem_per_node_mb: 4096,
            ntasks: 4,
            tasks_per_node: 2,
            ntasks_given: true,
            tasks_per_node_given: true,
            cpus_per_task: 4,
            gpus_total: 16,
            batch_node_gpus: (0..8).collect(),
            array: None,
            start_time: 1000,
            time_limit_s: Some(60),
            restarts: 0,
        }
    }

    fn payload() -> Payload {
        Payload {
            workdir: "/home/alice/run".into(),
            submit_host: "login1".into(),
            environment: [
                ("PATH".to_owned(), "/usr/bin".to_owned()),
                ("SLURM_JOB_ID".to_owned(), "7".to_owned()),
            ]
            .into(),
            ..Payload::default()
        }
    }

    #[test]
    fn environment_has_the_variables_launchers_read() {
        let env = job_environment(&facts(), &payload(), "gpu-[01-02]");
        let want = [
            ("PATH", "/usr/bin"),
            ("SLURM_JOB_ID", "42"),
            ("SLURM_JOBID", "42"),
            ("SLURM_JOB_NAME", "train"),
            ("SLURM_JOB_NODELIST", "gpu-[01-02]"),
            ("SLURM_NODELIST", "gpu-[01-02]"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_CPUS_PER_TASK", "4"),
            ("SLURM_JOB_CPUS_PER_NODE", "8(x2)"),
            ("SLURM_CPUS_ON_NODE", "8"),
            ("SLURM_MEM_PER_NODE", "4096"),
            ("SLURM_JOB_PARTITION", "gpu"),
            ("SLURM_JOB_ACCOUNT", "physics"),
            ("SLURM_JOB_QOS", "normal"),
            ("SLURM_SUBMIT_DIR", "/home/alice/run"),
            ("SLURM_SUBMIT_HOST", "login1"),
            ("SLURM_CLUSTER_NAME", "tandem"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURM_JOB_UID", "1000"),
            ("SLURM_JOB_GID", "100"),
            ("SLURM_JOB_GPUS", "0,1,2,3,4,5,6,7"),
            ("SLURM_JOB_END_TIME", "1060"),
        ];
        for (k, v) in want {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key("SLURM_ARRAY_JOB_ID"));
        assert!(!env.contains_key("SLURM_RESTART_COUNT"), "a first run");
        assert!(
            !env.contains_key("SLURM_GPUS"),
            "the request's, set by sbatch"
        );
    }

    #[test]
    fn requeued_run_gets_its_restart_count_and_a_first_run_none() {
        let mut f = facts();
        f.restarts = 2;
        let env = job_environment(&f, &payload(), "gpu-01");
        assert_eq!(env["SLURM_RESTART_COUNT"], "2");
        // Submitted from inside a restarted job: the stale count does not carry over.
        let mut p = payload();
        p.environment
            .insert("SLURM_RESTART_COUNT".to_owned(), "3".to_owned());
        let env = job_environment(&facts(), &p, "gpu-01");
        assert!(!env.contains_key("SLURM_RESTART_COUNT"), "{env:?}");
    }

    #[test]
    fn array_task_gets_array_variables_and_default_output() {
        let mut f = facts();
        f.job_id = 45;
        f.array = Some(ArrayFacts {
            array_job_id: 40,
            task_id: 6,
            count: 5,
            min: 2,
            max: 10,
            step: 2,
        });
        let env = job_environment(&f, &payload(), "gpu-01");
        assert_eq!(env["SLURM_ARRAY_JOB_ID"], "40");
        assert_eq!(env["SLURM_ARRAY_TASK_ID"], "6");
        assert_eq!(env["SLURM_ARRAY_TASK_COUNT"], "5");
        assert_eq!(env["SLURM_ARRAY_TASK_MIN"], "2");
        assert_eq!(env["SLURM_ARRAY_TASK_MAX"], "10");
        assert_eq!(env["SLURM_ARRAY_TASK_STEP"], "2");
        let (out, err) = output_paths(&f, &payload());
        assert_eq!(out, "/home/alice/run/slurm-40_6.out");
        assert_eq!(err, out);
    }

    #[test]
    fn output_patterns_expand_controller_letters_only() {
        let f = facts();
        let cases = [
            ("%x-%j.out", "train-42.out"),
            ("%u/%%j_%N.log", "alice/%%j_%N.log"),
            ("100%%", "100%%"),
            ("%5%", "%5%"),
            ("%5j", "00042"),
            ("%A_%a", "42_0"),
            ("tail%", "tail%"),
            ("%t.%s", "%t.%s"),
        ];
        for (pat, want) in cases {
            assert_eq!(expand_output(pat, &f), want, "{pat}");
        }
        let p = Payload {
            stdout: "/abs/%j.out".into(),
            stderr: "err-%j".into(),
            ..payload()
        };
        assert_eq!(
            output_paths(&f, &p),
            ("/abs/42.out".into(), "/home/alice/run/err-42".into())
        );
    }

    #[test]
    fn cpus_on_node_is_the_jobs_share_of_the_batch_node() {
        let mut f = facts();
        f.cpus_per_node = vec![6, 8];
        let mut p = payload();
        // Exported from a submitting shell inside another allocation.
        p.environment
            .insert("SLURM_CPUS_ON_NODE".to_owned(), "99".to_owned());
        let env = job_environment(&f, &p, "gpu-[01-02]");
        assert_eq!(env["SLURM_CPUS_ON_NODE"], "6");
        assert_eq!(env["SLURM_JOB_CPUS_PER_NODE"], "6,8");
    }

    #[test]
    fn percent_signs_survive_the_second_expansion_on_the_worker() {
        let mut f = facts();
        f.name = "run%N".into();
        // What the controller sends keeps every `%` the worker must not expand escaped.
        assert_eq!(expand_output("%x-%%N.out", &f), "run%%N-%%N.out");
        assert_eq!(expand_output("%%%j", &f), "%%42");
    }

    #[test]
    fn input_path_expands_like_output_and_defaults_to_nothing() {
        let f = facts();
        assert_eq!(input_path(&f, &payload()), "");
        let p = Payload {
            stdin: "in-%j.txt".into(),
            ..payload()
        };
        assert_eq!(input_path(&f, &p), "/home/alice/run/in-42.txt");
        let p = Payload {
            stdin: "/data/%x.in".into(),
            ..payload()
        };
        assert_eq!(input_path(&f, &p), "/data/train.in");
    }

    #[test]
    fn warn_signal_from_the_wire() {
        assert_eq!(WarnSignal::from_proto(0, 60, true), Ok(None));
        assert_eq!(
            WarnSignal::from_proto(10, 120, true),
            Ok(Some(WarnSignal {
                number: 10,
                before_s: 120,
                batch_only: true
            }))
        );
        assert!(WarnSignal::from_proto(-1, 60, false).is_err());
        assert!(WarnSignal::from_proto(65, 60, false).is_err());
    }

    #[test]
    fn counts_compress_like_slurm() {
        assert_eq!(compress_counts(&[4, 4, 8]), "4(x2),8");
        assert_eq!(compress_counts(&[1]), "1");
        assert_eq!(compress_counts(&[]), "");
        assert_eq!(compress_counts(&[2, 3, 3, 3, 2]), "2,3(x3),2");
    }

    #[test]
    fn payload_round_trips() {
        let p = payload();
        assert_eq!(Payload::decode(&p.clone().into_bytes()).unwrap(), p);
        let p = Payload {
            stdin: "in.txt".into(),
            open_append: true,
            signal: Some(WarnSignal {
                number: 12,
                before_s: 30,
                batch_only: true,
            }),
            ..payload()
        };
        assert_eq!(Payload::decode(&p.clone().into_bytes()).unwrap(), p);
    }

    /// The task variables of a batch job, as Slurm 22.05 (slurm-wlm 22.05.8, 8 nodes x 64
    /// CPUs, `sbatch OPTS --wrap='env | grep ...'`) printed them; a dash = not set.
    /// The CPUs per node are Tandem's allocation for the same options (Slurm's for `-N2 -n3`
    /// were `2,1`; Tandem gives every node of a job the same share).
    #[test]
    fn task_variables_match_slurm_for_each_way_of_asking() {
        struct Case {
            opts: &'static str,
            nodes: usize,
            cpus: u32,
            ntasks: u32,
            per_node: u32,
            ntasks_given: bool,
            per_node_given: bool,
            cpt: u32,
            // SLURM_NTASKS (= SLURM_NPROCS), SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE,
            // SLURM_CPUS_PER_TASK
            want: [&'static str; 4],
        }
        let cases = [
            Case {
                opts: "",
                nodes: 1,
                cpus: 1,
                ntasks: 1,
                per_node: 1,
                ntasks_given: false,
                per_node_given: false,
                cpt: 0,
                want: ["-", "-", "1", "-"],
            },
            Case {
                opts: "-N2",
                nodes: 2,
                cpus: 1,
                ntasks: 2,
                per_node: 1,
                ntasks_given: false,
                per_node_given: false,
                cpt: 0,
                want: ["-", "-", "1(x2)", "-"],
            },
            Case {
                opts: "-n3",
                nodes: 1,
                cpus: 3,
                ntasks: 3,
                per_node: 3,
                ntasks_given: true,
                per_node_given: false,
                cpt: 0,
                want: ["3", "-", "3", "-"],
            },
            Case {
                opts: "-N2 -n3",
                nodes: 2,
                cpus: 2,
                ntasks: 3,
                per_node: 2,
                ntasks_given: true,
                per_node_given: false,
                cpt: 0,
                want: ["3", "-", "2,1", "-"],
            },
            Case {
                opts: "--ntasks-per-node=2",
                nodes: 1,
                cpus: 2,
                ntasks: 2,
                per_node: 2,
                ntasks_given: true,
                per_node_given: true,
                cpt: 0,
                want: ["2", "2", "2", "-"],
            },
            Case {
                opts: "-N2 --ntasks-per-node=2",
                nodes: 2,
                cpus: 2,
                ntasks: 4,
                per_node: 2,
                ntasks_given: true,
                per_node_given: true,
                cpt: 0,
                want: ["4", "2", "2(x2)", "-"],
            },
            Case {
                opts: "-c4",
                nodes: 1,
                cpus: 4,
                ntasks: 1,
                per_node: 1,
                ntasks_given: false,
                per_node_given: false,
                cpt: 4,
                want: ["-", "-", "1", "4"],
            },
            Case {
                opts: "-N2 -c4",
                nodes: 2,
                cpus: 4,
                ntasks: 2,
                per_node: 1,
                ntasks_given: false,
                per_node_given: false,
                cpt: 4,
                want: ["-", "-", "1(x2)", "4"],
            },
            Case {
                opts: "-n2 -c3",
                nodes: 1,
                cpus: 6,
                ntasks: 2,
                per_node: 2,
                ntasks_given: true,
                per_node_given: false,
                cpt: 3,
                want: ["2", "-", "2", "3"],
            },
            Case {
                opts: "-N2 -n3 -c2",
                nodes: 2,
                cpus: 4,
                ntasks: 3,
                per_node: 2,
                ntasks_given: true,
                per_node_given: false,
                cpt: 2,
                want: ["3", "-", "2,1", "2"],
            },
            Case {
                opts: "-N3 -n4",
                nodes: 3,
                cpus: 2,
                ntasks: 4,
                per_node: 2,
                ntasks_given: true,
                per_node_given: false,
                cpt: 0,
                want: ["4", "-", "2,1(x2)", "-"],
            },
            Case {
                opts: "--exclusive",
                nodes: 1,
                cpus: 64,
                ntasks: 1,
                per_node: 1,
                ntasks_given: false,
                per_node_given: false,
                cpt: 0,
                want: ["-", "-", "64", "-"],
            },
        ];
        for c in cases {
            let f = LaunchFacts {
                nodes: (0..c.nodes).map(|i| format!("n{i}")).collect(),
                cpus_per_node: vec![c.cpus; c.nodes],
                ntasks: c.ntasks,
                tasks_per_node: c.per_node,
                ntasks_given: c.ntasks_given,
                tasks_per_node_given: c.per_node_given,
                cpus_per_task: c.cpt,
                ..facts()
            };
            // A submitting shell inside another allocation exported its own counts.
            let mut p = payload();
            for k in [
                "SLURM_NTASKS",
                "SLURM_NPROCS",
                "SLURM_NTASKS_PER_NODE",
                "SLURM_CPUS_PER_TASK",
            ] {
                p.environment.insert(k.to_owned(), "99".to_owned());
            }
            let env = job_environment(&f, &p, "n[0-9]");
            let get = |k: &str| env.get(k).map_or("-", String::as_str).to_owned();
            assert_eq!(
                [
                    get("SLURM_NTASKS"),
                    get("SLURM_NTASKS_PER_NODE"),
                    get("SLURM_TASKS_PER_NODE"),
                    get("SLURM_CPUS_PER_TASK"),
                ],
                c.want.map(str::to_owned),
                "sbatch {}",
                c.opts
            );
            assert_eq!(
                get("SLURM_NPROCS"),
                get("SLURM_NTASKS"),
                "sbatch {}",
                c.opts
            );
        }
    }

    #[test]
    fn tasks_fill_nodes_in_order_and_always_add_up() {
        assert_eq!(tasks_on_nodes(Some(7), &[3, 3, 3], 1), [3, 3, 1]);
        assert_eq!(tasks_on_nodes(Some(2), &[8, 8, 8], 1), [1, 1, 0]);
        assert_eq!(
            tasks_on_nodes(Some(10), &[2, 2], 1),
            [5, 5],
            "over capacity"
        );
        assert_eq!(tasks_on_nodes(None, &[8, 8], 3), [2, 2]);
        assert_eq!(tasks_on_nodes(None, &[2], 4), [1], "at least one task");
        assert!(tasks_on_nodes(Some(3), &[], 1).is_empty());
    }
}
