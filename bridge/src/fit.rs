//! Whether a pod may run on a Node: what the kubelet and kube-scheduler check of a pod's
//! own constraints, so the bridge never binds a pod where the kubelet rejects it (a
//! Deployment would then make a new pod, bound to the same place, in a loop).
//!
//! Checked here: `spec.nodeSelector`, the required part of `spec.affinity.nodeAffinity`
//! (`matchExpressions` on labels with `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`,
//! and `matchFields` on `metadata.name`), and the Node's `NoSchedule`/`NoExecute` taints
//! other than the pool's own (which the bridge's pods tolerate by admission). Nodes that do
//! not fit become the placeholder's excluded nodes, so the controller never allocates them.
//! Written by hand: the Kubernetes crates model these types but not their semantics, and
//! the rules are the documented ones, a few lines each.

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

use crate::labels::POOL_TAINT;

/// `Ok` when `pod` may run on `node`; else why not, in words a user can act on.
pub fn fits(pod: &PodSpec, node: &Node) -> Result<(), String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in pod.node_selector.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Err(format!("node {name} does not match nodeSelector {k}={v}"));
        }
    }
    let terms = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.as_slice());
    if let Some(terms) = terms
        && !terms.iter().any(|t| term_matches(t, name, &labels))
    {
        return Err(format!(
            "node {name} matches no term of the pod's required node affinity"
        ));
    }
    for t in node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        let hard = matches!(t.effect.as_str(), "NoSchedule" | "NoExecute");
        if hard && t.key != POOL_TAINT && !tolerated(t, pod.tolerations.as_deref()) {
            return Err(format!(
                "node {name} has the taint {}{}:{} that the pod does not tolerate",
                t.key,
                t.value
                    .as_deref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default(),
                t.effect
            ));
        }
    }
    Ok(())
}

/// A term matches when every expression and field requirement does (an empty term
/// matches nothing, as in Kubernetes).
fn term_matches(
    t: &NodeSelectorTerm,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // `metadata.name` is the one field Kubernetes supports here.
            r.key == "metadata.name" && requirement(r, Some(name))
        })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(want)) = (
                value.and_then(number),
                values.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        // An operator Kubernetes does not know matches nothing: fail closed.
        _ => false,
    }
}

/// Whether some toleration tolerates `taint`: same key (or an empty key with `Exists`,
/// which tolerates everything), `Exists` or an equal value, and the same effect (or none).
fn tolerated(taint: &Taint, tolerations: Option<&[Toleration]>) -> bool {
    tolerations.into_iter().flatten().any(|t| {
        let op = t.operator.as_deref().unwrap_or("Equal");
        let key = match t.key.as_deref().unwrap_or_default() {
            "" => op == "Exists",
            k => k == taint.key,
        };
        let value = op == "Exists"
            || t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default();
        let effect = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == taint.effect);
        key && value && effect
    })
}

/// Why a pod cannot be placed by Tandem at all, whatever the node: host ports, which a
/// placeholder cannot reserve (two groups' pods asking for one port would meet on a node
/// and the kubelet would reject the second).
pub fn unplaceable(pod: &PodSpec) -> Option<String> {
    let port = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .find_map(|p| p.host_port.filter(|h| *h > 0))?;
    Some(format!(
        "hostPort {port}: the tandem scheduler does not place pods with host ports (a \
         placeholder cannot reserve a port on a node); expose the pod through a Service"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut base = json!({"containers": [{"name": "c"}]});
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            for (k, x) in o {
                b.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(base).unwrap()
    }

    fn a100() -> Node {
        node(json!({
            "metadata": {"name": "p1", "labels": {"gpu": "a100", "cores": "64"}},
            "spec": {"taints": [
                {"key": POOL_TAINT, "value": "research", "effect": "NoSchedule"},
                {"key": POOL_TAINT, "value": "research", "effect": "NoExecute"},
            ]},
        }))
    }

    #[test]
    fn node_selectors_and_required_affinity_are_honoured() {
        assert!(fits(&spec(json!({})), &a100()).is_ok());
        assert!(fits(&spec(json!({"nodeSelector": {"gpu": "a100"}})), &a100()).is_ok());
        let e = fits(&spec(json!({"nodeSelector": {"gpu": "h100"}})), &a100()).unwrap_err();
        assert!(e.contains("nodeSelector gpu=h100"), "{e}");
        let affinity = |terms: serde_json::Value| {
            spec(json!({"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        let ok = [
            json!([{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "a100"]}]}]),
            json!([{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["h100"]}]}]),
            json!([{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}]),
            json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}]),
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["p1"]}]}]),
            // Terms are ORed.
            json!([{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
                   {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]),
        ];
        for t in ok {
            assert!(fits(&affinity(t.clone()), &a100()).is_ok(), "{t}");
        }
        let refused = [
            json!([{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]),
            json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["32"]}]}]),
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["p2"]}]}]),
            // Expressions within a term are ANDed.
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"},
                                         {"key": "zone", "operator": "Exists"}]}]),
            json!([{}]),
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Like", "values": ["a*"]}]}]),
        ];
        for t in refused {
            assert!(fits(&affinity(t.clone()), &a100()).is_err(), "{t}");
        }
    }

    #[test]
    fn other_taints_must_be_tolerated_and_the_pools_own_need_not_be() {
        let mut n = a100();
        if let Some(s) = n.spec.as_mut() {
            s.taints.get_or_insert_with(Vec::new).push(Taint {
                key: "maintenance".into(),
                value: Some("yes".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        let e = fits(&spec(json!({})), &n).unwrap_err();
        assert!(e.contains("maintenance=yes:NoSchedule"), "{e}");
        let tolerating = |t: serde_json::Value| spec(json!({"tolerations": [t]}));
        for t in [
            json!({"key": "maintenance", "operator": "Equal", "value": "yes"}),
            json!({"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}),
            json!({"operator": "Exists"}),
        ] {
            assert!(fits(&tolerating(t.clone()), &n).is_ok(), "{t}");
        }
        for t in [
            json!({"key": "maintenance", "value": "no"}),
            json!({"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}),
        ] {
            assert!(fits(&tolerating(t.clone()), &n).is_err(), "{t}");
        }
        // A PreferNoSchedule taint never keeps a pod off.
        let mut soft = a100();
        if let Some(s) = soft.spec.as_mut() {
            s.taints = Some(vec![Taint {
                key: "busy".into(),
                value: None,
                effect: "PreferNoSchedule".into(),
                time_added: None,
            }]);
        }
        assert!(fits(&spec(json!({})), &soft).is_ok());
    }

    #[test]
    fn host_ports_are_refused_with_the_reason() {
        let p = spec(json!({"containers": [{"name": "c", "ports": [
            {"containerPort": 80}, {"containerPort": 8080, "hostPort": 8080}]}]}));
        let why = unplaceable(&p).unwrap();
        assert!(why.starts_with("hostPort 8080:"), "{why}");
        let plain = spec(json!({"containers": [{"name": "c", "ports": [{"containerPort": 80}]}]}));
        assert_eq!(unplaceable(&plain), None);
    }
}
