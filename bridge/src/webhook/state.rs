//! The namespace map as the webhook knows it, kept current by a watch of the
//! `TandemCluster` (parsed by [`crate::cluster::policies`], as the scheduler does).
//!
//! Every replica runs this watch, leader or not: admission must be answered by whichever
//! replica the Service picks.

use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tracing::{info, warn};

use super::admit::View;
use crate::cluster;
use crate::policy::NamespacePolicy;

#[derive(Debug)]
enum Known {
    /// Not read yet, and why (a map that did not parse is named here).
    NotRead(String),
    Read(Vec<NamespacePolicy>),
}

/// The webhook's view of one `TandemCluster`, shared by every request.
#[derive(Debug)]
pub struct Policies {
    namespace: String,
    name: String,
    known: RwLock<Known>,
}

impl Policies {
    pub fn new(namespace: &str, name: &str) -> Arc<Self> {
        Arc::new(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            known: RwLock::new(Known::NotRead(format!(
                "TandemCluster {namespace}/{name} not read yet"
            ))),
        })
    }

    /// Whether the map has been read (the server's readiness).
    pub fn ready(&self) -> bool {
        matches!(*self.read(), Known::Read(_))
    }

    /// Runs `f` with the current view.
    pub fn with_view<T>(&self, f: impl FnOnce(View<'_>) -> T) -> T {
        let known = self.read();
        let policies = match &*known {
            Known::Read(p) => Ok(p.as_slice()),
            Known::NotRead(why) => Err(why.as_str()),
        };
        f(View {
            cluster: &self.name,
            policies,
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        // A panic while holding the lock cannot leave `Known` half written: every write
        // replaces it whole. So a poisoned lock is still a consistent value.
        self.known.read().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, k: Known) {
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = k;
    }

    /// A `TandemCluster` object was seen. A map that does not parse keeps the last good one
    /// (fail closed: never fall back to "nothing mapped").
    pub fn observe(&self, tc: &serde_json::Value) {
        match cluster::policies(tc) {
            Ok(p) => {
                info!(namespaces = p.len(), "webhook: namespace map read");
                self.set(Known::Read(p));
            }
            Err(e) => {
                warn!(error = %e, "webhook: TandemCluster namespace map refused; keeping the last one");
                if !self.ready() {
                    self.set(Known::NotRead(format!(
                        "TandemCluster {}/{}: {e}",
                        self.namespace, self.name
                    )));
                }
            }
        }
    }

    /// A (re)list found no `TandemCluster`: nothing is mapped yet.
    pub fn observe_absent(&self) {
        if !self.ready() {
            info!("webhook: no TandemCluster yet; no namespace is mapped");
            self.set(Known::Read(Vec::new()));
        }
    }
}

/// Watches the `TandemCluster` into `policies` until the task is dropped.
pub async fn watch(client: Client, policies: Arc<Policies>) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &policies.namespace, &cluster::api_resource());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", policies.name));
    let mut events = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen = false;
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => seen = false,
            Ok(Event::InitApply(tc) | Event::Apply(tc)) => {
                seen = true;
                policies.observe(&tc.data);
            }
            Ok(Event::InitDone) if !seen => policies.observe_absent(),
            // A deleted cluster keeps its last map, as the scheduler does.
            Ok(Event::InitDone | Event::Delete(_)) => {}
            Err(e) => warn!(error = %e, "webhook: TandemCluster watch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bad_map_never_replaces_a_good_one() {
        let p = Policies::new("ns", "pool");
        assert!(!p.ready());
        p.with_view(|v| assert_eq!(v.policies, Err("TandemCluster ns/pool not read yet")));
        let bad = json!({"spec": {"bridge": {"namespaces": [{"namespace": "a"}]}}});
        p.observe(&bad);
        assert!(!p.ready());
        p.with_view(|v| {
            let why = v.policies.unwrap_err();
            assert!(
                why.starts_with("TandemCluster ns/pool: spec.bridge.namespaces"),
                "{why}"
            );
        });
        p.observe(&json!({"spec": {"bridge": {"namespaces": [
            {"namespace": "a", "account": "x"}]}}}));
        p.observe(&bad);
        p.observe_absent();
        p.with_view(|v| {
            assert_eq!(v.cluster, "pool");
            assert_eq!(v.policies.unwrap()[0].account, "x");
        });
    }

    #[test]
    fn no_cluster_means_nothing_mapped() {
        let p = Policies::new("ns", "pool");
        p.observe_absent();
        assert!(p.ready());
        p.with_view(|v| assert_eq!(v.policies, Ok(&[][..])));
    }
}
