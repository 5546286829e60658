//! Pure builders: custom resource -> child objects (Slinky's `builder/`). Every object
//! carries the owner reference, the recommended labels and, for pods, the hash of what it was
//! rendered from, so a changed spec shows as outdated pods.
//!
//! Control-plane pods (controller, login) pass PodSecurity `restricted`. Workers too when
//! the set runs them as a user (`template.runAs`); otherwise the worker runs as root without
//! privilege and with only the capabilities that starting jobs as their submitters needs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
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

/// The clients' cluster file (`TANDEM_CONFIG`): the Service's address and the mounted key.
pub fn client_json(tc: &str, endpoint: &str) -> String {
    json!({
        "cluster_name": tc,
        "controller": endpoint,
        "key_file": format!("{KEY_DIR}/{KEY_FILE}"),
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
                "ports": [{"name": "grpc", "port": CONTROLLER_PORT, "targetPort": CONTROLLER_PORT, "protocol": "TCP"}],
            },
        }),
    )
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

/// Until the operator issues certificates from the cluster CA, its pods speak plain text
/// (loopback only; see `controller_pod`).
const PLAINTEXT_FLAG: &str = "--insecure-plaintext";

/// The controller pod. `config_hash` (of the rendered config) goes in its template hash, so
/// a config change restarts the controller; running jobs survive that as any restart.
pub fn controller_pod(tc: &TandemCluster, config_hash: &str) -> Result<Pod, RenderError> {
    let name = tc.metadata.name.clone().unwrap_or_default();
    let image = tc.spec.image.clone().unwrap_or_else(default_image);
    let c = &tc.spec.controller;
    let hash = hash_of(&(&image, c, config_hash));
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
        // The operator does not provision TLS certificates yet (issue #10): plain text,
        // which the controller accepts only on a loopback address. That is the harness's
        // pod network; on a real cluster the controller refuses to start and says so.
        PLAINTEXT_FLAG.into(),
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
                    "ports": [{"name": "grpc", "containerPort": CONTROLLER_PORT}],
                    "resources": c.resources,
                    "securityContext": restricted_container(),
                    "readinessProbe": {"tcpSocket": {"port": CONTROLLER_PORT}, "periodSeconds": 2},
                    "volumeMounts": [
                        {"name": "state", "mountPath": STATE_DIR},
                        {"name": "key", "mountPath": KEY_DIR, "readOnly": true},
                        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": true},
                    ],
                }],
                "volumes": [
                    {"name": "state", "persistentVolumeClaim": {"claimName": pvc_name(&name)}},
                    {"name": "key", "secret": {"secretName": key_secret_name(&name), "defaultMode": 0o400}},
                    {"name": "config", "configMap": {"name": config_map_name(&name)}},
                ],
            },
        }),
    )
}

// === worker and login pods ===

fn client_volumes(tc: &str, o: &PodOverrides) -> (Vec<Value>, Vec<Value>) {
    let mut volumes = vec![
        json!({"name": "tandem-key", "secret": {"secretName": key_secret_name(tc), "defaultMode": 0o400}}),
        json!({"name": "tandem-config", "configMap": {"name": config_map_name(tc)}}),
    ];
    let mut mounts = vec![
        json!({"name": "tandem-key", "mountPath": KEY_DIR, "readOnly": true}),
        json!({"name": "tandem-config", "mountPath": CONFIG_DIR, "readOnly": true}),
    ];
    volumes.extend(o.volumes.iter().map(|v| json!(v)));
    mounts.extend(o.volume_mounts.iter().map(|m| json!(m)));
    (volumes, mounts)
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
        PLAINTEXT_FLAG.into(),
    ];
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
    let (mut volumes, mut mounts) = client_volumes(&s.cluster_name, o);
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
                "ownerReferences": [owner("WorkerSet", &name, &ws.metadata.uid.clone().unwrap_or_default())],
            },
            "spec": {
                "restartPolicy": "Always",
                "automountServiceAccountToken": false,
                "serviceAccountName": o.service_account_name,
                "priorityClassName": o.priority_class_name,
                "nodeSelector": o.node_selector,
                "affinity": affinity,
                "tolerations": o.tolerations,
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
/// alive so people `kubectl exec` into it.
pub fn login_pod(
    ls: &LoginSet,
    index: u32,
    cluster_image: Option<&str>,
) -> Result<Pod, RenderError> {
    let name = ls.metadata.name.clone().unwrap_or_default();
    let s = &ls.spec;
    let o = &s.template;
    let image = o
        .image
        .clone()
        .or_else(|| cluster_image.map(str::to_owned))
        .unwrap_or_else(default_image);
    let hash = hash_of(&(&image, o));
    let mut env = vec![
        json!({"name": "TANDEM_CONFIG", "value": format!("{CONFIG_DIR}/{CLIENT_CONFIG_KEY}")}),
    ];
    env.extend(o.env.iter().map(|e| json!(e)));
    let (volumes, mounts) = client_volumes(&s.cluster_name, o);
    let run_as = o.run_as.unwrap_or(crate::crd::template::RunAs {
        user: NONROOT,
        group: NONROOT,
    });
    let mut pod_labels = merged(labels(&s.cluster_name, COMPONENT_LOGIN, &name), &o.labels);
    pod_labels.insert(LOGIN_SET.to_owned(), name.clone());
    let mut annotations = o.annotations.clone();
    annotations.insert(TEMPLATE_HASH.to_owned(), hash);
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
                "nodeSelector": o.node_selector,
                "affinity": o.affinity,
                "tolerations": o.tolerations,
                "securityContext": restricted_pod(run_as.user, run_as.group),
                "containers": [{
                    "name": "login",
                    "image": image,
                    "imagePullPolicy": o.image_pull_policy,
                    "command": ["sleep", "infinity"],
                    "env": env,
                    "resources": o.resources,
                    "securityContext": restricted_container(),
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        }),
    )
}

#[cfg(test)]
mod tests;
