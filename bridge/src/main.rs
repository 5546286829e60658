//! `tandem-bridge`: the Tandem controller as a Kubernetes scheduler.

use std::path::PathBuf;

use anyhow::Context as _;
use backon::Retryable as _;
use clap::{Parser, Subcommand};
use tandem_bridge::batch::GrpcBatch;
use tandem_bridge::leader;
use tandem_bridge::scheduler::{self, Config};
use tandem_net::auth::ClusterKey;

#[derive(Parser)]
#[command(name = "tandem-bridge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Schedule pods that name `schedulerName: tandem` through the controller's queue.
    Run(RunArgs),
    /// Serve only the admission webhook (no controller needed).
    Webhook(WebhookServeArgs),
    /// Create the webhook's CA and serving certificate Secret if absent, and write the CA
    /// into the webhook configurations' caBundle (the chart's install hook). Idempotent.
    WebhookCerts(WebhookCertsArgs),
}

#[derive(Parser)]
struct RunArgs {
    /// The controller's address (`http://HOST:PORT`).
    #[arg(long)]
    controller: String,
    /// The cluster key, mounted from its Secret; signs the bridge's role credential.
    #[arg(long)]
    key_file: PathBuf,
    /// The cluster CA the controller's certificate chains to. Without it the bridge speaks
    /// plain text, and only to a loopback address.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// The `TandemCluster` whose namespace map (spec.bridge.namespaces) applies.
    #[arg(long)]
    cluster: String,
    /// Its namespace.
    #[arg(long, default_value = "default")]
    cluster_namespace: String,
    /// Seconds a pod whose node vanished keeps its slot before it counts as gone.
    #[arg(long, default_value_t = 30)]
    node_grace_seconds: u32,
    /// Seconds past its grace period that a bound pod which vanished from the API before its
    /// containers were reported stopped still holds its slot.
    #[arg(long, default_value_t = 10)]
    vanish_margin_seconds: u32,
    /// Seconds a pod whose eviction PodDisruptionBudgets keep refusing may hold up the end
    /// of its job (scancel, preemption, time limit, node loss); then it is deleted, with a
    /// Warning Event that says why. Refused evictions are retried with backoff until then.
    #[arg(
        long = "eviction-timeout",
        value_name = "SECONDS",
        default_value_t = 120
    )]
    eviction_timeout: u32,
    /// The image of the GPU holder pods (it must have `sleep`): while a pool node with
    /// GPUs is in batch mode, a pod in --cluster-namespace holds them all, so nothing that
    /// reaches the node around the bridge gets one. Empty: no holders.
    #[arg(long, value_name = "IMAGE", default_value = concat!("ghcr.io/tandem-dev/tandem:", env!("CARGO_PKG_VERSION")))]
    gpu_holder_image: String,
    #[command(flatten)]
    webhook: WebhookArgs,
    #[command(flatten)]
    leader: LeaderArgs,
}

/// The admission webhook, served by `run` on every replica (leader or not) when given.
#[derive(clap::Args)]
struct WebhookArgs {
    /// Serve the admission webhook over HTTPS on this address (e.g. `0.0.0.0:9443`).
    #[arg(long, requires_all = ["webhook_cert_file", "webhook_key_file"])]
    webhook_listen: Option<std::net::SocketAddr>,
    /// The serving certificate (PEM; `tls.crt` of the webhook Secret). Read again when it
    /// changes.
    #[arg(long)]
    webhook_cert_file: Option<PathBuf>,
    /// Its key (PEM; `tls.key`).
    #[arg(long)]
    webhook_key_file: Option<PathBuf>,
}

#[derive(Parser)]
struct WebhookServeArgs {
    /// The `TandemCluster` whose namespace map (spec.bridge.namespaces) applies.
    #[arg(long)]
    cluster: String,
    /// Its namespace.
    #[arg(long, default_value = "default")]
    cluster_namespace: String,
    /// Where to serve HTTPS.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_listen: std::net::SocketAddr,
    /// The serving certificate (PEM).
    #[arg(long)]
    webhook_cert_file: PathBuf,
    /// Its key (PEM).
    #[arg(long)]
    webhook_key_file: PathBuf,
}

#[derive(Parser)]
struct WebhookCertsArgs {
    /// The namespace of the Secret and the Service.
    #[arg(long)]
    namespace: String,
    /// The `kubernetes.io/tls` Secret to create (keys tls.crt, tls.key, ca.crt).
    #[arg(long)]
    secret: String,
    /// The webhook's Service: the certificate is for SERVICE.NAMESPACE.svc.
    #[arg(long)]
    service: String,
    /// A MutatingWebhookConfiguration whose webhooks get the CA as caBundle (repeatable).
    #[arg(long)]
    mutating_webhook: Vec<String>,
    /// A ValidatingWebhookConfiguration whose webhooks get the CA as caBundle (repeatable).
    #[arg(long)]
    validating_webhook: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(a) => run(a).await,
        Command::Webhook(a) => webhook(a).await,
        Command::WebhookCerts(a) => webhook_certs(a).await,
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    let key = ClusterKey::load(&a.key_file)
        .with_context(|| format!("reading the cluster key {}", a.key_file.display()))?;
    let client = tandem_kubeclient::client::infer()
        .await
        .context("connecting to the Kubernetes API")?;
    // Before the controller connection and any leader election: every replica answers
    // admission, and pods can be admitted while the controller is away.
    let _webhook = start_webhook(&a.webhook, &client, &a.cluster_namespace, &a.cluster).await?;
    let lease = a.leader.lease_config(&a.cluster_namespace)?;
    let cfg = Config {
        cluster_namespace: a.cluster_namespace,
        cluster_name: a.cluster,
        node_grace_s: i64::from(a.node_grace_seconds),
        vanish_margin_s: i64::from(a.vanish_margin_seconds),
        eviction_timeout_s: i64::from(a.eviction_timeout),
        gpu_holder_image: Some(a.gpu_holder_image).filter(|i| !i.is_empty()),
    };
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    // Only the replica that schedules reaches the controller: a standby needs none.
    let sched_client = client.clone();
    let schedule = async {
        // A controller away (restarting, not yet up) is waited for, not fatal: the
        // webhook above keeps serving meanwhile, and pods wait unbound.
        let batch = (|| GrpcBatch::connect(&a.controller, a.ca_file.as_deref(), &key))
            .retry(tandem_bridge::batch::reconnect_backoff())
            .when(tandem_bridge::batch::BatchError::is_transient)
            .notify(|e, wait| {
                tracing::warn!(error = %e, retry_in = ?wait, "controller unreachable; retrying")
            })
            .await?;
        let evict_client = tandem_kubeclient::client::infer_without_retries()
            .await
            .context("connecting to the Kubernetes API")?;
        scheduler::run(
            sched_client,
            evict_client,
            batch,
            cfg,
            std::future::pending(),
        )
        .await?;
        anyhow::Ok(())
    };
    let Some(lease) = lease else {
        return tokio::select! {
            () = shutdown => Ok(()),
            r = schedule => r,
        };
    };
    let elector = leader::Elector::new(client, lease);
    match leader::run_elected(elector, shutdown, schedule).await? {
        leader::Outcome::Shutdown => Ok(()),
        leader::Outcome::Finished(r) => r,
    }
}

async fn start_webhook(
    a: &WebhookArgs,
    client: &kube::Client,
    cluster_namespace: &str,
    cluster: &str,
) -> anyhow::Result<Option<tandem_bridge::webhook::Serving>> {
    let (Some(listen), Some(cert), Some(key)) =
        (a.webhook_listen, &a.webhook_cert_file, &a.webhook_key_file)
    else {
        return Ok(None);
    };
    let cfg = tandem_bridge::webhook::server::Config {
        listen,
        cert_file: cert.clone(),
        key_file: key.clone(),
    };
    let s = tandem_bridge::webhook::serve(client.clone(), cluster_namespace, cluster, cfg)
        .await
        .context("starting the admission webhook")?;
    Ok(Some(s))
}

async fn webhook(a: WebhookServeArgs) -> anyhow::Result<()> {
    let client = tandem_kubeclient::client::infer()
        .await
        .context("connecting to the Kubernetes API")?;
    let args = WebhookArgs {
        webhook_listen: Some(a.webhook_listen),
        webhook_cert_file: Some(a.webhook_cert_file),
        webhook_key_file: Some(a.webhook_key_file),
    };
    let _serving = start_webhook(&args, &client, &a.cluster_namespace, &a.cluster).await?;
    terminated().await;
    Ok(())
}

async fn webhook_certs(a: WebhookCertsArgs) -> anyhow::Result<()> {
    let client = tandem_kubeclient::client::infer()
        .await
        .context("connecting to the Kubernetes API")?;
    let target = tandem_bridge::webhook::provision::Target {
        namespace: a.namespace,
        secret: a.secret,
        service: a.service,
        mutating: a.mutating_webhook,
        validating: a.validating_webhook,
    };
    let out = tandem_bridge::webhook::provision::provision(client, &target).await?;
    tracing::info!(
        secret_created = out.secret_created,
        patched = ?out.patched,
        "webhook certificates in place"
    );
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn terminated() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Leader election: only the Lease's holder runs the scheduler loop; the admission webhook
/// serves on every replica.
#[derive(clap::Args)]
struct LeaderArgs {
    /// Schedule only while holding the Lease, so of several replicas exactly one schedules
    /// (`--leader-elect=false` for a single replica; kube-scheduler's flag and default).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    leader_elect: bool,
    /// The `coordination.k8s.io` Lease's name.
    #[arg(long, default_value = leader::DEFAULT_LEASE_NAME)]
    lease_name: String,
    /// The Lease's namespace [default: $POD_NAMESPACE, else the service account's
    /// namespace, else --cluster-namespace].
    #[arg(long)]
    lease_namespace: Option<String>,
    /// This replica's identity in the Lease [default: $POD_NAME, else the hostname, with a
    /// random suffix].
    #[arg(long)]
    identity: Option<String>,
    /// A leader's term without renewal: a standby takes over at most this plus one retry
    /// period (2 s) after the leader's last renewal.
    #[arg(long, default_value_t = 10)]
    lease_duration_seconds: u32,
}

impl LeaderArgs {
    /// The Lease to contend for; `None` without leader election.
    fn lease_config(&self, cluster_namespace: &str) -> anyhow::Result<Option<leader::LeaseConfig>> {
        if !self.leader_elect {
            return Ok(None);
        }
        let env = |k: &str| std::env::var(k).ok();
        let ns_file = std::fs::read_to_string(leader::NAMESPACE_FILE).ok();
        let hostname =
            env("HOSTNAME").or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok());
        Ok(Some(leader::LeaseConfig {
            name: self.lease_name.clone(),
            namespace: leader::lease_namespace(
                self.lease_namespace.as_deref(),
                env("POD_NAMESPACE").as_deref(),
                ns_file.as_deref(),
                cluster_namespace,
            ),
            identity: leader::identity(
                self.identity.as_deref(),
                env("POD_NAME").as_deref(),
                hostname.as_deref(),
                &leader::random_suffix(),
            ),
            timing: leader::Timing::for_lease_seconds(self.lease_duration_seconds)?,
        }))
    }
}
