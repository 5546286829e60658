//! The admission webhook: pods of the namespaces the `TandemCluster` maps (or labelled
//! `tandem.dev/managed: "true"`) are given `schedulerName: tandem` and the pool toleration,
//! and refused with a message naming the field when their annotations are invalid, their
//! account is not their namespace's to charge, they preset `spec.nodeName`, or they use
//! resource claims. `/guard`, for pods and `pods/binding` of every namespace, keeps pods
//! Tandem does not schedule off the pool's nodes ([`admit`]'s "pool-node guard").
//!
//! ```text
//!   admit      (pod, old pod, namespace map) -> Allow | Patch | Deny     pure
//!   review     AdmissionReview bytes <-> admit                           pure
//!   certs      CA + serving certificate for SVC.NS.svc                   pure
//!   state      namespace map and pool nodes, watched                     I/O
//!   server     HTTPS /mutate /validate /guard /healthz /readyz           I/O
//!   provision  `webhook-certs`: Secret + caBundle                        I/O
//! ```
//!
//! Every replica serves, leader or not: the server and its watch start before (and
//! independently of) leader election and the controller connection.

pub mod admit;
pub mod certs;
pub mod provision;
pub mod review;
pub mod server;
pub mod state;

use std::sync::Arc;

/// The webhook as a replica runs it: the `TandemCluster` watch and the HTTPS server.
/// Dropping it stops both.
#[derive(Debug)]
pub struct Serving {
    pub server: server::Running,
    /// The `TandemCluster` watch and the Node watch.
    watches: [tokio::task::JoinHandle<()>; 2],
}

impl Drop for Serving {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

/// Starts the watch of the `TandemCluster` `namespace/name`, the watch of the Nodes (the
/// pool-node guard) and the server. Who the guard trusts comes from the environment
/// ([`state::Trust::from_env`]). Returns once the port is bound, so a bad certificate or a
/// taken port is reported at start.
pub async fn serve(
    client: kube::Client,
    namespace: &str,
    name: &str,
    cfg: server::Config,
) -> Result<Serving, server::Error> {
    let policies = state::Policies::new(namespace, name);
    let server = server::start(cfg, Arc::clone(&policies)).await?;
    let nodes = tokio::spawn(state::watch_nodes(client.clone(), Arc::clone(&policies)));
    let watch = tokio::spawn(state::watch(client, policies));
    Ok(Serving {
        server,
        watches: [watch, nodes],
    })
}
