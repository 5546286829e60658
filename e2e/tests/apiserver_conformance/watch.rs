//! Watches: event order and types, 410 Gone, bookmarks, streaming lists, and kube-runtime
//! watchers and reflectors over churn.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tandem_e2e::apiserver::Config;

use super::{create, merge, pod_json, raw, start, start_with};

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "0"}})
}

type Events<K> = futures::stream::BoxStream<'static, kube::Result<WatchEvent<K>>>;

/// The collection's current resource version, from a list.
async fn list_version<K>(api: &Api<K>) -> String
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

/// One object's current resource version.
async fn object_version<K>(api: &Api<K>, name: &str) -> String
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let obj = api.get(name).await.unwrap();
    obj.meta().resource_version.clone().unwrap()
}

/// Opens a watch from `version`.
async fn watch_from<K>(api: &Api<K>, params: &WatchParams, version: &str) -> Events<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    api.watch(params, version).await.unwrap().boxed()
}

/// Merge-patches the config map's value.
async fn set_value(api: &Api<ConfigMap>, name: &str, v: &str) -> kube::Result<ConfigMap> {
    merge(api, name, json!({"data": {"v": v}})).await
}

/// Creates the config map `name` (the caller judges the result: churn makes conflicts
/// normal).
async fn create_cm(api: &Api<ConfigMap>, name: &str) -> kube::Result<ConfigMap> {
    let obj: ConfigMap = serde_json::from_value(cm(name)).unwrap();
    api.create(&Default::default(), &obj).await
}

/// Merge-patches the pod's `app` label.
async fn relabel(api: &Api<Pod>, name: &str, app: &str) {
    merge(api, name, json!({"metadata": {"labels": {"app": app}}}))
        .await
        .unwrap();
}

/// What a cache is compared by: each object's name and resource version.
fn name_and_version(c: &ConfigMap) -> (String, String) {
    (
        c.metadata.name.clone().unwrap(),
        c.metadata.resource_version.clone().unwrap(),
    )
}

/// What the server holds, sorted: every config map's name and resource version.
async fn server_state(api: &Api<ConfigMap>) -> Vec<(String, String)> {
    let mut state: Vec<_> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(name_and_version)
        .collect();
    state.sort();
    state
}

async fn next<K: Clone + std::fmt::Debug>(
    s: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> WatchEvent<K> {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("an event within 5s")
        .expect("stream open")
        .expect("event ok")
}

#[tokio::test]
async fn watch_from_a_list_version_sees_added_modified_deleted_in_order() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("before")).await;
    let rv = list_version(&api).await;
    let mut w = watch_from(&api, &WatchParams::default(), &rv).await;
    create(&api, cm("a")).await;
    set_value(&api, "a", "1").await.unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    let mut last = rv.parse::<u64>().unwrap();
    let mut kinds = Vec::new();
    for _ in 0..3 {
        let (kind, obj) = match next(&mut w).await {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            other => panic!("unexpected {other:?}"),
        };
        let v: u64 = obj.metadata.resource_version.unwrap().parse().unwrap();
        assert!(v > last, "versions increase along the stream");
        last = v;
        assert_eq!(
            obj.metadata.name.as_deref(),
            Some("a"),
            "the pre-existing object is not replayed"
        );
        kinds.push(kind);
    }
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);
}

#[tokio::test]
async fn watch_from_a_version_outside_the_window_is_410_gone() {
    let (_s, client) = start_with(Config {
        watch_window: 5,
        ..Config::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("a")).await;
    let old = object_version(&api, "a").await;
    for i in 0..10 {
        set_value(&api, "a", &i.to_string()).await.unwrap();
    }
    let mut w = watch_from(&api, &WatchParams::default(), &old).await;
    match next(&mut w).await {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
    // A recent version is still fine.
    let recent = object_version(&api, "a").await;
    let mut w = watch_from(&api, &WatchParams::default(), &recent).await;
    set_value(&api, "a", "x").await.unwrap();
    assert!(matches!(next(&mut w).await, WatchEvent::Modified(_)));
}

#[tokio::test]
async fn bookmarks_only_when_asked_and_carry_the_current_version() {
    let (_s, client) = start_with(Config {
        bookmark_interval: Duration::from_millis(50),
        ..Config::default()
    })
    .await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    create(&api, cm("a")).await;
    let rv = list_version(&api).await;
    // Changes to another type move the global version; the bookmark reports it.
    let pods: Api<Pod> = Api::default_namespaced(client);
    create(&pods, pod_json("p", json!({}))).await;
    let global = object_version(&pods, "p").await;
    let mut w = watch_from(&api, &WatchParams::default(), &rv).await;
    match next(&mut w).await {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, global),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    let mut plain = watch_from(&api, &WatchParams::default().disable_bookmarks(), &rv).await;
    let got = tokio::time::timeout(Duration::from_millis(300), plain.next()).await;
    assert!(
        got.is_err(),
        "no bookmark without allowWatchBookmarks: {got:?}"
    );
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_annotated_bookmark() {
    let (s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("a")).await;
    create(&api, cm("b")).await;
    let path = "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1";
    let (code, body) = raw(&s, "GET", path, &[], None).await;
    assert_eq!(code, 200);
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..3], ["ADDED", "ADDED", "BOOKMARK"]);
    assert_eq!(
        lines[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // Without bookmarks allowed, a streaming list is refused.
    let (code, _) = raw(
        &s,
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=true&sendInitialEvents=true",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 422);
}

#[tokio::test]
async fn legacy_watch_path_watches_one_object() {
    let (s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    create(&api, cm("a")).await;
    create(&api, cm("b")).await;
    let (code, body) = raw(
        &s,
        "GET",
        "/api/v1/watch/namespaces/default/configmaps/b?timeoutSeconds=1",
        &[],
        None,
    )
    .await;
    assert_eq!(code, 200);
    let names: Vec<String> = body
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(names, ["b"]);
}

#[tokio::test]
async fn watch_timeout_seconds_ends_the_stream() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let rv = list_version(&api).await;
    let mut w = watch_from(&api, &WatchParams::default().timeout(1), &rv).await;
    let end = tokio::time::timeout(Duration::from_secs(4), w.next())
        .await
        .expect("stream ends in time");
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test]
async fn relabelling_out_of_a_selector_is_seen_as_deleted() {
    let (_s, client) = start().await;
    let api: Api<Pod> = Api::default_namespaced(client);
    create(&api, pod_json("p", json!({"app": "a"}))).await;
    let rv = list_version(&api).await;
    let mut w = watch_from(&api, &WatchParams::default().labels("app=a"), &rv).await;
    relabel(&api, "p", "b").await;
    assert!(matches!(next(&mut w).await, WatchEvent::Deleted(_)));
    relabel(&api, "p", "a").await;
    assert!(matches!(next(&mut w).await, WatchEvent::Added(_)));
}

/// A server with a small watch window (so churn expires watches and forces relists) and
/// frequent bookmarks, and the config map API on it.
async fn churn_server(
    watch_window: usize,
    bookmark_interval: Duration,
) -> (tandem_e2e::apiserver::RunningServer, Api<ConfigMap>) {
    let (server, client) = start_with(Config {
        watch_window,
        bookmark_interval,
        ..Config::default()
    })
    .await;
    (server, Api::default_namespaced(client))
}

/// Runs a kube-runtime reflector through churn that overflows the watch window (forcing
/// 410 relists) and checks its store converges to exactly what the server holds.
async fn reflector_converges(streaming: bool) {
    let (_s, api) = churn_server(20, Duration::from_millis(100)).await;
    let (reader, writer) = reflector::store::<ConfigMap>();
    let mut cfg = watcher::Config::default().page_size(7);
    if streaming {
        cfg = cfg.streaming_lists();
    }
    let events = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = events.clone();
    let rf = reflector(writer, watcher(api.clone(), cfg))
        .default_backoff()
        .applied_objects()
        .try_for_each(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            futures::future::ready(Ok(()))
        });
    let task = tokio::spawn(rf);
    for round in 0..60 {
        let name = format!("cm-{}", round % 15);
        match round % 4 {
            0 | 1 => {
                let _ = create_cm(&api, &name).await;
            }
            2 => {
                let _ = set_value(&api, &name, &round.to_string()).await;
            }
            _ => {
                let _ = api.delete(&name, &Default::default()).await;
            }
        }
        if round % 10 == 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    let want = server_state(&api).await;
    super::eventually(
        "the reflector to match the server",
        Duration::from_secs(10),
        || {
            let reader = reader.clone();
            let want = want.clone();
            async move {
                let mut got: Vec<_> = reader.state().iter().map(|c| name_and_version(c)).collect();
                got.sort();
                (got == want).then_some(())
            }
        },
    )
    .await;
    assert!(events.load(std::sync::atomic::Ordering::Relaxed) > 0);
    task.abort();
}

#[tokio::test]
async fn reflector_with_list_watch_converges_through_churn() {
    reflector_converges(false).await;
}

#[tokio::test]
async fn reflector_with_streaming_lists_converges_through_churn() {
    reflector_converges(true).await;
}

#[tokio::test]
async fn watcher_streaming_list_yields_init_done_with_all_objects() {
    let (_s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    for n in ["a", "b", "c"] {
        create(&api, cm(n)).await;
    }
    let mut s = watcher(api, watcher::Config::default().streaming_lists()).boxed();
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => seen.push(o.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["a", "b", "c"]);
}

/// A kube-runtime `Controller` through randomised churn (seconds by default; set
/// `KUBE_SIM_CHURN_SECS=60` for the minute-long run). The watch window is small, so
/// watches expire and relist along the way. At the end the controller has reconciled every
/// live object at exactly the version the server holds, its cache equals the server's list,
/// and it did not spin (reconciles are bounded by the writes made).
#[tokio::test]
async fn controller_sees_every_change_through_churn() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use kube::runtime::Controller;
    use kube::runtime::controller::Action;
    use rand::{Rng, SeedableRng};

    let secs: u64 = std::env::var("KUBE_SIM_CHURN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let (_s, api) = churn_server(30, Duration::from_millis(200)).await;
    let seen: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let reconciles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let controller = Controller::new(api.clone(), watcher::Config::default().page_size(10));
    let cache = controller.store();
    let (seen2, count2) = (seen.clone(), reconciles.clone());
    let run = controller.run(
        move |cm: Arc<ConfigMap>, _: Arc<()>| {
            let (seen, count) = (seen2.clone(), count2.clone());
            async move {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let rv = cm.metadata.resource_version.clone().unwrap_or_default();
                seen.lock()
                    .unwrap()
                    .insert(cm.metadata.name.clone().unwrap_or_default(), rv);
                Ok::<_, kube::Error>(Action::await_change())
            }
        },
        |_, _, _| Action::requeue(Duration::from_secs(1)),
        Arc::new(()),
    );
    let task = tokio::spawn(run.for_each(|_| futures::future::ready(())));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut writes = 0usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        let name = format!("cm-{}", rng.random_range(0..25));
        let ok = match rng.random_range(0..10) {
            0..=3 => create_cm(&api, &name).await.is_ok(),
            4..=7 => set_value(&api, &name, &rng.random::<u32>().to_string())
                .await
                .is_ok(),
            _ => api.delete(&name, &Default::default()).await.is_ok(),
        };
        writes += usize::from(ok);
        if rng.random_range(0..20) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let want: HashMap<String, String> = server_state(&api).await.into_iter().collect();
    super::eventually(
        "the controller to catch up with the server",
        Duration::from_secs(15),
        || {
            let (seen, cache, want) = (seen.clone(), cache.clone(), want.clone());
            async move {
                let cached: HashMap<String, String> =
                    cache.state().iter().map(|c| name_and_version(c)).collect();
                let seen = seen.lock().unwrap();
                let reconciled_latest = want.iter().all(|(n, rv)| seen.get(n) == Some(rv));
                (cached == want && reconciled_latest).then_some(())
            }
        },
    )
    .await;
    let n = reconciles.load(std::sync::atomic::Ordering::Relaxed);
    assert!(writes > 50, "churn made {writes} writes");
    assert!(
        n <= writes + want.len() * 3,
        "{n} reconciles for {writes} writes: a busy loop?"
    );
    // Quiet now: no further reconciles without changes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = reconciles.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        reconciles.load(std::sync::atomic::Ordering::Relaxed),
        after,
        "reconciles continue with no changes"
    );
    task.abort();
}

#[tokio::test]
async fn shutdown_ends_open_watches() {
    let (s, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let rv = list_version(&api).await;
    let mut w = watch_from(&api, &WatchParams::default(), &rv).await;
    tokio::time::timeout(Duration::from_secs(6), s.shutdown())
        .await
        .expect("shutdown completes");
    let end = tokio::time::timeout(Duration::from_secs(2), w.next())
        .await
        .expect("the watch ends");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
}
