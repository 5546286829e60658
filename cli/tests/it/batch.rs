//! Batch jobs end to end: a real controller and real workers (`tandem up`), driven through
//! the real CLI, each test on its own cluster.
//!
//! What belongs here: behaviour a user sees through sbatch/squeue/scancel/sacct/scontrol.
//! Crash safety is in `crash.rs`; option parsing details are unit tests in `src/opts`.

use crate::support;

use std::time::Duration;

use support::{Cluster, assert_one_line_error};

const T: Duration = Duration::from_secs(30);

#[test]
fn script_with_sbatch_lines_runs_and_writes_its_output_file() {
    let c = Cluster::start(3);
    let script = c.script(
        "hello.sh",
        "#!/bin/bash\n\
         # a comment before the directives\n\
         #SBATCH --job-name=greeter\n\
         #SBATCH -o out-%j.txt   # stdout pattern\n\
         #SBATCH -t 1\n\
         #SBATCH -n 1 -c 2\n\
         echo \"hello from $SLURM_JOB_ID name=$SLURM_JOB_NAME args=$*\"\n\
         echo \"cpus=$SLURM_CPUS_PER_TASK submit=$SLURM_SUBMIT_DIR\"\n",
    );
    let id = c.sbatch(&[&script, "a1", "a2"]);
    let rec = c.wait_state(id, "COMPLETED", T);
    assert_eq!(support::exit_code(&rec), "0:0");
    assert_eq!(rec["name"], "greeter");
    let out = c.wait_file(&c.work.join(format!("out-{id}.txt")), "cpus=", T);
    assert!(
        out.contains(&format!("hello from {id} name=greeter args=a1 a2")),
        "{out}"
    );
    assert!(
        out.contains(&format!("cpus=2 submit={}", c.work.display())),
        "{out}"
    );

    // The record is visible through the human tables too.
    let sacct = c.ok(&[
        "sacct",
        "-X",
        "-j",
        &id.to_string(),
        "-P",
        "--format",
        "JobID,JobName,State,ExitCode",
    ]);
    assert_eq!(
        sacct,
        format!("JobID|JobName|State|ExitCode\n{id}|greeter|COMPLETED|0:0\n")
    );
}

#[test]
fn two_node_job_gets_both_nodes_at_once() {
    let c = Cluster::start(3);
    let script = c.script(
        "two.sh",
        "#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=1 -o two.out\n\
         echo \"list=$SLURM_JOB_NODELIST n=$SLURM_JOB_NUM_NODES\"\n\
         \"$TANDEM_BIN\" scontrol show hostnames \"$SLURM_JOB_NODELIST\"\n",
    );
    let id = c.sbatch(&[&script]);
    let rec = c.wait_state(id, "COMPLETED", T);
    assert_eq!(rec["allocation_nodes"], 2);
    let out = c.wait_file(&c.work.join("two.out"), "n=2", T);
    let hosts: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(hosts.len(), 2, "{out}");
    assert_ne!(hosts[0], hosts[1]);
    for h in &hosts {
        assert!(h.starts_with("node-"), "{out}");
    }
    // The node list names exactly those hosts, as sacct shows it.
    let nodelist = rec["nodes"].as_str().unwrap();
    let expanded = c.ok(&["scontrol", "show", "hostnames", nodelist]);
    assert_eq!(expanded.lines().collect::<Vec<_>>(), hosts);
}

#[test]
fn job_over_its_time_limit_ends_timeout() {
    let c = Cluster::start(3);
    // MM:SS: two seconds.
    let id = c.sbatch(&["-t", "0:02", "--wrap", "sleep 60"]);
    let rec = c.wait_end(id, T);
    assert_eq!(rec["state"]["current"], "TIMEOUT", "{rec}");
    assert!(rec["time"]["elapsed"].as_u64().unwrap() < 20, "{rec}");
}

#[test]
fn scancel_ends_a_running_job_cancelled() {
    let c = Cluster::start(3);
    let id = c.sbatch(&["-J", "victim", "--wrap", "sleep 60"]);
    c.wait_state(id, "RUNNING", T);
    let squeue = c.ok(&["squeue", "-j", &id.to_string(), "-h", "-o", "%i %j %t"]);
    assert_eq!(squeue, format!("{id} victim R\n"));
    c.ok(&["scancel", &id.to_string()]);
    let rec = c.wait_end(id, T);
    assert_eq!(rec["state"]["current"], "CANCELLED", "{rec}");
    // Gone from the queue.
    assert_eq!(c.ok(&["squeue", "-h", "-j", &id.to_string()]), "");
}

#[test]
fn more_gpus_than_any_node_has_is_rejected_at_submit() {
    let c = Cluster::start(3);
    let out = c.run(&["sbatch", "--gpus-per-node=3", "--wrap", "true"]);
    assert_one_line_error(&out, "sbatch", "gpu");
    assert!(
        c.all_jobs().is_empty(),
        "a rejected job was stored: {:?}",
        c.all_jobs()
    );
}

#[test]
fn job_waits_pending_resources_while_busy_then_starts() {
    let c = Cluster::start(3);
    // Takes every GPU of the cluster for a few seconds.
    let hog = c.sbatch(&["-N", "3", "--gpus-per-node=2", "--wrap", "sleep 4"]);
    c.wait_state(hog, "RUNNING", T);
    let waiter = c.sbatch(&["--gpus-per-node=2", "--wrap", "echo got it"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut reason = String::new();
    while std::time::Instant::now() < deadline {
        let out = c.ok(&["squeue", "-h", "-j", &waiter.to_string(), "-o", "%T %r"]);
        reason = out.trim().to_string();
        if reason == "PENDING Resources" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(reason, "PENDING Resources", "{}", c.controller_log());
    // Slurm's JSON: `jq '.jobs[] | select(.job_state=="RUNNING") | .job_id'` finds the hog.
    let json: serde_json::Value = serde_json::from_str(&c.ok(&["squeue", "--json"])).unwrap();
    let jobs = json["jobs"].as_array().unwrap();
    let running: Vec<&serde_json::Value> = jobs
        .iter()
        .filter(|j| j["job_state"] == "RUNNING")
        .map(|j| &j["job_id"])
        .collect();
    assert_eq!(running, [&serde_json::json!(hog)], "{json}");
    let w = jobs.iter().find(|j| j["job_id"] == waiter).unwrap();
    assert_eq!(
        (&w["job_state"], &w["state_reason"], &w["tres_alloc_str"]),
        (
            &serde_json::json!("PENDING"),
            &serde_json::json!("Resources"),
            &serde_json::json!("")
        ),
        "{w}"
    );
    // The default squeue layout shows the reason in parentheses.
    let table = c.ok(&["squeue"]);
    assert!(
        table.starts_with(
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"
        ),
        "{table}"
    );
    assert!(table.contains("(Resources)"), "{table}");
    let hog_rec = c.wait_state(hog, "COMPLETED", T);
    let rec = c.wait_state(waiter, "COMPLETED", T);
    assert!(
        rec["time"]["start"].as_i64().unwrap() >= hog_rec["time"]["end"].as_i64().unwrap(),
        "{rec} {hog_rec}"
    );
}

#[test]
fn bad_input_gives_one_line_and_creates_nothing() {
    let c = Cluster::start(3);
    let malformed = c.script(
        "bad-line.sh",
        "#!/bin/sh\n#SBATCH -J ok\n#SBATCH --time=garbage\necho\n",
    );
    let quote = c.script("bad-quote.sh", "#!/bin/sh\n#SBATCH -J 'open\necho\n");
    let no_shebang = c.script("plain.sh", "echo no interpreter\n");
    let good = c.script("good.sh", "#!/bin/sh\necho\n");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![&malformed], "line 3"),
        (vec![&quote], "line 2"),
        (vec![&no_shebang], "#!"),
        (vec!["--bogus", &good], "--bogus"),
        (vec!["-p", "nosuchpartition", &good], "nosuchpartition"),
        (vec!["-t", "-5", &good], "negative"),
        (vec!["-t", "1:xx", &good], "1:xx"),
        (vec!["/nonexistent/job.sh"], "/nonexistent/job.sh"),
    ];
    for (args, needle) in cases {
        let mut all = vec!["sbatch"];
        all.extend(args.iter().copied());
        let out = c.run(&all);
        assert_one_line_error(&out, "sbatch", needle);
    }
    // Also through argv[0]-style invocation of other commands.
    assert_one_line_error(&c.run(&["scancel"]), "scancel", "No job identification");
    assert_one_line_error(&c.run(&["squeue", "-t", "sideways"]), "squeue", "sideways");
    assert!(
        c.all_jobs().is_empty(),
        "bad input created jobs: {:?}",
        c.all_jobs()
    );
    assert_eq!(c.ok(&["squeue", "-h"]), "");
}

#[test]
fn sinfo_and_scontrol_show_the_nodes() {
    let c = Cluster::start(3);
    let sinfo = c.ok(&["sinfo"]);
    assert_eq!(
        sinfo,
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\nbatch*       up   infinite      3   idle node-[1-3]\n"
    );
    // What the worker reported of its machine, in Slurm's lines.
    let node = c.ok(&["scontrol", "show", "node", "node-2"]);
    let arch = format!(
        "NodeName=node-2 Arch={} CoresPerSocket=1 \n",
        std::env::consts::ARCH
    );
    assert!(node.starts_with(&arch), "{node}");
    assert!(node.contains("\n   Gres=gpu:2\n"), "{node}");
    assert!(
        node.contains("\n   NodeAddr=127.0.0.1 NodeHostName="),
        "{node}"
    );
    assert!(node.contains("\n   OS=Linux "), "{node}");
    assert!(
        !node.contains("Unknown"),
        "boot and start times known: {node}"
    );
    let part = c.ok(&["scontrol", "show", "partition"]);
    assert!(
        part.starts_with(
            "PartitionName=batch\n   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n"
        ) && part.contains("\n   Nodes=node-[1-3]\n")
            && part.contains("\n   OverTimeLimit=NONE PreemptMode=OFF\n"),
        "{part}"
    );
    assert!(
        part.ends_with("\n   TRES=cpu=12,mem=12G,node=3,billing=12,gres/gpu=6\n\n"),
        "{part}"
    );
    let json: serde_json::Value = serde_json::from_str(&c.ok(&["sinfo", "--json"])).unwrap();
    assert_eq!(json["nodes"].as_array().unwrap().len(), 3);
}

#[test]
fn second_up_on_a_running_cluster_says_so() {
    let c = Cluster::start(3);
    let out = std::process::Command::new(support::TANDEM)
        .args(["up", "--no-default-config", "--nodes", "1", "--state-dir"])
        .arg(c.state_dir())
        .output()
        .unwrap();
    assert_one_line_error(&out, "tandem up", "already running");
    // The first cluster is unharmed.
    assert!(c.ok(&["sinfo", "-h"]).contains("node-[1-3]"));
}

/// `tandem up` spools the scripts on the memory file system when the machine has one: in a
/// directory of the cluster's own, which `tandem down` removes.
#[test]
fn batch_scripts_run_from_the_local_clusters_spool() {
    let c = Cluster::start(1);
    let id = c.sbatch(&["-o", "spool-%j.txt", "--wrap", "echo \"script=$0\""]);
    c.wait_state(id, "COMPLETED", T);
    let out = c.wait_file(&c.work.join(format!("spool-{id}.txt")), "script=", T);
    let script = std::path::PathBuf::from(out.trim().trim_start_matches("script="));
    let record = c.state_dir().join("workers/spool-root");
    let shm = std::path::Path::new("/dev/shm");
    // Scripts run from it: a `noexec` one (a container's) is not used.
    let usable_shm = std::fs::metadata(shm).is_ok_and(|m| m.is_dir())
        && nix::unistd::access(shm, nix::unistd::AccessFlags::W_OK).is_ok()
        && nix::sys::statvfs::statvfs(shm)
            .is_ok_and(|s| !s.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC));
    let spool = if usable_shm {
        let root = std::fs::read_to_string(&record).unwrap();
        assert!(root.starts_with("/dev/shm/tandem-spool-"), "{root}");
        std::path::PathBuf::from(root).join("node-1")
    } else {
        assert!(!record.exists());
        c.state_dir().join("workers/node-1/spool")
    };
    assert_eq!(script, spool.join(format!("job{id}/slurm_script")));
    // The job's directory went with the job; the spool itself goes with the cluster.
    assert!(!script.parent().unwrap().exists());
    let down = std::process::Command::new(support::TANDEM)
        .args(["down", "--state-dir"])
        .arg(c.state_dir())
        .output()
        .unwrap();
    assert!(down.status.success());
    if usable_shm {
        assert!(!spool.exists(), "{}", spool.display());
    }
    assert!(!record.exists());
}
