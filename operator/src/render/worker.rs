//! Worker pods: their volumes, the pool toleration, the template hash that marks a pod
//! outdated, and the pod itself.

use super::*;

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
