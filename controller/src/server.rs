//! `run`: open the store, recover, start the committer and the state actor, serve gRPC until
//! the shutdown future resolves (or the store fails), then stop in order.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tandem_net::auth::{ClusterKey, ServerAuth};
use tandem_net::net::{self, Listener};
use tandem_proto::listing::jobs_server::JobsServer;
use tandem_proto::v1::accounting_server::AccountingServer;
use tandem_proto::v1::bridge_server::BridgeServer;
use tandem_proto::v1::nodes_server::NodesServer;
use tandem_proto::v1::worker_link_server::WorkerLinkServer;
use tonic::service::interceptor::InterceptedService;
use tracing::{info, warn};

use crate::Error;
use crate::api::accounting::AccountingService;
use crate::api::bridge::BridgeService;
use crate::api::jobs::{self, JobsService};
use crate::api::nodes::NodesService;
use crate::api::workers::WorkerLinkService;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::state::{self, ActorParts, Command};
use crate::store::recover::recover;
use crate::store::{Committer, Store};

/// Requests one connection may have in flight (below HTTP/2's usual 200 concurrent
/// streams, so clients see the limit rather than queueing in their own stack).
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 128;

/// Runs the controller on `listener` until `shutdown` resolves.
///
/// Every acknowledged change is durable before its reply is sent, so stopping (or a
/// SIGKILL) at any moment loses nothing acknowledged. Returns an error if the store cannot
/// be opened or recovered, or fails while running.
pub async fn run(
    config: Config,
    listener: impl Into<Listener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let listener = listener.into();
    let started = Instant::now();
    let addr = listener.local_addr().ok();
    let config = Arc::new(config);
    let cfg = config.clone();
    // Opening and recovering read the whole store: keep it off the async workers.
    let (key, store, recovered) = tokio::task::spawn_blocking(move || -> Result<_, Error> {
        let key = ClusterKey::load_or_create(&cfg.key_file)?;
        let store = Store::open_with(&cfg.state_dir, cfg.durability)?;
        let loaded = store.load()?;
        let recovered = recover(loaded, cfg.cluster.clone()).map_err(|source| Error::Recover {
            path: store.path().to_owned(),
            source,
        })?;
        Ok((key, store, recovered))
    })
    .await
    .map_err(|e| Error::Stopped(format!("start-up task failed: {e}")))??;
    let key = Arc::new(key);
    let reader = Arc::new(Mutex::new(store.open_reader()?));
    let metrics = Arc::new(Metrics::new());
    let (committer, commit_join) =
        Committer::spawn(store, metrics.store_commits()).map_err(|source| Error::Thread {
            what: "committer",
            source,
        })?;
    let metrics_task = match config.metrics_listen {
        Some(addr) => {
            let l = net::bind(addr)
                .await
                .map_err(|source| Error::Bind { addr, source })?;
            info!(addr = ?l.local_addr().ok(), "serving metrics");
            Some(tokio::spawn(crate::metrics::serve(l, metrics.clone())))
        }
        None => None,
    };
    // The scaler answers from the first moment, before the actor's first pass.
    metrics.publish(&recovered.state, tandem_net::auth::unix_now());
    let scaler_task = match config.scaler_listen {
        Some(addr) => Some(serve_scaler(addr, metrics.snapshots(), config.tls.clone()).await?),
        None => None,
    };
    let jobs_n = recovered.state.jobs().count();
    let max_array_size = recovered.state.config().sched.max_array_size;
    let (handle, actor_join) = state::spawn(
        recovered.state,
        ActorParts {
            config: config.clone(),
            key: key.clone(),
            committer,
            metrics: metrics.clone(),
            idempotency: recovered.idempotency,
            steps: recovered.steps,
        },
    )
    .map_err(|source| Error::Thread {
        what: "state actor",
        source,
    })?;
    // The actor stops on its own only when the store failed; then the server must stop too.
    let (dead_tx, dead_rx) = tokio::sync::oneshot::channel::<()>();
    let actor_done = tokio::task::spawn_blocking(move || {
        let r = actor_join.join();
        let _ = dead_tx.send(());
        r
    });
    info!(
        addr = ?addr,
        state_dir = %config.state_dir.display(),
        jobs = jobs_n,
        startup_ms = started.elapsed().as_millis() as u64,
        "controller ready"
    );

    // Bound last, when the controller can answer: a client that finds the socket is served.
    let local = match &config.local_socket {
        Some(path) => {
            let l = net::bind_local(path).map_err(Error::BindLocal)?;
            info!(path = %path.display(), "serving the local socket");
            Some(l)
        }
        None => None,
    };
    crate::api::reads::limit_cpu(config.listing_cpu_share);
    let auth = ServerAuth::with_admins(key, config.admins.clone());
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let stop_handle = handle.clone();
    let serve = tonic::transport::Server::builder()
        // Finds dead peers (a worker host that vanished) even when no message is due.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // A client with more requests in flight on one connection gets RESOURCE_EXHAUSTED.
        .concurrency_limit_per_connection(MAX_IN_FLIGHT_PER_CONNECTION)
        .load_shed(true)
        .add_service(InterceptedService::new(
            JobsServer::new(JobsService::new(
                handle.clone(),
                reader.clone(),
                max_array_size,
            ))
            .max_decoding_message_size(jobs::MAX_REQUEST_BYTES),
            auth.clone(),
        ))
        .add_service(NodesServer::with_interceptor(
            NodesService::new(handle.clone()),
            auth.clone(),
        ))
        .add_service(BridgeServer::with_interceptor(
            BridgeService::new(handle.clone()),
            auth.clone(),
        ))
        .add_service(AccountingServer::with_interceptor(
            AccountingService::new(handle.clone(), reader),
            auth.clone(),
        ))
        .add_service(WorkerLinkServer::with_interceptor(
            WorkerLinkService::new(handle.clone(), stopping_rx),
            auth,
        ))
        .serve_with_incoming_shutdown(
            listener.incoming_with_local(config.tls.clone(), local),
            async move {
                tokio::select! {
                    () = shutdown => info!("shutdown requested"),
                    _ = dead_rx => warn!("state actor stopped; shutting down"),
                }
                // Ends worker and watch streams so the server can drain.
                let _ = stopping_tx.send(true);
                let _ = stop_handle.send_wait(Command::Shutdown).await;
            },
        );
    let served = serve.await;
    if let Some(path) = &config.local_socket {
        // Clients that find no socket use the address, and say so if nothing answers.
        let _ = std::fs::remove_file(path);
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    if let Some(t) = scaler_task {
        t.abort();
    }
    let _ = handle.send_wait(Command::Shutdown).await;
    drop(handle);
    let actor = actor_done
        .await
        .map_err(|e| Error::Stopped(format!("state actor: {e}")))?;
    if actor.is_err() {
        return Err(Error::Stopped("state actor panicked".into()));
    }
    // The actor owned the last committer handle: the committer drains and exits.
    let committed = tokio::task::spawn_blocking(move || commit_join.join())
        .await
        .map_err(|e| Error::Stopped(format!("committer: {e}")))?
        .map_err(|_| Error::Stopped("committer panicked".into()))?;
    committed?;
    served.map_err(Error::Serve)?;
    info!("controller stopped");
    Ok(())
}

/// Binds `--scaler-listen` and serves KEDA's external scaler there (its own listener: no
/// Tandem credential, read-only demand; TLS as the main listener, KEDA verifying it with the
/// trigger's `caCert`), until the returned task is aborted.
async fn serve_scaler(
    addr: std::net::SocketAddr,
    snapshots: tokio::sync::watch::Receiver<Arc<tandem_sched::demand::Snapshot>>,
    security: net::ServerSecurity,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    use tandem_proto::externalscaler::external_scaler_server::ExternalScalerServer;
    let l = net::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    info!(addr = ?l.local_addr().ok(), "serving the KEDA external scaler");
    let svc = ExternalScalerServer::new(crate::api::scaler::ScalerService::new(snapshots));
    Ok(tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(l.incoming(security))
            .await;
        if let Err(e) = served {
            warn!(error = %e, "KEDA scaler server stopped");
        }
    }))
}
