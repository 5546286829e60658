//! The pool-node guard's rules (see [`super`]'s "The pool-node guard"): what keeps a pod
//! Tandem does not schedule off the pool's nodes, on `CREATE`, on an `UPDATE` that adds a
//! toleration, and on `pods/binding`.
//!
//! Apart from the managed pods' rules ([`super::managed`]): these apply to pods of every
//! namespace (`/guard`), need no namespace map, and judge by the Node list and by who
//! sent the request ([`super::identity`]).

use k8s_openapi::api::core::v1::{Pod, Toleration};

use super::identity::{holder_pod, operator_pod};
use super::{Guard, Op, Requester, Verdict};
use crate::labels::{POOL_TAINT, SCHEDULER_NAME};

/// The pool-node guard's refusals for `pod` (the rules are in [`super`]'s documentation).
pub(super) fn problems(
    op: Op,
    pod: &Pod,
    old: Option<&Pod>,
    who: Requester<'_>,
    g: Guard<'_>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = pod.spec.as_ref();
    let node = spec
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty());
    // Evaluated only where a rule would refuse: most pods never need it.
    let ours = || operator_pod(pod, who, g.operators) || holder_pod(pod, who, g.holders);
    if op == Op::Create
        && let Some(node) = node
    {
        match g.pool_nodes {
            Err(why) => problems.push(format!(
                "spec.nodeName: cannot tell yet whether {node:?} is a Tandem pool node \
                 ({why}); try again shortly"
            )),
            Ok(pool) if pool.contains(node) && !ours() => problems.push(format!(
                "spec.nodeName: {node:?} is a Tandem pool node; pods reach pool nodes only \
                 through the {SCHEDULER_NAME} scheduler (leave spec.nodeName unset and let \
                 the pod's namespace be mapped to Tandem), or as the operator's worker pods"
            )),
            Ok(_) => {}
        }
    }
    let by_tandem =
        spec.and_then(|s| s.scheduler_name.as_deref()) == Some(SCHEDULER_NAME) && node.is_none();
    if by_tandem {
        return problems;
    }
    let Some(i) = spec
        .and_then(|s| s.tolerations.as_ref())
        .and_then(|ts| ts.iter().position(tolerates_pool_key))
    else {
        return problems;
    };
    // On update only a toleration the pod did not have is judged (tolerations may be added
    // to a running pod; the rest of the spec is immutable).
    let had = op == Op::Update
        && old
            .and_then(|o| o.spec.as_ref())
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| ts.iter().any(tolerates_pool_key));
    if had {
        return problems;
    }
    let off_pool = match (pinned_nodes(pod), g.pool_nodes) {
        (Some(names), Ok(pool)) => names.iter().all(|n| !pool.contains(*n)),
        _ => false,
    };
    if !off_pool && !ours() {
        problems.push(format!(
            "spec.tolerations[{i}]: tolerates the Tandem pool taint {POOL_TAINT}; only pods \
             scheduled by {SCHEDULER_NAME} (and Tandem's worker pods) may run on pool nodes, \
             which hold batch jobs while in batch mode. Tolerate specific taint keys \
             instead, or leave the pod to Tandem"
        ));
    }
    problems
}

/// Refusals for a `pods/binding` of a pod onto `node` by `who`.
pub fn guard_binding(node: &str, who: Requester<'_>, g: Guard<'_>) -> Verdict {
    if g.binders.iter().any(|b| b == who.username) {
        return Verdict::Allow;
    }
    match g.pool_nodes {
        Err(why) => Verdict::Deny(format!(
            "target.name: cannot tell yet whether {node:?} is a Tandem pool node ({why}); \
             try again shortly"
        )),
        Ok(pool) if pool.contains(node) => Verdict::Deny(format!(
            "target.name: {node:?} is a Tandem pool node; only the {SCHEDULER_NAME} scheduler \
             binds pods there ({} may not)",
            if who.username.is_empty() {
                "an unnamed requester"
            } else {
                who.username
            }
        )),
        Ok(_) => Verdict::Allow,
    }
}

/// Whether `t` lets a pod stay on (or be scheduled onto) a node with the pool taint: its
/// key is the pool's, or it tolerates every key, for an effect the pool taint has. Any
/// value counts: another cluster's pool is no place for a pod Tandem does not schedule.
fn tolerates_pool_key(t: &Toleration) -> bool {
    let key_ok = match t.key.as_deref() {
        Some(POOL_TAINT) => true,
        // An empty key with `Exists` tolerates every taint.
        None | Some("") => t.operator.as_deref() == Some("Exists"),
        Some(_) => false,
    };
    let effect_ok = matches!(
        t.effect.as_deref(),
        None | Some("") | Some("NoSchedule") | Some("NoExecute")
    );
    key_ok && effect_ok
}

/// The only nodes `pod` can run on, when it names them: its `spec.nodeName`, or the names
/// of a required node affinity every term of which is `metadata.name In [...]` (how the
/// DaemonSet controller pins its pods). `None`: any node.
fn pinned_nodes(pod: &Pod) -> Option<Vec<&str>> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(vec![n]);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    if terms.is_empty() {
        return None;
    }
    let mut names = Vec::new();
    for term in terms {
        // A term matches a node when all its requirements do: one `metadata.name In`
        // requirement bounds the term, whatever else it asks.
        let pinned = term
            .match_fields
            .iter()
            .flatten()
            .find(|f| f.key == "metadata.name" && f.operator == "In")?;
        names.extend(pinned.values.iter().flatten().map(String::as_str));
    }
    Some(names)
}
