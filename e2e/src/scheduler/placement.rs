//! Where a pod can go (pure): the default scheduler's filter plugins that matter here
//! (NodeUnschedulable, TaintToleration, NodeAffinity with `nodeSelector`, NodeResourcesFit)
//! and a LeastAllocated score, with kube-scheduler's wording for the nodes that do not fit.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

use crate::kubelet::admit::{Resources, pod_requests};
use crate::kubelet::quantity::parse_milli;

/// A node as the scheduler sees it: what it offers and what is already placed on it.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    pub node: &'a Node,
    /// Requests of the pods bound to it that have not finished.
    pub used: Resources,
    /// How many such pods.
    pub pods: usize,
}

/// Why a pod did not fit one node, as kube-scheduler counts it in its message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Misfit {
    Unschedulable,
    Taint(String),
    Affinity,
    TooManyPods,
    Insufficient(String),
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Misfit::Taint(t) => write!(f, "node(s) had untolerated taint {{{t}}}"),
            Misfit::Affinity => write!(f, "node(s) didn't match Pod's node affinity/selector"),
            Misfit::TooManyPods => write!(f, "Too many pods"),
            Misfit::Insufficient(r) => write!(f, "Insufficient {r}"),
        }
    }
}

/// The outcome of one scheduling attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Node(String),
    /// No node fits; the message is the `PodScheduled=False` condition's and the
    /// `FailedScheduling` event's.
    Unschedulable(String),
}

/// Chooses a node for `spec` among `nodes`: every filter must pass, then the node with the
/// most free cpu and memory (as a share of allocatable) after placing the pod wins; ties go
/// to the name that sorts first, so placement is deterministic.
pub fn place(spec: &PodSpec, nodes: &[NodeView<'_>]) -> Placement {
    let requests = match pod_requests(spec) {
        Ok(r) => r,
        Err(e) => return Placement::Unschedulable(format!("invalid resource requests: {e}")),
    };
    // By message, so reasons come out sorted as kube-scheduler sorts them.
    let mut misfits: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<(i128, &str)> = None;
    for view in nodes {
        match filter(spec, &requests, view) {
            Err(m) => *misfits.entry(m.to_string()).or_default() += 1,
            Ok(()) => {
                let score = score(&requests, view);
                let name = view.node.metadata.name.as_deref().unwrap_or_default();
                let better = match best {
                    None => true,
                    Some((s, n)) => score > s || (score == s && name < n),
                };
                if better {
                    best = Some((score, name));
                }
            }
        }
    }
    match best {
        Some((_, name)) => Placement::Node(name.to_owned()),
        None if nodes.is_empty() => {
            Placement::Unschedulable("no nodes available to schedule pods".into())
        }
        None => {
            let reasons: Vec<String> = misfits.iter().map(|(m, n)| format!("{n} {m}")).collect();
            Placement::Unschedulable(format!(
                "0/{} nodes are available: {}.",
                nodes.len(),
                reasons.join(", ")
            ))
        }
    }
}

/// The filters, in kube-scheduler's order; the first failure is the node's reason.
fn filter(spec: &PodSpec, requests: &Resources, view: &NodeView<'_>) -> Result<(), Misfit> {
    let node = view.node;
    let node_spec = node.spec.clone().unwrap_or_default();
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if node_spec.unschedulable == Some(true) {
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        };
        if !tolerations.iter().any(|t| tolerates(t, &taint)) {
            return Err(Misfit::Unschedulable);
        }
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if !node_affinity_matches(spec, &labels, name) {
        return Err(Misfit::Affinity);
    }
    for taint in node_spec.taints.iter().flatten() {
        if matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
        {
            let shown = match taint.value.as_deref() {
                Some(v) if !v.is_empty() => format!("{}: {v}", taint.key),
                _ => format!("{}: ", taint.key),
            };
            return Err(Misfit::Taint(shown));
        }
    }
    fits(requests, view)
}

/// NodeResourcesFit: the pod count, then every requested resource against allocatable
/// minus what the node's pods already request.
fn fits(requests: &Resources, view: &NodeView<'_>) -> Result<(), Misfit> {
    let alloc = allocatable(view.node);
    let max_pods = alloc.get("pods").copied().unwrap_or(110_000) / 1000;
    if view.pods as i128 + 1 > max_pods {
        return Err(Misfit::TooManyPods);
    }
    for (name, want) in requests {
        if *want <= 0 {
            continue;
        }
        let have = alloc.get(name).copied().unwrap_or(0);
        let used = view.used.get(name).copied().unwrap_or(0);
        if *want > have - used {
            return Err(Misfit::Insufficient(name.clone()));
        }
    }
    Ok(())
}

/// LeastAllocated over cpu and memory: the mean free share after placing the pod, in
/// per-mille.
fn score(requests: &Resources, view: &NodeView<'_>) -> i128 {
    let alloc = allocatable(view.node);
    let mut total = 0;
    for r in ["cpu", "memory"] {
        let have = alloc.get(r).copied().unwrap_or(0);
        if have <= 0 {
            continue;
        }
        let used = view.used.get(r).copied().unwrap_or(0) + requests.get(r).copied().unwrap_or(0);
        total += (have - used).max(0) * 1000 / have;
    }
    total / 2
}

/// The node's `status.allocatable` in milli-units (malformed quantities count as zero).
pub fn allocatable(node: &Node) -> Resources {
    node.status
        .iter()
        .flat_map(|s| s.allocatable.iter().flatten())
        .map(|(k, q)| (k.clone(), parse_milli(&q.0).unwrap_or(0)))
        .collect()
}

/// Whether a toleration tolerates a taint (`v1helper.TolerationsTolerateTaint`).
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        // An empty key with Exists tolerates everything.
        "Exists" => key.is_empty() || key == taint.key,
        "Equal" => {
            key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// `nodeSelector` and required node affinity (`requiredDuringSchedulingIgnoredDuringExecution`).
pub fn node_affinity_matches(
    spec: &PodSpec,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    if !selector_ok {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        None => true,
        // Terms are ORed; an empty list matches nothing.
        Some(sel) => sel
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, node_name)),
    }
}

/// A term's expressions and fields are ANDed; a term with neither matches nothing.
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            // `metadata.name` is the only field node affinity supports.
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, Some(name))
        })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(bound) = number(bound) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, v: serde_json::Value) -> Node {
        let mut n = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}});
        crate::testkit::merge_json(&mut n, v);
        serde_json::from_value(n).unwrap()
    }

    fn spec(v: serde_json::Value) -> PodSpec {
        let mut s = json!({"containers": [{"name": "c"}]});
        crate::testkit::merge_json(&mut s, v);
        serde_json::from_value(s).unwrap()
    }

    fn requests(cpu: &str, mem: &str) -> serde_json::Value {
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]})
    }

    fn views(nodes: &[Node]) -> Vec<NodeView<'_>> {
        nodes
            .iter()
            .map(|node| NodeView {
                node,
                used: Resources::new(),
                pods: 0,
            })
            .collect()
    }

    #[test]
    fn free_resources_decide_and_the_emptiest_node_wins() {
        let nodes = [node("a", json!({})), node("b", json!({}))];
        let mut v = views(&nodes);
        v[0].used.insert("cpu".into(), 3000);
        let p = spec(requests("2", "1Gi"));
        assert_eq!(place(&p, &v), Placement::Node("b".into()));
        v[1].used.insert("cpu".into(), 3000);
        assert_eq!(
            place(&p, &v),
            Placement::Unschedulable("0/2 nodes are available: 2 Insufficient cpu.".into())
        );
        let small = spec(requests("500m", "1Gi"));
        assert_eq!(
            place(&small, &v),
            Placement::Node("a".into()),
            "a tie goes to the first name"
        );
    }

    #[test]
    fn gpus_and_pod_counts_are_resources_too() {
        let nodes = [
            node("cpu-only", json!({})),
            node(
                "gpu",
                json!({"status": {"allocatable": {"nvidia.com/gpu": "8", "pods": "1"}}}),
            ),
        ];
        let mut v = views(&nodes);
        let p = spec(
            json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}),
        );
        assert_eq!(place(&p, &v), Placement::Node("gpu".into()));
        v[1].pods = 1;
        assert_eq!(
            place(&p, &v),
            Placement::Unschedulable(
                "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 Too many pods.".into()
            )
        );
    }

    #[test]
    fn taints_need_tolerations_except_prefer_no_schedule() {
        let nodes = [
            node(
                "pool",
                json!({"spec": {"taints": [{"key": "tandem.dev/pool", "value": "batch", "effect": "NoSchedule"}]}}),
            ),
            node(
                "soft",
                json!({"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}],
                                          "unschedulable": true}}),
            ),
        ];
        let v = views(&nodes);
        assert_eq!(
            place(&spec(json!({})), &v),
            Placement::Unschedulable(
                "0/2 nodes are available: 1 node(s) had untolerated taint {tandem.dev/pool: batch}, 1 node(s) were unschedulable.".into()
            )
        );
        for tol in [
            json!({"key": "tandem.dev/pool", "operator": "Equal", "value": "batch"}),
            json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoSchedule"}),
            json!({"operator": "Exists"}),
        ] {
            let p = spec(json!({"tolerations": [tol.clone()]}));
            assert_eq!(place(&p, &v), Placement::Node("pool".into()), "{tol}");
        }
        for tol in [
            json!({"key": "tandem.dev/pool", "value": "serve"}),
            json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}),
        ] {
            let p = spec(json!({"tolerations": [tol.clone()]}));
            assert!(
                matches!(place(&p, &v), Placement::Unschedulable(_)),
                "{tol}"
            );
        }
    }

    #[test]
    fn node_selector_and_required_affinity_filter_nodes() {
        let nodes = [
            node(
                "a",
                json!({"metadata": {"labels": {"gpu": "h100", "rack": "3"}}}),
            ),
            node(
                "b",
                json!({"metadata": {"labels": {"gpu": "a100", "rack": "7"}}}),
            ),
            node("c", json!({})),
        ];
        let v = views(&nodes);
        let with = |terms: serde_json::Value| {
            spec(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
            )
        };
        let expr = |key: &str, op: &str, values: serde_json::Value| json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]);
        let cases = [
            (spec(json!({"nodeSelector": {"gpu": "a100"}})), Some("b")),
            (with(expr("gpu", "In", json!(["h100", "a100"]))), Some("a")),
            (with(expr("gpu", "NotIn", json!(["h100"]))), Some("b")),
            (with(expr("gpu", "DoesNotExist", json!(null))), Some("c")),
            (with(expr("gpu", "Exists", json!(null))), Some("a")),
            (with(expr("rack", "Gt", json!(["5"]))), Some("b")),
            (with(expr("rack", "Lt", json!(["5"]))), Some("a")),
            (with(expr("rack", "Gt", json!(["x"]))), None),
            (
                with(
                    json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]),
                ),
                Some("c"),
            ),
            (
                with(
                    json!([{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}]),
                ),
                Some("b"),
            ),
            (
                with(
                    json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"}],
                             "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]}]),
                ),
                Some("b"),
            ),
            (with(json!([{}])), None),
            (with(json!([])), None),
        ];
        for (i, (p, want)) in cases.into_iter().enumerate() {
            match (place(&p, &v), want) {
                (Placement::Node(got), Some(want)) => assert_eq!(got, want, "case {i}"),
                (Placement::Unschedulable(msg), None) => assert_eq!(
                    msg,
                    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
                    "case {i}"
                ),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn no_nodes_and_bad_requests_say_so() {
        assert_eq!(
            place(&spec(json!({})), &[]),
            Placement::Unschedulable("no nodes available to schedule pods".into())
        );
        let nodes = [node("a", json!({}))];
        let bad = spec(requests("lots", "1Gi"));
        assert!(
            matches!(place(&bad, &views(&nodes)), Placement::Unschedulable(m) if m.starts_with("invalid resource requests"))
        );
    }
}
