//! Conformance suite for the in-memory API server, written from the Kubernetes API
//! documentation (API concepts, field/label selectors, patches, server-side apply, CRDs,
//! garbage collection, admission webhooks). Every test runs against its own server.
//!
//! Modules:
//! - `crud`: create/get/update, versions and 409s, generation, status subresource, names,
//!   discovery, error bodies.
//! - `selectors`: label and field selectors, pagination.
//! - `watch`: watch events, 410 Gone, bookmarks, streaming lists, kube-runtime watchers.
//! - `patch`: merge, JSON, strategic merge patch and server-side apply.
//! - `crd`: custom resources: schema validation, pruning, defaults, scale, status, tables.
//! - `lifecycle`: finalizers, garbage collection, namespaces, pod deletion, binding, eviction.
//! - `admission`: mutating and validating webhooks over HTTPS.
//! - `proxy`: the `log` subresource proxied to a kubelet endpoint.
//! - `binary`: the `kube-sim` process and its kubeconfig.
//! - `workloads`: Deployment, ReplicaSet, StatefulSet and Job controllers.

mod admission;
mod binary;
mod crd;
mod crud;
mod lifecycle;
mod patch;
mod proxy;
mod selectors;
mod watch;
mod workloads;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tandem_e2e::apiserver::{Config, RunningServer, Server};

/// A server with the default config and a client for it.
pub async fn start() -> (RunningServer, kube::Client) {
    start_with(Config::default()).await
}

pub async fn start_with(config: Config) -> (RunningServer, kube::Client) {
    let server = Server::start(config).await.expect("server starts");
    let client = server.client().expect("client");
    (server, client)
}

/// The `Status` of a failed call, or a panic naming what succeeded instead.
pub fn api_err<T: std::fmt::Debug>(r: kube::Result<T>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Creates an object from JSON through a typed API.
pub async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).expect("valid object JSON");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create")
}

/// A JSON merge patch (RFC 7386) of `name` with default params.
pub async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> kube::Result<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// A JSON merge patch of `name`'s `status` subresource with default params.
pub async fn merge_status<K>(api: &Api<K>, name: &str, patch: Value) -> kube::Result<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

pub fn pod_json(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox:1"}]},
    })
}

/// Writes what a kubelet would report for a running, ready pod.
pub async fn run_ready(pods: &Api<Pod>, name: &str) {
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    merge_status(pods, name, status).await.unwrap();
}

/// Polls `f` until it returns Some, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Raw HTTP against the server (for what `kube::Client` hides): returns status and body.
pub async fn raw(
    server: &RunningServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<axum::body::Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{}{path}", server.url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if !body.is_empty()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header("content-type", "application/json");
    }
    let resp = client
        .request(
            req.body(http_body_util::Full::new(axum::body::Bytes::from(body)))
                .unwrap(),
        )
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}
