//! JSON merge patch, JSON patch, strategic merge patch and server-side apply.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{api_err, create, merge, start};

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1", "b": "2"}})
}

#[tokio::test]
async fn merge_patch_sets_and_removes_with_null() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("c")).await;
    let c = merge(&api, "c", json!({"data": {"a": null, "c": "3"}}))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(c.data).unwrap(),
        json!({"b": "2", "c": "3"})
    );
}

#[tokio::test]
async fn merge_patch_with_stale_version_is_409() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let c = create(&api, cm("c")).await;
    let rv = c.metadata.resource_version.unwrap();
    merge(&api, "c", json!({"data": {"x": "1"}})).await.unwrap();
    let e = api_err(
        merge(
            &api,
            "c",
            json!({"metadata": {"resourceVersion": rv}, "data": {"x": "2"}}),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
}

#[tokio::test]
async fn json_patch_applies_ops_and_a_failed_test_changes_nothing() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("c")).await;
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/data/c", "value": "3"},
        {"op": "remove", "path": "/data/a"},
    ]))
    .unwrap();
    let c = api
        .patch("c", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(c.data).unwrap(),
        json!({"b": "2", "c": "3"})
    );
    let bad: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/data/b", "value": "9"},
        {"op": "test", "path": "/data/c", "value": "wrong"},
    ]))
    .unwrap();
    let e = api_err(
        api.patch("c", &PatchParams::default(), &Patch::Json::<()>(bad))
            .await,
    );
    assert_eq!(e.code, 422);
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["b"], "2");
}

#[tokio::test]
async fn strategic_merge_merges_containers_by_name_and_replaces_other_lists() {
    let (_s, client) = start().await;
    let api: Api<Deployment> = Api::default_namespaced(client);
    create(&api, json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
            "containers": [{"name": "one", "image": "x:1", "env": [{"name": "A", "value": "1"}]}, {"name": "two", "image": "y:1"}],
            "tolerations": [{"key": "k1", "operator": "Exists"}],
        }}},
    }))
    .await;
    let patch = json!({"spec": {"template": {"spec": {
        "containers": [{"name": "one", "env": [{"name": "B", "value": "2"}]}],
        "tolerations": [{"key": "k2", "operator": "Exists"}],
    }}}});
    let d = api
        .patch("d", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let spec = d.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.containers.len(), 2, "containers merged by name");
    assert_eq!(spec.containers[0].image.as_deref(), Some("x:1"));
    let env: Vec<String> = spec.containers[0]
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(env, ["A", "B"], "env merged by name");
    let tol: Vec<String> = spec
        .tolerations
        .unwrap()
        .into_iter()
        .filter_map(|t| t.key)
        .collect();
    assert_eq!(tol, ["k2"], "tolerations have no merge key: replaced");
    let d = api
        .patch("d", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "two", "$patch": "delete"}]}}}})))
        .await
        .unwrap();
    assert_eq!(d.spec.unwrap().template.spec.unwrap().containers.len(), 1);
}

#[tokio::test]
async fn server_side_apply_creates_tracks_managers_and_detects_conflicts() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"l": "1"}}, "data": {"a": "1", "b": "2"}});
    let c = api
        .patch("c", &PatchParams::apply("alice"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert_eq!(
        c.data.as_ref().unwrap().len(),
        2,
        "apply creates a missing object"
    );
    let mf = c.metadata.managed_fields.clone().unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("alice"), Some("Apply"))
    );
    let fields = serde_json::to_value(&mf[0].fields_v1).unwrap();
    assert!(fields["f:data"]["f:a"].is_object(), "{fields}");
    // Another manager setting a field alice owns to a different value conflicts...
    let bob = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "9"}});
    let e = api_err(
        api.patch("c", &PatchParams::apply("bob"), &Patch::Apply(&bob))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(e.message.contains("alice"), "{}", e.message);
    // ... unless forced.
    let c = api
        .patch("c", &PatchParams::apply("bob").force(), &Patch::Apply(&bob))
        .await
        .unwrap();
    assert_eq!(c.data.as_ref().unwrap()["a"], "9");
    // Alice re-applies without "b": her field is removed; "a" is bob's now and stays.
    let alice2 = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"l": "1"}}, "data": {}});
    let c = api
        .patch("c", &PatchParams::apply("alice"), &Patch::Apply(&alice2))
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(c.data).unwrap(), json!({"a": "9"}));
    let e = api_err(
        api.patch("c", &PatchParams::default(), &Patch::Apply(&alice2))
            .await,
    );
    assert_eq!(e.code, 400, "apply needs a field manager");
}

#[tokio::test]
async fn reapplying_or_rewriting_the_same_object_is_a_no_op() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    let first = api
        .patch(
            "c",
            &PatchParams::apply("op").force(),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    let again = api
        .patch(
            "c",
            &PatchParams::apply("op").force(),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version, first.metadata.resource_version,
        "no new version, no watch event"
    );
    let mut blind = again.clone();
    blind.metadata.resource_version = None;
    let replaced = api.replace("c", &Default::default(), &blind).await.unwrap();
    assert_eq!(
        replaced.metadata.resource_version,
        first.metadata.resource_version
    );
    let merged = merge(&api, "c", json!({"data": {"a": "1"}})).await.unwrap();
    assert_eq!(
        merged.metadata.resource_version,
        first.metadata.resource_version
    );
}

/// RFC 6902 `test`, as the real server's library applies it: a failed test is 422 `Invalid`
/// (the real server's generic message) and changes nothing; a passing one lets the rest
/// apply; a test for `null` passes on a missing field, not on a missing element.
#[tokio::test]
async fn json_patch_test_op_refuses_with_422_or_lets_the_rest_apply() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let before = create(&api, cm("c")).await;
    let patch = |ops: Value| {
        let api = api.clone();
        async move {
            let ops: json_patch::Patch = serde_json::from_value(ops).unwrap();
            api.patch("c", &PatchParams::default(), &Patch::Json::<()>(ops))
                .await
        }
    };
    for failing in [
        json!([{"op": "replace", "path": "/data/a", "value": "9"},
               {"op": "test", "path": "/data/b", "value": "wrong"}]),
        json!([{"op": "test", "path": "/data/a", "value": null},
               {"op": "replace", "path": "/data/a", "value": "9"}]),
        json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "x"},
               {"op": "replace", "path": "/data/a", "value": "9"}]),
        json!([{"op": "test", "path": "/nothing/here", "value": null},
               {"op": "replace", "path": "/data/a", "value": "9"}]),
    ] {
        let e = api_err(patch(failing.clone()).await);
        assert_eq!(
            (e.code, e.reason.as_str(), e.message.as_str()),
            (
                422,
                "Invalid",
                "the server rejected our request due to an error in our request"
            ),
            "{failing}"
        );
        let now = api.get("c").await.unwrap();
        assert_eq!(now.data, before.data, "{failing}");
        assert_eq!(
            now.metadata.resource_version, before.metadata.resource_version,
            "{failing}"
        );
    }
    let c = patch(json!([
        {"op": "test", "path": "/data/b", "value": "2"},
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/f"]},
        {"op": "replace", "path": "/data/a", "value": "9"},
    ]))
    .await
    .unwrap();
    assert_eq!(c.data.unwrap()["a"], "9");
    assert_eq!(c.metadata.finalizers.unwrap(), ["x/f"]);
    let c = patch(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": ["x/f"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "y/f"},
    ]))
    .await
    .unwrap();
    assert_eq!(c.metadata.finalizers.unwrap(), ["x/f", "y/f"]);
}

/// kube-rs's finalizer helper: it adds its finalizer with a JSON patch testing
/// `/metadata/finalizers` for `null`, and removes it with a test of its index.
#[tokio::test]
async fn kube_runtime_finalizer_helper_adds_and_removes_its_finalizer() {
    use std::sync::Arc;

    use kube::api::DeleteParams;
    use kube::runtime::controller::Action;
    use kube::runtime::finalizer::{Event, finalizer};

    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("c")).await;
    let run = |obj: ConfigMap| {
        let api = api.clone();
        async move {
            finalizer(&api, "test.tandem.dev/f", Arc::new(obj), |e| async move {
                Ok::<_, std::io::Error>(match e {
                    Event::Apply(_) => Action::await_change(),
                    Event::Cleanup(_) => Action::await_change(),
                })
            })
            .await
        }
    };
    run(api.get("c").await.unwrap()).await.unwrap();
    let held = api.get("c").await.unwrap();
    assert_eq!(held.metadata.finalizers.unwrap(), ["test.tandem.dev/f"]);
    api.delete("c", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("c").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    run(deleting).await.unwrap();
    assert!(
        api.get_opt("c").await.unwrap().is_none(),
        "gone after cleanup"
    );
}
