//! Keeping Node mode labels and pool taints in step with the controller, off the loop.
//!
//! Reading the controller's node list (hundreds of nodes) and patching the Nodes that
//! differ takes tens of milliseconds; awaited on the loop, it held every pod event that
//! arrived meanwhile, once a second, and those pods paid it in their latency. Here the read
//! and the patches are operations like a group's: the loop starts a read, plans the patches
//! from what it returns (pure, in [`crate::nodes`]) and folds the patched Nodes back in.
//! At most one sync runs at a time.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::LocalBoxFuture;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{debug, info, warn};

use crate::batch::{BatchAlloc, BatchError};
use crate::nodes::{self, Mode, Plan};

/// How many Node patches of one sync are in flight at once.
const PATCHES_IN_FLIGHT: usize = 16;

/// One step of a sync, for the loop.
pub(super) enum Step {
    /// The controller's nodes and their modes.
    Read(Result<HashMap<String, Option<Mode>>, BatchError>),
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

/// Reads the controller's node modes.
pub(super) fn read<B: BatchAlloc + 'static>(batch: Arc<B>) -> LocalBoxFuture<'static, Step> {
    Box::pin(async move { Step::Read(batch.modes().await) })
}

/// Writes `patches`, a `ModeChanged` Event for each flip.
pub(super) fn write(
    client: Client,
    recorder: Recorder,
    patches: Vec<NodePatch>,
) -> LocalBoxFuture<'static, Step> {
    Box::pin(async move {
        let api: Api<Node> = Api::all(client);
        let done = futures::stream::iter(patches)
            .map(|p| {
                let api = api.clone();
                let recorder = recorder.clone();
                async move { write_one(&api, &recorder, p).await }
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
