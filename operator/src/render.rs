//! Pure builders: custom resource -> child objects (Slinky's `builder/`). Every object
//! carries the owner reference, the recommended labels and, for pods, the hash of what it was
//! rendered from, so a changed spec shows as outdated pods.
//!
//! Control-plane pods (controller, login) pass PodSecurity `restricted`. Workers too when
//! the set runs them as a user (`template.runAs`); otherwise the worker runs as root without
//! privilege and with only the capabilities that starting jobs as their submitters needs.
//!
//! # Secrets and who mounts them
//!
//! | Secret | holds | mounted by |
//! |---|---|---|
//! | `<tc>-key` | the cluster key | controller, workers, the login pods' `authd` container |
//! | `<tc>-ca` | the cluster CA (`ca.crt`, `ca.key`) | workers and login pods, `ca.crt` only |
//! | `<tc>-controller-tls` | the controller's certificate (`kubernetes.io/tls`) | controller |
//! | `<ws>-<node>-step-tls` | a worker's step-service certificate for its node name (`kubernetes.io/tls`), owned by the WorkerSet | that node's worker pod |
//!
//! Login pods never see the cluster key or the CA key: a user who can exec into one gets
//! credentials for their own uid from the identity agent, nothing more.
//!
//! No pod mounts the CA key: the operator alone issues certificates. A worker's step
//! service (what srun connects to) presents a certificate for the worker's *node name*,
//! which is known when the pod is rendered (the pod is pinned to its Kubernetes node and the
//! worker registers as `spec.nodeName`). The operator issues it from the cluster CA into
//! the pod's own Secret ([`worker_step_tls_secret`]) right before it creates the pod,
//! afresh for every pod it creates, and the worker reads it with `--tls-dir`
//! ([`STEP_TLS_DIR`]); it refuses to start with a certificate that does not name its node.
//! srun dials the address the worker advertises, its pod IP, and verifies the certificate
//! as that node (`tandem_net::endpoint::connect_to_node`; the name verified is separate
//! from the address dialled, `tandem_net::net`), so the pod IP, which exists only once
//! the pod's sandbox does, need not be in any certificate. A worker presenting another
//! node's certificate is refused. (The controller dials no worker: workers connect to it.)
//!
//! The step Secrets are owned by the WorkerSet, not by their pods: made before the pod,
//! they are there when the kubelet mounts them, and a pod re-created under the same name
//! (an update, a restart of the node) does not race the garbage collector for its
//! predecessor's Secret. A node that leaves the set leaves its Secret behind until the set
//! is deleted or a pod for that node is made again (which reissues it).
//!
//! A worker still holds the cluster key, which signs any credential, root's included; a
//! per-node worker credential in its place is the larger least-privilege step left, and the
//! design's ("a worker speaks only for its node").
//!
//! # GPUs: worker pods request none; the bridge's GPU holder pod holds them in batch mode
//!
//! Batch-mode pool nodes' GPUs are held, so that a pod that reaches the node around the
//! bridge is not granted `nvidia.com/gpu` by the kubelet while batch jobs use them.
//! Admission already refuses the ways around the bridge (`nodeName` onto pool nodes, pool
//! tolerations, foreign bindings; `tandem_bridge::webhook::admit`), and the `NoExecute`
//! taint evicts what gets there anyway, so what is left are the guard's exempt namespaces
//! and whoever can bypass admission. Two ways to also hold the GPUs were weighed:
//!
//! - *Worker pods request the node's GPUs* (`nvidia.com/gpu: N`). Pod resources are
//!   immutable (in-place resize excludes extended resources), so the worker would hold them
//!   in `kube` mode too, and the kubelet would reject every bridged pod requesting a GPU
//!   there at admission (`OutOfnvidia.com/gpu`, phase Failed: terminal; a Job counts a
//!   failure). Giving bridged pods devices some other way means `NVIDIA_VISIBLE_DEVICES`
//!   injection, which hardened runtimes refuse from unprivileged pods because it lets any
//!   pod take any GPU, or privileged pods: worse than the hole. Not done. A set whose nodes
//!   never serve bridged pods may still request GPUs through `template.resources` (passed
//!   through as written); on pool nodes that breaks `kube` mode as above.
//! - *A per-node holder pod while in `batch` mode*, requesting the node's GPUs and deleted
//!   when the node turns `kube`: done, by the bridge, not the operator. It is safe only if
//!   the flip to `kube` waits until the kubelet reports the holder's containers stopped
//!   before a GPU pod is bound there, and the flip and the bind are the bridge's; the
//!   operator sees the `tandem.dev/mode` label change when the bridge is already binding,
//!   so a holder it deleted on that change would race the bind.
//!
//! The holder lives in `tandem_bridge::holder` (`bridge/src/holder.rs`; its API calls in
//! `bridge/src/scheduler/modes/holders.rs`), owned by the bridge's mode sync: while a pool
//! node with allocatable GPUs is in `batch` mode, `<cluster>-gpu-hold-<node>` runs in the
//! bridge's (the cluster's) namespace, pinned by `spec.nodeName`, requesting all of them,
//! `sleep infinity` from the Tandem image, tolerating the pool taint. Before writing `kube`
//! the bridge deletes it and waits for the kubelet's report that its container stopped,
//! and binds no pod to a node not yet written `kube`; after writing `batch` it creates it.
//! The admission guard admits it only from the bridge's service account
//! (`TANDEM_BRIDGE_GUARD_HOLDERS`); it names no scheduler, so it is no bridged pod and no
//! kube-side occupancy. One refused at admission (`OutOfnvidia.com/gpu`) means something
//! else holds GPUs on a batch node: the bridge drains that node in the controller with
//! that reason (the `bridge` role may drain, never resume) and publishes a Warning Event.
//! Dynamic Resource Allocation (a ResourceClaim per mode) is the lasting form of the same
//! idea.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crd::template::PodOverrides;
use crate::crd::{LoginSet, TandemCluster, WorkerSet};
use crate::defaults::*;
use crate::labels::*;
use crate::partitions::Rendered;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("building {what}")]
    Build {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("rendering the controller config")]
    Toml(#[source] toml::ser::Error),
}

fn typed<T: serde::de::DeserializeOwned>(what: &'static str, v: Value) -> Result<T, RenderError> {
    serde_json::from_value(v).map_err(|source| RenderError::Build { what, source })
}

/// Short, stable hash of anything serializable (pod template hashes).
pub fn hash_of(v: &impl serde::Serialize) -> String {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    let d = Sha256::digest(&bytes);
    let mut s = String::new();
    for b in &d[..8] {
        let _ = write!(s, "{b:02x}");
    }
    s
}

// === names ===

pub fn key_secret_name(tc: &str) -> String {
    format!("{tc}-key")
}
pub fn ca_secret_name(tc: &str) -> String {
    format!("{tc}-ca")
}
pub fn controller_tls_secret_name(tc: &str) -> String {
    format!("{tc}-controller-tls")
}
/// The step-service certificate Secret of worker set `ws`'s pod on node `node`
/// (`<pod>-step-tls`, within the 253 characters of an object name).
pub fn worker_step_tls_secret_name(ws: &str, node: &str) -> String {
    const SUFFIX: &str = "-step-tls";
    let mut pod = worker_pod_name(ws, node);
    pod.truncate(253 - SUFFIX.len());
    format!("{}{SUFFIX}", pod.trim_end_matches(['-', '.']))
}
pub fn config_map_name(tc: &str) -> String {
    format!("{tc}-config")
}
pub fn service_name(tc: &str) -> String {
    format!("{tc}-controller")
}
pub fn pvc_name(tc: &str) -> String {
    format!("{tc}-state")
}
pub fn controller_pod_name(tc: &str) -> String {
    format!("{tc}-controller")
}
/// One pod per Kubernetes node: the name says which, and a second create for the same node
/// conflicts (409) instead of making a duplicate.
pub fn worker_pod_name(ws: &str, node: &str) -> String {
    let mut name = format!("{ws}-{node}");
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_owned()
}

pub fn labels(cluster: &str, component: &str, instance: &str) -> BTreeMap<String, String> {
    [
        (APP_NAME, "tandem"),
        (APP_INSTANCE, instance),
        (APP_COMPONENT, component),
        (APP_MANAGED_BY, MANAGER),
        (CLUSTER, cluster),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The label selector string of a worker set's pods (`status.selector`, for HPA).
pub fn worker_selector(ws: &str) -> String {
    format!("{WORKER_SET}={ws}")
}

fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "tandem.dev/v1alpha1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn worker_set_owner(ws: &WorkerSet) -> OwnerReference {
    owner(
        "WorkerSet",
        &ws.metadata.name.clone().unwrap_or_default(),
        &ws.metadata.uid.clone().unwrap_or_default(),
    )
}

pub fn cluster_owner(tc: &TandemCluster) -> OwnerReference {
    owner(
        "TandemCluster",
        &tc.metadata.name.clone().unwrap_or_default(),
        &tc.metadata.uid.clone().unwrap_or_default(),
    )
}

fn restricted_container() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": true,
        "runAsNonRoot": true,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

fn restricted_pod(user: i64, group: i64) -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": user,
        "runAsGroup": group,
        "fsGroup": group,
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

/// The unprivileged uid control-plane pods run as (distroless `nonroot`).
pub const NONROOT: i64 = 65532;
/// The login pods' identity agent runs as its own uid, so the login container's users
/// (another uid) cannot reach its files or its process.
pub const AUTHD_UID: i64 = 65531;

/// The agent's uid in a login pod whose users run as `login_uid`: never the same.
pub fn authd_uid(login_uid: i64) -> i64 {
    if login_uid == AUTHD_UID {
        AUTHD_UID - 1
    } else {
        AUTHD_UID
    }
}

/// Bumped when pods are rendered differently for the same spec (new volumes, flags), so an
/// operator upgrade rolls its pods instead of leaving old ones that can no longer connect.
/// 3: workers take their step certificate from a per-node Secret, no longer the CA key.
const RENDER_REVISION: u32 = 3;

// === the cluster's children ===

fn merged(
    base: BTreeMap<String, String>,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = extra.clone();
    m.extend(base); // ours win: selectors depend on them
    m
}

/// Metadata of an object that belongs to the cluster's controller (ConfigMap, Secret,
/// Service, PVC): its name, the cluster's namespace and labels, owned by the cluster.
fn controller_object_meta(tc: &TandemCluster, object: &str) -> serde_json::Value {
    let name = tc.metadata.name.clone().unwrap_or_default();
    json!({
        "name": object,
        "namespace": tc.metadata.namespace,
        "labels": labels(&name, COMPONENT_CONTROLLER, &name),
        "ownerReferences": [cluster_owner(tc)],
    })
}

mod controller;
mod login;
mod secrets;
mod worker;
pub use controller::*;
pub use login::*;
pub use secrets::*;
pub use worker::*;

#[cfg(test)]
mod tests;
