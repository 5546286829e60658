//! The TandemCluster reconciler: the cluster's own objects (key, CA and controller TLS
//! Secrets, Service, PVC, ConfigMap, controller pod), its accounting and its status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use serde_json::json;
use tandem_proto::tls::ca::ClusterCa;

use super::*;
use crate::crd::TandemCluster;
use crate::events::{normal, publish, warning};
use crate::labels::*;
use crate::secrets::{ca_of, hex, read_ca};
use crate::{accounting, defaults, partitions, render, validate};

pub(crate) async fn reconcile_cluster(
    tc: Arc<TandemCluster>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
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
            publish(&ctx.recorder, &*tc, &warning("InvalidSpec", msg.clone())).await;
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
                Err(kube::Error::Api(e)) if e.code == 409 => read_ca(&ctx.client, &ns, &name)
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
            &ctx.recorder,
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
        publish(&ctx.recorder, &*tc, &warning(
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
            publish(&ctx.recorder, &*tc, &normal("ControllerPodCreated", note)).await;
            waiting.push("controller pod starting".into());
        }
        Some(p) if p.metadata.deletion_timestamp.is_some() => {
            waiting.push("controller pod restarting".into())
        }
        Some(p) if p.annotations().get(TEMPLATE_HASH) != want_hash.as_ref() => {
            let note = "the controller's config or certificate changed: restarting it (running jobs keep running)";
            publish(
                &ctx.recorder,
                &*tc,
                &normal("ControllerRestart", note.into()),
            )
            .await;
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
