//! Node events: registration, heartbeats, loss, drain, removal, resume.

use crate::effect::{Effect, SignalReason};
use crate::job::{JobState, KillReason, Reason};
use crate::node::{Health, Node, NodeMode};
use crate::{JobId, NodeId};

use super::{NodeError, NodeRegistration, State};

impl State {
    /// A worker registers (new node) or re-registers (known node). The node becomes UP.
    /// Jobs whose batch host is this node and that the worker no longer reports ended while
    /// it was away (or never received their launch): they end NODE_FAIL (requeued when
    /// allowed). Other nodes of a multi-node job need not report it. Jobs the worker reports that
    /// do not belong there come back as `Abandon` effects.
    pub fn register_node(
        &mut self,
        reg: NodeRegistration,
        now: i64,
    ) -> Result<Vec<Effect>, NodeError> {
        let name = reg.name.trim();
        if name.is_empty()
            || name.len() > 128
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(NodeError::BadName(reg.name.clone()));
        }
        let invalid = |p: String| NodeError::Invalid {
            node: name.to_string(),
            problem: p,
        };
        if reg.total.gpus > self.config.sched.max_gpus_per_node {
            return Err(invalid(format!(
                "{} GPUs, more than the {} supported per node",
                reg.total.gpus, self.config.sched.max_gpus_per_node
            )));
        }
        if reg.total.cpus == 0 {
            return Err(invalid("reports no CPUs".into()));
        }
        for p in &reg.partitions {
            if self.config.partition(p).is_none() {
                return Err(invalid(format!("unknown partition {p:?}")));
            }
        }
        let id = match self.node_by_name.get(name) {
            Some(id) => *id,
            None => {
                let id = NodeId(
                    u32::try_from(self.nodes.len())
                        .map_err(|_| invalid("node table full".into()))?,
                );
                self.nodes.push(Node::new(id, name, reg.total));
                self.node_by_name.insert(name.to_string(), id);
                id
            }
        };
        {
            let n = &mut self.nodes[id.index()];
            n.removed = false;
            n.total = reg.total;
            n.gpu_type = reg.gpu_type.clone();
            n.features = reg.features.clone();
            n.partitions = reg.partitions.clone();
            if n.health != Health::Up {
                n.health = Health::Up;
                if !n.drain {
                    n.reason = None;
                    n.reason_by = None;
                }
            }
            n.last_seen = now;
        }
        self.changes.nodes.insert(id);
        self.refresh_partitions_of(id);
        let mut effects = Vec::new();
        // Only the batch host runs a job's script, so only it can vouch for the job; the
        // other nodes of a multi-node job run nothing until steps start. A `kube`-mode
        // placeholder runs on no worker at all (its pods run under the kubelet): no worker
        // ever reports it, and its end comes from the bridge, never from a re-registration.
        let hosted: Vec<JobId> = self.nodes[id.index()]
            .jobs
            .iter()
            .copied()
            .filter(|j| {
                self.jobs.get(j).is_some_and(|j| {
                    j.spec.mode != NodeMode::Kube
                        && j.alloc
                            .as_ref()
                            .and_then(|a| a.nodes.first())
                            .is_some_and(|n| n.node == id)
                })
            })
            .collect();
        for job in hosted {
            if !reg.running_jobs.contains(&job) {
                effects.extend(self.fail_job_on_lost_node(job, id, now));
            }
        }
        // Ended jobs whose processes here were never reported gone (the worker was away, or
        // the controller restarted): ask again; the node stays held until it answers.
        for e in &self.nodes[id.index()].ending {
            effects.push(Effect::Cleanup {
                job: e.job,
                nodes: vec![id],
            });
        }
        for job in &reg.running_jobs {
            let ours = self.jobs.get(job).is_some_and(|j| {
                j.state == JobState::Running
                    && j.alloc
                        .as_ref()
                        .is_some_and(|a| a.node_ids().any(|n| n == id))
            });
            if !ours {
                effects.push(Effect::Abandon {
                    job: *job,
                    node: id,
                });
            }
        }
        Ok(effects)
    }

    /// A worker's heartbeat: only refreshes `last_seen` (not persisted; no change recorded).
    pub fn heartbeat(&mut self, name: &str, now: i64) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        self.nodes[id.index()].last_seen = now;
        Ok(())
    }

    /// The node's worker is gone (timeout) or an operator set it DOWN: it takes no work and
    /// its jobs end NODE_FAIL, or go back to PENDING when requeue is allowed. The other nodes
    /// of a multi-node job are told to kill their part. A `kube`-mode placeholder does not
    /// end here: see [`State::placeholder_on_lost_node`].
    pub fn node_lost(
        &mut self,
        name: &str,
        reason: &str,
        now: i64,
    ) -> Result<Vec<Effect>, NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        {
            let n = &mut self.nodes[id.index()];
            n.health = Health::Down;
            n.reason = Some(if reason.is_empty() {
                "Not responding".to_string()
            } else {
                reason.to_string()
            });
        }
        self.changes.nodes.insert(id);
        let jobs = self.nodes[id.index()].jobs.clone();
        let mut effects = Vec::new();
        for job in jobs {
            let kube = self
                .jobs
                .get(&job)
                .is_some_and(|j| j.spec.mode == NodeMode::Kube);
            if kube {
                effects.extend(self.placeholder_on_lost_node(job, id));
            } else {
                effects.extend(self.fail_job_on_lost_node(job, id, now));
            }
        }
        // Fail closed: a lost worker cannot report, so the node keeps what ended jobs held
        // there (it is DOWN, and stays held after it comes back until its worker reports
        // their processes gone). The jobs themselves wait for it no longer: as Slurm does
        // for a DOWN node, they leave COMPLETING once their other nodes have reported.
        let ending: Vec<JobId> = self.nodes[id.index()]
            .ending
            .iter()
            .map(|e| e.job)
            .collect();
        for job in ending {
            if self.jobs.get(&job).is_some_and(|j| j.completing_on(id)) {
                self.with_job(job, |j| j.done_completing_on(id));
            }
        }
        Ok(effects)
    }

    /// A placeholder's pods run under the kubelet, not the worker: a lost worker or an
    /// operator's DOWN says nothing about whether they still run, on this node or the
    /// others. Freeing the node now would hand it to batch work beside live pods, so the
    /// placeholder keeps it, in `kube` mode, and hands back only that node once the bridge
    /// has evicted the group's pods there ([`State::release_placeholder_nodes`]); its other
    /// nodes keep serving. When it has no other node left to keep, the whole placeholder
    /// is marked ending NODE_FAIL instead (the bridge evicts every pod, then reports them
    /// gone: [`State::job_ended`] ends it and frees its nodes). An ending already asked for
    /// (scancel, preemption, requeue) keeps its meaning and is not asked again.
    fn placeholder_on_lost_node(&mut self, job: JobId, lost: NodeId) -> Vec<Effect> {
        let running = self
            .jobs
            .get(&job)
            .is_some_and(|j| j.state == JobState::Running && j.kill.is_none());
        if !running || self.mark_releasing(job, lost) {
            return Vec::new();
        }
        // Every node, the lost one included: its kubelet may well be alive.
        let nodes: Vec<NodeId> = self
            .jobs
            .get(&job)
            .and_then(|j| j.alloc.as_ref())
            .as_ref()
            .map(|a| a.node_ids().collect())
            .unwrap_or_default();
        self.with_job(job, |j| {
            j.kill = Some(KillReason::NodeFail);
            j.releasing = None;
        });
        vec![Effect::Terminate {
            job,
            nodes,
            reason: SignalReason::NodeFail,
            grace_s: 0,
        }]
    }

    fn fail_job_on_lost_node(&mut self, job: JobId, lost: NodeId, now: i64) -> Vec<Effect> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        let others: Vec<NodeId> = j
            .alloc
            .as_ref()
            .map(|a| a.node_ids().filter(|n| *n != lost).collect())
            .unwrap_or_default();
        let mut effects = Vec::new();
        if !others.is_empty() {
            effects.push(Effect::Terminate {
                job,
                nodes: others,
                reason: SignalReason::NodeFail,
                grace_s: 0,
            });
        }
        // A kill the controller already asked for keeps its meaning (a cancelled job stays
        // cancelled even if its node dies meanwhile).
        let (state, reason) = match j.kill {
            Some(KillReason::Cancel) => (JobState::Cancelled, Reason::None),
            Some(KillReason::Requeue) => (JobState::Requeued, Reason::None),
            _ => (JobState::NodeFail, Reason::NodeDown),
        };
        self.with_job(job, |j| {
            if j.kill.is_none() {
                j.kill = Some(KillReason::NodeFail);
            }
        });
        effects.extend(self.end_run(job, state, reason, 0, 0, now));
        effects
    }

    /// Drains a node: it finishes its jobs and takes no new ones.
    pub fn drain(&mut self, name: &str, reason: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        if reason.trim().is_empty() {
            return Err(NodeError::Invalid {
                node: name.to_string(),
                problem: "a drain needs a reason".into(),
            });
        }
        let n = &mut self.nodes[id.index()];
        n.drain = true;
        n.reason = Some(reason.to_string());
        self.changes.nodes.insert(id);
        // Batch jobs finish where they run; a placeholder's pods never "finish" (a serving
        // Deployment runs for good), so a drain hands the node back as `kubectl drain`
        // would: the bridge evicts the group's pods there (PodDisruptionBudgets honoured
        // up to its eviction deadline), then releases only this node.
        let placeholders: Vec<JobId> = self.nodes[id.index()]
            .jobs
            .iter()
            .copied()
            .filter(|j| {
                self.jobs.get(j).is_some_and(|j| {
                    j.spec.mode == NodeMode::Kube
                        && j.state == JobState::Running
                        && j.kill.is_none()
                })
            })
            .collect();
        for job in placeholders {
            self.mark_releasing_all_ok(job, id);
        }
        Ok(())
    }

    /// Removes an idle node from the cluster (its worker set shrank): it leaves sinfo and its
    /// partitions. Refused while it holds jobs; set it DOWN first to requeue them. The id
    /// stays reserved (finished jobs' allocations name it); registering revives it.
    pub fn remove_node(&mut self, name: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        let n = &mut self.nodes[id.index()];
        if !n.jobs.is_empty() {
            return Err(NodeError::Invalid {
                node: name.to_string(),
                problem: format!("{} job(s) still run there", n.jobs.len()),
            });
        }
        n.removed = true;
        n.health = Health::Down;
        n.drain = false;
        n.reason = Some("removed".into());
        self.changes.nodes.insert(id);
        self.refresh_partitions_of(id);
        Ok(())
    }

    /// Ends a drain (`scontrol update state=resume`). A DOWN node comes back when its worker
    /// registers.
    pub fn resume(&mut self, name: &str) -> Result<(), NodeError> {
        let id = *self
            .node_by_name
            .get(name)
            .ok_or_else(|| NodeError::Unknown(name.to_string()))?;
        let n = &mut self.nodes[id.index()];
        n.drain = false;
        if n.health != Health::Down {
            n.reason = None;
            n.reason_by = None;
        }
        self.changes.nodes.insert(id);
        Ok(())
    }

    /// Records who gave the node's current reason, and when (the drain, DOWN or removal
    /// just made); nothing without a reason.
    pub fn stamp_reason(&mut self, name: &str, by: &str, now: i64) {
        let Some(&id) = self.node_by_name.get(name) else {
            return;
        };
        let n = &mut self.nodes[id.index()];
        if n.reason.is_some() {
            n.reason_by = Some((by.to_owned(), now));
            self.changes.nodes.insert(id);
        }
    }
}
