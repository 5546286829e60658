//! Pods and Deployments in bridge tests: builders of Tandem-scheduled GPU workloads, and
//! predicates on a pod (its node, phase, `PodScheduled` condition, job id). Apart from the
//! environment because they are plain functions on objects.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodCondition};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// One line about a pod: name, node, phase, and its `PodScheduled` condition.
pub fn describe(p: &Pod) -> String {
    format!(
        "{} node={:?} phase={:?} scheduled={:?}",
        p.metadata.name.as_deref().unwrap_or(""),
        node_of(p),
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        scheduled(p).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone())),
    )
}

/// The node a pod is bound to.
pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Whether the pod's phase is `Running`.
pub fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The pod's `PodScheduled` condition.
pub fn scheduled(p: &Pod) -> Option<&PodCondition> {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
}

/// The message of the pod's `PodScheduled=False` `Unschedulable` condition, if it has one.
pub fn unschedulable(p: &Pod) -> Option<&str> {
    scheduled(p)
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.message.as_deref().unwrap_or(""))
}

/// The `tandem.dev/job-id` annotation of a bound pod.
pub fn job_id(p: &Pod) -> Option<&str> {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("tandem.dev/job-id"))
        .map(String::as_str)
}

/// A Deployment of `replicas` pods of `gpus` GPUs each (label `app=<name>`), scheduled by
/// Tandem.
pub fn deployment(name: &str, replicas: u32, gpus: u32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": "tandem",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "serve", "image": "busybox",
                        "command": ["sh", "-c", "sleep 300"],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "limits": {"nvidia.com/gpu": gpus.to_string()}}}],
                },
            },
        },
    }))
    .unwrap_or_else(|e| panic!("deployment {name}: {e}"))
}

/// A pod of one GPU (and 1 CPU, 1 GiB) that sleeps, scheduled by Tandem; `extra` is merged
/// into the whole object (`{"metadata": {"labels": ..}}`, `{"spec": {"nodeSelector": ..}}`).
pub fn gpu_pod(name: &str, extra: serde_json::Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tandem",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "serve", "image": "busybox",
                "command": ["sh", "-c", "sleep 300"],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                              "limits": {"nvidia.com/gpu": "1"}}}],
        },
    });
    crate::testkit::merge_json(&mut pod, extra);
    serde_json::from_value(pod).unwrap_or_else(|e| panic!("pod {name}: {e}"))
}

/// Sets the Deployment `name`'s replicas.
pub async fn scale(api: &Api<Deployment>, name: &str, replicas: u32) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .unwrap_or_else(|e| panic!("scaling {name} to {replicas}: {e}"));
}
