//! What a pod task writes to the API: its status after every change (a merge patch of
//! `status`), a rejected pod's failure, and Events as a kubelet's recorder writes them.
//! Apart from the task's logic because these are its only API writes besides removal.
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::Worker;
use crate::kubelet::admit::Rejection;
use crate::kubelet::status;

impl Worker {
    pub(super) async fn publish(&mut self) {
        let status = status::build(&self.pod, &self.runtime(), Timestamp::now());
        self.write_status(json!({ "status": status })).await;
        self.dirty = false;
    }

    async fn write_status(&mut self, patch: serde_json::Value) {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match pods
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(pod) => {
                if pod.metadata.uid.as_deref() == Some(self.uid.as_str()) {
                    self.pod = pod;
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => self.gone = true,
            Err(e) => tracing::warn!(error = %e, "writing pod status failed"),
        }
    }

    /// Fails a pod admission refused: the event first, then the status, as the kubelet's
    /// `rejectPod` does (so whoever sees the Failed pod finds the event too).
    pub(super) async fn reject(&mut self, r: Rejection) {
        tracing::info!(reason = %r.reason, message = %r.message, "pod rejected");
        if let Some(event) = self.event_object("Warning", &r.reason, &r.message, None) {
            let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                tracing::warn!(error = %e, "recording the rejection event failed");
            }
        }
        let qos = status::qos_class(&self.pod);
        let patch = json!({"status": {"phase": "Failed", "reason": r.reason, "message": r.message, "qosClass": qos}});
        self.write_status(patch).await;
    }

    /// Records an Event about the pod (or one of its containers), as the kubelet's event
    /// recorder does. The worker does not wait for it: events are best effort.
    pub(super) fn emit(&self, type_: &str, reason: &str, message: &str, container: Option<&str>) {
        let event = self.event_object(type_, reason, message, container);
        let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let reason = reason.to_owned();
        tokio::spawn(async move {
            let Some(event) = event else { return };
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                tracing::debug!(error = %e, %reason, "recording an event failed");
            }
        });
    }

    fn event_object(
        &self,
        type_: &str,
        reason: &str,
        message: &str,
        container: Option<&str>,
    ) -> Option<Event> {
        let now = Timestamp::now();
        let mut involved = json!({"apiVersion": "v1", "kind": "Pod", "name": self.name,
                                  "namespace": self.ns, "uid": self.uid});
        if let Some(c) = container {
            involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": format!("{}.{:x}", self.name, now.as_nanosecond()), "namespace": self.ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": self.ctx.node},
            "reportingComponent": "kubelet",
            "reportingInstance": self.ctx.node,
            "firstTimestamp": now.to_string(),
            "lastTimestamp": now.to_string(),
            "count": 1,
        }))
        .ok()
    }
}
