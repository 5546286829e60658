//! Background work a real cluster's controllers do: the garbage collector (ownerReferences,
//! `foregroundDeletion` and `orphan` finalizers), namespace cleanup, CRD cleanup.
//!
//! One task runs a pass after a change to the store that could give it work; a pass makes
//! changes only when something is left to collect, so passes settle.
//!
//! A pass reads the whole store, so it is skipped when the events since the last one (the
//! store's watch windows) cannot have given it work: no deletion, no object with owner
//! references or being deleted, nothing about namespaces or CRDs, nothing in a namespace
//! being deleted. Binding a pod or writing an Event, the bulk of a busy cluster's writes,
//! then costs the collector a look at that event only, not at the store.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::Ctx;
use super::meta;
use super::ops::{DeleteOpts, delete_in};
use super::store::{Event, EventKind, Since, State};

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";
const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

pub async fn run(ctx: Arc<Ctx>) {
    let mut changed = ctx.store.subscribe();
    let mut shutdown = ctx.shutdown.clone();
    // The version up to which the store's events were looked at; `None`: look at all.
    let mut seen: Option<u64> = None;
    loop {
        let started = std::time::Instant::now();
        ctx.store.with(|st| {
            let rv = st.rv();
            if seen.is_none_or(|since| may_have_work(st, since)) {
                // Work found (done or failed) is looked for again: the pass's own writes
                // are events too, and a failed delete leaves none.
                seen = if pass(st) { None } else { Some(rv) };
            } else {
                seen = Some(rv);
            }
        });
        // A pass reads the whole store under its lock: under a burst of relevant writes,
        // back-to-back passes held the lock most of the time (bridge_scale: 2,000 pods bound
        // at 23/s). Resting 4x the pass's duration caps collection at a fifth of the lock;
        // on a small store that is microseconds, so collection stays as prompt as before.
        tokio::time::sleep(started.elapsed() * 4).await;
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// `(type key, namespace, name)` of a stored object.
type Ref = (String, String, String);

/// Whether an event after version `since` could give a pass work. Unsure (a window that
/// no longer reaches back, a type gone) counts as yes.
fn may_have_work(st: &State, since: u64) -> bool {
    let deleting_ns: HashSet<&str> = st
        .types
        .get("namespaces")
        .map(|t| {
            t.objects
                .values()
                .filter(|n| meta::is_deleting(n))
                .map(meta::name)
                .collect()
        })
        .unwrap_or_default();
    st.types.keys().any(|key| match st.since(key, since) {
        Since::Events(events) => events.iter().any(|e| relevant(key, e, &deleting_ns)),
        Since::TooOld | Since::Gone => true,
    })
}

fn relevant(key: &str, e: &Event, deleting_ns: &HashSet<&str>) -> bool {
    let owned = |o: &Value| {
        o.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    e.kind == EventKind::Deleted
        || key == "namespaces"
        || key == "customresourcedefinitions.apiextensions.k8s.io"
        || owned(&e.object)
        || e.prev.as_ref().is_some_and(owned)
        || meta::is_deleting(&e.object)
        || deleting_ns.contains(meta::namespace(&e.object))
}

/// One collection pass over the whole store; whether it found anything to do.
pub fn pass(st: &mut State) -> bool {
    let uids: HashSet<String> = st
        .types
        .values()
        .flat_map(|t| t.objects.values().map(|o| meta::uid(o).to_owned()))
        .collect();
    let mut to_delete: Vec<Ref> = Vec::new();
    let mut to_strip: Vec<(Ref, String)> = Vec::new();
    let mut finish: Vec<(Ref, &'static str)> = Vec::new();
    let deleting_ns: Vec<String> = st
        .types
        .get("namespaces")
        .map(|t| {
            t.objects
                .values()
                .filter(|n| meta::is_deleting(n))
                .map(|n| meta::name(n).to_owned())
                .collect()
        })
        .unwrap_or_default();
    let deleting_crds: Vec<(String, String)> = st
        .types
        .get("customresourcedefinitions.apiextensions.k8s.io")
        .map(|t| {
            t.objects
                .values()
                .filter(|c| meta::is_deleting(c))
                .map(|c| (meta::name(c).to_owned(), meta::uid(c).to_owned()))
                .collect()
        })
        .unwrap_or_default();
    // Owners that hold deletion for their dependents.
    let mut foreground: HashSet<String> = HashSet::new();
    let mut orphaning: HashSet<String> = HashSet::new();
    for (key, ts) in &st.types {
        for ((ns, name), o) in &ts.objects {
            let r = (key.clone(), ns.clone(), name.clone());
            if meta::is_deleting(o) {
                let f = meta::finalizers(o);
                if f.iter().any(|x| x == FOREGROUND) {
                    foreground.insert(meta::uid(o).to_owned());
                }
                if f.iter().any(|x| x == ORPHAN) {
                    orphaning.insert(meta::uid(o).to_owned());
                }
            }
            if ts.rt.namespaced && deleting_ns.contains(ns) && !meta::is_deleting(o) {
                to_delete.push(r.clone());
            }
            if ts.rt.custom.is_some()
                && deleting_crds.iter().any(|(n, _)| *n == key.as_str())
                && !meta::is_deleting(o)
            {
                to_delete.push(r.clone());
            }
            let owners = meta::owner_uids(o);
            if !owners.is_empty()
                && !meta::is_deleting(o)
                && owners.iter().all(|u| !uids.contains(u))
            {
                to_delete.push(r.clone());
            }
        }
    }
    for (key, ts) in &st.types {
        for ((ns, name), o) in &ts.objects {
            let r = (key.clone(), ns.clone(), name.clone());
            for u in meta::owner_uids(o) {
                if foreground.contains(&u) && !meta::is_deleting(o) {
                    to_delete.push(r.clone());
                }
                if orphaning.contains(&u) {
                    to_strip.push((r.clone(), u));
                }
            }
        }
    }
    // Owners whose dependents are gone (foreground) or released (orphan) lose the finalizer.
    for (key, ts) in &st.types {
        for ((ns, name), o) in &ts.objects {
            if !meta::is_deleting(o) {
                continue;
            }
            let r = (key.clone(), ns.clone(), name.clone());
            let uid = meta::uid(o);
            let f = meta::finalizers(o);
            let dependents = st.types.values().any(|t| {
                t.objects
                    .values()
                    .any(|d| meta::owner_uids(d).iter().any(|u| u == uid))
            });
            if f.iter().any(|x| x == FOREGROUND) && !dependents {
                finish.push((r.clone(), FOREGROUND));
            }
            if f.iter().any(|x| x == ORPHAN) && !dependents {
                finish.push((r.clone(), ORPHAN));
            }
            if key == "customresourcedefinitions.apiextensions.k8s.io"
                && f.iter().any(|x| x == CRD_CLEANUP)
                && st.types.get(name).is_none_or(|t| t.objects.is_empty())
            {
                finish.push((r, CRD_CLEANUP));
            }
        }
    }
    let gone_types = unserved_custom_types(st);
    let found = !(to_delete.is_empty()
        && to_strip.is_empty()
        && finish.is_empty()
        && deleting_ns.is_empty()
        && gone_types.is_empty());
    let opts = DeleteOpts::default();
    for (key, ns, name) in dedup(to_delete) {
        if let Some(rt) = st.types.get(&key).map(|t| t.rt.clone())
            && let Err(e) = delete_in(st, &rt, &ns, &name, &opts)
        {
            tracing::debug!(%key, %ns, %name, error = %e, "garbage collection delete failed");
        }
    }
    for ((key, ns, name), uid) in to_strip {
        edit(st, &key, &ns, &name, |o| {
            if let Some(refs) = o
                .pointer_mut("/metadata/ownerReferences")
                .and_then(Value::as_array_mut)
            {
                refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
            }
        });
    }
    for ((key, ns, name), fin) in finish {
        edit(st, &key, &ns, &name, |o| {
            let left: Vec<String> = meta::finalizers(o)
                .into_iter()
                .filter(|f| f != fin)
                .collect();
            o["metadata"]["finalizers"] = json!(left);
        });
    }
    finish_namespaces(st, &deleting_ns);
    for k in gone_types {
        st.remove_type(&k);
    }
    found
}

fn dedup(v: Vec<Ref>) -> Vec<Ref> {
    let mut seen = HashSet::new();
    v.into_iter().filter(|r| seen.insert(r.clone())).collect()
}

fn edit(st: &mut State, key: &str, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
    let Some(rt) = st.types.get(key).map(|t| t.rt.clone()) else {
        return;
    };
    let Ok(mut o) = st.get(&rt, ns, name) else {
        return;
    };
    let rv = meta::resource_version(&o).unwrap_or_default().to_owned();
    f(&mut o);
    if let Err(e) = st.update(&rt, o, &rv) {
        tracing::debug!(%key, %ns, %name, error = %e, "garbage collection update failed");
    }
}

/// A deleting namespace with no content left is removed (its `kubernetes` finalizer done).
fn finish_namespaces(st: &mut State, deleting: &[String]) {
    for ns in deleting {
        let empty = st
            .types
            .values()
            .all(|t| !t.rt.namespaced || t.objects.keys().all(|(n, _)| n != ns));
        if empty
            && let Some(rt) = st.types.get("namespaces").map(|t| t.rt.clone())
            && let Err(e) = st.remove(&rt, "", ns)
        {
            tracing::debug!(%ns, error = %e, "namespace removal failed");
        }
    }
}

/// The custom types whose CRD is gone: each goes with it.
fn unserved_custom_types(st: &State) -> Vec<String> {
    st.types
        .iter()
        .filter(|(k, t)| {
            t.rt.custom.is_some()
                && st
                    .try_get("customresourcedefinitions.apiextensions.k8s.io", "", k)
                    .is_none()
        })
        .map(|(k, _)| k.clone())
        .collect()
}
