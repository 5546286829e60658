//! `scontrol show job|node|partition`: Slurm's `Key=Value` blocks, one record per block,
//! continuation lines indented by three spaces, records separated by a blank line.

use super::columns::RenderCtx;
use super::view::{JobView, NodeView, PartitionView, timestamp};
use tandem_sched::time::format_elapsed;
use tandem_sched::tres::format_mem_mb;

fn null(s: &str) -> &str {
    if s.is_empty() { "(null)" } else { s }
}

/// A time limit as scontrol prints it (Slurm's `secs2time_str`): `00:05:00`, `2-00:00:00`,
/// where squeue writes `5:00`; `none` when there is no limit.
fn limit(secs: Option<u64>, none: &str) -> String {
    secs.map_or_else(|| none.to_string(), format_elapsed)
}

/// Builds one record from lines of `(key, value)` pairs.
fn block(lines: &[Vec<(&str, String)>]) -> String {
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str("   ");
        }
        let pairs: Vec<String> = line.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&pairs.join(" "));
        out.push('\n');
    }
    out.push('\n');
    out
}

pub fn jobs(jobs: &[JobView], ctx: &RenderCtx) -> String {
    jobs.iter().map(|j| job(j, ctx)).collect()
}

fn job(j: &JobView, ctx: &RenderCtx) -> String {
    let ts = |t: Option<i64>| timestamp(t, ctx.utc_offset_s);
    let mut first = vec![("JobId", j.job_id_raw.to_string())];
    if let Some(a) = j.array_job_id {
        first.push(("ArrayJobId", a.to_string()));
        first.push(("ArrayTaskId", j.array_task_id.clone().unwrap_or_default()));
    }
    first.push(("JobName", j.name.to_string()));
    let (stdout, stderr, stdin) = std_paths(j);
    // Slurm 22.05's lines and their order. Keys for what Tandem's jobs cannot ask for carry
    // the value Slurm prints for a job that did not (TimeMin, the socket/core layout, temp
    // disk, licenses, power); keys whose value Tandem does not know (BatchFlag, AccrueTime,
    // LastSchedEval) are left out rather than made up.
    let mut lines = vec![
        first,
        vec![
            ("UserId", format!("{}({})", j.user, j.uid)),
            ("GroupId", format!("{}({})", group_name(j.gid), j.gid)),
            ("MCS_label", "N/A".to_string()),
        ],
        vec![
            ("Priority", j.priority.to_string()),
            ("Nice", j.nice.to_string()),
            ("Account", null(j.account).to_string()),
            ("QOS", null(j.qos).to_string()),
        ],
        vec![
            ("JobState", j.state.to_string()),
            ("Reason", j.reason.to_string()),
            ("Dependency", null(j.dependency).to_string()),
        ],
        vec![
            ("Requeue", u8::from(j.requeue).to_string()),
            ("Restarts", j.restarts.to_string()),
            ("Reboot", "0".to_string()),
            ("ExitCode", j.exit_code.to_string()),
        ],
        vec![
            ("RunTime", tandem_sched::time::format_elapsed(j.elapsed_s)),
            ("TimeLimit", limit(j.time_limit_s, "UNLIMITED")),
            ("TimeMin", "N/A".to_string()),
        ],
        vec![
            ("SubmitTime", ts(j.submit_time)),
            ("EligibleTime", ts(j.eligible_time)),
        ],
        // A pending job's are the plan's: its expected start, and that plus its limit; a
        // running job's end is its start plus its limit.
        vec![
            (
                "StartTime",
                ts(if j.is_pending() {
                    j.expected_start
                } else {
                    j.start_time
                }),
            ),
            ("EndTime", ts(j.shown_end())),
            ("Deadline", "N/A".to_string()),
        ],
        vec![
            ("Partition", j.partition.to_string()),
            (
                "AllocNode:Sid",
                format!("{}:{}", null(j.submit_host), j.alloc_sid),
            ),
        ],
        vec![
            ("ReqNodeList", null(j.req_nodelist).to_string()),
            ("ExcNodeList", null(j.exc_nodelist).to_string()),
        ],
        // Slurm 22.05 leaves it empty, not `(null)`, until the job has nodes; the nodes the
        // plan holds for a pending job follow.
        if j.sched_nodes.is_empty() {
            vec![("NodeList", j.nodelist.to_string())]
        } else {
            vec![
                ("NodeList", j.nodelist.to_string()),
                ("SchedNodeList", j.sched_nodes.to_string()),
            ]
        },
    ];
    // The node that runs the batch script, once there is one.
    if let Some(host) = j.batch_host() {
        lines.push(vec![("BatchHost", host)]);
    }
    lines.extend([
        vec![
            ("NumNodes", j.nodes.to_string()),
            ("NumCPUs", j.cpus.to_string()),
            ("NumTasks", j.tasks.to_string()),
            ("CPUs/Task", j.cpus_per_task.max(1).to_string()),
            ("ReqB:S:C:T", "0:0:*:*".to_string()),
        ],
        vec![("TRES", j.tres.to_string())],
        vec![
            ("Socks/Node", "*".to_string()),
            ("NtasksPerN:B:S:C", format!("{}:0:*:*", j.ntasks_per_node)),
            ("CoreSpec", "*".to_string()),
        ],
        vec![
            // What one node must offer: a task's CPUs, times the tasks it must take.
            (
                "MinCPUsNode",
                (j.cpus_per_task.max(1) * j.ntasks_per_node.max(1)).to_string(),
            ),
            min_memory(j),
            ("MinTmpDiskNode", "0".to_string()),
        ],
        vec![
            ("Features", null(j.constraint).to_string()),
            ("DelayBoot", "00:00:00".to_string()),
        ],
        vec![
            (
                "OverSubscribe",
                if j.exclusive { "NO" } else { "OK" }.to_string(),
            ),
            ("Contiguous", "0".to_string()),
            ("Licenses", "(null)".to_string()),
            ("Network", "(null)".to_string()),
        ],
    ]);
    if let Some(gres) = j.tres_per_node() {
        lines.push(vec![("TresPerNode", gres)]);
    }
    lines.push(vec![("Command", null(j.command).to_string())]);
    lines.push(vec![("WorkDir", j.workdir.to_string())]);
    if !j.comment.is_empty() {
        lines.push(vec![("Comment", j.comment.to_string())]);
    }
    // Slurm ends the record with `Power=` and a line of its indent alone.
    lines.extend([
        vec![("StdErr", stderr)],
        vec![("StdIn", stdin)],
        vec![("StdOut", stdout)],
        vec![("Power", String::new())],
        Vec::new(),
    ]);
    block(&lines)
}

/// Slurm's `MinMemoryCPU` for a job that asked `--mem-per-cpu`, else `MinMemoryNode`;
/// no memory at all is a bare `0`.
fn min_memory(j: &JobView) -> (&'static str, String) {
    let show = |mb: u64| {
        if mb == 0 {
            "0".to_string()
        } else {
            format_mem_mb(mb)
        }
    };
    if j.mem_per_cpu_mb > 0 {
        ("MinMemoryCPU", show(j.mem_per_cpu_mb))
    } else {
        ("MinMemoryNode", show(j.mem_mb))
    }
}

/// The batch script's stdout, stderr and stdin as Slurm shows them: the submitted patterns
/// or the defaults (`slurm-%j.out`, `slurm-%A_%a.out` in an array; stderr with stdout;
/// `/dev/null`), with what the job's record knows expanded (`%j %A %a %x %u`; `%N` stays,
/// the node is the worker's to fill in) and relative paths under the working directory.
fn std_paths(j: &JobView) -> (String, String, String) {
    use tandem_controller::launch::{in_workdir, output_patterns};
    use tandem_worker::launch::output::{PatternFields, expand};
    let task = j
        .array_task_id
        .as_deref()
        .and_then(|t| t.parse::<u64>().ok());
    let fields = PatternFields {
        job_id: Some(j.job_id_raw),
        array_job_id: j.array_job_id,
        array_task_id: task,
        job_name: Some(j.name),
        user: Some(j.user),
        ..PatternFields::default()
    };
    let resolve = |pattern: &str| in_workdir(expand(pattern, &fields), j.workdir);
    let (stdout_pattern, stderr_pattern) =
        output_patterns(j.array_job_id.is_some(), j.stdout, j.stderr);
    let stdin = if j.stdin.is_empty() {
        "/dev/null".to_string()
    } else {
        resolve(j.stdin)
    };
    (resolve(stdout_pattern), resolve(stderr_pattern), stdin)
}

/// The group's name from the local group database, or the number as Slurm prints an
/// unknown one.
fn group_name(gid: u32) -> String {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or_else(|| gid.to_string(), |g| g.name)
}

/// `scontrol show node`, in Slurm 22.05's lines and order. What Tandem does not measure or
/// have is printed as Slurm prints it for a node without it: no load or free-memory
/// figures (`N/A`), no energy plugin, no owner or MCS label, weight 1, no TmpDisk, and the
/// topology Slurm infers from a node declared by its CPU count alone (one core and one
/// thread per socket). Lines Slurm omits for a node it has not heard from (`Arch=`,
/// `NodeAddr=`, `OS=`) are omitted until the node's worker registers. Tandem's own
/// time-partition mode ends the State line (`Mode=batch|kube`).
pub fn nodes(nodes: &[NodeView], ctx: &RenderCtx) -> String {
    nodes.iter().map(|n| node(n, ctx)).collect()
}

fn node(n: &NodeView, ctx: &RenderCtx) -> String {
    let ts = |t: Option<i64>| timestamp(t, ctx.utc_offset_s);
    let feats = if n.features.is_empty() {
        "(null)".to_string()
    } else {
        n.features.join(",")
    };
    // Slurm ends the first, the OS and the Partitions lines with a space.
    let mut first = vec![("NodeName", n.name.clone())];
    if !n.arch.is_empty() {
        first.push(("Arch", n.arch.clone()));
    }
    first.push(("CoresPerSocket", "1 ".to_string()));
    let mut lines = vec![
        first,
        vec![
            ("CPUAlloc", n.cpus_alloc.to_string()),
            ("CPUEfctv", n.cpus.to_string()),
            ("CPUTot", n.cpus.to_string()),
            ("CPULoad", "N/A".to_string()),
        ],
        vec![("AvailableFeatures", feats.clone())],
        vec![("ActiveFeatures", feats)],
        vec![("Gres", n.gres())],
    ];
    if let Some((host, port)) = n.host_and_port() {
        let hostname = if n.hostname.is_empty() {
            n.name.clone()
        } else {
            n.hostname.clone()
        };
        lines.push(vec![
            ("NodeAddr", host.to_string()),
            ("NodeHostName", hostname),
            ("Port", port.to_string()),
            ("Version", null(&n.version).to_string()),
        ]);
    }
    if !n.os.is_empty() {
        lines.push(vec![("OS", format!("{} ", n.os))]);
    }
    lines.extend([
        vec![
            ("RealMemory", n.mem_mb.to_string()),
            ("AllocMem", n.mem_alloc_mb.to_string()),
            ("FreeMem", "N/A".to_string()),
            ("Sockets", n.cpus.to_string()),
            ("Boards", "1".to_string()),
        ],
        vec![
            ("State", n.state_with_flags()),
            ("ThreadsPerCore", "1".to_string()),
            ("TmpDisk", "0".to_string()),
            ("Weight", "1".to_string()),
            ("Owner", "N/A".to_string()),
            ("MCS_label", "N/A".to_string()),
            ("Mode", n.mode.to_string()),
        ],
        vec![("Partitions", format!("{} ", n.partitions.join(",")))],
        vec![
            ("BootTime", ts(n.boot_time)),
            ("SlurmdStartTime", ts(n.worker_start_time)),
        ],
        vec![("LastBusyTime", ts(n.last_heartbeat))],
        vec![("CfgTRES", node_tres(n.cpus, n.mem_mb, n.gpus, true))],
        vec![(
            "AllocTRES",
            node_tres(n.cpus_alloc, n.mem_alloc_mb, n.gpus_alloc, false),
        )],
        vec![("CapWatts", "n/a".to_string())],
        vec![
            ("CurrentWatts", "0".to_string()),
            ("AveWatts", "0".to_string()),
        ],
        vec![
            ("ExtSensorsJoules", "n/s".to_string()),
            ("ExtSensorsWatts", "0".to_string()),
            ("ExtSensorsTemp", "n/s".to_string()),
        ],
    ]);
    // Only with a reason, followed by who gave it and when, as Slurm prints it:
    // `Reason=disk check [root@2026-12-04T21:22:36]`.
    if !n.reason.is_empty() {
        let by = n
            .reason_by
            .as_ref()
            .map_or_else(String::new, |(u, t)| format!(" [{u}@{}]", ts(Some(*t))));
        lines.push(vec![("Reason", format!("{}{by}", n.reason))]);
    }
    block(&lines)
}

/// A node's TRES as scontrol prints them, leaving out what is zero: configured ones with
/// `billing` (Slurm's default weights bill a CPU each), `cpu=64,mem=512G,billing=64,
/// gres/gpu=8`; allocated ones without, `cpu=2,mem=4G`.
fn node_tres(cpus: u32, mem_mb: u64, gpus: u32, billing: bool) -> String {
    let mut parts = Vec::new();
    if cpus > 0 {
        parts.push(format!("cpu={cpus}"));
    }
    if mem_mb > 0 {
        parts.push(format!("mem={}", format_mem_mb(mem_mb)));
    }
    if billing && cpus > 0 {
        parts.push(format!("billing={cpus}"));
    }
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    parts.join(",")
}

/// `scontrol show partition`, in Slurm 22.05's lines and order. Keys for what Tandem's
/// partitions do not have carry Slurm's value for a partition without it (no group, QOS or
/// submit-host restriction, no partition QOS, root may run jobs, no per-node CPU or memory
/// caps, no oversubscription, no overtime).
pub fn partitions(parts: &[PartitionView]) -> String {
    parts
        .iter()
        .map(|p| {
            let accounts = if p.allowed_accounts.is_empty() {
                "ALL".to_string()
            } else {
                p.allowed_accounts.join(",")
            };
            let names: Vec<&str> = p.nodes.iter().map(String::as_str).collect();
            let yes_no = |b: bool| if b { "YES" } else { "NO" }.to_string();
            let fixed = |k: &'static str, v: &str| (k, v.to_string());
            let mut tres = vec![format!("cpu={}", p.total_cpus)];
            if p.total_mem_mb > 0 {
                tres.push(format!("mem={}", format_mem_mb(p.total_mem_mb)));
            }
            tres.push(format!("node={}", p.nodes.len()));
            tres.push(format!("billing={}", p.total_cpus));
            if p.total_gpus > 0 {
                tres.push(format!("gres/gpu={}", p.total_gpus));
            }
            block(&[
                vec![("PartitionName", p.name.clone())],
                vec![
                    fixed("AllowGroups", "ALL"),
                    ("AllowAccounts", accounts),
                    fixed("AllowQos", "ALL"),
                ],
                vec![
                    fixed("AllocNodes", "ALL"),
                    ("Default", yes_no(p.is_default)),
                    fixed("QoS", "N/A"),
                ],
                vec![
                    ("DefaultTime", limit(p.default_time_s, "NONE")),
                    fixed("DisableRootJobs", "NO"),
                    fixed("ExclusiveUser", "NO"),
                    fixed("GraceTime", "0"),
                    fixed("Hidden", "NO"),
                ],
                vec![
                    (
                        "MaxNodes",
                        p.max_nodes
                            .map_or("UNLIMITED".to_string(), |n| n.to_string()),
                    ),
                    ("MaxTime", limit(p.max_time_s, "UNLIMITED")),
                    fixed("MinNodes", "0"),
                    fixed("LLN", "NO"),
                    fixed("MaxCPUsPerNode", "UNLIMITED"),
                ],
                vec![("Nodes", tandem_sched::hostlist::compress(&names))],
                vec![
                    ("PriorityJobFactor", p.priority_job_factor.to_string()),
                    ("PriorityTier", p.priority_tier.to_string()),
                    fixed("RootOnly", "NO"),
                    fixed("ReqResv", "NO"),
                    fixed("OverSubscribe", "NO"),
                ],
                vec![
                    fixed("OverTimeLimit", "NONE"),
                    ("PreemptMode", p.preempt_mode.clone()),
                ],
                vec![
                    ("State", p.state.clone()),
                    ("TotalCPUs", p.total_cpus.to_string()),
                    ("TotalNodes", p.nodes.len().to_string()),
                    fixed("SelectTypeParameters", "NONE"),
                ],
                vec![fixed("JobDefaults", "(null)")],
                vec![
                    p.default_mem_per_cpu_mb.map_or_else(
                        || fixed("DefMemPerNode", "UNLIMITED"),
                        |mb| ("DefMemPerCPU", mb.to_string()),
                    ),
                    fixed("MaxMemPerNode", "UNLIMITED"),
                ],
                vec![("TRES", tres.join(","))],
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_proto::v1::{JobInfo, JobState};

    #[test]
    fn job_block_layout() {
        let info = JobInfo {
            job_id: 3,
            array_task_id: -1,
            name: "train".into(),
            user: "alice".into(),
            uid: 1000,
            // No group of this number exists: shown by number, as Slurm does.
            gid: 4_242_420,
            nice: 5,
            state: JobState::Running as i32,
            nodelist: "node-[1-2]".into(),
            workdir: "/home/alice".into(),
            submit_host: "login1".into(),
            alloc_sid: 28358,
            ..JobInfo::default()
        };
        let j = JobView::from_job(&info, 0);
        let text = jobs(&[j], &RenderCtx::default());
        // The lines of Slurm 22.05's `scontrol show job`, in its order, with the fields
        // Tandem has.
        // Slurm 22.05 ends the record with `   Power=`, a line of three spaces, and a blank
        // line.
        assert!(text.ends_with("\n   Power=\n   \n\n"), "{text:?}");
        let keys: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.split_whitespace()
                    .map(|kv| kv.split('=').next().unwrap_or_default())
                    .collect()
            })
            .collect();
        let want: Vec<Vec<&str>> = vec![
            vec!["JobId", "JobName"],
            vec!["UserId", "GroupId", "MCS_label"],
            vec!["Priority", "Nice", "Account", "QOS"],
            vec!["JobState", "Reason", "Dependency"],
            vec!["Requeue", "Restarts", "Reboot", "ExitCode"],
            vec!["RunTime", "TimeLimit", "TimeMin"],
            vec!["SubmitTime", "EligibleTime"],
            vec!["StartTime", "EndTime", "Deadline"],
            vec!["Partition", "AllocNode:Sid"],
            vec!["ReqNodeList", "ExcNodeList"],
            vec!["NodeList"],
            vec!["BatchHost"],
            vec!["NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "ReqB:S:C:T"],
            vec!["TRES"],
            vec!["Socks/Node", "NtasksPerN:B:S:C", "CoreSpec"],
            vec!["MinCPUsNode", "MinMemoryNode", "MinTmpDiskNode"],
            vec!["Features", "DelayBoot"],
            vec!["OverSubscribe", "Contiguous", "Licenses", "Network"],
            vec!["Command"],
            vec!["WorkDir"],
            vec!["StdErr"],
            vec!["StdIn"],
            vec!["StdOut"],
            vec!["Power"],
        ];
        assert_eq!(keys, want, "{text}");
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("JobId=3 JobName=train"));
        assert_eq!(
            lines.next(),
            Some("   UserId=alice(1000) GroupId=4242420(4242420) MCS_label=N/A")
        );
        assert_eq!(
            lines.next(),
            Some("   Priority=0 Nice=5 Account=(null) QOS=(null)")
        );
        assert!(
            text.contains(
                "\n   ReqNodeList=(null) ExcNodeList=(null)\n   NodeList=node-[1-2]\n   \
                 BatchHost=node-1\n"
            ),
            "{text}"
        );
        assert!(text.contains(" JobState=RUNNING "));
        // No limit: `TimeLimit=UNLIMITED`. Slurm 22.05 printed `-t 5`, `-t 60` and `-t 2-0` as
        // `TimeLimit=00:05:00`, `01:00:00` and `2-00:00:00` (squeue's `5:00` is its own).
        assert!(
            text.contains(" TimeLimit=UNLIMITED TimeMin=N/A\n"),
            "{text}"
        );
        for (secs, shown) in [
            (300, "00:05:00"),
            (3600, "01:00:00"),
            (2 * 86_400, "2-00:00:00"),
        ] {
            let limited = JobInfo {
                time_limit_s: secs,
                ..info.clone()
            };
            let text = jobs(&[JobView::from_job(&limited, 0)], &RenderCtx::default());
            assert!(
                text.contains(&format!(" TimeLimit={shown} TimeMin=N/A\n")),
                "{text}"
            );
        }
        // The reference printed `Partition=batch AllocNode:Sid=localhost:28358` and, with
        // no memory asked, a bare `MinMemoryNode=0`.
        assert!(
            text.contains("\n   Partition= AllocNode:Sid=login1:28358\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\n   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0\n   \
                 Features=(null) DelayBoot=00:00:00\n   \
                 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)\n"
            ),
            "{text}"
        );
        // `--ntasks-per-node=2 -c 2`: `NtasksPerN:B:S:C=2:0:*:*` and `MinCPUsNode=4`.
        let per_node = JobInfo {
            ntasks_per_node: 2,
            cpus_per_task: 2,
            ..info.clone()
        };
        let text_node = jobs(&[JobView::from_job(&per_node, 0)], &RenderCtx::default());
        assert!(
            text_node.contains(
                "\n   Socks/Node=* NtasksPerN:B:S:C=2:0:*:* CoreSpec=*\n   MinCPUsNode=4 "
            ),
            "{text_node}"
        );
        // `--mem-per-cpu=100` showed `MinMemoryCPU=100M` in its place.
        let per_cpu = JobInfo {
            mem_per_cpu_mb: 100,
            ..info.clone()
        };
        let text_cpu = jobs(&[JobView::from_job(&per_cpu, 0)], &RenderCtx::default());
        assert!(
            text_cpu.contains(" MinMemoryCPU=100M MinTmpDiskNode=0\n"),
            "{text_cpu}"
        );
        // Slurm 22.05 without -o/-e/-i: `StdErr=` and `StdOut=` the default file in the
        // working directory, `StdIn=/dev/null`.
        assert!(
            text.ends_with(
                "   StdErr=/home/alice/slurm-3.out\n   StdIn=/dev/null\n   \
                 StdOut=/home/alice/slurm-3.out\n   Power=\n   \n\n"
            ),
            "{text}"
        );
        // `-e /tmp/err.%j` showed `StdErr=/tmp/err.5460`; `%x` is the name; a relative
        // `-i` is under the working directory.
        let named = JobInfo {
            stderr: "/tmp/%x.%j".into(),
            stdin: "in.txt".into(),
            ..info.clone()
        };
        let text = jobs(&[JobView::from_job(&named, 0)], &RenderCtx::default());
        assert!(
            text.ends_with(
                "   StdErr=/tmp/train.3\n   StdIn=/home/alice/in.txt\n   \
                 StdOut=/home/alice/slurm-3.out\n   Power=\n   \n\n"
            ),
            "{text}"
        );
        // Slurm 22.05, `sbatch -w n[1-2] -x n3`: `ReqNodeList=n[1-2] ExcNodeList=n3`.
        let info = JobInfo {
            req_nodelist: "node-[1-2]".into(),
            exc_nodelist: "node-3".into(),
            ..info
        };
        let text = jobs(&[JobView::from_job(&info, 0)], &RenderCtx::default());
        assert!(
            text.contains("\n   ReqNodeList=node-[1-2] ExcNodeList=node-3\n"),
            "{text}"
        );
        // Pending, Slurm 22.05 printed `NodeList=` with nothing after it.
        let info = JobInfo {
            state: JobState::Pending as i32,
            nodelist: String::new(),
            ..info
        };
        let text = jobs(&[JobView::from_job(&info, 0)], &RenderCtx::default());
        assert!(text.contains("\n   NodeList=\n"), "{text}");
        assert!(text.ends_with("\n\n"));
    }

    /// The reference Slurm 22.05 (`NODES=8`), `scontrol show node n1` of a drained node, and
    /// of n1 running a 2-CPU job (`AllocTRES=cpu=2`); lines 1, 7 and 10 end with a space:
    ///
    /// ```text
    /// NodeName=n1 Arch=x86_64 CoresPerSocket=64
    ///    CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.43
    ///    AvailableFeatures=(null)
    ///    ActiveFeatures=(null)
    ///    Gres=gpu:8
    ///    NodeAddr=127.0.0.1 NodeHostName=vm Port=17001 Version=22.05.8
    ///    OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0
    ///    RealMemory=1 AllocMem=0 FreeMem=22623 Sockets=1 Boards=1
    ///    State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
    ///    Partitions=batch
    ///    BootTime=2026-12-04T22:11:52 SlurmdStartTime=2026-12-05T07:40:15
    ///    LastBusyTime=2026-12-05T07:40:15
    ///    CfgTRES=cpu=64,mem=1M,billing=64,gres/gpu=8
    ///    AllocTRES=
    ///    CapWatts=n/a
    ///    CurrentWatts=0 AveWatts=0
    ///    ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
    ///    Reason=disk check [root@2026-12-05T07:51:50]
    /// ```
    ///
    /// Tandem's differences, by design: no topology (Slurm's inference for a node declared by
    /// CPU count: one core per socket), no load or free-memory figures, and its time-partition
    /// mode at the end of the State line.
    #[test]
    fn node_block_reads_as_slurms() {
        use tandem_proto::v1::{NodeInfo, Tres};
        let info = NodeInfo {
            name: "n1".into(),
            state: "IDLE".into(),
            total: Some(Tres {
                cpus: 64,
                mem_mb: 1,
                gpus: 8,
                gpu_type: String::new(),
            }),
            allocated: Some(Tres::default()),
            partitions: vec!["batch".into()],
            reason: "disk check".into(),
            reason_user: "root".into(),
            reason_time: 1_796_457_110,
            boot_time: 1_796_422_312,
            worker_start_time: 1_796_456_415,
            last_heartbeat: 1_796_456_415,
            address: "127.0.0.1:17001".into(),
            hostname: "vm".into(),
            worker_version: "0.1.0".into(),
            arch: "x86_64".into(),
            os: "Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0".into(),
            ..NodeInfo::default()
        };
        let text = nodes(&[NodeView::from_node(&info)], &RenderCtx::default());
        assert_eq!(
            text,
            "NodeName=n1 Arch=x86_64 CoresPerSocket=1 \n   \
             CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=N/A\n   \
             AvailableFeatures=(null)\n   \
             ActiveFeatures=(null)\n   \
             Gres=gpu:8\n   \
             NodeAddr=127.0.0.1 NodeHostName=vm Port=17001 Version=0.1.0\n   \
             OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0 \n   \
             RealMemory=1 AllocMem=0 FreeMem=N/A Sockets=64 Boards=1\n   \
             State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Mode=batch\n   \
             Partitions=batch \n   \
             BootTime=2026-12-04T22:11:52 SlurmdStartTime=2026-12-05T07:40:15\n   \
             LastBusyTime=2026-12-05T07:40:15\n   \
             CfgTRES=cpu=64,mem=1M,billing=64,gres/gpu=8\n   \
             AllocTRES=\n   \
             CapWatts=n/a\n   \
             CurrentWatts=0 AveWatts=0\n   \
             ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s\n   \
             Reason=disk check [root@2026-12-05T07:51:50]\n\n"
        );
        // Allocated: Slurm's `AllocTRES=cpu=2` leaves out what is zero, and bills nothing.
        let busy = NodeInfo {
            state: "MIXED".into(),
            allocated: Some(Tres {
                cpus: 2,
                ..Tres::default()
            }),
            ..info.clone()
        };
        let text = nodes(&[NodeView::from_node(&busy)], &RenderCtx::default());
        assert!(text.contains("\n   AllocTRES=cpu=2\n"), "{text}");
        assert!(text.contains("\n   CPUAlloc=2 CPUEfctv=64"), "{text}");
        // Drain is a flag on the state the node's use gives it: the reference printed
        // `State=IDLE+DRAIN` for a drained node and `State=MIXED+DRAIN` for one draining
        // under a job.
        for (state, node, shown) in [
            ("DRAINED", &info, "IDLE+DRAIN"),
            ("DRAINING", &busy, "MIXED+DRAIN"),
            ("DOWN+DRAIN", &info, "DOWN+DRAIN"),
        ] {
            let n = NodeInfo {
                state: state.into(),
                ..node.clone()
            };
            let text = nodes(&[NodeView::from_node(&n)], &RenderCtx::default());
            assert!(
                text.contains(&format!("\n   State={shown} ThreadsPerCore=1 ")),
                "{state}: {text}"
            );
        }
        // Not heard from since the controller started: no Arch, address or OS, as Slurm
        // prints a node that never registered.
        let silent = NodeInfo {
            address: String::new(),
            arch: String::new(),
            os: String::new(),
            boot_time: 0,
            worker_start_time: 0,
            ..info
        };
        let text = nodes(&[NodeView::from_node(&silent)], &RenderCtx::default());
        assert!(
            text.starts_with("NodeName=n1 CoresPerSocket=1 \n"),
            "{text}"
        );
        assert!(
            !text.contains("NodeAddr=") && !text.contains("OS="),
            "{text}"
        );
        assert!(
            text.contains("\n   BootTime=Unknown SlurmdStartTime=Unknown\n"),
            "{text}"
        );
    }

    /// The reference Slurm 22.05 (`NODES=8`, no partition options), `scontrol show
    /// partition`:
    ///
    /// ```text
    /// PartitionName=batch
    ///    AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
    ///    AllocNodes=ALL Default=YES QoS=N/A
    ///    DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO
    ///    MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
    ///    Nodes=n[1-8]
    ///    PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO
    ///    OverTimeLimit=NONE PreemptMode=OFF
    ///    State=UP TotalCPUs=512 TotalNodes=8 SelectTypeParameters=NONE
    ///    JobDefaults=(null)
    ///    DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
    ///    TRES=cpu=512,mem=8M,node=8,billing=512,gres/gpu=64
    /// ```
    #[test]
    fn partition_block_reads_as_slurms() {
        use tandem_proto::v1::PartitionInfo;
        let info = PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            nodes: (1..=8).map(|i| format!("n{i}")).collect(),
            priority_tier: 1,
            priority_job_factor: 1,
            total_cpus: 512,
            total_gpus: 64,
            total_mem_mb: 8,
            preempt_mode: "OFF".into(),
            ..PartitionInfo::default()
        };
        let text = partitions(&[PartitionView::from_partition(&info)]);
        assert_eq!(
            text,
            "PartitionName=batch\n   \
             AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n   \
             AllocNodes=ALL Default=YES QoS=N/A\n   \
             DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO\n   \
             MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED\n   \
             Nodes=n[1-8]\n   \
             PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO\n   \
             OverTimeLimit=NONE PreemptMode=OFF\n   \
             State=UP TotalCPUs=512 TotalNodes=8 SelectTypeParameters=NONE\n   \
             JobDefaults=(null)\n   \
             DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED\n   \
             TRES=cpu=512,mem=8M,node=8,billing=512,gres/gpu=64\n\n"
        );
        // Limits, accounts, a default memory per CPU and QOS preemption, as Slurm names them
        // (`DefaultTime=01:00:00`, `MaxTime=1-00:00:00`, `DefMemPerCPU=2048`).
        let info = PartitionInfo {
            is_default: false,
            default_time_s: 3600,
            max_time_s: 86_400,
            max_nodes: 4,
            allowed_accounts: vec!["physics".into(), "chem".into()],
            preempt_mode: "REQUEUE".into(),
            default_mem_per_cpu_mb: 2048,
            ..info
        };
        let text = partitions(&[PartitionView::from_partition(&info)]);
        for line in [
            "\n   AllowGroups=ALL AllowAccounts=physics,chem AllowQos=ALL\n",
            "\n   AllocNodes=ALL Default=NO QoS=N/A\n",
            "\n   DefaultTime=01:00:00 DisableRootJobs=NO",
            "\n   MaxNodes=4 MaxTime=1-00:00:00 MinNodes=0",
            "\n   OverTimeLimit=NONE PreemptMode=REQUEUE\n",
            "\n   DefMemPerCPU=2048 MaxMemPerNode=UNLIMITED\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
    }

    /// `-N 2 --gpus-per-node=2`: the job holds 4 GPUs, 2 on each node.
    #[test]
    fn tres_per_node_is_the_per_node_share() {
        let tres = |gpus, gpu_type: &str| tandem_proto::v1::Tres {
            cpus: 2,
            mem_mb: 0,
            gpus,
            gpu_type: gpu_type.into(),
        };
        let cases = [
            (2, tres(4, ""), "TresPerNode=gres/gpu:2"),
            (2, tres(16, "h100"), "TresPerNode=gres/gpu:h100:8"),
            (1, tres(3, ""), "TresPerNode=gres/gpu:3"),
        ];
        for (nodes, t, want) in cases {
            let info = JobInfo {
                job_id: 3,
                array_task_id: -1,
                state: JobState::Running as i32,
                num_nodes: nodes,
                tres: Some(t),
                ..JobInfo::default()
            };
            let text = jobs(&[JobView::from_job(&info, 0)], &RenderCtx::default());
            assert!(text.contains(&format!("\n   {want}\n")), "{want}: {text}");
        }
        // Without GPUs Slurm 22.05 printed no TresPerNode line at all.
        let info = JobInfo {
            job_id: 3,
            array_task_id: -1,
            num_nodes: 2,
            tres: Some(tres(0, "")),
            ..JobInfo::default()
        };
        let text = jobs(&[JobView::from_job(&info, 0)], &RenderCtx::default());
        assert!(!text.contains("TresPerNode"), "{text}");
    }
}
