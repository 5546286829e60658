//! Where `srun`'s tasks go and what each one sees, beside Slurm 22.05: `-w` inside a
//! multi-node job, `--ntasks-per-node` inside a job, and `-N2 -n3` outside one. The expected
//! lines are Slurm's outputs (8 nodes `n[1-8]`, the job on `n[1-2]`), with Tandem's node
//! names put in.

use crate::support;

use std::time::Duration;

use support::Cluster;

const T: Duration = Duration::from_secs(30);

/// Run by every task: one line of its place and its layout variables (`-` when unset).
const TASK: &str = "#!/bin/sh\n\
printf 'P=%s NODE=%s NID=%s' \"$SLURM_PROCID\" \"$SLURMD_NODENAME\" \"$SLURM_NODEID\"\n\
for v in NNODES NTASKS NPROCS STEP_NUM_NODES STEP_NUM_TASKS STEP_NODELIST \\\n\
  STEP_TASKS_PER_NODE TASKS_PER_NODE NTASKS_PER_NODE JOB_CPUS_PER_NODE; do\n\
  eval \"printf ' %s=%s' $v \\\"\\${SLURM_$v--}\\\"\"\n\
done\n\
echo\n";

/// One expected task line.
struct Line<'a> {
    procid: u32,
    node: &'a str,
    nodeid: u32,
    nnodes: u32,
    ntasks: u32,
    step_nodes: &'a str,
    tasks_per_node: &'a str,
    ntasks_per_node: &'a str,
    job_cpus: &'a str,
}

impl Line<'_> {
    fn text(&self) -> String {
        let Line {
            procid,
            node,
            nodeid,
            nnodes,
            ntasks,
            step_nodes,
            tasks_per_node,
            ntasks_per_node,
            job_cpus,
        } = self;
        format!(
            "P={procid} NODE={node} NID={nodeid} NNODES={nnodes} NTASKS={ntasks} \
             NPROCS={ntasks} STEP_NUM_NODES={nnodes} STEP_NUM_TASKS={ntasks} \
             STEP_NODELIST={step_nodes} STEP_TASKS_PER_NODE={tasks_per_node} \
             TASKS_PER_NODE={tasks_per_node} NTASKS_PER_NODE={ntasks_per_node} \
             JOB_CPUS_PER_NODE={job_cpus}"
        )
    }
}

/// Runs `body` as a batch script with `opts`; returns its output after the `nodes:` line,
/// and the job's two node names.
fn batch(c: &Cluster, name: &str, opts: &[&str], body: &str) -> (Vec<String>, String, String) {
    let tandem = support::TANDEM;
    c.script("task.sh", TASK);
    std::fs::set_permissions(
        c.work.join("task.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let script = c.script(
        &format!("{name}.sh"),
        &format!(
            "#!/bin/sh\nset -- $({tandem} scontrol show hostnames \"$SLURM_JOB_NODELIST\")\n\
             a=$1; b=$2\necho \"nodes: $a $b\"\n{body}\necho end\n"
        ),
    );
    let out = format!("{name}.out");
    let mut args = vec!["-o", out.as_str()];
    args.extend_from_slice(opts);
    args.push(&script);
    c.sbatch(&args);
    let text = c.wait_file(&c.work.join(&out), "end", T);
    let mut lines = text.lines().map(|l| l.trim_end().to_owned());
    let head = lines.next().expect("nodes line");
    let words: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(words.len(), 3, "{text}");
    let (a, b) = (words[1].to_owned(), words[2].to_owned());
    (lines.collect(), a, b)
}

/// Slurm 22.05, `sbatch -N2` (1 CPU on each node, `SLURM_JOB_CPUS_PER_NODE=1(x2)`):
///
/// ```text
/// srun -w n2 / srun -w n1,n2 (SLURM_NNODES=2 is srun's -N: the step is widened)
///   P=0 n1 NODEID=0 NNODES=2 NTASKS=2 STEP_NODELIST=n[1-2] STEP_TASKS_PER_NODE=1(x2) ...
///   P=1 n2 NODEID=1 ...
/// srun -N1 -w n2
///   P=0 n2 NODEID=0 NNODES=1 NTASKS=1 STEP_NODELIST=n2 STEP_TASKS_PER_NODE=1 ...
/// srun -n1 -w n2
///   srun: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1
///   P=0 n2 NODEID=0 NNODES=1 NTASKS=1 STEP_NODELIST=n2 ...
/// srun --ntasks-per-node=2
///   srun: error: Unable to create step for job 1: More processors requested than permitted
/// ```
#[test]
fn a_named_node_in_a_two_node_job_is_widened_to_both_as_in_slurm() {
    let c = Cluster::start(3);
    let body = "for o in \"-w $b\" \"-w $a,$b\" \"-N1 -w $b\" \"-n1 -w $b\"; do\n\
                echo \"== $o\"; $TANDEM_BIN srun $o ./task.sh 2>&1 | sort\ndone\n\
                $TANDEM_BIN srun --ntasks-per-node=2 true 2>refused.err; echo \"refused: $?\"";
    let (got, a, b) = batch(&c, "widen", &["-N2"], body);
    let both = tandem_sched::hostlist::compress(&[a.as_str(), b.as_str()]);
    let line = |procid: u32, node: &str, nodeid: u32, nnodes: u32, step_nodes: &str, tpn: &str| {
        Line {
            procid,
            node,
            nodeid,
            nnodes,
            ntasks: nnodes,
            step_nodes,
            tasks_per_node: tpn,
            ntasks_per_node: "-",
            job_cpus: "1(x2)",
        }
        .text()
    };
    let wide = [
        line(0, &a, 0, 2, &both, "1(x2)"),
        line(1, &b, 1, 2, &both, "1(x2)"),
    ];
    let mut want = vec![format!("== -w {b}")];
    want.extend(wide.iter().cloned());
    want.push(format!("== -w {a},{b}"));
    want.extend(wide.iter().cloned());
    want.push(format!("== -N1 -w {b}"));
    want.push(line(0, &b, 0, 1, &b, "1"));
    want.push(format!("== -n1 -w {b}"));
    want.push(line(0, &b, 0, 1, &b, "1"));
    want.push("srun: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1".into());
    want.push("refused: 1".into());
    want.push("end".into());
    assert_eq!(got, want);
    let refused = std::fs::read_to_string(c.work.join("refused.err")).unwrap();
    assert!(
        refused.ends_with("More processors requested than permitted\n"),
        "{refused}"
    );
}

/// Slurm 22.05, `sbatch -N2 -c4` (4 CPUs on each node, no task count):
///
/// ```text
/// srun --ntasks-per-node=2            P=0,1 on n1 (NODEID 0), P=2,3 on n2 (NODEID 1):
///   NTASKS=4 NPROCS=4 STEP_NUM_TASKS=4 STEP_TASKS_PER_NODE=2(x2) TASKS_PER_NODE=2(x2)
///   NTASKS_PER_NODE=2 JOB_CPUS_PER_NODE=4(x2)
/// srun -w n2 --ntasks-per-node=2      the same, on both nodes
/// srun -N1 -w n2 --ntasks-per-node=2  P=0,1 on n2: NNODES=1 NTASKS=2 STEP_TASKS_PER_NODE=2
/// srun -n3 --ntasks-per-node=2        srun: Warning: can't honor --ntasks-per-node set to 2
///   which doesn't match the requested tasks 3 with the number of requested nodes 2.
///   Ignoring --ntasks-per-node.       P=0,1 on n1, P=2 on n2: STEP_TASKS_PER_NODE=2,1,
///   NTASKS_PER_NODE unset
/// ```
#[test]
fn ntasks_per_node_inside_a_job_lays_out_tasks_as_slurm_does() {
    let c = Cluster::start(3);
    let body = "for o in --ntasks-per-node=2 \"-w $b --ntasks-per-node=2\" \
                \"-N1 -w $b --ntasks-per-node=2\" \"-n3 --ntasks-per-node=2\"; do\n\
                echo \"== $o\"; $TANDEM_BIN srun $o ./task.sh 2>&1 | sort\ndone";
    let (got, a, b) = batch(&c, "per-node", &["-N2", "-c4"], body);
    let both = tandem_sched::hostlist::compress(&[a.as_str(), b.as_str()]);
    let line = |procid: u32,
                node: &str,
                nodeid: u32,
                nnodes: u32,
                ntasks: u32,
                step_nodes: &str,
                tpn: &str,
                ntpn: &str| {
        Line {
            procid,
            node,
            nodeid,
            nnodes,
            ntasks,
            step_nodes,
            tasks_per_node: tpn,
            ntasks_per_node: ntpn,
            job_cpus: "4(x2)",
        }
        .text()
    };
    let four: Vec<String> = [(0, a.as_str(), 0), (1, &a, 0), (2, &b, 1), (3, &b, 1)]
        .into_iter()
        .map(|(p, node, nid)| line(p, node, nid, 2, 4, &both, "2(x2)", "2"))
        .collect();
    let mut want = vec!["== --ntasks-per-node=2".to_owned()];
    want.extend(four.iter().cloned());
    want.push(format!("== -w {b} --ntasks-per-node=2"));
    want.extend(four.iter().cloned());
    want.push(format!("== -N1 -w {b} --ntasks-per-node=2"));
    want.push(line(0, &b, 0, 1, 2, &b, "2", "2"));
    want.push(line(1, &b, 0, 1, 2, &b, "2", "2"));
    want.push("== -n3 --ntasks-per-node=2".into());
    want.push(line(0, &a, 0, 2, 3, &both, "2,1", "-"));
    want.push(line(1, &a, 0, 2, 3, &both, "2,1", "-"));
    want.push(line(2, &b, 1, 2, 3, &both, "2,1", "-"));
    want.push(
        "srun: Warning: can't honor --ntasks-per-node set to 2 which doesn't match the \
         requested tasks 3 with the number of requested nodes 2. Ignoring --ntasks-per-node."
            .into(),
    );
    want.push("end".into());
    assert_eq!(got, want);
}

/// Slurm 22.05, `srun -N2 -n3` outside a job: tasks `2,1` (P=0,1 on n1, P=2 on n2), the job
/// holds `SLURM_JOB_CPUS_PER_NODE=2,1`; `scontrol show job`: `NumNodes=2 NumCPUs=3
/// NumTasks=3`, sacct `AllocCPUS=3`.
#[test]
fn srun_n3_on_two_nodes_allocates_two_cpus_and_one_as_slurm_does() {
    let c = Cluster::start(3);
    c.script("task.sh", TASK);
    std::fs::set_permissions(
        c.work.join("task.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = c.ok(&[
        "srun",
        "-N2",
        "-n3",
        "sh",
        "-c",
        "./task.sh; [ $SLURM_PROCID = 0 ] && echo \"job $SLURM_JOB_ID\" || true",
    ]);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort_unstable();
    let job = lines
        .iter()
        .find_map(|l| l.strip_prefix("job "))
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    let tasks: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("P="))
        .collect();
    assert_eq!(tasks.len(), 3, "{out}");
    let node_of = |l: &str| {
        l.split(' ')
            .find_map(|w| w.strip_prefix("NODE="))
            .unwrap()
            .to_owned()
    };
    let (a, b) = (node_of(tasks[0]), node_of(tasks[2]));
    let both = tandem_sched::hostlist::compress(&[a.as_str(), b.as_str()]);
    let line = |procid: u32, node: &str, nodeid: u32| {
        Line {
            procid,
            node,
            nodeid,
            nnodes: 2,
            ntasks: 3,
            step_nodes: &both,
            tasks_per_node: "2,1",
            ntasks_per_node: "-",
            job_cpus: "2,1",
        }
        .text()
    };
    assert_eq!(tasks, [line(0, &a, 0), line(1, &a, 0), line(2, &b, 1)]);
    let alloc = c.ok(&["sacct", "-X", "-n", "-P", "-j", &job, "-o", "AllocCPUS"]);
    assert_eq!(alloc.trim(), "3");
}

/// Slurm 22.05, `srun -N2 -n5` outside a job on idle nodes: the first node takes every task
/// but the second's one (`4 n1 4,1 4,1 4,1` and `1 n2 4,1 4,1 4,1` for `SLURMD_NODENAME
/// SLURM_TASKS_PER_NODE SLURM_JOB_CPUS_PER_NODE SLURM_STEP_TASKS_PER_NODE`, counted by
/// `uniq -c`), not an even `3,2`; 4-CPU nodes here hold the same 4.
#[test]
fn srun_n5_on_two_nodes_fills_the_first_node_as_slurm_does() {
    let c = Cluster::start(3);
    let out = c.ok(&[
        "srun",
        "-N2",
        "-n5",
        "sh",
        "-c",
        "echo $SLURMD_NODENAME $SLURM_TASKS_PER_NODE $SLURM_JOB_CPUS_PER_NODE \
         $SLURM_STEP_TASKS_PER_NODE",
    ]);
    let mut per_node: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    for l in out.lines() {
        let (node, layout) = l.split_once(' ').unwrap_or_else(|| panic!("{out}"));
        let e = per_node
            .entry(node.to_owned())
            .or_insert((0, layout.to_owned()));
        e.0 += 1;
        assert_eq!(e.1, layout, "{out}");
    }
    let counts: Vec<usize> = per_node.values().map(|(n, _)| *n).collect();
    assert_eq!(counts, [4, 1], "{out}");
    for (_, layout) in per_node.values() {
        assert_eq!(layout, "4,1 4,1 4,1", "{out}");
    }
}

/// `-w` beyond `-N` or beyond the task count, beside Slurm 22.05 (nodes `n[1-8]` there):
/// `srun -N1 -w n3,n1` printed `srun: error: Required nodelist includes more nodes than
/// permitted by max-node count (2 > 1). Eliminating nodes from the nodelist.` and ran on n3;
/// `sbatch -N1 -w n1,n2` was refused with `sbatch: error: invalid number of nodes (-N 2-1)`;
/// `sbatch -n1 -w n2,n1` warned `can't run 1 processes on 2 nodes, setting nnodes to 1` and
/// queued a job with `ReqNodeList=n1 NumNodes=1`.
#[test]
fn nodelists_beyond_the_node_or_task_count_are_settled_as_slurm_does() {
    let c = Cluster::start(3);
    let out = c.run(&[
        "srun",
        "-N1",
        "-w",
        "node-3,node-1",
        "sh",
        "-c",
        "echo $SLURM_JOB_NODELIST",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "node-3\n");
    assert!(
        stderr.contains(
            "srun: error: Required nodelist includes more nodes than permitted by max-node \
             count (2 > 1). Eliminating nodes from the nodelist.\n"
        ),
        "{stderr}"
    );

    let before = c.all_jobs().len();
    let out = c.run(&["sbatch", "-N1", "-w", "node-1,node-2", "--wrap=true"]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "sbatch: error: invalid number of nodes (-N 2-1)\n"
    );
    assert_eq!(c.all_jobs().len(), before, "a refused sbatch queued a job");

    let out = c.run(&["sbatch", "-H", "-n1", "-w", "node-2,node-1", "--wrap=true"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "sbatch: Warning: can't run 1 processes on 2 nodes, setting nnodes to 1\n"
    );
    let id: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|w| w.parse().ok())
        .expect("Submitted batch job ID");
    let show = c.ok(&["scontrol", "show", "job", &id.to_string()]);
    assert!(show.contains("ReqNodeList=node-1 "), "{show}");
    assert!(show.contains("NumNodes=1"), "{show}");

    // Inside a `-N2` job Slurm's srun did the same: `srun -N1 -w n2,n1` printed the error
    // line and ran on n2.
    let (got, a, b) = batch(
        &c,
        "inside",
        &["-N2"],
        "$TANDEM_BIN srun -N1 -w $b,$a sh -c 'echo on $SLURMD_NODENAME' 2>&1",
    );
    assert_eq!(
        got,
        [
            "srun: error: Required nodelist includes more nodes than permitted by max-node \
             count (2 > 1). Eliminating nodes from the nodelist."
                .to_string(),
            format!("on {b}"),
            "end".to_string(),
        ],
        "job on {a} and {b}"
    );
}
