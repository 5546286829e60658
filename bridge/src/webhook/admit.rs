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
mod tests {
    use super::*;

    const ANYONE: Requester<'static> = Requester { username: "alice" };

    /// A guard that knows no pool node (the managed-pod tests do not involve one).
    fn no_guard() -> Guard<'static> {
        static NONE: BTreeSet<String> = BTreeSet::new();
        Guard {
            pool_nodes: Ok(&NONE),
            operators: &[],
            binders: &[],
            holders: &[],
        }
    }

    fn policies() -> Vec<NamespacePolicy> {
        vec![NamespacePolicy {
            namespace: "serving".into(),
            account: "inference".into(),
            allowed_accounts: vec!["research".into()],
            ..Default::default()
        }]
    }

    fn pod(v: Value) -> Pod {
        let mut base = json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "schedulerName": "default-scheduler",
        }});
        crate_merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    /// A JSON merge of `patch` into `base` (objects merged, everything else replaced).
    fn crate_merge(base: &mut Value, patch: Value) {
        match (base, patch) {
            (Value::Object(b), Value::Object(p)) => {
                for (k, v) in p {
                    crate_merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, p) => *b = p,
        }
    }

    fn decide(mode: Mode, ns: &str, p: &Pod) -> Verdict {
        let ps = policies();
        let view = View {
            cluster: "pool",
            policies: Ok(&ps),
            guard: no_guard(),
        };
        admit(mode, Op::Create, ns, p, None, Requester::default(), view)
    }

    fn denied(v: Verdict) -> String {
        match v {
            Verdict::Deny(m) => m,
            other => panic!("expected a denial, got {other:?}"),
        }
    }

    #[test]
    fn a_pod_in_a_mapped_namespace_gets_the_scheduler_and_the_pool_toleration() {
        let v = decide(Mode::Mutate, "serving", &pod(json!({})));
        let Verdict::Patch(ops) = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/spec/schedulerName", "value": "tandem"}),
                json!({"op": "add", "path": "/spec/tolerations", "value": [
                    {"key": "tandem.dev/pool", "operator": "Equal", "value": "pool", "effect": "NoSchedule"}]}),
            ]
        );
        // Existing tolerations are kept: the pool's is appended.
        let p = pod(json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}));
        let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
            panic!()
        };
        assert_eq!(ops[1]["path"], "/spec/tolerations/-");
        // Already scheduled by tandem and tolerating the pool (a template written by hand,
        // or the webhook's own earlier answer): nothing to change.
        let p = pod(json!({"spec": {"schedulerName": "tandem", "tolerations": [
            {"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoSchedule"}]}}));
        assert_eq!(decide(Mode::Mutate, "serving", &p), Verdict::Allow);
        // A toleration of another cluster's pool does not count.
        let p = pod(json!({"spec": {"tolerations": [
            {"key": "tandem.dev/pool", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]}}));
        let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
            panic!()
        };
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn the_label_opts_in_anywhere_and_out_in_a_mapped_namespace() {
        // Unmapped, unlabelled: untouched, whatever its annotations say.
        let p = pod(json!({"metadata": {"annotations": {"tandem.dev/partiton": "x"}}}));
        assert_eq!(decide(Mode::Mutate, "web", &p), Verdict::Allow);
        // Labelled in an unmapped namespace: managed, and refused for want of an account.
        let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "true"}}}));
        let m = denied(decide(Mode::Mutate, "web", &p));
        assert!(
            m.starts_with("metadata.namespace: namespace web is not mapped"),
            "{m}"
        );
        // Opted out in a mapped namespace: left to the default scheduler.
        let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "false"}}}));
        assert_eq!(decide(Mode::Mutate, "serving", &p), Verdict::Allow);
        let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "yes"}}}));
        let m = denied(decide(Mode::Mutate, "serving", &p));
        assert!(
            m.contains("metadata.labels[tandem.dev/managed]: \"yes\" is neither"),
            "{m}"
        );
        // Naming the tandem scheduler by hand in an unmapped namespace is asking for it.
        let p = pod(json!({"spec": {"schedulerName": "tandem"}}));
        assert!(denied(decide(Mode::Mutate, "web", &p)).contains("not mapped"));
    }

    #[test]
    fn every_problem_is_refused_naming_its_field() {
        let p = pod(json!({"metadata": {"annotations": {"tandem.dev/time-limit": "soon"}}}));
        let m = denied(decide(Mode::Mutate, "serving", &p));
        assert!(
            m.starts_with("metadata.annotations: annotation tandem.dev/time-limit: \"soon\""),
            "{m}"
        );
        let p = pod(json!({"metadata": {"annotations": {"tandem.dev/acount": "b"}}}));
        assert!(
            denied(decide(Mode::Mutate, "serving", &p))
                .contains("unknown annotation tandem.dev/acount")
        );
        let p = pod(json!({"metadata": {"annotations": {"tandem.dev/account": "b"}}}));
        assert_eq!(
            denied(decide(Mode::Mutate, "serving", &p)),
            "metadata.annotations[tandem.dev/account]: namespace serving may not charge \
             account b; it may charge inference, research"
        );
        let p = pod(json!({"metadata": {"annotations": {"tandem.dev/account": "research"}}}));
        assert!(matches!(
            decide(Mode::Mutate, "serving", &p),
            Verdict::Patch(_)
        ));
        let p = pod(json!({"spec": {"nodeName": "k1"}}));
        assert!(
            denied(decide(Mode::Mutate, "serving", &p))
                .starts_with("spec.nodeName: preset to \"k1\"")
        );
        let p =
            pod(json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}));
        assert!(denied(decide(Mode::Mutate, "serving", &p)).starts_with("spec.resourceClaims:"));
        let p = pod(json!({"spec": {"containers": [{"name": "c",
            "ports": [{"containerPort": 80, "hostPort": 80}]}]}}));
        assert!(
            denied(decide(Mode::Mutate, "serving", &p))
                .starts_with("spec.containers[].ports[].hostPort 80:")
        );
        let p = pod(json!({"spec": {"schedulerName": "volcano"}}));
        assert!(
            denied(decide(Mode::Mutate, "serving", &p))
                .starts_with("spec.schedulerName: \"volcano\"")
        );
        // Several at once: all listed.
        let p = pod(
            json!({"metadata": {"annotations": {"tandem.dev/account": "b"}},
            "spec": {"nodeName": "k1"}}),
        );
        let m = denied(decide(Mode::Mutate, "serving", &p));
        assert!(
            m.contains("tandem.dev/account") && m.contains("; spec.nodeName"),
            "{m}"
        );
    }

    #[test]
    fn validation_checks_the_final_object_and_never_patches() {
        // After mutation the pod names tandem: valid.
        let p = pod(json!({"spec": {"schedulerName": "tandem"}}));
        assert_eq!(decide(Mode::Validate, "serving", &p), Verdict::Allow);
        // A later mutating webhook set it back: refused.
        let p = pod(json!({}));
        assert!(denied(decide(Mode::Validate, "serving", &p)).starts_with("spec.schedulerName"));
        let p = pod(json!({"spec": {"schedulerName": "tandem", "nodeName": "k1"}}));
        assert!(denied(decide(Mode::Validate, "serving", &p)).starts_with("spec.nodeName"));
    }

    #[test]
    fn updates_recheck_only_changed_annotations() {
        let ps = policies();
        let view = View {
            cluster: "pool",
            policies: Ok(&ps),
            guard: no_guard(),
        };
        let old = pod(json!({"spec": {"schedulerName": "tandem", "nodeName": "k1"}}));
        // The bridge writing its job id, a label change: allowed, no patch, even though
        // nodeName is set (by the binding).
        let new = pod(
            json!({"metadata": {"annotations": {"tandem.dev/job-id": "7"},
            "labels": {"x": "y"}}, "spec": {"schedulerName": "tandem", "nodeName": "k1"}}),
        );
        for mode in [Mode::Mutate, Mode::Validate] {
            assert_eq!(
                admit(mode, Op::Update, "serving", &new, Some(&old), ANYONE, view),
                Verdict::Allow
            );
        }
        // Annotations already invalid and not touched by the update: not refused again
        // (the scheduler reports them; the update may be what cleans the pod up).
        let bad = pod(json!({"metadata": {"annotations": {"tandem.dev/qos": ""}},
            "spec": {"schedulerName": "tandem"}}));
        let mut relabelled = bad.clone();
        relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        assert_eq!(
            admit(
                Mode::Mutate,
                Op::Update,
                "serving",
                &relabelled,
                Some(&bad),
                ANYONE,
                view
            ),
            Verdict::Allow
        );
        let new = pod(
            json!({"metadata": {"annotations": {"tandem.dev/account": "b"}},
            "spec": {"schedulerName": "tandem", "nodeName": "k1"}}),
        );
        let m = denied(admit(
            Mode::Validate,
            Op::Update,
            "serving",
            &new,
            Some(&old),
            ANYONE,
            view,
        ));
        assert!(m.contains("may not charge account b"), "{m}");
        assert_eq!(
            admit(
                Mode::Mutate,
                Op::Other,
                "serving",
                &new,
                Some(&old),
                ANYONE,
                view
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn nothing_is_judged_before_the_namespace_map_is_read() {
        let view = View {
            cluster: "pool",
            policies: Err("TandemCluster default/pool not read yet"),
            guard: no_guard(),
        };
        let m = denied(admit(
            Mode::Mutate,
            Op::Create,
            "web",
            &pod(json!({})),
            None,
            ANYONE,
            view,
        ));
        assert!(m.contains("TandemCluster default/pool not read yet"), "{m}");
    }

    #[test]
    fn a_pod_of_a_workload_is_admitted() {
        let p = pod(
            json!({"spec": {"workloadRef": {"name": "train", "podGroup": "workers",
                                                     "podGroupReplicaKey": "0"}}}),
        );
        // The field is read (the k8s-openapi version in use has it), and it refuses nothing.
        assert_eq!(
            p.spec
                .as_ref()
                .and_then(|s| s.workload_ref.as_ref())
                .map(|r| r.pod_group.as_str()),
            Some("workers")
        );
        let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
            panic!("a Workload's pod is mutated like any other")
        };
        assert_eq!(ops[0]["path"], "/spec/schedulerName");
        let p = pod(json!({"spec": {"schedulerName": "tandem",
            "workloadRef": {"name": "train", "podGroup": "workers"}}}));
        assert_eq!(decide(Mode::Validate, "serving", &p), Verdict::Allow);
    }

    // --- the pool-node guard ---

    const OPERATOR: &str = "system:serviceaccount:tandem:tandem-operator";
    const BRIDGE: &str = "system:serviceaccount:tandem:tandem-bridge";

    struct Pool {
        nodes: BTreeSet<String>,
        operators: Vec<String>,
        binders: Vec<String>,
        policies: Vec<NamespacePolicy>,
    }

    impl Pool {
        fn new() -> Self {
            Pool {
                nodes: ["b1".to_owned(), "k1".to_owned()].into(),
                operators: vec![OPERATOR.to_owned()],
                binders: vec![BRIDGE.to_owned(), "system:kube-scheduler".to_owned()],
                policies: policies(),
            }
        }

        fn guard(&self) -> Guard<'_> {
            Guard {
                pool_nodes: Ok(&self.nodes),
                operators: &self.operators,
                binders: &self.binders,
                holders: std::slice::from_ref(&self.binders[0]),
            }
        }

        fn judge(
            &self,
            mode: Mode,
            op: Op,
            ns: &str,
            p: &Pod,
            old: Option<&Pod>,
            user: &str,
        ) -> Verdict {
            let view = View {
                cluster: "pool",
                policies: Ok(&self.policies),
                guard: self.guard(),
            };
            admit(mode, op, ns, p, old, Requester { username: user }, view)
        }

        fn create(&self, mode: Mode, ns: &str, p: &Pod, user: &str) -> Verdict {
            self.judge(mode, Op::Create, ns, p, None, user)
        }
    }

    /// A worker pod as the operator renders it (labels, owner, pool toleration, node pin).
    fn worker(extra: Value) -> Pod {
        let mut p = pod(json!({
            "metadata": {
                "labels": {
                    "app.kubernetes.io/name": "tandem",
                    "app.kubernetes.io/component": "worker",
                    "app.kubernetes.io/managed-by": "tandem-operator",
                    "tandem.dev/cluster": "pool",
                    "tandem.dev/workerset": "gpu",
                },
                "ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet",
                    "name": "gpu", "uid": "u", "controller": true}],
            },
            "spec": {"tolerations": [{"key": "tandem.dev/pool", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["b1"]}]}]}}}},
        }));
        let mut v = serde_json::to_value(&p).unwrap();
        crate_merge(&mut v, extra);
        p = serde_json::from_value(v).unwrap();
        p
    }

    #[test]
    fn a_preset_node_name_onto_a_pool_node_is_refused_from_any_namespace() {
        let pool = Pool::new();
        let pinned = pod(json!({"spec": {"nodeName": "b1"}}));
        for mode in [Mode::Guard, Mode::Mutate, Mode::Validate] {
            let m = denied(pool.create(mode, "web", &pinned, "alice"));
            assert!(
                m.starts_with("spec.nodeName: \"b1\" is a Tandem pool node"),
                "{m}"
            );
        }
        // A node outside the pool: not the guard's business.
        let elsewhere = pod(json!({"spec": {"nodeName": "cpu-7"}}));
        assert_eq!(
            pool.create(Mode::Guard, "web", &elsewhere, "alice"),
            Verdict::Allow
        );
        // Naming the tandem scheduler does not make a preset node acceptable.
        let p = pod(json!({"spec": {"nodeName": "k1", "schedulerName": "tandem"}}));
        assert!(denied(pool.create(Mode::Guard, "web", &p, "alice")).contains("pool node"));
        // Before the Node list is read: refused, naming why; pods naming no node pass.
        let g = Guard {
            pool_nodes: Err("nodes not listed yet"),
            ..pool.guard()
        };
        let view = View {
            cluster: "pool",
            policies: Ok(&pool.policies),
            guard: g,
        };
        let m = denied(admit(
            Mode::Guard,
            Op::Create,
            "web",
            &elsewhere,
            None,
            ANYONE,
            view,
        ));
        assert!(
            m.contains("cannot tell yet") && m.contains("nodes not listed yet"),
            "{m}"
        );
        assert_eq!(
            admit(
                Mode::Guard,
                Op::Create,
                "web",
                &pod(json!({})),
                None,
                ANYONE,
                view
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn a_pod_tolerating_the_pool_taint_outside_tandem_is_refused() {
        let pool = Pool::new();
        for tol in [
            json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": "tandem.dev/pool", "operator": "Equal", "value": "other"}),
            json!({"operator": "Exists"}),
            json!({"key": "", "operator": "Exists", "effect": "NoExecute"}),
        ] {
            let p =
                pod(json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}, tol]}}));
            let m = denied(pool.create(Mode::Guard, "web", &p, "alice"));
            assert!(
                m.starts_with(
                    "spec.tolerations[1]: tolerates the Tandem pool taint tandem.dev/pool"
                ),
                "{tol}: {m}"
            );
        }
        // Tolerations that do not reach the pool: fine.
        for tol in [
            json!({"key": "gpu", "operator": "Exists"}),
            json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "PreferNoSchedule"}),
            json!({"operator": "Exists", "effect": "PreferNoSchedule"}),
        ] {
            let p = pod(json!({"spec": {"tolerations": [tol]}}));
            assert_eq!(
                pool.create(Mode::Guard, "web", &p, "alice"),
                Verdict::Allow,
                "{tol}"
            );
        }
        // A pod the bridge schedules tolerates NoSchedule by design.
        let p = pod(json!({"spec": {"schedulerName": "tandem", "tolerations": [
            {"key": "tandem.dev/pool", "operator": "Equal", "value": "pool", "effect": "NoSchedule"}]}}));
        assert_eq!(
            pool.create(Mode::Guard, "serving", &p, "alice"),
            Verdict::Allow
        );
        // Pinned like a DaemonSet pod: allowed onto a node outside the pool, not onto one in it.
        let ds = |node: &str| {
            pod(json!({"spec": {"tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}}))
        };
        assert_eq!(
            pool.create(Mode::Guard, "monitoring", &ds("cpu-7"), "ds"),
            Verdict::Allow
        );
        assert!(
            denied(pool.create(Mode::Guard, "monitoring", &ds("b1"), "ds"))
                .starts_with("spec.tolerations[0]")
        );
        let p =
            pod(json!({"spec": {"nodeName": "cpu-7", "tolerations": [{"operator": "Exists"}]}}));
        assert_eq!(pool.create(Mode::Guard, "web", &p, "alice"), Verdict::Allow);
        // Both problems at once are both named.
        let p = pod(json!({"spec": {"nodeName": "b1", "tolerations": [{"operator": "Exists"}]}}));
        let m = denied(pool.create(Mode::Guard, "web", &p, "alice"));
        assert!(
            m.contains("spec.nodeName") && m.contains("; spec.tolerations[0]"),
            "{m}"
        );
    }

    #[test]
    fn an_opted_out_pod_of_a_mapped_namespace_stays_off_the_pool() {
        let pool = Pool::new();
        let out = json!({"metadata": {"labels": {MANAGED_LABEL: "false"}}});
        let mut pinned = out.clone();
        crate_merge(&mut pinned, json!({"spec": {"nodeName": "b1"}}));
        let m = denied(pool.create(Mode::Mutate, "serving", &pod(pinned), "alice"));
        assert!(
            m.starts_with("spec.nodeName: \"b1\" is a Tandem pool node"),
            "{m}"
        );
        let mut tolerating = out.clone();
        crate_merge(
            &mut tolerating,
            json!({"spec": {"tolerations": [
            {"key": "tandem.dev/pool", "operator": "Exists"}]}}),
        );
        let m = denied(pool.create(Mode::Mutate, "serving", &pod(tolerating), "alice"));
        assert!(m.starts_with("spec.tolerations[0]"), "{m}");
        // Opted out and minding its own business: still allowed, unchanged.
        assert_eq!(
            pool.create(Mode::Mutate, "serving", &pod(out), "alice"),
            Verdict::Allow
        );
    }

    #[test]
    fn gpu_holders_pass_only_when_the_bridge_creates_them() {
        let pool = Pool::new();
        let spec = crate::holder::Spec {
            cluster: "pool",
            namespace: "tandem",
            image: "img",
        };
        let h = crate::holder::pod(&spec, "b1", 2);
        // The bridge's own: pinned to a batch-mode pool node, tolerating NoExecute.
        assert_eq!(
            pool.create(Mode::Guard, "tandem", &h, BRIDGE),
            Verdict::Allow
        );
        // The same labels from anyone else (or the operator) prove nothing.
        for who in ["alice", OPERATOR, "system:kube-scheduler", ""] {
            let m = denied(pool.create(Mode::Guard, "tandem", &h, who));
            assert!(
                m.contains("spec.nodeName") && m.contains("spec.tolerations"),
                "{m}"
            );
        }
        // The bridge's identity admits no other pod onto the pool.
        let mut other = h.clone();
        if let Some(l) = other.metadata.labels.as_mut() {
            l.insert("app.kubernetes.io/component".into(), "worker".into());
        }
        assert!(denied(pool.create(Mode::Guard, "tandem", &other, BRIDGE)).contains("pool node"));
        // Through the mutating endpoint of a mapped namespace too (it opts out).
        assert_eq!(
            pool.create(Mode::Mutate, "serving", &h, BRIDGE),
            Verdict::Allow
        );
    }

    #[test]
    fn the_operators_own_pods_pass_only_when_the_operator_creates_them() {
        let pool = Pool::new();
        let w = worker(json!({}));
        assert_eq!(
            pool.create(Mode::Guard, "tandem", &w, OPERATOR),
            Verdict::Allow
        );
        let pinned = worker(json!({"spec": {"nodeName": "b1"}}));
        assert_eq!(
            pool.create(Mode::Guard, "tandem", &pinned, OPERATOR),
            Verdict::Allow
        );
        for kind in ["controller", "login"] {
            let owner = if kind == "login" {
                "LoginSet"
            } else {
                "TandemCluster"
            };
            let p = worker(json!({"metadata": {
                "labels": {"app.kubernetes.io/component": kind},
                "ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1", "kind": owner,
                    "name": "x", "uid": "u", "controller": true}]}}));
            assert_eq!(
                pool.create(Mode::Guard, "tandem", &p, OPERATOR),
                Verdict::Allow,
                "{kind}"
            );
        }
        // The same pod from anyone else: the labels and owner are forgeable.
        assert!(
            denied(pool.create(Mode::Guard, "tandem", &w, "alice"))
                .starts_with("spec.tolerations[0]")
        );
        assert!(
            denied(pool.create(Mode::Guard, "tandem", &pinned, BRIDGE))
                .starts_with("spec.nodeName")
        );
        // From the operator, but not shaped as its pods: refused.
        let bad = [
            json!({"metadata": {"labels": {"app.kubernetes.io/component": "sidecar"}}}),
            json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "helm"}}}),
            json!({"metadata": {"labels": {"tandem.dev/cluster": ""}}}),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1",
                "kind": "LoginSet", "name": "gpu", "uid": "u", "controller": true}]}}),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.devx/v1",
                "kind": "WorkerSet", "name": "gpu", "uid": "u", "controller": true}]}}),
            json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1",
                "kind": "WorkerSet", "name": "gpu", "uid": "u", "controller": false}]}}),
        ];
        for extra in bad {
            let p = worker(extra.clone());
            assert!(
                matches!(
                    pool.create(Mode::Guard, "tandem", &p, OPERATOR),
                    Verdict::Deny(_)
                ),
                "{extra}"
            );
        }
        let mut unlabelled = w.clone();
        unlabelled.metadata.labels = None;
        assert!(matches!(
            pool.create(Mode::Guard, "tandem", &unlabelled, OPERATOR),
            Verdict::Deny(_)
        ));
    }

    #[test]
    fn an_update_that_adds_a_pool_toleration_is_refused() {
        let pool = Pool::new();
        let old = pod(
            json!({"spec": {"nodeName": "cpu-7", "tolerations": [{"key": "gpu", "operator": "Exists"}]}}),
        );
        // nodeName is set (by a binding) but cpu-7 is outside the pool: pinned off it.
        let mut new = serde_json::to_value(&old).unwrap();
        new["spec"]["nodeName"] = json!("b1");
        new["spec"]["tolerations"] = json!([{"key": "gpu", "operator": "Exists"},
            {"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}]);
        let new: Pod = serde_json::from_value(new).unwrap();
        let m = denied(pool.judge(Mode::Guard, Op::Update, "web", &new, Some(&old), "alice"));
        assert!(m.starts_with("spec.tolerations[1]"), "{m}");
        // The update path does not judge nodeName (only a binding sets it, judged there).
        assert!(!m.contains("spec.nodeName"), "{m}");
        // A toleration the pod already had is not judged again (a label edit passes).
        let mut relabelled = new.clone();
        relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        assert_eq!(
            pool.judge(
                Mode::Guard,
                Op::Update,
                "web",
                &relabelled,
                Some(&new),
                "alice"
            ),
            Verdict::Allow
        );
        assert_eq!(
            pool.judge(Mode::Guard, Op::Other, "web", &new, Some(&old), "alice"),
            Verdict::Allow
        );
    }

    #[test]
    fn only_the_named_binders_bind_onto_pool_nodes() {
        let pool = Pool::new();
        let g = pool.guard();
        let who = |u| Requester { username: u };
        assert_eq!(guard_binding("b1", who(BRIDGE), g), Verdict::Allow);
        assert_eq!(
            guard_binding("k1", who("system:kube-scheduler"), g),
            Verdict::Allow
        );
        let m = denied(guard_binding("b1", who("alice"), g));
        assert!(
            m.starts_with("target.name: \"b1\" is a Tandem pool node; only the tandem scheduler binds pods there (alice may not)"),
            "{m}"
        );
        assert!(denied(guard_binding("b1", who(""), g)).contains("an unnamed requester"));
        assert_eq!(guard_binding("cpu-7", who("alice"), g), Verdict::Allow);
        let unread = Guard {
            pool_nodes: Err("nodes not listed yet"),
            ..g
        };
        assert!(denied(guard_binding("cpu-7", who("alice"), unread)).contains("cannot tell yet"));
        assert_eq!(guard_binding("b1", who(BRIDGE), unread), Verdict::Allow);
    }
}
