//! The reconcilers: thin async shells around the pure parts. Each gathers what it needs
//! (reflector stores, the controller through [`BatchControl`]), asks a pure function what to
//! do, applies it in named steps, records Events, and patches status only when it changed.
//!
//! API calls go through `Api`s named after their resources (`pods`, `services`, ...): the
//! RBAC test in [`crate::rbac`] reads this file by that convention.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, ObjectReference, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event as KEvent, EventType as KEventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, finalizer, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tandem_proto::auth::ClusterKey;
use tandem_proto::net::ClientSecurity;
use tandem_proto::tls::ca::ClusterCa;
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::batch::{BatchControl, GrpcBatch};
use crate::crd::{LoginSet, LoginSetStatus, TandemCluster, WorkerSet, WorkerSetStatus};
use crate::labels::*;
use crate::plan::{self, Action, DrainFor, Lookup, PodPhase, WorkerPod};
use crate::{accounting, defaults, partitions, render, validate};

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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call {step} failed")]
    Kube {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("rendering {0}")]
    Render(#[from] render::RenderError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("the cluster key Secret {0} is malformed")]
    BadKey(String),
    #[error("the cluster CA Secret {0} is malformed")]
    BadCa(String),
    #[error("making the cluster CA or a certificate")]
    Tls(#[from] tandem_proto::tls::TlsError),
    #[error("generating the cluster key: {0}")]
    Random(String),
    /// Deleting a worker set waits for drains and removals; the finalizer stays until done
    /// (the helper keeps it on any error, and the error policy retries in 5 s).
    #[error("cleanup pending: {0}")]
    CleanupPending(String),
}

fn kube(step: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| Error::Kube { step, source }
}

/// Shared by the reconcilers.
pub struct Context {
    client: Client,
    recorder: Recorder,
    /// Every pod the operator manages (label `app.kubernetes.io/managed-by`).
    pod_store: Store<Pod>,
    node_store: Store<Node>,
    /// One controller connection per cluster (namespace/name, endpoint).
    batch: Mutex<HashMap<(String, String), GrpcBatch>>,
    /// The longest a settled object waits for its next pass (`--status-refresh-seconds`).
    refresh: Duration,
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
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        pod_store,
        node_store,
        batch: Mutex::new(HashMap::new()),
        refresh: Duration::from_secs(args.status_refresh_seconds.max(1)),
    });
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

fn error_policy<K>(_obj: Arc<K>, err: &Error, _ctx: Arc<Context>) -> Requeue {
    warn!(error = %format!("{err:#}"), "reconcile error; retrying");
    Requeue::requeue(Duration::from_secs(5))
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    old: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status does.
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

async fn publish<K: Resource<DynamicType = ()>>(ctx: &Context, obj: &K, ev: &plan::Event) {
    let recorder = &ctx.recorder;
    let e = KEvent {
        type_: match ev.type_ {
            plan::EventType::Normal => KEventType::Normal,
            plan::EventType::Warning => KEventType::Warning,
        },
        reason: ev.reason.into(),
        note: Some(ev.note.chars().take(1000).collect()),
        action: ev.reason.into(),
        secondary: ev.related.as_ref().map(|r| match r {
            plan::Related::Pod(name) => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.clone()),
                namespace: obj.meta().namespace.clone(),
                ..ObjectReference::default()
            },
            plan::Related::Node(name) => ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            },
        }),
    };
    if let Err(err) = recorder.publish(&e, &obj.object_ref(&())).await {
        warn!(error = %err, reason = ev.reason, "event not recorded");
    }
}

fn warning(reason: &'static str, note: String) -> plan::Event {
    plan::Event {
        type_: plan::EventType::Warning,
        reason,
        note,
        related: None,
    }
}

fn normal(reason: &'static str, note: String) -> plan::Event {
    plan::Event {
        type_: plan::EventType::Normal,
        reason,
        note,
        related: None,
    }
}

// === the controller connection ===

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A Secret's value as text, from `data` (what an API server returns) or `stringData` (as
/// written, which the in-repo server keeps).
fn secret_text(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .or_else(|| s.string_data.as_ref().and_then(|d| d.get(key)).cloned())
}

/// Reads the cluster key from its Secret (the only place it lives).
async fn cluster_key(ctx: &Context, ns: &str, tc: &str) -> Result<Option<ClusterKey>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = render::key_secret_name(tc);
    let Some(s) = secrets
        .get_opt(&name)
        .await
        .map_err(kube("read key Secret"))?
    else {
        return Ok(None);
    };
    let bytes = secret_text(&s, defaults::KEY_FILE)
        .and_then(|t| unhex(&t))
        .ok_or(Error::BadKey(name))?;
    Ok(Some(ClusterKey::from_bytes(bytes)))
}

/// The cluster CA from its Secret (`ca.crt` and `ca.key`, both PEM).
fn ca_of(name: &str, s: &Secret) -> Result<ClusterCa, Error> {
    let cert = secret_text(s, defaults::CA_CERT_FILE);
    let key = secret_text(s, defaults::CA_KEY_FILE);
    match (cert, key) {
        (Some(c), Some(k)) => ClusterCa::from_pem(&c, &k).map_err(|_| Error::BadCa(name.into())),
        _ => Err(Error::BadCa(name.into())),
    }
}

async fn read_ca(ctx: &Context, ns: &str, tc: &str) -> Result<Option<ClusterCa>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let name = render::ca_secret_name(tc);
    secrets
        .get_opt(&name)
        .await
        .map_err(kube("read CA Secret"))?
        .map(|s| ca_of(&name, &s))
        .transpose()
}

async fn batch_for(ctx: &Context, ns: &str, tc: &TandemCluster) -> Result<GrpcBatch, String> {
    let name = tc.name_any();
    let endpoint = tc
        .status
        .as_ref()
        .and_then(|s| s.controller_endpoint.clone())
        .ok_or("the cluster has no controller endpoint yet")?;
    let key = (format!("{ns}/{name}"), endpoint.clone());
    if let Some(b) = ctx.batch.lock().await.get(&key) {
        return Ok(b.clone());
    }
    let k = cluster_key(ctx, ns, &name)
        .await
        .map_err(|e| format!("{e:#}"))?
        .ok_or("the cluster key Secret does not exist yet")?;
    // The controller's certificate chains to the cluster CA, which the operator keeps.
    let ca = read_ca(ctx, ns, &name)
        .await
        .map_err(|e| format!("{e:#}"))?
        .ok_or("the cluster CA Secret does not exist yet")?;
    let security = tandem_proto::tls::client_config_pem(ca.cert_pem().as_bytes())
        .map(ClientSecurity::Tls)
        .map_err(|e| format!("{e:#}"))?;
    let b = GrpcBatch::connect(&endpoint, &security, &k)
        .await
        .map_err(|e| format!("{e:#}"))?;
    ctx.batch.lock().await.insert(key, b.clone());
    Ok(b)
}

// === TandemCluster ===

async fn reconcile_cluster(tc: Arc<TandemCluster>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = tc.namespace().unwrap_or_default();
    let name = tc.name_any();
    let clusters: Api<TandemCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let gen_ = tc.metadata.generation;
    let old = tc.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = gen_;

    // Step: validate. A bad spec changes nothing that runs.
    let problems = validate::cluster(&tc.spec);
    if !problems.is_empty() {
        let msg = problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        // Told once per problem: the pass repeats every refresh period.
        if !degraded_by(&old.conditions, &msg) {
            publish(&ctx, &*tc, &warning("InvalidSpec", msg.clone())).await;
        }
        // The running cluster's node counts still follow its controller.
        if let Ok(b) = batch_for(&ctx, &ns, &tc).await
            && let Ok(batch_nodes) = b.nodes(&[]).await
        {
            status.nodes = crate::status::cluster_counts(&batch_nodes);
        }
        status.conditions = vec![
            condition(
                "Ready",
                old_ready(&old.conditions),
                "InvalidSpec",
                "the running cluster is left as it was".into(),
                gen_,
                &old.conditions,
            ),
            condition("Degraded", false, "InvalidSpec", msg, gen_, &old.conditions),
        ];
        status.conditions[1].status = "True".into();
        patch_cluster_status(&clusters, &name, &old, &status).await?;
        return Ok(Requeue::requeue(ctx.refresh));
    }

    // Step: key Secret (created once).
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    if secrets
        .get_opt(&render::key_secret_name(&name))
        .await
        .map_err(kube("read key Secret"))?
        .is_none()
    {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
        let secret = render::key_secret(&tc, &hex(&bytes))?;
        create_ok(
            secrets.create(&PostParams::default(), &secret).await,
            "create key Secret",
        )?;
    }

    // Step: the cluster CA Secret (created once: a new CA would orphan every certificate).
    let ca_name = render::ca_secret_name(&name);
    let ca = match secrets
        .get_opt(&ca_name)
        .await
        .map_err(kube("read CA Secret"))?
    {
        Some(s) => ca_of(&ca_name, &s)?,
        None => {
            let ca = ClusterCa::generate()?;
            let secret = render::ca_secret(&tc, ca.cert_pem(), ca.key_pem())?;
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => ca,
                // Made by an earlier pass whose answer we have not seen: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => read_ca(&ctx, &ns, &name)
                    .await?
                    .ok_or_else(|| Error::BadCa(ca_name.clone()))?,
                Err(source) => {
                    return Err(Error::Kube {
                        step: "create CA Secret",
                        source,
                    });
                }
            }
        }
    };

    // Step: Service, and the endpoint from its clusterIP.
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let svc = match services
        .get_opt(&render::service_name(&name))
        .await
        .map_err(kube("read Service"))?
    {
        Some(s) if render::service_ports_differ(&s) => {
            // Made by an older operator: give it the scaler and metrics ports.
            services
                .patch(
                    &render::service_name(&name),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"ports": render::service_ports()}})),
                )
                .await
                .map_err(kube("patch Service ports"))?
        }
        Some(s) => s,
        None => services
            .create(&PostParams::default(), &render::service(&tc)?)
            .await
            .map_err(kube("create Service"))?,
    };
    let cluster_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None");
    let endpoint = cluster_ip
        .as_ref()
        .map(|ip| format!("https://{}", host_port(ip, defaults::CONTROLLER_PORT)));
    status.controller_endpoint = endpoint.clone();

    // Step: the controller's certificate, for the Service's names and clusterIP; reissued
    // when they or the CA change.
    let cert_names =
        render::controller_cert_names(&render::service_name(&name), &ns, cluster_ip.as_deref());
    let tls_name = render::controller_tls_secret_name(&name);
    let have_tls = secrets
        .get_opt(&tls_name)
        .await
        .map_err(kube("read controller TLS Secret"))?;
    if render::cert_needs_issue(&cert_names, ca.cert_pem(), have_tls.as_ref()) {
        let (cert, key) = ca.issue(&cert_names)?;
        let secret = render::controller_tls_secret(&tc, &cert_names, &cert, &key, ca.cert_pem())?;
        if have_tls.is_some() {
            secrets
                .patch(&tls_name, &PatchParams::default(), &Patch::Merge(&secret))
                .await
                .map_err(kube("patch controller TLS Secret"))?;
        } else {
            create_ok(
                secrets.create(&PostParams::default(), &secret).await,
                "create controller TLS Secret",
            )?;
        }
        publish(
            &ctx,
            &*tc,
            &normal(
                "CertificateIssued",
                format!(
                    "controller certificate issued for {}",
                    cert_names.join(", ")
                ),
            ),
        )
        .await;
    }
    let cert_id = render::controller_cert_id(&cert_names, ca.cert_pem());

    // Step: PVC.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    if pvcs
        .get_opt(&render::pvc_name(&name))
        .await
        .map_err(kube("read PVC"))?
        .is_none()
    {
        create_ok(
            pvcs.create(&PostParams::default(), &render::pvc(&tc)?)
                .await,
            "create PVC",
        )?;
    }

    // Step: partitions (keep those still referenced) and the ConfigMap.
    let batch = batch_for(
        &ctx,
        &ns,
        &TandemCluster {
            status: Some(status.clone()),
            ..(*tc).clone()
        },
    )
    .await;
    let mut waiting = Vec::new();
    let mut referenced = match &batch {
        Ok(b) => match b.referenced_partitions().await {
            Ok(r) => r,
            // Unknown: keep everything rendered before (never drop blindly).
            Err(e) => {
                waiting.push(format!("jobs' partitions unknown: {e}"));
                old.partitions.iter().cloned().collect()
            }
        },
        Err(_) => old.partitions.iter().cloned().collect(),
    };
    for p in
        ctx.pod_store.state().iter().filter(|p| {
            p.labels().get(CLUSTER) == Some(&name) && p.namespace().as_deref() == Some(&ns)
        })
    {
        if let Some(args) = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.args.as_ref())
            && let Some(i) = args.iter().position(|a| a == "--partitions")
            && let Some(list) = args.get(i + 1)
        {
            referenced.extend(list.split(',').map(str::to_owned));
        }
    }
    let parts = partitions::render(&tc.spec.partitions, &old.partitions, &referenced);
    if !parts.retained.is_empty() && parts.retained != old.retained_partitions {
        publish(&ctx, &*tc, &warning(
            "PartitionRemovalDeferred",
            format!("partitions {:?} left the spec but jobs or workers still use them: kept, DRAINed, until they are idle", parts.retained),
        )).await;
    }
    status.retained_partitions = parts.retained.clone();
    status.partitions = parts.partitions.iter().map(|p| p.name.clone()).collect();
    let cm = render::config_map(&tc, &parts, endpoint.as_deref())?;
    let config_hash = render::hash_of(&cm.data);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    configmaps
        .patch(
            &render::config_map_name(&name),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(kube("apply ConfigMap"))?;

    // Step: the controller pod (recreated if lost; replaced when its config changes).
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let want = render::controller_pod(&tc, &config_hash, &cert_id)?;
    let want_hash = want.annotations().get(TEMPLATE_HASH).cloned();
    let have = ctx.pod_store.state().into_iter().find(|p| {
        p.namespace().as_deref() == Some(&ns) && p.name_any() == render::controller_pod_name(&name)
    });
    let mut controller_ready = false;
    match have {
        None => {
            create_ok(
                pods.create(&PostParams::default(), &want).await,
                "create controller Pod",
            )?;
            // The first start and a lost pod's replacement read the same: a pod on the
            // cluster's store, where every acknowledged job waits for it.
            let note = format!(
                "no controller pod: creating {} on the store in PVC {} (running jobs keep running)",
                render::controller_pod_name(&name),
                render::pvc_name(&name)
            );
            publish(&ctx, &*tc, &normal("ControllerPodCreated", note)).await;
            waiting.push("controller pod starting".into());
        }
        Some(p) if p.metadata.deletion_timestamp.is_some() => {
            waiting.push("controller pod restarting".into())
        }
        Some(p) if p.annotations().get(TEMPLATE_HASH) != want_hash.as_ref() => {
            let note = "the controller's config or certificate changed: restarting it (running jobs keep running)";
            publish(&ctx, &*tc, &normal("ControllerRestart", note.into())).await;
            pods.delete(&p.name_any(), &DeleteParams::default())
                .await
                .map_err(kube("delete controller Pod"))?;
            waiting.push("controller pod restarting for a new config".into());
        }
        Some(p) => {
            controller_ready = pod_ready(&p);
            if !controller_ready {
                waiting.push("controller pod not ready".into());
            }
        }
    }

    // Step: accounts, users and QOS (only those the spec names).
    let mut problems = Vec::new();
    if controller_ready {
        match &batch {
            Ok(b) => match b.accounting().await {
                Ok(current) => {
                    let (changes, managed) = accounting::diff(&tc.spec, &current, &old.managed);
                    let mut ok = true;
                    for c in &changes {
                        if let Err(e) = b.apply(c).await {
                            problems.push(format!("accounting change failed: {e}"));
                            ok = false;
                            break;
                        }
                    }
                    if ok {
                        status.managed = managed;
                    }
                }
                Err(e) => problems.push(format!("controller unreachable: {e}")),
            },
            Err(e) => problems.push(format!("controller unreachable: {e}")),
        }
        // Step: node counts (kept as they were when the controller does not answer).
        if let Ok(b) = &batch
            && let Ok(batch_nodes) = b.nodes(&[]).await
        {
            status.nodes = crate::status::cluster_counts(&batch_nodes);
        }
    }
    if !status.retained_partitions.is_empty() {
        waiting.push(format!(
            "partitions {:?} kept until no job uses them",
            status.retained_partitions
        ));
    }
    let ready = controller_ready && problems.is_empty();
    status.conditions = vec![
        condition(
            "Ready",
            ready,
            if ready { "ControllerReady" } else { "NotReady" },
            waiting.join("; "),
            gen_,
            &old.conditions,
        ),
        condition(
            "Progressing",
            !waiting.is_empty(),
            "Reconciling",
            waiting.join("; "),
            gen_,
            &old.conditions,
        ),
        condition(
            "Degraded",
            !problems.is_empty(),
            if problems.is_empty() {
                "AsExpected"
            } else {
                "ControllerProblem"
            },
            problems.join("; "),
            gen_,
            &old.conditions,
        ),
    ];
    patch_cluster_status(&clusters, &name, &old, &status).await?;
    // Settled, it is still looked at every refresh period: the node counts change with no
    // watch event (patched only when they differ).
    Ok(if ready && waiting.is_empty() {
        Requeue::requeue(ctx.refresh)
    } else {
        Requeue::requeue(ctx.refresh.min(Duration::from_secs(5)))
    })
}

/// `HOST:PORT`, bracketing an IPv6 host (a dual-stack Service's clusterIP may be one).
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn old_ready(c: &[Condition]) -> bool {
    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn create_ok<T>(r: Result<T, kube::Error>, step: &'static str) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        // Made by an earlier pass whose answer we have not seen yet.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube { step, source }),
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The merge patch from status `old` to `new`. What `new` leaves out (an emptied list, a
/// `None`; the status types skip those when serializing) is sent as `null`: a merge patch
/// that omits a key keeps its old value, so `status.members` would never empty and a set
/// scaled to zero would keep "forgetting" its last node on every pass.
fn status_patch<S: serde::Serialize>(old: &S, new: &S) -> serde_json::Value {
    fn remove_missing(old: &serde_json::Value, new: &mut serde_json::Value) {
        if let (serde_json::Value::Object(o), serde_json::Value::Object(n)) = (old, new) {
            for (k, ov) in o {
                match n.get_mut(k) {
                    None => {
                        n.insert(k.clone(), serde_json::Value::Null);
                    }
                    Some(nv) => remove_missing(ov, nv),
                }
            }
        }
    }
    let mut status = json!(new);
    remove_missing(&json!(old), &mut status);
    json!({ "status": status })
}

async fn patch_cluster_status(
    clusters: &Api<TandemCluster>,
    name: &str,
    old: &crate::crd::TandemClusterStatus,
    new: &crate::crd::TandemClusterStatus,
) -> Result<(), Error> {
    if old == new {
        return Ok(());
    }
    clusters
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(status_patch(old, new)),
        )
        .await
        .map_err(kube("patch TandemCluster status"))?;
    Ok(())
}

// === WorkerSet ===

async fn reconcile_workerset(ws: Arc<WorkerSet>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = ws.namespace().unwrap_or_default();
    let sets: Api<WorkerSet> = Api::namespaced(ctx.client.clone(), &ns);
    // Add the finalizer with a merge patch guarded by resourceVersion (a 409 retries):
    // kube's helper adds it with a JSON-patch `test` of the absent list, which the e2e
    // harness's server rejects; removal still goes through the helper.
    if ws.metadata.deletion_timestamp.is_none() && !ws.finalizers().iter().any(|f| f == FINALIZER) {
        let mut finalizers = ws.finalizers().to_vec();
        finalizers.push(FINALIZER.to_owned());
        sets.patch(
            &ws.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": ws.resource_version()}})),
        )
        .await
        .map_err(kube("add WorkerSet finalizer"))?;
        return Ok(Requeue::requeue(Duration::from_millis(100)));
    }
    finalizer::finalizer(&sets, FINALIZER, ws, |event| async {
        match event {
            finalizer::Event::Apply(ws) => sync_workerset(&ws, &ctx, false).await,
            finalizer::Event::Cleanup(ws) => sync_workerset(&ws, &ctx, true).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn worker_pod_view(p: &Pod) -> WorkerPod {
    let spec = p.spec.as_ref();
    let node = spec
        .and_then(|s| s.node_name.clone())
        .or_else(|| {
            // Not yet bound: the node its affinity pins it to.
            spec.and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .and_then(|r| r.node_selector_terms.first())
                .and_then(|t| t.match_fields.as_ref())
                .and_then(|m| m.first())
                .and_then(|m| m.values.as_ref())
                .and_then(|v| v.first().cloned())
        })
        .unwrap_or_default();
    let phase = match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") | Some("Failed") => PodPhase::Ended,
        _ => PodPhase::Pending,
    };
    let a = p.annotations();
    let drain = a
        .get(DRAIN_SINCE)
        .and_then(|s| s.parse().ok())
        .zip(a.get(DRAIN_FOR).and_then(|w| DrainFor::parse(w)));
    WorkerPod {
        name: p.name_any(),
        node,
        phase,
        terminating: p.metadata.deletion_timestamp.is_some(),
        template_hash: a.get(TEMPLATE_HASH).cloned().unwrap_or_default(),
        drain,
    }
}

/// Kubernetes nodes the set's pods may go to: schedulable, matching the node selector,
/// with every NoSchedule/NoExecute taint tolerated. Sorted by name.
pub fn eligible_nodes(
    nodes: &[Arc<Node>],
    selector: &BTreeMap<String, String>,
    tolerations: &[k8s_openapi::api::core::v1::Toleration],
) -> Vec<String> {
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .filter(|n| selector.iter().all(|(k, v)| n.labels().get(k) == Some(v)))
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .into_iter()
                .flatten()
                .all(|t| {
                    t.effect == "PreferNoSchedule"
                        || tolerations.iter().any(|tol| {
                            let key_ok = tol
                                .key
                                .as_deref()
                                .is_none_or(|k| k.is_empty() || k == t.key);
                            let op_exists = tol.operator.as_deref() == Some("Exists");
                            let value_ok = op_exists
                                || tol.value.as_deref().unwrap_or("")
                                    == t.value.as_deref().unwrap_or("");
                            let effect_ok = tol
                                .effect
                                .as_deref()
                                .is_none_or(|e| e.is_empty() || e == t.effect);
                            key_ok && value_ok && effect_ok && (tol.key.is_some() || op_exists)
                        })
                })
        })
        .map(|n| n.name_any())
        .collect();
    out.sort();
    out
}

/// The Kubernetes nodes a worker set's pods may go to: [`eligible_nodes`] with the
/// tolerations the pods are rendered with ([`render::worker_tolerations`]: the template's
/// and the pool's), so batch-mode pool nodes (`NoExecute`) count whatever the template says.
pub fn eligible_worker_nodes(
    nodes: &[Arc<Node>],
    o: &crate::crd::template::PodOverrides,
) -> Vec<String> {
    eligible_nodes(nodes, &o.node_selector, &render::worker_tolerations(o))
}

async fn sync_workerset(ws: &WorkerSet, ctx: &Context, deleting: bool) -> Result<Requeue, Error> {
    let ns = ws.namespace().unwrap_or_default();
    let name = ws.name_any();
    let sets: Api<WorkerSet> = Api::namespaced(ctx.client.clone(), &ns);
    let clusters: Api<TandemCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let gen_ = ws.metadata.generation;
    let old = ws.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = gen_;
    status.selector = Some(render::worker_selector(&name));

    // Step: the cluster and the spec against it.
    let tc = clusters
        .get_opt(&ws.spec.cluster_name)
        .await
        .map_err(kube("read TandemCluster"))?;
    let Some(tc) = tc else {
        if deleting {
            // The cluster (and its controller) is gone: nothing to drain or remove.
            for p in own_pods(ctx, &ns, &name) {
                if p.metadata.deletion_timestamp.is_none() {
                    pods.delete(&p.name_any(), &DeleteParams::default())
                        .await
                        .map_err(kube("delete worker Pod"))?;
                }
            }
            return Ok(Requeue::await_change());
        }
        let msg = format!("TandemCluster {} not found", ws.spec.cluster_name);
        status.conditions = degraded(&old.conditions, gen_, "ClusterNotFound", msg);
        patch_set_status(&sets, &name, &old, &status).await?;
        return Ok(Requeue::requeue(Duration::from_secs(10)));
    };
    if !deleting {
        let problems = validate::worker_set(&ws.spec, &tc.spec);
        if !problems.is_empty() {
            let msg = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            let msg = format!("{msg} (running workers are left as they are)");
            // Told once per problem: the pass repeats every refresh period.
            if !degraded_by(&old.conditions, &msg) {
                publish(ctx, ws, &warning("InvalidSpec", msg.clone())).await;
            }
            // The running workers' node counts still follow the controller.
            if let Ok(b) = batch_for(ctx, &ns, &tc).await
                && let Ok(batch_nodes) = b.nodes(&[]).await
            {
                let views: Vec<WorkerPod> = own_pods(ctx, &ns, &name)
                    .iter()
                    .map(|p| worker_pod_view(p))
                    .filter(|v| !v.terminating && v.phase != PodPhase::Ended)
                    .collect();
                let by_name = batch_nodes
                    .into_iter()
                    .map(|n| (n.name.clone(), n))
                    .collect();
                crate::status::set_counts(views.iter().map(|v| v.node.as_str()), &by_name)
                    .write(&mut status);
            }
            status.conditions = degraded(&old.conditions, gen_, "InvalidSpec", msg);
            patch_set_status(&sets, &name, &old, &status).await?;
            return Ok(Requeue::requeue(ctx.refresh));
        }
    }

    // Step: observe pods, Kubernetes nodes and batch nodes.
    let all_pods = ctx.pod_store.state();
    let mine: Vec<Arc<Pod>> = own_pods(ctx, &ns, &name);
    let occupied: std::collections::BTreeSet<String> = all_pods
        .iter()
        .filter(|p| p.labels().get(APP_COMPONENT).map(String::as_str) == Some(COMPONENT_WORKER))
        .filter_map(|p| Some(worker_pod_view(p).node).filter(|n| !n.is_empty()))
        .collect();
    let o = &ws.spec.template;
    let free_nodes: Vec<String> = eligible_worker_nodes(&ctx.node_store.state(), o)
        .into_iter()
        .filter(|n| !occupied.contains(n))
        .collect();

    // Step: worker pods made before they carried the pool toleration get it in place
    // (tolerations are the one list a running pod may grow): otherwise the batch-mode
    // `NoExecute` taint evicts them, and their nodes' running jobs with them. Best effort:
    // a refusal is logged and the rest of the pass goes on.
    for p in &mine {
        if p.metadata.deletion_timestamp.is_none() && !render::has_pool_toleration(p) {
            let patch = render::pool_toleration_patch(p);
            match pods
                .patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => info!(workerset = %name, pod = %p.name_any(), "added the pool toleration"),
                Err(e) => {
                    warn!(workerset = %name, pod = %p.name_any(), error = %e, "could not add the pool toleration")
                }
            }
        }
    }
    let views: Vec<WorkerPod> = mine.iter().map(|p| worker_pod_view(p)).collect();
    let mut members: Vec<String> = old.members.clone();
    for v in &views {
        if !v.node.is_empty() && !members.contains(&v.node) {
            members.push(v.node.clone());
        }
    }
    let batch = batch_for(ctx, &ns, &tc).await;
    let lookup = match &batch {
        Ok(b) => match b.nodes(&[]).await {
            Ok(batch_nodes) => Lookup::from_nodes(
                batch_nodes
                    .into_iter()
                    .filter(|n| members.contains(&n.name)),
            ),
            Err(e) => Lookup::Failed(e.to_string()),
        },
        Err(e) => Lookup::Failed(e.clone()),
    };
    let image = o
        .image
        .clone()
        .or_else(|| tc.spec.image.clone())
        .unwrap_or_else(defaults::default_image);
    let desired = plan::Desired {
        replicas: u32::try_from(ws.spec.replicas).unwrap_or(0),
        template_hash: render::worker_template_hash(ws, &image),
        drain_deadline_s: i64::from(ws.spec.scale_in.drain_deadline_seconds),
        max_unavailable: ws.spec.update_strategy.max_unavailable,
        deleting,
        set: format!("{ns}/{name}"),
    };
    let observed = plan::Observed {
        pods: views.clone(),
        nodes: lookup.clone(),
        members: members.clone(),
        free_nodes,
        now: now(),
    };
    let p = plan::plan(&desired, &observed);

    // The cluster CA, read only when a pod is to be made: each new pod's step certificate
    // is issued from it just before the pod (see `render`'s module documentation).
    let ca = if p
        .actions
        .iter()
        .any(|a| matches!(a, Action::CreatePod { .. }))
    {
        read_ca(ctx, &ns, &ws.spec.cluster_name).await
    } else {
        Ok(None)
    };

    // Step: apply, in order; the first failure stops the rest (retried next pass), except
    // what the controller answers "not yet" to (see `plan::on_failure`): that is waited for.
    let mut failure = None;
    let mut not_yet: Vec<String> = Vec::new();
    for a in &p.actions {
        let r: Result<(), String> = match a {
            Action::CreatePod { node } => match (&ca, render::worker_pod(ws, node, tc.spec.image.as_deref())) {
                (Ok(Some(ca)), Ok(pod)) => match put_step_secret(ctx, ws, node, ca).await {
                    Ok(()) => create_ok(pods.create(&PostParams::default(), &pod).await, "create worker Pod").map_err(|e| format!("{e:#}")),
                    Err(e) => Err(e),
                },
                (Ok(None), _) => Err(format!("the cluster CA Secret {} is not there yet", render::ca_secret_name(&ws.spec.cluster_name))),
                (Err(e), _) => Err(format!("{e:#}")),
                (_, Err(e)) => Err(e.to_string()),
            },
            Action::Mark { pod, why, since } => pods
                .patch(pod, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {DRAIN_SINCE: since.to_string(), DRAIN_FOR: why.as_str()}}})))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Action::Unmark { pod } => pods
                .patch(pod, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {DRAIN_SINCE: null, DRAIN_FOR: null}}})))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Action::DeletePod { pod } => match pods.delete(pod, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.to_string()),
            },
            Action::Drain { node, reason } => with_batch(&batch, |b| async move { b.update_node(node, "DRAIN", reason).await.map_err(|e| e.to_string()) }).await,
            Action::Resume { node } => with_batch(&batch, |b| async move { b.update_node(node, "RESUME", "").await.map_err(|e| e.to_string()) }).await,
            Action::Down { node, reason } => with_batch(&batch, |b| async move { b.update_node(node, "DOWN", reason).await.map_err(|e| e.to_string()) }).await,
            Action::RemoveNode { node } => match &batch {
                Ok(b) => match b.remove_node(node, false, "tandem-operator: worker pod gone").await {
                    Ok(()) => {
                        members.retain(|m| m != node);
                        Ok(())
                    }
                    Err(e) => match plan::on_failure(a, e.refused(), &e.detail()) {
                        plan::OnFailure::Wait(w) => {
                            info!(workerset = %name, node = %node, why = %e.detail(), "node removal refused for now; waiting");
                            not_yet.push(w);
                            continue;
                        }
                        plan::OnFailure::Stop => Err(e.to_string()),
                    },
                },
                Err(e) => Err(format!("controller unreachable: {e}")),
            },
            Action::Forget { node } => {
                members.retain(|m| m != node);
                Ok(())
            }
        };
        if let Err(e) = r {
            failure = Some(format!("{a:?}: {e}"));
            break;
        }
        if let Action::CreatePod { node } = a
            && !members.contains(node)
        {
            members.push(node.clone());
        }
    }
    for ev in &p.events {
        publish(ctx, ws, ev).await;
    }
    if let Some(f) = &failure {
        publish(ctx, ws, &warning("StepFailed", f.clone())).await;
    }

    // Step: status.
    let live: Vec<&WorkerPod> = views
        .iter()
        .filter(|v| !v.terminating && v.phase != PodPhase::Ended)
        .collect();
    status.replicas = i32::try_from(live.len()).unwrap_or(i32::MAX);
    status.ready_replicas =
        i32::try_from(live.iter().filter(|v| plan::ready(v, &lookup)).count()).unwrap_or(0);
    status.updated_replicas = i32::try_from(
        live.iter()
            .filter(|v| v.template_hash == desired.template_hash)
            .count(),
    )
    .unwrap_or(0);
    // Kept as they were when the controller does not answer.
    if let Lookup::Nodes(batch_nodes) = &lookup {
        crate::status::set_counts(live.iter().map(|v| v.node.as_str()), batch_nodes)
            .write(&mut status);
    }
    status.members = members;
    // Deleting finishes only once every action went through: a removal refused or failed
    // leaves its node in the controller.
    let finished = p.finished && failure.is_none() && not_yet.is_empty();
    let mut problems = p.problems.clone();
    problems.extend(failure);
    let mut waiting = p.waiting.clone();
    waiting.extend(not_yet.iter().cloned());
    let ready = problems.is_empty()
        && waiting.is_empty()
        && status.ready_replicas == ws.spec.replicas
        && p.actions.is_empty();
    status.conditions = vec![
        condition(
            "Ready",
            ready,
            if ready { "AllWorkersReady" } else { "NotReady" },
            format!(
                "{}/{} workers ready",
                status.ready_replicas, ws.spec.replicas
            ),
            gen_,
            &old.conditions,
        ),
        condition(
            "Progressing",
            !p.actions.is_empty() || !waiting.is_empty(),
            "Reconciling",
            waiting.join("; "),
            gen_,
            &old.conditions,
        ),
        condition(
            "Degraded",
            !problems.is_empty(),
            if problems.is_empty() {
                "AsExpected"
            } else {
                "Problem"
            },
            problems.join("; "),
            gen_,
            &old.conditions,
        ),
    ];
    if !deleting {
        patch_set_status(&sets, &name, &old, &status).await?;
    }
    if deleting && finished {
        info!(workerset = %name, "worker set cleaned up");
        return Ok(Requeue::await_change());
    }
    if deleting && !finished {
        return Err(Error::CleanupPending(format!(
            "worker set {name} still has {} pod(s) or node(s) to clean up",
            views.len() + status.members.len()
        )));
    }
    let asked = if not_yet.is_empty() {
        p.requeue_after_s
    } else {
        Some(
            p.requeue_after_s
                .map_or(plan::DRAIN_POLL_S, |s| s.min(plan::DRAIN_POLL_S)),
        )
    };
    Ok(Requeue::requeue(crate::status::next_look(
        asked,
        ctx.refresh,
    )))
}

/// Issues the step-service certificate of `ws`'s pod on `node` (for the node name) into its
/// Secret: created, or rewritten if one is left from an earlier pod on that node. Afresh for
/// every pod, so each starts with a certificate valid for its full term.
async fn put_step_secret(
    ctx: &Context,
    ws: &WorkerSet,
    node: &str,
    ca: &ClusterCa,
) -> Result<(), String> {
    let secrets: Api<Secret> =
        Api::namespaced(ctx.client.clone(), &ws.namespace().unwrap_or_default());
    let name = render::worker_step_tls_secret_name(&ws.name_any(), node);
    let (cert, key) = ca
        .issue(&render::step_cert_names(node))
        .map_err(|e| format!("issuing the step certificate of node {node}: {e}"))?;
    let secret = render::worker_step_tls_secret(ws, node, &cert, &key, ca.cert_pem())
        .map_err(|e| e.to_string())?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&secret))
                .await
                .map_err(|e| format!("patch step TLS Secret {name}: {e}"))?;
        }
        Err(e) => return Err(format!("create step TLS Secret {name}: {e}")),
    }
    info!(workerset = %ws.name_any(), node = %node, secret = %name, "step certificate issued");
    Ok(())
}

async fn with_batch<'a, F, Fut>(batch: &'a Result<GrpcBatch, String>, f: F) -> Result<(), String>
where
    F: FnOnce(&'a GrpcBatch) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    match batch {
        Ok(b) => f(b).await,
        Err(e) => Err(format!("controller unreachable: {e}")),
    }
}

fn own_pods(ctx: &Context, ns: &str, set: &str) -> Vec<Arc<Pod>> {
    ctx.pod_store
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(ns)
                && p.labels().get(WORKER_SET).map(String::as_str) == Some(set)
        })
        .collect()
}

/// `old` already says Degraded with this message (its Event was published then).
fn degraded_by(old: &[Condition], msg: &str) -> bool {
    old.iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.message == msg)
}

fn degraded(old: &[Condition], gen_: Option<i64>, reason: &str, msg: String) -> Vec<Condition> {
    let mut d = condition("Degraded", true, reason, msg.clone(), gen_, old);
    d.status = "True".into();
    vec![
        condition("Ready", old_ready(old), reason, msg, gen_, old),
        d,
    ]
}

async fn patch_set_status(
    sets: &Api<WorkerSet>,
    name: &str,
    old: &WorkerSetStatus,
    new: &WorkerSetStatus,
) -> Result<(), Error> {
    if old == new {
        return Ok(());
    }
    sets.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(status_patch(old, new)),
    )
    .await
    .map_err(kube("patch WorkerSet status"))?;
    Ok(())
}

// === LoginSet ===

async fn reconcile_loginset(ls: Arc<LoginSet>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let ns = ls.namespace().unwrap_or_default();
    let name = ls.name_any();
    let logins: Api<LoginSet> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let clusters: Api<TandemCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let tc = clusters
        .get_opt(&ls.spec.cluster_name)
        .await
        .map_err(kube("read TandemCluster"))?;
    let image = tc.as_ref().and_then(|t| t.spec.image.clone());
    let mine: Vec<Arc<Pod>> = ctx
        .pod_store
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(&ns) && p.labels().get(LOGIN_SET) == Some(&name)
        })
        .collect();
    let want = u32::try_from(ls.spec.replicas).unwrap_or(0);
    for i in 0..want {
        let pod = render::login_pod(&ls, i, image.as_deref())?;
        let pod_name = pod.name_any();
        match mine.iter().find(|p| p.name_any() == pod_name) {
            None => create_ok(
                pods.create(&PostParams::default(), &pod).await,
                "create login Pod",
            )?,
            Some(p)
                if p.metadata.deletion_timestamp.is_none()
                    && p.annotations().get(TEMPLATE_HASH)
                        != pod.annotations().get(TEMPLATE_HASH) =>
            {
                pods.delete(&pod_name, &DeleteParams::default())
                    .await
                    .map_err(kube("delete login Pod"))?;
            }
            Some(_) => {}
        }
    }
    for p in &mine {
        let idx = p
            .name_any()
            .rsplit('-')
            .next()
            .and_then(|i| i.parse::<u32>().ok());
        if idx.is_none_or(|i| i >= want) && p.metadata.deletion_timestamp.is_none() {
            pods.delete(&p.name_any(), &DeleteParams::default())
                .await
                .map_err(kube("delete login Pod"))?;
        }
    }
    let old = ls.status.clone().unwrap_or_default();
    let ready = i32::try_from(mine.iter().filter(|p| pod_ready(p)).count()).unwrap_or(0);
    let gen_ = ls.metadata.generation;
    let mut status = LoginSetStatus {
        observed_generation: gen_,
        replicas: i32::try_from(
            mine.iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count(),
        )
        .unwrap_or(0),
        ready_replicas: ready,
        selector: Some(format!("{LOGIN_SET}={name}")),
        conditions: vec![],
    };
    let msg = match &tc {
        None => format!("TandemCluster {} not found", ls.spec.cluster_name),
        Some(_) => format!("{ready}/{} login pods ready", ls.spec.replicas),
    };
    status.conditions = vec![condition(
        "Ready",
        tc.is_some() && ready == ls.spec.replicas,
        "LoginPods",
        msg,
        gen_,
        &old.conditions,
    )];
    if old != status {
        logins
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map_err(kube("patch LoginSet status"))?;
    }
    // The pods are read from the shared pod store, whose watch may not yet have applied the
    // event that triggered this pass (a pod turning ready): look again soon until every pod
    // is ready, as the cluster's reconcile does, or the status could stay behind for good.
    Ok(if tc.is_some() && ready == ls.spec.replicas {
        Requeue::requeue(Duration::from_secs(300))
    } else {
        Requeue::requeue(Duration::from_secs(2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Toleration;

    fn node(
        name: &str,
        labels: &[(&str, &str)],
        taint: Option<(&str, &str)>,
        cordoned: bool,
    ) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
                "spec": {
                    "unschedulable": cordoned,
                    "taints": taint.map(|(k, e)| vec![json!({"key": k, "effect": e})]).unwrap_or_default(),
                },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn eligible_nodes_match_selector_taints_and_cordons() {
        let nodes = vec![
            node("a", &[("pool", "gpu")], None, false),
            node("b", &[("pool", "cpu")], None, false),
            node(
                "c",
                &[("pool", "gpu")],
                Some(("tandem.dev/pool", "NoSchedule")),
                false,
            ),
            node("d", &[("pool", "gpu")], None, true),
        ];
        let sel: BTreeMap<String, String> = [("pool".to_owned(), "gpu".to_owned())].into();
        assert_eq!(eligible_nodes(&nodes, &sel, &[]), vec!["a"]);
        let tol = Toleration {
            key: Some("tandem.dev/pool".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        assert_eq!(eligible_nodes(&nodes, &sel, &[tol]), vec!["a", "c"]);
    }

    /// A pool node in batch mode carries `NoSchedule` and `NoExecute` pool taints. A worker
    /// set whose template tolerates only `NoSchedule` (as the charts' examples used to)
    /// still counts it: its pods are rendered with the pool toleration of every effect.
    #[test]
    fn batch_mode_pool_nodes_are_eligible_for_workers_whatever_their_template_says() {
        let batch = |name: &str| {
            Arc::new(
                serde_json::from_value::<Node>(json!({
                    "metadata": {"name": name, "labels": {"pool": "gpu", "tandem.dev/mode": "batch"}},
                    "spec": {"taints": [
                        {"key": "tandem.dev/pool", "value": "research", "effect": "NoSchedule"},
                        {"key": "tandem.dev/pool", "value": "research", "effect": "NoExecute"},
                    ]},
                }))
                .unwrap(),
            )
        };
        let nodes = vec![
            batch("b"),
            node(
                "k",
                &[("pool", "gpu")],
                Some(("tandem.dev/pool", "NoSchedule")),
                false,
            ),
            // A taint of someone else's is still the template's to tolerate.
            node(
                "x",
                &[("pool", "gpu")],
                Some(("dedicated", "NoExecute")),
                false,
            ),
        ];
        let mut o = crate::crd::template::PodOverrides {
            node_selector: [("pool".to_owned(), "gpu".to_owned())].into(),
            ..Default::default()
        };
        assert_eq!(eligible_worker_nodes(&nodes, &o), vec!["b", "k"]);
        o.tolerations = vec![Toleration {
            key: Some("tandem.dev/pool".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }];
        assert_eq!(eligible_worker_nodes(&nodes, &o), vec!["b", "k"]);
        // What the template alone tolerates would leave the batch node out.
        assert_eq!(
            eligible_nodes(&nodes, &o.node_selector, &o.tolerations),
            vec!["k"]
        );
    }

    #[test]
    fn a_status_patch_clears_what_the_new_status_leaves_out() {
        let old = WorkerSetStatus {
            members: vec!["kn-0".into()],
            selector: Some("s".into()),
            replicas: 1,
            ..Default::default()
        };
        let new = WorkerSetStatus {
            selector: Some("s".into()),
            ..Default::default()
        };
        let p = status_patch(&old, &new);
        assert_eq!(p["status"]["members"], serde_json::Value::Null);
        assert!(p["status"].as_object().unwrap().contains_key("members"));
        assert_eq!(p["status"]["replicas"], json!(0));
        assert_eq!(p["status"]["selector"], json!("s"));
        // Nested objects too (the cluster's managed entities).
        let mut a = json!({"managed": {"accounts": ["x"], "qos": ["q"]}});
        let b = json!({"managed": {"qos": ["q"]}});
        assert_eq!(
            status_patch(&a, &b)["status"]["managed"],
            json!({"accounts": null, "qos": ["q"]})
        );
        a["managed"]["accounts"] = json!(["y"]);
        assert_eq!(status_patch(&a, &a)["status"], a);
    }

    #[test]
    fn key_hex_round_trips() {
        let b = [7u8; 32];
        assert_eq!(unhex(&hex(&b)), Some(b));
        assert_eq!(unhex("zz"), None);
    }
}
