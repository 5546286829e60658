//! Admission webhooks called over HTTPS with the configuration's caBundle.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::post;
use base64::Engine;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{api_err, create, start};

/// A TLS listener for axum; failed handshakes are skipped.
struct TlsListener {
    tcp: TcpListener,
    tls: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.tls.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A webhook server over HTTPS. `/mutate` adds the label `mutated=yes`; `/validate` denies
/// objects whose name starts with `deny`. Records the names it was asked about.
struct Hook {
    port: u16,
    /// base64 of the PEM certificate (what a caBundle holds).
    ca_bundle: String,
    calls: Arc<Mutex<Vec<String>>>,
}

fn review_response(review: &Value, allowed: bool, patch: Option<Value>, message: &str) -> Value {
    let mut resp = json!({"uid": review["request"]["uid"], "allowed": allowed});
    if let Some(p) = patch {
        resp["patchType"] = json!("JSONPatch");
        resp["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(p.to_string()));
    }
    if !allowed {
        resp["status"] = json!({"code": 403, "message": message});
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": resp})
}

fn self_signed() -> (rcgen::CertifiedKey<rcgen::KeyPair>, String) {
    let ck = rcgen::generate_simple_self_signed(vec![
        "127.0.0.1".to_owned(),
        "hook.default.svc".to_owned(),
    ])
    .unwrap();
    let pem = base64::engine::general_purpose::STANDARD.encode(ck.cert.pem());
    (ck, pem)
}

async fn start_hook() -> Hook {
    let (ck, ca_bundle) = self_signed();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![ck.cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
                ck.signing_key.serialize_der(),
            )),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = tcp.local_addr().unwrap().port();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (c1, c2) = (calls.clone(), calls.clone());
    let app = Router::new()
        .route(
            "/mutate",
            post(move |axum::Json(review): axum::Json<Value>| async move {
                c1.lock().unwrap().push(
                    review["request"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                );
                let patch =
                    json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]);
                axum::Json(review_response(&review, true, Some(patch), ""))
            }),
        )
        .route(
            "/validate",
            post(move |axum::Json(review): axum::Json<Value>| async move {
                let name = review["request"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                c2.lock().unwrap().push(name.clone());
                let deny = name.starts_with("deny");
                axum::Json(review_response(&review, !deny, None, "no thanks"))
            }),
        );
    let listener = TlsListener {
        tcp,
        tls: TlsAcceptor::from(Arc::new(cfg)),
    };
    tokio::spawn(async move { axum::serve(listener, app).await });
    Hook {
        port,
        ca_bundle,
        calls,
    }
}

fn mutating(name: &str, client_config: Value, extra: Value) -> MutatingWebhookConfiguration {
    let mut wh = json!({
        "name": format!("{name}.test.tandem.dev"),
        "clientConfig": client_config,
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
        "sideEffects": "None", "admissionReviewVersions": ["v1"],
    });
    if let (Some(w), Some(e)) = (wh.as_object_mut(), extra.as_object()) {
        w.extend(e.clone());
    }
    serde_json::from_value(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration", "metadata": {"name": name}, "webhooks": [wh]})).unwrap()
}

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}})).unwrap()
}

#[tokio::test]
async fn mutating_webhook_patch_is_applied_and_object_selector_honoured() {
    let (_s, client) = start().await;
    let hook = start_hook().await;
    let cfgs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let cc = json!({"url": format!("https://127.0.0.1:{}/mutate", hook.port), "caBundle": hook.ca_bundle});
    cfgs.create(
        &PostParams::default(),
        &mutating(
            "m",
            cc,
            json!({"objectSelector": {"matchLabels": {"hook": "yes"}}}),
        ),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let c = cms
        .create(
            &PostParams::default(),
            &cm("picked", json!({"hook": "yes"})),
        )
        .await
        .unwrap();
    assert_eq!(
        c.metadata
            .labels
            .unwrap()
            .get("mutated")
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        cms.get("picked").await.unwrap().metadata.labels.unwrap()["mutated"],
        "yes",
        "stored patched"
    );
    let c = cms
        .create(
            &PostParams::default(),
            &cm("skipped", json!({"hook": "no"})),
        )
        .await
        .unwrap();
    assert!(!c.metadata.labels.unwrap().contains_key("mutated"));
    assert_eq!(*hook.calls.lock().unwrap(), ["picked"]);
}

#[tokio::test]
async fn validating_webhook_denial_is_403_with_its_message() {
    let (_s, client) = start().await;
    let hook = start_hook().await;
    let cfgs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let cfg: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "v"},
        "webhooks": [{"name": "v.test.tandem.dev", "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", hook.port), "caBundle": hook.ca_bundle},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["default"]}]},
            "sideEffects": "None", "admissionReviewVersions": ["v1"]}],
    }))
    .unwrap();
    cfgs.create(&PostParams::default(), &cfg).await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let e = api_err(
        cms.create(&PostParams::default(), &cm("deny-me", json!({})))
            .await,
    );
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains("denied the request: no thanks"),
        "{}",
        e.message
    );
    assert!(cms.get_opt("deny-me").await.unwrap().is_none());
    cms.create(&PostParams::default(), &cm("fine", json!({})))
        .await
        .unwrap();
    // Outside the namespace selector the webhook is not called.
    let nss: Api<Namespace> = Api::all(client.clone());
    create(
        &nss,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}),
    )
    .await;
    let other: Api<ConfigMap> = Api::namespaced(client, "other");
    other
        .create(&PostParams::default(), &cm("deny-not-checked", json!({})))
        .await
        .unwrap();
    assert!(
        !hook
            .calls
            .lock()
            .unwrap()
            .contains(&"deny-not-checked".to_owned())
    );
}

#[tokio::test]
async fn failure_policy_decides_when_the_webhook_cannot_be_called() {
    let (_s, client) = start().await;
    let hook = start_hook().await;
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfgs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let unreachable =
        json!({"url": format!("https://127.0.0.1:{closed}/mutate"), "caBundle": hook.ca_bundle});
    cfgs.create(
        &PostParams::default(),
        &mutating(
            "ignore",
            unreachable.clone(),
            json!({"failurePolicy": "Ignore"}),
        ),
    )
    .await
    .unwrap();
    cms.create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    cfgs.create(
        &PostParams::default(),
        &mutating("fail", unreachable, json!({"failurePolicy": "Fail"})),
    )
    .await
    .unwrap();
    let e = api_err(
        cms.create(&PostParams::default(), &cm("b", json!({})))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert!(
        e.message
            .contains("failed calling webhook \"fail.test.tandem.dev\""),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn the_ca_bundle_is_what_the_server_trusts() {
    let (_s, client) = start().await;
    let hook = start_hook().await;
    let (_, other_ca) = self_signed();
    let cfgs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let cc =
        json!({"url": format!("https://127.0.0.1:{}/mutate", hook.port), "caBundle": other_ca});
    cfgs.create(&PostParams::default(), &mutating("wrong-ca", cc, json!({})))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    assert_eq!(
        api_err(
            cms.create(&PostParams::default(), &cm("a", json!({})))
                .await
        )
        .code,
        500
    );
    assert!(hook.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn service_references_reach_the_service_target_port_with_its_dns_name() {
    let (_s, client) = start().await;
    let hook = start_hook().await;
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    create(&svcs, json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hook"}, "spec": {"ports": [{"port": 443, "targetPort": hook.port}]}})).await;
    let cfgs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let cc = json!({"service": {"namespace": "default", "name": "hook", "path": "/mutate", "port": 443}, "caBundle": hook.ca_bundle});
    cfgs.create(&PostParams::default(), &mutating("svc", cc, json!({})))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let c = cms
        .create(&PostParams::default(), &cm("a", json!({"x": "y"})))
        .await
        .unwrap();
    assert_eq!(c.metadata.labels.unwrap()["mutated"], "yes");
}
