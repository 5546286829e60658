//! `TandemCluster` (short `tc`): one batch controller with its storage, partitions, QOS,
//! account tree, priority settings and the bridge's namespace map.
//!
//! What the API server can check on its own is in the schema: types (shares are integers),
//! minimums, name patterns, and CEL rules across the spec (an account's parent is declared,
//! names are unique, one default partition at most). [`crate::validate`] repeats the CEL
//! checks in Rust, so a server that does not evaluate CEL still gets a `Degraded` condition
//! naming the field instead of a broken controller.

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::{NAME_PATTERN, cel};

/// A Tandem batch cluster: the controller pod, its PVC, Service, config and key Secret.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tandem.dev",
    version = "v1alpha1",
    kind = "TandemCluster",
    plural = "tandemclusters",
    shortname = "tc",
    namespaced,
    status = "TandemClusterStatus",
    doc = "A Tandem batch cluster: controller, storage, partitions, QOS, accounts and fair share",
    printcolumn(
        name = "READY",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "ENDPOINT",
        type_ = "string",
        json_path = ".status.controllerEndpoint"
    ),
    printcolumn(name = "NODES", type_ = "integer", json_path = ".status.nodes.total"),
    printcolumn(name = "IDLE", type_ = "integer", json_path = ".status.nodes.idle"),
    printcolumn(name = "DOWN", type_ = "integer", json_path = ".status.nodes.down"),
    printcolumn(
        name = "AGE",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = cel::cluster_rules)]
pub struct TandemClusterSpec {
    /// Image with the `tandem` binary. Default: `ghcr.io/tandem-dev/tandem:<operator version>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The controller pod.
    #[serde(default)]
    pub controller: ControllerSpec,
    /// The controller's durable store.
    #[serde(default)]
    pub storage: StorageSpec,
    /// Partitions (at least one; with none marked default the first is).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub partitions: Vec<PartitionSpec>,
    /// QOS levels besides the built-in `normal` (an entry named `normal` replaces it).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub qos: Vec<QosSpec>,
    /// The account tree below `root`, with users. Reconciled into the controller's store;
    /// accounts, users and QOS made with `sacctmgr` that this spec does not name are left alone.
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub accounts: Vec<AccountSpec>,
    /// Multifactor priority weights and fair-share decay.
    #[serde(default)]
    pub priority: PrioritySpec,
    /// The bridge's namespace -> account map with per-namespace defaults.
    #[serde(default)]
    pub bridge: BridgeSpec,
}

/// The controller pod's shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// A worker silent this long is lost (`--node-timeout`, e.g. `30s`). Default: 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)?$"))]
    pub node_timeout: Option<String>,
}

/// The PVC holding the controller's store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSpec {
    /// Requested size (a Kubernetes quantity). Default: `10Gi`.
    #[serde(default = "default_storage_size")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"))]
    pub size: String,
    /// Storage class; default: the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        Self {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

fn default_storage_size() -> String {
    crate::defaults::DEFAULT_STORAGE_SIZE.to_owned()
}

/// A partition (Slurm's `PartitionName=`). Workers join it through a `WorkerSet`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PartitionSpec {
    #[schemars(regex(pattern = NAME_PATTERN), length(min = 1, max = 63))]
    pub name: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// Slurm time string (`2-00:00:00`, `30` = 30 minutes, `UNLIMITED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_tier: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_job_factor: Option<u16>,
    /// UP (default), DOWN, DRAIN or INACTIVE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PartitionStateSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum PartitionStateSpec {
    Up,
    Down,
    Drain,
    Inactive,
}

/// A QOS (`sacctmgr add qos`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QosSpec {
    #[schemars(regex(pattern = NAME_PATTERN), length(min = 1, max = 63))]
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    /// QOS this one may preempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempt: Vec<String>,
    /// `requeue` (default) or `cancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_mode: Option<PreemptModeSpec>,
    /// Seconds a preempted job keeps running after its SIGTERM notice (Slurm's GraceTime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_time_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs_per_user: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_per_user: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs_per_account: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_submit_per_account: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus_per_user: Option<u32>,
    /// Slurm time string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wall: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PreemptModeSpec {
    Requeue,
    Cancel,
}

/// An account below `root` (or below `parent`, which must be declared here too).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccountSpec {
    #[schemars(regex(pattern = NAME_PATTERN), length(min = 1, max = 63))]
    pub name: String,
    /// Parent account; empty or `root` = a top-level account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Fair-share shares (an integer, at least 1). Default: 1.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub shares: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grp_gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grp_jobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs_per_user: Option<u32>,
    /// Users associated with this account.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub users: Vec<UserSpec>,
}

/// A user's association with an account.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UserSpec {
    #[schemars(regex(pattern = r"^[a-z_][a-z0-9_.-]*$"), length(min = 1, max = 63))]
    pub name: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub shares: u32,
    /// This account is the user's default (first association otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
}

fn one() -> u32 {
    1
}

/// Multifactor priority weights and fair-share decay.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrioritySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<PriorityWeightsSpec>,
    /// Age at which the age factor saturates (Slurm time string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub favor_small: Option<bool>,
    /// Half-life of usage decay (Slurm time string, e.g. `7-00:00:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairshare_half_life: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityWeightsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairshare: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tres_cpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tres_mem: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tres_gpu: Option<u32>,
}

/// How the bridge charges pods: namespace -> account, with defaults per namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BridgeSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub namespaces: Vec<NamespaceMapping>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceMapping {
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        length(min = 1, max = 63)
    )]
    pub namespace: String,
    /// Account pods of this namespace charge (declared in `accounts`).
    pub account: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Default time limit (Slurm time string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// Accounts pods may pick by annotation besides `account`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_accounts: Vec<String>,
}

/// What the operator observed and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TandemClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `http://<service clusterIP>:<port>` of the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_endpoint: Option<String>,
    /// Node counts by state, as `sinfo` reports them.
    #[serde(default)]
    pub nodes: NodeCounts,
    /// Accounts, users and QOS this spec put into the store: the only ones the operator ever
    /// changes or deletes (those made with `sacctmgr` are not its business).
    #[serde(default)]
    pub managed: ManagedEntities,
    /// Partitions removed from the spec but kept in the controller's config because jobs
    /// still reference them (slurm-operator #138: removing them crash-looped slurmctld).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained_partitions: Vec<String>,
    /// Partitions in the controller's config now (spec and retained).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
}

/// Node counts by state (`sinfo`'s states; a node counts once, by its base state).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    pub total: u32,
    pub idle: u32,
    pub mixed: u32,
    pub allocated: u32,
    pub down: u32,
    /// DRAINING or DRAINED.
    pub drain: u32,
    /// Nodes in kube mode (serving bridged pods).
    pub kube: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedEntities {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
    /// `user/account` pairs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qos: Vec<String>,
}
