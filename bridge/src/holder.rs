//! The GPU holder: while a pool node with GPUs serves batch work, a pod of the bridge's
//! holds every `nvidia.com/gpu` the node offers, so that a pod reaching the node around the
//! bridge (an exempt namespace, someone bypassing admission) is refused by the kubelet
//! (`OutOfnvidia.com/gpu`) rather than handed devices batch jobs use.
//!
//! The holder of node `N` is `<cluster>-gpu-hold-<N>` in the bridge's cluster namespace
//! (`--cluster-namespace`, the chart's release namespace, where a namespaced Role lets the
//! bridge create pods and nowhere else). It is pinned by `spec.nodeName` (the bridge is the
//! pool's binder, and no scheduler is involved), requests and limits `nvidia.com/gpu` = the
//! node's allocatable, runs `sleep infinity` from `--gpu-holder-image` (the Tandem image,
//! which has coreutils), tolerates the pool taint with every effect (as worker pods do) and
//! carries:
//!
//! - `app.kubernetes.io/managed-by: tandem-bridge`, `app.kubernetes.io/component:
//!   gpu-holder` and `tandem.dev/cluster`: what the admission guard checks, beside the
//!   requester's identity (`TANDEM_BRIDGE_GUARD_HOLDERS`, the bridge's service account;
//!   [`crate::webhook::admit`]). Labels alone admit nothing.
//! - `tandem.dev/managed: "false"`: never a pod the bridge schedules. It does not name the
//!   `tandem` scheduler either, so the scheduler loop's pod watch never sees it and it
//!   takes no placeholder: it runs no user code and is not kube-side occupancy.
//!
//! The mode sync owns it ([`crate::scheduler`], `scheduler/modes.rs`); [`plan`] is its
//! decision, pure:
//!
//! - **batch**, the Node written (`NoExecute` on it), GPUs > 0: the holder exists; one
//!   missing is created, one holding the wrong count or stopped is deleted (and made again
//!   by a later sync). After the patch that flips a node to batch the holder is created at
//!   once.
//! - **kube**: the holder is deleted, and the Node's patch to `kube` (which removes
//!   `NoExecute`, and which the scheduler waits for before it binds a pod there) is held
//!   until the kubelet reported the holder's containers terminated (the devices released).
//!   A holder that vanished from the API before that (a force delete) holds until its grace
//!   period and the vanish margin have passed ([`crate::decide::vanish_deadline`]); a node
//!   whose holder this bridge never saw waits as long from when it first looked (it may be
//!   a predecessor's, force-deleted). Fail closed: nothing unknown counts as released.
//! - A holder the kubelet **rejected** at admission (phase `Failed`, reason
//!   `OutOfnvidia.com/gpu`) means something else holds GPUs on a batch node: the node is
//!   drained in the controller with that reason and a Warning Event is published, once per
//!   holder. The failed holder stays, as the record (`kubectl get pods`); an administrator
//!   who has removed the intruder deletes it, and resumes the node, and a new holder is made.
//! - A node that left the pool (or lost its GPUs) has its holder deleted.
//! - Holders are owned by the TandemCluster they serve: deleting it (uninstalling the
//!   cluster) garbage-collects them. None is made before the cluster object is seen, nor
//!   after it is deleted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;

use crate::labels::{MANAGED_LABEL, POOL_TAINT};
use crate::nodes::{self, Controller, Mode};

/// The extended resource held.
pub const GPU: &str = "nvidia.com/gpu";
/// `app.kubernetes.io/managed-by` of holders.
pub const MANAGER: &str = "tandem-bridge";
/// `app.kubernetes.io/component` of holders.
pub const COMPONENT: &str = "gpu-holder";
/// The holder's `terminationGracePeriodSeconds`: `sleep` ends at SIGTERM.
pub const GRACE_S: i64 = 1;

/// The holder pod's name for `node`: `<cluster>-gpu-hold-<node>`, cut to the 253
/// characters a pod name may have.
pub fn name(cluster: &str, node: &str) -> String {
    let mut n = format!("{cluster}-gpu-hold-{node}");
    n.truncate(253);
    n.trim_end_matches(['-', '.']).to_owned()
}

/// The label selector that lists a cluster's holders.
pub fn selector(cluster: &str) -> String {
    format!(
        "{}={MANAGER},{}={COMPONENT},{}={cluster}",
        tandem_kubeclient::labels::APP_MANAGED_BY,
        tandem_kubeclient::labels::APP_COMPONENT,
        tandem_kubeclient::labels::CLUSTER,
    )
}

/// Whether `pod` is a holder (by its labels; who made it is admission's business).
pub fn is_holder(pod: &Pod) -> bool {
    let l = pod.metadata.labels.as_ref();
    let get = |k: &str| l.and_then(|l| l.get(k)).map(String::as_str);
    get(tandem_kubeclient::labels::APP_MANAGED_BY) == Some(MANAGER)
        && get(tandem_kubeclient::labels::APP_COMPONENT) == Some(COMPONENT)
}

/// The node a holder is pinned to.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Whole GPUs in a quantity's text; 0 when unreadable.
fn whole(q: &str) -> u64 {
    crate::quantity::parse_milli(q)
        .map(crate::quantity::milli_to_units)
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0)
}

/// The node's allocatable `nvidia.com/gpu` (0 when it reports none).
pub fn node_gpus(node: &Node) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU))
        .map_or(0, |q| whole(&q.0))
}

/// The GPUs a holder asks for (its first container's limit, else request).
pub fn held_gpus(pod: &Pod) -> u64 {
    let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return 0;
    };
    let r = c.resources.as_ref();
    r.and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get(GPU))
        .or_else(|| r.and_then(|r| r.requests.as_ref()).and_then(|q| q.get(GPU)))
        .map_or(0, |q| whole(&q.0))
}

/// What [`pod`] builds a holder from.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec<'a> {
    pub cluster: &'a str,
    pub namespace: &'a str,
    pub image: &'a str,
    /// The TandemCluster the holders serve (same namespace): their owner, so that deleting
    /// the cluster (`helm uninstall`) garbage-collects them rather than leaving pods that
    /// hold a node's GPUs for good.
    pub owner: &'a OwnerReference,
}

/// The holder pod of `node`, holding `gpus`.
pub fn pod(s: &Spec<'_>, node: &str, gpus: u64) -> Pod {
    let labels: BTreeMap<&str, &str> = [
        (tandem_kubeclient::labels::APP_MANAGED_BY, MANAGER),
        (tandem_kubeclient::labels::APP_COMPONENT, COMPONENT),
        (tandem_kubeclient::labels::CLUSTER, s.cluster),
        (MANAGED_LABEL, "false"),
    ]
    .into();
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name(s.cluster, node), "namespace": s.namespace, "labels": labels,
                     "ownerReferences": [s.owner]},
        "spec": {
            "nodeName": node,
            // Held for the pod's life: a container that dies is restarted, the devices
            // stay the pod's.
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": GRACE_S,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            // The pool taint with every effect: NoExecute is what a batch node carries.
            "tolerations": [{"key": POOL_TAINT, "operator": "Exists"}],
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "hold",
                "image": s.image,
                "command": ["sleep", "infinity"],
                "resources": {
                    "requests": {GPU: gpus.to_string()},
                    "limits": {GPU: gpus.to_string()},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    });
    serde_json::from_value(v).unwrap_or_default()
}

/// A holder as its kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Admitted or not yet: its devices are, or may soon be, taken.
    Holding,
    /// Refused at admission: something else holds GPUs on the node.
    Rejected { reason: String, message: String },
    /// Every container reported terminated (or the pod is over): the devices are free.
    Stopped,
}

/// The holder's state from its status. Only the kubelet's report counts as stopped.
pub fn state(p: &Pod) -> State {
    let status = p.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref());
    let reason = status.and_then(|s| s.reason.clone()).unwrap_or_default();
    if phase == Some("Failed") && reason.starts_with("OutOf") {
        return State::Rejected {
            message: status.and_then(|s| s.message.clone()).unwrap_or_default(),
            reason,
        };
    }
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return State::Stopped;
    }
    let all: Vec<_> = status
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .collect();
    let stopped = !all.is_empty()
        && all
            .iter()
            .all(|c| c.state.as_ref().is_some_and(|st| st.terminated.is_some()));
    // A running container that stopped and will be restarted still holds the devices
    // (they are the pod's); only a pod being deleted, whose containers all stopped, is done.
    if stopped && p.metadata.deletion_timestamp.is_some() {
        State::Stopped
    } else {
        State::Holding
    }
}

/// What this bridge remembers of a node's holder between syncs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Memory {
    /// Until when a holder that was not seen stopped may still hold the devices: set when
    /// one vanished unstopped, or when the node was first looked at without one.
    pub until: Option<i64>,
}

/// What to do about one node's holder now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Create the holder, holding this many GPUs.
    pub create: Option<u64>,
    /// Delete the holder object (it is not being deleted yet).
    pub delete: bool,
    /// Drain the node in the controller: the holder was refused, with this reason.
    pub drain: Option<State>,
    /// The Node may be written to `kube`: no holder holds its devices.
    pub released: bool,
    /// A sync should come again soon (a holder is being deleted).
    pub waiting: bool,
}

/// What to do about `node`'s holder, given the controller's view, the holder as listed
/// (`None`: none) and what was remembered. `drained`: this holder's refusal was already
/// acted on. Pure.
pub fn plan(
    node: &Node,
    controller: Controller,
    holder: Option<&Pod>,
    memory: &Memory,
    drained: bool,
    cluster: &str,
    now: i64,
) -> Plan {
    let gpus = node_gpus(node);
    let deleting = holder.is_some_and(|h| h.metadata.deletion_timestamp.is_some());
    let st = holder.map(state);
    let mut p = Plan::default();
    match controller {
        Controller::Unknown => {}
        Controller::NotPool => {
            p.delete = holder.is_some() && !deleting;
        }
        Controller::Pool(Mode::Batch) => {
            let written = nodes::plan(node, controller, cluster).is_none();
            match (holder, st.clone()) {
                (None, _) if written && gpus > 0 => p.create = Some(gpus),
                (None, _) => {}
                (Some(_), Some(State::Rejected { .. })) => {
                    if !drained {
                        p.drain = st;
                    }
                }
                (Some(_), Some(State::Stopped)) => {
                    p.delete = !deleting;
                    p.waiting = true;
                }
                (Some(h), _) => {
                    p.delete = !deleting && (gpus == 0 || held_gpus(h) != gpus);
                    p.waiting = deleting || p.delete;
                }
            }
        }
        Controller::Pool(Mode::Kube) => {
            // A Node already written to kube was written after its holder was released.
            let written = nodes::plan(node, controller, cluster).is_none();
            p.delete = holder.is_some() && !deleting;
            p.released = match st {
                Some(State::Stopped | State::Rejected { .. }) => true,
                Some(State::Holding) => false,
                None => gpus == 0 || written || memory.until.is_none_or(|u| now >= u),
            };
            // Until then the sync looks again each tick.
            p.waiting = !p.released;
        }
    }
    p
}

/// `memory` after a listing: `holder` as listed now, `last` as listed before (`None` when
/// this bridge has not looked at the node yet: `first`). `margin_s` is the vanish margin.
pub fn remember(
    memory: &Memory,
    first: bool,
    last: Option<&Pod>,
    holder: Option<&Pod>,
    margin_s: i64,
    now: i64,
) -> Memory {
    match (holder, last) {
        // Present: what it reports decides.
        (Some(_), _) => Memory::default(),
        // Never seen, on the first look: it may be a predecessor's, force-deleted.
        (None, None) if first => Memory {
            until: Some(now + GRACE_S + margin_s.max(0)),
        },
        (None, None) => memory.clone(),
        // Gone since the last look: stopped as reported, or held for its grace period.
        (None, Some(l)) => {
            let stopped = matches!(state(l), State::Stopped | State::Rejected { .. });
            let until = if stopped {
                None
            } else {
                let grace = l
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30)
                    .max(l.metadata.deletion_grace_period_seconds.unwrap_or(0))
                    .max(0);
                Some(now + grace + margin_s.max(0))
            };
            Memory {
                until: until.max(memory.until.filter(|u| *u > now)),
            }
        }
    }
}

/// The drain reason for a refused holder.
pub fn drain_reason(s: &State) -> String {
    match s {
        State::Rejected { reason, message } => {
            let mut r = format!("tandem-bridge: GPU holder refused ({reason})");
            if !message.is_empty() {
                r.push_str(": ");
                r.push_str(message);
            }
            r
        }
        _ => String::new(),
    }
}

/// Why a pod may not be bound on `node` yet, if so: the Node is not written to `kube`
/// (it still carries `NoExecute`, which the kubelet refuses a bridged pod for), or its
/// holder may still hold the devices. `holder_released`: what the last sync's [`plan`]
/// said about the holder (`None`: the node was not planned yet).
pub fn unbindable(node: &Node, holder_released: Option<bool>) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let batch_taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t.key == POOL_TAINT && t.effect == "NoExecute")
        });
    if batch_taint {
        return Some(format!("node {name} is not written to kube mode yet"));
    }
    if node_gpus(node) > 0 && holder_released != Some(true) {
        return Some(format!(
            "node {name}'s GPU holder has not released its GPUs yet"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const BATCH: Controller = Controller::Pool(Mode::Batch);
    const KUBE: Controller = Controller::Pool(Mode::Kube);

    fn node(mode: &str, gpus: u64) -> Node {
        let taints = nodes::pool_taints(
            "pool",
            if mode == "batch" {
                Mode::Batch
            } else {
                Mode::Kube
            },
        );
        serde_json::from_value(json!({
            "metadata": {"name": "k1", "labels": {"tandem.dev/mode": mode}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "8", GPU: gpus.to_string()}},
        }))
        .unwrap()
    }

    fn spec() -> Spec<'static> {
        static OWNER: std::sync::LazyLock<OwnerReference> =
            std::sync::LazyLock::new(|| OwnerReference {
                api_version: "tandem.dev/v1alpha1".into(),
                kind: "TandemCluster".into(),
                name: "pool".into(),
                uid: "tc-uid".into(),
                ..OwnerReference::default()
            });
        Spec {
            cluster: "pool",
            namespace: "tandem",
            image: "img",
            owner: &OWNER,
        }
    }

    /// Deleting the TandemCluster (uninstalling it) must take the holders with it.
    #[test]
    fn a_holder_is_owned_by_its_tandem_cluster() {
        let p = pod(&spec(), "b1", 2);
        let owners = p.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("TandemCluster", "pool", "tc-uid")
        );
        assert_eq!(p.metadata.namespace.as_deref(), Some("tandem"));
    }

    fn holder(gpus: u64, status: serde_json::Value, deleting: bool) -> Pod {
        let mut p = pod(&spec(), "k1", gpus);
        p.status = serde_json::from_value(status).unwrap();
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            p.metadata.deletion_grace_period_seconds = Some(GRACE_S);
        }
        p
    }

    fn running() -> serde_json::Value {
        json!({"phase": "Running", "containerStatuses": [{"name": "hold", "image": "img",
            "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {}}}]})
    }

    fn terminated() -> serde_json::Value {
        json!({"phase": "Running", "containerStatuses": [{"name": "hold", "image": "img",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 143}}}]})
    }

    fn rejected() -> serde_json::Value {
        json!({"phase": "Failed", "reason": "OutOfnvidia.com/gpu",
            "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu"})
    }

    #[test]
    fn the_holder_pod_holds_every_gpu_pinned_and_tolerated() {
        let p = pod(&spec(), "k1", 4);
        assert_eq!(p.metadata.name.as_deref(), Some("pool-gpu-hold-k1"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("tandem"));
        assert!(is_holder(&p));
        assert_eq!(node_of(&p), Some("k1"));
        assert_eq!(held_gpus(&p), 4);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["resources"]["requests"][GPU],
            "4"
        );
        assert_eq!(
            v["spec"]["containers"][0]["command"],
            json!(["sleep", "infinity"])
        );
        assert_eq!(
            v["spec"]["tolerations"],
            json!([{"key": POOL_TAINT, "operator": "Exists"}])
        );
        assert_eq!(v["metadata"]["labels"]["tandem.dev/managed"], "false");
        assert_eq!(v["metadata"]["labels"]["tandem.dev/cluster"], "pool");
        assert!(
            v["spec"].get("schedulerName").is_none(),
            "no scheduler's pod"
        );
        assert_eq!(
            selector("pool"),
            "app.kubernetes.io/managed-by=tandem-bridge,app.kubernetes.io/component=gpu-holder,tandem.dev/cluster=pool"
        );
        assert!(name("c", &"n".repeat(300)).len() <= 253);
    }

    #[test]
    fn gpus_are_read_from_allocatable() {
        assert_eq!(node_gpus(&node("batch", 8)), 8);
        assert_eq!(node_gpus(&node("batch", 0)), 0);
        let mut n = node("batch", 8);
        n.status = None;
        assert_eq!(node_gpus(&n), 0);
    }

    #[test]
    fn a_batch_node_with_gpus_gets_a_holder_once_written() {
        let n = node("batch", 2);
        let p = plan(&n, BATCH, None, &Memory::default(), false, "pool", 0);
        assert_eq!(p.create, Some(2));
        assert!(!p.released, "a batch node is never released");
        // Not written yet (still kube on the Node): the patch goes first.
        let p = plan(
            &node("kube", 2),
            BATCH,
            None,
            &Memory::default(),
            false,
            "pool",
            0,
        );
        assert_eq!(p, Plan::default());
        // Present and holding: nothing to do.
        let h = holder(2, running(), false);
        assert_eq!(
            plan(&n, BATCH, Some(&h), &Memory::default(), false, "pool", 0),
            Plan::default()
        );
        // Holding the wrong count: replaced.
        let h = holder(1, running(), false);
        let p = plan(&n, BATCH, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(p.delete && p.waiting && p.create.is_none());
    }

    #[test]
    fn nodes_without_gpus_get_no_holder() {
        let n = node("batch", 0);
        assert_eq!(
            plan(&n, BATCH, None, &Memory::default(), false, "pool", 0),
            Plan::default()
        );
        // One left from when it had GPUs goes.
        let h = holder(2, running(), false);
        assert!(plan(&n, BATCH, Some(&h), &Memory::default(), false, "pool", 0).delete);
        // A kube flip of a node without GPUs needs no holder to go.
        let p = plan(
            &n,
            KUBE,
            None,
            &Memory { until: Some(100) },
            false,
            "pool",
            0,
        );
        assert!(p.released);
    }

    #[test]
    fn a_flip_to_kube_waits_until_the_kubelet_reports_the_holder_stopped() {
        let n = node("batch", 2);
        // Holding: deleted, not released.
        let h = holder(2, running(), false);
        let p = plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(p.delete && !p.released && p.waiting);
        // Being deleted, still running: not deleted again, not released.
        let h = holder(2, running(), true);
        let p = plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(!p.delete && !p.released && p.waiting);
        // Being deleted, never started (no status): not released.
        let h = holder(2, json!({"phase": "Pending"}), true);
        assert!(!plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0).released);
        // The kubelet reported its containers terminated: released.
        let h = holder(2, terminated(), true);
        let p = plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(p.released && !p.delete);
        // Terminated but not being deleted (restartPolicy Always restarts it): holding.
        let h = holder(2, terminated(), false);
        let p = plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(p.delete && !p.released);
        // Gone, as the bridge last saw it stopped: released.
        let p = plan(&n, KUBE, None, &Memory::default(), false, "pool", 0);
        assert!(p.released);
        // Gone before it was reported stopped: only past the remembered deadline.
        let m = Memory { until: Some(50) };
        assert!(
            plan(&node("kube", 2), KUBE, None, &m, false, "pool", 0).released,
            "a Node already written to kube was written after its holder went"
        );
        assert!(!plan(&n, KUBE, None, &m, false, "pool", 49).released);
        assert!(plan(&n, KUBE, None, &m, false, "pool", 50).released);
        // Unknown controller view: nothing at all.
        let h = holder(2, running(), false);
        assert_eq!(
            plan(&n, Controller::Unknown, Some(&h), &m, false, "pool", 0),
            Plan::default()
        );
    }

    #[test]
    fn the_memory_fails_closed() {
        let running_h = holder(2, running(), true);
        let stopped_h = holder(2, terminated(), true);
        // First look, no holder: a predecessor's may have been force-deleted.
        let m = remember(&Memory::default(), true, None, None, 10, 100);
        assert_eq!(m.until, Some(100 + GRACE_S + 10));
        // Later looks keep it.
        assert_eq!(remember(&m, false, None, None, 10, 105), m);
        // Seen: the report decides, nothing is remembered.
        assert_eq!(
            remember(&m, false, None, Some(&running_h), 10, 105),
            Memory::default()
        );
        // Vanished while running: its grace and the margin.
        let m = remember(&Memory::default(), false, Some(&running_h), None, 10, 200);
        assert_eq!(m.until, Some(200 + GRACE_S + 10));
        // Vanished after it was reported stopped: released now.
        let m = remember(&Memory::default(), false, Some(&stopped_h), None, 10, 200);
        assert_eq!(m.until, None);
    }

    #[test]
    fn a_refused_holder_drains_the_node_once() {
        let n = node("batch", 2);
        let h = holder(2, rejected(), false);
        let p = plan(&n, BATCH, Some(&h), &Memory::default(), false, "pool", 0);
        let s = p.drain.clone().unwrap();
        assert!(
            !p.delete && p.create.is_none(),
            "the failed holder stays as the record"
        );
        assert_eq!(
            drain_reason(&s),
            "tandem-bridge: GPU holder refused (OutOfnvidia.com/gpu): Pod was rejected: Node didn't have enough resource: nvidia.com/gpu"
        );
        assert!(!drain_reason(&s).starts_with(tandem_kubeclient::labels::DRAIN_REASON_PREFIX));
        let p = plan(&n, BATCH, Some(&h), &Memory::default(), true, "pool", 0);
        assert_eq!(p, Plan::default(), "drained once");
        // In kube mode a refused holder holds nothing: released, and deleted.
        let p = plan(&n, KUBE, Some(&h), &Memory::default(), false, "pool", 0);
        assert!(p.released && p.delete && p.drain.is_none());
    }

    #[test]
    fn a_node_leaving_the_pool_loses_its_holder() {
        let n = node("batch", 2);
        let h = holder(2, running(), false);
        let p = plan(
            &n,
            Controller::NotPool,
            Some(&h),
            &Memory::default(),
            false,
            "pool",
            0,
        );
        assert!(p.delete);
    }

    #[test]
    fn binding_waits_for_the_kube_write_and_the_holder() {
        assert!(
            unbindable(&node("batch", 0), Some(true))
                .unwrap()
                .contains("not written")
        );
        assert!(
            unbindable(&node("kube", 2), None)
                .unwrap()
                .contains("GPU holder")
        );
        assert!(unbindable(&node("kube", 2), Some(false)).is_some());
        assert_eq!(unbindable(&node("kube", 2), Some(true)), None);
        assert_eq!(unbindable(&node("kube", 0), None), None);
    }
}
