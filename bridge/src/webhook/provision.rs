//! `tandem-bridge webhook-certs`: the chart's install hook. Creates the CA and serving
//! certificate in a `kubernetes.io/tls` Secret (with `ca.crt`) unless the Secret exists, and
//! writes the CA into the `caBundle` of every webhook of the named configurations.
//! Idempotent: run again, it changes nothing; run by two jobs at once, one Secret wins and
//! both patch with its CA.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::Resource as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tracing::info;

use super::certs;

/// The Secret's keys (the `kubernetes.io/tls` ones plus the CA).
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";

/// What to provision.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    pub secret: String,
    pub service: String,
    pub mutating: Vec<String>,
    pub validating: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("generating the certificates: {0}")]
    Generate(#[from] tandem_net::tls::TlsError),
    #[error("{0} exists but lacks {1}; delete it to have it made again")]
    Incomplete(String, &'static str),
    #[error("{kind} {name} has no webhooks")]
    NoWebhooks { kind: &'static str, name: String },
}

fn api(what: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what, source }
}

/// What was done, for the job's log and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub secret_created: bool,
    /// Configurations whose caBundle was written (those already right are not listed).
    pub patched: Vec<String>,
    pub ca_pem: String,
}

pub async fn provision(client: Client, t: &Target) -> Result<Outcome, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &t.namespace);
    let what = format!("Secret {}/{}", t.namespace, t.secret);
    let (ca_pem, secret_created) = match secrets
        .get_opt(&t.secret)
        .await
        .map_err(api(what.clone()))?
    {
        Some(s) => (ca_of(&s, &what)?, false),
        None => {
            let b = certs::generate(&t.service, &t.namespace)?;
            match secrets.create(&PostParams::default(), &secret(t, &b)).await {
                Ok(_) => {
                    info!(secret = %what, "created the webhook CA and serving certificate");
                    (b.ca_pem, true)
                }
                // Another run created it between our read and write: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let s = secrets.get(&t.secret).await.map_err(api(what.clone()))?;
                    (ca_of(&s, &what)?, false)
                }
                Err(e) => return Err(api(what)(e)),
            }
        }
    };
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca_pem);
    let mut patched = Vec::new();
    let kinds = [
        (
            ApiResource::erase::<MutatingWebhookConfiguration>(&()),
            MutatingWebhookConfiguration::KIND,
            &t.mutating,
        ),
        (
            ApiResource::erase::<ValidatingWebhookConfiguration>(&()),
            ValidatingWebhookConfiguration::KIND,
            &t.validating,
        ),
    ];
    for (ar, kind, names) in kinds {
        let cfgs: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for name in names {
            let what = format!("{kind} {name}");
            let cfg = cfgs.get(name).await.map_err(api(what.clone()))?;
            let Some(ops) = ca_bundle_patch(&cfg.data, &bundle) else {
                return Err(Error::NoWebhooks {
                    kind,
                    name: name.to_string(),
                });
            };
            if ops.is_empty() {
                continue;
            }
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
                .map_err(|e| api(what.clone())(kube::Error::SerdeError(e)))?;
            cfgs.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
                .map_err(api(what.clone()))?;
            info!(config = %what, "caBundle written");
            patched.push(what);
        }
    }
    Ok(Outcome {
        secret_created,
        patched,
        ca_pem,
    })
}

fn secret(t: &Target, b: &certs::Bundle) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        (TLS_CRT, &b.cert_pem),
        (TLS_KEY, &b.key_pem),
        (CA_CRT, &b.ca_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
    .collect();
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(t.secret.clone()),
            namespace: Some(t.namespace.clone()),
            labels: Some(
                [(
                    "app.kubernetes.io/component".to_owned(),
                    "webhook".to_owned(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Default::default()
    }
}

/// The CA of an existing Secret, after checking it has all three keys.
fn ca_of(s: &Secret, what: &str) -> Result<String, Error> {
    let data = s.data.as_ref();
    let get = |k: &'static str| {
        data.and_then(|d| d.get(k))
            .filter(|v| !v.0.is_empty())
            .ok_or_else(|| Error::Incomplete(what.to_owned(), k))
    };
    get(TLS_CRT)?;
    get(TLS_KEY)?;
    Ok(String::from_utf8_lossy(&get(CA_CRT)?.0).into_owned())
}

/// The JSON patch writing `bundle` (base64 PEM) into every webhook of a configuration,
/// each guarded by a `test` of the webhook's name (a concurrent edit reordering them makes
/// the patch fail rather than write the wrong entry). Empty when all already hold it;
/// `None` when the configuration has no webhooks.
pub fn ca_bundle_patch(cfg: &Value, bundle: &str) -> Option<Vec<Value>> {
    let hooks = cfg.get("webhooks")?.as_array().filter(|w| !w.is_empty())?;
    let mut ops = Vec::new();
    for (i, wh) in hooks.iter().enumerate() {
        if wh.pointer("/clientConfig/caBundle").and_then(Value::as_str) == Some(bundle) {
            continue;
        }
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": wh["name"]}));
        if wh.get("clientConfig").is_some() {
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}));
        } else {
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig"), "value": {"caBundle": bundle}}));
        }
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_webhook_gets_the_bundle_once() {
        let cfg = json!({"webhooks": [
            {"name": "a.tandem.dev", "clientConfig": {"service": {"name": "s"}}},
            {"name": "b.tandem.dev", "clientConfig": {"caBundle": "QUJD"}},
        ]});
        let ops = ca_bundle_patch(&cfg, "QUJD").unwrap();
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/webhooks/0/name", "value": "a.tandem.dev"}),
                json!({"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "QUJD"}),
            ]
        );
        let mut done = cfg.clone();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut done, &patch).unwrap();
        assert_eq!(ca_bundle_patch(&done, "QUJD").unwrap(), Vec::<Value>::new());
        assert_eq!(ca_bundle_patch(&json!({"webhooks": []}), "QUJD"), None);
    }

    #[test]
    fn an_incomplete_secret_is_named() {
        let t = Target {
            namespace: "ns".into(),
            secret: "s".into(),
            service: "svc".into(),
            mutating: vec![],
            validating: vec![],
        };
        let b = certs::generate("svc", "ns").unwrap();
        let mut s = secret(&t, &b);
        assert_eq!(ca_of(&s, "Secret ns/s").unwrap(), b.ca_pem);
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        s.data.as_mut().unwrap().remove(CA_CRT);
        assert_eq!(
            ca_of(&s, "Secret ns/s").unwrap_err().to_string(),
            "Secret ns/s exists but lacks ca.crt; delete it to have it made again"
        );
    }
}
