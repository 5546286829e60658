//! The namespace map as the webhook knows it, kept current by a watch of the
//! `TandemCluster` (parsed by [`crate::cluster::policies`], as the scheduler does), and the
//! pool nodes' names for the pool-node guard, kept current by a watch of the Nodes
//! ([`crate::nodes::is_pool_node`]).
//!
//! Every replica runs this watch, leader or not: admission must be answered by whichever
//! replica the Service picks.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tracing::{info, warn};

use super::admit::{Guard, View};
use crate::cluster;
use crate::nodes;
use crate::policy::NamespacePolicy;

/// Who the pool-node guard trusts: usernames as the API server authenticates them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    /// Whose worker, controller and login pods may reach pool nodes.
    pub operators: Vec<String>,
    /// Who may bind pods onto pool nodes.
    pub binders: Vec<String>,
    /// Whose GPU holder pods may reach pool nodes (the bridge itself).
    pub holders: Vec<String>,
}

impl Trust {
    /// Comma-separated usernames whose operator pods may reach pool nodes (the chart sets
    /// the operator's service account, `system:serviceaccount:NS:NAME`).
    pub const OPERATORS_ENV: &'static str = "TANDEM_BRIDGE_GUARD_OPERATORS";
    /// Comma-separated usernames that may bind pods onto pool nodes (the chart sets the
    /// bridge's service account and `system:kube-scheduler`).
    pub const BINDERS_ENV: &'static str = "TANDEM_BRIDGE_GUARD_BINDERS";
    /// Comma-separated usernames whose GPU holder pods may reach pool nodes (the chart sets
    /// the bridge's service account).
    pub const HOLDERS_ENV: &'static str = "TANDEM_BRIDGE_GUARD_HOLDERS";

    /// From the environment. Unset: no operator, and kube-scheduler alone binds (its binds
    /// are of pods that passed the toleration rule at creation).
    pub fn from_env() -> Self {
        let list = |name: &str, default: &[&str]| match std::env::var(name) {
            Ok(v) => parse_list(&v),
            Err(_) => default.iter().map(|s| (*s).to_owned()).collect(),
        };
        Self {
            operators: list(Self::OPERATORS_ENV, &[]),
            binders: list(Self::BINDERS_ENV, &["system:kube-scheduler"]),
            holders: list(Self::HOLDERS_ENV, &[]),
        }
    }
}

fn parse_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

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
    /// The pool nodes' names; `None` until the Node list has been read.
    pool: RwLock<Option<BTreeSet<String>>>,
    trust: Trust,
}

/// Why the guard cannot judge node names yet.
const NODES_NOT_READ: &str = "the Node list is not read yet";

impl Policies {
    pub fn new(namespace: &str, name: &str) -> Arc<Self> {
        Self::trusting(namespace, name, Trust::from_env())
    }

    /// As [`Policies::new`], trusting `trust` rather than the environment.
    pub fn trusting(namespace: &str, name: &str, trust: Trust) -> Arc<Self> {
        Arc::new(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            known: RwLock::new(Known::NotRead(format!(
                "TandemCluster {namespace}/{name} not read yet"
            ))),
            pool: RwLock::new(None),
            trust,
        })
    }

    /// Whether the map and the Node list have been read (the server's readiness).
    pub fn ready(&self) -> bool {
        self.map_read() && self.pool_read().is_some()
    }

    fn map_read(&self) -> bool {
        matches!(*self.read(), Known::Read(_))
    }

    /// Runs `f` with the current view.
    pub fn with_view<T>(&self, f: impl FnOnce(View<'_>) -> T) -> T {
        let known = self.read();
        let pool = self.pool_read();
        let policies = match &*known {
            Known::Read(p) => Ok(p.as_slice()),
            Known::NotRead(why) => Err(why.as_str()),
        };
        f(View {
            cluster: &self.name,
            policies,
            guard: Guard {
                pool_nodes: pool.as_ref().ok_or(NODES_NOT_READ),
                operators: &self.trust.operators,
                binders: &self.trust.binders,
                holders: &self.trust.holders,
            },
        })
    }

    fn pool_read(&self) -> std::sync::RwLockReadGuard<'_, Option<BTreeSet<String>>> {
        // As `read`: every write leaves a consistent set.
        self.pool.read().unwrap_or_else(|e| e.into_inner())
    }

    fn pool_write(&self) -> std::sync::RwLockWriteGuard<'_, Option<BTreeSet<String>>> {
        self.pool.write().unwrap_or_else(|e| e.into_inner())
    }

    /// A (re)list of the Nodes completed: these are the pool nodes now.
    pub fn observe_pool(&self, names: BTreeSet<String>) {
        info!(pool_nodes = names.len(), "webhook: Node list read");
        *self.pool_write() = Some(names);
    }

    /// A Node was added or changed. Before the first list completes it is left to the list.
    pub fn observe_node(&self, node: &Node) {
        if let Some(pool) = self.pool_write().as_mut() {
            if nodes::is_pool_node(node) {
                pool.insert(node.name_any());
            } else {
                pool.remove(&node.name_any());
            }
        }
    }

    /// A Node was deleted.
    pub fn forget_node(&self, name: &str) {
        if let Some(pool) = self.pool_write().as_mut() {
            pool.remove(name);
        }
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
                if !self.map_read() {
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
        if !self.map_read() {
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

/// Watches the Nodes into `policies`' pool set until the task is dropped.
pub async fn watch_nodes(client: Client, policies: Arc<Policies>) {
    let api: Api<Node> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // The pool as a (re)list finds it; swapped in whole at its end, so a relist never
    // shows a half-read pool (which would let a pod onto a node not yet listed).
    let mut listing = BTreeSet::new();
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(n)) => {
                if nodes::is_pool_node(&n) {
                    listing.insert(n.name_any());
                }
            }
            Ok(Event::InitDone) => policies.observe_pool(std::mem::take(&mut listing)),
            Ok(Event::Apply(n)) => policies.observe_node(&n),
            Ok(Event::Delete(n)) => policies.forget_node(&n.name_any()),
            Err(e) => warn!(error = %e, "webhook: Node watch"),
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
        assert!(!p.map_read());
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
        assert!(!p.ready(), "the Node list is not read yet");
        p.observe_pool(BTreeSet::new());
        assert!(p.ready());
        p.with_view(|v| assert_eq!(v.policies, Ok(&[][..])));
    }

    fn node(name: &str, mode: Option<&str>) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name,
            "labels": mode.map(|m| json!({"tandem.dev/mode": m})).unwrap_or(json!({}))}}))
        .unwrap()
    }

    #[test]
    fn the_pool_follows_the_nodes_once_listed() {
        let trust = Trust {
            operators: vec!["op".into()],
            binders: vec!["b".into()],
            holders: vec!["h".into()],
        };
        let p = Policies::trusting("ns", "pool", trust);
        // Before the list: changes are left to it, and the guard cannot judge nodes.
        p.observe_node(&node("b1", Some("batch")));
        p.with_view(|v| {
            assert_eq!(v.guard.pool_nodes, Err(NODES_NOT_READ));
            assert_eq!(v.guard.operators, ["op"]);
            assert_eq!(v.guard.binders, ["b"]);
            assert_eq!(v.guard.holders, ["h"]);
        });
        p.observe_pool(["b1".to_owned()].into());
        p.observe_node(&node("k1", Some("kube")));
        p.observe_node(&node("cpu", None));
        let names = |p: &Policies| p.with_view(|v| v.guard.pool_nodes.cloned().unwrap());
        assert_eq!(
            names(&p),
            BTreeSet::from(["b1".to_owned(), "k1".to_owned()])
        );
        // A node that lost its marks, and one deleted, leave the pool.
        p.observe_node(&node("k1", None));
        p.forget_node("b1");
        assert!(names(&p).is_empty());
    }

    #[test]
    fn trust_lists_are_comma_separated() {
        assert_eq!(parse_list(" a, ,b ,"), ["a", "b"]);
        assert!(parse_list("").is_empty());
    }
}
