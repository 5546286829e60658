//! The scheduling pass: run the core's cycle, dispatch its starts and preemptions after the
//! commit, time its phases.

use super::*;

impl Actor {
    /// Turns "only submits happened" into a wanted pass if some node has room for them;
    /// where none has, tells them now what a pass would (squeue right after sbatch shows
    /// `Resources` and a priority, as with Slurm, not `None` until something ends).
    pub(super) fn settle_pass_wanted(&mut self) {
        let st = &self.st;
        let no_room = self.pacing.settle(|| capacity_available(st));
        if !no_room.is_empty() {
            let now = self.now();
            self.st.no_room_for(&no_room, now);
        }
    }

    /// Whether the pass due now runs before the drained commands are flushed, so that its
    /// writes (the starts a submit allows) share their transaction: one commit, one fsync,
    /// for a submit and its start, where flushing first made two, the second queued behind
    /// the first (Slurm, too, starts a job from inside its submit RPC when it can). The
    /// commands' callers then also wait for the pass, so only while passes are quick
    /// (`Config::quick_pass`, well under a commit), and never when a tick is due: the tick
    /// runs first so that nodes lost now are not scheduled on.
    pub(super) fn pass_joins_flush(&self) -> bool {
        let now = Instant::now();
        self.pacing
            .joins_flush(now, now >= self.next_tick, self.cfg.quick_pass)
    }

    /// Runs a scheduling pass and flushes its writes with whatever is pending; returns the
    /// rows flushed.
    pub(super) fn pass(&mut self) -> usize {
        self.pacing.started();
        let started = Instant::now();
        let now = self.now();
        let mut phases = PhaseTimer::default();
        let plan = tandem_sched::cycle::schedule_observed(&mut self.st, now, &mut phases);
        let sched_us = started.elapsed().as_micros() as u64;
        let n_starts = plan.starts.len();
        for start in &plan.starts {
            self.launch(start, now);
        }
        for p in &plan.preemptions {
            // A preempted placeholder's pods are evicted by the bridge (its event says
            // PREEMPTED); there is nothing on the worker to signal.
            if self
                .st
                .job(p.job)
                .is_some_and(|j| j.spec.mode == tandem_sched::node::NodeMode::Kube)
            {
                continue;
            }
            for n in &p.nodes {
                if let Some(name) = self.st.node(*n).map(|x| x.name.clone()) {
                    self.send_after_commit(
                        &name,
                        controller_message::Msg::SignalJob(v1::SignalJob {
                            job_id: p.job.0,
                            signal: 0,
                            batch_only: false,
                            reason: "preempt".into(),
                            // The victim's QOS GraceTime: the worker sends SIGTERM now
                            // and starts the KillWait countdown only after it.
                            grace_s: p.grace_s,
                        }),
                    );
                }
            }
        }
        self.planned = plan
            .reservations
            .iter()
            .map(|r| {
                let names: Vec<&str> = r
                    .nodes
                    .iter()
                    .filter_map(|n| self.st.node(*n).map(|x| x.name.as_str()))
                    .collect();
                (
                    r.job,
                    (r.start, Arc::from(tandem_sched::hostlist::compress(&names))),
                )
            })
            .collect();
        let dispatch_us = started.elapsed().as_micros() as u64 - sched_us;
        // After the starts: only placeholders still pending have a reason to announce.
        self.placeholder_reasons();
        let rows = self.flush();
        // Counted in the pass: publishing the recomputed priorities is the pass's cost.
        self.publish_facts(false);
        let total = started.elapsed();
        self.metrics.pass(n_starts, total.as_micros() as u64);
        // Cap scheduling at half the actor's time: the next pass waits as long as this
        // one took.
        self.pacing.finished(Instant::now(), total);
        if n_starts > 0 || !plan.preemptions.is_empty() || sched_us > 10_000 {
            info!(
                considered = plan.stats.considered,
                eligible = plan.stats.eligible,
                started = n_starts,
                preempted = plan.preemptions.len(),
                reservations = plan.stats.reservations,
                sched_us,
                usage_us = phases.us(Phase::Usage),
                eligible_us = phases.us(Phase::Eligible),
                order_us = phases.us(Phase::Order),
                place_us = phases.us(Phase::Place),
                preempt_us = phases.us(Phase::Preempt),
                apply_us = phases.us(Phase::Apply),
                dispatch_us,
                rows,
                total_us = total.as_micros() as u64,
                "scheduling pass"
            );
        } else {
            debug!(
                considered = plan.stats.considered,
                sched_us,
                total_us = total.as_micros() as u64,
                "scheduling pass"
            );
        }
        self.publish_demand();
        rows
    }

    /// Gauges and the scaler's demand snapshot, from what the pass left (at most every
    /// `metrics::PUBLISH_EVERY`; the tick publishes what a burst of passes left).
    pub(super) fn publish_demand(&self) {
        self.metrics.pass_done(&self.st, self.now());
    }
}

/// Whether any node could take more work now.
fn capacity_available(st: &State) -> bool {
    st.nodes().any(|n| {
        let free = n.free();
        n.schedulable() && free.cpus > 0
    })
}

/// Times the phases of one pass (the core has no clock; it reports phase boundaries).
#[derive(Default)]
struct PhaseTimer {
    current: Option<(Phase, Instant)>,
    done: Vec<(Phase, Duration)>,
}

impl PassObserver for PhaseTimer {
    fn phase(&mut self, phase: Phase) {
        let now = Instant::now();
        if let Some((p, t)) = self.current.take() {
            self.done.push((p, now - t));
        }
        self.current = Some((phase, now));
    }
}

impl PhaseTimer {
    fn us(&self, phase: Phase) -> u64 {
        self.done
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, d)| d.as_micros() as u64)
            .sum()
    }
}
