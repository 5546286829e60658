//! CustomResourceDefinitions and their custom resources.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use tandem_e2e::apiserver::RunningServer;

use super::{api_err, eventually, merge, merge_status, raw, start};

pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.tandem.dev"},
        "spec": {
            "group": "test.tandem.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
                "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "required": ["size"], "properties": {
                            "replicas": {"type": "integer", "minimum": 0},
                            "size": {"type": "string", "enum": ["small", "large"]},
                            "mode": {"type": "string", "default": "batch"},
                            "note": {"type": "string", "nullable": true},
                            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        }},
                        "status": {"type": "object", "properties": {
                            "replicas": {"type": "integer"}, "selector": {"type": "string"}, "phase": {"type": "string"},
                        }},
                    },
                }},
            }],
        },
    })
}

fn widget_api(client: kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.tandem.dev", "v1", "Widget"),
        "widgets",
    );
    Api::default_namespaced_with(client, &ar)
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "test.tandem.dev/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})).unwrap()
}

async fn create_widget(
    api: &Api<DynamicObject>,
    name: &str,
    spec: Value,
) -> kube::Result<DynamicObject> {
    api.create(&PostParams::default(), &widget(name, spec))
        .await
}

/// A server with the Widget CRD installed, and the widget API on it.
async fn widgets() -> (RunningServer, Api<DynamicObject>) {
    let (server, client) = start().await;
    install(&client).await;
    (server, widget_api(client))
}

pub async fn install(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd()).unwrap();
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let conds = created.status.unwrap().conditions.unwrap();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
}

#[tokio::test]
async fn custom_resources_are_served_after_the_crd_is_created() {
    let (_s, client) = start().await;
    let api = widget_api(client.clone());
    assert_eq!(api_err(api.list(&ListParams::default()).await).code, 404);
    install(&client).await;
    let w = create_widget(&api, "w1", json!({"size": "small", "replicas": 1}))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    assert_eq!(w.data["spec"]["mode"], "batch", "schema default applied");
    let d = kube::discovery::Discovery::new(client).run().await.unwrap();
    assert!(d.get("test.tandem.dev").is_some_and(|g| {
        g.recommended_resources()
            .iter()
            .any(|(r, _)| r.kind == "Widget")
    }));
}

#[tokio::test]
async fn schema_violations_are_422_naming_the_field() {
    let (_s, api) = widgets().await;
    let e =
        api_err(create_widget(&api, "bad", json!({"size": "small", "replicas": "three"})).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let causes = e.details.as_ref().unwrap().causes.clone();
    assert!(
        causes.iter().any(|c| c.field == "spec.replicas"),
        "{causes:?}"
    );
    assert!(e.message.contains("spec.replicas"), "{}", e.message);
    let e = api_err(create_widget(&api, "bad", json!({"replicas": 1})).await);
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "spec.size" && c.reason == "FieldValueRequired")
    );
    let e = api_err(create_widget(&api, "bad", json!({"size": "huge"})).await);
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "spec.size")
    );
    let e = api_err(create_widget(&api, "bad", json!({"size": "small", "replicas": -1})).await);
    assert_eq!(e.code, 422);
    assert!(
        api.get_opt("bad").await.unwrap().is_none(),
        "nothing stored"
    );
    // nullable fields accept null.
    create_widget(&api, "ok", json!({"size": "small", "note": null}))
        .await
        .unwrap();
    // Updates are validated too.
    let e = api_err(merge(&api, "ok", json!({"spec": {"replicas": "x"}})).await);
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn unknown_fields_are_pruned_unless_preserved() {
    let (_s, api) = widgets().await;
    let w = create_widget(
        &api,
        "w",
        json!({"size": "small", "bogus": 1, "extra": {"anything": [1, 2]}}),
    )
    .await
    .unwrap();
    assert!(w.data["spec"].get("bogus").is_none());
    assert_eq!(w.data["spec"]["extra"], json!({"anything": [1, 2]}));
}

#[tokio::test]
async fn generation_bumps_on_spec_not_on_status_or_metadata() {
    let (_s, api) = widgets().await;
    create_widget(&api, "w", json!({"size": "small", "replicas": 1}))
        .await
        .unwrap();
    let w = merge_status(&api, "w", json!({"status": {"phase": "Ready"}}))
        .await
        .unwrap();
    assert_eq!(
        (w.metadata.generation, w.data["status"]["phase"].as_str()),
        (Some(1), Some("Ready"))
    );
    let w = merge(&api, "w", json!({"metadata": {"labels": {"x": "y"}}}))
        .await
        .unwrap();
    assert_eq!(w.metadata.generation, Some(1));
    let w = merge(
        &api,
        "w",
        json!({"spec": {"size": "large"}, "status": {"phase": "Ignored"}}),
    )
    .await
    .unwrap();
    assert_eq!(w.metadata.generation, Some(2));
    assert_eq!(
        w.data["status"]["phase"], "Ready",
        "the main resource cannot write status"
    );
}

#[tokio::test]
async fn scale_subresource_reads_and_writes_spec_replicas() {
    let (_s, api) = widgets().await;
    create_widget(&api, "w", json!({"size": "small", "replicas": 2}))
        .await
        .unwrap();
    merge_status(
        &api,
        "w",
        json!({"status": {"replicas": 2, "selector": "app=w"}}),
    )
    .await
    .unwrap();
    let scale: Scale = api.get_scale("w").await.unwrap();
    assert_eq!(scale.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(scale.status.as_ref().unwrap().replicas, 2);
    assert_eq!(
        scale.status.as_ref().unwrap().selector.as_deref(),
        Some("app=w")
    );
    let scaled = api
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(scaled.spec.unwrap().replicas, Some(5));
    let w = api.get("w").await.unwrap();
    assert_eq!(w.data["spec"]["replicas"], 5);
    assert_eq!(w.metadata.generation, Some(2), "scaling is a spec change");
    // A Scale with a stale version conflicts.
    let mut stale = scale.clone();
    stale.spec.as_mut().unwrap().replicas = Some(1);
    let e = api_err(api.replace_scale("w", &PostParams::default(), &stale).await);
    assert_eq!(e.code, 409);
    let mut fresh: Scale = api.get_scale("w").await.unwrap();
    fresh.spec.as_mut().unwrap().replicas = Some(0);
    assert_eq!(
        api.replace_scale("w", &PostParams::default(), &fresh)
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas,
        Some(0)
    );
}

#[tokio::test]
async fn table_output_has_printer_columns() {
    let (s, api) = widgets().await;
    create_widget(&api, "w", json!({"size": "small", "replicas": 3}))
        .await
        .unwrap();
    let accept = [(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )];
    let (code, body) = raw(
        &s,
        "GET",
        "/apis/test.tandem.dev/v1/namespaces/default/widgets",
        &accept,
        None,
    )
    .await;
    assert_eq!(code, 200);
    let t: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Replicas", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "w");
    assert_eq!(t["rows"][0]["cells"][1], 3);
}

#[tokio::test]
async fn bad_crds_are_rejected_and_deleting_a_crd_removes_its_objects() {
    let (_s, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut bad = widget_crd();
    bad["metadata"]["name"] = json!("wrong.test.tandem.dev");
    let e = api_err(
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(bad).unwrap(),
        )
        .await,
    );
    assert_eq!(e.code, 422);
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "metadata.name")
    );
    install(&client).await;
    let api = widget_api(client.clone());
    create_widget(&api, "w", json!({"size": "small"}))
        .await
        .unwrap();
    crds.delete("widgets.test.tandem.dev", &Default::default())
        .await
        .unwrap();
    eventually("the CRD and its type to go", Duration::from_secs(5), || {
        let (crds, api) = (crds.clone(), api.clone());
        async move {
            let crd_gone = crds.get_opt("widgets.test.tandem.dev").await.unwrap().is_none();
            let type_gone = matches!(api.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 404);
            (crd_gone && type_gone).then_some(())
        }
    })
    .await;
}
