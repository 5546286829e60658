//! `WorkerSet` (short `ws`): workers of one shape joining one cluster, one pod per Kubernetes
//! node, scaled through the scale subresource (`kubectl scale`, HPA, KEDA).
//!
//! A worker's batch node name is its Kubernetes node's name, so the bridge can map batch
//! allocations to Kubernetes nodes. Scale-in drains the chosen workers in the controller
//! first and deletes their pods only when idle or at the drain deadline.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::template::PodOverrides;
use super::{NAME_PATTERN, cel};

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "WorkerSet",
    plural = "workersets",
    shortname = "ws",
    namespaced,
    status = "WorkerSetStatus",
    doc = "Tandem workers of one shape, one per Kubernetes node, with the scale subresource",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "DESIRED", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "READY", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "IDLE", type_ = "integer", json_path = ".status.idle"),
    printcolumn(name = "ALLOCATED", type_ = "integer", json_path = ".status.allocated"),
    printcolumn(name = "KUBE", type_ = "integer", json_path = ".status.kube"),
    printcolumn(name = "DOWN", type_ = "integer", json_path = ".status.down"),
    printcolumn(name = "DRAIN", type_ = "integer", json_path = ".status.drain"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = cel::workerset_rules)]
pub struct WorkerSetSpec {
    /// The `TandemCluster` (same namespace) these workers join.
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 40)
    )]
    pub cluster_name: String,
    /// Number of workers (pods, one per Kubernetes node).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100000))]
    pub replicas: i32,
    /// Partitions the workers join (declared in the cluster's `partitions`).
    #[schemars(length(min = 1, max = 16), inner(regex(pattern = NAME_PATTERN)))]
    pub partitions: Vec<String>,
    /// Node features for `--constraint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(regex(pattern = NAME_PATTERN)))]
    pub features: Vec<String>,
    /// GPUs each worker offers. Unset: what NVML finds on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<GpuShape>,
    /// CPUs each worker offers. Default: what the pod may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub cpus: Option<u32>,
    /// Memory each worker offers (`256G`, `64000` MiB). Default: the machine's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+[KMGT]?$"))]
    pub memory: Option<String>,
    #[serde(default)]
    pub template: PodOverrides,
    #[serde(default)]
    pub scale_in: ScaleInPolicy,
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
}

/// The GPUs of one worker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuShape {
    /// GPUs per worker; unset = autodetect with NVML.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub count: Option<u32>,
    /// GPU type for `--gres=gpu:TYPE:N` (`h100`); unset = from the NVML device name.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = NAME_PATTERN))]
    pub gpu_type: Option<String>,
}

/// How workers leave on scale-in (and on deletion of the set).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleInPolicy {
    /// Seconds a drained worker may keep running jobs before its pod is deleted anyway
    /// (its jobs are then requeued, or end NODE_FAIL if they may not be). Default: 3600.
    #[serde(default = "default_drain_deadline")]
    #[schemars(range(min = 0))]
    pub drain_deadline_seconds: u32,
}

impl Default for ScaleInPolicy {
    fn default() -> Self {
        Self {
            drain_deadline_seconds: default_drain_deadline(),
        }
    }
}

fn default_drain_deadline() -> u32 {
    crate::defaults::DEFAULT_DRAIN_DEADLINE_S
}

/// How a template change reaches running workers: each outdated worker is drained, and its
/// pod replaced once idle (running jobs are never cut short by a rollout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateStrategy {
    /// Most workers out of service for the rollout at once. Default: 1.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1))]
    pub max_unavailable: u32,
}

impl Default for UpdateStrategy {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

fn default_max_unavailable() -> u32 {
    1
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Worker pods that exist and are not being deleted (the scale subresource's count).
    #[serde(default)]
    pub replicas: i32,
    /// Workers whose batch node is registered and up.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Workers running the current template.
    #[serde(default)]
    pub updated_replicas: i32,
    #[serde(default)]
    pub idle: i32,
    /// ALLOCATED or MIXED.
    #[serde(default)]
    pub allocated: i32,
    /// Nodes in kube mode (serving bridged pods).
    #[serde(default)]
    pub kube: i32,
    #[serde(default)]
    pub down: i32,
    /// DRAINING or DRAINED.
    #[serde(default)]
    pub drain: i32,
    /// Label selector of the pods, for the scale subresource (HPA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Batch node names this set has workers for (or had, until removed from the
    /// controller): how the operator knows which controller nodes are its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
}
