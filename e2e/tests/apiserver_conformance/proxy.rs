//! The `log` subresource is proxied to the kubelet endpoint the pod's node reports.

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Path, Query};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, LogParams};
use serde_json::json;

use super::{api_err, create, start};

/// A stand-in kubelet log endpoint that echoes what it was asked.
async fn fake_kubelet() -> u16 {
    let app = Router::new().route(
        "/containerLogs/{ns}/{pod}/{container}",
        get(
            |Path((ns, pod, container)): Path<(String, String, String)>,
             Query(q): Query<HashMap<String, String>>| async move {
                let mut q: Vec<String> = q.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
                q.sort();
                format!(
                    "log of {ns}/{pod}/{container} [{}]\nsecond line\n",
                    q.join(",")
                )
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(l, app).await });
    port
}

#[tokio::test]
async fn pod_logs_come_from_the_nodes_kubelet() {
    let (_s, client) = start().await;
    let port = fake_kubelet().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = create(&nodes, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}], "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}})).await;
    assert!(
        node.status.unwrap().daemon_endpoints.is_some(),
        "node status survives create"
    );
    let pods: Api<Pod> = Api::default_namespaced(client);
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "x:1"}]}}),
    )
    .await;
    let text = pods
        .logs(
            "p",
            &LogParams {
                tail_lines: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(text, "log of default/p/main [tailLines=5]\nsecond line\n");
    create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"},
        "spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "x:1"}]}})).await;
    let e = api_err(pods.logs("two", &LogParams::default()).await);
    assert_eq!(e.code, 400);
    assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
    let text = pods
        .logs(
            "two",
            &LogParams {
                container: Some("b".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(text.starts_with("log of default/two/b"));
    create(&pods, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound"}, "spec": {"containers": [{"name": "a", "image": "x:1"}]}})).await;
    assert_eq!(
        api_err(pods.logs("unbound", &LogParams::default()).await).code,
        400
    );
}
