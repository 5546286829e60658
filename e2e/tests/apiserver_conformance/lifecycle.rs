//! Deletion: finalizers, owner references and garbage collection, namespaces, graceful pod
//! deletion; the pod `binding` and `eviction` subresources; PVC binding.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Binding, ConfigMap, Namespace, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, EvictParams, PostParams, PropagationPolicy};
use serde_json::{Value, json};

use super::{api_err, create, eventually, merge, merge_status, pod_json, run_ready, start};

fn cm(name: &str, extra_meta: Value) -> Value {
    let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
    if let (Some(m), Some(e)) = (v["metadata"].as_object_mut(), extra_meta.as_object()) {
        m.extend(e.clone());
    }
    v
}

fn owned_by(owner: &Deployment) -> Value {
    json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.metadata.name, "uid": owner.metadata.uid, "blockOwnerDeletion": true}]})
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {
        "selector": {"matchLabels": {"a": name}}, "template": {"metadata": {"labels": {"a": name}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}}})
}

async fn gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(
        &format!("{name} to be deleted"),
        Duration::from_secs(5),
        || async { api.get_opt(name).await.unwrap().is_none().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_finalizer_holds_deletion_until_removed() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(
        &api,
        cm("c", json!({"finalizers": ["test.tandem.dev/hold"]})),
    )
    .await;
    let out = api.delete("c", &DeleteParams::default()).await.unwrap();
    assert!(
        out.is_left(),
        "still there: the object comes back, not a Status"
    );
    let c = api.get("c").await.unwrap();
    assert!(c.metadata.deletion_timestamp.is_some());
    // No new finalizers on a deleting object.
    let e = api_err(
        merge(
            &api,
            "c",
            json!({"metadata": {"finalizers": ["test.tandem.dev/hold", "other"]}}),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        api.get_opt("c").await.unwrap().is_some(),
        "held by the finalizer"
    );
    merge(&api, "c", json!({"metadata": {"finalizers": null}}))
        .await
        .unwrap();
    assert!(
        api.get_opt("c").await.unwrap().is_none(),
        "gone once the last finalizer is removed"
    );
}

#[tokio::test]
async fn background_gc_deletes_dependents_of_a_deleted_owner() {
    let (_s, client) = start().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let owner = create(&deps, deployment("own")).await;
    create(&cms, cm("dep", owned_by(&owner))).await;
    create(&cms, cm("free", json!({}))).await;
    deps.delete("own", &DeleteParams::default()).await.unwrap();
    gone(&cms, "dep").await;
    assert!(cms.get_opt("free").await.unwrap().is_some());
}

#[tokio::test]
async fn foreground_deletion_waits_for_dependents() {
    let (_s, client) = start().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let owner = create(&deps, deployment("own")).await;
    let mut meta = owned_by(&owner);
    meta["finalizers"] = json!(["test.tandem.dev/hold"]);
    create(&cms, cm("dep", meta)).await;
    deps.delete(
        "own",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    eventually(
        "the dependent to be marked for deletion",
        Duration::from_secs(5),
        || async {
            cms.get("dep")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some()
                .then_some(())
        },
    )
    .await;
    let o = deps.get("own").await.unwrap();
    assert!(
        o.metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_owned())
    );
    merge(&cms, "dep", json!({"metadata": {"finalizers": null}}))
        .await
        .unwrap();
    gone(&deps, "own").await;
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_the_owner_reference() {
    let (_s, client) = start().await;
    let deps: Api<Deployment> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let owner = create(&deps, deployment("own")).await;
    create(&cms, cm("dep", owned_by(&owner))).await;
    deps.delete(
        "own",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    gone(&deps, "own").await;
    let dep = cms.get("dep").await.unwrap();
    assert!(dep.metadata.owner_references.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_content_first() {
    let (_s, client) = start().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    create(
        &nss,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    create(
        &cms,
        cm("held", json!({"finalizers": ["test.tandem.dev/hold"]})),
    )
    .await;
    create(&cms, cm("plain", json!({}))).await;
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    gone(&cms, "plain").await;
    let ns = nss.get("team").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    let e = api_err(
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(cm("new", json!({}))).unwrap(),
        )
        .await,
    );
    assert_eq!(e.code, 403, "no new content in a terminating namespace");
    merge(&cms, "held", json!({"metadata": {"finalizers": null}}))
        .await
        .unwrap();
    gone(&nss, "team").await;
}

#[tokio::test]
async fn bound_pods_are_deleted_gracefully_and_removed_by_a_zero_grace_delete() {
    let (_s, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    let mut p = pod_json("bound", json!({}));
    p["spec"]["nodeName"] = json!("n1");
    let created = create(&pods, p).await;
    create(&pods, pod_json("unbound", json!({}))).await;
    pods.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        pods.get_opt("unbound").await.unwrap().is_none(),
        "an unbound pod goes at once"
    );
    pods.delete("bound", &DeleteParams::default())
        .await
        .unwrap();
    let held = pods.get("bound").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.metadata.deletion_grace_period_seconds, Some(30));
    // The kubelet may still write status during the grace period.
    merge_status(&pods, "bound", json!({"status": {"phase": "Failed"}}))
        .await
        .unwrap();
    assert!(pods.get_opt("bound").await.unwrap().is_some());
    let wrong_uid = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(api_err(pods.delete("bound", &wrong_uid).await).code, 409);
    let right = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: created.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("bound", &right).await.unwrap();
    assert!(pods.get_opt("bound").await.unwrap().is_none());
}

#[tokio::test]
async fn binding_sets_the_node_once() {
    let (_s, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    create(&pods, pod_json("p", json!({}))).await;
    let binding: Binding = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}})).unwrap();
    let _: Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    let p = pods.get("p").await.unwrap();
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("n1"));
    let conds = p.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );
    let e = api_err(
        pods.create_subresource::<Binding, Value>("binding", "p", &PostParams::default(), &binding)
            .await,
    );
    assert_eq!(e.code, 409);
}

#[tokio::test]
async fn eviction_deletes_the_pod() {
    let (_s, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client);
    create(&pods, pod_json("p", json!({}))).await;
    pods.evict("p", &EvictParams::default()).await.unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
    assert_eq!(
        api_err(pods.evict("p", &EvictParams::default()).await).code,
        404
    );
}

#[tokio::test]
async fn eviction_respects_disruption_budgets() {
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let (s, _) = start().await;
    // kube's client retries 429s with backoff for minutes (the real server sends the same
    // 429): this test wants to see the first answer.
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    for n in ["a", "b"] {
        create(&pods, pod_json(n, json!({"app": "db"}))).await;
        run_ready(&pods, n).await;
    }
    create(
        &pdbs,
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}}),
    )
    .await;
    pods.evict("a", &EvictParams::default()).await.unwrap();
    let e = api_err(pods.evict("b", &EvictParams::default()).await);
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    assert!(pods.get_opt("b").await.unwrap().is_some());
}

#[tokio::test]
async fn claims_are_bound_at_once() {
    let (_s, client) = start().await;
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client);
    let c = create(
        &pvcs,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    assert_eq!(c.status.unwrap().phase.as_deref(), Some("Bound"));
    assert!(c.spec.unwrap().volume_name.is_some());
}
