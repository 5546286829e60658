//! The seam between the pass and the priority policy: builds `priority.rs`'s inputs from the
//! cluster model. The pass ranks every eligible job with it; `sprio` and `sshare` use it to
//! show the same numbers the pass used.

use std::collections::HashMap;

use crate::fairshare::{AssocIdx, FairShareTable};
use crate::job::Job;
use crate::priority::{PriorityBreakdown, PriorityContext, PriorityInput};
use crate::state::State;

/// Everything per pass that job priorities depend on: cluster totals, the Fair Tree table,
/// and a cache of association look-ups. Build once per pass; O(1) per job after that.
pub struct Ranking<'a> {
    st: &'a State,
    ctx: PriorityContext,
    table: FairShareTable,
    assoc_of: HashMap<(&'a str, &'a str), Option<AssocIdx>>,
}

impl<'a> Ranking<'a> {
    pub fn new(st: &'a State, now: i64) -> Ranking<'a> {
        let mut total_nodes = 0u32;
        let (mut cpus, mut mem, mut gpus) = (0u64, 0u64, 0u64);
        // Nodes that can work (or do): a DOWN node does not make every job look small.
        for n in st.nodes().filter(|n| n.schedulable() || !n.jobs.is_empty()) {
            total_nodes += 1;
            cpus += u64::from(n.total.cpus);
            mem += n.total.mem_mb;
            gpus += u64::from(n.total.gpus);
        }
        let ctx = PriorityContext {
            now,
            total_nodes,
            total_cpus: cpus,
            total_mem_mb: mem,
            total_gpus: gpus,
            max_partition_factor: st
                .config
                .partitions
                .iter()
                .map(|p| p.priority_job_factor)
                .max()
                .unwrap_or(0),
            max_qos_priority: st.config.qos.iter().map(|q| q.priority).max().unwrap_or(0),
        };
        Ranking {
            st,
            ctx,
            table: st.assoc.compute(),
            assoc_of: HashMap::new(),
        }
    }

    /// The Fair Tree table of this pass (sshare's rows).
    pub fn fairshare(&self) -> &FairShareTable {
        &self.table
    }

    pub fn context(&self) -> &PriorityContext {
        &self.ctx
    }

    /// A job's view for the priority function.
    pub fn input(&mut self, job: &'a Job) -> PriorityInput {
        let st = self.st;
        let t = job.shape.total();
        let assoc = *self
            .assoc_of
            .entry((job.spec.user.as_str(), job.spec.account.as_str()))
            .or_insert_with(|| st.job_assoc(job));
        PriorityInput {
            eligible_at: job.eligible_time.unwrap_or(self.ctx.now),
            fairshare: assoc.map(|a| self.table.factor(a)).unwrap_or(0.0),
            nodes: job.shape.nodes,
            cpus: u64::from(t.cpus),
            mem_mb: t.mem_mb,
            gpus: u64::from(t.gpus),
            partition_factor: st
                .config
                .partition(&job.spec.partition)
                .map_or(0, |p| p.priority_job_factor),
            qos_priority: st.config.qos(&job.spec.qos).map_or(0, |q| q.priority),
            nice: job.spec.nice,
        }
    }

    /// sprio's row for a job.
    pub fn breakdown(&mut self, job: &'a Job) -> PriorityBreakdown {
        let input = self.input(job);
        crate::priority::priority(&self.st.config.priority, &self.ctx, &input)
    }

    /// The priority the pass uses: an administrator's fixed value, else multifactor.
    pub fn priority(&mut self, job: &'a Job) -> u64 {
        match job.spec.priority {
            Some(fixed) => fixed,
            None => u64::from(self.breakdown(job).total),
        }
    }
}
