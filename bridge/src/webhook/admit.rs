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

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde_json::{Value, json};

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

/// Decides on one pod in `namespace`. `old` is the pod before an update.
pub fn admit(
    mode: Mode,
    op: Op,
    namespace: &str,
    pod: &Pod,
    old: Option<&Pod>,
    view: View<'_>,
) -> Verdict {
    if op == Op::Other {
        return Verdict::Allow;
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
        return Verdict::Allow;
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
    let unset = matches!(scheduler, None | Some("") | Some(DEFAULT_SCHEDULER));
    let wrong_scheduler = match mode {
        Mode::Mutate => !unset && scheduler != Some(SCHEDULER_NAME),
        Mode::Validate => scheduler != Some(SCHEDULER_NAME),
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

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        admit(mode, Op::Create, ns, p, None, view)
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
                admit(mode, Op::Update, "serving", &new, Some(&old), view),
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
            view,
        ));
        assert!(m.contains("may not charge account b"), "{m}");
        assert_eq!(
            admit(Mode::Mutate, Op::Other, "serving", &new, Some(&old), view),
            Verdict::Allow
        );
    }

    #[test]
    fn nothing_is_judged_before_the_namespace_map_is_read() {
        let view = View {
            cluster: "pool",
            policies: Err("TandemCluster default/pool not read yet"),
        };
        let m = denied(admit(
            Mode::Mutate,
            Op::Create,
            "web",
            &pod(json!({})),
            None,
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
}
