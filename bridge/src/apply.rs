//! The Kubernetes side of a decision: bindings, evictions, `PodScheduled` conditions and
//! Events, written as kube-scheduler writes them (autoscalers and dashboards key on them).

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

use crate::labels::{JOB_ID, SLOT_FINALIZER};

/// Whether `pod` carries the bridge's [`SLOT_FINALIZER`].
pub fn protected(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == SLOT_FINALIZER))
}

/// Adds [`SLOT_FINALIZER`] to `pod` (before it is bound). A JSON patch that tests the list
/// it extends, so a concurrent change of the finalizers is a conflict, not a lost write.
pub async fn protect(client: &Client, pod: &Pod) -> kube::Result<()> {
    if protected(pod) {
        return Ok(());
    }
    let (ns, name) = names(pod);
    let ops = match &pod.metadata.finalizers {
        Some(f) if !f.is_empty() => serde_json::json!([
            {"op": "test", "path": "/metadata/finalizers", "value": f},
            {"op": "add", "path": "/metadata/finalizers/-", "value": SLOT_FINALIZER},
        ]),
        _ => serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid},
            {"op": "add", "path": "/metadata/finalizers", "value": [SLOT_FINALIZER]},
        ]),
    };
    json_patch(client, ns, name, ops).await
}

/// Removes [`SLOT_FINALIZER`] from `pod` (its slot is free). Tests the entry it removes,
/// by index, as kube-runtime's finalizer helper does. Gone already is done.
pub async fn release(client: &Client, pod: &Pod) -> kube::Result<()> {
    let Some(i) = pod
        .metadata
        .finalizers
        .as_ref()
        .and_then(|f| f.iter().position(|x| x == SLOT_FINALIZER))
    else {
        return Ok(());
    };
    let (ns, name) = names(pod);
    let path = format!("/metadata/finalizers/{i}");
    let ops = serde_json::json!([
        {"op": "test", "path": path, "value": SLOT_FINALIZER},
        {"op": "remove", "path": path},
    ]);
    match json_patch(client, ns, name, ops).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        r => r,
    }
}

fn names(pod: &Pod) -> (&str, &str) {
    (
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
    )
}

async fn json_patch(
    client: &Client,
    ns: &str,
    name: &str,
    ops: serde_json::Value,
) -> kube::Result<()> {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
}

/// Binds `pod` to `node` through the `binding` subresource, annotating it with the job.
pub async fn bind(
    client: &Client,
    ns: &str,
    pod: &str,
    node: &str,
    job_id: u64,
) -> kube::Result<()> {
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(pod.to_owned()),
            annotations: Some([(JOB_ID.to_owned(), job_id.to_string())].into()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            ..ObjectReference::default()
        },
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            pod,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(()),
        // Bound already (a watch event older than this bridge's own binding made it
        // decide again): done if it is where this job put it; any other node stays an
        // error, retried and logged.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let current = api.get(pod).await?;
            if current.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) {
                Ok(())
            } else {
                Err(kube::Error::Api(e))
            }
        }
        Err(e) => Err(e),
    }
}

/// Evicts `pod` through the Eviction API, so PodDisruptionBudgets are honoured.
pub async fn evict(client: &Client, ns: &str, pod: &str) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    api.evict(pod, &EvictParams::default()).await.map(|_| ())
}

/// Whether an eviction was refused to keep a PodDisruptionBudget (429 Too Many Requests).
pub fn refused_by_budget(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 429)
}

/// Deletes `pod` (with its own grace period) whose eviction a PodDisruptionBudget kept
/// refusing past the deadline, with a Warning Event on it that says why.
pub async fn delete_overdue(
    client: &Client,
    recorder: &Recorder,
    pod: &Pod,
    note: String,
) -> kube::Result<()> {
    let (ns, name) = names(pod);
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = kube::api::DeleteParams {
        preconditions: pod
            .metadata
            .uid
            .clone()
            .map(|uid| kube::api::Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
        ..kube::api::DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e),
    }
    let e = Event {
        type_: EventType::Warning,
        reason: "EvictionDeadlineExceeded".into(),
        note: Some(note),
        action: "Deleting".into(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&e, &pod.object_ref(&())).await {
        tracing::debug!(error = %err, "event not recorded");
    }
    Ok(())
}

/// `PodScheduled=False`, reason `Unschedulable`, with `message`.
pub async fn unschedulable(
    client: &Client,
    ns: &str,
    pod: &str,
    message: &str,
) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": now,
    }]}});
    api.patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
}

/// An Event on `pod`, as kube-scheduler reports (`Scheduled`, `FailedScheduling`).
pub async fn event(recorder: &Recorder, pod: &Pod, warning: bool, reason: &str, note: String) {
    let e = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_owned(),
        note: Some(note),
        action: if warning { "Scheduling" } else { "Binding" }.to_owned(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&e, &pod.object_ref(&())).await {
        tracing::debug!(error = %err, "event not recorded");
    }
}
