//! Label selectors, field selectors and list pagination.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use serde_json::json;

use super::{api_err, create, pod_json, start};

fn names(pods: Vec<Pod>) -> Vec<String> {
    let mut v: Vec<String> = pods.into_iter().filter_map(|p| p.metadata.name).collect();
    v.sort();
    v
}

#[tokio::test]
async fn set_based_label_selector_matches_the_right_pods() {
    let (_s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client);
    for (name, labels) in [
        ("ax", json!({"a": "x"})),
        ("ay", json!({"a": "y", "c": "1"})),
        ("az", json!({"a": "z"})),
        ("axb", json!({"a": "x", "b": "1"})),
        ("none", json!({})),
    ] {
        create(&api, pod_json(name, labels)).await;
    }
    let got = api
        .list(&ListParams::default().labels("a in (x,y),!b"))
        .await
        .unwrap();
    assert_eq!(names(got.items), ["ax", "ay"]);
    let got = api
        .list(&ListParams::default().labels("a notin (x),a"))
        .await
        .unwrap();
    assert_eq!(names(got.items), ["ay", "az"]);
    let got = api
        .list(&ListParams::default().labels("a=x,b"))
        .await
        .unwrap();
    assert_eq!(names(got.items), ["axb"]);
    let got = api
        .list(&ListParams::default().labels("a!=x"))
        .await
        .unwrap();
    assert_eq!(
        names(got.items),
        ["ay", "az", "none"],
        "!= also matches pods without the label"
    );
    let e = api_err(api.list(&ListParams::default().labels("a in x")).await);
    assert_eq!(e.code, 400);
}

#[tokio::test]
async fn pod_field_selectors() {
    let (_s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    let mut bound = pod_json("bound", json!({}));
    bound["spec"]["nodeName"] = json!("n1");
    bound["spec"]["schedulerName"] = json!("tandem");
    create(&api, bound).await;
    create(&api, pod_json("free", json!({}))).await;
    let list = |f: &'static str| {
        let api = api.clone();
        async move {
            names(
                api.list(&ListParams::default().fields(f))
                    .await
                    .unwrap()
                    .items,
            )
        }
    };
    assert_eq!(list("spec.nodeName=n1").await, ["bound"]);
    assert_eq!(list("spec.nodeName=").await, ["free"]);
    assert_eq!(list("spec.schedulerName=tandem").await, ["bound"]);
    assert_eq!(list("spec.schedulerName!=tandem").await, ["free"]);
    assert_eq!(
        list("status.phase=Pending,metadata.name=free").await,
        ["free"]
    );
    assert_eq!(list("metadata.namespace=default").await, ["bound", "free"]);
    let e = api_err(
        api.list(&ListParams::default().fields("spec.bogus=1"))
            .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let e = api_err(
        cms.list(&ListParams::default().fields("status.phase=x"))
            .await,
    );
    assert_eq!(e.code, 400, "configmaps support only metadata fields");
}

#[tokio::test]
async fn pagination_with_limit_and_continue_visits_every_item_once() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for i in 0..7 {
        create(&api, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}})).await;
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut first_rv = None;
    loop {
        let mut lp = ListParams::default().limit(3);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 3);
        if pages == 1 {
            assert_eq!(page.metadata.remaining_item_count, Some(4));
            first_rv = page.metadata.resource_version.clone();
        } else {
            assert_eq!(
                page.metadata.resource_version, first_rv,
                "pages report the first page's version"
            );
        }
        seen.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        token = page.metadata.continue_.filter(|c| !c.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    let unique: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!((seen.len(), unique.len()), (7, 7));
    let e = api_err(
        api.list(&ListParams::default().continue_token("garbage!"))
            .await,
    );
    assert_eq!(e.code, 400);
    // A deleted item does not break the walk.
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    api.delete("cm-3", &Default::default()).await.unwrap();
    let rest = api
        .list(
            &ListParams::default()
                .limit(100)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 4);
}
