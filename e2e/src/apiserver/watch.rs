//! Watches: a stream of `{"type": ..., "object": ...}` lines from a resourceVersion on.
//!
//! A watch task wakes on every commit (the store's version channel), reads the type's event
//! window after the last version it sent, and filters by namespace and selectors. A change
//! that moves an object out of (into) the selection is sent as DELETED (ADDED), as the real
//! watch cache does. Bookmarks, when asked for, carry the store's version every
//! `bookmark_interval`; `sendInitialEvents=true` ends its initial ADDED events with the
//! bookmark annotated `k8s.io/initial-events-end`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Ctx;
use super::error::{ApiError, ApiResult};
use super::list::ListParams;
use super::ops::present;
use super::resource::ResourceType;
use super::store::{EventKind, Since};

#[derive(Clone, Debug)]
pub struct WatchParams {
    pub list: ListParams,
    pub ns: Option<String>,
    pub bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub timeout: Duration,
    /// Send each event's object as a one-row Table (what `kubectl get -w` asks for).
    pub table: bool,
}

/// Where the stream starts.
enum Start {
    /// Synthetic ADDED events for the current state first.
    Snapshot {
        end_bookmark: bool,
    },
    From(u64),
}

/// Validates the request and starts the stream. Errors found before streaming are plain
/// HTTP errors; a version that is too old is an `ERROR` event (as a real server sends it).
pub fn watch(
    ctx: Arc<Ctx>,
    rt: Arc<ResourceType>,
    version: String,
    p: WatchParams,
) -> ApiResult<Response> {
    let rv = p.list.resource_version.clone().filter(|r| !r.is_empty());
    let start = match (p.send_initial_events, rv.as_deref()) {
        (Some(true), _) => {
            if !p.bookmarks {
                return Err(ApiError::invalid(
                    "WatchList",
                    "meta.k8s.io",
                    "",
                    vec![super::error::Cause::new(
                        "FieldValueForbidden",
                        "allowWatchBookmarks",
                        "Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
                    )],
                ));
            }
            Start::Snapshot { end_bookmark: true }
        }
        (_, None) | (_, Some("0")) => Start::Snapshot {
            end_bookmark: false,
        },
        (_, Some(r)) => Start::From(
            r.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r:?}")))?,
        ),
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        run(ctx, rt, version, p, start, tx).await;
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn render(rt: &ResourceType, version: &str, obj: Value, table: bool) -> Value {
    let obj = present(rt, version, obj);
    if table {
        super::table::to_table(rt, version, &obj)
    } else {
        obj
    }
}

fn bookmark(rt: &ResourceType, version: &str, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        json!({"kind": rt.kind, "apiVersion": rt.api_version(version), "metadata": metadata}),
    )
}

async fn run(
    ctx: Arc<Ctx>,
    rt: Arc<ResourceType>,
    version: String,
    p: WatchParams,
    start: Start,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let key = rt.key();
    let in_scope = |obj: &Value| {
        p.ns.as_deref()
            .is_none_or(|ns| super::meta::namespace(obj) == ns)
            && p.list.matches(obj)
    };
    let mut changed = ctx.store.subscribe();
    let mut shutdown = ctx.shutdown.clone();
    let mut out: Vec<Bytes> = Vec::new();
    let mut last = {
        let st = ctx.store.lock();
        match start {
            Start::Snapshot { end_bookmark } => {
                for (_, obj) in st.iter(&rt, p.ns.as_deref(), None) {
                    if in_scope(obj) {
                        out.push(line("ADDED", render(&rt, &version, obj.clone(), p.table)));
                    }
                }
                if end_bookmark {
                    out.push(bookmark(&rt, &version, st.rv(), true));
                }
                st.rv()
            }
            Start::From(rv) => rv,
        }
    };
    for b in out.drain(..) {
        if tx.send(Ok(b)).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(p.timeout);
    tokio::pin!(deadline);
    let mut ticker = tokio::time::interval(ctx.config.bookmark_interval);
    // A slow reader gets one bookmark late, not a burst of them.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut first = true;
    loop {
        let mut tick = false;
        if !first {
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = ticker.tick(), if p.bookmarks => tick = true,
                _ = &mut deadline => return,
                _ = shutdown.changed() => return,
                _ = tx.closed() => return,
            }
        }
        first = false;
        let (since, now) = {
            let st = ctx.store.lock();
            (st.since(&key, last), st.rv())
        };
        let events = match since {
            Since::Events(e) => e,
            Since::TooOld => {
                let e = ApiError::gone(format!("too old resource version: {last} ({now})"));
                let _ = tx.send(Ok(line("ERROR", e.status_body()))).await;
                return;
            }
            Since::Gone => return,
        };
        if tick && events.is_empty() {
            // Nothing of this type is pending, so every change up to `now` has been sent.
            last = last.max(now);
            if tx
                .send(Ok(bookmark(&rt, &version, last, false)))
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        for e in events {
            last = e.rv;
            let now_in = in_scope(&e.object);
            let was_in = e.prev.as_ref().is_some_and(&in_scope);
            let (kind, obj) = match e.kind {
                EventKind::Added | EventKind::Deleted if now_in => {
                    (e.kind.as_str(), e.object.clone())
                }
                EventKind::Modified if now_in && was_in => ("MODIFIED", e.object.clone()),
                EventKind::Modified if now_in => ("ADDED", e.object.clone()),
                EventKind::Modified if was_in => {
                    let mut old = e.prev.clone().unwrap_or(Value::Null);
                    old["metadata"]["resourceVersion"] = json!(e.rv.to_string());
                    ("DELETED", old)
                }
                _ => continue,
            };
            if tx
                .send(Ok(line(kind, render(&rt, &version, obj, p.table))))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}
