//! The steps of running jobs (srun's), as the actor keeps them until a job's end folds them
//! into its accounting record. A struct of its own so that the rules on step ids and step
//! ends hold in one place, tested without a controller:
//!
//! - A job's step ids are unique: a new step gets one past the highest the job has had (0
//!   for its first), also after a restart recovered its steps from the store.
//! - srun's report of a step's end (its worst task) is final; a worker's per-node report
//!   only fills in an end srun never reported.
//! - Dropping a job's steps says whether it had any, so the store deletes rows only then.

use std::collections::HashMap;

use tandem_sched::JobId;

use crate::steps::StepRec;

/// Steps by job.
#[derive(Debug, Default)]
pub struct StepTable {
    by_job: HashMap<JobId, Vec<StepRec>>,
}

/// Who reports a step's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    /// srun (or a user on its behalf): final.
    Srun,
    /// A worker, for its node: only when srun has not reported.
    Worker,
}

/// No step with that id in that job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoSuchStep;

impl StepTable {
    /// The table as recovered from the store.
    pub fn new(by_job: HashMap<JobId, Vec<StepRec>>) -> Self {
        StepTable { by_job }
    }

    /// The steps of `job`, oldest first.
    pub fn of(&self, job: JobId) -> Option<&[StepRec]> {
        self.by_job.get(&job).map(Vec::as_slice)
    }

    /// The id the next step of `job` gets.
    pub fn next_id(&self, job: JobId) -> u32 {
        self.by_job
            .get(&job)
            .and_then(|l| l.iter().map(|s| s.step_id + 1).max())
            .unwrap_or(0)
    }

    /// Records a new step of `job`; its id is [`StepTable::next_id`]'s, taken just before.
    pub fn add(&mut self, job: JobId, rec: StepRec) {
        debug_assert_eq!(
            rec.step_id,
            self.next_id(job),
            "step ids are handed out in order"
        );
        self.by_job.entry(job).or_default().push(rec);
    }

    /// Records a step's end at `now`. `Ok(Some)`: the record changed (to be written);
    /// `Ok(None)`: a worker's report after srun's, ignored.
    pub fn end(
        &mut self,
        job: JobId,
        step: u32,
        exit_code: i32,
        signal: i32,
        by: Reporter,
        now: i64,
    ) -> Result<Option<&StepRec>, NoSuchStep> {
        let rec = self
            .by_job
            .get_mut(&job)
            .and_then(|l| l.iter_mut().find(|s| s.step_id == step))
            .ok_or(NoSuchStep)?;
        if rec.end_time.is_some() && by == Reporter::Worker {
            return Ok(None);
        }
        rec.end_time = Some(now);
        rec.exit_code = exit_code;
        rec.signal = signal;
        Ok(Some(rec))
    }

    /// Forgets the steps of `job` (it ended, was requeued or purged); whether it had any.
    pub fn remove(&mut self, job: JobId) -> bool {
        self.by_job.remove(&job).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step_id: u32) -> StepRec {
        StepRec {
            step_id,
            name: "hostname".into(),
            nodelist: "n1".into(),
            ntasks: 1,
            start_time: 10,
            end_time: None,
            exit_code: 0,
            signal: 0,
            cpus: 1,
            gpus: 0,
        }
    }

    fn open(t: &mut StepTable, job: JobId) -> u32 {
        let id = t.next_id(job);
        t.add(job, step(id));
        id
    }

    #[test]
    fn step_ids_count_up_per_job_and_past_recovered_ones() {
        let mut t = StepTable::default();
        let (a, b) = (JobId(1), JobId(2));
        assert_eq!([open(&mut t, a), open(&mut t, a)], [0, 1]);
        assert_eq!(open(&mut t, b), 0, "each job counts on its own");
        // An ended step keeps its id taken.
        t.end(a, 1, 0, 0, Reporter::Srun, 20).unwrap();
        assert_eq!(open(&mut t, a), 2);
        // Recovered out of order and with a gap: the next id is past the highest.
        let mut r = StepTable::new(HashMap::from([(a, vec![step(5), step(0)])]));
        assert_eq!(open(&mut r, a), 6);
        let ids: Vec<u32> = r.of(a).unwrap().iter().map(|s| s.step_id).collect();
        assert_eq!(ids, [5, 0, 6]);
    }

    #[test]
    fn sruns_end_is_final_and_a_worker_only_fills_in() {
        let mut t = StepTable::default();
        let job = JobId(7);
        open(&mut t, job);
        open(&mut t, job);
        // Step 0: the worker reports first, srun's report replaces it.
        let w = t.end(job, 0, 1, 0, Reporter::Worker, 20).unwrap().cloned();
        assert_eq!(w.map(|s| (s.end_time, s.exit_code)), Some((Some(20), 1)));
        let s = t
            .end(job, 0, 2, 9, Reporter::Srun, 21)
            .unwrap()
            .cloned()
            .unwrap();
        assert_eq!((s.end_time, s.exit_code, s.signal), (Some(21), 2, 9));
        // Step 1: srun first; a worker's later report changes nothing.
        t.end(job, 1, 0, 0, Reporter::Srun, 30).unwrap();
        assert_eq!(t.end(job, 1, 137, 9, Reporter::Worker, 31), Ok(None));
        let s1 = &t.of(job).unwrap()[1];
        assert_eq!((s1.end_time, s1.exit_code, s1.signal), (Some(30), 0, 0));
        // A step that does not exist, in a job with steps or without.
        assert_eq!(t.end(job, 5, 0, 0, Reporter::Srun, 40), Err(NoSuchStep));
        assert_eq!(
            t.end(JobId(8), 0, 0, 0, Reporter::Worker, 40),
            Err(NoSuchStep)
        );
    }

    #[test]
    fn removing_a_jobs_steps_says_whether_it_had_any() {
        let mut t = StepTable::default();
        open(&mut t, JobId(1));
        assert!(t.remove(JobId(1)));
        assert!(!t.remove(JobId(1)));
        assert!(!t.remove(JobId(2)));
        assert!(t.of(JobId(1)).is_none());
        assert_eq!(
            t.next_id(JobId(1)),
            0,
            "a requeued job's steps count from 0 again"
        );
    }
}
