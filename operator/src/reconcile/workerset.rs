//! The WorkerSet reconciler: the finalizer, then one pass that observes the set's pods, the
//! Kubernetes nodes and the controller's nodes, asks [`plan::plan`] what to do, applies its
//! actions in order (step certificates, pods, drain marks, controller calls) and patches
//! the set's status, as the named steps of [`STEPS`]. Deleting runs the same pass until
//! every node is drained and removed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::finalizer;
use serde_json::json;
use tandem_net::tls::ca::ClusterCa;
use tracing::{info, warn};

use super::*;
use crate::connections::{Batch, with_batch};
use crate::crd::{TandemCluster, WorkerSet, WorkerSetStatus};
use crate::events::{publish, warning};
use crate::labels::*;
use crate::plan::{self, Action, DrainFor, Lookup, PodPhase, WorkerPod};
use crate::secrets::read_ca;
use crate::{defaults, render, validate};

/// The step of a pass that finds the set without the operator's finalizer.
const FINALIZER_STEPS: &[Step<WorkerSetPass>] = &[step!(WorkerSetPass, "finalizer", add_finalizer)];

/// The steps of a WorkerSet pass (applying or cleaning up), in order.
pub(crate) const STEPS: &[Step<WorkerSetPass>] = &[
    step!(WorkerSetPass, "cluster", cluster),
    step!(WorkerSetPass, "validate", validate),
    step!(WorkerSetPass, "observe", observe),
    step!(WorkerSetPass, "pool-toleration", pool_toleration),
    step!(WorkerSetPass, "plan", plan_pass),
    step!(WorkerSetPass, "apply", apply),
    step!(WorkerSetPass, "status", status),
];

/// The state of one WorkerSet pass: what the steps found and what the next ones need.
pub(crate) struct WorkerSetPass {
    ctx: Arc<Context>,
    ws: Arc<WorkerSet>,
    ns: String,
    name: String,
    sets: Api<WorkerSet>,
    pods: Api<Pod>,
    gen_: Option<i64>,
    old: WorkerSetStatus,
    status: WorkerSetStatus,
    /// The set is being deleted: every worker leaves.
    deleting: bool,
    /// Its cluster (`cluster`).
    tc: Option<TandemCluster>,
    /// Its pods (`observe`).
    mine: Vec<Arc<Pod>>,
    /// Eligible Kubernetes nodes with no worker on them (`observe`).
    free_nodes: Vec<String>,
    views: Vec<WorkerPod>,
    members: Vec<String>,
    batch: Result<Batch, String>,
    lookup: Lookup,
    template_hash: String,
    plan: plan::Plan,
    /// Read only when a pod is to be made (`plan`).
    ca: Result<Option<ClusterCa>, Error>,
    /// The action that failed (`apply`).
    failure: Option<String>,
    /// What the controller answered "not yet" to (`apply`).
    not_yet: Vec<String>,
}

impl WorkerSetPass {
    fn new(ws: Arc<WorkerSet>, ctx: Arc<Context>, deleting: bool) -> Self {
        let ns = ws.namespace().unwrap_or_default();
        let name = ws.name_any();
        let gen_ = ws.metadata.generation;
        let old = ws.status.clone().unwrap_or_default();
        let mut status = old.clone();
        status.observed_generation = gen_;
        status.selector = Some(render::worker_selector(&name));
        WorkerSetPass {
            sets: Api::namespaced(ctx.client.clone(), &ns),
            pods: Api::namespaced(ctx.client.clone(), &ns),
            ctx,
            ws,
            ns,
            name,
            gen_,
            old,
            status,
            deleting,
            tc: None,
            mine: Vec::new(),
            free_nodes: Vec::new(),
            views: Vec::new(),
            members: Vec::new(),
            batch: Err("not connected yet".into()),
            lookup: Lookup::Failed("not looked up yet".into()),
            template_hash: String::new(),
            plan: plan::Plan::default(),
            ca: Ok(None),
            failure: None,
            not_yet: Vec::new(),
        }
    }

    fn tc(&self) -> Result<&TandemCluster, Error> {
        cluster_of(&self.tc, &self.ws)
    }
}

/// The cluster the `cluster` step read (which ends the pass when there is none).
fn cluster_of<'a>(
    tc: &'a Option<TandemCluster>,
    ws: &WorkerSet,
) -> Result<&'a TandemCluster, Error> {
    tc.as_ref().ok_or_else(|| {
        Error::CleanupPending(format!(
            "TandemCluster {} not read yet",
            ws.spec.cluster_name
        ))
    })
}

pub(crate) async fn reconcile_workerset(
    ws: Arc<WorkerSet>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    if ws.metadata.deletion_timestamp.is_none() && !ws.finalizers().iter().any(|f| f == FINALIZER) {
        let mut pass = WorkerSetPass::new(ws.clone(), ctx.clone(), false);
        return run_steps(FINALIZER_STEPS, &mut pass, &ctx, &*ws).await;
    }
    let sets: Api<WorkerSet> =
        Api::namespaced(ctx.client.clone(), &ws.namespace().unwrap_or_default());
    finalizer::finalizer(&sets, FINALIZER, ws, |event| async {
        match event {
            finalizer::Event::Apply(ws) => sync_workerset(ws, ctx.clone(), false).await,
            finalizer::Event::Cleanup(ws) => sync_workerset(ws, ctx.clone(), true).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// One pass over the set's workers: [`STEPS`].
async fn sync_workerset(
    ws: Arc<WorkerSet>,
    ctx: Arc<Context>,
    deleting: bool,
) -> Result<Requeue, Error> {
    let mut pass = WorkerSetPass::new(ws.clone(), ctx.clone(), deleting);
    run_steps(STEPS, &mut pass, &ctx, &*ws).await
}

/// Adds the finalizer with a merge patch guarded by resourceVersion (a 409 retries):
/// kube's helper adds it with a JSON-patch `test` of the absent list, which the e2e
/// harness's server rejects; removal still goes through the helper.
async fn add_finalizer(p: &mut WorkerSetPass) -> StepResult {
    let ws = &p.ws;
    let mut finalizers = ws.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    p.sets
        .patch(
            &ws.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": ws.resource_version()}})),
        )
        .await
        .map_err(kube("add WorkerSet finalizer"))?;
    Ok(Flow::Done(Requeue::requeue(Duration::from_millis(100))))
}

pub(crate) fn worker_pod_view(p: &Pod) -> WorkerPod {
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

/// The set's cluster. Without one the set is Degraded; deleting, its pods just go: the
/// cluster (and its controller) is gone, so there is nothing to drain or remove.
async fn cluster(p: &mut WorkerSetPass) -> StepResult {
    let clusters: Api<TandemCluster> = Api::namespaced(p.ctx.client.clone(), &p.ns);
    p.tc = clusters
        .get_opt(&p.ws.spec.cluster_name)
        .await
        .map_err(kube("read TandemCluster"))?;
    if p.tc.is_some() {
        return Ok(Flow::Next);
    }
    if p.deleting {
        for pod in own_pods(&p.ctx, &p.ns, &p.name) {
            if pod.metadata.deletion_timestamp.is_none() {
                p.pods
                    .delete(&pod.name_any(), &DeleteParams::default())
                    .await
                    .map_err(kube("delete worker Pod"))?;
            }
        }
        return Ok(Flow::Done(Requeue::await_change()));
    }
    let msg = format!("TandemCluster {} not found", p.ws.spec.cluster_name);
    p.status.conditions = degraded(&p.old.conditions, p.gen_, "ClusterNotFound", msg);
    patch_set_status(&p.sets, &p.name, &p.old, &p.status).await?;
    Ok(Flow::Done(Requeue::requeue(Duration::from_secs(10))))
}

/// The spec against the cluster's (not when deleting). A bad spec changes nothing that
/// runs: the pass ends here with the set Degraded.
async fn validate(p: &mut WorkerSetPass) -> StepResult {
    if p.deleting {
        return Ok(Flow::Next);
    }
    let tc = p.tc()?;
    let problems = validate::worker_set(&p.ws.spec, &tc.spec);
    if problems.is_empty() {
        return Ok(Flow::Next);
    }
    let (ctx, ns, name, old, gen_) = (&p.ctx, &p.ns, &p.name, &p.old, p.gen_);
    let msg = problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    let msg = format!("{msg} (running workers are left as they are)");
    // Told once per problem: the pass repeats every refresh period.
    if !degraded_by(&old.conditions, &msg) {
        publish(&ctx.recorder, &*p.ws, &warning("InvalidSpec", msg.clone())).await;
    }
    // The running workers' node counts still follow the controller.
    if let Ok(b) = batch_for(ctx, ns, tc).await
        && let Ok(batch_nodes) = b.nodes(&[]).await
    {
        let views: Vec<WorkerPod> = own_pods(ctx, ns, name)
            .iter()
            .map(|p| worker_pod_view(p))
            .filter(|v| !v.terminating && v.phase != PodPhase::Ended)
            .collect();
        let by_name = batch_nodes
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect();
        crate::status::set_counts(views.iter().map(|v| v.node.as_str()), &by_name)
            .write(&mut p.status);
    }
    p.status.conditions = degraded(&old.conditions, gen_, "InvalidSpec", msg);
    patch_set_status(&p.sets, name, old, &p.status).await?;
    Ok(Flow::Done(Requeue::requeue(ctx.refresh)))
}

/// The set's pods, and the eligible Kubernetes nodes no worker is on.
async fn observe(p: &mut WorkerSetPass) -> StepResult {
    let ctx = &p.ctx;
    let all_pods = ctx.pod_store.state();
    p.mine = own_pods(ctx, &p.ns, &p.name);
    let occupied: std::collections::BTreeSet<String> = all_pods
        .iter()
        .filter(|p| p.labels().get(APP_COMPONENT).map(String::as_str) == Some(COMPONENT_WORKER))
        .filter_map(|p| Some(worker_pod_view(p).node).filter(|n| !n.is_empty()))
        .collect();
    p.free_nodes = eligible_worker_nodes(&ctx.node_store.state(), &p.ws.spec.template)
        .into_iter()
        .filter(|n| !occupied.contains(n))
        .collect();
    Ok(Flow::Next)
}

/// Worker pods made before they carried the pool toleration get it in place (tolerations
/// are the one list a running pod may grow): otherwise the batch-mode `NoExecute` taint
/// evicts them, and their nodes' running jobs with them. Best effort: a refusal is logged
/// and the rest of the pass goes on.
async fn pool_toleration(p: &mut WorkerSetPass) -> StepResult {
    let name = &p.name;
    for pod in &p.mine {
        if pod.metadata.deletion_timestamp.is_none() && !render::has_pool_toleration(pod) {
            let patch = render::pool_toleration_patch(pod);
            match p
                .pods
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await
            {
                Ok(_) => {
                    info!(workerset = %name, pod = %pod.name_any(), "added the pool toleration")
                }
                Err(e) => {
                    warn!(workerset = %name, pod = %pod.name_any(), error = %e, "could not add the pool toleration")
                }
            }
        }
    }
    Ok(Flow::Next)
}

/// The controller's view of the set's nodes, and [`plan::plan`]'s answer. The cluster CA is
/// read only when a pod is to be made: each new pod's step certificate is issued from it
/// just before the pod (see `render`'s module documentation).
async fn plan_pass(p: &mut WorkerSetPass) -> StepResult {
    let (ctx, ns, name, ws) = (&p.ctx, &p.ns, &p.name, &p.ws);
    let tc = cluster_of(&p.tc, ws)?;
    p.views = p.mine.iter().map(|p| worker_pod_view(p)).collect();
    p.members = p.old.members.clone();
    for v in &p.views {
        if !v.node.is_empty() && !p.members.contains(&v.node) {
            p.members.push(v.node.clone());
        }
    }
    let batch = batch_for(ctx, ns, tc).await;
    p.lookup = match &batch {
        Ok(b) => match b.nodes(&[]).await {
            Ok(batch_nodes) => Lookup::from_nodes(
                batch_nodes
                    .into_iter()
                    .filter(|n| p.members.contains(&n.name)),
            ),
            Err(e) => Lookup::Failed(e.to_string()),
        },
        Err(e) => Lookup::Failed(e.clone()),
    };
    let o = &ws.spec.template;
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
        deleting: p.deleting,
        set: format!("{ns}/{name}"),
    };
    let observed = plan::Observed {
        pods: p.views.clone(),
        nodes: p.lookup.clone(),
        members: p.members.clone(),
        free_nodes: std::mem::take(&mut p.free_nodes),
        now: now(),
    };
    p.plan = plan::plan(&desired, &observed);
    p.template_hash = desired.template_hash;
    p.batch = batch;
    p.ca = if p
        .plan
        .actions
        .iter()
        .any(|a| matches!(a, Action::CreatePod { .. }))
    {
        read_ca(&ctx.client, ns, &ws.spec.cluster_name).await
    } else {
        Ok(None)
    };
    Ok(Flow::Next)
}

/// The plan's actions, in order; the first failure stops the rest (retried next pass, and
/// told as a `StepFailed` Event naming the action), except what the controller answers
/// "not yet" to (see `plan::on_failure`): that is waited for. The plan's Events follow.
async fn apply(p: &mut WorkerSetPass) -> StepResult {
    let tc = p.tc()?.clone();
    let (ctx, ws, name, pods, batch, ca) = (&p.ctx, &*p.ws, &p.name, &p.pods, &p.batch, &p.ca);
    let members = &mut p.members;
    for a in &p.plan.actions {
        let r: Result<(), String> = match a {
            Action::CreatePod { node } => match (ca, render::worker_pod(ws, node, tc.spec.image.as_deref())) {
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
            Action::Drain { node, reason } => with_batch(batch, |b| async move { b.update_node(node, "DRAIN", reason).await.map_err(|e| e.to_string()) }).await,
            Action::Resume { node } => with_batch(batch, |b| async move { b.update_node(node, "RESUME", "").await.map_err(|e| e.to_string()) }).await,
            Action::Down { node, reason } => with_batch(batch, |b| async move { b.update_node(node, "DOWN", reason).await.map_err(|e| e.to_string()) }).await,
            Action::RemoveNode { node } => match batch {
                Ok(b) => match b.remove_node(node, false, "tandem-operator: worker pod gone").await {
                    Ok(()) => {
                        members.retain(|m| m != node);
                        Ok(())
                    }
                    Err(e) => match plan::on_failure(a, e.refused(), &e.detail()) {
                        plan::OnFailure::Wait(w) => {
                            info!(workerset = %name, node = %node, why = %e.detail(), "node removal refused for now; waiting");
                            p.not_yet.push(w);
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
            p.failure = Some(format!("{a:?}: {e}"));
            break;
        }
        if let Action::CreatePod { node } = a
            && !members.contains(node)
        {
            members.push(node.clone());
        }
    }
    for ev in &p.plan.events {
        publish(&ctx.recorder, ws, ev).await;
    }
    if let Some(f) = &p.failure {
        publish(&ctx.recorder, ws, &warning(STEP_FAILED, f.clone())).await;
    }
    Ok(Flow::Next)
}

/// The counts and conditions, and the status patched if it changed (not when deleting).
/// Deleting finishes only once every action went through (a removal refused or failed
/// leaves its node in the controller); until then the pass ends in
/// [`Error::CleanupPending`], which keeps the finalizer.
async fn status(p: &mut WorkerSetPass) -> StepResult {
    let (ws, name, old, gen_, plan) = (&p.ws, &p.name, &p.old, p.gen_, &p.plan);
    let status = &mut p.status;
    let live: Vec<&WorkerPod> = p
        .views
        .iter()
        .filter(|v| !v.terminating && v.phase != PodPhase::Ended)
        .collect();
    status.replicas = i32::try_from(live.len()).unwrap_or(i32::MAX);
    status.ready_replicas =
        i32::try_from(live.iter().filter(|v| plan::ready(v, &p.lookup)).count()).unwrap_or(0);
    status.updated_replicas = i32::try_from(
        live.iter()
            .filter(|v| v.template_hash == p.template_hash)
            .count(),
    )
    .unwrap_or(0);
    // Kept as they were when the controller does not answer.
    if let Lookup::Nodes(batch_nodes) = &p.lookup {
        crate::status::set_counts(live.iter().map(|v| v.node.as_str()), batch_nodes).write(status);
    }
    status.members = std::mem::take(&mut p.members);
    let failure = p.failure.clone();
    let finished = plan.finished && failure.is_none() && p.not_yet.is_empty();
    let mut problems = plan.problems.clone();
    problems.extend(failure);
    let mut waiting = plan.waiting.clone();
    waiting.extend(p.not_yet.iter().cloned());
    let ready = problems.is_empty()
        && waiting.is_empty()
        && status.ready_replicas == ws.spec.replicas
        && plan.actions.is_empty();
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
            !plan.actions.is_empty() || !waiting.is_empty(),
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
    if !p.deleting {
        patch_set_status(&p.sets, name, old, status).await?;
    }
    if p.deleting && finished {
        info!(workerset = %name, "worker set cleaned up");
        return Ok(Flow::Done(Requeue::await_change()));
    }
    if p.deleting && !finished {
        return Err(Error::CleanupPending(format!(
            "worker set {name} still has {} pod(s) or node(s) to clean up",
            p.views.len() + status.members.len()
        )));
    }
    let asked = if p.not_yet.is_empty() {
        plan.requeue_after_s
    } else {
        Some(
            plan.requeue_after_s
                .map_or(plan::DRAIN_POLL_S, |s| s.min(plan::DRAIN_POLL_S)),
        )
    };
    Ok(Flow::Done(Requeue::requeue(crate::status::next_look(
        asked,
        p.ctx.refresh,
    ))))
}

/// Issues the step-service certificate of `ws`'s pod on `node` (for the node name) into its
/// Secret: created, or rewritten if one is left from an earlier pod on that node. Afresh for
/// every pod, so each starts with a certificate valid for its full term.
pub(crate) async fn put_step_secret(
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

pub(crate) fn own_pods(ctx: &Context, ns: &str, set: &str) -> Vec<Arc<Pod>> {
    ctx.pod_store
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(ns)
                && p.labels().get(WORKER_SET).map(String::as_str) == Some(set)
        })
        .collect()
}

pub(crate) async fn patch_set_status(
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
}
