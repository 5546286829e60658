//! The LoginSet reconciler: login pods by index, replaced when their template changes, and
//! the set's status, as the named steps of [`STEPS`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use serde_json::json;

use super::*;
use crate::crd::{LoginSet, LoginSetStatus, TandemCluster};
use crate::labels::*;
use crate::render;

/// The steps of a LoginSet pass, in order.
pub(crate) const STEPS: &[Step<LoginSetPass>] = &[
    step!(LoginSetPass, "cluster", cluster),
    step!(LoginSetPass, "pods", pods),
    step!(LoginSetPass, "status", status),
];

/// The state of one LoginSet pass.
pub(crate) struct LoginSetPass {
    ctx: Arc<Context>,
    ls: Arc<LoginSet>,
    ns: String,
    name: String,
    /// Its cluster, if there is one (`cluster`).
    tc: Option<TandemCluster>,
    /// Its pods, from the pod store (`pods`).
    mine: Vec<Arc<Pod>>,
}

pub(crate) async fn reconcile_loginset(
    ls: Arc<LoginSet>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let mut pass = LoginSetPass {
        ns: ls.namespace().unwrap_or_default(),
        name: ls.name_any(),
        ctx: ctx.clone(),
        ls: ls.clone(),
        tc: None,
        mine: Vec::new(),
    };
    run_steps(STEPS, &mut pass, &ctx, &*ls).await
}

/// The set's cluster, for its image; the pods are made without one too.
async fn cluster(p: &mut LoginSetPass) -> StepResult {
    let clusters: Api<TandemCluster> = Api::namespaced(p.ctx.client.clone(), &p.ns);
    p.tc = clusters
        .get_opt(&p.ls.spec.cluster_name)
        .await
        .map_err(kube("read TandemCluster"))?;
    Ok(Flow::Next)
}

/// One pod per index: made when missing, replaced when its template changed, and those
/// past the replica count deleted.
async fn pods(p: &mut LoginSetPass) -> StepResult {
    let (ctx, ls, ns, name) = (&p.ctx, &p.ls, &p.ns, &p.name);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let image = p.tc.as_ref().and_then(|t| t.spec.image.clone());
    p.mine = ctx
        .pod_store
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns) && p.labels().get(LOGIN_SET) == Some(name))
        .collect();
    let mine = &p.mine;
    let want = u32::try_from(ls.spec.replicas).unwrap_or(0);
    for i in 0..want {
        let pod = render::login_pod(ls, i, image.as_deref())?;
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
    for p in mine {
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
    Ok(Flow::Next)
}

/// The counts and the Ready condition, patched if they changed.
async fn status(p: &mut LoginSetPass) -> StepResult {
    let (ls, name, mine, tc) = (&p.ls, &p.name, &p.mine, &p.tc);
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
        let logins: Api<LoginSet> = Api::namespaced(p.ctx.client.clone(), &p.ns);
        logins
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .map_err(kube("patch LoginSet status"))?;
    }
    // The pods are read from the shared pod store, whose watch may not yet have applied the
    // event that triggered this pass (a pod turning ready): look again soon until every pod
    // is ready, as the cluster's reconcile does, or the status could stay behind for good.
    Ok(Flow::Done(if tc.is_some() && ready == ls.spec.replicas {
        Requeue::requeue(Duration::from_secs(300))
    } else {
        Requeue::requeue(Duration::from_secs(2))
    }))
}
