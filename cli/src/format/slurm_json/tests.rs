//! The JSON documents' tests: each object family as Slurm 22.05's scripts read it.

use super::acct::tres_list;
use super::*;
use crate::format::view::{NodeView, PartitionView};
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
