//! The bench's pods: the watch that records when each pod was first seen bound (or
//! waiting), the pod it creates, and the two ways it creates them (a burst with 64 calls in
//! flight, or a steady pace). Apart from `main.rs` because this is the measuring side of
//! every phase.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::{WAIT, progress};

/// When each pod was first seen bound, and whether it was seen waiting.
#[derive(Default)]
pub struct Seen {
    pub bound: HashMap<String, (Instant, String)>,
    pub waiting: std::collections::HashSet<String>,
}

pub fn watch_pods(api: Api<Pod>, seen: Arc<Mutex<Seen>>) {
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            let p = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => p,
                Ok(_) => continue,
                Err(e) => {
                    progress(format!("pod watch: {e}"));
                    continue;
                }
            };
            let at = Instant::now();
            let name = p.metadata.name.clone().unwrap_or_default();
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let Ok(mut seen) = seen.lock() else { return };
            match node {
                Some(n) => {
                    seen.bound.entry(name).or_insert((at, n));
                }
                None => {
                    let waits = p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter()
                                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                        });
                    if waits {
                        seen.waiting.insert(name);
                    }
                }
            }
        }
    });
}

/// Polls `f` every 5 ms until it holds or [`WAIT`] passes; whether it held.
pub async fn until(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while !f() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

pub fn pod(name: &str, gpus: u32, labels: serde_json::Value) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox",
                     "command": ["sleep", "3600"],
                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                   "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
    });
    if labels_empty(&v) {
        v["metadata"].as_object_mut().map(|m| m.remove("labels"));
    }
    serde_json::from_value(v).unwrap_or_else(|e| panic!("a pod: {e}"))
}

fn labels_empty(v: &serde_json::Value) -> bool {
    v["metadata"]["labels"]
        .as_object()
        .is_none_or(serde_json::Map::is_empty)
}

/// Creates `pods` with 64 create calls in flight; each pod's create time (just before its
/// call) goes into `created`.
pub async fn create_pods(api: &Api<Pod>, pods: Vec<Pod>, created: &mut HashMap<String, Instant>) {
    let results: Vec<(String, Instant, Result<Pod, kube::Error>)> =
        futures::stream::iter(pods.into_iter().map(|p| {
            let api = api.clone();
            async move {
                let name = p.metadata.name.clone().unwrap_or_default();
                let at = Instant::now();
                let r = api.create(&PostParams::default(), &p).await;
                (name, at, r)
            }
        }))
        .buffer_unordered(64)
        .collect()
        .await;
    for (name, at, r) in results {
        match r {
            Ok(_) => {
                created.insert(name, at);
            }
            Err(e) => progress(format!("creating pod {name}: {e}")),
        }
    }
}

/// Creates `pods` at `rate` per second, each on its own task (a slow create does not
/// delay the next); each pod's create time (just before its call) goes into `created`.
pub async fn create_paced(
    api: &Api<Pod>,
    pods: Vec<Pod>,
    rate: f64,
    created: &mut HashMap<String, Instant>,
) {
    let start = tokio::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for (i, p) in pods.into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate)).await;
        let api = api.clone();
        calls.spawn(async move {
            let name = p.metadata.name.clone().unwrap_or_default();
            let at = Instant::now();
            let r = api.create(&PostParams::default(), &p).await;
            (name, at, r)
        });
    }
    while let Some(done) = calls.join_next().await {
        match done {
            Ok((name, at, Ok(_))) => {
                created.insert(name, at);
            }
            Ok((name, _, Err(e))) => progress(format!("creating pod {name}: {e}")),
            Err(e) => progress(format!("a create task: {e}")),
        }
    }
}
