//! Background work a real cluster's controllers do: the garbage collector (ownerReferences,
//! `foregroundDeletion` and `orphan` finalizers), namespace cleanup, CRD cleanup.
//!
//! One task runs a pass after every change to the store; a pass makes changes only when
//! something is left to collect, so passes settle.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::Ctx;
use super::meta;
use super::ops::{DeleteOpts, delete_in};
use super::store::State;

const FOREGROUND: &str = "foregroundDeletion";
const ORPHAN: &str = "orphan";
const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

pub async fn run(ctx: Arc<Ctx>) {
    let mut changed = ctx.store.subscribe();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        ctx.store.with(pass);
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// `(type key, namespace, name)` of a stored object.
type Ref = (String, String, String);

/// One collection pass over the whole store.
pub fn pass(st: &mut State) {
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
    drop_unserved_custom_types(st);
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

/// A CRD that is gone takes its type with it.
fn drop_unserved_custom_types(st: &mut State) {
    let gone: Vec<String> = st
        .types
        .iter()
        .filter(|(k, t)| {
            t.rt.custom.is_some()
                && st
                    .try_get("customresourcedefinitions.apiextensions.k8s.io", "", k)
                    .is_none()
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in gone {
        st.remove_type(&k);
    }
}
