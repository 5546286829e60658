//! Job steps (`srun` inside an allocation): where a step's tasks go, and the record `sacct`
//! shows for it (`JOBID.0`, ...). Placement is pure.

use serde::{Deserialize, Serialize};
use tandem_proto::v1;

/// A step as recorded (persisted in `steps` while its job runs, then folded into the job's
/// accounting record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRec {
    pub step_id: u32,
    pub name: String,
    pub nodelist: String,
    pub ntasks: u32,
    pub start_time: i64,
    pub end_time: Option<i64>,
    pub exit_code: i32,
    pub signal: i32,
    pub cpus: u32,
    pub gpus: u32,
}

impl StepRec {
    pub fn info(&self, job_state: v1::JobState) -> v1::StepInfo {
        let state = match self.end_time {
            None if job_state == v1::JobState::Running => v1::JobState::Running,
            // A step still open when its job ended went down with it.
            None => job_state,
            Some(_) if self.signal != 0 => v1::JobState::Cancelled,
            Some(_) if self.exit_code != 0 => v1::JobState::Failed,
            Some(_) => v1::JobState::Completed,
        };
        v1::StepInfo {
            step_id: self.step_id.to_string(),
            name: self.name.clone(),
            state: state as i32,
            nodelist: self.nodelist.clone(),
            ntasks: self.ntasks,
            start_time: self.start_time,
            end_time: self.end_time.unwrap_or(0),
            exit_code: self.exit_code,
            signal: self.signal,
            tres: Some(v1::Tres {
                cpus: self.cpus,
                gpus: self.gpus,
                ..Default::default()
            }),
            // srun steps are not measured yet: sacct leaves their usage blank.
            usage: None,
        }
    }
}

/// One node of a job's allocation, as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocNode {
    pub name: String,
    pub cpus: u32,
    pub gpus: Vec<u32>,
}

/// Where a step's tasks run on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Index into the allocation's nodes.
    pub node: usize,
    pub task_ids: Vec<u32>,
    pub gpus: Vec<u32>,
}

/// Slurm's refusal of a step that needs more CPUs than its job holds on a node.
pub const TOO_MANY_PROCESSORS: &str = "More processors requested than permitted";

/// Places a step on the job's nodes: `-w` picks nodes by name (widened with the job's other
/// nodes, in order, up to `-N`, as Slurm's srun does with the `SLURM_NNODES` it inherits),
/// `-N` takes the first N, and each node's GPUs go to its tasks (`--gpus-per-task` takes
/// that many per task, else all the job's GPUs on that node). Task counts follow Slurm's
/// block layout ([`block_counts`]); `--ntasks-per-node` decides the task count only when
/// `-n` is not given or matches it (srun ignores it otherwise). Without `-N`/`-n` a step
/// gets the job's task count, as srun in a batch script does.
pub fn place(
    alloc: &[AllocNode],
    req: &v1::CreateStepRequest,
    job_ntasks: u32,
) -> Result<Vec<Placed>, String> {
    let mut nodes: Vec<usize> = (0..alloc.len()).collect();
    if !req.nodelist.trim().is_empty() {
        let names = tandem_sched::hostlist::expand(&req.nodelist).map_err(|e| e.to_string())?;
        let mut picked = Vec::new();
        for n in &names {
            let i = alloc
                .iter()
                .position(|a| &a.name == n)
                .ok_or_else(|| format!("node {n} is not part of the job's allocation"))?;
            picked.push(i);
        }
        picked.sort_unstable();
        picked.dedup();
        // Slurm 22.05 in a `-N2` job: `srun -w n2` runs on `n[1-2]`, task 0 on n1; the
        // named nodes are a minimum, the rest come from the allocation in its order.
        let want = req.nodes as usize;
        if want > picked.len() {
            let more: Vec<usize> = (0..alloc.len())
                .filter(|i| !picked.contains(i))
                .take(want - picked.len())
                .collect();
            picked.extend(more);
            picked.sort_unstable();
        }
        nodes = picked;
    }
    if req.nodes > 0 {
        let want = req.nodes as usize;
        if want > nodes.len() {
            return Err(format!(
                "step asks for {want} nodes but the allocation has {}",
                nodes.len()
            ));
        }
        nodes.truncate(want);
    }
    let n = u32::try_from(nodes.len()).map_err(|_| "too many nodes".to_owned())?;
    if n == 0 {
        return Err("allocation has no nodes".into());
    }
    let ntasks = match (req.ntasks, req.ntasks_per_node) {
        (0, 0) if req.nodes == 0 && req.nodelist.is_empty() => job_ntasks.max(n),
        (0, 0) => n,
        (0, tpn) => tpn.saturating_mul(n),
        (t, _) => t,
    };
    if ntasks > 1_000_000 {
        return Err("more than 1000000 tasks".into());
    }
    let cpt = req.cpus_per_task.max(1);
    let caps: Vec<u32> = nodes.iter().map(|&i| alloc[i].cpus / cpt).collect();
    let counts = block_counts(ntasks, &caps);
    let mut out = Vec::new();
    let mut next = 0u32;
    for (&i, &here) in nodes.iter().zip(&counts) {
        if here == 0 {
            continue;
        }
        let task_ids: Vec<u32> = (next..next + here).collect();
        next += here;
        let node_gpus = &alloc[i].gpus;
        let gpus = if req.gpus_per_task > 0 {
            let want = (req.gpus_per_task as usize).saturating_mul(task_ids.len());
            if want > node_gpus.len() {
                return Err(format!(
                    "{} tasks x {} GPUs do not fit the {} GPUs the job holds on {}",
                    task_ids.len(),
                    req.gpus_per_task,
                    node_gpus.len(),
                    alloc[i].name
                ));
            }
            node_gpus[..want].to_vec()
        } else {
            node_gpus.clone()
        };
        out.push(Placed {
            node: i,
            task_ids,
            gpus,
        });
    }
    // A step never holds more CPUs on a node than its job does there. Slurm 22.05 refuses
    // such a step outright (`srun -N1` or `-n5` in a `-N2 --ntasks-per-node=2` job), with
    // this exact message.
    let cpt = u64::from(cpt);
    if out
        .iter()
        .any(|p| p.task_ids.len() as u64 * cpt > u64::from(alloc[p.node].cpus))
    {
        return Err(TOO_MANY_PROCESSORS.into());
    }
    Ok(out)
}

/// Tasks per node of a step, as Slurm 22.05's block layout counts them
/// (`_task_layout_block`): one task per node per round, each node up to `caps` (the tasks
/// its CPUs hold), the last round's extras on the first nodes; once no node has room left,
/// rounds go on past the caps (the step is then refused for its CPUs). Slurm in a `-N3 -c8`
/// job: `srun -n7` runs `3,2(x2)`; in a `4,1`-CPU job `srun -n5` runs `4,1`.
pub fn block_counts(ntasks: u32, caps: &[u32]) -> Vec<u32> {
    let mut counts = vec![0u32; caps.len()];
    if caps.is_empty() {
        return counts;
    }
    let mut placed = 0u32;
    let mut over = false;
    let mut round = 0u32;
    while placed < ntasks {
        let mut room_left = false;
        for (count, &cap) in counts.iter_mut().zip(caps) {
            if placed == ntasks {
                break;
            }
            if round < cap || over {
                *count += 1;
                placed += 1;
                if round + 1 < cap {
                    room_left = true;
                }
            }
        }
        if !room_left {
            over = true;
        }
        round += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> Vec<AllocNode> {
        (1..=3)
            .map(|i| AllocNode {
                name: format!("n{i}"),
                cpus: 8,
                gpus: vec![0, 1, 2, 3],
            })
            .collect()
    }

    fn req(f: impl FnOnce(&mut v1::CreateStepRequest)) -> v1::CreateStepRequest {
        let mut r = v1::CreateStepRequest {
            job_id: 1,
            ..Default::default()
        };
        f(&mut r);
        r
    }

    fn ids(p: &[Placed]) -> Vec<(usize, Vec<u32>)> {
        p.iter().map(|x| (x.node, x.task_ids.clone())).collect()
    }

    #[test]
    fn default_step_takes_the_job_layout() {
        let p = place(&alloc(), &req(|_| {}), 6).unwrap();
        assert_eq!(
            ids(&p),
            vec![(0, vec![0, 1]), (1, vec![2, 3]), (2, vec![4, 5])]
        );
        assert_eq!(p[0].gpus, vec![0, 1, 2, 3]);
    }

    #[test]
    fn ntasks_spread_in_blocks_and_nodes_truncate() {
        let p = place(&alloc(), &req(|r| r.ntasks = 5), 3).unwrap();
        assert_eq!(
            ids(&p),
            vec![(0, vec![0, 1]), (1, vec![2, 3]), (2, vec![4])]
        );
        let p = place(&alloc(), &req(|r| r.nodes = 2), 3).unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0]), (1, vec![1])]);
        let p = place(&alloc(), &req(|r| r.nodelist = "n3".into()), 3).unwrap();
        assert_eq!(ids(&p), vec![(2, vec![0])]);
    }

    #[test]
    fn gpus_per_task_and_bad_requests() {
        let p = place(
            &alloc(),
            &req(|r| {
                r.nodes = 1;
                r.ntasks = 2;
                r.gpus_per_task = 2;
            }),
            1,
        )
        .unwrap();
        assert_eq!(p[0].gpus, vec![0, 1, 2, 3]);
        for (r, want) in [
            (req(|r| r.nodes = 4), "allocation has 3"),
            (req(|r| r.nodelist = "n9".into()), "not part"),
            (
                req(|r| {
                    r.nodes = 1;
                    r.ntasks = 3;
                    r.gpus_per_task = 2;
                }),
                "GPUs",
            ),
        ] {
            let e = place(&alloc(), &r, 1).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }

    /// Slurm 22.05, in a `-N2 --ntasks-per-node=2` job (2 CPUs on each node): `srun -N1`
    /// (4 tasks from SLURM_NTASKS), `srun -n5` and `srun -N1 -n3` all end with `srun: error:
    /// Unable to create step for job N: More processors requested than permitted`, exit 1;
    /// `srun -n3` runs as `2,1` and `srun -N1 -n2` as `2`.
    #[test]
    fn a_step_needing_more_cpus_than_the_job_holds_is_refused() {
        let job: Vec<AllocNode> = alloc()
            .into_iter()
            .take(2)
            .map(|n| AllocNode { cpus: 2, ..n })
            .collect();
        for r in [
            req(|r| {
                r.nodes = 1;
                r.ntasks = 4;
            }),
            req(|r| r.ntasks = 5),
            req(|r| {
                r.nodes = 1;
                r.ntasks = 3;
            }),
            req(|r| {
                r.ntasks = 2;
                r.cpus_per_task = 3;
            }),
        ] {
            assert_eq!(
                place(&job, &r, 4).unwrap_err(),
                TOO_MANY_PROCESSORS,
                "{r:?}"
            );
        }
        let p = place(&job, &req(|r| r.ntasks = 3), 4).unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1]), (1, vec![2])]);
        let p = place(
            &job,
            &req(|r| {
                r.nodes = 1;
                r.ntasks = 2;
            }),
            4,
        )
        .unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1])]);
    }

    fn job(cpus: &[u32]) -> Vec<AllocNode> {
        cpus.iter()
            .enumerate()
            .map(|(i, &cpus)| AllocNode {
                name: format!("n{}", i + 1),
                cpus,
                gpus: Vec::new(),
            })
            .collect()
    }

    fn counts(p: &[Placed]) -> Vec<(usize, usize)> {
        p.iter().map(|x| (x.node, x.task_ids.len())).collect()
    }

    /// Slurm 22.05's `SLURM_STEP_TASKS_PER_NODE`: in a `-N3 -c8` job `srun -n5` gives
    /// `2(x2),1` and `srun -n7` `3,2(x2)`; in a `-N2 -n5` job (CPUs `4,1`) `srun -n5` gives
    /// `4,1` and `srun -n3` `2,1`; in a `-N3 -n5` job (`3,1(x2)`) `srun -n5` gives `3,1(x2)`;
    /// in a `--exclusive -N2` job `srun -n6` gives `3(x2)`.
    #[test]
    fn block_counts_follow_slurms_step_layout() {
        assert_eq!(block_counts(5, &[8, 8, 8]), [2, 2, 1]);
        assert_eq!(block_counts(7, &[8, 8, 8]), [3, 2, 2]);
        assert_eq!(block_counts(5, &[4, 1]), [4, 1]);
        assert_eq!(block_counts(3, &[4, 1]), [2, 1]);
        assert_eq!(block_counts(5, &[3, 1, 1]), [3, 1, 1]);
        assert_eq!(block_counts(6, &[64, 64]), [3, 3]);
        assert_eq!(block_counts(1, &[2, 2]), [1, 0]);
        // Past every node's room the rounds go on (and the step is refused for its CPUs).
        assert_eq!(block_counts(5, &[2, 2]), [3, 2]);
        assert_eq!(block_counts(2, &[0, 0]), [1, 1]);
        assert_eq!(block_counts(3, &[]), Vec::<u32>::new());
    }

    /// Slurm 22.05 in a `-N2` job: `srun -w n1` and `srun -w n2` (`SLURM_NNODES=2` taken as
    /// `-N2`) both run on `n[1-2]`, task 0 on n1; `srun -N1 -w n2` on n2 alone.
    #[test]
    fn a_named_node_is_widened_to_the_step_node_count() {
        let two = job(&[4, 4]);
        for name in ["n1", "n2"] {
            let p = place(
                &two,
                &req(|r| {
                    r.nodes = 2;
                    r.ntasks = 2;
                    r.nodelist = name.into();
                }),
                2,
            )
            .unwrap();
            assert_eq!(ids(&p), vec![(0, vec![0]), (1, vec![1])], "-w {name}");
        }
        let p = place(
            &two,
            &req(|r| {
                r.nodes = 1;
                r.ntasks = 1;
                r.nodelist = "n2".into();
            }),
            2,
        )
        .unwrap();
        assert_eq!(ids(&p), vec![(1, vec![0])]);
        // Three nodes, `-N2 -w n3`: n3 and the first other node, in allocation order.
        let p = place(
            &job(&[4, 4, 4]),
            &req(|r| {
                r.nodes = 2;
                r.nodelist = "n3".into();
            }),
            3,
        )
        .unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0]), (2, vec![1])]);
    }

    /// Slurm 22.05, `srun --ntasks-per-node=K` in a job that set no task count: K tasks on
    /// every node (`-N2 -c4`: `--ntasks-per-node=3` runs `3(x2)`, tasks 0-2 on the first
    /// node), `-N1 --ntasks-per-node=2` runs 2 on the first node; in a `-N2` job (1 CPU a
    /// node) `--ntasks-per-node=2` is refused for its CPUs. With a `-n` that does not match,
    /// `-n` decides (`-n3 --ntasks-per-node=2`: `2,1`).
    #[test]
    fn ntasks_per_node_gives_every_node_that_many_tasks() {
        let four = job(&[4, 4]);
        let p = place(&four, &req(|r| r.ntasks_per_node = 3), 2).unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1, 2]), (1, vec![3, 4, 5])]);
        let p = place(
            &four,
            &req(|r| {
                r.nodes = 1;
                r.ntasks_per_node = 2;
            }),
            2,
        )
        .unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1])]);
        let p = place(
            &four,
            &req(|r| {
                r.ntasks = 3;
                r.ntasks_per_node = 2;
            }),
            2,
        )
        .unwrap();
        assert_eq!(counts(&p), vec![(0, 2), (1, 1)]);
        assert_eq!(
            place(&job(&[1, 1]), &req(|r| r.ntasks_per_node = 2), 2).unwrap_err(),
            TOO_MANY_PROCESSORS
        );
    }
}
