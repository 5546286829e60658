//! The TandemCluster's controller side: its `--config` TOML and client file (the
//! ConfigMap), the Service, the state PVC and the controller pod.

use super::*;

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
