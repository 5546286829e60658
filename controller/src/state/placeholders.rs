//! The bridge's placeholder jobs: `kube`-mode jobs that hold nodes for Kubernetes pods.
//!
//! A group is its namespace's: placeholders are keyed by (namespace, group UID), so a pod
//! in another namespace that copies a group's labels (an LWS group key is a hash anyone can
//! compute) makes a group of its own, charged to its own namespace, and an end report
//! names the namespace it speaks for, refused for another's placeholder.
//!
//! A placeholder is scheduled like any job and never launched: the bridge binds the pods
//! where it runs. It is found again by its pod group's UID (a restarted bridge submits
//! again and gets the same job), and it ends only when the bridge reports the pods gone,
//! so a terminating pod keeps its node. To end one early (scancel, preemption, time limit,
//! or the loss of the last node it keeps: the pods run under the kubelet, so a lost worker
//! or an operator's DOWN does not mean they stopped) the controller marks it ending; the
//! bridge evicts the pods, then reports. Every node stays held, in `kube` mode, until then.
//! A node drained or lost while the group keeps others is asked back alone (the event's
//! `releasing`): the bridge evicts the group's pods there and releases it
//! ([`Actor::release_placeholder_nodes`]); the group serves on from the rest.
//!
//! Watchers get a snapshot, then every change after the batch holding it commits: the
//! bridge never binds on an allocation the store does not know. A watcher whose queue
//! fills up loses its stream (bounded memory) and subscribes again.

use std::sync::atomic::{AtomicBool, Ordering};

use tandem_sched::job::KillReason;
use tandem_sched::node::NodeMode;
use tandem_sched::state::Release;

use super::*;

/// Live placeholders by group and the bridges watching them.
#[derive(Default)]
pub(super) struct Placeholders {
    /// (namespace, pod-group UID) -> its placeholder that has not finished.
    by_group: HashMap<(String, String), JobId>,
    watchers: Vec<Watcher>,
    /// Running placeholders past their time limit, already announced as ending TIMEOUT.
    timed_out: HashSet<JobId>,
    /// The pending reason last announced per pending placeholder. A pass changes reasons
    /// without recording a job change (see `tandem_sched::cycle`), so they are compared
    /// here after each pass: the bridge tells the pods why they wait (`Resources`,
    /// `Priority`, ...), not the `None` of a job no pass has looked at yet.
    reasons: HashMap<JobId, String>,
}

struct Watcher {
    tx: PlaceholderTx,
    /// Set when an event could not be queued: the stream is ended rather than left with
    /// a gap.
    lost: Arc<AtomicBool>,
}

impl Placeholders {
    /// Rebuilds the group index from recovered jobs.
    pub(super) fn index(&mut self, st: &State) {
        for j in st.jobs() {
            if let Some(key) = live_group(j) {
                self.by_group.insert(key, j.id);
            }
        }
    }
}

/// When a bridge's report says the pods stopped: `end_time` (0: now), never in the future
/// and never before the job started.
fn reported_end(job: &Job, end_time: i64, now: i64) -> i64 {
    let started = job.start_time.unwrap_or(job.submit_time);
    if end_time == 0 {
        now
    } else {
        end_time.min(now)
    }
    .max(started)
}

fn is_placeholder(j: &Job) -> bool {
    j.spec.mode == NodeMode::Kube && j.spec.group_uid.is_some()
}

/// A placeholder's key: its namespace (the job's user) and its group's UID.
fn group_key(j: &Job) -> Option<(String, String)> {
    let uid = j.spec.group_uid.as_ref()?;
    Some((j.spec.user.clone(), uid.clone()))
}

fn live_group(j: &Job) -> Option<(String, String)> {
    if is_placeholder(j) && !j.state.is_terminal() {
        group_key(j)
    } else {
        None
    }
}

impl Actor {
    pub(super) fn submit_placeholder(
        &mut self,
        spec: JobSpec,
        reply: Reply<v1::SubmitPlaceholderResponse>,
    ) {
        let uid = spec.group_uid.clone().unwrap_or_default();
        let key = (spec.user.clone(), uid.clone());
        if let Some(id) = self.placeholders.by_group.get(&key).copied()
            && self.st.job(id).is_some_and(|j| !j.state.is_terminal())
        {
            // The first submit may still be in flight: answer after this batch.
            let resp = v1::SubmitPlaceholderResponse {
                job_id: id.0,
                created: false,
            };
            self.reply_after_commit(reply, resp);
            return;
        }
        let now = self.now();
        match self.st.submit(spec, now) {
            Ok(id) => {
                info!(job_id = id.0, group = %uid, namespace = %key.0, "placeholder submitted");
                self.placeholders.by_group.insert(key, id);
                self.metrics.submitted(1);
                self.pacing.want();
                let resp = v1::SubmitPlaceholderResponse {
                    job_id: id.0,
                    created: true,
                };
                self.reply_after_commit(reply, resp);
            }
            Err(e) => {
                let _ = reply.send(Err(Status::invalid_argument(e.to_string())));
            }
        }
    }

    /// Placeholder `id`, if `namespace` owns it: not found, not a placeholder (a batch job)
    /// and another namespace's are refused.
    fn owned_placeholder(&self, id: JobId, namespace: &str) -> Result<&Job, Status> {
        let job = self
            .st
            .job(id)
            .ok_or_else(|| Status::not_found(format!("job {id} not found")))?;
        if !is_placeholder(job) {
            return Err(Status::failed_precondition(format!(
                "job {id} is a batch job, not a placeholder"
            )));
        }
        if job.spec.user != namespace {
            return Err(Status::permission_denied(format!(
                "placeholder {id} belongs to namespace {:?}, not {namespace:?}",
                job.spec.user
            )));
        }
        Ok(job)
    }

    /// The group's pods are gone: ends the job at `end_time` (0: now; never in the future,
    /// never before it started). A pending placeholder is cancelled; an ended one answers
    /// its state again. Refused, changing nothing, when `namespace` is not the job's.
    pub(super) fn end_placeholder(
        &mut self,
        id: JobId,
        end_time: i64,
        namespace: &str,
    ) -> Result<v1::EndPlaceholderResponse, Status> {
        let now = self.now();
        let job = self.owned_placeholder(id, namespace)?;
        match job.state {
            JobState::Pending => {
                let effects = self
                    .st
                    .cancel(&JobSelector::job(id), &Requester::admin(), now)
                    .map_err(|e| Status::failed_precondition(e.to_string()))?;
                self.apply_effects(effects);
            }
            JobState::Running => {
                let end = reported_end(job, end_time, now);
                let timed_out = job.kill.is_none()
                    && (self.placeholders.timed_out.contains(&id)
                        || job.expected_end().is_some_and(|e| end >= e));
                let outcome = JobOutcome {
                    timed_out,
                    ..JobOutcome::default()
                };
                let effects = self
                    .st
                    .job_ended(id, outcome, end)
                    .map_err(|e| Status::failed_precondition(e.to_string()))?;
                self.apply_effects(effects);
            }
            _ => {}
        }
        self.placeholders.timed_out.remove(&id);
        self.pacing.want();
        let state = self.st.job(id).map_or(JobState::Completed, |j| j.state);
        Ok(v1::EndPlaceholderResponse {
            state: convert::state_to_proto(state) as i32,
        })
    }

    /// The group's pods are gone from `nodes`, which the controller asked back (see
    /// [`tandem_sched::state::Release`]): they leave the job, charged until `end_time`
    /// (clamped as for an end), and are free. Releasing every node the job still holds
    /// ends it as [`Self::end_placeholder`] does. Refused, changing nothing, when
    /// `namespace` is not the job's, a node is unknown, or a node was not asked back.
    pub(super) fn release_placeholder_nodes(
        &mut self,
        id: JobId,
        nodes: &[String],
        end_time: i64,
        namespace: &str,
    ) -> Result<v1::ReleasePlaceholderNodesResponse, Status> {
        let now = self.now();
        let job = self.owned_placeholder(id, namespace)?;
        let ids = nodes
            .iter()
            .map(|n| {
                self.st
                    .node_by_name(n)
                    .map(|x| x.id)
                    .ok_or_else(|| Status::invalid_argument(format!("unknown node {n:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let end = reported_end(job, end_time, now);
        let released = self
            .st
            .release_placeholder_nodes(id, &ids, end)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        let state = match released {
            Release::EndsJob => self.end_placeholder(id, end, namespace)?.state,
            Release::Shrunk => {
                info!(job_id = id.0, nodes = ?nodes, "placeholder handed back nodes; it runs on with the rest");
                self.pacing.want();
                convert::state_to_proto(JobState::Running) as i32
            }
            Release::Nothing => self
                .st
                .job(id)
                .map_or(0, |j| convert::state_to_proto(j.state) as i32),
        };
        let held = self
            .st
            .job(id)
            .filter(|j| j.state == JobState::Running)
            .map(|j| {
                self.st
                    .node_names(j)
                    .iter()
                    .map(|n| (*n).to_owned())
                    .collect()
            })
            .unwrap_or_default();
        Ok(v1::ReleasePlaceholderNodesResponse { state, nodes: held })
    }

    pub(super) fn watch_placeholders(&mut self, tx: PlaceholderTx) {
        let now = self.now();
        let mut events: Vec<v1::PlaceholderEvent> = self
            .st
            .jobs()
            .filter(|j| is_placeholder(j))
            .map(|j| self.placeholder_event(j, now))
            .collect();
        events.push(v1::PlaceholderEvent {
            snapshot_done: true,
            ..Default::default()
        });
        let watcher = Watcher {
            tx,
            lost: Arc::new(AtomicBool::new(false)),
        };
        let (t, lost) = (watcher.tx.clone(), watcher.lost.clone());
        // After this batch commits, like every later event: a snapshot shows only what is
        // durable, and changes after it arrive after it.
        self.effects
            .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                if r.is_err() {
                    lost.store(true, Ordering::Relaxed);
                    return;
                }
                for e in events {
                    if t.try_send(Ok(e)).is_err() {
                        lost.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }));
        self.placeholders.watchers.push(watcher);
    }

    /// Queues events for changed jobs (called by `flush` with the batch's job changes) and
    /// keeps the group index in step.
    pub(super) fn placeholders_changed(
        &mut self,
        changed: &std::collections::BTreeSet<JobId>,
        removed: &[JobId],
    ) {
        let now = self.now();
        let mut events = Vec::new();
        for id in changed {
            let Some(j) = self.st.job(*id) else { continue };
            if !is_placeholder(j) {
                continue;
            }
            if j.state.is_terminal()
                && let Some(key) = group_key(j)
                && self.placeholders.by_group.get(&key) == Some(id)
            {
                self.placeholders.by_group.remove(&key);
            }
            if !self.placeholders.watchers.is_empty() {
                events.push(self.placeholder_event(j, now));
            }
        }
        // A purged record may have been any job (its kind is gone with it); a bridge
        // ignores ids it does not know.
        for id in removed {
            self.placeholders.by_group.retain(|_, j| j != id);
            events.push(v1::PlaceholderEvent {
                job_id: id.0,
                removed: true,
                ..Default::default()
            });
        }
        self.send_placeholder_events(events);
    }

    /// Running placeholders past their time limit: announce them ending TIMEOUT once.
    pub(super) fn placeholder_timeouts(&mut self) {
        let now = self.now();
        let due: Vec<JobId> = self
            .st
            .running_jobs()
            .filter(|j| is_placeholder(j) && j.kill.is_none())
            .filter(|j| !self.placeholders.timed_out.contains(&j.id))
            .filter(|j| j.expected_end().is_some_and(|e| now >= e))
            .map(|j| j.id)
            .collect();
        if due.is_empty() {
            return;
        }
        let mut events = Vec::new();
        for id in due {
            info!(
                job_id = id.0,
                "placeholder reached its time limit: its pods are evicted"
            );
            self.placeholders.timed_out.insert(id);
            if let Some(j) = self.st.job(id) {
                events.push(self.placeholder_event(j, now));
            }
        }
        self.send_placeholder_events(events);
    }

    /// After a pass: announces pending placeholders whose reason changed.
    pub(super) fn placeholder_reasons(&mut self) {
        let now = self.now();
        let ids: Vec<JobId> = self
            .placeholders
            .by_group
            .values()
            .copied()
            .filter(|id| {
                self.st
                    .job(*id)
                    .is_some_and(|j| j.state == JobState::Pending)
            })
            .collect();
        // Forget those no longer pending (started or ended while no bridge watched).
        let live: HashSet<JobId> = ids.iter().copied().collect();
        self.placeholders.reasons.retain(|id, _| live.contains(id));
        let mut events = Vec::new();
        for id in ids {
            let Some(j) = self.st.job(id) else { continue };
            let reason = j.reason.to_string();
            if self.placeholders.reasons.get(&id) == Some(&reason) {
                continue;
            }
            events.push(self.placeholder_event(j, now));
        }
        self.send_placeholder_events(events);
    }

    fn send_placeholder_events(&mut self, events: Vec<v1::PlaceholderEvent>) {
        let pending = convert::state_to_proto(JobState::Pending) as i32;
        for e in &events {
            if e.removed || e.state != pending {
                self.placeholders.reasons.remove(&JobId(e.job_id));
            } else {
                self.placeholders
                    .reasons
                    .insert(JobId(e.job_id), e.reason.clone());
            }
        }
        self.placeholders
            .watchers
            .retain(|w| !w.lost.load(Ordering::Relaxed) && !w.tx.is_closed());
        if events.is_empty() || self.placeholders.watchers.is_empty() {
            return;
        }
        let targets: Vec<(PlaceholderTx, Arc<AtomicBool>)> = self
            .placeholders
            .watchers
            .iter()
            .map(|w| (w.tx.clone(), w.lost.clone()))
            .collect();
        self.effects
            .push(Box::new(move |_: &Store, r: Result<(), &StoreError>| {
                for (tx, lost) in targets {
                    if r.is_err() || lost.load(Ordering::Relaxed) {
                        lost.store(true, Ordering::Relaxed);
                        continue;
                    }
                    for e in &events {
                        if tx.try_send(Ok(e.clone())).is_err() {
                            lost.store(true, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            }));
    }

    fn placeholder_event(&self, j: &Job, now: i64) -> v1::PlaceholderEvent {
        let running = j.state == JobState::Running;
        let ending = match (running, j.kill) {
            (false, _) => None,
            (true, Some(KillReason::Cancel)) => Some(JobState::Cancelled),
            (true, Some(KillReason::Preempt(_))) => Some(JobState::Preempted),
            (true, Some(KillReason::NodeFail)) => Some(JobState::NodeFail),
            (true, Some(KillReason::Requeue)) => Some(JobState::Requeued),
            (true, None)
                if self.placeholders.timed_out.contains(&j.id)
                    || j.expected_end().is_some_and(|e| now >= e) =>
            {
                Some(JobState::Timeout)
            }
            (true, None) => None,
        };
        v1::PlaceholderEvent {
            job_id: j.id.0,
            group_uid: j.spec.group_uid.clone().unwrap_or_default(),
            state: convert::state_to_proto(j.state) as i32,
            reason: j.reason.to_string(),
            nodes: if running {
                self.st
                    .node_names(j)
                    .iter()
                    .map(|n| (*n).to_owned())
                    .collect()
            } else {
                Vec::new()
            },
            pods_per_node: j.shape.tasks_per_node,
            ending: ending.map_or(0, |s| convert::state_to_proto(s) as i32),
            removed: false,
            snapshot_done: false,
            namespace: j.spec.user.clone(),
            releasing: if running && j.kill.is_none() {
                j.releasing_nodes()
                    .iter()
                    .filter_map(|n| self.st.node(*n).map(|x| x.name.clone()))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }
}
