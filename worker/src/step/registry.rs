//! The process groups of running step tasks, so that `SignalTasks`, a cancelled job and a
//! vanished `srun` can reach them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Key of one step on this node.
pub type StepKey = (u64, u32);

#[derive(Debug, Clone, Copy)]
struct TaskGroup {
    task_id: u32,
    pgid: i32,
}

#[derive(Debug, Default)]
struct StepEntry {
    /// Owner of the tasks: `SignalTasks` from a user must come from this uid.
    uid: u32,
    groups: Vec<TaskGroup>,
}

/// Shared by the step service and the batch supervisors. A std mutex: it is never held
/// across an await, and every operation is a few map lookups.
#[derive(Debug, Default)]
pub struct StepRegistry {
    steps: Mutex<HashMap<StepKey, StepEntry>>,
}

impl StepRegistry {
    pub fn add_task(&self, key: StepKey, uid: u32, task_id: u32, pgid: i32) {
        let mut steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = steps.entry(key).or_default();
        entry.uid = uid;
        entry.groups.push(TaskGroup { task_id, pgid });
    }

    /// Forgets a task that has been reaped, so its pid is never signalled again.
    pub fn remove_task(&self, key: StepKey, task_id: u32) {
        let mut steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = steps.get_mut(&key) {
            entry.groups.retain(|g| g.task_id != task_id);
            if entry.groups.is_empty() {
                steps.remove(&key);
            }
        }
    }

    /// The uid owning a step's tasks on this node, if any run here.
    pub fn owner(&self, key: StepKey) -> Option<u32> {
        let steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        steps.get(&key).map(|e| e.uid)
    }

    /// Signals every task group of one step; returns how many groups were signalled.
    pub fn signal_step(&self, key: StepKey, signal: Signal) -> usize {
        let groups: Vec<i32> = {
            let steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
            steps
                .get(&key)
                .map(|e| e.groups.iter().map(|g| g.pgid).collect())
                .unwrap_or_default()
        };
        signal_groups(&groups, signal)
    }

    /// Whether a step task of the job runs here, not yet reaped.
    pub fn has_job(&self, job_id: u64) -> bool {
        let steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
        steps.keys().any(|(job, _)| *job == job_id)
    }

    /// Signals every step task of a job (the job was cancelled or ended on this node).
    pub fn signal_job(&self, job_id: u64, signal: Signal) -> usize {
        let groups: Vec<i32> = {
            let steps = self.steps.lock().unwrap_or_else(PoisonError::into_inner);
            steps
                .iter()
                .filter(|((job, _), _)| *job == job_id)
                .flat_map(|(_, e)| e.groups.iter().map(|g| g.pgid))
                .collect()
        };
        signal_groups(&groups, signal)
    }
}

fn signal_groups(groups: &[i32], signal: Signal) -> usize {
    groups
        .iter()
        .filter(|pgid| killpg(Pid::from_raw(**pgid), signal).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_tracked_per_step_until_reaped() {
        let r = StepRegistry::default();
        r.add_task((1, 0), 1000, 0, i32::MAX - 1);
        r.add_task((1, 0), 1000, 1, i32::MAX - 2);
        assert_eq!(r.owner((1, 0)), Some(1000));
        assert_eq!(r.owner((1, 1)), None);
        r.remove_task((1, 0), 0);
        assert_eq!(r.owner((1, 0)), Some(1000));
        r.remove_task((1, 0), 1);
        assert_eq!(r.owner((1, 0)), None, "empty steps are dropped");
    }
}
