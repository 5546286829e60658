//! The GPU holders' API calls, off the loop ([`crate::holder`] decides what they are):
//! listing a cluster's holders, creating and deleting them, and draining a node whose
//! holder the kubelet refused. Holders live in one namespace, where the chart's Role lets
//! the bridge create pods.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{debug, info, warn};

use crate::batch::BatchAlloc;

/// The holders of `cluster` in `namespace`; `None` when they could not be listed (then no
/// GPU node is let into `kube` mode by this sync).
pub(super) async fn list(client: Client, namespace: &str, cluster: &str) -> Option<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let lp = ListParams::default().labels(&crate::holder::selector(cluster));
    match api.list(&lp).await {
        Ok(l) => Some(l.items),
        Err(e) => {
            warn!(error = %e, "listing the GPU holders; no GPU node turns kube this sync");
            None
        }
    }
}

/// Creates `pod` (a holder); one already there is fine.
pub(super) async fn create(client: Client, pod: Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, &ns);
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => info!(holder = %name, node = ?crate::holder::node_of(&pod), "GPU holder created"),
        Err(kube::Error::Api(e)) if e.code == 409 => debug!(holder = %name, "GPU holder exists"),
        Err(e) => {
            warn!(holder = %name, error = %e, "GPU holder not created; trying again next sync")
        }
    }
}

/// Deletes the holder `pod` (that object: its UID is a precondition), gracefully: the
/// kubelet stops its container and reports it before the object goes.
pub(super) async fn delete(client: Client, pod: Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => info!(holder = %name, "GPU holder deleted"),
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {
            debug!(holder = %name, "GPU holder already gone")
        }
        Err(e) => {
            warn!(holder = %name, error = %e, "GPU holder not deleted; trying again next sync")
        }
    }
}

/// Drains `node` in the controller with `reason` and says so in a Warning Event on the
/// Node; on success the holder's UID is recorded in `drained`, so it is done once.
pub(super) async fn drain<B: BatchAlloc>(
    batch: Arc<B>,
    recorder: Recorder,
    drained: Arc<Mutex<HashSet<String>>>,
    node: String,
    node_ref: ObjectReference,
    holder_uid: String,
    reason: String,
) {
    match batch.drain(&node, &reason).await {
        Ok(()) => {
            warn!(node = %node, reason = %reason, "GPU holder refused: node drained");
            drained
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(holder_uid);
            let e = Event {
                type_: EventType::Warning,
                reason: "GPUHolderRefused".into(),
                note: Some(format!(
                    "Node {node} is in batch mode but its GPUs are held by something else; drained in the controller: {reason}"
                )),
                action: "Partitioning".into(),
                secondary: None,
            };
            if let Err(err) = recorder.publish(&e, &node_ref).await {
                debug!(error = %err, "event not recorded");
            }
        }
        Err(e) => {
            warn!(node = %node, error = %e, "draining a node whose GPU holder was refused; trying again next sync")
        }
    }
}
