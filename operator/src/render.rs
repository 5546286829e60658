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

/// The controller's `--config` TOML: partitions (with retained ones), QOS-free (QOS and
/// accounts go through the Accounting RPCs, so `sacctmgr` changes are not fought over), and
/// the priority settings.
pub fn controller_toml(tc: &TandemCluster, parts: &Rendered) -> Result<String, RenderError> {
    use toml::{Table, Value as T};
    let spec = &tc.spec;
    let mut root = Table::new();
    root.insert(
        "cluster_name".into(),
        T::String(tc.metadata.name.clone().unwrap_or_default()),
    );
    let mut list = Vec::new();
    for p in &parts.partitions {
        let mut t = Table::new();
        t.insert("name".into(), T::String(p.name.clone()));
        if p.default {
            t.insert("default".into(), T::Boolean(true));
        }
        let mut s = |k: &str, v: &Option<String>| {
            if let Some(v) = v {
                t.insert(k.into(), T::String(v.clone()));
            }
        };
        s("max_time", &p.max_time);
        s("default_time", &p.default_time);
        if let Some(n) = p.max_nodes {
            t.insert("max_nodes".into(), T::Integer(i64::from(n)));
        }
        if !p.allowed_accounts.is_empty() {
            t.insert(
                "allowed_accounts".into(),
                T::Array(p.allowed_accounts.iter().cloned().map(T::String).collect()),
            );
        }
        if let Some(x) = p.priority_tier {
            t.insert("priority_tier".into(), T::Integer(i64::from(x)));
        }
        if let Some(x) = p.priority_job_factor {
            t.insert("priority_job_factor".into(), T::Integer(i64::from(x)));
        }
        if let Some(st) = p.state {
            let v = serde_json::to_value(st)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned));
            if let Some(v) = v {
                t.insert("state".into(), T::String(v));
            }
        }
        list.push(T::Table(t));
    }
    root.insert("partition".into(), T::Array(list));
    let pr = &spec.priority;
    if let Some(v) = &pr.max_age {
        root.insert("priority_max_age".into(), T::String(v.clone()));
    }
    if let Some(v) = pr.favor_small {
        root.insert("priority_favor_small".into(), T::Boolean(v));
    }
    if let Some(v) = &pr.fairshare_half_life {
        root.insert("fairshare_half_life".into(), T::String(v.clone()));
    }
    if let Some(w) = &pr.weights {
        let mut t = Table::new();
        for (k, v) in [
            ("age", w.age),
            ("fairshare", w.fairshare),
            ("job_size", w.job_size),
            ("partition", w.partition),
            ("qos", w.qos),
            ("tres_cpu", w.tres_cpu),
            ("tres_mem", w.tres_mem),
            ("tres_gpu", w.tres_gpu),
        ] {
            if let Some(v) = v {
                t.insert(k.into(), T::Integer(i64::from(v)));
            }
        }
        root.insert("priority_weights".into(), T::Table(t));
    }
    toml::to_string(&root).map_err(RenderError::Toml)
}

/// The clients' cluster file (`TANDEM_CONFIG`): the Service's address, the mounted CA
/// that its certificate chains to, the identity agent's socket (login pods) and the key
/// (workers, which sign for themselves).
pub fn client_json(tc: &str, endpoint: &str) -> String {
    json!({
        "cluster_name": tc,
        "controller": endpoint,
        "key_file": format!("{KEY_DIR}/{KEY_FILE}"),
        "ca_file": format!("{CA_DIR}/{CA_CERT_FILE}"),
        "auth_socket": format!("{AUTH_DIR}/{AUTH_SOCKET_FILE}"),
    })
    .to_string()
}

pub fn config_map(
    tc: &TandemCluster,
    parts: &Rendered,
    endpoint: Option<&str>,
) -> Result<ConfigMap, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let mut data = BTreeMap::new();
    data.insert(
        CONTROLLER_CONFIG_KEY.to_owned(),
        controller_toml(tc, parts)?,
    );
    if let Some(e) = endpoint {
        data.insert(CLIENT_CONFIG_KEY.to_owned(), client_json(&name, e));
    }
    data.insert(
        BRIDGE_CONFIG_KEY.to_owned(),
        serde_json::to_string(&tc.spec.bridge).unwrap_or_default(),
    );
    typed(
        "ConfigMap",
        json!({
            "metadata": controller_object_meta(tc, &config_map_name(&name)),
            "data": data,
        }),
    )
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

/// The cluster key Secret: created once with a fresh key, never rewritten (that would lock
/// every running worker out).
pub fn key_secret(tc: &TandemCluster, key_hex: &str) -> Result<Secret, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    typed(
        "Secret",
        json!({
            "metadata": controller_object_meta(tc, &key_secret_name(&name)),
            "type": "Opaque",
            "stringData": { KEY_FILE: format!("{key_hex}\n") },
        }),
    )
}

/// Secret data as Kubernetes stores it (`data`, base64 on the wire), so what the operator
/// writes reads back the same on every API server.
fn secret_data<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
    let map: BTreeMap<&str, ByteString> = pairs
        .into_iter()
        .map(|(k, v)| (k, ByteString(v.as_bytes().to_vec())))
        .collect();
    json!(map)
}

/// The cluster CA Secret: created once, never rewritten (a new CA would orphan every
/// certificate in use). No pod mounts its key: the operator alone issues certificates.
pub fn ca_secret(tc: &TandemCluster, cert_pem: &str, key_pem: &str) -> Result<Secret, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    typed(
        "CA Secret",
        json!({
            "metadata": controller_object_meta(tc, &ca_secret_name(&name)),
            "type": "Opaque",
            "data": secret_data([(CA_CERT_FILE, cert_pem), (CA_KEY_FILE, key_pem)]),
        }),
    )
}

/// The names the controller's certificate carries: every spelling of the Service's DNS
/// name (KEDA and in-cluster clients) and its cluster IP (what the cluster file names,
/// since pods may not resolve the Service).
pub fn controller_cert_names(service: &str, ns: &str, cluster_ip: Option<&str>) -> Vec<String> {
    let mut names = vec![
        service.to_owned(),
        format!("{service}.{ns}"),
        format!("{service}.{ns}.svc"),
        format!("{service}.{ns}.svc.cluster.local"),
    ];
    names.extend(cluster_ip.map(str::to_owned));
    names
}

/// What identifies an issued controller certificate: its names and its CA. In the
/// controller pod's template hash, so a reissue restarts the controller onto it.
pub fn controller_cert_id(names: &[String], ca_pem: &str) -> String {
    hash_of(&(names, hash_of(&ca_pem)))
}

/// Whether the controller's certificate must be (re)issued: none yet, issued for other
/// names (the Service's IP changed) or by another CA, or missing its files.
pub fn cert_needs_issue(want: &[String], ca_pem: &str, have: Option<&Secret>) -> bool {
    let Some(have) = have else {
        return true;
    };
    let annotations = have.metadata.annotations.clone().unwrap_or_default();
    let has = |k: &str| {
        have.data.as_ref().is_some_and(|d| d.contains_key(k))
            || have.string_data.as_ref().is_some_and(|d| d.contains_key(k))
    };
    annotations.get(CERT_NAMES) != Some(&want.join(","))
        || annotations.get(CERT_CA) != Some(&hash_of(&ca_pem))
        || !has(tandem_net::tls::CERT_FILE)
        || !has(tandem_net::tls::KEY_FILE)
}

/// The controller's `kubernetes.io/tls` Secret (the layout `--tls-dir` reads, as
/// cert-manager writes it), annotated with what it was issued for.
pub fn controller_tls_secret(
    tc: &TandemCluster,
    names: &[String],
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Secret, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let mut meta = controller_object_meta(tc, &controller_tls_secret_name(&name));
    meta["annotations"] = json!({
        CERT_NAMES: names.join(","),
        CERT_CA: hash_of(&ca_pem),
    });
    typed(
        "controller TLS Secret",
        json!({
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": secret_data([
                (tandem_net::tls::CERT_FILE, cert_pem),
                (tandem_net::tls::KEY_FILE, key_pem),
                (tandem_net::tls::CA_FILE, ca_pem),
            ]),
        }),
    )
}

/// The names a worker's step certificate carries: its node name alone, what srun verifies
/// (the pod IP it dials is not known when the pod is rendered).
pub fn step_cert_names(node: &str) -> Vec<String> {
    vec![node.to_owned()]
}

/// The step-service certificate Secret of worker set `ws`'s pod on `node`
/// (`kubernetes.io/tls`: `tls.crt`, `tls.key`, `ca.crt`, the layout `--tls-dir` reads),
/// annotated with what it was issued for. Owned by the set (see the module's documentation
/// for why not by the pod).
pub fn worker_step_tls_secret(
    ws: &WorkerSet,
    node: &str,
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<Secret, RenderError> {
    let name = ws.metadata.name.clone().unwrap_or_default();
    let mut secret_labels = labels(&ws.spec.cluster_name, COMPONENT_WORKER, &name);
    secret_labels.insert(WORKER_SET.to_owned(), name.clone());
    typed(
        "worker step TLS Secret",
        json!({
            "metadata": {
                "name": worker_step_tls_secret_name(&name, node),
                "namespace": ws.metadata.namespace,
                "labels": secret_labels,
                "annotations": {
                    CERT_NAMES: step_cert_names(node).join(","),
                    CERT_CA: hash_of(&ca_pem),
                },
                "ownerReferences": [worker_set_owner(ws)],
            },
            "type": "kubernetes.io/tls",
            "data": secret_data([
                (tandem_net::tls::CERT_FILE, cert_pem),
                (tandem_net::tls::KEY_FILE, key_pem),
                (tandem_net::tls::CA_FILE, ca_pem),
            ]),
        }),
    )
}

/// The Service's ports: gRPC for clients and workers, the KEDA scaler, Prometheus.
pub fn service_ports() -> Value {
    json!([
        {"name": "grpc", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT, "protocol": "TCP"},
        {"name": "scaler", "port": SCALER_PORT, "targetPort": SCALER_PORT, "protocol": "TCP"},
        {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT, "protocol": "TCP"},
    ])
}

pub fn service(tc: &TandemCluster) -> Result<Service, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let mut selector = BTreeMap::new();
    selector.insert(CLUSTER.to_owned(), name.clone());
    selector.insert(APP_COMPONENT.to_owned(), COMPONENT_CONTROLLER.to_owned());
    typed(
        "Service",
        json!({
            "metadata": controller_object_meta(tc, &service_name(&name)),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": service_ports(),
            },
        }),
    )
}

/// Whether a Service made by an older operator lacks ports this one serves.
pub fn service_ports_differ(svc: &Service) -> bool {
    let have: Vec<(Option<String>, i32)> = svc
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| (p.name.clone(), p.port))
        .collect();
    let want: Vec<(Option<String>, i32)> = service_ports()
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().map(str::to_owned),
                p["port"]
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .unwrap_or(0),
            )
        })
        .collect();
    have != want
}

/// The store's PVC. Owned by the cluster, so deleting the `TandemCluster` deletes the
/// store (what a user deleting a cluster asks for); a lost controller pod keeps it.
pub fn pvc(tc: &TandemCluster) -> Result<PersistentVolumeClaim, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": tc.spec.storage.size}},
    });
    if let Some(class) = &tc.spec.storage.storage_class_name {
        spec["storageClassName"] = json!(class);
    }
    typed(
        "PersistentVolumeClaim",
        json!({
            "metadata": controller_object_meta(tc, &pvc_name(&name)),
            "spec": spec,
        }),
    )
}

/// The controller pod. `config_hash` (of the rendered config) and `cert_id` (of its
/// certificate, [`controller_cert_id`]) go in its template hash, so a config change or a
/// reissued certificate restarts the controller; running jobs survive that as any restart.
pub fn controller_pod(
    tc: &TandemCluster,
    config_hash: &str,
    cert_id: &str,
) -> Result<Pod, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let image = tc.spec.image.clone().unwrap_or_else(default_image);
    let c = &tc.spec.controller;
    let hash = hash_of(&(&image, c, config_hash, cert_id, RENDER_REVISION));
    let mut args = vec![
        "controller".to_owned(),
        "--listen".into(),
        format!("$(POD_IP):{CONTROLLER_PORT}"),
        "--state-dir".into(),
        STATE_DIR.into(),
        "--key-file".into(),
        format!("{KEY_DIR}/{KEY_FILE}"),
        "--config".into(),
        format!("{CONFIG_DIR}/{CONTROLLER_CONFIG_KEY}"),
        "--tls-dir".into(),
        TLS_DIR.into(),
        // On the pod IP, as gRPC is: the Service reaches them there, and the scaler speaks
        // TLS with the same certificate.
        "--scaler-listen".into(),
        format!("$(POD_IP):{SCALER_PORT}"),
        "--metrics-listen".into(),
        format!("$(POD_IP):{METRICS_PORT}"),
    ];
    if let Some(t) = &c.node_timeout {
        args.push("--node-timeout".into());
        args.push(t.clone());
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(TEMPLATE_HASH.to_owned(), hash);
    typed(
        "controller Pod",
        json!({
            "metadata": {
                "name": controller_pod_name(&name),
                "namespace": tc.metadata.namespace,
                "labels": labels(&name, COMPONENT_CONTROLLER, &name),
                "annotations": annotations,
                "ownerReferences": [cluster_owner(tc)],
            },
            "spec": {
                "restartPolicy": "Always",
                "enableServiceLinks": false,
                "automountServiceAccountToken": false,
                "nodeSelector": c.node_selector,
                "tolerations": c.tolerations,
                "securityContext": restricted_pod(NONROOT, NONROOT),
                "containers": [{
                    "name": "controller",
                    "image": image,
                    "command": ["tandem"],
                    "args": args,
                    "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                    "ports": [
                        {"name": "grpc", "containerPort": CONTROLLER_PORT},
                        {"name": "scaler", "containerPort": SCALER_PORT},
                        {"name": "metrics", "containerPort": METRICS_PORT},
                    ],
                    "resources": c.resources,
                    "securityContext": restricted_container(),
                    "readinessProbe": {"tcpSocket": {"port": CONTROLLER_PORT}, "periodSeconds": 2},
                    "volumeMounts": [
                        {"name": "state", "mountPath": STATE_DIR},
                        {"name": "key", "mountPath": KEY_DIR, "readOnly": true},
                        {"name": "tls", "mountPath": TLS_DIR, "readOnly": true},
                        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": true},
                    ],
                }],
                "volumes": [
                    {"name": "state", "persistentVolumeClaim": {"claimName": pvc_name(&name)}},
                    {"name": "key", "secret": {"secretName": key_secret_name(&name), "defaultMode": 0o400}},
                    {"name": "tls", "secret": {"secretName": controller_tls_secret_name(&name), "defaultMode": 0o400}},
                    {"name": "config", "configMap": {"name": config_map_name(&name)}},
                ],
            },
        }),
    )
}

// === worker and login pods ===

/// A worker's volumes: the cluster key (it signs as its node), the CA certificate (`ca.crt`
/// alone: the controller's certificate chains to it, and so do the other workers' for the
/// jobs' srun), its step-service certificate for node `node`
/// ([`worker_step_tls_secret_name`]), the cluster file, and the set's own volumes. No CA
/// key: see the module's documentation.
fn worker_volumes(tc: &str, ws: &str, node: &str, o: &PodOverrides) -> (Vec<Value>, Vec<Value>) {
    let mut volumes = vec![
        json!({"name": "tandem-key", "secret": {"secretName": key_secret_name(tc), "defaultMode": 0o400}}),
        json!({"name": "tandem-ca", "secret": {
            "secretName": ca_secret_name(tc),
            "items": [{"key": CA_CERT_FILE, "path": CA_CERT_FILE}],
            "defaultMode": 0o444,
        }}),
        json!({"name": "step-tls", "secret": {"secretName": worker_step_tls_secret_name(ws, node), "defaultMode": 0o400}}),
        json!({"name": "tandem-config", "configMap": {"name": config_map_name(tc)}}),
    ];
    let mut mounts = vec![
        json!({"name": "tandem-key", "mountPath": KEY_DIR, "readOnly": true}),
        json!({"name": "tandem-ca", "mountPath": CA_DIR, "readOnly": true}),
        json!({"name": "step-tls", "mountPath": STEP_TLS_DIR, "readOnly": true}),
        json!({"name": "tandem-config", "mountPath": CONFIG_DIR, "readOnly": true}),
    ];
    volumes.extend(o.volumes.iter().map(|v| json!(v)));
    mounts.extend(o.volume_mounts.iter().map(|m| json!(m)));
    (volumes, mounts)
}

/// The toleration every worker pod carries: the pool taint's key, any value (any cluster's
/// pool), every effect, no `tolerationSeconds`. Pool nodes carry
/// `tandem.dev/pool=<cluster>:NoSchedule` always and `:NoExecute` while in batch mode; a
/// worker that tolerated only `NoSchedule` would be evicted by the taint manager the moment
/// its node turned to batch, which is exactly when its node needs it.
pub fn pool_toleration() -> Toleration {
    Toleration {
        key: Some(POOL_TAINT.to_owned()),
        operator: Some("Exists".to_owned()),
        ..Toleration::default()
    }
}

/// A worker set's pod tolerations: [`pool_toleration`] first, then the template's own
/// except those on the pool key, whatever the template says.
///
/// First, because Kubernetes' taint manager takes, for each taint, the *first* toleration
/// that matches it and honours that one's `tolerationSeconds`: a template toleration of
/// the pool key with `tolerationSeconds: 300` listed before ours would evict the worker five
/// minutes into batch mode. The template's pool-key tolerations are dropped as redundant
/// (ours tolerates every value and effect of that key); other keys are kept as written.
pub fn worker_tolerations(o: &PodOverrides) -> Vec<Toleration> {
    std::iter::once(pool_toleration())
        .chain(
            o.tolerations
                .iter()
                .filter(|t| t.key.as_deref() != Some(POOL_TAINT))
                .cloned(),
        )
        .collect()
}

/// Whether `pod` carries [`pool_toleration`] (as written: key, `Exists`, no effect, no
/// `tolerationSeconds`).
pub fn has_pool_toleration(pod: &Pod) -> bool {
    let want = pool_toleration();
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| ts.contains(&want))
}

/// A merge patch that adds [`pool_toleration`] to a running pod's tolerations. A merge patch
/// replaces the whole list, so it carries the pod's own list first (the API server allows
/// only additions) and the `resourceVersion` it was read at (a concurrent edit makes it
/// fail with 409 instead of being lost).
pub fn pool_toleration_patch(pod: &Pod) -> Value {
    let mut tolerations: Vec<Toleration> = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    tolerations.push(pool_toleration());
    json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "spec": {"tolerations": tolerations},
    })
}

fn merged(
    base: BTreeMap<String, String>,
    extra: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = extra.clone();
    m.extend(base); // ours win: selectors depend on them
    m
}

/// The hash a worker set's pods are rendered with (what makes a pod outdated).
pub fn worker_template_hash(ws: &WorkerSet, image: &str) -> String {
    let s = &ws.spec;
    hash_of(&(
        image,
        &s.partitions,
        &s.features,
        &s.gpus,
        &s.cpus,
        &s.memory,
        &s.template,
        RENDER_REVISION,
    ))
}

/// A worker pod for Kubernetes node `node`. Its batch node name comes from the downward API
/// (`spec.nodeName`), so the name is the node's even if the scheduler had a say.
pub fn worker_pod(
    ws: &WorkerSet,
    node: &str,
    cluster_image: Option<&str>,
) -> Result<Pod, RenderError> {
    let name = ws.metadata.name.clone().unwrap_or_default();
    let s = &ws.spec;
    let o = &s.template;
    let image = o
        .image
        .clone()
        .or_else(|| cluster_image.map(str::to_owned))
        .unwrap_or_else(default_image);
    let hash = worker_template_hash(ws, &image);
    let mut args = vec![
        "worker".to_owned(),
        "--name".into(),
        "$(TANDEM_NODE_NAME)".into(),
        "--partitions".into(),
        s.partitions.join(","),
        "--step-listen".into(),
        format!("$(POD_IP):{WORKER_STEP_PORT}"),
        "--state-dir".into(),
        WORKER_SPOOL.into(),
        // The step certificate for this node ([`worker_step_tls_secret`]), and `ca.crt`
        // beside it to verify the controller.
        "--tls-dir".into(),
        STEP_TLS_DIR.into(),
    ];
    // Where the host's cgroup tree is shared (no cgroup namespace, or two clusters' workers
    // on one node), a worker's jobs live under a subtree no other cluster's worker of the
    // same node name uses: a worker clears leftovers of its own earlier lives at start, and
    // must never take another cluster's running jobs for them.
    args.extend([
        "--cgroup-subtree".into(),
        format!(
            "{}.{}.$(TANDEM_NODE_NAME)",
            ws.metadata.namespace.as_deref().unwrap_or("default"),
            s.cluster_name
        ),
    ]);
    if !s.features.is_empty() {
        args.extend(["--features".into(), s.features.join(",")]);
    }
    if let Some(g) = &s.gpus {
        if let Some(n) = g.count {
            args.extend(["--gpus".into(), n.to_string()]);
        }
        if let Some(t) = &g.gpu_type {
            args.extend(["--gpu-type".into(), t.clone()]);
        }
    }
    if let Some(c) = s.cpus {
        args.extend(["--cpus".into(), c.to_string()]);
    }
    if let Some(m) = &s.memory {
        args.extend(["--mem".into(), m.clone()]);
    }
    let mut env = vec![
        json!({"name": "TANDEM_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        json!({"name": "TANDEM_CONFIG", "value": format!("{CONFIG_DIR}/{CLIENT_CONFIG_KEY}")}),
    ];
    env.extend(o.env.iter().map(|e| json!(e)));
    let (mut volumes, mut mounts) = worker_volumes(&s.cluster_name, &name, node, o);
    volumes.push(json!({"name": "spool", "emptyDir": {}}));
    mounts.push(json!({"name": "spool", "mountPath": WORKER_SPOOL}));
    let (pod_sc, container_sc) = match o.run_as {
        Some(r) => (restricted_pod(r.user, r.group), restricted_container()),
        // Root without privilege: setuid/setgid to start jobs as their submitters, kill
        // them, and reach their files.
        None => (
            json!({"seccompProfile": {"type": "RuntimeDefault"}}),
            json!({
                "allowPrivilegeEscalation": false,
                "privileged": false,
                "capabilities": {"drop": ["ALL"], "add": ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            }),
        ),
    };
    let mut pod_labels = merged(labels(&s.cluster_name, COMPONENT_WORKER, &name), &o.labels);
    pod_labels.insert(WORKER_SET.to_owned(), name.clone());
    let mut annotations = o.annotations.clone();
    annotations.insert(TEMPLATE_HASH.to_owned(), hash);
    // Pinned to its node by required affinity (as a DaemonSet does), so the default
    // scheduler still checks fit, taints and resources.
    let mut affinity = o
        .affinity
        .as_ref()
        .map(|a| json!(a))
        .unwrap_or_else(|| json!({}));
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    });
    typed(
        "worker Pod",
        json!({
            "metadata": {
                "name": worker_pod_name(&name, node),
                "namespace": ws.metadata.namespace,
                "labels": pod_labels,
                "annotations": annotations,
                "ownerReferences": [worker_set_owner(ws)],
            },
            "spec": {
                "restartPolicy": "Always",
                "automountServiceAccountToken": false,
                "serviceAccountName": o.service_account_name,
                "priorityClassName": o.priority_class_name,
                "nodeSelector": o.node_selector,
                "affinity": affinity,
                "tolerations": worker_tolerations(o),
                "securityContext": pod_sc,
                // Drained before deletion; the grace covers the worker's own cleanup.
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": "worker",
                    "image": image,
                    "imagePullPolicy": o.image_pull_policy,
                    "command": ["tandem"],
                    "args": args,
                    "env": env,
                    "ports": [{"name": "steps", "containerPort": WORKER_STEP_PORT}],
                    "resources": o.resources,
                    "securityContext": container_sc,
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        }),
    )
}

/// A login pod: the CLI configured through `TANDEM_CONFIG` (the mounted cluster file), kept
/// alive so people `kubectl exec` into it, and beside it the identity agent.
///
/// The `login` container holds neither the cluster key nor the CA key: only `ca.crt` and
/// the agent's socket. The `authd` container alone mounts the key and runs as another uid
/// ([`authd_uid`]), so users of the login container (its uid) cannot read the key through
/// the other container's files or process, and get credentials for their own uid only. The
/// socket's directory is read-only for them: connecting needs no write access, and nobody
/// there can replace the socket with an impostor. The pod does not share its process
/// namespace (that would expose the agent's `/proc/<pid>/root` to its own uid only, but
/// there is no reason to open it).
pub fn login_pod(
    ls: &LoginSet,
    index: u32,
    cluster_image: Option<&str>,
) -> Result<Pod, RenderError> {
    let name = ls.metadata.name.clone().unwrap_or_default();
    let s = &ls.spec;
    let o = &s.template;
    let tc = &s.cluster_name;
    let image = o
        .image
        .clone()
        .or_else(|| cluster_image.map(str::to_owned))
        .unwrap_or_else(default_image);
    let hash = hash_of(&(&image, o, RENDER_REVISION));
    let mut env = vec![
        json!({"name": "TANDEM_CONFIG", "value": format!("{CONFIG_DIR}/{CLIENT_CONFIG_KEY}")}),
    ];
    env.extend(o.env.iter().map(|e| json!(e)));
    let mut volumes = vec![
        json!({"name": "tandem-config", "configMap": {"name": config_map_name(tc)}}),
        json!({"name": "tandem-ca", "secret": {
            "secretName": ca_secret_name(tc),
            "items": [{"key": CA_CERT_FILE, "path": CA_CERT_FILE}],
            "defaultMode": 0o444,
        }}),
        json!({"name": "tandem-key", "secret": {"secretName": key_secret_name(tc), "defaultMode": 0o400}}),
        json!({"name": "tandem-auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
    ];
    let mut mounts = vec![
        json!({"name": "tandem-config", "mountPath": CONFIG_DIR, "readOnly": true}),
        json!({"name": "tandem-ca", "mountPath": CA_DIR, "readOnly": true}),
        json!({"name": "tandem-auth", "mountPath": AUTH_DIR, "readOnly": true}),
    ];
    volumes.extend(o.volumes.iter().map(|v| json!(v)));
    mounts.extend(o.volume_mounts.iter().map(|m| json!(m)));
    let run_as = o.run_as.unwrap_or(crate::crd::template::RunAs {
        user: NONROOT,
        group: NONROOT,
    });
    let agent_uid = authd_uid(run_as.user);
    let mut agent_sc = restricted_container();
    agent_sc["runAsUser"] = json!(agent_uid);
    agent_sc["runAsGroup"] = json!(agent_uid);
    let mut pod_labels = merged(labels(tc, COMPONENT_LOGIN, &name), &o.labels);
    pod_labels.insert(LOGIN_SET.to_owned(), name.clone());
    let mut annotations = o.annotations.clone();
    annotations.insert(TEMPLATE_HASH.to_owned(), hash);
    annotations.insert(DEFAULT_CONTAINER.to_owned(), "login".to_owned());
    typed(
        "login Pod",
        json!({
            "metadata": {
                "name": format!("{name}-{index}"),
                "namespace": ls.metadata.namespace,
                "labels": pod_labels,
                "annotations": annotations,
                "ownerReferences": [owner("LoginSet", &name, &ls.metadata.uid.clone().unwrap_or_default())],
            },
            "spec": {
                "restartPolicy": "Always",
                "automountServiceAccountToken": false,
                "shareProcessNamespace": false,
                "nodeSelector": o.node_selector,
                "affinity": o.affinity,
                "tolerations": o.tolerations,
                "securityContext": restricted_pod(run_as.user, run_as.group),
                "containers": [
                    {
                        "name": "login",
                        "image": image,
                        "imagePullPolicy": o.image_pull_policy,
                        "command": ["sleep", "infinity"],
                        "env": env,
                        "resources": o.resources,
                        "securityContext": restricted_container(),
                        "volumeMounts": mounts,
                    },
                    {
                        "name": "authd",
                        "image": image,
                        "imagePullPolicy": o.image_pull_policy,
                        "command": ["tandem"],
                        "args": [
                            "authd",
                            "--key-file", format!("{KEY_DIR}/{KEY_FILE}"),
                            "--socket", format!("{AUTH_DIR}/{AUTH_SOCKET_FILE}"),
                        ],
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "16Mi"},
                            "limits": {"memory": "64Mi"},
                        },
                        "securityContext": agent_sc,
                        "volumeMounts": [
                            {"name": "tandem-key", "mountPath": KEY_DIR, "readOnly": true},
                            {"name": "tandem-auth", "mountPath": AUTH_DIR},
                        ],
                    },
                ],
                "volumes": volumes,
            },
        }),
    )
}

#[cfg(test)]
mod tests;
