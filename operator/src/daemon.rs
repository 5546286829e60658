//! Daemon wiring: `tandem-operator run`'s options, the watches (the reconcilers' triggers
//! and the shared pod and node stores), and the three controllers run until shutdown.
//!
//! Kept apart from [`crate::reconcile`] so that the reconcilers can be driven one pass at a
//! time in tests, with a context built there, without starting any watch.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{info, warn};

use crate::crd::{LoginSet, TandemCluster, WorkerSet};
use crate::labels::*;
use crate::reconcile::{
    Context, error_policy, reconcile_cluster, reconcile_loginset, reconcile_workerset,
};

/// `tandem-operator run` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Watch only this namespace (default: all).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Look at each settled cluster and worker set again this often (seconds), so their
    /// node counts follow the controller: node states change without a watch event.
    #[arg(
        long,
        env = "TANDEM_OPERATOR_STATUS_REFRESH_SECONDS",
        default_value_t = crate::status::DEFAULT_REFRESH_S,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub status_refresh_seconds: u64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            namespace: None,
            status_refresh_seconds: crate::status::DEFAULT_REFRESH_S,
        }
    }
}

/// Runs with the client from the kubeconfig or the in-cluster config.
pub async fn run(
    args: Args,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let client = crate::kubeclient::infer().await?;
    run_with_client(client, args, shutdown).await
}

/// Runs the reconcilers until `shutdown` resolves (tests pass their own client).
pub async fn run_with_client(
    client: Client,
    args: Args,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let ns = args.namespace.as_deref();
    let api_of =
        |client: &Client| -> (Api<TandemCluster>, Api<WorkerSet>, Api<LoginSet>, Api<Pod>) {
            match ns {
                Some(n) => (
                    Api::namespaced(client.clone(), n),
                    Api::namespaced(client.clone(), n),
                    Api::namespaced(client.clone(), n),
                    Api::namespaced(client.clone(), n),
                ),
                None => (
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                    Api::all(client.clone()),
                ),
            }
        };
    let (clusters, sets, logins, pods) = api_of(&client);
    let nodes: Api<Node> = Api::all(client.clone());
    let managed = watcher::Config::default().labels(&format!("{APP_MANAGED_BY}={MANAGER}"));
    let (pod_store, pod_writer) = reflector::store();
    let (node_store, node_writer) = reflector::store();
    // Both back off on errors (exponential, reset after a healthy stretch) rather than
    // relisting in a tight loop against an API server that refuses.
    let pod_reflector = reflector::reflector(
        pod_writer,
        watcher(pods.clone(), managed.clone()).default_backoff(),
    )
    .applied_objects()
    .for_each(|_| async {});
    let node_reflector = reflector::reflector(
        node_writer,
        watcher(nodes, watcher::Config::default()).default_backoff(),
    )
    .applied_objects()
    .for_each(|_| async {});
    let reporter = Reporter {
        controller: REPORTER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        Recorder::new(client.clone(), reporter),
        pod_store,
        node_store,
        Duration::from_secs(args.status_refresh_seconds.max(1)),
    ));
    let configmaps: Api<ConfigMap> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    let cluster_ctl = Controller::new(clusters.clone(), watcher::Config::default())
        .owns(pods.clone(), managed.clone()) // watch: pods
        .owns(configmaps, managed.clone()) // watch: configmaps
        .shutdown_on_signal()
        .run(reconcile_cluster, error_policy, ctx.clone())
        .for_each(log_result);
    let set_ctl = Controller::new(sets.clone(), watcher::Config::default()) // watch: sets
        .owns(pods.clone(), managed.clone())
        .shutdown_on_signal()
        .run(reconcile_workerset, error_policy, ctx.clone())
        .for_each(log_result);
    let login_ctl = Controller::new(logins, watcher::Config::default()) // watch: logins
        .owns(pods, managed)
        .shutdown_on_signal()
        .run(reconcile_loginset, error_policy, ctx.clone())
        .for_each(log_result);
    // watch: clusters (the cluster controller above), watch: nodes (the node reflector)
    info!("tandem-operator running");
    tokio::select! {
        _ = futures::future::join5(cluster_ctl, set_ctl, login_ctl, pod_reflector, node_reflector) => {}
        _ = shutdown => info!("shutting down"),
    }
    Ok(())
}

async fn log_result<T: std::fmt::Debug, E: std::fmt::Display>(r: Result<T, E>) {
    if let Err(e) = r {
        warn!(error = %e, "reconcile failed");
    }
}
