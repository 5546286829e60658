//! The admission decision for one Pod: pure, from the request and the namespace map.
//!
//! A pod is *managed* when its namespace is named in the `TandemCluster`'s
//! `spec.bridge.namespaces`, when it carries the label `tandem.dev/managed: "true"`, or when it
//! already names the `tandem` scheduler. A managed pod is mutated to name the `tandem`
//! scheduler and to tolerate the pool taint, and refused (every problem listed, each naming
//! its field) when:
//!
//! - a `tandem.dev/*` annotation does not parse ([`crate::annotations`]);
//! - `tandem.dev/account` names an account its namespace may not charge, or the namespace is
//!   not mapped at all ([`crate::policy`]): no pod spends another team's share;
//! - `spec.nodeName` is preset: such a pod bypasses every scheduler, and the kubelet does
//!   not enforce `NoSchedule` taints, so it could land on a node in `batch` mode;
//! - `spec.resourceClaims` is used: the bridge does not schedule dynamic resources yet;
//! - a container asks for a `hostPort`: a placeholder cannot reserve a port on a node, so
//!   the kubelet could reject the pod where it is bound ([`crate::fit::unplaceable`]);
//! - `spec.schedulerName` names another scheduler (two schedulers must not race for a pod).
//!
//! A `spec.workloadRef` (the in-tree Workload API) is allowed: the bridge places its pod group
//! as a gang, or pod by pod for a `basic` group.
//!
//! A pod in a mapped namespace opts out with `tandem.dev/managed: "false"` (a small CPU
//! sidecar Deployment that should not wait for the pool). Everything else is allowed
//! unchanged. Until the namespace map has been read, nothing can be judged and every pod is
//! refused (fail closed; the server reports not ready meanwhile).
//!
//! On `UPDATE` only the annotations can change what was checked (the fields above are
//! immutable once created); they are checked again when they changed, so an annotation
//! edit cannot switch a running pod's account to another team's.
//!
//! # The pool-node guard
//!
//! Batch-mode pool nodes keep every other pod off ([`crate::nodes`] taints them
//! `NoSchedule` always and `NoExecute` in batch mode). Admission closes the ways around a
//! taint, for pods of *every* namespace ([`Mode::Guard`], the cluster-wide webhook entry;
//! `/mutate` and `/validate` apply the same rules to the pods they see unmanaged):
//!
//! - a pod `CREATE` whose `spec.nodeName` is a pool node ([`crate::nodes::is_pool_node`])
//!   is refused: the kubelet does not enforce `NoSchedule`, so such a pod would skip every
//!   scheduler (a managed pod with any preset node is refused above);
//! - a pod not scheduled by Tandem that tolerates the pool taint key (or every taint) is
//!   refused, on `CREATE` and on an `UPDATE` that adds the toleration: the default
//!   scheduler would otherwise place it on a pool node, and a `NoExecute` toleration would
//!   outlast the batch taint. A pod pinned (by `nodeName` or `metadata.name` node affinity,
//!   as DaemonSet pods are) to nodes none of which is in the pool is let through;
//! - a `pods/binding` onto a pool node by anyone but the binders named in the
//!   configuration (the bridge's service account, and kube-scheduler, whose binds are of
//!   pods that tolerate the `NoSchedule` taint and so passed the rule above) is refused.
//!
//! The bridge's GPU holder pods ([`crate::holder`]: `nodeName` a pool node, tolerating the
//! pool taint) pass when created by a holder identity of the configuration (the bridge's
//! service account) and carrying the holder's labels.
//!
//! Tandem's own operator pods (workers, which tolerate the pool taint, and the controller
//! and login pods) pass when *created by* an operator identity of the configuration and
//! carrying what the operator sets: the recommended labels (`managed-by: tandem-operator`,
//! the component, `tandem.dev/cluster`) and a controlling owner of the matching
//! `tandem.dev` kind. Labels and owner references alone prove nothing (whoever may create a
//! pod may write them); the requester's identity is the API server's authentication, which
//! the pod's author cannot choose. What remains: whoever can act as the operator's service
//! account (its token, impersonation, or creating pods under it in the operator's
//! namespace) can place pods on pool nodes, as can the namespaces the chart exempts.
//!
//! Until the Node list has been read, a request that names a node or tolerates the pool is
//! refused (fail closed), and nothing else is affected.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde_json::{Value, json};
use tandem_operator::labels as operator;

use crate::annotations;
use crate::labels::{ACCOUNT, MANAGED_LABEL, POOL_TAINT, PREFIX, SCHEDULER_NAME};
use crate::policy::{self, NamespacePolicy, PolicyError};

/// The scheduler name the API server defaults an unset `spec.schedulerName` to; it means
/// "nobody chose", so a managed pod's is replaced.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// What the webhook knows of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The `TandemCluster`'s name: the pool taint's value.
    pub cluster: &'a str,
    /// The namespace map; `Err` until it has been read (with why), so nothing is judged.
    pub policies: Result<&'a [NamespacePolicy], &'a str>,
    /// What the pool-node guard knows.
    pub guard: Guard<'a>,
}

/// What the pool-node guard knows and trusts.
#[derive(Debug, Clone, Copy)]
pub struct Guard<'a> {
    /// The pool nodes' names; `Err` until the Node list has been read (with why).
    pub pool_nodes: Result<&'a BTreeSet<String>, &'a str>,
    /// Usernames (as the API server authenticates them, e.g.
    /// `system:serviceaccount:tandem-system:tandem-operator`) whose worker, controller and
    /// login pods may reach pool nodes.
    pub operators: &'a [String],
    /// Usernames that may bind pods onto pool nodes (`pods/binding`).
    pub binders: &'a [String],
    /// Usernames whose GPU holder pods ([`crate::holder`]) may reach pool nodes: the
    /// bridge's own service account.
    pub holders: &'a [String],
}

/// Who sent the request, as the API server authenticated them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Requester<'a> {
    pub username: &'a str,
}

/// The request's operation, as far as the decision cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    /// `old` is the pod before the update.
    Update,
    /// Delete and connect: never refused.
    Other,
}

/// Which answer the endpoint gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `/mutate`: set the scheduler and toleration, and refuse what is invalid.
    Mutate,
    /// `/validate`: only refuse; runs on the object as every mutating webhook left it.
    Validate,
    /// `/guard`: only the pool-node guard, for pods of every namespace; needs no namespace
    /// map, so it judges from the moment the Node list is read.
    Guard,
}

/// The decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Allow,
    /// Allowed with these JSON patch (RFC 6902) operations.
    Patch(Vec<Value>),
    /// Refused; the message lists every problem, each naming its field.
    Deny(String),
}

/// Decides on one pod in `namespace`. `old` is the pod before an update; `who` sent it.
pub fn admit(
    mode: Mode,
    op: Op,
    namespace: &str,
    pod: &Pod,
    old: Option<&Pod>,
    who: Requester<'_>,
    view: View<'_>,
) -> Verdict {
    if op == Op::Other {
        return Verdict::Allow;
    }
    if mode == Mode::Guard {
        return deny_or(guard(op, pod, old, who, view.guard), Verdict::Allow);
    }
    let policies = match view.policies {
        Ok(p) => p,
        Err(why) => {
            return Verdict::Deny(format!(
                "tandem-bridge cannot judge pods yet: {why}; try again shortly"
            ));
        }
    };
    let labels = pod.metadata.labels.as_ref();
    let opt = labels
        .and_then(|l| l.get(MANAGED_LABEL))
        .map(String::as_str);
    let mut problems = Vec::new();
    let opted_in = match opt {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            problems.push(format!(
                "metadata.labels[{MANAGED_LABEL}]: {other:?} is neither \"true\" nor \"false\""
            ));
            Some(true)
        }
    };
    let spec = pod.spec.as_ref();
    let scheduler = spec.and_then(|s| s.scheduler_name.as_deref());
    let mapped = policies.iter().any(|p| p.namespace == namespace);
    let managed = match opted_in {
        Some(v) => v,
        None => mapped || scheduler == Some(SCHEDULER_NAME),
    };
    if !managed {
        // An opted-out pod of a mapped namespace, or any pod this endpoint sees: it is not
        // Tandem's, so it must stay off the pool.
        problems.extend(guard(op, pod, old, who, view.guard));
        return deny_or(problems, Verdict::Allow);
    }

    if op == Op::Update {
        let before = old.map(|o| tandem_annotations(o.metadata.annotations.as_ref()));
        if before.as_ref() != Some(&tandem_annotations(pod.metadata.annotations.as_ref())) {
            check_annotations(namespace, pod, policies, &mut problems);
        }
        return deny_or(problems, Verdict::Allow);
    }

    check_annotations(namespace, pod, policies, &mut problems);
    if let Some(node) = spec.and_then(|s| s.node_name.as_deref()) {
        problems.push(format!(
            "spec.nodeName: preset to {node:?}; pods scheduled by {SCHEDULER_NAME} are bound \
             where the controller allocates, so leave spec.nodeName unset"
        ));
    }
    if spec
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty())
    {
        problems.push(format!(
            "spec.resourceClaims: the {SCHEDULER_NAME} scheduler does not schedule pods with \
             resource claims yet"
        ));
    }
    if let Some(why) = spec.and_then(crate::fit::unplaceable) {
        problems.push(format!("spec.containers[].ports[].{why}"));
    }
    let unset = matches!(scheduler, None | Some("") | Some(DEFAULT_SCHEDULER));
    let wrong_scheduler = match mode {
        Mode::Mutate => !unset && scheduler != Some(SCHEDULER_NAME),
        // Guard mode returned at the top.
        Mode::Validate | Mode::Guard => scheduler != Some(SCHEDULER_NAME),
    };
    if wrong_scheduler {
        problems.push(format!(
            "spec.schedulerName: {:?}; pods managed by Tandem are scheduled by {SCHEDULER_NAME:?} \
             (leave it unset, or label the pod {MANAGED_LABEL}=false to opt out)",
            scheduler.unwrap_or_default()
        ));
    }
    if mode == Mode::Validate {
        return deny_or(problems, Verdict::Allow);
    }
    let ops = mutations(pod, view.cluster);
    let ok = if ops.is_empty() {
        Verdict::Allow
    } else {
        Verdict::Patch(ops)
    };
    deny_or(problems, ok)
}

fn deny_or(problems: Vec<String>, ok: Verdict) -> Verdict {
    if problems.is_empty() {
        ok
    } else {
        Verdict::Deny(problems.join("; "))
    }
}

/// The annotations under `tandem.dev/`, to tell whether an update changed them.
fn tandem_annotations(a: Option<&BTreeMap<String, String>>) -> Vec<(&str, &str)> {
    a.into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn check_annotations(
    namespace: &str,
    pod: &Pod,
    policies: &[NamespacePolicy],
    problems: &mut Vec<String>,
) {
    match annotations::parse(pod.metadata.annotations.as_ref()) {
        Err(e) => problems.push(format!("metadata.annotations: {e}")),
        Ok(asks) => match policy::resolve(namespace, &asks, policies) {
            Ok(_) => {}
            Err(e @ PolicyError::AccountNotAllowed { .. }) => {
                problems.push(format!("metadata.annotations[{ACCOUNT}]: {e}"));
            }
            Err(e @ PolicyError::NamespaceNotMapped { .. }) => {
                problems.push(format!("metadata.namespace: {e}"));
            }
        },
    }
}

/// The toleration of the pool taint `tandem.dev/pool=<cluster>:NoSchedule`.
pub fn pool_toleration(cluster: &str) -> Toleration {
    Toleration {
        key: Some(POOL_TAINT.to_owned()),
        operator: Some("Equal".to_owned()),
        value: Some(cluster.to_owned()),
        effect: Some("NoSchedule".to_owned()),
        toleration_seconds: None,
    }
}

/// Whether `t` already lets the pod onto the pool's nodes.
fn tolerates_pool(t: &Toleration, cluster: &str) -> bool {
    let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
    let key_ok = matches!(t.key.as_deref(), None | Some("") | Some(POOL_TAINT));
    let value_ok = t.operator.as_deref() == Some("Exists") || t.value.as_deref() == Some(cluster);
    effect_ok && key_ok && value_ok
}

/// The JSON patch that makes a managed pod name the scheduler and tolerate the pool.
fn mutations(pod: &Pod, cluster: &str) -> Vec<Value> {
    let spec = pod.spec.as_ref();
    let mut ops = Vec::new();
    if spec.and_then(|s| s.scheduler_name.as_deref()) != Some(SCHEDULER_NAME) {
        ops.push(json!({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}));
    }
    let tolerations = spec.and_then(|s| s.tolerations.as_ref());
    if !tolerations
        .into_iter()
        .flatten()
        .any(|t| tolerates_pool(t, cluster))
    {
        let t = serde_json::to_value(pool_toleration(cluster)).unwrap_or(Value::Null);
        if tolerations.is_some() {
            ops.push(json!({"op": "add", "path": "/spec/tolerations/-", "value": t}));
        } else {
            ops.push(json!({"op": "add", "path": "/spec/tolerations", "value": [t]}));
        }
    }
    ops
}

/// The pool-node guard's refusals for `pod` (see the module's documentation).
fn guard(op: Op, pod: &Pod, old: Option<&Pod>, who: Requester<'_>, g: Guard<'_>) -> Vec<String> {
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

/// Whether `pod` is a GPU holder ([`crate::holder`]) created by the bridge's identity: the
/// holder's labels and the cluster's, from a requester named in `holders`. As for operator
/// pods, the identity is what counts; the labels only say which kind of pod it is.
fn holder_pod(pod: &Pod, who: Requester<'_>, holders: &[String]) -> bool {
    if who.username.is_empty() || !holders.iter().any(|h| h == who.username) {
        return false;
    }
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    crate::holder::is_holder(pod)
        && label(operator::CLUSTER).is_some_and(|c| !c.is_empty())
        && label(MANAGED_LABEL) == Some("false")
}

/// Whether `pod` is one of the operator's own (worker, controller or login), created by an
/// operator identity. See the module's documentation for why the identity is what counts.
fn operator_pod(pod: &Pod, who: Requester<'_>, operators: &[String]) -> bool {
    if who.username.is_empty() || !operators.iter().any(|o| o == who.username) {
        return false;
    }
    let Some(labels) = pod.metadata.labels.as_ref() else {
        return false;
    };
    let label = |k: &str| labels.get(k).map(String::as_str);
    let owner_kind = match label(operator::APP_COMPONENT) {
        Some(operator::COMPONENT_WORKER) => "WorkerSet",
        Some(operator::COMPONENT_LOGIN) => "LoginSet",
        Some(operator::COMPONENT_CONTROLLER) => "TandemCluster",
        _ => return false,
    };
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == owner_kind
            && o.api_version
                .strip_prefix(operator::GROUP)
                .is_some_and(|v| v.starts_with('/'))
    });
    label(operator::APP_MANAGED_BY) == Some(operator::MANAGER)
        && label(operator::CLUSTER).is_some_and(|c| !c.is_empty())
        && owned
}

#[cfg(test)]
mod tests;
