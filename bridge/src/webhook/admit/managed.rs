//! The rules for a pod Tandem manages (see [`super`] for which pods those are): its
//! `tandem.dev/*` annotations and account, the fields a pod scheduled by Tandem may not
//! set, and the JSON patch that makes it name the scheduler and tolerate the pool.
//!
//! Apart from the pool-node guard ([`super::guard`]), which judges the pods Tandem does
//! *not* schedule, and from [`super::admit`], which decides which rules a pod gets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde_json::{Value, json};

use super::{DEFAULT_SCHEDULER, Mode};
use crate::annotations;
use crate::labels::{ACCOUNT, MANAGED_LABEL, POOL_TAINT, PREFIX, SCHEDULER_NAME};
use crate::policy::{self, NamespacePolicy, PolicyError};

/// A managed pod's update: only the annotations can change what was checked (the other
/// fields are immutable once created); they are checked again when they changed.
pub(super) fn check_update(
    namespace: &str,
    pod: &Pod,
    old: Option<&Pod>,
    policies: &[NamespacePolicy],
    problems: &mut Vec<String>,
) {
    let before = old.map(|o| tandem_annotations(o.metadata.annotations.as_ref()));
    if before.as_ref() != Some(&tandem_annotations(pod.metadata.annotations.as_ref())) {
        check_annotations(namespace, pod, policies, problems);
    }
}

/// A managed pod's creation: its annotations, and every field a pod scheduled by Tandem
/// may not set. `/mutate` (`Mode::Mutate`) leaves an unset or defaulted scheduler name to
/// its patch; `/validate` requires `tandem`.
pub(super) fn check_create(
    mode: Mode,
    namespace: &str,
    pod: &Pod,
    policies: &[NamespacePolicy],
    problems: &mut Vec<String>,
) {
    let spec = pod.spec.as_ref();
    let scheduler = spec.and_then(|s| s.scheduler_name.as_deref());
    check_annotations(namespace, pod, policies, problems);
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
        // Guard mode never comes here: `admit` returns first.
        Mode::Validate | Mode::Guard => scheduler != Some(SCHEDULER_NAME),
    };
    if wrong_scheduler {
        problems.push(format!(
            "spec.schedulerName: {:?}; pods managed by Tandem are scheduled by {SCHEDULER_NAME:?} \
             (leave it unset, or label the pod {MANAGED_LABEL}=false to opt out)",
            scheduler.unwrap_or_default()
        ));
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
pub(super) fn mutations(pod: &Pod, cluster: &str) -> Vec<Value> {
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
