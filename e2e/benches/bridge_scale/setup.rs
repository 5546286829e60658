//! What the bench sets up besides the API server: the real `tandem controller` process
//! (waited for until it answers), the scheduler-plugins PodGroup CRD, and dynamic APIs for
//! custom resources. Apart from `main.rs` because it is set-up, not measurement.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::json;
use tandem_e2e::bridgekit::{Proc, free_port, spawn};
use tandem_net::auth::{ClusterKey, Identity};
use tandem_net::endpoint;
use tandem_proto::v1;
use tandem_proto::v1::nodes_client::NodesClient;

pub fn podgroup_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
        "spec": {
            "group": "scheduling.x-k8s.io", "scope": "Namespaced",
            "names": {"kind": "PodGroup", "plural": "podgroups", "singular": "podgroup",
                      "listKind": "PodGroupList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap_or_else(|e| panic!("the PodGroup CRD: {e}"))
}

pub fn dynamic_api(
    client: &kube::Client,
    ns: &str,
    g: &str,
    v: &str,
    k: &str,
    plural: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource {
            group: g.into(),
            version: v.into(),
            api_version: format!("{g}/{v}"),
            kind: k.into(),
            plural: plural.into(),
        },
    )
}

pub struct Batch {
    pub _controller: Proc,
    pub url: String,
    pub key: ClusterKey,
    pub key_file: PathBuf,
}

pub async fn start_controller(tandem: &Path, dir: &Path) -> Batch {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap_or_else(|e| panic!("{}: {e}", state.display()));
    let key_file = state.join("tandem.key");
    let addr = format!("127.0.0.1:{}", free_port());
    let (s, k) = (
        state.to_string_lossy().into_owned(),
        key_file.to_string_lossy().into_owned(),
    );
    let proc = spawn(
        tandem,
        &[
            "controller",
            "--listen",
            &addr,
            "--state-dir",
            &s,
            "--key-file",
            &k,
            "--heartbeat-interval",
            "2s",
            // The bench's own process is busy at times: no node lost to a late heartbeat.
            "--node-timeout",
            "120s",
            "--kill-wait",
            "1s",
            "--insecure-plaintext",
        ],
        &dir.join("controller.log"),
        &[(
            "RUST_LOG",
            &std::env::var("TANDEM_BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "warn".into()),
        )],
    );
    let url = format!("http://{addr}");
    let key = loop {
        if let Ok(k) = ClusterKey::load(&key_file) {
            break k;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // It answers once it listens.
    let admin = Identity::user("root", 0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(ch) = endpoint::connect(&url, &key, &admin).await
            && NodesClient::new(ch)
                .list_nodes(v1::ListNodesRequest::default())
                .await
                .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the controller did not answer");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Batch {
        _controller: proc,
        url,
        key,
        key_file,
    }
}
