//! Create, read, update; resourceVersion, uid, generation and the error bodies.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{api_err, create, merge, merge_status, pod_json, raw, start};

/// Without the workload controllers, which would write Deployment status themselves.
async fn no_controllers() -> (tandem_e2e::apiserver::RunningServer, kube::Client) {
    super::start_with(tandem_e2e::apiserver::Config {
        workload_controllers: false,
        ..Default::default()
    })
    .await
}

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

fn deployment(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}},
        },
    })
}

#[tokio::test]
async fn create_fills_uid_version_timestamp_and_generation() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let a = create(&api, cm("a")).await;
    let b = create(&api, cm("b")).await;
    let (ma, mb) = (&a.metadata, &b.metadata);
    assert_eq!(ma.uid.as_ref().unwrap().len(), 36);
    assert_ne!(ma.uid, mb.uid);
    assert!(ma.creation_timestamp.is_some());
    assert_eq!(ma.generation, Some(1));
    let (ra, rb): (u64, u64) = (
        ma.resource_version.as_ref().unwrap().parse().unwrap(),
        mb.resource_version.as_ref().unwrap().parse().unwrap(),
    );
    assert!(rb > ra, "versions grow: {ra} then {rb}");
    let list = api.list(&ListParams::default()).await.unwrap();
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv >= rb, "a list's version covers its items");
    assert_eq!(api.get("a").await.unwrap().data, a.data);
}

#[tokio::test]
async fn generate_name_gives_distinct_names() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let v = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "job-"}});
    let a = create(&api, v.clone()).await;
    let b = create(&api, v).await;
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(
        na.starts_with("job-") && na.len() == "job-".len() + 5,
        "{na}"
    );
    assert_ne!(na, nb);
}

#[tokio::test]
async fn duplicate_create_is_409_already_exists() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("a")).await;
    let e = api_err(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(cm("a")).unwrap(),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "configmaps \"a\" already exists");
}

#[tokio::test]
async fn stale_update_is_409_conflict_and_current_update_succeeds() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let first = create(&api, cm("a")).await;
    let mut fresh = first.clone();
    fresh.data = Some([("k".to_owned(), "2".to_owned())].into());
    let updated = api
        .replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        first.metadata.resource_version
    );
    let mut stale = first.clone();
    stale.data = Some([("k".to_owned(), "3".to_owned())].into());
    let e = api_err(api.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("the object has been modified"),
        "{}",
        e.message
    );
    assert_eq!(
        api.get("a").await.unwrap().data.unwrap()["k"],
        "2",
        "the stale write changed nothing"
    );
    // Without a resourceVersion an update is unconditional.
    let mut blind = updated.clone();
    blind.metadata.resource_version = None;
    blind.data = Some([("k".to_owned(), "4".to_owned())].into());
    assert_eq!(
        api.replace("a", &PostParams::default(), &blind)
            .await
            .unwrap()
            .data
            .unwrap()["k"],
        "4"
    );
}

#[tokio::test]
async fn noop_update_keeps_the_version() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let a = create(&api, cm("a")).await;
    let again = api.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_eq!(again.metadata.resource_version, a.metadata.resource_version);
}

#[tokio::test]
async fn generation_tracks_spec_changes_only() {
    let (_s, client) = no_controllers().await;
    let api: Api<Deployment> = Api::default_namespaced(client);
    let d = create(&api, deployment("web", 1)).await;
    assert_eq!(d.metadata.generation, Some(1));
    let d = merge(&api, "web", json!({"metadata": {"labels": {"x": "y"}}}))
        .await
        .unwrap();
    assert_eq!(
        d.metadata.generation,
        Some(1),
        "metadata changes do not bump generation"
    );
    let d = merge_status(
        &api,
        "web",
        json!({"status": {"replicas": 1, "observedGeneration": 1}}),
    )
    .await
    .unwrap();
    assert_eq!(
        d.metadata.generation,
        Some(1),
        "status changes do not bump generation"
    );
    let d = merge(&api, "web", json!({"spec": {"replicas": 3}}))
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, Some(2), "spec changes do");
}

#[tokio::test]
async fn status_subresource_splits_spec_and_status_writes() {
    let (_s, client) = no_controllers().await;
    let api: Api<Deployment> = Api::default_namespaced(client);
    let mut with_status = deployment("web", 1);
    with_status["status"] = json!({"replicas": 7});
    let d = create(&api, with_status).await;
    assert!(
        d.status.is_none() || d.status.as_ref().unwrap().replicas.is_none(),
        "create ignores status"
    );
    // A status write cannot change the spec...
    let d = merge_status(
        &api,
        "web",
        json!({"spec": {"replicas": 9}, "status": {"replicas": 2}}),
    )
    .await
    .unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(1));
    assert_eq!(d.status.as_ref().unwrap().replicas, Some(2));
    // ... and a main-resource write cannot change the status.
    let d = merge(
        &api,
        "web",
        json!({"spec": {"replicas": 4}, "status": {"replicas": 5}}),
    )
    .await
    .unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(4));
    assert_eq!(d.status.as_ref().unwrap().replicas, Some(2));
}

#[tokio::test]
async fn pods_get_defaults_and_pending_status() {
    let (_s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client);
    let p = create(&api, pod_json("p", json!({}))).await;
    let spec = p.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
}

#[tokio::test]
async fn pod_spec_is_immutable_except_image() {
    let (_s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client);
    create(&api, pod_json("p", json!({}))).await;
    let pp = PatchParams::default();
    let e = api_err(merge(&api, "p", json!({"spec": {"nodeName": "n1"}})).await);
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.contains("pod updates may not change fields"),
        "{}",
        e.message
    );
    let p = api
        .patch(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.spec.unwrap().containers[0].image.as_deref(),
        Some("busybox:2")
    );
}

#[tokio::test]
async fn invalid_names_are_422_naming_the_field() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let e = api_err(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(cm("Not_Valid")).unwrap(),
        )
        .await,
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let causes = e.details.unwrap().causes;
    assert_eq!(causes[0].field, "metadata.name");
    assert!(api.get_opt("Not_Valid").await.unwrap().is_none());
}

#[tokio::test]
async fn missing_namespace_and_object_are_404_with_status_bodies() {
    let (s, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let e = api_err(
        api.create(
            &PostParams::default(),
            &serde_json::from_value(cm("a")).unwrap(),
        )
        .await,
    );
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "namespaces \"nope\" not found")
    );
    let (code, body) = super::raw(
        &s,
        "GET",
        "/api/v1/namespaces/default/configmaps/missing",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 404);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["reason"], "NotFound");
    assert_eq!(
        v["details"],
        json!({"name": "missing", "kind": "configmaps"})
    );
    let (code, _) = raw(&s, "GET", "/apis/nosuch.example.com/v1/things", &[], None).await;
    assert_eq!(code, 404);
}

#[tokio::test]
async fn create_with_a_resource_version_is_refused() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let mut v = cm("a");
    v["metadata"]["resourceVersion"] = json!("5");
    let e = api_err(
        api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await,
    );
    assert_eq!(e.code, 500);
    assert!(
        e.message.contains("resourceVersion should not be set"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn dry_run_stores_nothing() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let out = api
        .create(&pp, &serde_json::from_value(cm("dry")).unwrap())
        .await
        .unwrap();
    assert_eq!(out.metadata.name.as_deref(), Some("dry"));
    assert!(api.get_opt("dry").await.unwrap().is_none());
}

#[tokio::test]
async fn discovery_lists_builtin_groups_and_version() {
    let (_s, client) = start().await;
    let info = client.apiserver_version().await.unwrap();
    assert_eq!((info.major.as_str(), info.minor.as_str()), ("1", "35"));
    let d = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    for (group, kind) in [
        ("", "Pod"),
        ("apps", "Deployment"),
        ("coordination.k8s.io", "Lease"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ] {
        let g = d
            .get(group)
            .unwrap_or_else(|| panic!("group {group:?} discovered"));
        assert!(
            g.recommended_resources()
                .iter()
                .any(|(r, _)| r.kind == kind),
            "{kind} in {group:?}"
        );
    }
    let (pods, caps) =
        kube::discovery::pinned_kind(&client, &kube::api::GroupVersionKind::gvk("", "v1", "Pod"))
            .await
            .unwrap();
    assert_eq!(pods.plural, "pods");
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "pods/status" || r.plural == "status"),
        "{:?}",
        caps.subresources
    );
    let ns: Api<Namespace> = Api::all(client);
    let names: Vec<String> = ns
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
}

#[tokio::test]
async fn events_written_through_either_api_show_in_both() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as NewEvent;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let (_s, client) = start().await;
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let pod = create(&pods, pod_json("p", json!({}))).await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "tandem-test".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("hello".into()),
        action: "Test".into(),
        secondary: None,
    };
    recorder.publish(&ev, &pod.object_ref(&())).await.unwrap();
    let core: Api<CoreEvent> = Api::default_namespaced(client.clone());
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=p"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let e = &list.items[0];
    assert_eq!(
        (e.reason.as_deref(), e.message.as_deref()),
        (Some("Tested"), Some("hello"))
    );
    assert_eq!(e.reporting_component.as_deref(), Some("tandem-test"));
    let newer: Api<NewEvent> = Api::default_namespaced(client);
    let same = newer
        .get(e.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(same.metadata.uid, e.metadata.uid);
    core.delete(e.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    assert!(
        newer
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "deletes are mirrored too"
    );
}

#[tokio::test]
async fn pods_table_has_kubectl_columns() {
    let (s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client);
    create(&api, pod_json("p", json!({}))).await;
    let accept = [(
        "accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )];
    let (code, body) = raw(&s, "GET", "/api/v1/namespaces/default/pods", &accept, None).await;
    assert_eq!(code, 200);
    let t: Value = serde_json::from_str(&body).unwrap();
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Ready", "Status", "Restarts", "Node", "Age"]);
    assert_eq!(
        t["rows"][0]["cells"].as_array().unwrap()[..5],
        [
            json!("p"),
            json!("0/1"),
            json!("Pending"),
            json!(0),
            json!("<none>")
        ]
    );
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}

/// `stringData` is write-only: the server folds it into `data` (base64 of the UTF-8 string,
/// over `data`) on create, update and patch, and never returns it.
#[tokio::test]
async fn secret_string_data_is_folded_into_data_on_every_write() {
    use k8s_openapi::api::core::v1::Secret;
    let (server, client) = start().await;
    let api: Api<Secret> = Api::default_namespaced(client);
    let text = |s: &Secret| -> Value {
        assert!(s.string_data.is_none(), "stringData is never returned");
        json!(
            s.data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), String::from_utf8(v.0.clone()).unwrap()))
                .collect::<std::collections::BTreeMap<_, _>>()
        )
    };
    let s = create(
        &api,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
               "data": {"a": "b2xk", "b": "Yg=="}, "stringData": {"a": "new", "c": "k\u{e9}y\n"}}),
    )
    .await;
    assert_eq!(text(&s), json!({"a": "new", "b": "b", "c": "k\u{e9}y\n"}));
    // The wire form is base64, as `data` always is.
    let (code, wire) = raw(
        &server,
        "GET",
        "/api/v1/namespaces/default/secrets/s",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 200);
    let wire: Value = serde_json::from_str(&wire).unwrap();
    assert_eq!(wire["data"]["a"], "bmV3");
    assert!(wire.get("stringData").is_none(), "{wire}");
    assert!(text(&api.get("s").await.unwrap())["c"] == "k\u{e9}y\n");

    let mut put = api.get("s").await.unwrap();
    put.string_data = Some([("b".to_owned(), "put".to_owned())].into());
    let s = api
        .replace("s", &PostParams::default(), &put)
        .await
        .unwrap();
    assert_eq!(text(&s), json!({"a": "new", "b": "put", "c": "k\u{e9}y\n"}));

    let s = merge(&api, "s", json!({"stringData": {"d": "merged"}}))
        .await
        .unwrap();
    assert_eq!(text(&s)["d"], "merged");
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/stringData", "value": {"a": "jp"}},
    ]))
    .unwrap();
    let s = api
        .patch("s", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(text(&s)["a"], "jp");
    let s = api
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Strategic(json!({"stringData": {"e": "smp"}})),
        )
        .await
        .unwrap();
    assert_eq!(text(&s)["e"], "smp");
    let stored = text(&api.get("s").await.unwrap());
    assert_eq!(
        stored,
        json!({"a": "jp", "b": "put", "c": "k\u{e9}y\n", "d": "merged", "e": "smp"})
    );
    // Dry run answers with what would be stored.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let d: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "dry"}, "stringData": {"x": "y"}}))
    .unwrap();
    assert_eq!(
        text(&api.create(&dry, &d).await.unwrap()),
        json!({"x": "y"})
    );
}
