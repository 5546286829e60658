//! The object store: every object of every type, one global resourceVersion counter, and a
//! bounded window of recent events per type for watches.
//!
//! # Invariants
//! - Every committed change takes the next value of the global counter as its
//!   `resourceVersion`; lists report the counter, so "list at N, watch from N" misses nothing.
//! - A type's `window` holds every event with `rv > window_start`, at most `window_cap` of them
//!   (the real watch cache keeps a similar bounded history). A watch from an older version
//!   gets 410 Gone.
//! - All of it sits behind one `std::sync::Mutex`: operations are short and never await while
//!   holding it; webhooks and other I/O happen before a commit, which re-checks the version.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::watch;

use super::error::{ApiError, ApiResult};
use super::meta;
use super::resource::ResourceType;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change of one object.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventKind,
    pub object: Value,
    /// The object before a MODIFIED change, so a watch with a selector can turn a change that
    /// leaves (or enters) the selection into DELETED (or ADDED), as the real watch cache does.
    pub prev: Option<Value>,
}

/// `(namespace, name)`; cluster-scoped objects use `""` as namespace.
pub type ObjKey = (String, String);

pub struct TypeState {
    pub rt: Arc<ResourceType>,
    pub objects: BTreeMap<ObjKey, Value>,
    window: VecDeque<Arc<Event>>,
    /// Every event with a larger version is in `window`.
    window_start: u64,
}

pub struct State {
    rv: u64,
    /// By [`ResourceType::key`].
    pub types: BTreeMap<String, TypeState>,
    window_cap: usize,
}

/// What a watch gets when it asks for events after a version.
pub enum Since {
    Events(Vec<Arc<Event>>),
    /// The version is older than the window: the client must relist.
    TooOld,
    /// The type was removed (its CRD deleted).
    Gone,
}

/// The shared store. Cloning the `Arc` around it is how handlers share it.
pub struct Store {
    state: Mutex<State>,
    /// Carries the global version after every commit; watches and the garbage collector wait
    /// on it instead of polling.
    changed: watch::Sender<u64>,
}

impl Store {
    pub fn new(types: Vec<Arc<ResourceType>>, window_cap: usize) -> Self {
        let mut st = State {
            rv: 0,
            types: BTreeMap::new(),
            window_cap: window_cap.max(1),
        };
        for rt in types {
            st.add_type(rt);
        }
        Self {
            state: Mutex::new(st),
            changed: watch::channel(0).0,
        }
    }

    /// Locks the state. A poisoned lock means a handler panicked mid-change; the state is
    /// still structurally valid (every change is applied in one place), so keep serving.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Runs `f` on the locked state and wakes watchers if the version moved.
    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (r, before, after) = {
            let mut st = self.lock();
            let before = st.rv;
            let r = f(&mut st);
            (r, before, st.rv)
        };
        if after != before {
            self.changed.send_replace(after);
        }
        r
    }
}

impl State {
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn add_type(&mut self, rt: Arc<ResourceType>) {
        match self.types.get_mut(&rt.key()) {
            Some(ts) => ts.rt = rt,
            None => {
                let key = rt.key();
                self.types.insert(
                    key,
                    TypeState {
                        rt,
                        objects: BTreeMap::new(),
                        window: VecDeque::new(),
                        window_start: 0,
                    },
                );
            }
        }
    }

    /// Removes a type and all its objects (a CRD's deletion); watches of it end.
    pub fn remove_type(&mut self, key: &str) {
        self.types.remove(key);
    }

    pub fn resolve(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        let key = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        self.types
            .get(&key)
            .map(|t| t.rt.clone())
            .filter(|rt| rt.serves(version))
    }

    pub fn all_types(&self) -> Vec<Arc<ResourceType>> {
        self.types.values().map(|t| t.rt.clone()).collect()
    }

    fn ts(&self, rt: &ResourceType) -> ApiResult<&TypeState> {
        self.types
            .get(&rt.key())
            .ok_or_else(|| ApiError::not_found("resource", &rt.key()))
    }

    fn ts_mut(&mut self, rt: &ResourceType) -> ApiResult<&mut TypeState> {
        self.types
            .get_mut(&rt.key())
            .ok_or_else(|| ApiError::not_found("resource", &rt.key()))
    }

    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<Value> {
        self.ts(rt)?
            .objects
            .get(&(ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.key(), name))
    }

    pub fn try_get(&self, key: &str, ns: &str, name: &str) -> Option<&Value> {
        self.types
            .get(key)?
            .objects
            .get(&(ns.to_owned(), name.to_owned()))
    }

    /// Objects of a type in key order, optionally in one namespace, starting after `after`.
    pub fn iter<'a>(
        &'a self,
        rt: &ResourceType,
        ns: Option<&'a str>,
        after: Option<&'a ObjKey>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + 'a {
        let objects = self.types.get(&rt.key()).map(|t| &t.objects);
        objects.into_iter().flat_map(move |m| {
            let lower = match after {
                Some(k) => std::ops::Bound::Excluded(k.clone()),
                None => std::ops::Bound::Unbounded,
            };
            m.range((lower, std::ops::Bound::Unbounded))
                .filter(move |(k, _)| ns.is_none_or(|n| k.0 == n))
        })
    }

    /// Stores a new object. `obj` has its name and namespace final; this fills uid,
    /// creationTimestamp, generation and resourceVersion.
    pub fn create(&mut self, rt: &ResourceType, mut obj: Value) -> ApiResult<Value> {
        let (ns, name) = (
            meta::namespace(&obj).to_owned(),
            meta::name(&obj).to_owned(),
        );
        if rt.namespaced {
            match self.try_get("namespaces", "", &ns) {
                None => return Err(ApiError::not_found("namespaces", &ns)),
                Some(n) if meta::is_deleting(n) => {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        rt.key()
                    )));
                }
                Some(_) => {}
            }
        }
        let key = (ns, name.clone());
        if self.ts(rt)?.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&rt.key(), &name));
        }
        self.rv += 1;
        let rv = self.rv;
        let m = meta::meta_mut(&mut obj);
        // Clients cannot set these (strategy strips them); internal mirrors keep theirs.
        if !m.get("uid").is_some_and(Value::is_string) {
            m.insert("uid".into(), json!(meta::new_uid()));
        }
        if !m.get("creationTimestamp").is_some_and(Value::is_string) {
            m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
        }
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        let cap = self.window_cap;
        let ts = self.ts_mut(rt)?;
        ts.objects.insert(key, obj.clone());
        ts.push(
            Event {
                rv,
                kind: EventKind::Added,
                object: obj.clone(),
                prev: None,
            },
            cap,
        );
        Ok(obj)
    }

    /// Replaces an object if its stored version is still `expected_rv`. Bumps `generation`
    /// when anything other than metadata (and status, for types with a status subresource)
    /// changed, or when deletion starts. An object that is being deleted and has no
    /// finalizers left is removed.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        mut new: Value,
        expected_rv: &str,
    ) -> ApiResult<Value> {
        let (ns, name) = (
            meta::namespace(&new).to_owned(),
            meta::name(&new).to_owned(),
        );
        let key = (ns, name.clone());
        let old = self
            .ts(rt)?
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.key(), &name))?;
        if meta::resource_version(&old) != Some(expected_rv) {
            return Err(ApiError::stale(&rt.key(), &name));
        }
        let mut generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
        if spec_changed(rt, &old, &new) || (meta::is_deleting(&new) && !meta::is_deleting(&old)) {
            generation += 1;
        }
        let mut same = new.clone();
        meta::meta_mut(&mut same).insert("resourceVersion".into(), json!(expected_rv));
        if old == same {
            // A no-op write (with or without a version) keeps the version and emits no
            // event, as on a real server.
            return Ok(old);
        }
        self.rv += 1;
        let rv = self.rv;
        let m = meta::meta_mut(&mut new);
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("generation".into(), json!(generation));
        if let Some(f) = m.get("finalizers")
            && f.as_array().is_some_and(Vec::is_empty)
        {
            m.remove("finalizers");
        }
        let cap = self.window_cap;
        // A pod in its grace period waits for the kubelet's final delete; a namespace waits
        // for the namespace cleanup (its `spec.finalizers`).
        let grace_pending = new["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            > 0;
        let is_ns = rt.group.is_empty() && rt.plural == "namespaces";
        let finished = meta::is_deleting(&new)
            && meta::finalizers(&new).is_empty()
            && !grace_pending
            && !is_ns;
        let ts = self.ts_mut(rt)?;
        if finished {
            ts.objects.remove(&key);
            ts.push(
                Event {
                    rv,
                    kind: EventKind::Deleted,
                    object: new.clone(),
                    prev: None,
                },
                cap,
            );
        } else {
            ts.objects.insert(key, new.clone());
            ts.push(
                Event {
                    rv,
                    kind: EventKind::Modified,
                    object: new.clone(),
                    prev: Some(old),
                },
                cap,
            );
        }
        Ok(new)
    }

    /// Removes an object now (its finalizers are empty or being ignored by the caller).
    pub fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<Value> {
        let key = (ns.to_owned(), name.to_owned());
        let ts = self.ts(rt)?;
        let mut obj = ts
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.key(), name))?;
        self.rv += 1;
        let rv = self.rv;
        meta::meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let cap = self.window_cap;
        let ts = self.ts_mut(rt)?;
        ts.objects.remove(&key);
        ts.push(
            Event {
                rv,
                kind: EventKind::Deleted,
                object: obj.clone(),
                prev: None,
            },
            cap,
        );
        Ok(obj)
    }

    /// Events of a type after `rv`.
    pub fn since(&self, key: &str, rv: u64) -> Since {
        let Some(ts) = self.types.get(key) else {
            return Since::Gone;
        };
        if rv < ts.window_start {
            return Since::TooOld;
        }
        let start = ts.window.partition_point(|e| e.rv <= rv);
        Since::Events(ts.window.iter().skip(start).cloned().collect())
    }
}

impl TypeState {
    fn push(&mut self, e: Event, cap: usize) {
        self.window.push_back(Arc::new(e));
        while self.window.len() > cap {
            if let Some(old) = self.window.pop_front() {
                self.window_start = old.rv;
            }
        }
    }
}

/// Whether a write changes what `generation` tracks.
fn spec_changed(rt: &ResourceType, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("metadata");
            if rt.status {
                o.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}
