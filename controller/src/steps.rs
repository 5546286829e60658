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

/// Places a step on the job's nodes: `-w` picks nodes by name, `-N` takes the first N,
/// tasks go out in blocks (`-n` spread evenly, or `--ntasks-per-node`), and each node's GPUs
/// go to its tasks (`--gpus-per-task` takes that many per task, else all the job's GPUs on
/// that node). Without `-N`/`-n` a step gets the job's task layout, as srun in a batch
/// script does.
pub fn place(
    alloc: &[AllocNode],
    req: &v1::CreateStepRequest,
    job_ntasks: u32,
    job_tasks_per_node: u32,
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
    let (ntasks, per_node) = match (req.ntasks, req.ntasks_per_node) {
        (0, 0) if req.nodes == 0 && req.nodelist.is_empty() => {
            (job_ntasks.max(n), job_tasks_per_node.max(1))
        }
        (0, 0) => (n, 1),
        (0, tpn) => (tpn.saturating_mul(n), tpn),
        (t, 0) => (t, t.div_ceil(n)),
        (t, tpn) => {
            if u64::from(t) > u64::from(tpn) * u64::from(n) {
                return Err(format!("{t} tasks do not fit {n} nodes at {tpn} per node"));
            }
            (t, tpn)
        }
    };
    if ntasks > 1_000_000 {
        return Err("more than 1000000 tasks".into());
    }
    let mut out = Vec::new();
    let mut next = 0u32;
    for &i in &nodes {
        if next >= ntasks {
            break;
        }
        let here = per_node.min(ntasks - next);
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
    if next < ntasks {
        // Only reachable when ntasks_per_node was derived: spread the rest round robin.
        let mut k = 0;
        while next < ntasks {
            let slot = k % out.len();
            out[slot].task_ids.push(next);
            next += 1;
            k += 1;
        }
    }
    // A step never holds more CPUs on a node than its job does there. Slurm 22.05 refuses
    // such a step outright (`srun -N1` or `-n5` in a `-N2 --ntasks-per-node=2` job), with
    // this exact message.
    let cpt = u64::from(req.cpus_per_task.max(1));
    if out
        .iter()
        .any(|p| p.task_ids.len() as u64 * cpt > u64::from(alloc[p.node].cpus))
    {
        return Err(TOO_MANY_PROCESSORS.into());
    }
    Ok(out)
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
        let p = place(&alloc(), &req(|_| {}), 6, 2).unwrap();
        assert_eq!(
            ids(&p),
            vec![(0, vec![0, 1]), (1, vec![2, 3]), (2, vec![4, 5])]
        );
        assert_eq!(p[0].gpus, vec![0, 1, 2, 3]);
    }

    #[test]
    fn ntasks_spread_in_blocks_and_nodes_truncate() {
        let p = place(&alloc(), &req(|r| r.ntasks = 5), 3, 1).unwrap();
        assert_eq!(
            ids(&p),
            vec![(0, vec![0, 1]), (1, vec![2, 3]), (2, vec![4])]
        );
        let p = place(&alloc(), &req(|r| r.nodes = 2), 3, 1).unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0]), (1, vec![1])]);
        let p = place(&alloc(), &req(|r| r.nodelist = "n3".into()), 3, 1).unwrap();
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
            1,
        )
        .unwrap();
        assert_eq!(p[0].gpus, vec![0, 1, 2, 3]);
        for (r, want) in [
            (req(|r| r.nodes = 4), "allocation has 3"),
            (req(|r| r.nodelist = "n9".into()), "not part"),
            (
                req(|r| {
                    r.ntasks = 10;
                    r.ntasks_per_node = 2;
                }),
                "do not fit",
            ),
            (
                req(|r| {
                    r.nodes = 1;
                    r.ntasks = 3;
                    r.gpus_per_task = 2;
                }),
                "GPUs",
            ),
        ] {
            let e = place(&alloc(), &r, 1, 1).unwrap_err();
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
                place(&job, &r, 4, 2).unwrap_err(),
                TOO_MANY_PROCESSORS,
                "{r:?}"
            );
        }
        let p = place(&job, &req(|r| r.ntasks = 3), 4, 2).unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1]), (1, vec![2])]);
        let p = place(
            &job,
            &req(|r| {
                r.nodes = 1;
                r.ntasks = 2;
            }),
            4,
            2,
        )
        .unwrap();
        assert_eq!(ids(&p), vec![(0, vec![0, 1])]);
    }
}
