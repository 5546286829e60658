//! Node modes in Kubernetes: every pool node carries the taint
//! `tandem.dev/pool=<cluster>:NoSchedule` (the default scheduler leaves it alone) and the
//! label `tandem.dev/mode=batch|kube`, kept in step with the controller, so
//! `kubectl get nodes -L tandem.dev/mode` shows the time partition.
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
    let ours = |t: &Taint| {
        t.key == POOL_TAINT && t.value.as_deref() == Some(cluster) && t.effect == "NoSchedule"
    };
    let taints =
        if taints.iter().filter(|t| t.key == POOL_TAINT).count() == 1 && taints.iter().any(ours) {
            None
        } else {
            let mut kept: Vec<Taint> = taints.into_iter().filter(|t| t.key != POOL_TAINT).collect();
            kept.push(pool_taint(cluster));
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

/// `tandem.dev/pool=<cluster>:NoSchedule`.
pub fn pool_taint(cluster: &str) -> Taint {
    Taint {
        key: POOL_TAINT.to_owned(),
        value: Some(cluster.to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    }
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

    #[test]
    fn missing_label_is_set_without_a_flip() {
        let n = node(None, &[(POOL_TAINT, "pool")]);
        let p = plan(&n, BATCH, "pool").unwrap();
        assert_eq!(p.label, Some(Mode::Batch));
        assert_eq!(p.taints, None);
        assert_eq!(p.flip, None, "first labelling is not a flip");
        let ops = json_patch(&n, &p);
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/labels", "value": {"tandem.dev/mode": "batch"}},
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
        let n = node(Some("batch"), &[(POOL_TAINT, "elsewhere"), ("gpu", "x")]);
        let p = plan(&n, BATCH, "pool").unwrap();
        assert_eq!(p.label, None);
        let t = p.taints.unwrap();
        assert_eq!(t.iter().filter(|t| t.key == POOL_TAINT).count(), 1);
        assert!(t.contains(&pool_taint("pool")));
        assert!(t.iter().any(|t| t.key == "gpu"));
    }

    #[test]
    fn a_node_without_spec_gets_one() {
        let mut n = node(Some("batch"), &[]);
        n.spec = None;
        let p = plan(&n, BATCH, "pool").unwrap();
        assert_eq!(
            json_patch(&n, &p)[1],
            json!({"op": "add", "path": "/spec", "value": {"taints": [
                {"key": "tandem.dev/pool", "value": "pool", "effect": "NoSchedule"}]}})
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
