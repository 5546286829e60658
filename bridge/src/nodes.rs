//! Node modes in Kubernetes: every pool node carries the taint
//! `tandem.dev/pool=<cluster>:NoSchedule` (the default scheduler leaves it alone) and the
//! label `tandem.dev/mode=batch|kube`, kept in step with the controller, so
//! `kubectl get nodes -L tandem.dev/mode` shows the time partition.
//!
//! While in `batch` mode a pool node also carries `tandem.dev/pool=<cluster>:NoExecute`
//! (same key, second effect). `NoSchedule` only keeps schedulers away; a pod that reached
//! the node another way (a preset `spec.nodeName`, a bind by someone else, a pod that was
//! there before the node joined the pool) would keep running next to batch jobs. With
//! `NoExecute`, Kubernetes' taint manager evicts every pod without a matching toleration,
//! and the kubelet refuses to admit new ones. Bridged pods tolerate `NoSchedule` only (the
//! webhook adds exactly that), so they are evicted too should one ever be on a batch node;
//! Tandem's worker pods must tolerate the key with every effect (`operator: Exists`, no
//! effect). In `kube` mode the `NoExecute` taint is removed: the bridge binds pods there.
//!
//! [`plan`] is pure: from the Node as observed and the controller's view of it, what to
//! change (nothing when in step, so no request storm) and whether the change is a flip worth
//! an Event. [`json_patch()`] turns a plan into a JSON patch that tests the observed
//! `resourceVersion` first, so a concurrent writer's taints are never lost: the patch fails,
//! the next watch event brings the new Node, and the plan is made again.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};

use crate::labels::{MODE_LABEL, POOL_TAINT};

/// A node's mode, as the controller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Batch,
    Kube,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Batch => "batch",
            Mode::Kube => "kube",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "batch" => Some(Mode::Batch),
            "kube" => Some(Mode::Kube),
            _ => None,
        }
    }
}

/// What the controller says about a Kubernetes node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// The controller was asked and has no node of that name: not a pool node.
    NotPool,
    /// The controller could not be asked, or answered no mode: change nothing.
    Unknown,
    /// A pool node in this mode.
    Pool(Mode),
}

/// What to write on a node. `None` fields are left as they are.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The mode label's new value.
    pub label: Option<Mode>,
    /// The node's whole new taint list (other taints kept, in their order).
    pub taints: Option<Vec<Taint>>,
    /// A flip from one mode to the other: publish `ModeChanged`.
    pub flip: Option<(Mode, Mode)>,
}

/// The change that brings `node` in step with `controller`; `None` when it already is,
/// when it is not a pool node, or when the controller's view is unknown (fail closed).
pub fn plan(node: &Node, controller: Controller, cluster: &str) -> Option<Plan> {
    let Controller::Pool(want) = controller else {
        return None;
    };
    let current = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MODE_LABEL))
        .map(String::as_str);
    let label = (current != Some(want.as_str())).then_some(want);
    let flip = current
        .and_then(Mode::parse)
        .filter(|was| *was != want)
        .map(|was| (was, want));
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let wanted = pool_taints(cluster, want);
    let same = |a: &Taint, b: &Taint| a.key == b.key && a.value == b.value && a.effect == b.effect;
    let pool: Vec<&Taint> = taints.iter().filter(|t| t.key == POOL_TAINT).collect();
    let in_step =
        pool.len() == wanted.len() && wanted.iter().all(|w| pool.iter().any(|t| same(t, w)));
    let taints = if in_step {
        None
    } else {
        // A taint of ours already there is kept as it is (its `timeAdded`, which the taint
        // manager reads, included); the others of the key are another cluster's or stale.
        let wanted: Vec<Taint> = wanted
            .into_iter()
            .map(|w| {
                pool.iter()
                    .find(|t| same(t, &w))
                    .map_or(w, |t| (*t).clone())
            })
            .collect();
        let mut kept: Vec<Taint> = taints.into_iter().filter(|t| t.key != POOL_TAINT).collect();
        kept.extend(wanted);
        Some(kept)
    };
    if label.is_none() && taints.is_none() {
        return None;
    }
    Some(Plan {
        label,
        taints,
        flip,
    })
}

/// `tandem.dev/pool=<cluster>:NoSchedule`: on every pool node, in either mode.
pub fn pool_taint(cluster: &str) -> Taint {
    Taint {
        key: POOL_TAINT.to_owned(),
        value: Some(cluster.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
}

/// `tandem.dev/pool=<cluster>:NoExecute`: on a pool node while it is in `batch` mode, so
/// that no pod without Tandem's toleration stays on it.
pub fn batch_taint(cluster: &str) -> Taint {
    Taint {
        effect: "NoExecute".to_owned(),
        ..pool_taint(cluster)
    }
}

/// The pool taints a node in `mode` carries, in the order they are written.
pub fn pool_taints(cluster: &str, mode: Mode) -> Vec<Taint> {
    match mode {
        Mode::Kube => vec![pool_taint(cluster)],
        Mode::Batch => vec![pool_taint(cluster), batch_taint(cluster)],
    }
}

/// Whether `node` is a pool node of some Tandem cluster: it carries the mode label or a
/// taint with the pool key (whatever its value). Admission keeps other pods off such nodes.
/// A node the bridge has not marked yet is not recognised; it gets the marks at the bridge's
/// next node sync, and its `NoExecute` taint evicts what got there meanwhile.
pub fn is_pool_node(node: &Node) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(MODE_LABEL));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == POOL_TAINT));
    labelled || tainted
}

/// The JSON patch (RFC 6902) applying `plan` to `node`: a `test` of the observed
/// `resourceVersion`, then the label and the taint list.
pub fn json_patch(node: &Node, plan: &Plan) -> Value {
    let mut ops = Vec::new();
    if let Some(rv) = &node.metadata.resource_version {
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}));
    }
    if let Some(m) = plan.label {
        if node.metadata.labels.is_some() {
            ops.push(json!({
                "op": "add",
                "path": format!("/metadata/labels/{}", MODE_LABEL.replace('~', "~0").replace('/', "~1")),
                "value": m.as_str(),
            }));
        } else {
            ops.push(json!({"op": "add", "path": "/metadata/labels",
                "value": {MODE_LABEL: m.as_str()}}));
        }
    }
    if let Some(t) = &plan.taints {
        let t = serde_json::to_value(t).unwrap_or(Value::Array(Vec::new()));
        if node.spec.is_some() {
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": t}));
        } else {
            ops.push(json!({"op": "add", "path": "/spec", "value": {"taints": t}}));
        }
    }
    Value::Array(ops)
}

/// The `ModeChanged` Event's note.
pub fn flip_note(name: &str, from: Mode, to: Mode) -> String {
    format!(
        "Node {name} changed mode from {} to {}",
        from.as_str(),
        to.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(mode: Option<&str>, taints: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("k1".into()),
                resource_version: Some("7".into()),
                labels: mode.map(|m| [(MODE_LABEL.to_owned(), m.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then(|| {
                    taints
                        .iter()
                        .map(|(k, v)| Taint {
                            key: (*k).into(),
                            value: Some((*v).into()),
                            effect: "NoSchedule".into(),
                            time_added: None,
                        })
                        .collect()
                }),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    const KUBE: Controller = Controller::Pool(Mode::Kube);
    const BATCH: Controller = Controller::Pool(Mode::Batch);

    #[test]
    fn in_step_changes_nothing() {
        let n = node(Some("kube"), &[(POOL_TAINT, "pool"), ("gpu", "x")]);
        assert_eq!(plan(&n, KUBE, "pool"), None);
    }

    /// `n` with one more taint.
    fn tainted(mut n: Node, key: &str, value: &str, effect: &str) -> Node {
        let spec = n.spec.get_or_insert_with(NodeSpec::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        });
        n
    }

    #[test]
    fn missing_label_is_set_without_a_flip() {
        let n = node(None, &[(POOL_TAINT, "pool")]);
        let p = plan(&n, KUBE, "pool").unwrap();
        assert_eq!(p.label, Some(Mode::Kube));
        assert_eq!(p.taints, None);
        assert_eq!(p.flip, None, "first labelling is not a flip");
        let ops = json_patch(&n, &p);
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/labels", "value": {"tandem.dev/mode": "kube"}},
            ])
        );
    }

    #[test]
    fn stale_label_flips_with_an_event() {
        let n = node(Some("batch"), &[(POOL_TAINT, "pool")]);
        let p = plan(&n, KUBE, "pool").unwrap();
        assert_eq!(p.label, Some(Mode::Kube));
        assert_eq!(p.flip, Some((Mode::Batch, Mode::Kube)));
        assert_eq!(p.taints, None);
        let mut labelled = n.clone();
        labelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("other".into(), "x".into());
        assert_eq!(
            json_patch(&labelled, &p)[1],
            json!({"op": "add", "path": "/metadata/labels/tandem.dev~1mode", "value": "kube"})
        );
        assert!(
            flip_note("k1", Mode::Batch, Mode::Kube).contains("from batch to kube"),
            "the note names both modes"
        );
    }

    #[test]
    fn missing_taint_is_added_keeping_the_others() {
        let n = node(Some("kube"), &[("gpu", "x")]);
        let p = plan(&n, KUBE, "pool").unwrap();
        assert_eq!(p.label, None);
        assert_eq!(p.flip, None);
        let t = p.taints.clone().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].key, "gpu", "other taints kept, first");
        assert_eq!(t[1], pool_taint("pool"));
        let ops = json_patch(&n, &p);
        assert_eq!(ops[1]["path"], "/spec/taints");
        assert_eq!(ops[1]["value"][1]["value"], "pool");
        assert_eq!(ops[1]["value"][1]["effect"], "NoSchedule");
    }

    #[test]
    fn another_clusters_taint_is_replaced() {
        let n = node(Some("kube"), &[(POOL_TAINT, "elsewhere"), ("gpu", "x")]);
        let p = plan(&n, KUBE, "pool").unwrap();
        assert_eq!(p.label, None);
        let t = p.taints.unwrap();
        assert_eq!(t.iter().filter(|t| t.key == POOL_TAINT).count(), 1);
        assert!(t.contains(&pool_taint("pool")));
        assert!(t.iter().any(|t| t.key == "gpu"));
        let n = tainted(n, POOL_TAINT, "elsewhere", "NoExecute");
        let t = plan(&n, BATCH, "pool").unwrap().taints.unwrap();
        let pool: Vec<&Taint> = t.iter().filter(|t| t.key == POOL_TAINT).collect();
        assert_eq!(pool, [&pool_taint("pool"), &batch_taint("pool")]);
    }

    #[test]
    fn a_batch_node_carries_no_execute_and_a_kube_node_does_not() {
        // In kube mode with only NoSchedule: in step.
        let kube = node(Some("kube"), &[(POOL_TAINT, "pool"), ("gpu", "x")]);
        assert_eq!(plan(&kube, KUBE, "pool"), None);
        // Turning batch: the NoExecute taint is added beside NoSchedule, others kept.
        let p = plan(&kube, BATCH, "pool").unwrap();
        assert_eq!(p.label, Some(Mode::Batch));
        assert_eq!(p.flip, Some((Mode::Kube, Mode::Batch)));
        let t = p.taints.clone().unwrap();
        assert_eq!(t[0].key, "gpu", "other taints kept, first");
        assert_eq!(t[1..], [pool_taint("pool"), batch_taint("pool")]);
        assert_eq!(t[2].effect, "NoExecute");
        assert_eq!(t[2].value.as_deref(), Some("pool"));
        let ops = json_patch(&kube, &p);
        assert_eq!(ops[2]["path"], "/spec/taints");
        assert_eq!(ops[2]["value"][2]["effect"], "NoExecute");
        // A batch node with both: in step; the NoExecute taint's timeAdded is not a
        // difference (the API server stamps it).
        let mut batch = tainted(
            node(Some("batch"), &[(POOL_TAINT, "pool")]),
            POOL_TAINT,
            "pool",
            "NoExecute",
        );
        if let Some(t) = batch.spec.as_mut().and_then(|s| s.taints.as_mut()) {
            t[1].time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        assert_eq!(plan(&batch, BATCH, "pool"), None);
        // Back to kube: the NoExecute taint goes, NoSchedule stays.
        let p = plan(&batch, KUBE, "pool").unwrap();
        assert_eq!(p.taints, Some(vec![pool_taint("pool")]));
        // A duplicate NoSchedule beside the right pair is cleaned up, keeping timeAdded.
        let dup = tainted(batch.clone(), POOL_TAINT, "pool", "NoSchedule");
        let t = plan(&dup, BATCH, "pool").unwrap().taints.unwrap();
        assert_eq!(t.len(), 2);
        assert!(
            t[1].time_added.is_some(),
            "the existing NoExecute taint is kept"
        );
        // Batch node with NoSchedule only (written by an older bridge): NoExecute added.
        let old = node(Some("batch"), &[(POOL_TAINT, "pool")]);
        let p = plan(&old, BATCH, "pool").unwrap();
        assert_eq!((p.label, p.flip), (None, None));
        assert_eq!(p.taints, Some(pool_taints("pool", Mode::Batch)));
    }

    #[test]
    fn pool_nodes_are_told_by_the_label_or_the_taint_key() {
        assert!(is_pool_node(&node(Some("batch"), &[])));
        assert!(is_pool_node(&node(None, &[(POOL_TAINT, "other")])));
        assert!(!is_pool_node(&node(None, &[("gpu", "x")])));
        let mut bare = node(None, &[]);
        bare.spec = None;
        assert!(!is_pool_node(&bare));
    }

    #[test]
    fn a_node_without_spec_gets_one() {
        let mut n = node(Some("batch"), &[]);
        n.spec = None;
        let p = plan(&n, BATCH, "pool").unwrap();
        assert_eq!(
            json_patch(&n, &p)[1],
            json!({"op": "add", "path": "/spec", "value": {"taints": [
                {"key": "tandem.dev/pool", "value": "pool", "effect": "NoSchedule"},
                {"key": "tandem.dev/pool", "value": "pool", "effect": "NoExecute"}]}})
        );
    }

    #[test]
    fn nodes_outside_the_pool_are_untouched() {
        let n = node(Some("batch"), &[]);
        assert_eq!(plan(&n, Controller::NotPool, "pool"), None);
        let bare = node(None, &[]);
        assert_eq!(plan(&bare, Controller::NotPool, "pool"), None);
    }

    #[test]
    fn unknown_controller_state_changes_nothing() {
        let n = node(Some("batch"), &[("gpu", "x")]);
        assert_eq!(plan(&n, Controller::Unknown, "pool"), None);
        let bare = node(None, &[]);
        assert_eq!(plan(&bare, Controller::Unknown, "pool"), None);
    }
}
