//! Tandem's policy in the replay: the scheduling core itself.
//!
//! Every trace job is submitted to a real [`State`] and every pass is a real
//! [`State::schedule`]: eligibility, multifactor priority with Fair Tree fair
//! share, placement and backfill reservations on the per-node timeline, as the
//! controller runs them. The replay only feeds events (submit at the trace's
//! submit time, end at start + run time) and records the starts.
//!
//! Mapping:
//! - trace groups become accounts under `root` and trace users become user
//!   associations under their group's account (a user seen in two groups gets
//!   two associations, as in Slurm), all with equal shares; usage is charged
//!   in billing-weighted CPU-seconds with the default 7-day half-life;
//! - the estimate (requested time, or the run time under RLScheduler's
//!   protocol) becomes the job's time limit, which is what backfill plans with;
//! - a job of `p` processors asks for `p` tasks of one CPU.
//!
//! Nodes: with up to [`ONE_CPU_NODES_UP_TO`] processors every processor is a
//! one-CPU node, which makes the core's node model the trace's processor model
//! exactly. Larger machines (CEA Curie: 93,312) get nodes of
//! `MaxProcs / MaxNodes` CPUs (16 for Curie, its thin-node size), because the
//! core's pass walks nodes and 93,312 one-CPU nodes would make every pass
//! scan tens of thousands of them. A job then takes `ceil(p / cpus)` nodes
//! with its tasks spread evenly (Slurm's rule), so it may hold a few more
//! CPUs than it asked for.

use std::collections::HashMap;

use super::replay::{Machine, Scheduler};
use super::swf::SimJob;
use crate::account::{AccountConfig, UserConfig};
use crate::{ClusterConfig, JobId, JobOutcome, JobSpec, NodeRegistration, State, Tres};

/// Machines up to this many processors are modelled as one-CPU nodes.
pub const ONE_CPU_NODES_UP_TO: u64 = 4_096;
/// Node size when the header gives no usable `MaxProcs / MaxNodes`.
pub const DEFAULT_NODE_CPUS: u64 = 16;
/// Purge finished job records every this many ends, so the core's job table
/// holds only what is live (the controller purges by age the same way).
const PURGE_EVERY: u64 = 10_000;

/// CPUs per core node for a machine of `procs` processors with `max_nodes`
/// nodes in its header.
pub fn node_cpus(procs: u64, max_nodes: Option<u64>) -> u64 {
    if procs <= ONE_CPU_NODES_UP_TO {
        return 1;
    }
    match max_nodes {
        Some(n) if n > 0 && procs / n >= 1 => procs / n,
        _ => DEFAULT_NODE_CPUS,
    }
}

/// The core driven by trace events.
pub(crate) struct TandemPolicy {
    st: State,
    /// Core job id of each trace job (aligned with the job slice).
    ids: Vec<Option<JobId>>,
    /// Trace index of each core job id.
    index: HashMap<JobId, usize>,
    ends: u64,
    /// The first thing the core refused; the replay stops on it.
    error: Option<String>,
}

impl TandemPolicy {
    /// A cluster of `procs` processors in nodes of `cpus_per_node` CPUs, with an
    /// association for every (group, user) of `jobs`.
    pub(crate) fn new(jobs: &[SimJob], procs: u64, cpus_per_node: u64) -> Result<Self, String> {
        let mut cfg = ClusterConfig::default();
        let mut groups: Vec<u32> = jobs.iter().map(|j| j.group).collect();
        groups.sort_unstable();
        groups.dedup();
        for g in &groups {
            cfg.accounts.push(AccountConfig::new(account(*g), 1));
        }
        let mut pairs: Vec<(u32, u32)> = jobs.iter().map(|j| (j.group, j.user)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        for (g, u) in pairs {
            cfg.users.push(UserConfig {
                user: user(u),
                account: account(g),
                shares: 1,
                default: false,
            });
        }
        let mut st = State::new(cfg).map_err(|e| e.to_string())?;
        let cpus = u32::try_from(cpus_per_node.max(1)).map_err(|_| "node too large".to_string())?;
        let nodes = procs.div_ceil(u64::from(cpus));
        for i in 0..nodes {
            let reg = NodeRegistration {
                name: format!("n{i}"),
                total: Tres::new(cpus, 1024 * u64::from(cpus), 0),
                ..NodeRegistration::default()
            };
            st.register_node(reg, 0).map_err(|e| e.to_string())?;
        }
        st.take_changes();
        Ok(Self {
            st,
            ids: vec![None; jobs.len()],
            index: HashMap::new(),
            ends: 0,
            error: None,
        })
    }

    fn fail(&mut self, what: String) {
        if self.error.is_none() {
            self.error = Some(what);
        }
    }
}

fn account(group: u32) -> String {
    format!("g{group}")
}

fn user(uid: u32) -> String {
    format!("u{uid}")
}

impl Scheduler for TandemPolicy {
    fn on_submit(&mut self, now: i64, idx: usize, job: &SimJob) {
        let spec = JobSpec {
            name: format!("j{}", job.id),
            user: user(job.user),
            uid: job.user,
            gid: job.group,
            account: account(job.group),
            time_limit: Some(job.estimate.max(1) as u64),
            ntasks: u32::try_from(job.procs).unwrap_or(u32::MAX),
            cpus_per_task: 1,
            ..JobSpec::default()
        };
        match self.st.submit(spec, now) {
            Ok(id) => {
                self.ids[idx] = Some(id);
                self.index.insert(id, idx);
            }
            Err(e) => self.fail(format!("core refused trace job {}: {e}", job.id)),
        }
    }

    fn on_end(&mut self, now: i64, idx: usize, job: &SimJob) {
        let Some(id) = self.ids[idx] else { return };
        match self.st.job_ended(id, JobOutcome::default(), now) {
            // Simulated workers find every process gone: each held node reports at once.
            Ok(effects) => {
                for e in effects {
                    if let crate::effect::Effect::Cleanup { job, nodes } = e {
                        for n in nodes {
                            let name = self.st.node(n).map(|x| x.name.clone());
                            if let Some(name) = name
                                && let Err(e) = self.st.job_gone(&name, job)
                            {
                                self.fail(format!("core refused a cleanup report: {e}"));
                            }
                        }
                    }
                }
            }
            Err(e) => self.fail(format!("core refused the end of trace job {}: {e}", job.id)),
        }
        self.index.remove(&id);
        self.ends += 1;
        if self.ends.is_multiple_of(PURGE_EVERY) {
            self.st.purge_finished(now);
        }
    }

    fn pass(
        &mut self,
        now: i64,
        machine: &mut Machine,
        queue: &mut Vec<usize>,
        jobs: &[SimJob],
    ) -> Vec<usize> {
        let plan = self.st.schedule(now);
        self.st.take_changes();
        let mut started = Vec::with_capacity(plan.starts.len());
        for s in &plan.starts {
            match self.index.get(&s.job) {
                Some(&idx) => {
                    machine.start(now, idx, &jobs[idx]);
                    started.push(idx);
                }
                None => self.fail(format!(
                    "core started job {} that the trace does not know",
                    s.job
                )),
            }
        }
        if !started.is_empty() {
            let mut gone = started.clone();
            gone.sort_unstable();
            queue.retain(|i| gone.binary_search(i).is_err());
        }
        started
    }

    fn error(&mut self) -> Option<String> {
        self.error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_machines_are_one_cpu_nodes() {
        assert_eq!(node_cpus(256, Some(256)), 1);
        assert_eq!(node_cpus(4_096, None), 1);
        assert_eq!(node_cpus(93_312, Some(5_544)), 16);
        assert_eq!(node_cpus(10_000, None), DEFAULT_NODE_CPUS);
    }
}
