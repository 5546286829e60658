//! Worker-set decisions, pure: (desired, observed pods, observed batch nodes, now) -> [`Plan`].
//!
//! The reconcile shell gathers the observation, calls [`plan`], applies the actions in order
//! (stopping at the first failure) and records the events. Nothing here does I/O, so every
//! decision is a plain unit test.
//!
//! # Rules
//!
//! - **Scale out**: pods go first to the set's former nodes that lack a pod (a lost pod comes
//!   back on its node, so its batch node returns under the same name), then to free eligible
//!   Kubernetes nodes. One worker per Kubernetes node.
//! - **Scale in**: victims are, in order, pods whose worker never started, idle workers, then
//!   the workers whose jobs end soonest (jobs without a time limit last). A victim is marked
//!   (pod annotation, so the deadline survives operator restarts), drained in the controller
//!   with a reason starting `tandem-operator:`, and its pod deleted only when the controller
//!   reports the node drained with no job, or when the drain deadline passed (the node is
//!   then set DOWN first: batch jobs are requeued or end NODE_FAIL per `--requeue`). Bridged
//!   pods do not wait for the deadline: the drain itself asks the node back from their
//!   placeholder, the bridge evicts them there (their PodDisruptionBudgets honoured up to
//!   its eviction timeout), and the node is free once the kubelet reports them gone; the
//!   group keeps its other nodes.
//! - **Fail closed** (slurm-operator PR #79): when the controller lookup fails, no pod whose
//!   worker may hold jobs is deleted; only pods that never started are.
//! - **Own drains only**: a drain is cleared only if its reason starts with the operator's
//!   prefix; an administrator's drain stays.
//! - **Rollout**: pods rendered from an older template are drained up to `maxUnavailable` at
//!   a time and replaced on the same node once idle: no running job is cut short.
//! - **Removal**: a former node with no pod and no further use is removed from the
//!   controller. One that still shows jobs is set DOWN first, and removed on a later pass
//!   once the controller reports it free: a placeholder of bridged pods keeps a DOWN node
//!   until the bridge reports the pods gone, and the controller refuses its removal until
//!   then (the operator waits, see [`on_failure`]).
//! - **Registration**: a running worker whose node is not registered and up yet is looked
//!   at again every [`DRAIN_POLL_S`] (node states are not watched), so `readyReplicas`
//!   follows registration without waiting for another pod event.

use std::collections::{BTreeMap, BTreeSet};

use crate::labels::DRAIN_REASON_PREFIX;

/// Why a pod was chosen to leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DrainFor {
    ScaleIn,
    Rollout,
    Delete,
}

impl DrainFor {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainFor::ScaleIn => "scale-in",
            DrainFor::Rollout => "rollout",
            DrainFor::Delete => "delete",
        }
    }

    pub fn parse(s: &str) -> Option<DrainFor> {
        match s {
            "scale-in" => Some(DrainFor::ScaleIn),
            "rollout" => Some(DrainFor::Rollout),
            "delete" => Some(DrainFor::Delete),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Not yet running a process (unscheduled, pulling, or waiting to start).
    Pending,
    Running,
    /// Succeeded or Failed: the worker is gone and the pod must be replaced.
    Ended,
}

/// A worker pod as the plan needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerPod {
    pub name: String,
    /// `spec.nodeName` or the node its affinity pins it to: its batch node's name.
    pub node: String,
    pub phase: PodPhase,
    /// Being deleted (deletionTimestamp set).
    pub terminating: bool,
    pub template_hash: String,
    /// Marked to leave: since when (unix seconds) and why.
    pub drain: Option<(i64, DrainFor)>,
}

/// Slurm's base node states, as the controller reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    Idle,
    Mixed,
    Allocated,
    Down,
    Drained,
    Draining,
    Unknown,
}

impl NodeState {
    pub fn parse(s: &str) -> NodeState {
        match s.to_ascii_uppercase().as_str() {
            "IDLE" => NodeState::Idle,
            "MIXED" => NodeState::Mixed,
            "ALLOCATED" => NodeState::Allocated,
            "DOWN" => NodeState::Down,
            "DRAINED" => NodeState::Drained,
            "DRAINING" => NodeState::Draining,
            _ => NodeState::Unknown,
        }
    }
}

/// A batch node as the controller reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNode {
    pub name: String,
    pub state: NodeState,
    /// The drain flag (a DOWN node may be drained too).
    pub drain: bool,
    pub reason: String,
    pub running_jobs: u32,
    /// Latest expected end of its running jobs (unix seconds); `None` when a job has no
    /// time limit (sorts last among busy nodes).
    pub busy_until: Option<i64>,
    pub kube_mode: bool,
}

impl BatchNode {
    /// Drained by this operator (the only drains it may clear).
    pub fn drained_by_operator(&self) -> bool {
        self.drain && self.reason.starts_with(DRAIN_REASON_PREFIX)
    }
}

/// The controller's answer, or why there is none.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    Nodes(BTreeMap<String, BatchNode>),
    Failed(String),
}

impl Lookup {
    pub fn from_nodes(nodes: impl IntoIterator<Item = BatchNode>) -> Lookup {
        Lookup::Nodes(nodes.into_iter().map(|n| (n.name.clone(), n)).collect())
    }

    fn get(&self, name: &str) -> Option<&BatchNode> {
        match self {
            Lookup::Nodes(m) => m.get(name),
            Lookup::Failed(_) => None,
        }
    }

    fn ok(&self) -> bool {
        matches!(self, Lookup::Nodes(_))
    }
}

/// What the spec asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub replicas: u32,
    pub template_hash: String,
    pub drain_deadline_s: i64,
    pub max_unavailable: u32,
    /// The set is being deleted: every worker leaves.
    pub deleting: bool,
    /// `namespace/name`, for drain reasons.
    pub set: String,
}

/// Everything observed for one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub pods: Vec<WorkerPod>,
    pub nodes: Lookup,
    /// Batch node names the set had workers on (from its status).
    pub members: Vec<String>,
    /// Eligible Kubernetes nodes with no Tandem worker on them, in preference order.
    pub free_nodes: Vec<String>,
    pub now: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    CreatePod {
        node: String,
    },
    /// Annotate the pod as leaving.
    Mark {
        pod: String,
        why: DrainFor,
        since: i64,
    },
    /// Remove the annotation (scale-out cancelled a scale-in).
    Unmark {
        pod: String,
    },
    Drain {
        node: String,
        reason: String,
    },
    /// Clear a drain this operator set.
    Resume {
        node: String,
    },
    /// Set the node DOWN: its batch jobs are requeued (or end NODE_FAIL when they may not
    /// be); a placeholder of bridged pods ends NODE_FAIL but keeps the node until the bridge
    /// reports its pods gone.
    Down {
        node: String,
        reason: String,
    },
    DeletePod {
        pod: String,
    },
    /// Remove the node from the controller.
    RemoveNode {
        node: String,
    },
    /// Drop a former node from `status.members` (the controller does not know it).
    Forget {
        node: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// A Kubernetes Event to record about the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// PascalCase.
    pub reason: &'static str,
    pub note: String,
    /// The object the decision is about besides the set itself (the Event's `related`).
    /// Event recorders fold Events with the same reason about the same object into one
    /// series that keeps only the first note; naming the pod or node keeps one Event per
    /// victim, drain and removal.
    pub related: Option<Related>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Related {
    /// A pod in the set's namespace.
    Pod(String),
    /// A Kubernetes node (a worker's batch node has its node's name).
    Node(String),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub events: Vec<Event>,
    /// What the set waits for (Progressing), one line each.
    pub waiting: Vec<String>,
    /// What is wrong (Degraded), one line each.
    pub problems: Vec<String>,
    /// When to look again even if nothing changes (a drain deadline, a drain to watch).
    pub requeue_after_s: Option<i64>,
    /// Deleting, and nothing is left: the finalizer may go.
    pub finished: bool,
}

impl Plan {
    fn event(&mut self, type_: EventType, reason: &'static str, note: String) {
        self.events.push(Event {
            type_,
            reason,
            note,
            related: None,
        });
    }

    fn event_about(
        &mut self,
        related: Related,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        self.events.push(Event {
            type_,
            reason,
            note,
            related: Some(related),
        });
    }

    fn requeue(&mut self, after_s: i64) {
        let after_s = after_s.max(1);
        self.requeue_after_s = Some(self.requeue_after_s.map_or(after_s, |r| r.min(after_s)));
    }
}

/// How often a drain in progress is looked at (node state changes are not watched).
pub const DRAIN_POLL_S: i64 = 5;

pub fn drain_reason(why: DrainFor, set: &str) -> String {
    match why {
        DrainFor::ScaleIn => format!("{DRAIN_REASON_PREFIX} scale-in of workerset {set}"),
        DrainFor::Rollout => format!("{DRAIN_REASON_PREFIX} new template for workerset {set}"),
        DrainFor::Delete => format!("{DRAIN_REASON_PREFIX} workerset {set} deleted"),
    }
}

/// Victim order: lower sorts first. (never started, idle, soonest end, name).
fn victim_rank(pod: &WorkerPod, nodes: &Lookup) -> (u8, i64, String) {
    if pod.phase != PodPhase::Running {
        return (0, 0, pod.name.clone());
    }
    match nodes.get(&pod.node) {
        // Running but not registered: holds no job.
        None => (1, 0, pod.name.clone()),
        Some(n) if n.running_jobs == 0 => (1, 0, pod.name.clone()),
        Some(n) => (2, n.busy_until.unwrap_or(i64::MAX), pod.name.clone()),
    }
}

pub fn plan(desired: &Desired, obs: &Observed) -> Plan {
    let mut p = Plan::default();
    let now = obs.now;
    if let Lookup::Failed(why) = &obs.nodes {
        p.problems.push(format!(
            "controller lookup failed ({why}): no worker that may hold jobs is removed"
        ));
        p.requeue(DRAIN_POLL_S);
    }

    // Ended pods are replaced: delete them, they count as gone.
    for pod in &obs.pods {
        if pod.phase == PodPhase::Ended && !pod.terminating {
            p.actions.push(Action::DeletePod {
                pod: pod.name.clone(),
            });
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Warning,
                "WorkerEnded",
                format!("worker pod {} ended; replacing it", pod.name),
            );
        }
    }
    let live: Vec<&WorkerPod> = obs
        .pods
        .iter()
        .filter(|x| !x.terminating && x.phase != PodPhase::Ended)
        .collect();
    let occupied: BTreeSet<&str> = obs.pods.iter().map(|x| x.node.as_str()).collect();

    let target = if desired.deleting {
        0
    } else {
        desired.replicas as usize
    };
    let leaving =
        |x: &WorkerPod| matches!(x.drain, Some((_, DrainFor::ScaleIn | DrainFor::Delete)));
    // Pods that stay (rollout victims stay: they are replaced on their node).
    let mut staying: Vec<&WorkerPod> = live.iter().copied().filter(|x| !leaving(x)).collect();
    let mut victims: Vec<(&WorkerPod, i64, DrainFor)> = live
        .iter()
        .filter_map(|x| match x.drain {
            Some((since, why)) if leaving(x) => Some((*x, since, why)),
            _ => None,
        })
        .collect();

    // === scale in: choose victims ===
    if staying.len() > target {
        let why = if desired.deleting {
            DrainFor::Delete
        } else {
            DrainFor::ScaleIn
        };
        let excess = staying.len() - target;
        let mut ranked: Vec<&WorkerPod> = staying.clone();
        ranked.sort_by_key(|x| victim_rank(x, &obs.nodes));
        let mut chosen = Vec::new();
        for pod in ranked {
            if chosen.len() == excess {
                break;
            }
            // Ranking running workers needs the controller's view; never-started pods don't.
            if pod.phase == PodPhase::Running && !obs.nodes.ok() {
                continue;
            }
            chosen.push(pod);
        }
        if chosen.len() < excess {
            p.waiting.push(format!(
                "{} more workers to choose for {} once the controller answers",
                excess - chosen.len(),
                why.as_str()
            ));
        }
        for pod in chosen {
            p.actions.push(Action::Mark {
                pod: pod.name.clone(),
                why,
                since: now,
            });
            let detail = match obs.nodes.get(&pod.node) {
                _ if pod.phase != PodPhase::Running => "its worker never started".to_owned(),
                None => "not registered".to_owned(),
                Some(n) if n.running_jobs == 0 => "idle".to_owned(),
                Some(n) => format!(
                    "{} running job(s), ending {}",
                    n.running_jobs,
                    n.busy_until
                        .map_or("with no time limit".to_owned(), |t| format!("by {t}"))
                ),
            };
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Normal,
                "VictimChosen",
                format!(
                    "worker {} (node {}) chosen for {}: {detail}",
                    pod.name,
                    pod.node,
                    why.as_str()
                ),
            );
            staying.retain(|x| x.name != pod.name);
            victims.push((pod, now, why));
        }
    }

    // === scale out: cancel scale-ins first, then create ===
    let mut deficit = target.saturating_sub(staying.len());
    if deficit > 0 && !desired.deleting {
        // Cancel the latest-marked scale-ins first (least drained).
        let mut cancellable: Vec<(&WorkerPod, i64)> = victims
            .iter()
            .filter(|(_, _, why)| *why == DrainFor::ScaleIn)
            .map(|(x, since, _)| (*x, *since))
            .collect();
        cancellable.sort_by_key(|(x, since)| (std::cmp::Reverse(*since), x.name.clone()));
        for (pod, _) in cancellable.into_iter().take(deficit) {
            p.actions.push(Action::Unmark {
                pod: pod.name.clone(),
            });
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Normal,
                "ScaleInCancelled",
                format!("worker {} stays: replicas raised again", pod.name),
            );
            victims.retain(|(x, _, _)| x.name != pod.name);
            staying.push(pod);
            deficit -= 1;
        }
    }
    let mut created = Vec::new();
    if deficit > 0 && !desired.deleting {
        let former = obs
            .members
            .iter()
            .filter(|m| !occupied.contains(m.as_str()))
            .cloned();
        let fresh = obs
            .free_nodes
            .iter()
            .filter(|n| !occupied.contains(n.as_str()) && !obs.members.contains(n))
            .cloned();
        let mut replaced = 0;
        for node in former.chain(fresh) {
            if created.len() == deficit {
                break;
            }
            if obs.members.contains(&node) {
                replaced += 1;
                p.event_about(
                    Related::Node(node.clone()),
                    EventType::Normal,
                    "PodReplaced",
                    format!("worker for node {node} is gone; creating a new pod there"),
                );
            }
            p.actions.push(Action::CreatePod { node: node.clone() });
            created.push(node);
        }
        let fresh_count = created.len() - replaced;
        if fresh_count > 0 {
            p.event(
                EventType::Normal,
                "ScaledOut",
                format!("creating {fresh_count} worker pod(s)"),
            );
        }
        if created.len() < deficit {
            let msg = format!(
                "{} worker(s) cannot be placed: no free Kubernetes node fits the set",
                deficit - created.len()
            );
            p.event(EventType::Warning, "NoNodeAvailable", msg.clone());
            p.problems.push(msg);
        }
    }

    // === rollout of a new template ===
    if !desired.deleting {
        let rolling = staying
            .iter()
            .filter(|x| matches!(x.drain, Some((_, DrainFor::Rollout))))
            .count();
        let not_ready = staying
            .iter()
            .filter(|x| x.drain.is_none() && !ready(x, &obs.nodes))
            .count();
        let budget = (desired.max_unavailable as usize).saturating_sub(rolling + not_ready);
        let mut outdated: Vec<&WorkerPod> = staying
            .iter()
            .copied()
            .filter(|x| x.drain.is_none() && x.template_hash != desired.template_hash)
            .collect();
        if !outdated.is_empty() {
            if obs.nodes.ok() {
                outdated.sort_by_key(|x| victim_rank(x, &obs.nodes));
                for pod in outdated.iter().take(budget) {
                    p.actions.push(Action::Mark {
                        pod: pod.name.clone(),
                        why: DrainFor::Rollout,
                        since: now,
                    });
                    p.event_about(
                        Related::Pod(pod.name.clone()),
                        EventType::Normal,
                        "RolloutDrain",
                        format!(
                            "worker {} runs an older template: draining it, its pod is replaced once idle",
                            pod.name
                        ),
                    );
                    victims.push((pod, now, DrainFor::Rollout));
                }
            }
            p.waiting.push(format!(
                "{} worker(s) still on an older template",
                outdated.len()
            ));
        }
        // Rollout victims stay counted in `staying`, but are drained below like the others.
        for x in staying.iter() {
            if let Some((since, DrainFor::Rollout)) = x.drain {
                victims.push((x, since, DrainFor::Rollout));
            }
        }
    }

    // === drain victims, delete when drained or past the deadline ===
    for (pod, since, why) in &victims {
        if pod.phase != PodPhase::Running {
            p.actions.push(Action::DeletePod {
                pod: pod.name.clone(),
            });
            continue;
        }
        let Lookup::Nodes(nodes) = &obs.nodes else {
            p.waiting.push(format!(
                "worker {} waits for the controller before it is removed",
                pod.name
            ));
            continue;
        };
        let Some(node) = nodes.get(&pod.node) else {
            // Never registered: holds no job.
            p.actions.push(Action::DeletePod {
                pod: pod.name.clone(),
            });
            continue;
        };
        if node.running_jobs == 0 && (node.drain || node.state == NodeState::Down) {
            p.actions.push(Action::DeletePod {
                pod: pod.name.clone(),
            });
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Normal,
                "WorkerDrained",
                format!(
                    "node {} is drained and idle; deleting pod {}",
                    node.name, pod.name
                ),
            );
            continue;
        }
        if !node.drain {
            p.actions.push(Action::Drain {
                node: node.name.clone(),
                reason: drain_reason(*why, &desired.set),
            });
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Normal,
                "DrainStarted",
                format!(
                    "draining node {} ({}); its pod goes when its jobs end or after {}s",
                    node.name,
                    why.as_str(),
                    desired.drain_deadline_s
                ),
            );
        }
        if node.running_jobs == 0 {
            // Drain just asked for; delete on the next look.
            p.requeue(1);
            continue;
        }
        let deadline = since.saturating_add(desired.drain_deadline_s);
        if now >= deadline {
            p.actions.push(Action::Down {
                node: node.name.clone(),
                reason: format!(
                    "{DRAIN_REASON_PREFIX} drain deadline passed for workerset {}",
                    desired.set
                ),
            });
            p.actions.push(Action::DeletePod {
                pod: pod.name.clone(),
            });
            p.event_about(
                Related::Pod(pod.name.clone()),
                EventType::Warning,
                "DrainDeadlinePassed",
                format!(
                    "node {} still ran {} job(s) {}s after its drain began: setting it DOWN ({}) and deleting pod {}",
                    node.name,
                    node.running_jobs,
                    desired.drain_deadline_s,
                    fate_of_jobs(node),
                    pod.name
                ),
            );
        } else {
            p.waiting.push(format!(
                "node {} drains: {} job(s) running",
                node.name, node.running_jobs
            ));
            p.requeue((deadline - now).min(DRAIN_POLL_S));
        }
    }

    // === clear the operator's own drains on workers that stay ===
    if let Lookup::Nodes(nodes) = &obs.nodes {
        for pod in &staying {
            if pod.drain.is_some() || pod.phase != PodPhase::Running {
                continue;
            }
            if let Some(n) = nodes.get(&pod.node)
                && n.drained_by_operator()
                && n.state != NodeState::Down
            {
                p.actions.push(Action::Resume {
                    node: n.name.clone(),
                });
                p.event_about(
                    Related::Node(n.name.clone()),
                    EventType::Normal,
                    "DrainCleared",
                    format!("node {} is back in service", n.name),
                );
            }
        }
    }

    // === running workers not (yet) up in the controller: node registration is not
    // watched, so look again rather than report them unready until the next pod event ===
    if !desired.deleting && obs.nodes.ok() {
        let unready: Vec<&str> = staying
            .iter()
            .filter(|x| x.drain.is_none() && x.phase == PodPhase::Running && !ready(x, &obs.nodes))
            .map(|x| x.name.as_str())
            .collect();
        if !unready.is_empty() {
            p.waiting.push(format!(
                "worker(s) {} running but not registered and up in the controller yet",
                unready.join(", ")
            ));
            p.requeue(DRAIN_POLL_S);
        }
    }

    // === former nodes with no pod and no use: remove from the controller ===
    let mut left = 0;
    for m in &obs.members {
        if occupied.contains(m.as_str()) || created.contains(m) {
            if occupied.contains(m.as_str()) {
                left += 1;
            }
            continue;
        }
        match &obs.nodes {
            Lookup::Failed(_) => left += 1,
            Lookup::Nodes(nodes) => match nodes.get(m) {
                None => p.actions.push(Action::Forget { node: m.clone() }),
                Some(n) if n.running_jobs > 0 && n.state == NodeState::Down => {
                    // DOWN already, yet still holding jobs: a bridged pods' placeholder
                    // keeps its nodes until the bridge reports the pods gone (the controller
                    // refuses to remove the node before then). Asking again every pass would
                    // only fail; look again until the node is free.
                    left += 1;
                    p.waiting.push(format!(
                        "node {m} is DOWN with its pod gone and still holds {} job(s) ({}): removed once they are gone",
                        n.running_jobs,
                        if n.kube_mode {
                            "bridged pods being evicted"
                        } else {
                            "jobs ending"
                        }
                    ));
                    p.requeue(DRAIN_POLL_S);
                }
                Some(n) if n.running_jobs > 0 => {
                    // A lost pod's node the controller has not timed out yet: DOWN ends or
                    // hands back what it runs; it is removed on a later pass, once the
                    // controller reports it free (removal now would be refused while a
                    // placeholder holds it).
                    left += 1;
                    p.actions.push(Action::Down {
                        node: m.clone(),
                        reason: format!("{DRAIN_REASON_PREFIX} worker pod gone"),
                    });
                    p.event_about(
                        Related::Node(m.clone()),
                        EventType::Warning,
                        "WorkerPodLost",
                        format!(
                            "node {m} lost its pod with {} job(s) running: setting it DOWN; {}; it leaves the controller once free",
                            n.running_jobs,
                            fate_of_jobs(n)
                        ),
                    );
                    p.requeue(1);
                }
                Some(_) => {
                    p.actions.push(Action::RemoveNode { node: m.clone() });
                    p.event_about(
                        Related::Node(m.clone()),
                        EventType::Normal,
                        "NodeRemoved",
                        format!("node {m} removed from the controller"),
                    );
                }
            },
        }
    }
    if desired.deleting {
        let pods_left = obs.pods.len();
        if pods_left == 0 && left == 0 && obs.nodes.ok() {
            p.finished = true;
        } else {
            p.waiting.push(format!(
                "deleting: {pods_left} pod(s) and {left} node(s) left"
            ));
            p.requeue(DRAIN_POLL_S);
        }
    }
    if created.len() < deficit || !victims.is_empty() {
        p.requeue(DRAIN_POLL_S);
    }
    p
}

/// What setting `node` DOWN does to what it runs, for Events. A node serves one mode at a
/// time, so its mode says which kind of work is there.
fn fate_of_jobs(node: &BatchNode) -> &'static str {
    if node.kube_mode {
        "the bridge evicts its bridged pods, and the node stays held until they are gone"
    } else {
        "its batch jobs are requeued, or end NODE_FAIL unless they may be requeued (--requeue)"
    }
}

/// What the shell does when an action fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnFailure {
    /// Stop the pass here (the rest depends on it); report it and retry next pass.
    Stop,
    /// Not an error: the controller says "not yet". Count it as waiting (this line), look
    /// again in [`DRAIN_POLL_S`], and go on with the rest of the pass.
    Wait(String),
}

/// How to treat a failed `action`. `refused`: the controller answered FailedPrecondition
/// (it refuses the request in the node's present state), `detail` its message.
///
/// A RemoveNode refused that way is a node still holding work the controller must see end
/// first (a placeholder whose bridged pods are not gone yet, or a job that started there
/// after the lookup): waiting is the answer, and failing the pass would hold back every
/// other worker's actions and publish a warning on every pass.
pub fn on_failure(action: &Action, refused: bool, detail: &str) -> OnFailure {
    match action {
        Action::RemoveNode { node } if refused => {
            OnFailure::Wait(format!("node {node} not removed yet: {detail}"))
        }
        _ => OnFailure::Stop,
    }
}

/// A worker counts as ready when its pod runs and its batch node is registered and up.
pub fn ready(pod: &WorkerPod, nodes: &Lookup) -> bool {
    pod.phase == PodPhase::Running
        && nodes
            .get(&pod.node)
            .is_some_and(|n| !matches!(n.state, NodeState::Down | NodeState::Unknown))
}

#[cfg(test)]
mod tests;
