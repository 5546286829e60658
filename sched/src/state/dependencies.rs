//! Dependency targets as `dependency::Dependency::evaluate` sees them.

use crate::dependency::{DepStatus, DepTarget, TargetStatus};
use crate::job::{Job, JobState};

use super::State;

impl State {
    /// Describes a dependency target for [`crate::dependency::Dependency::evaluate`].
    pub(crate) fn target_status(&self, t: DepTarget) -> Option<TargetStatus> {
        let job = self.jobs.get(&t.job)?;
        if let Some(task) = t.task {
            let a = job.array.as_ref()?;
            if a.pending.contains(task) {
                return Some(TargetStatus {
                    all_started: false,
                    started_at: None,
                    all_finished: false,
                    any_not_ok: false,
                });
            }
            let id = a.task_job(task)?;
            return self.jobs.get(&id).map(single_status);
        }
        match &job.array {
            None => Some(single_status(job)),
            Some(a) => Some(TargetStatus {
                all_started: a.pending.is_empty(),
                started_at: a.last_start,
                all_finished: a.is_done(),
                any_not_ok: a.not_ok > 0,
            }),
        }
    }

    /// Evaluates a job's dependency. `singleton_clear` comes from the pass's index.
    pub(crate) fn dependency_status(
        &self,
        job: &Job,
        singleton_clear: bool,
        now: i64,
    ) -> DepStatus {
        match &job.spec.dependency {
            None => DepStatus::Satisfied,
            // An array meta is judged for the index it would start next (aftercorr).
            Some(d) => {
                let my_task = job
                    .array_task_id
                    .or_else(|| job.array.as_ref().and_then(|a| a.pending.first()));
                d.evaluate(|t| self.target_status(t), my_task, singleton_clear, now)
            }
        }
    }
}

fn single_status(j: &Job) -> TargetStatus {
    let finished = j.state.is_terminal();
    TargetStatus {
        all_started: j.start_time.is_some() || finished,
        started_at: j.start_time,
        all_finished: finished,
        any_not_ok: finished && j.state != JobState::Completed,
    }
}
