//! The step's shape: `-N`, `-n` and `--ntasks-per-node` settled as Slurm 22.05's srun
//! settles them (inside a job, from the job's variables), with its warnings; and the
//! sbatch-only options srun refuses rather than ignores.

use anyhow::bail;

use super::Allocation;
use crate::opts::JobOpts;

/// The step's `-N`, `-n` and `--ntasks-per-node` as Slurm's srun settles them; 0 = not
/// given (the controller's defaults apply).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) nodes: u32,
    pub(super) ntasks: u32,
    /// `--ntasks-per-node` when honoured: srun drops it when `-n` does not match it.
    pub(super) ntasks_per_node: u32,
}

/// Settles the step's layout options as Slurm 22.05's srun does, returning its warnings
/// (printed as `srun: Warning: ...`). Inside an allocation srun takes `SLURM_NNODES`,
/// `SLURM_NTASKS` (or `SLURM_NPROCS`) and `SLURM_NTASKS_PER_NODE` from its environment as
/// `-N`, `-n` and `--ntasks-per-node` when they are not on the command line. Then:
/// fewer tasks than nodes lowers the node count to the task count (`can't run 1 processes
/// on 2 nodes`); `--ntasks-per-node` without a task count gives that many tasks per node,
/// and with one that does not match it is ignored (with a warning only when there are more
/// tasks than nodes). Observed in a `-N2 --ntasks-per-node=2` job: `srun -n3` warns and runs
/// `2,1`; `srun -N1` warns (4 tasks, 1 node) and is refused; `srun -n2` runs `1(x2)`
/// silently; in a `-N2` job `srun -w n1` runs on both nodes.
pub(super) fn resolve_layout(
    opts: &JobOpts,
    env: &[(String, String)],
    alloc: Allocation,
) -> (Layout, Vec<String>) {
    let inherited = |var: &str| {
        if alloc != Allocation::Inherited {
            return None;
        }
        env.iter()
            .find(|(k, _)| k == var)
            .and_then(|(_, v)| v.trim().parse::<u32>().ok())
            .filter(|n| *n > 0)
    };
    let mut nodes = opts
        .nodes
        .map(|n| n.min)
        .or_else(|| inherited("SLURM_NNODES"))
        .unwrap_or(0);
    let mut ntasks = opts
        .ntasks
        .or_else(|| inherited("SLURM_NTASKS"))
        .or_else(|| inherited("SLURM_NPROCS"))
        .unwrap_or(0);
    let mut per_node = opts
        .ntasks_per_node
        .or_else(|| inherited("SLURM_NTASKS_PER_NODE"))
        .unwrap_or(0);
    let mut warnings = Vec::new();
    if ntasks > 0 && nodes > ntasks {
        warnings.push(format!(
            "can't run {ntasks} processes on {nodes} nodes, setting nnodes to {ntasks}"
        ));
        nodes = ntasks;
    }
    if per_node > 0 && nodes > 0 {
        let fit = u64::from(per_node) * u64::from(nodes);
        if ntasks == 0 {
            ntasks = u32::try_from(fit).unwrap_or(u32::MAX);
        } else if u64::from(ntasks) != fit {
            if ntasks > nodes {
                warnings.push(format!(
                    "can't honor --ntasks-per-node set to {per_node} which doesn't match the \
                     requested tasks {ntasks} with the number of requested nodes {nodes}. \
                     Ignoring --ntasks-per-node."
                ));
            }
            per_node = 0;
        }
    }
    (
        Layout {
            nodes,
            ntasks,
            ntasks_per_node: per_node,
        },
        warnings,
    )
}

/// Options srun shares with sbatch through [`JobOpts`] but does not carry out for a step
/// (Slurm's srun gives `-i`, `--signal` and `--open-mode` per-task meanings Tandem's steps do
/// not have yet): refused before any RPC rather than silently ignored.
pub(super) fn refuse_batch_only(opts: &JobOpts) -> anyhow::Result<()> {
    let given = [
        ("--signal", opts.signal.is_some()),
        ("--open-mode", opts.open_mode.is_some()),
        ("--input", opts.input.is_some()),
        ("--test-only", opts.test_only),
    ];
    if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
        bail!("{name} is not supported by srun (it applies to sbatch batch jobs)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::srun::Args;
    use clap::Parser as _;

    #[test]
    fn batch_only_options_are_refused_not_ignored() {
        for flag in ["--signal=USR1@30", "--open-mode=append", "--input=in.txt"] {
            let args = Args::try_parse_from(["srun", flag, "true"]).unwrap();
            let err = refuse_batch_only(&args.opts).unwrap_err().to_string();
            assert!(err.contains("not supported by srun"), "{flag}: {err}");
        }
        let plain = Args::try_parse_from(["srun", "-N2", "true"]).unwrap();
        assert!(refuse_batch_only(&plain.opts).is_ok());
    }

    fn opts(argv: &[&str]) -> JobOpts {
        let mut full = vec!["srun"];
        full.extend_from_slice(argv);
        full.push("true");
        Args::try_parse_from(full).unwrap().opts
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn layout(nodes: u32, ntasks: u32, ntasks_per_node: u32) -> Layout {
        Layout {
            nodes,
            ntasks,
            ntasks_per_node,
        }
    }

    /// Slurm 22.05's srun in a `sbatch -N2 --ntasks-per-node=2` job (its environment:
    /// `SLURM_NNODES=2 SLURM_NTASKS=4 SLURM_NTASKS_PER_NODE=2`): `srun` and `srun -w n1`
    /// run 4 tasks `2(x2)` on both nodes; `srun -n3` warns `can't honor --ntasks-per-node set
    /// to 2 which doesn't match the requested tasks 3 with the number of requested nodes 2.
    /// Ignoring --ntasks-per-node.` and runs `2,1`; `srun -N1` warns the same for 4 tasks on
    /// 1 node (then is refused); `srun -n1` warns `can't run 1 processes on 2 nodes, setting
    /// nnodes to 1`; `srun -n2` runs `1(x2)` without a warning; `srun --ntasks-per-node=1`
    /// warns and runs the job's 4 tasks.
    #[test]
    fn inside_a_job_the_layout_comes_from_the_jobs_variables() {
        let job = env(&[
            ("SLURM_NNODES", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NPROCS", "4"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &job, Allocation::Inherited);
        let ignored = |tpn: u32, n: u32, nodes: u32| {
            format!(
                "can't honor --ntasks-per-node set to {tpn} which doesn't match the requested \
                 tasks {n} with the number of requested nodes {nodes}. Ignoring \
                 --ntasks-per-node."
            )
        };
        assert_eq!(r(&[]), (layout(2, 4, 2), vec![]));
        assert_eq!(r(&["-w", "n1"]), (layout(2, 4, 2), vec![]));
        assert_eq!(r(&["-n3"]), (layout(2, 3, 0), vec![ignored(2, 3, 2)]));
        assert_eq!(r(&["-N1"]), (layout(1, 4, 0), vec![ignored(2, 4, 1)]));
        assert_eq!(
            r(&["-n1"]),
            (
                layout(1, 1, 0),
                vec!["can't run 1 processes on 2 nodes, setting nnodes to 1".to_owned()]
            )
        );
        assert_eq!(r(&["-n2"]), (layout(2, 2, 0), vec![]));
        assert_eq!(
            r(&["--ntasks-per-node=1"]),
            (layout(2, 4, 0), vec![ignored(1, 4, 2)])
        );
    }

    /// Slurm 22.05 in a plain `sbatch -N2 -c4` job (`SLURM_NNODES=2`, no task count):
    /// `srun --ntasks-per-node=2` runs 4 tasks `2(x2)` and sets `SLURM_NTASKS_PER_NODE=2`;
    /// `srun -N1 --ntasks-per-node=2` runs 2 on the first node; `srun -w n2` runs on both
    /// nodes, one task each; `srun -N1 -w n2` one task on n2.
    #[test]
    fn ntasks_per_node_without_a_task_count_multiplies_the_nodes() {
        let job = env(&[("SLURM_NNODES", "2")]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &job, Allocation::Inherited).0;
        assert_eq!(r(&["--ntasks-per-node=2"]), layout(2, 4, 2));
        assert_eq!(r(&["--ntasks-per-node=3"]), layout(2, 6, 3));
        assert_eq!(r(&["-N1", "--ntasks-per-node=2"]), layout(1, 2, 2));
        assert_eq!(r(&["-w", "n2"]), layout(2, 0, 0));
        assert_eq!(r(&["-N1", "-w", "n2"]), layout(1, 0, 0));
        assert_eq!(r(&["-n3"]), layout(2, 3, 0));
    }

    /// Outside a job nothing is inherited: `srun -N2 -n3` stays `-N2 -n3`, `srun -N2 -n3
    /// --ntasks-per-node=2` drops `--ntasks-per-node` (Slurm warns and allocates 3 CPUs).
    #[test]
    fn outside_a_job_only_the_command_line_counts() {
        let stale = env(&[("SLURM_NNODES", "5"), ("SLURM_NTASKS", "9")]);
        let r = |argv: &[&str]| resolve_layout(&opts(argv), &stale, Allocation::MadeHere).0;
        assert_eq!(r(&["-N2", "-n3"]), layout(2, 3, 0));
        assert_eq!(r(&["-N2", "-n3", "--ntasks-per-node=2"]), layout(2, 3, 0));
        assert_eq!(r(&["-N2", "--ntasks-per-node=2"]), layout(2, 4, 2));
        assert_eq!(r(&["-n4", "--ntasks-per-node=2"]), layout(0, 4, 2));
        assert_eq!(r(&[]), layout(0, 0, 0));
    }
}
