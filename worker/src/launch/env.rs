//! The environment a batch script or a step task starts with.
//!
//! The controller builds the job-wide variables (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`, ...)
//! and the user's exported environment; the worker adds only what is true of this node and
//! this process. Node-local variables override what the job brought along (a submit host's
//! `SLURMD_NODENAME` is wrong here), except the few that are only defaults (`TMPDIR`, and
//! `SLURM_CPUS_ON_NODE` when the controller already sized it for the job).

use std::collections::{BTreeMap, HashMap};

/// What this node knows about itself.
#[derive(Debug, Clone)]
pub struct NodeLocal<'a> {
    pub node_name: &'a str,
    /// CPUs of the node, used for `SLURM_CPUS_ON_NODE` when the controller did not set it.
    pub cpus: u32,
}

/// Where one step task sits in its step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskPlace {
    pub job_id: u64,
    pub step_id: u32,
    /// Global rank (`SLURM_PROCID`).
    pub proc_id: u32,
    /// Rank among the step's tasks on this node (`SLURM_LOCALID`).
    pub local_id: u32,
    /// Index of this node in the step (`SLURM_NODEID`).
    pub node_id: u32,
    /// Tasks of the whole step (`SLURM_STEP_NUM_TASKS`); 0 when unknown.
    pub ntasks: u32,
}

/// Default scratch directory when the job brought none.
const DEFAULT_TMPDIR: &str = "/tmp";

/// Environment of a batch script: it runs as task 0 on the first node of the allocation.
pub fn batch_env(
    job_env: &HashMap<String, String>,
    node: &NodeLocal<'_>,
    gpus: &[u32],
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = job_env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    set_node_vars(&mut env, node, gpus);
    env.insert("SLURM_NODEID".into(), "0".into());
    env.insert("SLURM_PROCID".into(), "0".into());
    env.insert("SLURM_LOCALID".into(), "0".into());
    env.insert("SLURM_GTIDS".into(), "0".into());
    env.insert("ENVIRONMENT".into(), "BATCH".into());
    // Slurm's batch scripts see the node's name as HOSTNAME (their steps inherit it).
    env.insert("HOSTNAME".into(), node.node_name.to_owned());
    env
}

/// Environment of one step task (`srun`). `node_tasks` are the global ranks of the step's
/// tasks on this node (`SLURM_GTIDS`).
pub fn task_env(
    step_env: &HashMap<String, String>,
    node: &NodeLocal<'_>,
    gpus: &[u32],
    place: TaskPlace,
    node_tasks: &[u32],
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = step_env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // A task launched from inside a batch script inherits ENVIRONMENT=BATCH; Slurm drops it.
    env.remove("ENVIRONMENT");
    set_node_vars(&mut env, node, gpus);
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("SLURM_JOB_ID", place.job_id.to_string());
    set("SLURM_JOBID", place.job_id.to_string());
    set("SLURM_STEP_ID", place.step_id.to_string());
    set("SLURM_STEPID", place.step_id.to_string());
    set("SLURM_PROCID", place.proc_id.to_string());
    set("SLURM_LOCALID", place.local_id.to_string());
    set("SLURM_NODEID", place.node_id.to_string());
    set("SLURM_GTIDS", join(node_tasks));
    if place.ntasks > 0 {
        set("SLURM_STEP_NUM_TASKS", place.ntasks.to_string());
    }
    if !gpus.is_empty() {
        set("SLURM_STEP_GPUS", join(gpus));
    }
    env
}

fn set_node_vars(env: &mut BTreeMap<String, String>, node: &NodeLocal<'_>, gpus: &[u32]) {
    env.insert("SLURMD_NODENAME".into(), node.node_name.to_owned());
    env.insert("SLURM_TOPOLOGY_ADDR".into(), node.node_name.to_owned());
    env.insert("SLURM_TOPOLOGY_ADDR_PATTERN".into(), "node".into());
    env.entry("SLURM_CPUS_ON_NODE".into())
        .or_insert_with(|| node.cpus.to_string());
    env.entry("TMPDIR".into())
        .or_insert_with(|| DEFAULT_TMPDIR.to_owned());
    if gpus.is_empty() {
        // As Slurm 22.05: a job holding no GPU on this node gets no device list at all, not
        // the submit host's (which would name devices the job does not hold) and not an
        // empty one. The devices cgroup is what keeps it off the node's GPUs.
        for k in DEVICE_LISTS
            .iter()
            .chain(&["SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"])
        {
            env.remove(*k);
        }
    } else {
        let list = join(gpus);
        env.insert("SLURM_GPUS_ON_NODE".into(), gpus.len().to_string());
        // Indices are NVML's, in PCI bus order; CUDA numbers fastest-first unless told
        // otherwise, which would hand a job another job's device on a mixed node.
        env.entry("CUDA_DEVICE_ORDER".into())
            .or_insert_with(|| "PCI_BUS_ID".to_owned());
        for k in DEVICE_LISTS {
            env.insert(k.into(), list.clone());
        }
        env.insert("SLURM_JOB_GPUS".into(), list);
    }
}

/// The device lists Slurm's GPU plugin sets for CUDA, OpenCL and ROCm (all three, as with
/// no `Flags=` in gres.conf).
const DEVICE_LISTS: [&str; 3] = [
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ROCR_VISIBLE_DEVICES",
];

fn join(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeLocal<'static> {
        NodeLocal {
            node_name: "gpu-02",
            cpus: 64,
        }
    }

    fn job_env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn batch_script_is_task_zero_on_node_zero_with_its_gpus() {
        let env = batch_env(
            &job_env(&[("SLURM_JOB_ID", "7"), ("PATH", "/usr/bin")]),
            &node(),
            &[2, 3],
        );
        let want = [
            ("SLURM_JOB_ID", "7"),
            ("PATH", "/usr/bin"),
            ("SLURMD_NODENAME", "gpu-02"),
            ("SLURM_NODEID", "0"),
            ("SLURM_PROCID", "0"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_GPUS_ON_NODE", "2"),
            ("CUDA_VISIBLE_DEVICES", "2,3"),
            ("GPU_DEVICE_ORDINAL", "2,3"),
            ("ROCR_VISIBLE_DEVICES", "2,3"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("SLURM_GTIDS", "0"),
            ("SLURM_JOB_GPUS", "2,3"),
            ("SLURM_CPUS_ON_NODE", "64"),
            ("SLURM_TOPOLOGY_ADDR", "gpu-02"),
            ("TMPDIR", "/tmp"),
            ("ENVIRONMENT", "BATCH"),
        ];
        for (k, v) in want {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
    }

    #[test]
    fn node_facts_override_submit_host_values_but_defaults_do_not() {
        let env = batch_env(
            &job_env(&[
                ("SLURMD_NODENAME", "login-1"),
                ("SLURM_CPUS_ON_NODE", "8"),
                ("TMPDIR", "/scratch/alice"),
                ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
                ("ROCR_VISIBLE_DEVICES", "0,1,2,3"),
                ("SLURM_GPUS_ON_NODE", "4"),
                ("SLURM_JOB_GPUS", "0,1,2,3"),
            ]),
            &node(),
            &[],
        );
        assert_eq!(env["SLURMD_NODENAME"], "gpu-02");
        assert_eq!(env["SLURM_CPUS_ON_NODE"], "8", "controller's job size wins");
        assert_eq!(env["TMPDIR"], "/scratch/alice");
        // No GPU held: no device list and no GPU count, as Slurm 22.05 (not the submit
        // host's, which name devices this job does not hold).
        for k in [
            "SLURM_GPUS_ON_NODE",
            "SLURM_JOB_GPUS",
            "CUDA_VISIBLE_DEVICES",
            "ROCR_VISIBLE_DEVICES",
            "CUDA_DEVICE_ORDER",
        ] {
            assert!(!env.contains_key(k), "{k}");
        }
    }

    #[test]
    fn no_cuda_variable_is_invented_without_gpus() {
        let env = batch_env(&job_env(&[]), &node(), &[]);
        assert!(!env.contains_key("CUDA_VISIBLE_DEVICES"));
    }

    #[test]
    fn step_task_gets_its_rank_and_the_step_gpus() {
        let place = TaskPlace {
            job_id: 9,
            step_id: 1,
            proc_id: 5,
            local_id: 1,
            node_id: 2,
            ntasks: 8,
        };
        let env = task_env(
            &job_env(&[("SLURM_PROCID", "0"), ("ENVIRONMENT", "BATCH")]),
            &node(),
            &[4],
            place,
            &[4, 5],
        );
        let want = [
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_STEPID", "1"),
            ("SLURM_JOB_ID", "9"),
            ("SLURM_STEP_NUM_TASKS", "8"),
            ("CUDA_VISIBLE_DEVICES", "4"),
            ("SLURM_STEP_GPUS", "4"),
            ("SLURM_GTIDS", "4,5"),
        ];
        for (k, v) in want {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key("ENVIRONMENT"));
    }
}
