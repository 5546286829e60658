//! Dynamic admission: calls the registered mutating and validating webhooks over HTTPS,
//! trusting only the configuration's `caBundle`, and applies their JSON patches.
//!
//! # Simplifications
//! - Webhooks are called one after another (validating ones too), with no reinvocation.
//! - A `service` reference is reached on `127.0.0.1` (all "pods" here are local processes) at
//!   the Service's numeric `targetPort` for the given port (or the port itself), with TLS
//!   server name `<name>.<namespace>.svc` as a real server would verify.
//! - `matchConditions` and `matchPolicy` are ignored; versions match if listed or `*`.
//! - Only writes of whole objects are admitted: create/update/delete of a resource, updates
//!   of its `status`/`scale` subresources, and `pods/binding` creates (the Binding is the
//!   object, `kind` `Binding`, as a real server sends it); `eviction` posts are not.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::meta;
use super::resource::ResourceType;
use super::selector::LabelSelector;
use super::store::Store;

/// What is being admitted.
pub struct Attrs<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    pub rt: &'a ResourceType,
    pub version: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub dry_run: bool,
}

/// A webhook with what is needed to call it, snapshotted from the store.
struct Hook {
    name: String,
    spec: Value,
    /// Where to connect and which name the certificate must carry.
    url: String,
    tls_name: Option<String>,
}

fn rule_matches(rule: &Value, a: &Attrs<'_>) -> bool {
    let any = |field: &str, want: &str| {
        rule[field].as_array().is_some_and(|l| {
            l.iter()
                .any(|v| v.as_str() == Some("*") || v.as_str() == Some(want))
        })
    };
    let ops_ok = any("operations", a.operation);
    let group_ok = any("apiGroups", &a.rt.group);
    let version_ok = any("apiVersions", a.version) || any("apiVersions", a.rt.storage_version());
    let res_ok = rule["resources"].as_array().is_some_and(|l| {
        l.iter().filter_map(Value::as_str).any(|r| {
            let (res, sub) = r.split_once('/').unwrap_or((r, ""));
            let res_match = res == "*" || res == a.rt.plural;
            let sub_match = sub == "*" || sub == a.subresource;
            res_match && sub_match
        })
    });
    let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
        "Namespaced" => a.rt.namespaced,
        "Cluster" => !a.rt.namespaced,
        _ => true,
    };
    ops_ok && group_ok && version_ok && res_ok && scope_ok
}

fn selector_matches(sel: &Value, labels_of: &Value) -> ApiResult<bool> {
    if sel.is_null() {
        return Ok(true);
    }
    let s = LabelSelector::from_object(sel)?;
    Ok(s.matches(&json!({"metadata": {"labels": labels_of}})))
}

/// Collects the matching webhooks of one kind (`mutatingwebhookconfigurations` or
/// `validatingwebhookconfigurations`), in name order as the real server calls them.
fn hooks(
    store: &Store,
    kind: &str,
    a: &Attrs<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> ApiResult<Vec<Hook>> {
    let st = store.lock();
    let key = format!("{kind}.admissionregistration.k8s.io");
    let Some(ts) = st.types.get(&key) else {
        return Ok(Vec::new());
    };
    let is_namespace = a.rt.group.is_empty() && a.rt.plural == "namespaces";
    let ns_labels = if is_namespace {
        obj["metadata"]["labels"].clone()
    } else {
        st.try_get("namespaces", "", a.namespace)
            .map(|n| n["metadata"]["labels"].clone())
            .unwrap_or(Value::Null)
    };
    let mut out = Vec::new();
    for cfg in ts.objects.values() {
        for wh in cfg["webhooks"].as_array().into_iter().flatten() {
            if !wh["rules"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|r| rule_matches(r, a)))
            {
                continue;
            }
            if (a.rt.namespaced || is_namespace)
                && !selector_matches(&wh["namespaceSelector"], &ns_labels)?
            {
                continue;
            }
            let new_match = selector_matches(&wh["objectSelector"], &obj["metadata"]["labels"])?;
            let old_match = old
                .map(|o| selector_matches(&wh["objectSelector"], &o["metadata"]["labels"]))
                .transpose()?;
            if !new_match && !old_match.unwrap_or(false) {
                continue;
            }
            let cc = &wh["clientConfig"];
            let (url, tls_name) = if let Some(u) = cc["url"].as_str() {
                (u.to_owned(), None)
            } else {
                let svc = &cc["service"];
                let (sns, sname) = (
                    svc["namespace"].as_str().unwrap_or_default(),
                    svc["name"].as_str().unwrap_or_default(),
                );
                let port = svc["port"].as_i64().unwrap_or(443);
                let target = st
                    .try_get("services", sns, sname)
                    .and_then(|s| {
                        s["spec"]["ports"]
                            .as_array()?
                            .iter()
                            .find(|p| p["port"].as_i64() == Some(port))?["targetPort"]
                            .as_i64()
                    })
                    .unwrap_or(port);
                let path = svc["path"].as_str().unwrap_or("/");
                (
                    format!("https://127.0.0.1:{target}{path}"),
                    Some(format!("{sname}.{sns}.svc")),
                )
            };
            out.push(Hook {
                name: wh["name"].as_str().unwrap_or_default().to_owned(),
                spec: wh.clone(),
                url,
                tls_name,
            });
        }
    }
    Ok(out)
}

/// Runs the mutating webhooks; returns the (possibly patched) object.
pub async fn mutate(
    store: &Store,
    a: &Attrs<'_>,
    mut obj: Value,
    old: Option<&Value>,
) -> ApiResult<Value> {
    for hook in hooks(store, "mutatingwebhookconfigurations", a, &obj, old)? {
        let Some(resp) = call(&hook, a, &obj, old).await? else {
            continue;
        };
        check_allowed(&hook, &resp)?;
        if let Some(p) = resp["patch"].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p)
                .map_err(|e| ApiError::internal(format!("Internal error occurred: webhook \"{}\" returned a patch that is not base64: {e}", hook.name)))?;
            let patch: Value = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::internal(format!(
                    "Internal error occurred: webhook \"{}\" returned an invalid patch: {e}",
                    hook.name
                ))
            })?;
            super::patch::json_patch(&mut obj, &patch).map_err(|e| {
                ApiError::internal(format!(
                    "Internal error occurred: webhook \"{}\" patch failed: {}",
                    hook.name, e.message
                ))
            })?;
        }
    }
    Ok(obj)
}

/// Runs the validating webhooks.
pub async fn validate(
    store: &Store,
    a: &Attrs<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    for hook in hooks(store, "validatingwebhookconfigurations", a, obj, old)? {
        if let Some(resp) = call(&hook, a, obj, old).await? {
            check_allowed(&hook, &resp)?;
        }
    }
    Ok(())
}

fn check_allowed(hook: &Hook, resp: &Value) -> ApiResult<()> {
    if resp["allowed"].as_bool() == Some(true) {
        return Ok(());
    }
    let status = &resp["status"];
    let msg = status["message"].as_str().unwrap_or("");
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| *c >= 400)
        .unwrap_or(403);
    let reason = if code == 403 {
        "Forbidden"
    } else {
        "BadRequest"
    };
    Err(ApiError::new(
        code,
        reason,
        format!(
            "admission webhook \"{}\" denied the request: {msg}",
            hook.name
        ),
    ))
}

/// Calls one webhook. `Ok(None)`: the call failed and `failurePolicy: Ignore` says go on.
async fn call(
    hook: &Hook,
    a: &Attrs<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> ApiResult<Option<Value>> {
    let uid = meta::new_uid();
    // A binding's object is a core/v1 Binding, not the pod it binds.
    let kind = if a.subresource == "binding" {
        "Binding"
    } else {
        a.rt.kind.as_str()
    };
    let group_version_kind = json!({"group": a.rt.group, "version": a.version, "kind": kind});
    let group_version_resource =
        json!({"group": a.rt.group, "version": a.version, "resource": a.rt.plural});
    let mut request = json!({
        "uid": uid,
        "kind": group_version_kind,
        "resource": group_version_resource,
        "requestKind": group_version_kind,
        "requestResource": group_version_resource,
        "name": a.name,
        "namespace": a.namespace,
        "operation": a.operation,
        "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
        "object": if a.operation == "DELETE" { Value::Null } else { obj.clone() },
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": a.dry_run,
    });
    if !a.subresource.is_empty() {
        request["subResource"] = json!(a.subresource);
        request["requestSubResource"] = json!(a.subresource);
    }
    let review =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request});
    let timeout = Duration::from_secs(
        hook.spec["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    );
    let result = tokio::time::timeout(timeout, post(hook, &review))
        .await
        .unwrap_or_else(|_| Err(format!("context deadline exceeded after {timeout:?}")));
    let fail_open = hook.spec["failurePolicy"].as_str() == Some("Ignore");
    match result {
        Ok(v) => match v.get("response") {
            Some(r) if r["uid"].as_str() == Some(uid.as_str()) => Ok(Some(r.clone())),
            _ if fail_open => Ok(None),
            _ => Err(ApiError::internal(format!(
                "Internal error occurred: failed calling webhook \"{}\": expected response.uid=\"{uid}\"",
                hook.name
            ))),
        },
        Err(e) if fail_open => {
            tracing::warn!(webhook = %hook.name, error = %e, "webhook call failed; failurePolicy Ignore");
            Ok(None)
        }
        Err(e) => Err(ApiError::internal(format!(
            "Internal error occurred: failed calling webhook \"{}\": {e}",
            hook.name
        ))),
    }
}

async fn post(hook: &Hook, review: &Value) -> Result<Value, String> {
    let uri: hyper::Uri = hook
        .url
        .parse()
        .map_err(|e| format!("bad webhook url {:?}: {e}", hook.url))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("webhook url {:?} must use https", hook.url));
    }
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or("webhook url has no host")?;
    let base: hyper::Uri = format!("https://{authority}")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mut cfg = kube::Config::new(base);
    let ca = hook.spec["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .map_err(|e| format!("caBundle is not base64: {e}"))?;
    let ders = pem_certificates(&pem);
    if ders.is_empty() {
        return Err("caBundle holds no PEM certificate".into());
    }
    cfg.root_cert = Some(ders);
    cfg.tls_server_name = hook.tls_name.clone();
    let client = kube::Client::try_from(cfg).map_err(|e| format!("{e}"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let body = serde_json::to_vec(review).map_err(|e| e.to_string())?;
    let req = hyper::Request::post(path)
        .header("content-type", "application/json")
        .body(body)
        .map_err(|e| e.to_string())?;
    client
        .request::<Value>(req)
        .await
        .map_err(|e| format!("{e}"))
}

/// DER certificates from a PEM bundle.
fn pem_certificates(pem: &[u8]) -> Vec<Vec<u8>> {
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line == "-----BEGIN CERTIFICATE-----" {
            cur = Some(String::new());
        } else if line == "-----END CERTIFICATE-----" {
            if let Some(b) = cur.take()
                && let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b)
            {
                out.push(der);
            }
        } else if let Some(b) = cur.as_mut() {
            b.push_str(line);
        }
    }
    out
}
