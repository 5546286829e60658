//! The TandemCluster reconciler: the cluster's own objects (key, CA and controller TLS
//! Secrets, Service, PVC, ConfigMap, controller pod), its accounting and its status, as the
//! named steps of [`STEPS`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use serde_json::json;
use tandem_net::tls::ca::ClusterCa;

use super::*;
use crate::connections::Batch;
use crate::crd::{TandemCluster, TandemClusterStatus};
use crate::events::{normal, publish, warning};
use crate::labels::*;
use crate::secrets::{ca_of, hex, read_ca};
use crate::{accounting, defaults, partitions, render, validate};

/// The steps of a TandemCluster pass, in order.
pub(crate) const STEPS: &[Step<ClusterPass>] = &[
    step!(ClusterPass, "validate", validate),
    step!(ClusterPass, "key-secret", key_secret),
    step!(ClusterPass, "ca-secret", ca_secret),
    step!(ClusterPass, "service", service),
    step!(
        ClusterPass,
        "controller-certificate",
        controller_certificate
    ),
    step!(ClusterPass, "pvc", pvc),
    step!(ClusterPass, "config", config),
    step!(ClusterPass, "controller-pod", controller_pod),
    step!(ClusterPass, "accounting", accounting),
    step!(ClusterPass, "node-counts", node_counts),
    step!(ClusterPass, "status", status),
];

/// The state of one TandemCluster pass: what the steps found and what the next ones need.
pub(crate) struct ClusterPass {
    ctx: Arc<Context>,
    tc: Arc<TandemCluster>,
    ns: String,
    name: String,
    clusters: Api<TandemCluster>,
    secrets: Api<Secret>,
    gen_: Option<i64>,
    old: TandemClusterStatus,
    status: TandemClusterStatus,
    /// The cluster CA (`ca-secret`).
    ca: Option<ClusterCa>,
    /// The Service's clusterIP (`service`).
    cluster_ip: Option<String>,
    /// The controller certificate's identity (`controller-certificate`).
    cert_id: String,
    /// The controller connection (`config`).
    batch: Result<Batch, String>,
    config_hash: String,
    controller_ready: bool,
    waiting: Vec<String>,
    problems: Vec<String>,
}

impl ClusterPass {
    fn new(tc: Arc<TandemCluster>, ctx: Arc<Context>) -> Self {
        let ns = tc.namespace().unwrap_or_default();
        let name = tc.name_any();
        let gen_ = tc.metadata.generation;
        let old = tc.status.clone().unwrap_or_default();
        let mut status = old.clone();
        status.observed_generation = gen_;
        ClusterPass {
            clusters: Api::namespaced(ctx.client.clone(), &ns),
            secrets: Api::namespaced(ctx.client.clone(), &ns),
            ctx,
            tc,
            ns,
            name,
            gen_,
            old,
            status,
            ca: None,
            cluster_ip: None,
            cert_id: String::new(),
            batch: Err("not connected yet".into()),
            config_hash: String::new(),
            controller_ready: false,
            waiting: Vec::new(),
            problems: Vec::new(),
        }
    }

    fn ca(&self) -> Result<&ClusterCa, Error> {
        self.ca
            .as_ref()
            .ok_or_else(|| Error::BadCa(render::ca_secret_name(&self.name)))
    }
}

pub(crate) async fn reconcile_cluster(
    tc: Arc<TandemCluster>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let mut pass = ClusterPass::new(tc.clone(), ctx.clone());
    run_steps(STEPS, &mut pass, &ctx, &*tc).await
}

/// A bad spec changes nothing that runs: the pass ends here with the cluster Degraded.
async fn validate(p: &mut ClusterPass) -> StepResult {
    let problems = validate::cluster(&p.tc.spec);
    if problems.is_empty() {
        return Ok(Flow::Next);
    }
    let (ctx, old, gen_) = (&p.ctx, &p.old, p.gen_);
    let msg = problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    // Told once per problem: the pass repeats every refresh period.
    if !degraded_by(&old.conditions, &msg) {
        publish(&ctx.recorder, &*p.tc, &warning("InvalidSpec", msg.clone())).await;
    }
    // The running cluster's node counts still follow its controller.
    if let Ok(b) = batch_for(ctx, &p.ns, &p.tc).await
        && let Ok(batch_nodes) = b.nodes(&[]).await
    {
        p.status.nodes = crate::status::cluster_counts(&batch_nodes);
    }
    p.status.conditions = vec![
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
    p.status.conditions[1].status = "True".into();
    patch_cluster_status(&p.clusters, &p.name, old, &p.status).await?;
    Ok(Flow::Done(Requeue::requeue(ctx.refresh)))
}

/// The key Secret, created once.
async fn key_secret(p: &mut ClusterPass) -> StepResult {
    if p.secrets
        .get_opt(&render::key_secret_name(&p.name))
        .await
        .map_err(kube("read key Secret"))?
        .is_none()
    {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| Error::Random(e.to_string()))?;
        let secret = render::key_secret(&p.tc, &hex(&bytes))?;
        create_ok(
            p.secrets.create(&PostParams::default(), &secret).await,
            "create key Secret",
        )?;
    }
    Ok(Flow::Next)
}

/// The cluster CA Secret, created once: a new CA would orphan every certificate.
async fn ca_secret(p: &mut ClusterPass) -> StepResult {
    let ca_name = render::ca_secret_name(&p.name);
    let ca = match p
        .secrets
        .get_opt(&ca_name)
        .await
        .map_err(kube("read CA Secret"))?
    {
        Some(s) => ca_of(&ca_name, &s)?,
        None => {
            let ca = ClusterCa::generate()?;
            let secret = render::ca_secret(&p.tc, ca.cert_pem(), ca.key_pem())?;
            match p.secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => ca,
                // Made by an earlier pass whose answer we have not seen: use that one.
                Err(kube::Error::Api(e)) if e.code == 409 => read_ca(&p.ctx.client, &p.ns, &p.name)
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
    p.ca = Some(ca);
    Ok(Flow::Next)
}

/// The Service, and the controller endpoint from its clusterIP.
async fn service(p: &mut ClusterPass) -> StepResult {
    let services: Api<Service> = Api::namespaced(p.ctx.client.clone(), &p.ns);
    let svc = match services
        .get_opt(&render::service_name(&p.name))
        .await
        .map_err(kube("read Service"))?
    {
        Some(s) if render::service_ports_differ(&s) => {
            // Made by an older operator: give it the scaler and metrics ports.
            services
                .patch(
                    &render::service_name(&p.name),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"ports": render::service_ports()}})),
                )
                .await
                .map_err(kube("patch Service ports"))?
        }
        Some(s) => s,
        None => services
            .create(&PostParams::default(), &render::service(&p.tc)?)
            .await
            .map_err(kube("create Service"))?,
    };
    p.cluster_ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && ip != "None");
    p.status.controller_endpoint = p
        .cluster_ip
        .as_ref()
        .map(|ip| format!("https://{}", host_port(ip, defaults::CONTROLLER_PORT)));
    Ok(Flow::Next)
}

/// The controller's certificate, for the Service's names and clusterIP; reissued when they
/// or the CA change.
async fn controller_certificate(p: &mut ClusterPass) -> StepResult {
    let ca = p.ca()?;
    let cert_names = render::controller_cert_names(
        &render::service_name(&p.name),
        &p.ns,
        p.cluster_ip.as_deref(),
    );
    let tls_name = render::controller_tls_secret_name(&p.name);
    let have_tls = p
        .secrets
        .get_opt(&tls_name)
        .await
        .map_err(kube("read controller TLS Secret"))?;
    if render::cert_needs_issue(&cert_names, ca.cert_pem(), have_tls.as_ref()) {
        let (cert, key) = ca.issue(&cert_names)?;
        let secret = render::controller_tls_secret(&p.tc, &cert_names, &cert, &key, ca.cert_pem())?;
        if have_tls.is_some() {
            p.secrets
                .patch(&tls_name, &PatchParams::default(), &Patch::Merge(&secret))
                .await
                .map_err(kube("patch controller TLS Secret"))?;
        } else {
            create_ok(
                p.secrets.create(&PostParams::default(), &secret).await,
                "create controller TLS Secret",
            )?;
        }
        publish(
            &p.ctx.recorder,
            &*p.tc,
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
    p.cert_id = render::controller_cert_id(&cert_names, ca.cert_pem());
    Ok(Flow::Next)
}

/// The PVC the controller's store lives on, created once.
async fn pvc(p: &mut ClusterPass) -> StepResult {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(p.ctx.client.clone(), &p.ns);
    if pvcs
        .get_opt(&render::pvc_name(&p.name))
        .await
        .map_err(kube("read PVC"))?
        .is_none()
    {
        create_ok(
            pvcs.create(&PostParams::default(), &render::pvc(&p.tc)?)
                .await,
            "create PVC",
        )?;
    }
    Ok(Flow::Next)
}

/// The partitions (keeping those still referenced) and the ConfigMap.
async fn config(p: &mut ClusterPass) -> StepResult {
    let (ctx, ns, name, old) = (&p.ctx, &p.ns, &p.name, &p.old);
    p.batch = batch_for(
        ctx,
        ns,
        &TandemCluster {
            status: Some(p.status.clone()),
            ..(*p.tc).clone()
        },
    )
    .await;
    let mut referenced = match &p.batch {
        Ok(b) => match b.referenced_partitions().await {
            Ok(r) => r,
            // Unknown: keep everything rendered before (never drop blindly).
            Err(e) => {
                p.waiting.push(format!("jobs' partitions unknown: {e}"));
                old.partitions.iter().cloned().collect()
            }
        },
        Err(_) => old.partitions.iter().cloned().collect(),
    };
    for pod in ctx.pod_store.state().iter().filter(|pod| {
        pod.labels().get(CLUSTER) == Some(name) && pod.namespace().as_deref() == Some(ns)
    }) {
        if let Some(args) = pod
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
    let parts = partitions::render(&p.tc.spec.partitions, &old.partitions, &referenced);
    if !parts.retained.is_empty() && parts.retained != old.retained_partitions {
        publish(&ctx.recorder, &*p.tc, &warning(
            "PartitionRemovalDeferred",
            format!("partitions {:?} left the spec but jobs or workers still use them: kept, DRAINed, until they are idle", parts.retained),
        )).await;
    }
    p.status.retained_partitions = parts.retained.clone();
    p.status.partitions = parts.partitions.iter().map(|p| p.name.clone()).collect();
    let cm = render::config_map(&p.tc, &parts, p.status.controller_endpoint.as_deref())?;
    p.config_hash = render::hash_of(&cm.data);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    configmaps
        .patch(
            &render::config_map_name(name),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(kube("apply ConfigMap"))?;
    Ok(Flow::Next)
}

/// The controller pod: recreated if lost, replaced when its config or certificate changes.
async fn controller_pod(p: &mut ClusterPass) -> StepResult {
    let (ctx, ns, name) = (&p.ctx, &p.ns, &p.name);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let want = render::controller_pod(&p.tc, &p.config_hash, &p.cert_id)?;
    let want_hash = want.annotations().get(TEMPLATE_HASH).cloned();
    let have = ctx.pod_store.state().into_iter().find(|pod| {
        pod.namespace().as_deref() == Some(ns)
            && pod.name_any() == render::controller_pod_name(name)
    });
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
                render::controller_pod_name(name),
                render::pvc_name(name)
            );
            publish(&ctx.recorder, &*p.tc, &normal("ControllerPodCreated", note)).await;
            p.waiting.push("controller pod starting".into());
        }
        Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
            p.waiting.push("controller pod restarting".into())
        }
        Some(pod) if pod.annotations().get(TEMPLATE_HASH) != want_hash.as_ref() => {
            let note = "the controller's config or certificate changed: restarting it (running jobs keep running)";
            publish(
                &ctx.recorder,
                &*p.tc,
                &normal("ControllerRestart", note.into()),
            )
            .await;
            pods.delete(&pod.name_any(), &DeleteParams::default())
                .await
                .map_err(kube("delete controller Pod"))?;
            p.waiting
                .push("controller pod restarting for a new config".into());
        }
        Some(pod) => {
            p.controller_ready = pod_ready(&pod);
            if !p.controller_ready {
                p.waiting.push("controller pod not ready".into());
            }
        }
    }
    Ok(Flow::Next)
}

/// Accounts, users and QOS (only those the spec names), once the controller is ready. A
/// refused change is a problem of the status, not a failed step.
async fn accounting(p: &mut ClusterPass) -> StepResult {
    if !p.controller_ready {
        return Ok(Flow::Next);
    }
    match &p.batch {
        Ok(b) => match b.accounting().await {
            Ok(current) => {
                let (changes, managed) = accounting::diff(&p.tc.spec, &current, &p.old.managed);
                let mut ok = true;
                for c in &changes {
                    if let Err(e) = b.apply(c).await {
                        p.problems.push(format!("accounting change failed: {e}"));
                        ok = false;
                        break;
                    }
                }
                if ok {
                    p.status.managed = managed;
                }
            }
            Err(e) => p.problems.push(format!("controller unreachable: {e}")),
        },
        Err(e) => p.problems.push(format!("controller unreachable: {e}")),
    }
    Ok(Flow::Next)
}

/// The node counts, once the controller is ready (kept as they were when it does not
/// answer).
async fn node_counts(p: &mut ClusterPass) -> StepResult {
    if p.controller_ready
        && let Ok(b) = &p.batch
        && let Ok(batch_nodes) = b.nodes(&[]).await
    {
        p.status.nodes = crate::status::cluster_counts(&batch_nodes);
    }
    Ok(Flow::Next)
}

/// The conditions, and the status patched if it changed.
async fn status(p: &mut ClusterPass) -> StepResult {
    let (gen_, old) = (p.gen_, &p.old);
    if !p.status.retained_partitions.is_empty() {
        p.waiting.push(format!(
            "partitions {:?} kept until no job uses them",
            p.status.retained_partitions
        ));
    }
    let (waiting, problems) = (&p.waiting, &p.problems);
    let ready = p.controller_ready && problems.is_empty();
    p.status.conditions = vec![
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
    patch_cluster_status(&p.clusters, &p.name, old, &p.status).await?;
    // Settled, it is still looked at every refresh period: the node counts change with no
    // watch event (patched only when they differ).
    let refresh = p.ctx.refresh;
    Ok(Flow::Done(if ready && waiting.is_empty() {
        Requeue::requeue(refresh)
    } else {
        Requeue::requeue(refresh.min(Duration::from_secs(5)))
    }))
}

/// `HOST:PORT`, bracketing an IPv6 host (a dual-stack Service's clusterIP may be one).
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

pub(crate) async fn patch_cluster_status(
    clusters: &Api<TandemCluster>,
    name: &str,
    old: &TandemClusterStatus,
    new: &TandemClusterStatus,
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
