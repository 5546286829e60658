//! Service proxy: the harness's kube-proxy. It watches Services, Pods and Endpoints and
//! forwards TCP from each Service's `clusterIP:port` to the ready endpoints'
//! `podIP:targetPort`, so a client that dials a Service's cluster IP (read from the API or
//! from the service-link variables) reaches a backing pod as on a real cluster.
//!
//! Cluster IPs and pod IPs are loopback addresses (`crate::net`), so this is a user-space
//! proxy: one listener per `clusterIP:port` with at least one ready endpoint (none listens
//! where there is none, so clients are refused, as by kube-proxy's REJECT rule), and per
//! accepted connection a backend chosen at random (kube-proxy's iptables mode picks at
//! random too), the bytes copied both ways.
//!
//! # Layout
//! - [`endpoints`]: which pods back which Service port (pure), shared with the endpoints
//!   controller and the API server's webhook dialling.
//! - this file: the watches, the listeners and the copying.

pub mod endpoints;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddrV4;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Backends by `clusterIP:port`, read by the accept loops on every connection.
type Table = Arc<RwLock<BTreeMap<SocketAddrV4, Vec<SocketAddrV4>>>>;

/// A running service proxy. Dropping it closes every listener and forwarded connection.
pub struct ServiceProxy {
    task: JoinHandle<()>,
    table: Table,
}

impl std::fmt::Debug for ServiceProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceProxy").finish_non_exhaustive()
    }
}

impl ServiceProxy {
    /// Starts watching and forwarding (in the background).
    pub fn start(client: kube::Client) -> Self {
        let table = Table::default();
        let task = tokio::spawn(run(client, table.clone()));
        Self { task, table }
    }

    /// The addresses being forwarded now and their ready backends.
    pub fn table(&self) -> BTreeMap<SocketAddrV4, Vec<SocketAddrV4>> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Keeps a reflector of every object of a kind, waking `wake` on each change.
fn reflect<K>(api: Api<K>, wake: tokio::sync::mpsc::Sender<()>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::debug!(error = %e, "service proxy watch failed; retrying");
            }
            // A full channel already holds a wake-up: the next sync sees this change too.
            let _ = wake.try_send(());
        }
    });
    (reader, task)
}

async fn run(client: kube::Client, table: Table) {
    let (wake, mut woken) = tokio::sync::mpsc::channel(1);
    let (services, t1) = reflect(Api::<Service>::all(client.clone()), wake.clone());
    let (pods, t2) = reflect(Api::<Pod>::all(client.clone()), wake.clone());
    let (manual, t3) = reflect(Api::<Endpoints>::all(client), wake);
    let _watches = AbortOnDrop(vec![t1, t2, t3]);
    let mut listeners: HashMap<SocketAddrV4, JoinHandle<()>> = HashMap::new();
    let mut retry = tokio::time::interval(Duration::from_millis(500));
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed = false;
    loop {
        tokio::select! {
            w = woken.recv() => if w.is_none() { return },
            _ = retry.tick(), if failed => {}
        }
        let svcs = services.state();
        let pods = pods.state();
        let eps = manual.state();
        let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let manual_by_name: BTreeMap<(String, String), &Endpoints> = eps
            .iter()
            .map(|e| {
                let key = (
                    e.metadata.namespace.clone().unwrap_or_default(),
                    e.metadata.name.clone().unwrap_or_default(),
                );
                (key, e.as_ref())
            })
            .collect();
        let desired = endpoints::forwarding_table(
            svcs.iter().map(|s| s.as_ref()),
            &pod_refs,
            &manual_by_name,
        );
        listeners.retain(|addr, task| {
            let keep = desired.contains_key(addr) && !task.is_finished();
            if !keep {
                tracing::debug!(%addr, "service proxy stops listening");
                task.abort();
            }
            keep
        });
        *table.write().unwrap_or_else(|e| e.into_inner()) = desired.clone();
        failed = false;
        for addr in desired.keys() {
            if listeners.contains_key(addr) {
                continue;
            }
            match TcpListener::bind(*addr).await {
                Ok(listener) => {
                    tracing::debug!(%addr, "service proxy listening");
                    listeners.insert(*addr, tokio::spawn(accept(listener, *addr, table.clone())));
                }
                Err(e) => {
                    // Taken by someone else (another test's service drew the same address,
                    // or a process bound it): retried until it frees up.
                    tracing::warn!(%addr, error = %e, "service proxy cannot bind a cluster IP");
                    failed = true;
                }
            }
        }
    }
}

struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Accepts connections to one `clusterIP:port`; each is forwarded to a backend. The
/// connections end with the listener (when the proxy is dropped or the port loses its last
/// endpoint).
async fn accept(listener: TcpListener, addr: SocketAddrV4, table: Table) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let (client, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%addr, error = %e, "service proxy accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let backends = table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .cloned()
            .unwrap_or_default();
        conns.spawn(forward(client, addr, backends));
    }
}

/// Connects to a random backend (trying the others if it refuses) and copies both ways.
async fn forward(mut client: TcpStream, addr: SocketAddrV4, mut backends: Vec<SocketAddrV4>) {
    let _ = client.set_nodelay(true);
    while !backends.is_empty() {
        let pick = backends.swap_remove(rand::random_range(0..backends.len()));
        match TcpStream::connect(pick).await {
            Ok(mut upstream) => {
                let _ = upstream.set_nodelay(true);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    tracing::trace!(%addr, backend = %pick, error = %e, "forwarded connection ended");
                }
                return;
            }
            Err(e) => {
                tracing::debug!(%addr, backend = %pick, error = %e, "service backend refused");
            }
        }
    }
    // No backend answered: the client's connection is closed (a real cluster would have
    // refused it, or timed out).
}
