//! The Secrets the operator writes: the cluster key, the CA, the controller's serving
//! certificate and each worker's step certificate (for its node name), and when a
//! certificate must be issued again.

use super::*;

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
    let has = |k: &str| have.data.as_ref().is_some_and(|d| d.contains_key(k));
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
