//! Timers: lost workers, the time-limit safety net, the periodic pass, and purging finished
//! jobs and old idempotency keys.

use super::*;

impl Actor {
    pub(super) fn tick(&mut self) {
        let now_i = Instant::now();
        let now = self.now();
        // A pass whose demand was not published (too soon after the last) is, now.
        self.metrics.publish_if_stale(&self.st, now);
        // Priorities and reasons of a pass that came too soon after the last publication.
        if self.view.facts_stale {
            self.publish_facts(false);
        }
        // Lost workers.
        let lost: Vec<String> = self
            .st
            .nodes()
            .filter(|n| n.health != Health::Down)
            .filter(|n| self.workers.silence(&n.name, now_i) > self.cfg.node_timeout)
            .map(|n| n.name.clone())
            .collect();
        for name in lost {
            warn!(node = %name, timeout_ms = self.cfg.node_timeout.as_millis() as u64, "worker not responding: node DOWN");
            if let Ok(effects) = self.st.node_lost(&name, "Not responding", now) {
                self.apply_effects(effects);
                // As Slurm names its own user (SlurmUser) for the reasons it gives.
                let me = tandem_net::net::user_name_of(rustix::process::geteuid().as_raw());
                self.st.stamp_reason(&name, &me, now);
            }
            self.workers.lost(&name);
            self.pacing.want();
        }
        // Safety net for time limits the worker should have enforced.
        let kill_wait = i64::try_from(self.cfg.kill_wait.as_secs()).unwrap_or(i64::MAX);
        let overdue: Vec<(JobId, Vec<String>)> = self
            .st
            .running_jobs()
            .filter(|j| j.spec.mode != tandem_sched::node::NodeMode::Kube)
            .filter(|j| !self.timeout_signalled.contains(&j.id))
            .filter(|j| {
                j.expected_end().is_some_and(|e| {
                    now > e.saturating_add(kill_wait).saturating_add(TIMEOUT_SLACK_S)
                })
            })
            .map(|j| {
                (
                    j.id,
                    self.st
                        .node_names(j)
                        .iter()
                        .map(|s| (*s).to_owned())
                        .collect(),
                )
            })
            .collect();
        for (id, nodes) in overdue {
            warn!(
                job_id = id.0,
                "job overran its time limit unreported; signalling its nodes"
            );
            for n in &nodes {
                self.signal_node(n, id, 0, false, "timeout");
            }
            self.timeout_signalled.insert(id);
        }
        // Processes that outlived the kill: the kill wait, then UnkillableStepTimeout, after
        // the run ended. Their node is drained; the job keeps it until they are gone.
        let unkillable = kill_wait.saturating_add(
            i64::try_from(self.cfg.unkillable_step_timeout.as_secs()).unwrap_or(i64::MAX),
        );
        for name in self.st.drain_unkillable(now, unkillable) {
            warn!(node = %name, after_s = unkillable, "job processes survived the kill: node drained (Kill task failed)");
            let me = tandem_net::net::user_name_of(rustix::process::geteuid().as_raw());
            self.st.stamp_reason(&name, &me, now);
        }
        self.placeholder_timeouts();
        // Periodic work.
        if now_i >= self.next_periodic_pass {
            // Begin times and time-based eligibility have no event of their own.
            if self.st.pending_jobs().next().is_some() {
                self.pacing.want();
            } else if self.st.running_jobs().next().is_some() {
                // No pass will run, but running jobs (a serving group's placeholder for
                // days) still charge their accounts: `sshare` and fair share see usage
                // as it accrues, as Slurm's decay thread does, not only when jobs end.
                self.st.charge_usage(now);
            }
            self.next_periodic_pass = now_i + self.cfg.sched_interval;
        }
        if now_i >= self.next_purge {
            let purged = self.st.purge_finished(now - MIN_JOB_AGE_S);
            if !purged.is_empty() {
                debug!(purged = purged.len(), "purged finished jobs from memory");
            }
            let before = now - IDEMPOTENCY_TTL_S;
            let n = self.idem.len();
            self.idem.retain(|_, (_, t)| *t >= before);
            if self.idem.len() != n {
                self.batch.expire_idempotency_before = Some(before);
            }
            self.next_purge = now_i + Duration::from_secs(10);
        }
    }
}
