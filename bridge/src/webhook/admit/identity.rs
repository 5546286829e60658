//! Which pods the pool-node guard lets onto pool nodes because of who creates them: the
//! bridge's GPU holders and the operator's own pods. Labels and owner references only say
//! which kind of pod it is; the requester's identity, as the API server authenticated it,
//! is what counts (see [`super`]'s documentation).
//!
//! Apart from the guard's rules ([`super::guard`]) so that the one place a pod is trusted
//! reads on its own.

use k8s_openapi::api::core::v1::Pod;
use tandem_kubeclient::labels as operator;

use super::Requester;
use crate::labels::MANAGED_LABEL;

/// Whether `pod` is a GPU holder ([`crate::holder`]) created by the bridge's identity: the
/// holder's labels and the cluster's, from a requester named in `holders`. As for operator
/// pods, the identity is what counts; the labels only say which kind of pod it is.
pub(super) fn holder_pod(pod: &Pod, who: Requester<'_>, holders: &[String]) -> bool {
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
pub(super) fn operator_pod(pod: &Pod, who: Requester<'_>, operators: &[String]) -> bool {
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
