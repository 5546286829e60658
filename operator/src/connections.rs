//! The controller connection cache: one [`BatchControl`] per cluster (namespace/name and
//! controller endpoint), made on first use from the cluster key and CA Secrets.
//!
//! Making the connection goes through [`Connect`], so the reconcilers can be run in tests
//! against a fake controller ([`crate::batch::fake`]) while the Secret reads stay real.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::{Client, ResourceExt};
use tandem_net::auth::ClusterKey;
use tandem_net::net::ClientSecurity;
use tokio::sync::Mutex;

use crate::batch::{BatchControl, GrpcBatch};
use crate::crd::TandemCluster;
use crate::secrets::{cluster_key, read_ca};

/// A controller connection, shared by the passes of one cluster.
pub type Batch = Arc<dyn BatchControl>;

/// Opens a connection to a cluster's controller.
pub trait Connect: Send + Sync {
    /// `ca_pem`: the cluster CA the controller's certificate chains to; `key`: the cluster
    /// key the operator's identity is signed with.
    fn connect<'a>(
        &'a self,
        endpoint: &'a str,
        ca_pem: &'a str,
        key: &'a ClusterKey,
    ) -> BoxFuture<'a, Result<Batch, String>>;
}

/// [`Connect`] over gRPC with TLS ([`GrpcBatch`]).
pub struct GrpcConnect;

impl Connect for GrpcConnect {
    fn connect<'a>(
        &'a self,
        endpoint: &'a str,
        ca_pem: &'a str,
        key: &'a ClusterKey,
    ) -> BoxFuture<'a, Result<Batch, String>> {
        Box::pin(async move {
            let security = tandem_net::tls::client_config_pem(ca_pem.as_bytes())
                .map(ClientSecurity::Tls)
                .map_err(|e| format!("{e:#}"))?;
            let b = GrpcBatch::connect(endpoint, &security, key)
                .await
                .map_err(|e| format!("{e:#}"))?;
            Ok(Arc::new(b) as Batch)
        })
    }
}

/// One controller connection per cluster (namespace/name, endpoint).
pub struct Connections {
    connect: Box<dyn Connect>,
    cache: Mutex<HashMap<(String, String), Batch>>,
}

impl Connections {
    pub fn new(connect: impl Connect + 'static) -> Self {
        Connections {
            connect: Box::new(connect),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The connection to `tc`'s controller (in namespace `ns`): from the cache, else made
    /// from the endpoint in its status and its key and CA Secrets.
    pub async fn for_cluster(
        &self,
        client: &Client,
        ns: &str,
        tc: &TandemCluster,
    ) -> Result<Batch, String> {
        let name = tc.name_any();
        let endpoint = tc
            .status
            .as_ref()
            .and_then(|s| s.controller_endpoint.clone())
            .ok_or("the cluster has no controller endpoint yet")?;
        let key = (format!("{ns}/{name}"), endpoint.clone());
        if let Some(b) = self.cache.lock().await.get(&key) {
            return Ok(b.clone());
        }
        let k = cluster_key(client, ns, &name)
            .await
            .map_err(|e| format!("{e:#}"))?
            .ok_or("the cluster key Secret does not exist yet")?;
        // The controller's certificate chains to the cluster CA, which the operator keeps.
        let ca = read_ca(client, ns, &name)
            .await
            .map_err(|e| format!("{e:#}"))?
            .ok_or("the cluster CA Secret does not exist yet")?;
        let b = self.connect.connect(&endpoint, ca.cert_pem(), &k).await?;
        self.cache.lock().await.insert(key, b.clone());
        Ok(b)
    }
}

/// Runs `f` on the connection, or fails as "controller unreachable" without one.
pub async fn with_batch<'a, F, Fut>(batch: &'a Result<Batch, String>, f: F) -> Result<(), String>
where
    F: FnOnce(&'a Batch) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    match batch {
        Ok(b) => f(b).await,
        Err(e) => Err(format!("controller unreachable: {e}")),
    }
}
