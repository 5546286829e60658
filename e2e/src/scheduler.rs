//! A stand-in for the default scheduler (kube-scheduler): pods that name no scheduler
//! (`schedulerName` empty or `default-scheduler`) and have no `nodeName` are bound, through
//! the `binding` subresource, to a node they fit ([`placement`]). The `Scheduled` event and
//! the `PodScheduled` condition follow, as from kube-scheduler; a pod that fits nowhere gets
//! `PodScheduled=False` (reason `Unschedulable`) and a `FailedScheduling` event, and is
//! tried again whenever a node or a pod changes.
//!
//! Pods naming another scheduler (Tandem's bridge: `schedulerName: tandem`) are left alone.
//!
//! Not done (see DIFFERENCES.md): preemption, scoring beyond LeastAllocated, pod
//! (anti-)affinity, topology spread, volume binding, scheduling gates, preferred affinity.

pub mod placement;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::kubelet::admit::{Resources, pod_requests};
use placement::{NodeView, Placement};

/// The name kube-scheduler answers to, and that this stand-in reports as.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// A running scheduler. Dropping it stops it.
pub struct Scheduler {
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Starts scheduling (in the background).
    pub fn start(client: kube::Client) -> Self {
        Self {
            task: tokio::spawn(run(client)),
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the default scheduler is the one to place this pod now.
pub fn wants_scheduling(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let ours = matches!(
        spec.scheduler_name.as_deref(),
        None | Some("") | Some(DEFAULT_SCHEDULER)
    );
    let unbound = spec.node_name.as_deref().is_none_or(str::is_empty);
    let gated = spec
        .scheduling_gates
        .as_ref()
        .is_some_and(|g| !g.is_empty());
    ours && unbound && !gated && pod.metadata.deletion_timestamp.is_none() && !finished(pod)
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn reflect<K>(api: Api<K>, wake: tokio::sync::mpsc::Sender<()>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::debug!(error = %e, "scheduler watch failed; retrying");
            }
            let _ = wake.try_send(());
        }
    });
    (reader, task)
}

/// What the scheduler remembers between passes.
#[derive(Default)]
struct Memory {
    /// Pods bound by this scheduler that the pod cache does not show bound yet (the
    /// scheduler cache's "assumed" pods), by uid: node and requests.
    assumed: HashMap<String, (String, Resources)>,
    /// The last unschedulable message reported per pod uid, so a pass that changes nothing
    /// writes nothing.
    reported: HashMap<String, String>,
}

async fn run(client: kube::Client) {
    let (wake, mut woken) = tokio::sync::mpsc::channel(1);
    let (pods, t1) = reflect(Api::<Pod>::all(client.clone()), wake.clone());
    let (nodes, t2) = reflect(Api::<Node>::all(client.clone()), wake);
    let _watches = Abort(vec![t1, t2]);
    let mut memory = Memory::default();
    // API errors are retried on a tick; otherwise only changes wake the scheduler.
    let mut retry = tokio::time::interval(Duration::from_secs(1));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed = false;
    loop {
        tokio::select! {
            w = woken.recv() => if w.is_none() { return },
            _ = retry.tick(), if failed => {}
        }
        if pods.wait_until_ready().await.is_err() || nodes.wait_until_ready().await.is_err() {
            return;
        }
        failed = !pass(&client, &pods.state(), &nodes.state(), &mut memory).await;
    }
}

struct Abort(Vec<JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// One scheduling pass over every pending pod; false if an API call failed.
async fn pass(
    client: &kube::Client,
    pods: &[std::sync::Arc<Pod>],
    nodes: &[std::sync::Arc<Node>],
    memory: &mut Memory,
) -> bool {
    let uids: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let bound: HashSet<&str> = pods
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
        })
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    memory
        .assumed
        .retain(|uid, _| uids.contains(uid.as_str()) && !bound.contains(uid.as_str()));
    memory.reported.retain(|uid, _| uids.contains(uid.as_str()));

    let mut views: Vec<NodeView<'_>> = nodes
        .iter()
        .map(|n| NodeView {
            node: n.as_ref(),
            used: Resources::new(),
            pods: 0,
        })
        .collect();
    for pod in pods.iter().filter(|p| !finished(p)) {
        let Some(spec) = &pod.spec else { continue };
        let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        charge(&mut views, node, &pod_requests(spec).unwrap_or_default());
    }
    for (node, req) in memory.assumed.values() {
        charge(&mut views, node, req);
    }

    let mut pending: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| wants_scheduling(p))
        .filter(|p| {
            p.metadata
                .uid
                .as_deref()
                .is_some_and(|u| !memory.assumed.contains_key(u))
        })
        .collect();
    // The active queue's order: priority, then age.
    pending.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)),
            p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            p.metadata.name.clone(),
        )
    });
    let mut ok = true;
    for pod in pending {
        let (ns, name, uid) = (
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod.metadata.name.clone().unwrap_or_default(),
            pod.metadata.uid.clone().unwrap_or_default(),
        );
        let spec = pod.spec.clone().unwrap_or_default();
        match placement::place(&spec, &views) {
            Placement::Node(node) => match bind(client, &ns, &name, &uid, &node).await {
                Ok(()) => {
                    tracing::debug!(pod = %format!("{ns}/{name}"), %node, "scheduled");
                    let req = pod_requests(&spec).unwrap_or_default();
                    charge(&mut views, &node, &req);
                    memory.assumed.insert(uid.clone(), (node.clone(), req));
                    memory.reported.remove(&uid);
                    let msg = format!("Successfully assigned {ns}/{name} to {node}");
                    event(client, pod, "Normal", "Scheduled", &msg).await;
                }
                // Bound or deleted meanwhile: the next pass sees it.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "binding failed");
                    ok = false;
                }
            },
            Placement::Unschedulable(msg) => {
                if memory.reported.get(&uid) == Some(&msg) || already_reported(pod, &msg) {
                    memory.reported.insert(uid, msg);
                    continue;
                }
                tracing::debug!(pod = %format!("{ns}/{name}"), %msg, "unschedulable");
                if let Err(e) = mark_unschedulable(client, &ns, &name, &msg).await {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "recording unschedulable failed");
                    ok = false;
                    continue;
                }
                event(client, pod, "Warning", "FailedScheduling", &msg).await;
                memory.reported.insert(uid, msg);
            }
        }
    }
    ok
}

/// Counts a pod's requests against the node it is on.
fn charge(views: &mut [NodeView<'_>], node: &str, req: &Resources) {
    if let Some(v) = views
        .iter_mut()
        .find(|v| v.node.metadata.name.as_deref() == Some(node))
    {
        v.pods += 1;
        for (k, m) in req {
            *v.used.entry(k.clone()).or_default() += m;
        }
    }
}

fn already_reported(pod: &Pod, msg: &str) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
                && c.message.as_deref() == Some(msg)
        })
}

async fn bind(
    client: &kube::Client,
    ns: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        name,
        &PostParams::default(),
        &binding,
    )
    .await
    .map(|_| ())
}

async fn mark_unschedulable(
    client: &kube::Client,
    ns: &str,
    name: &str,
    msg: &str,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg,
        "lastProbeTime": null, "lastTransitionTime": Timestamp::now().to_string(),
    }]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
}

/// Records an Event about the pod as kube-scheduler does (best effort).
async fn event(client: &kube::Client, pod: &Pod, type_: &str, reason: &str, message: &str) {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let now = Timestamp::now();
    let event: Result<Event, _> = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}.{:x}", now.as_nanosecond()), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns,
                           "uid": pod.metadata.uid, "resourceVersion": pod.metadata.resource_version},
        "reason": reason, "message": message, "type": type_,
        "source": {"component": DEFAULT_SCHEDULER},
        "reportingComponent": DEFAULT_SCHEDULER,
        "reportingInstance": format!("{DEFAULT_SCHEDULER}-tandem-e2e"),
        "action": if reason == "Scheduled" { "Binding" } else { "Scheduling" },
        "firstTimestamp": now.to_string(), "lastTimestamp": now.to_string(), "count": 1,
    }));
    let Ok(event) = event else { return };
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = events.create(&PostParams::default(), &event).await {
        tracing::debug!(error = %e, %reason, "recording a scheduler event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_unbound_pods_of_the_default_scheduler_are_taken() {
        let base = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        let with = |patch: serde_json::Value| {
            let mut v = base.clone();
            crate::testkit::merge_json(&mut v, patch);
            pod(v)
        };
        assert!(wants_scheduling(&with(json!({}))));
        assert!(wants_scheduling(&with(
            json!({"spec": {"schedulerName": "default-scheduler"}})
        )));
        assert!(!wants_scheduling(&with(
            json!({"spec": {"schedulerName": "tandem"}})
        )));
        assert!(!wants_scheduling(&with(
            json!({"spec": {"nodeName": "n1"}})
        )));
        assert!(!wants_scheduling(&with(
            json!({"status": {"phase": "Failed"}})
        )));
        assert!(!wants_scheduling(&with(
            json!({"spec": {"schedulingGates": [{"name": "g"}]}})
        )));
        assert!(!wants_scheduling(&with(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
    }
}
