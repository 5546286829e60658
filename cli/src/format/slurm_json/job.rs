//! The v0.0.38 job object (`job_response_properties`) that `squeue --json` and `scontrol
//! show job --json` print, from a [`JobView`].

use serde::Serialize;

use super::{array_of, minutes, unset_zero, wait_status};
use crate::format::view::JobView;

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
