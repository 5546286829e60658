//! Keeping Node mode labels and pool taints in step with the controller, off the loop, and
//! the GPU holders ([`crate::holder`]) with them.
//!
//! Reading the controller's node list (hundreds of nodes) and patching the Nodes that
//! differ takes tens of milliseconds; awaited on the loop, it held every pod event that
//! arrived meanwhile, once a second, and those pods paid it in their latency. Here the read
//! and the patches are operations like a group's: the loop starts a read, plans the patches
//! from what it returns (pure, in [`crate::nodes`] and [`crate::holder`]) and folds the
//! patched Nodes back in. At most one sync runs at a time.
//!
//! The read also lists the GPU holders. A GPU node's patch to `kube` is held until its
//! holder is reported stopped (the sync then comes again each tick); a patch to `batch` is
//! followed by the holder's creation; [`Holders::unbindable`] is what the scheduler asks
//! before it binds a pod to a node.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use futures::future::LocalBoxFuture;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{debug, info, warn};

use crate::batch::{BatchAlloc, BatchError};
use crate::holder;
use crate::nodes::{self, Controller, Mode, Plan};

mod holders;

/// How many Node patches of one sync are in flight at once.
const PATCHES_IN_FLIGHT: usize = 16;

/// One step of a sync, for the loop.
pub(super) enum Step {
    /// The controller's nodes and their modes, and the GPU holders as listed (`None`: not
    /// listed, or holders are off).
    Read(
        Result<HashMap<String, Option<Mode>>, BatchError>,
        Option<Vec<Pod>>,
    ),
    /// Nodes written, as the API server returned them.
    Patched(Vec<(String, Node)>),
}

/// A Node write planned by the loop, owned so that it runs off the loop.
pub(super) struct NodePatch {
    name: String,
    patch: json_patch::Patch,
    node_ref: ObjectReference,
    plan: Plan,
}

impl NodePatch {
    /// The write that applies `plan` to `node`, guarded by its observed resourceVersion.
    pub(super) fn new(name: &str, node: &Node, plan: Plan) -> Option<Self> {
        use kube::Resource as _;
        let ops = nodes::json_patch(node, &plan);
        match serde_json::from_value(ops) {
            Ok(patch) => Some(Self {
                name: name.to_owned(),
                patch,
                node_ref: node.object_ref(&()),
                plan,
            }),
            Err(e) => {
                warn!(node = %name, error = %e, "node patch not built");
                None
            }
        }
    }
}

/// What the GPU holders need from the configuration.
#[derive(Debug, Clone)]
pub(super) struct HolderConfig {
    /// The holder's image (`--gpu-holder-image`); `None`: no holders (and binds wait only
    /// for the `kube` write).
    pub image: Option<String>,
    /// Where holders live: the cluster namespace.
    pub namespace: String,
    pub cluster: String,
    /// [`crate::decide::vanish_deadline`]'s margin, for a holder gone unreported.
    pub margin_s: i64,
}

/// The GPU holders as the mode sync knows them.
pub(super) struct Holders {
    cfg: HolderConfig,
    /// Holders as last listed, by node.
    listed: HashMap<String, Pod>,
    /// Nodes looked at since this bridge started.
    looked: HashSet<String>,
    memory: HashMap<String, holder::Memory>,
    /// Whether each node's holder has released its GPUs, as the last sync judged.
    released: HashMap<String, bool>,
    /// Holders (by UID) whose refusal drained their node; written by the drain itself.
    drained: Arc<Mutex<HashSet<String>>>,
    /// The TandemCluster, the holders' owner, while it exists: none is made without it.
    owner: Option<OwnerReference>,
}

/// What one sync writes, and whether another should come soon.
pub(super) struct Sync {
    pub ops: Vec<Op>,
    /// A holder is being deleted or a flip waits for one: read again at the next tick.
    pub waiting: bool,
}

/// One write of a sync.
pub(super) enum Op {
    /// A Node patch, then (a flip to `batch`) the holder's creation.
    Patch(Box<NodePatch>, Option<Box<Pod>>),
    Create(Box<Pod>),
    Delete(Box<Pod>),
    Drain {
        node: String,
        node_ref: Box<ObjectReference>,
        holder_uid: String,
        reason: String,
    },
}

impl Holders {
    pub(super) fn new(cfg: HolderConfig) -> Self {
        Self {
            cfg,
            listed: HashMap::new(),
            looked: HashSet::new(),
            memory: HashMap::new(),
            released: HashMap::new(),
            drained: Arc::default(),
            owner: None,
        }
    }

    /// Reads the controller's node modes, and lists the holders.
    pub(super) fn read<B: BatchAlloc + 'static>(
        &self,
        batch: Arc<B>,
        client: Client,
    ) -> LocalBoxFuture<'static, Step> {
        let (on, ns, cluster) = (
            self.cfg.image.is_some(),
            self.cfg.namespace.clone(),
            self.cfg.cluster.clone(),
        );
        Box::pin(async move {
            let modes = batch.modes().await;
            let listed = if on && modes.is_ok() {
                holders::list(client, &ns, &cluster).await
            } else {
                None
            };
            Step::Read(modes, listed)
        })
    }

    /// The writes that bring the Nodes (and their holders) in step with `views`, the
    /// controller's view of each. `listed`: the holders as just listed.
    pub(super) fn sync(
        &mut self,
        node_objs: &HashMap<String, Node>,
        views: &HashMap<String, Controller>,
        listed: Option<Vec<Pod>>,
        now: i64,
    ) -> Sync {
        let cluster = self.cfg.cluster.clone();
        let mut names: Vec<&String> = node_objs.keys().collect();
        names.sort();
        let mut ops = Vec::new();
        let mut waiting = false;
        let Some(image) = self.cfg.image.clone() else {
            for name in names {
                let (Some(n), Some(v)) = (node_objs.get(name), views.get(name)) else {
                    continue;
                };
                if let Some(p) =
                    nodes::plan(n, *v, &cluster).and_then(|p| NodePatch::new(name, n, p))
                {
                    ops.push(Op::Patch(Box::new(p), None));
                }
            }
            return Sync { ops, waiting };
        };
        let owner = self.owner.clone();
        let spec = owner.as_ref().map(|owner| holder::Spec {
            cluster: &cluster,
            namespace: &self.cfg.namespace,
            image: &image,
            owner,
        });
        let ok = listed.is_some();
        let mut now_listed: HashMap<String, Pod> = HashMap::new();
        for p in listed.into_iter().flatten() {
            if let Some(node) = holder::node_of(&p) {
                now_listed.insert(node.to_owned(), p);
            }
        }
        if ok {
            for name in &names {
                let first = self.looked.insert((*name).clone());
                let m = self.memory.get(*name).cloned().unwrap_or_default();
                let m = holder::remember(
                    &m,
                    first,
                    self.listed.get(*name),
                    now_listed.get(*name),
                    self.cfg.margin_s,
                    now,
                );
                self.memory.insert((*name).clone(), m);
            }
            // Holders of Nodes that are gone: nothing to hold.
            for (node, p) in &now_listed {
                if !node_objs.contains_key(node) && p.metadata.deletion_timestamp.is_none() {
                    ops.push(Op::Delete(Box::new(p.clone())));
                }
            }
            self.listed = now_listed;
        }
        let drained = self
            .drained
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for name in names {
            let (Some(n), Some(view)) = (node_objs.get(name), views.get(name).copied()) else {
                continue;
            };
            let node_plan = nodes::plan(n, view, &cluster);
            if !ok {
                // Holders unknown: no GPU node turns kube, nothing else changes.
                let gpus = holder::node_gpus(n) > 0;
                self.released.insert(name.clone(), !gpus);
                let to_kube = view == Controller::Pool(Mode::Kube);
                if let Some(p) = node_plan
                    && !(gpus && to_kube)
                    && let Some(p) = NodePatch::new(name, n, p)
                {
                    ops.push(Op::Patch(Box::new(p), None));
                }
                waiting |= gpus && to_kube;
                continue;
            }
            let h = self.listed.get(name);
            let uid_drained = h
                .and_then(|h| h.metadata.uid.as_ref())
                .is_some_and(|u| drained.contains(u));
            let m = self.memory.get(name).cloned().unwrap_or_default();
            let hp = holder::plan(n, view, h, &m, uid_drained, &cluster, now);
            self.released.insert(name.clone(), hp.released);
            waiting |= hp.waiting;
            if hp.delete
                && let Some(h) = h
            {
                ops.push(Op::Delete(Box::new(h.clone())));
            }
            if let (Some(gpus), Some(spec)) = (hp.create, &spec) {
                ops.push(Op::Create(Box::new(holder::pod(spec, name, gpus))));
            }
            if let (Some(st), Some(h)) = (&hp.drain, h) {
                use kube::Resource as _;
                ops.push(Op::Drain {
                    node: name.clone(),
                    node_ref: Box::new(n.object_ref(&())),
                    holder_uid: h.metadata.uid.clone().unwrap_or_default(),
                    reason: holder::drain_reason(st),
                });
            }
            let Some(p) = node_plan else { continue };
            if view == Controller::Pool(Mode::Kube) && !hp.released {
                debug!(node = %name, "kube mode waits for the GPU holder to stop");
                continue;
            }
            let gpus = holder::node_gpus(n);
            let create = spec
                .as_ref()
                .filter(|_| view == Controller::Pool(Mode::Batch) && gpus > 0 && h.is_none())
                .map(|spec| Box::new(holder::pod(spec, name, gpus)));
            if let Some(p) = NodePatch::new(name, n, p) {
                ops.push(Op::Patch(Box::new(p), create));
            }
        }
        Sync { ops, waiting }
    }

    /// The TandemCluster as last seen (`None`: deleted, or not seen yet): the holders'
    /// owner. Holders are made only while it exists, so deleting it collects them all.
    pub(super) fn set_owner(&mut self, tc: Option<&kube::api::DynamicObject>) {
        self.owner = tc.and_then(|tc| {
            let types = tc.types.as_ref()?;
            Some(OwnerReference {
                api_version: types.api_version.clone(),
                kind: types.kind.clone(),
                name: tc.metadata.name.clone()?,
                uid: tc.metadata.uid.clone()?,
                ..OwnerReference::default()
            })
        });
    }

    /// Why a pod may not be bound to `node` yet ([`holder::unbindable`]).
    pub(super) fn unbindable(&self, node: &Node) -> Option<String> {
        let released = if self.cfg.image.is_none() {
            Some(true)
        } else {
            node.metadata
                .name
                .as_ref()
                .and_then(|n| self.released.get(n).copied())
        };
        holder::unbindable(node, released)
    }
}

/// Runs `ops`: Node patches (each with a `ModeChanged` Event for a flip, then its holder's
/// creation), holder creations and deletions, drains.
pub(super) fn write<B: BatchAlloc + 'static>(
    client: Client,
    recorder: Recorder,
    batch: Arc<B>,
    holders: &Holders,
    ops: Vec<Op>,
) -> LocalBoxFuture<'static, Step> {
    let drained = holders.drained.clone();
    Box::pin(async move {
        let api: Api<Node> = Api::all(client.clone());
        let done = futures::stream::iter(ops)
            .map(|op| {
                let (api, client, recorder) = (api.clone(), client.clone(), recorder.clone());
                let (batch, drained) = (batch.clone(), drained.clone());
                async move {
                    match op {
                        Op::Patch(p, create) => {
                            let patched = write_one(&api, &recorder, *p).await;
                            if let (Some(_), Some(pod)) = (&patched, create) {
                                holders::create(client, *pod).await;
                            }
                            patched
                        }
                        Op::Create(pod) => {
                            holders::create(client, *pod).await;
                            None
                        }
                        Op::Delete(pod) => {
                            holders::delete(client, *pod).await;
                            None
                        }
                        Op::Drain {
                            node,
                            node_ref,
                            holder_uid,
                            reason,
                        } => {
                            holders::drain(
                                batch, recorder, drained, node, *node_ref, holder_uid, reason,
                            )
                            .await;
                            None
                        }
                    }
                }
            })
            .buffer_unordered(PATCHES_IN_FLIGHT)
            .filter_map(futures::future::ready)
            .collect()
            .await;
        Step::Patched(done)
    })
}

async fn write_one(api: &Api<Node>, recorder: &Recorder, p: NodePatch) -> Option<(String, Node)> {
    match api
        .patch(
            &p.name,
            &PatchParams::default(),
            &Patch::Json::<()>(p.patch),
        )
        .await
    {
        Ok(patched) => {
            info!(node = %p.name, mode = ?p.plan.label, taint = p.plan.taints.is_some(), "node in step");
            if let Some((from, to)) = p.plan.flip {
                let e = Event {
                    type_: EventType::Normal,
                    reason: "ModeChanged".into(),
                    note: Some(nodes::flip_note(&p.name, from, to)),
                    action: "Partitioning".into(),
                    secondary: None,
                };
                if let Err(err) = recorder.publish(&e, &p.node_ref).await {
                    debug!(error = %err, "event not recorded");
                }
            }
            Some((p.name, patched))
        }
        // A concurrent writer (the resourceVersion test failed) or a refusal: the watch
        // event of that write, or the next resync, plans again from what is then observed
        // (never a retry per tick: no request storm).
        Err(e) => {
            warn!(node = %p.name, error = %e, "node patch refused; planning again");
            None
        }
    }
}
