//! The bridge's decisions: (a group's pods, its placeholder job) -> what to do.
//!
//! Pure, so every rule is a unit test: bind all members or none, mark waiting pods
//! `Unschedulable` with the controller's reason, evict pods whose job was cancelled,
//! preempted or timed out, end the job when its pods are gone. Every unknown fails closed:
//! a controller lookup that failed, or a pod bound outside the allocation, means wait, and
//! never an eviction.

use k8s_openapi::api::core::v1::Pod;

/// One pod of a group as the bridge sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Order within the group (completion index, worker index); unranked pods follow by name.
    pub rank: Option<u32>,
    /// `spec.nodeName`, once bound.
    pub node: Option<String>,
    pub state: MemberState,
}

/// Where a pod is in its life, for scheduling purposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Waiting for a node (or bound and starting: [`Member::node`] tells).
    Live,
    /// Being deleted, containers still running: it keeps its slot (slurm-bridge #16).
    Terminating,
    /// Stopped for good at this time (succeeded, failed, deleted and stopped, or its node
    /// vanished and the grace period passed).
    Finished { at: i64 },
}

/// The group's placeholder job as the controller reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobView {
    /// The lookup failed or has not answered yet.
    Unknown,
    /// No placeholder exists for the group.
    Absent,
    Pending {
        job_id: u64,
        /// The controller's reason, in Slurm's words (`Priority`, `Resources`, ...).
        reason: String,
    },
    Allocated {
        job_id: u64,
        /// The Kubernetes nodes behind the allocated batch nodes, in allocation order.
        nodes: Vec<String>,
        pods_per_node: u32,
        /// Nodes the controller asks back (drained or lost) while the job runs on: the
        /// group's pods there are evicted, then the nodes released.
        releasing: Vec<String>,
    },
    /// Still holding its nodes, but the controller wants the pods gone (scancel,
    /// preemption, time limit): evict them, then report them gone.
    Ending { job_id: u64, why: EndReason },
    /// Over; its nodes are free.
    Ended { job_id: u64, why: EndReason },
}

/// Why a placeholder job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// The bridge reported its pods gone: nothing left to do.
    PodsGone,
    Cancelled,
    Preempted,
    TimedOut,
    NodeFailed,
    /// Not the job's end: one of its nodes was drained or lost and is asked back.
    NodeReleased,
}

/// What the bridge must do next for a group. At most one binding or eviction set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do until something changes; `why` is for the logs.
    Wait { why: String },
    /// Submit the placeholder (idempotent under the group's UID).
    Submit,
    /// Mark these pods `PodScheduled=False`, reason `Unschedulable`, with this message.
    Unschedulable { pods: Vec<String>, message: String },
    /// Bind every listed pod to its node (the whole rest of the group).
    Bind {
        job_id: u64,
        bindings: Vec<(String, String)>,
    },
    /// Evict these pods through the Eviction API.
    Evict {
        job_id: u64,
        pods: Vec<String>,
        why: EndReason,
    },
    /// Report the job's pods gone; usage is charged until `end_time`.
    EndJob { job_id: u64, end_time: i64 },
    /// Report the group's pods gone from `nodes` (asked back by the controller); their
    /// usage is charged until `end_time`.
    ReleaseNodes {
        job_id: u64,
        nodes: Vec<String>,
        end_time: i64,
    },
}

/// Decides for one group. `expected` is the number of members the group waits for (see
/// [`crate::group::expected_members`]); `None` = not known yet. Call only once the pod
/// watch has synced: an empty member list then means the pods are really gone.
pub fn decide(members: &[Member], expected: Option<u32>, job: &JobView, now: i64) -> Decision {
    decide_gang(members, expected, false, job, now)
}

/// [`decide`] for a group that may start in stages (`staged`: a JobSet started `InOrder`
/// or with `dependsOn`): its placeholder, sized for every member, is submitted as soon as
/// the first members exist, and later members bind to its allocation as they appear.
pub fn decide_gang(
    members: &[Member],
    expected: Option<u32>,
    staged: bool,
    job: &JobView,
    now: i64,
) -> Decision {
    let live_unbound: Vec<&Member> = members
        .iter()
        .filter(|m| m.state == MemberState::Live && m.node.is_none())
        .collect();
    let holding: Vec<&Member> = members
        .iter()
        .filter(|m| m.node.is_some() && !matches!(m.state, MemberState::Finished { .. }))
        .collect();
    match job {
        JobView::Unknown => wait("the controller's view of the job is unknown"),
        JobView::Absent => {
            if !holding.is_empty() {
                return wait("pods are bound but no placeholder job exists");
            }
            if live_unbound.is_empty() {
                return wait("no pod waits");
            }
            let have = u32::try_from(live_unbound.len()).unwrap_or(u32::MAX);
            match expected {
                None => unschedulable(&live_unbound, "waiting for the group's size".into()),
                Some(want) if have < want && !staged => unschedulable(
                    &live_unbound,
                    format!("pod group has {have} of {want} pods; waiting for the rest"),
                ),
                Some(_) => Decision::Submit,
            }
        }
        JobView::Pending { job_id, reason } => {
            if live_unbound.is_empty() && holding.is_empty() {
                // Its pods went away before it ran (a Deployment scaled down): withdraw it.
                return Decision::EndJob {
                    job_id: *job_id,
                    end_time: now,
                };
            }
            if live_unbound.is_empty() {
                return wait("no pod waits");
            }
            // `None` is Slurm's reason for a job no scheduling pass has looked at yet: like
            // kube-scheduler, say `Unschedulable` only once an attempt failed, with why.
            if reason.is_empty() || reason == "None" {
                return wait("the placeholder has not been considered yet");
            }
            unschedulable(
                &live_unbound,
                format!("waiting in Tandem's queue: {reason}"),
            )
        }
        JobView::Allocated {
            job_id,
            nodes,
            pods_per_node,
            releasing,
        } => {
            if let Some(d) = hand_back(*job_id, releasing, members, &holding, now) {
                return d;
            }
            allocated(
                *job_id,
                nodes,
                *pods_per_node,
                members,
                &live_unbound,
                &holding,
                now,
            )
        }
        JobView::Ending { job_id, why } => {
            if let Some(d) = clear_out(*job_id, why, &holding) {
                return d;
            }
            Decision::EndJob {
                job_id: *job_id,
                end_time: last_stop(members, now),
            }
        }
        JobView::Ended { job_id, why } => {
            if let Some(d) = clear_out(*job_id, why, &holding) {
                return d;
            }
            if live_unbound.is_empty() {
                return wait("job ended and no pod waits");
            }
            // New pods of the group (a JobSet restarting, a replacement) need a new job.
            Decision::Submit
        }
    }
}

fn allocated(
    job_id: u64,
    nodes: &[String],
    pods_per_node: u32,
    members: &[Member],
    unbound: &[&Member],
    holding: &[&Member],
    now: i64,
) -> Decision {
    if let Some(m) = holding
        .iter()
        .find(|m| !nodes.iter().any(|n| Some(n) == m.node.as_ref()))
    {
        return wait(&format!(
            "pod {} is bound to {} outside the allocation",
            m.name,
            m.node.as_deref().unwrap_or_default()
        ));
    }
    if unbound.is_empty() {
        if holding.is_empty() {
            return Decision::EndJob {
                job_id,
                end_time: last_stop(members, now),
            };
        }
        return wait("every pod is placed");
    }
    let mut free: Vec<(&String, u32)> = nodes
        .iter()
        .map(|n| {
            let used = holding
                .iter()
                .filter(|m| m.node.as_ref() == Some(n))
                .count();
            (
                n,
                pods_per_node.saturating_sub(u32::try_from(used).unwrap_or(u32::MAX)),
            )
        })
        .collect();
    let mut order: Vec<&&Member> = unbound.iter().collect();
    order.sort_by(|a, b| {
        (a.rank.is_none(), a.rank, &a.name).cmp(&(b.rank.is_none(), b.rank, &b.name))
    });
    let mut bindings = Vec::with_capacity(order.len());
    for m in order {
        let Some(slot) = free.iter_mut().find(|(_, n)| *n > 0) else {
            // All or none: a group larger than its allocation binds nothing.
            return wait("more pods than the allocation holds");
        };
        slot.1 -= 1;
        bindings.push((m.name.clone(), slot.0.clone()));
    }
    Decision::Bind { job_id, bindings }
}

/// For nodes the controller asks back while the job runs on: evict the group's pods on
/// them, wait while evicted ones stop (a pod counts as gone only as [`MemberState`] says:
/// from the kubelet's report, or its vanish deadline), then release the nodes. `None`
/// when no node is asked back. Nothing is bound meanwhile: the allocation is changing.
fn hand_back(
    job_id: u64,
    releasing: &[String],
    members: &[Member],
    holding: &[&Member],
    now: i64,
) -> Option<Decision> {
    if releasing.is_empty() {
        return None;
    }
    let on = |m: &Member| m.node.as_ref().is_some_and(|n| releasing.contains(n));
    let there: Vec<&Member> = holding.iter().copied().filter(|m| on(m)).collect();
    let evict: Vec<String> = there
        .iter()
        .filter(|m| m.state == MemberState::Live)
        .map(|m| m.name.clone())
        .collect();
    if !evict.is_empty() {
        return Some(Decision::Evict {
            job_id,
            pods: evict,
            why: EndReason::NodeReleased,
        });
    }
    if !there.is_empty() {
        return Some(wait("evicted pods on a node asked back are still stopping"));
    }
    let end_time = members
        .iter()
        .filter(|m| on(m))
        .filter_map(|m| match m.state {
            MemberState::Finished { at } => Some(at),
            _ => None,
        })
        .max()
        .unwrap_or(now)
        .min(now);
    Some(Decision::ReleaseNodes {
        job_id,
        nodes: releasing.to_vec(),
        end_time,
    })
}

/// For a job that is over or ending: evict the pods still running on its nodes, or wait
/// while evicted ones stop; `None` once none holds a slot.
fn clear_out(job_id: u64, why: &EndReason, holding: &[&Member]) -> Option<Decision> {
    let evict: Vec<String> = holding
        .iter()
        .filter(|m| m.state == MemberState::Live)
        .map(|m| m.name.clone())
        .collect();
    if !evict.is_empty() {
        return Some(Decision::Evict {
            job_id,
            pods: evict,
            why: why.clone(),
        });
    }
    (!holding.is_empty()).then(|| wait("evicted pods are still stopping"))
}

/// When the last member stopped; `now` when none is known (all gone from the API).
fn last_stop(members: &[Member], now: i64) -> i64 {
    members
        .iter()
        .filter_map(|m| match m.state {
            MemberState::Finished { at } => Some(at),
            _ => None,
        })
        .max()
        .unwrap_or(now)
}

fn wait(why: &str) -> Decision {
    Decision::Wait {
        why: why.to_owned(),
    }
}

fn unschedulable(pods: &[&Member], message: String) -> Decision {
    Decision::Unschedulable {
        pods: pods.iter().map(|m| m.name.clone()).collect(),
        message,
    }
}

/// A pod's [`MemberState`]. `node_gone_since` is when its node left the API (`None` while
/// it exists); after `grace` seconds the pod counts as stopped (slurm-bridge #49), before
/// that it keeps its slot.
pub fn member_state(pod: &Pod, node_gone_since: Option<i64>, grace: i64, now: i64) -> MemberState {
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    let finished_at = || {
        status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(|t| t.0.as_second())
            .max()
    };
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return MemberState::Finished {
            at: finished_at().unwrap_or(now),
        };
    }
    if let Some(gone) = node_gone_since
        && now.saturating_sub(gone) >= grace
    {
        return MemberState::Finished {
            at: gone.saturating_add(grace),
        };
    }
    if pod.metadata.deletion_timestamp.is_some() {
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some();
        return if bound && !containers_stopped(pod) {
            MemberState::Terminating
        } else {
            MemberState::Finished {
                at: finished_at().unwrap_or(now),
            }
        };
    }
    MemberState::Live
}

/// Whether the kubelet reported every container of a bound pod stopped: each has a
/// `terminated` state, and there is at least one status to judge from. A kubelet that has
/// not reported yet (no statuses) may be starting them: that is not "stopped", whatever
/// the phase says (kubelets before 1.27 keep `Running` on a deleted pod to the end).
fn containers_stopped(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let all: Vec<_> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .collect();
    !all.is_empty()
        && all
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|st| st.terminated.is_some()))
}

/// A bound pod that vanished from the API before the kubelet reported its containers
/// stopped (a force delete): it holds its slot until `deadline` (its grace period and a
/// margin after it vanished; [`vanish_deadline`]), then counts as stopped then.
pub fn vanished_state(deadline: i64, now: i64) -> MemberState {
    if now < deadline {
        MemberState::Terminating
    } else {
        MemberState::Finished { at: deadline }
    }
}

/// When a bound pod that vanished at `now` with its containers perhaps still running
/// stops holding its slot: the longest its kubelet may take to stop them (the pod's
/// `terminationGracePeriodSeconds`, Kubernetes' default 30, or a longer deletion grace),
/// plus `margin_s`. `None` when the pod's last state shows nothing left running (it never
/// reached a node, or its containers were reported stopped).
pub fn vanish_deadline(last: &Pod, margin_s: i64, now: i64) -> Option<i64> {
    let bound = last
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some();
    let phase = last.status.as_ref().and_then(|s| s.phase.as_deref());
    if !bound || matches!(phase, Some("Succeeded" | "Failed")) || containers_stopped(last) {
        return None;
    }
    let spec_grace = last
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let grace = spec_grace
        .max(last.metadata.deletion_grace_period_seconds.unwrap_or(0))
        .max(0);
    Some(now.saturating_add(grace).saturating_add(margin_s.max(0)))
}

#[cfg(test)]
mod tests;
