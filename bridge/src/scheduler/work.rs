//! The scheduler loop's operations: what one decision writes (a placeholder submit, the
//! bindings, evictions, `Unschedulable` conditions, an end report) or reads (a group's
//! owner), run off the loop so that many groups' operations are in flight at once.
//!
//! The loop decides from its state, hands a [`Work`] over with everything it needs
//! (owned, so no operation borrows the loop), and gets an [`Outcome`] back to fold into
//! its state. The loop never starts a second operation on a group whose first is still in
//! flight; a group that changed meanwhile is decided again once its operation is done.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::Recorder;
use tracing::{debug, info, warn};

use super::{PlaceholderId, PodKey, Target};
use crate::apply;
use crate::batch::{BatchAlloc, BatchError};
use crate::decide::EndReason;
use crate::group::{GroupInfo, GroupKey, GroupKind, workload_ref};
use crate::policy::Resolved;
use crate::request;
use crate::resources::PodResources;

/// The clients an operation uses, cloned into each.
pub(super) struct Ctx<B> {
    pub client: Client,
    /// For evictions: a client that returns a PodDisruptionBudget's 429 at once.
    pub evict_client: Client,
    pub batch: Arc<B>,
    pub recorder: Recorder,
}

impl<B> Clone for Ctx<B> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            evict_client: self.evict_client.clone(),
            batch: self.batch.clone(),
            recorder: self.recorder.clone(),
        }
    }
}

/// Pods to tell why they wait, with what each was last told (written once per message).
pub(super) struct Tell {
    pub ns: String,
    pub pods: Vec<Pod>,
    pub told: HashMap<String, String>,
}

/// One operation, decided by the loop.
pub(super) enum Work {
    /// Read the group's owner object (Workload, PodGroup, JobSet, Job): its UID and size.
    /// The second field names the owner when the group's key does not (a LeaderWorkerSet's
    /// group key is a hash; its pods name the set).
    Lookup(GroupKey, Option<String>),
    /// Submit the group's placeholder (the partition's capacity is read first, cached).
    Submit(Box<Submit>),
    Tell {
        tell: Tell,
        message: String,
    },
    /// Bind every pod to its node (all were decided at once).
    Bind {
        ns: String,
        job_id: u64,
        bindings: Vec<(String, String)>,
        /// The pods, for their `Scheduled` Events.
        pods: Vec<Pod>,
    },
    /// Evict `names` through the Eviction API; delete `overdue` (pods whose evictions
    /// a PodDisruptionBudget refused for longer than the eviction timeout).
    Evict {
        ns: String,
        job_id: u64,
        names: Vec<String>,
        overdue: Vec<Pod>,
        why: EndReason,
        timeout_s: i64,
    },
    /// Report the pods gone, then release the finalizers of those that stopped.
    End {
        /// The group's namespace: the controller ends only its own placeholders.
        ns: String,
        job_id: u64,
        end_time: i64,
        release: Vec<Pod>,
    },
    /// Report the group's pods gone from `nodes` (asked back), then release the
    /// finalizers of the pods that stopped.
    ReleaseNodes {
        ns: String,
        job_id: u64,
        nodes: Vec<String>,
        end_time: i64,
        release: Vec<Pod>,
    },
    /// Remove the slot finalizer of pods that stopped (their slots are free).
    Release(Vec<Pod>),
}

pub(super) struct Submit {
    pub key: GroupKey,
    pub uid: String,
    pub info: GroupInfo,
    pub res: Vec<PodResources>,
    pub settings: Resolved,
    /// Nodes the pods may not run on.
    pub exclude: Vec<String>,
    /// The waiting pods, told why when the controller refuses the request.
    pub waiting: Tell,
}

/// What an operation did, for the loop's state.
pub(super) struct Outcome {
    pub target: Target,
    /// A [`Work::Lookup`]'s answer: the owner, `None` when absent or unreadable.
    pub owner: Option<(GroupKey, Option<serde_json::Value>)>,
    /// A placeholder submitted: (its key, job id).
    pub submitted: Option<(PlaceholderId, u64)>,
    /// `Unschedulable` written: (pod, message).
    pub told: Vec<(PodKey, String)>,
    /// Pods bound: (pod, node).
    pub bound: Vec<(PodKey, String)>,
    /// Pods whose eviction a PodDisruptionBudget refused.
    pub refused: Vec<PodKey>,
    /// The placeholder this operation ended (the controller took the end report).
    pub ended: Option<u64>,
    /// Nodes the controller took back from a placeholder: (job id, nodes).
    pub released: Option<(u64, Vec<String>)>,
    /// Why the target must be decided again later (a failed call).
    pub retry: Option<String>,
}

impl Outcome {
    fn new(target: Target) -> Self {
        Self {
            target,
            owner: None,
            submitted: None,
            told: Vec::new(),
            bound: Vec::new(),
            refused: Vec::new(),
            ended: None,
            released: None,
            retry: None,
        }
    }
}

/// Runs `work` for `target`.
pub(super) async fn perform<B: BatchAlloc>(ctx: Ctx<B>, target: Target, work: Work) -> Outcome {
    let mut out = Outcome::new(target);
    match work {
        Work::Lookup(k, name) => {
            let owner = owner(&ctx.client, &k, name.as_deref()).await;
            out.owner = Some((k, owner));
        }
        Work::Submit(s) => submit(&ctx, &mut out, *s).await,
        Work::Tell { tell: t, message } => out.told = tell(&ctx, t, &message).await,
        Work::Bind {
            ns,
            job_id,
            bindings,
            pods,
        } => bind(&ctx, &mut out, &ns, job_id, &bindings, pods).await,
        Work::Evict {
            ns,
            job_id,
            names,
            overdue,
            why,
            timeout_s,
        } => {
            let calls = names.iter().map(|name| {
                let client = ctx.evict_client.clone();
                let ns = ns.as_str();
                async move { (name, apply::evict(&client, ns, name).await) }
            });
            for (name, r) in futures::future::join_all(calls).await {
                match r {
                    Ok(()) => info!(job_id, pod = %name, why = ?why, "evicted"),
                    Err(e) if apply::refused_by_budget(&e) => {
                        info!(job_id, pod = %name, "eviction refused by a PodDisruptionBudget; retrying with backoff");
                        out.refused.push((ns.clone(), name.clone()));
                        out.retry = Some("eviction refused".into());
                    }
                    Err(e) => {
                        warn!(job_id, pod = %name, error = %e, "eviction failed; retrying");
                        out.retry = Some("eviction failed".into());
                    }
                }
            }
            for p in &overdue {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                let what = if why == EndReason::NodeReleased {
                    "asks back this pod's node (drained or lost)".to_owned()
                } else {
                    format!("is over ({why:?})")
                };
                let note = format!(
                    "Placeholder job {job_id} {what} and a PodDisruptionBudget refused this pod's eviction for {timeout_s} s (--eviction-timeout): deleting it"
                );
                match apply::delete_overdue(&ctx.client, &ctx.recorder, p, note).await {
                    Ok(()) => {
                        warn!(job_id, pod = %name, why = ?why, "eviction deadline passed; pod deleted")
                    }
                    Err(e) => {
                        warn!(job_id, pod = %name, error = %e, "deleting an overdue pod failed; retrying");
                        out.retry = Some("delete failed".into());
                    }
                }
            }
        }
        Work::End {
            ns,
            job_id,
            end_time,
            release: stopped,
        } => match ctx.batch.end(job_id, end_time, &ns).await {
            Ok(()) => {
                info!(job_id, end_time, "placeholder ended: its pods are gone");
                out.ended = Some(job_id);
                release(&ctx, &mut out, &stopped).await;
            }
            Err(e) => out.retry = Some(e.to_string()),
        },
        Work::ReleaseNodes {
            ns,
            job_id,
            nodes,
            end_time,
            release: stopped,
        } => match ctx.batch.release_nodes(job_id, &nodes, end_time, &ns).await {
            Ok(held) => {
                info!(job_id, released = ?nodes, still_held = ?held, "nodes asked back are released: the group's pods there are gone");
                out.released = Some((job_id, nodes));
                release(&ctx, &mut out, &stopped).await;
            }
            Err(e) => out.retry = Some(e.to_string()),
        },
        Work::Release(stopped) => release(&ctx, &mut out, &stopped).await,
    }
    out
}

/// Removes the slot finalizer of each pod in `stopped`; a failure is retried.
async fn release<B>(ctx: &Ctx<B>, out: &mut Outcome, stopped: &[Pod]) {
    let calls = stopped.iter().map(|p| apply::release(&ctx.client, p));
    for (p, r) in stopped.iter().zip(futures::future::join_all(calls).await) {
        let name = p.metadata.name.as_deref().unwrap_or_default();
        match r {
            Ok(()) => debug!(pod = %name, "slot released"),
            Err(e) => {
                warn!(pod = %name, error = %e, "releasing the pod's slot finalizer failed; retrying");
                out.retry = Some("finalizer not released".into());
            }
        }
    }
}

async fn submit<B: BatchAlloc>(ctx: &Ctx<B>, out: &mut Outcome, s: Submit) {
    let Submit {
        key: k,
        uid,
        info,
        res,
        settings,
        exclude,
        waiting,
    } = s;
    let caps = match ctx
        .batch
        .caps(settings.partition.as_deref().unwrap_or(""))
        .await
    {
        Ok(c) => c,
        Err(e) => {
            out.told = tell(ctx, waiting, &e.to_string()).await;
            return;
        }
    };
    let placeholder = match request::placeholder(&uid, &info, &res, settings, caps) {
        Ok(p) => request::Placeholder { exclude, ..p },
        Err(e) => {
            out.told = tell(ctx, waiting, &e.to_string()).await;
            return;
        }
    };
    match ctx.batch.submit(&placeholder).await {
        Ok(job_id) => {
            info!(job_id, group = ?k, pods = placeholder.pods, nodes = placeholder.nodes, "placeholder submitted");
            out.submitted = Some((PlaceholderId::new(&k.namespace, &uid), job_id));
        }
        Err(BatchError::Call { status, .. }) if status.code() == tonic::Code::InvalidArgument => {
            out.told = tell(ctx, waiting, status.message()).await;
        }
        Err(e) => out.retry = Some(e.to_string()),
    }
}

/// Writes `Unschedulable` with `message` on the pods not already told so; the pods
/// written.
async fn tell<B>(ctx: &Ctx<B>, t: Tell, message: &str) -> Vec<(PodKey, String)> {
    let pods: Vec<&Pod> = t
        .pods
        .iter()
        .filter(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            t.told.get(name).is_none_or(|m| m != message)
        })
        .collect();
    let calls = pods.iter().map(|p| {
        let name = p.metadata.name.clone().unwrap_or_default();
        let (client, ns) = (ctx.client.clone(), t.ns.as_str());
        async move {
            match apply::unschedulable(&client, ns, &name, message).await {
                Ok(()) => {
                    apply::event(
                        &ctx.recorder,
                        p,
                        true,
                        "FailedScheduling",
                        message.to_owned(),
                    )
                    .await;
                    Some(((ns.to_owned(), name), message.to_owned()))
                }
                Err(e) => {
                    debug!(pod = %name, error = %e, "PodScheduled not written");
                    None
                }
            }
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}

async fn bind<B>(
    ctx: &Ctx<B>,
    out: &mut Outcome,
    ns: &str,
    job_id: u64,
    bindings: &[(String, String)],
    pods: Vec<Pod>,
) {
    let mut pods: HashMap<String, Pod> = pods
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), p))
        .collect();
    let calls = bindings.iter().map(|(pod, node)| {
        let client = ctx.client.clone();
        let obj = pods.get(pod);
        async move {
            // The finalizer first: a pod bound without it could vanish (a force delete)
            // while its containers still run, and its slot would look free.
            let protected = match obj {
                Some(p) => apply::protect(&client, p).await,
                None => Ok(()),
            };
            let r = match protected {
                Ok(()) => apply::bind(&client, ns, pod, node, job_id).await,
                Err(e) => Err(e),
            };
            (pod, node, r)
        }
    });
    let results = futures::future::join_all(calls).await;
    for (pod, node, r) in results {
        match r {
            Ok(()) => {
                out.bound.push(((ns.to_owned(), pod.clone()), node.clone()));
                if let Some(p) = pods.remove(pod) {
                    let note = format!("Successfully assigned {ns}/{pod} to {node}");
                    // Best effort, off the operation: waiting for each Event's write before
                    // the group counts as bound halved the bind rate (bridge_scale bench).
                    let recorder = ctx.recorder.clone();
                    tokio::spawn(async move {
                        apply::event(&recorder, &p, false, "Scheduled", note).await;
                    });
                }
            }
            Err(e) => {
                warn!(job_id, pod = %pod, node = %node, error = %e, "binding failed; retrying");
                out.retry = Some("binding failed".into());
            }
        }
    }
}

/// The Workload, PodGroup, JobSet or Job behind a group, as JSON; `None` when absent or
/// unreadable (a cluster without the Workload API answers 404: its pods wait, told why).
async fn owner(client: &Client, k: &GroupKey, named: Option<&str>) -> Option<serde_json::Value> {
    let (group, version, kind, plural) = match k.kind {
        GroupKind::Workload => ("scheduling.k8s.io", "v1alpha1", "Workload", "workloads"),
        GroupKind::PodGroup => ("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups"),
        GroupKind::JobSet => ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
        GroupKind::IndexedJob => ("batch", "v1", "Job", "jobs"),
        GroupKind::LeaderWorkerSet => (
            "leaderworkerset.x-k8s.io",
            "v1",
            "LeaderWorkerSet",
            "leaderworkersets",
        ),
        GroupKind::Pod => return None,
    };
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    };
    let name = named.unwrap_or_else(|| workload_ref(k).map_or(k.name.as_str(), |r| r.workload));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &k.namespace, &ar);
    match api.get_opt(name).await {
        Ok(Some(o)) => serde_json::to_value(o).ok(),
        Ok(None) => None,
        Err(e) => {
            debug!(group = ?k, error = %e, "owner lookup failed");
            None
        }
    }
}
