//! The tasks' environment: the export mode a step inherits, the step's layout variables
//! over the job's (Slurm 22.05's names and values), each node's own CPU count and node id,
//! and the tasks' file-creation mask.

use std::collections::HashMap;

use tandem_controller::launch::compress_counts;
use tandem_proto::v1::{CreateStepResponse, StepTarget};

use super::Allocation;

/// `SLURM_EXPORT_ENV` of the environment srun runs in, parsed as `--export`.
pub(super) fn inherited_export(
    env: &[(String, String)],
) -> Option<Result<crate::opts::Export, String>> {
    env.iter()
        .rev()
        .find(|(k, _)| k == "SLURM_EXPORT_ENV")
        .map(|(_, v)| crate::opts::parse_export(v))
}

/// The step's layout variables over the inherited environment, as Slurm 22.05 sets them in
/// every task (see `cli/tests/it/compat.rs`): the step's own node and task counts replace the
/// job's `SLURM_NNODES`, `SLURM_NTASKS` and `SLURM_TASKS_PER_NODE`. When srun made the job
/// itself, it also sets the job-wide variables a batch script would have had.
pub(super) fn step_environment(
    env: &mut HashMap<String, String>,
    step: &CreateStepResponse,
    alloc: Allocation,
    ntasks_per_node: Option<u32>,
) {
    let mut targets: Vec<&StepTarget> = step.targets.iter().collect();
    targets.sort_by_key(|t| t.node_index);
    let nnodes = targets.len().to_string();
    let counts: Vec<u32> = targets
        .iter()
        .map(|t| u32::try_from(t.task_ids.len()).unwrap_or(u32::MAX))
        .collect();
    let tasks_per_node = compress_counts(&counts);
    let mut set = |k: &str, v: String| {
        env.insert(k.to_owned(), v);
    };
    set("SLURM_STEP_ID", step.step_id.to_string());
    set("SLURM_STEPID", step.step_id.to_string());
    set("SLURM_STEP_NODELIST", step.nodelist.clone());
    set("SLURM_STEP_NUM_NODES", nnodes.clone());
    set("SLURM_STEP_NUM_TASKS", step.ntasks.to_string());
    set("SLURM_STEP_TASKS_PER_NODE", tasks_per_node.clone());
    set("SLURM_NNODES", nnodes.clone());
    set("SLURM_NTASKS", step.ntasks.to_string());
    set("SLURM_NPROCS", step.ntasks.to_string());
    set("SLURM_TASKS_PER_NODE", tasks_per_node);
    if alloc == Allocation::MadeHere {
        // The job srun made holds exactly the step's nodes.
        set("SLURM_JOB_NODELIST", step.nodelist.clone());
        set("SLURM_NODELIST", step.nodelist.clone());
        set("SLURM_JOB_NUM_NODES", nnodes);
        let cpus: Vec<u32> = targets.iter().map(|t| t.cpus).collect();
        // A controller that does not report CPUs leaves the variable unset, not wrong.
        if !cpus.is_empty() && cpus.iter().all(|c| *c > 0) {
            set("SLURM_JOB_CPUS_PER_NODE", compress_counts(&cpus));
        }
        set("SLURM_NODE_ALIASES", "(null)".to_owned());
    }
    // Slurm's default task distribution, by name: cyclic while each node gets at most one
    // task, block beyond (Slurm 22.05: `srun -n1` cyclic, `srun -n4` on two nodes block).
    let distribution = if step.ntasks as usize <= targets.len() {
        "cyclic"
    } else {
        "block"
    };
    set("SLURM_DISTRIBUTION", distribution.to_owned());
    // A step's tasks also see the job's CPUs under the heterogeneous-job name.
    if let Some(cpus) = env.get("SLURM_JOB_CPUS_PER_NODE").cloned() {
        env.insert("SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0".to_owned(), cpus);
    }
    // Only an honoured `--ntasks-per-node` is set; an ignored one leaves the job's value.
    if let Some(n) =
        ntasks_per_node.filter(|n| u64::from(*n) * targets.len() as u64 == u64::from(step.ntasks))
    {
        env.insert("SLURM_NTASKS_PER_NODE".to_owned(), n.to_string());
    }
}

/// A node's `SLURM_NODEID`: its place among the step's nodes, not the job's (Slurm 22.05 in
/// a `-N2` job: `srun -N1 -w n2` runs with `SLURM_NODEID=0`).
pub(super) fn step_node_id(targets: &[StepTarget], target: &StepTarget) -> u32 {
    let before = targets
        .iter()
        .filter(|t| t.node_index < target.node_index)
        .count();
    u32::try_from(before).unwrap_or(u32::MAX)
}

/// The step environment for one node: `SLURM_CPUS_ON_NODE` is the job's CPUs there, not the
/// batch node's value inherited from the batch script.
pub(super) fn target_env(
    env: &HashMap<String, String>,
    target: &StepTarget,
) -> HashMap<String, String> {
    let mut env = env.clone();
    if target.cpus > 0 {
        env.insert("SLURM_CPUS_ON_NODE".into(), target.cpus.to_string());
    }
    env
}

/// The tasks' file-creation mask and its `SLURM_UMASK` text: as Slurm's srun, the
/// variable's value when this srun inherited a valid one (a step of a step), else this
/// process's mask in four octal digits.
pub(super) struct TaskUmask {
    pub(super) mask: u32,
    pub(super) text: String,
}

pub(super) fn task_umask(env: &[(String, String)], own: u32) -> TaskUmask {
    let inherited = env
        .iter()
        .rev()
        .find(|(k, _)| k == "SLURM_UMASK")
        .and_then(|(_, v)| Some((u32::from_str_radix(v, 8).ok()?, v)))
        .filter(|(m, _)| *m <= 0o777);
    match inherited {
        Some((mask, text)) => TaskUmask {
            mask,
            text: text.clone(),
        },
        None => TaskUmask {
            mask: own,
            text: format!("{own:04o}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_gets_its_own_cpu_count() {
        let env: HashMap<String, String> = [
            ("SLURM_CPUS_ON_NODE".to_owned(), "8".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ]
        .into();
        let target = |cpus| StepTarget {
            node: "n2".into(),
            cpus,
            ..StepTarget::default()
        };
        let got = target_env(&env, &target(3));
        assert_eq!(got["SLURM_CPUS_ON_NODE"], "3", "the job's share on n2");
        assert_eq!(got["PATH"], "/bin");
        // A controller that does not say keeps the inherited value.
        assert_eq!(target_env(&env, &target(0))["SLURM_CPUS_ON_NODE"], "8");
    }

    fn step(targets: &[(u32, &[u32], u32)], nodelist: &str) -> CreateStepResponse {
        CreateStepResponse {
            job_id: 1,
            step_id: 2,
            nodelist: nodelist.into(),
            ntasks: targets.iter().map(|t| t.1.len() as u32).sum(),
            targets: targets
                .iter()
                .map(|(index, ids, cpus)| StepTarget {
                    node: format!("n{}", index + 1),
                    node_index: *index,
                    task_ids: ids.to_vec(),
                    cpus: *cpus,
                    ..StepTarget::default()
                })
                .collect(),
            ..CreateStepResponse::default()
        }
    }

    fn job_env() -> HashMap<String, String> {
        // What a `sbatch -N2 --ntasks-per-node=2` batch script holds.
        [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x2)"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Slurm 22.05 in a `-N2 --ntasks-per-node=2` job: `srun -n1` gives `SLURM_NNODES=1
    /// SLURM_NTASKS=1 SLURM_TASKS_PER_NODE=1 SLURM_STEP_NUM_NODES=1
    /// SLURM_STEP_TASKS_PER_NODE=1 SLURM_STEP_NODELIST=n1`, the job's `SLURM_NODELIST=n[1-2]`
    /// and `SLURM_JOB_CPUS_PER_NODE=2(x2)` kept; `srun -n3`: `2,1` on both nodes.
    #[test]
    fn a_step_inside_a_job_sets_its_own_layout() {
        let mut env = job_env();
        step_environment(
            &mut env,
            &step(&[(0, &[0], 2)], "n1"),
            Allocation::Inherited,
            None,
        );
        for (k, v) in [
            ("SLURM_NNODES", "1"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_NPROCS", "1"),
            ("SLURM_TASKS_PER_NODE", "1"),
            ("SLURM_STEP_NUM_NODES", "1"),
            ("SLURM_STEP_NUM_TASKS", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "1"),
            ("SLURM_STEP_NODELIST", "n1"),
            ("SLURM_STEP_ID", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_CPUS_PER_NODE", "2(x2)"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        let mut env = job_env();
        // Targets out of node order still list the counts in node order.
        let three = step(&[(1, &[2], 2), (0, &[0, 1], 2)], "n[1-2]");
        step_environment(&mut env, &three, Allocation::Inherited, None);
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "2,1");
        assert_eq!(env["SLURM_STEP_TASKS_PER_NODE"], "2,1");
        assert_eq!(env["SLURM_STEP_NUM_NODES"], "2");
        assert_eq!(env["SLURM_NNODES"], "2");
        assert_eq!(env["SLURM_NTASKS"], "3");
    }

    /// Slurm 22.05, `srun -N2 -n3` outside a job: `SLURM_NNODES=2 SLURM_NODELIST=n[1-2]
    /// SLURM_JOB_NODELIST=n[1-2] SLURM_JOB_NUM_NODES=2 SLURM_JOB_CPUS_PER_NODE=2,1
    /// SLURM_TASKS_PER_NODE=2,1 SLURM_STEP_NUM_NODES=2 SLURM_STEP_TASKS_PER_NODE=2,1`, and
    /// `-N2 --ntasks-per-node=2` adds `SLURM_NTASKS_PER_NODE=2`.
    #[test]
    fn a_step_in_its_own_job_sets_the_job_variables_too() {
        let mut env = HashMap::new();
        let s = step(&[(0, &[0, 1], 2), (1, &[2], 1)], "n[1-2]");
        step_environment(&mut env, &s, Allocation::MadeHere, None);
        for (k, v) in [
            ("SLURM_NNODES", "2"),
            ("SLURM_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_NUM_NODES", "2"),
            ("SLURM_JOB_CPUS_PER_NODE", "2,1"),
            ("SLURM_TASKS_PER_NODE", "2,1"),
            ("SLURM_STEP_NUM_NODES", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2,1"),
            ("SLURM_NTASKS", "3"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key("SLURM_NTASKS_PER_NODE"));
        let mut env = HashMap::new();
        let s = step(&[(0, &[0, 1], 2), (1, &[2, 3], 2)], "n[1-2]");
        step_environment(&mut env, &s, Allocation::MadeHere, Some(2));
        assert_eq!(env["SLURM_NTASKS_PER_NODE"], "2");
        assert_eq!(env["SLURM_JOB_CPUS_PER_NODE"], "2(x2)");
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "2(x2)");
    }

    #[test]
    fn node_ids_count_the_steps_nodes_only() {
        let target = |node_index| StepTarget {
            node_index,
            ..StepTarget::default()
        };
        let one = [target(1)];
        assert_eq!(step_node_id(&one, &one[0]), 0, "-N1 -w n2 in a -N2 job");
        let three = [target(4), target(0), target(2)];
        let ids: Vec<u32> = three.iter().map(|t| step_node_id(&three, t)).collect();
        assert_eq!(ids, [2, 0, 1]);
    }
}
