//! Login pods: the login shell container and the identity agent beside it.

use super::*;

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
