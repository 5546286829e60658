//! `scontrol show job|node|partition`: Slurm's `Key=Value` blocks, one record per block,
//! continuation lines indented by three spaces, records separated by a blank line.

use super::columns::RenderCtx;
use super::view::{JobView, NodeView, PartitionView, timestamp};
use tandem_sched::time::format_duration;
use tandem_sched::tres::format_mem_mb;

fn null(s: &str) -> &str {
    if s.is_empty() { "(null)" } else { s }
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
    // Slurm 22.05's lines and their order; fields Tandem does not have are left out rather
    // than made up.
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
            ("TimeLimit", format_duration(j.time_limit_s)),
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
        ],
        vec![("TRES", j.tres.to_string())],
        vec![
            min_memory(j),
            ("Features", null(j.constraint).to_string()),
            (
                "OverSubscribe",
                if j.exclusive { "NO" } else { "OK" }.to_string(),
            ),
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
    lines.extend([
        vec![("StdErr", stderr)],
        vec![("StdIn", stdin)],
        vec![("StdOut", stdout)],
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

pub fn nodes(nodes: &[NodeView], ctx: &RenderCtx) -> String {
    nodes
        .iter()
        .map(|n| {
            let feats = if n.features.is_empty() {
                "(null)".to_string()
            } else {
                n.features.join(",")
            };
            let mut cfg = format!("cpu={},mem={}", n.cpus, format_mem_mb(n.mem_mb));
            if n.gpus > 0 {
                cfg.push_str(&format!(",gres/gpu={}", n.gpus));
            }
            let mut alloc = String::new();
            if n.cpus_alloc > 0 || n.mem_alloc_mb > 0 || n.gpus_alloc > 0 {
                alloc = format!("cpu={},mem={}", n.cpus_alloc, format_mem_mb(n.mem_alloc_mb));
                if n.gpus_alloc > 0 {
                    alloc.push_str(&format!(",gres/gpu={}", n.gpus_alloc));
                }
            }
            let mut lines = vec![
                vec![("NodeName", n.name.clone())],
                vec![
                    ("CPUAlloc", n.cpus_alloc.to_string()),
                    ("CPUTot", n.cpus.to_string()),
                ],
                vec![("AvailableFeatures", feats.clone())],
                vec![("ActiveFeatures", feats)],
                vec![("Gres", n.gres())],
                vec![("NodeAddr", null(&n.address).to_string())],
                vec![
                    ("RealMemory", n.mem_mb.to_string()),
                    ("AllocMem", n.mem_alloc_mb.to_string()),
                ],
                vec![("State", n.state.clone()), ("Mode", n.mode.to_string())],
                vec![("Partitions", n.partitions.join(","))],
                vec![
                    ("BootTime", timestamp(n.boot_time, ctx.utc_offset_s)),
                    (
                        "LastBusyTime",
                        timestamp(n.last_heartbeat, ctx.utc_offset_s),
                    ),
                ],
                vec![("CfgTRES", cfg)],
                vec![("AllocTRES", alloc)],
                vec![("Version", null(&n.version).to_string())],
            ];
            // Only with a reason, followed by who gave it and when, as Slurm prints it:
            // `Reason=disk check [root@2026-12-04T21:22:36]`.
            if !n.reason.is_empty() {
                let by = n.reason_by.as_ref().map_or_else(String::new, |(u, t)| {
                    format!(" [{u}@{}]", timestamp(Some(*t), ctx.utc_offset_s))
                });
                lines.push(vec![("Reason", format!("{}{by}", n.reason))]);
            }
            block(&lines)
        })
        .collect()
}

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
            block(&[
                vec![("PartitionName", p.name.clone())],
                vec![("AllowAccounts", accounts)],
                vec![(
                    "Default",
                    if p.is_default { "YES" } else { "NO" }.to_string(),
                )],
                vec![(
                    "DefaultTime",
                    p.default_time_s
                        .map_or("NONE".to_string(), |s| format_duration(Some(s))),
                )],
                vec![
                    (
                        "MaxNodes",
                        p.max_nodes
                            .map_or("UNLIMITED".to_string(), |n| n.to_string()),
                    ),
                    ("MaxTime", format_duration(p.max_time_s)),
                ],
                vec![("Nodes", tandem_sched::hostlist::compress(&names))],
                vec![
                    ("PriorityJobFactor", p.priority_job_factor.to_string()),
                    ("PriorityTier", p.priority_tier.to_string()),
                ],
                vec![
                    ("State", p.state.clone()),
                    ("TotalCPUs", p.total_cpus.to_string()),
                    ("TotalNodes", p.nodes.len().to_string()),
                ],
                vec![("TotalGPUs", p.total_gpus.to_string())],
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
        let keys: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| !l.is_empty())
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
            vec!["RunTime", "TimeLimit"],
            vec!["SubmitTime", "EligibleTime"],
            vec!["StartTime", "EndTime", "Deadline"],
            vec!["Partition", "AllocNode:Sid"],
            vec!["ReqNodeList", "ExcNodeList"],
            vec!["NodeList"],
            vec!["BatchHost"],
            vec!["NumNodes", "NumCPUs", "NumTasks", "CPUs/Task"],
            vec!["TRES"],
            vec!["MinMemoryNode", "Features", "OverSubscribe"],
            vec!["Command"],
            vec!["WorkDir"],
            vec!["StdErr"],
            vec!["StdIn"],
            vec!["StdOut"],
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
        // The reference printed `Partition=batch AllocNode:Sid=localhost:28358` and, with
        // no memory asked, a bare `MinMemoryNode=0`.
        assert!(
            text.contains("\n   Partition= AllocNode:Sid=login1:28358\n"),
            "{text}"
        );
        assert!(
            text.contains("\n   MinMemoryNode=0 Features=(null)"),
            "{text}"
        );
        // `--mem-per-cpu=100` showed `MinMemoryCPU=100M` in its place.
        let per_cpu = JobInfo {
            mem_per_cpu_mb: 100,
            ..info.clone()
        };
        let text_cpu = jobs(&[JobView::from_job(&per_cpu, 0)], &RenderCtx::default());
        assert!(
            text_cpu.contains("\n   MinMemoryCPU=100M Features="),
            "{text_cpu}"
        );
        // Slurm 22.05 without -o/-e/-i: `StdErr=` and `StdOut=` the default file in the
        // working directory, `StdIn=/dev/null`.
        assert!(
            text.ends_with(
                "   StdErr=/home/alice/slurm-3.out\n   StdIn=/dev/null\n   \
                 StdOut=/home/alice/slurm-3.out\n\n"
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
                 StdOut=/home/alice/slurm-3.out\n\n"
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
