//! Events: a [`plan::Event`] (the pure parts' words) published through kube's recorder on
//! the object it is about, and the two constructors the reconcilers use.
//!
//! Its own module because every reconciler and the step runner publish, and because an
//! Event that cannot be recorded is logged, never an error of the pass.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event as KEvent, EventType as KEventType, Recorder};
use tracing::warn;

use crate::plan;

pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    obj: &K,
    ev: &plan::Event,
) {
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

pub fn warning(reason: &'static str, note: String) -> plan::Event {
    plan::Event {
        type_: plan::EventType::Warning,
        reason,
        note,
        related: None,
    }
}

pub fn normal(reason: &'static str, note: String) -> plan::Event {
    plan::Event {
        type_: plan::EventType::Normal,
        reason,
        note,
        related: None,
    }
}
