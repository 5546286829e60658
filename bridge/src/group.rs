//! Which pods are scheduled together, and how many members a group waits for.
//!
//! One group becomes one placeholder job, so a gang is placed all at once: a
//! scheduler-plugins PodGroup, a **whole JobSet** (all its replicated jobs together, where
//! slurm-bridge makes each pod its own job), a LeaderWorkerSet group (leader and workers),
//! an indexed Job's pods, or else a single pod. The most specific marker wins: a JobSet's
//! pods are also an indexed Job's pods, and a PodGroup label is the user's explicit word.

use k8s_openapi::api::core::v1::Pod;
use thiserror::Error;

use crate::labels::{
    JOB_COMPLETION_INDEX, JOB_NAME, JOBSET_NAME, LEGACY_JOB_NAME, LWS_GROUP_KEY, LWS_NAME,
    LWS_SIZE, POD_GROUP,
};

/// What kind of workload a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKind {
    PodGroup,
    JobSet,
    LeaderWorkerSet,
    IndexedJob,
    Pod,
}

/// A group's identity within the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub namespace: String,
    pub kind: GroupKind,
    /// The PodGroup, JobSet or Job name, the LWS group key, or the pod name.
    pub name: String,
}

/// How a group is shown in `squeue`: `namespace/owner`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    pub key: GroupKey,
    pub display: String,
    /// Members the group waits for before it is submitted, when the pods say
    /// (LeaderWorkerSet size, 1 for a lone pod). Others need their owner object: see
    /// [`expected_members`].
    pub size_hint: Option<u32>,
    /// Order of the pod within its group (completion index, LWS worker index), so
    /// bindings are stable: pod 0 lands on the first allocated node.
    pub rank: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GroupError {
    #[error("pod has no metadata.name or metadata.namespace")]
    Unnamed,
    #[error("{key}: {value:?} is not a whole number")]
    BadNumber { key: &'static str, value: String },
}

/// The group a pod belongs to.
pub fn group_of(pod: &Pod) -> Result<GroupInfo, GroupError> {
    let meta = &pod.metadata;
    let (Some(name), Some(ns)) = (meta.name.as_deref(), meta.namespace.as_deref()) else {
        return Err(GroupError::Unnamed);
    };
    let label = |k: &str| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(k))
            .map(String::as_str)
    };
    let annotation = |k: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let key = |kind, name: &str| GroupKey {
        namespace: ns.to_owned(),
        kind,
        name: name.to_owned(),
    };
    let completion_index = annotation(JOB_COMPLETION_INDEX)
        .or_else(|| label(JOB_COMPLETION_INDEX))
        .map(|v| number(JOB_COMPLETION_INDEX, v))
        .transpose()?;
    if let Some(g) = label(POD_GROUP) {
        return Ok(GroupInfo {
            key: key(GroupKind::PodGroup, g),
            display: format!("{ns}/{g}"),
            size_hint: None,
            rank: completion_index,
        });
    }
    if let Some(js) = label(JOBSET_NAME) {
        return Ok(GroupInfo {
            key: key(GroupKind::JobSet, js),
            display: format!("{ns}/{js}"),
            size_hint: None,
            rank: None,
        });
    }
    if let Some(g) = label(LWS_GROUP_KEY) {
        let size = annotation(LWS_SIZE)
            .map(|v| number(LWS_SIZE, v))
            .transpose()?;
        let shown = label(LWS_NAME).unwrap_or(g);
        return Ok(GroupInfo {
            key: key(GroupKind::LeaderWorkerSet, g),
            display: format!("{ns}/{shown}"),
            size_hint: size,
            rank: label("leaderworkerset.sigs.k8s.io/worker-index").and_then(|v| v.parse().ok()),
        });
    }
    if let (Some(job), Some(_)) = (
        label(JOB_NAME).or_else(|| label(LEGACY_JOB_NAME)),
        completion_index,
    ) {
        return Ok(GroupInfo {
            key: key(GroupKind::IndexedJob, job),
            display: format!("{ns}/{job}"),
            size_hint: None,
            rank: completion_index,
        });
    }
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map_or(name, |o| o.name.as_str());
    Ok(GroupInfo {
        key: key(GroupKind::Pod, name),
        display: format!("{ns}/{owner}"),
        size_hint: Some(1),
        rank: None,
    })
}

fn number(key: &'static str, v: &str) -> Result<u32, GroupError> {
    v.trim().parse().map_err(|_| GroupError::BadNumber {
        key,
        value: v.to_owned(),
    })
}

/// Members a group must have before it is submitted: the PodGroup's `minMember`, every
/// pod of a JobSet (sum over replicated jobs of replicas x parallelism), the indexed Job's
/// parallelism, the LWS size, or 1. `owner` is the PodGroup, JobSet or Job object as JSON
/// (`None` when it could not be read: the group then waits, it is never guessed).
pub fn expected_members(info: &GroupInfo, owner: Option<&serde_json::Value>) -> Option<u32> {
    match info.key.kind {
        GroupKind::Pod | GroupKind::LeaderWorkerSet => info.size_hint,
        GroupKind::PodGroup => owner?
            .pointer("/spec/minMember")?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok()),
        GroupKind::IndexedJob => job_pods(owner?.get("spec")?),
        GroupKind::JobSet => {
            let mut total: u32 = 0;
            for rj in owner?.pointer("/spec/replicatedJobs")?.as_array()? {
                let replicas = rj.get("replicas").map_or(Some(1), |r| r.as_u64())?;
                let per_job = job_pods(rj.pointer("/template/spec")?)?;
                let n = u32::try_from(replicas).ok()?.checked_mul(per_job)?;
                total = total.checked_add(n)?;
            }
            Some(total)
        }
    }
}

/// Pods a Job runs at once: `parallelism` (default 1), at most `completions`.
fn job_pods(spec: &serde_json::Value) -> Option<u32> {
    let parallelism = spec.get("parallelism").map_or(Some(1), |p| p.as_u64())?;
    let n = match spec.get("completions").and_then(|c| c.as_u64()) {
        Some(c) => parallelism.min(c),
        None => parallelism,
    };
    u32::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "p-0", "namespace": "ml", "labels": labels, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web-7d4f", "uid": "u1", "controller": true}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn the_most_specific_marker_names_the_group() {
        // A JobSet pod is also an indexed Job's pod: the JobSet wins.
        let js = pod(
            json!({JOBSET_NAME: "train", JOB_NAME: "train-workers-0",
                   JOB_COMPLETION_INDEX: "3"}),
            json!({JOB_COMPLETION_INDEX: "3"}),
        );
        let g = group_of(&js).unwrap();
        assert_eq!(
            (g.key.kind, g.key.name.as_str()),
            (GroupKind::JobSet, "train")
        );
        assert_eq!(g.display, "ml/train");
        // An explicit PodGroup label wins over everything.
        let pg = pod(json!({POD_GROUP: "gang", JOBSET_NAME: "train"}), json!({}));
        assert_eq!(group_of(&pg).unwrap().key.kind, GroupKind::PodGroup);
        let lws = pod(
            json!({LWS_GROUP_KEY: "abc123", LWS_NAME: "llm",
                   "leaderworkerset.sigs.k8s.io/worker-index": "2"}),
            json!({LWS_SIZE: "4"}),
        );
        let g = group_of(&lws).unwrap();
        assert_eq!(
            (g.key.kind, g.size_hint, g.rank),
            (GroupKind::LeaderWorkerSet, Some(4), Some(2))
        );
        assert_eq!(g.display, "ml/llm");
        let ij = pod(
            json!({LEGACY_JOB_NAME: "sweep"}),
            json!({JOB_COMPLETION_INDEX: "7"}),
        );
        let g = group_of(&ij).unwrap();
        assert_eq!((g.key.kind, g.rank), (GroupKind::IndexedJob, Some(7)));
        // A Deployment's pod: alone, shown by its owner.
        let single = pod(json!({"app": "web"}), json!({}));
        let g = group_of(&single).unwrap();
        assert_eq!((g.key.kind, g.key.name.as_str()), (GroupKind::Pod, "p-0"));
        assert_eq!((g.display.as_str(), g.size_hint), ("ml/web-7d4f", Some(1)));
        // A non-indexed Job's pods are independent.
        let plain_job = pod(json!({JOB_NAME: "once"}), json!({}));
        assert_eq!(group_of(&plain_job).unwrap().key.kind, GroupKind::Pod);
    }

    #[test]
    fn bad_numbers_are_refused() {
        let p = pod(json!({LWS_GROUP_KEY: "k"}), json!({LWS_SIZE: "four"}));
        assert_eq!(
            group_of(&p).unwrap_err().to_string(),
            "leaderworkerset.sigs.k8s.io/size: \"four\" is not a whole number"
        );
    }

    #[test]
    fn expected_members_come_from_the_owner_or_wait() {
        let info = |kind| GroupInfo {
            key: GroupKey {
                namespace: "ml".into(),
                kind,
                name: "x".into(),
            },
            display: "ml/x".into(),
            size_hint: None,
            rank: None,
        };
        let jobset = json!({"spec": {"replicatedJobs": [
            {"name": "leader", "template": {"spec": {"parallelism": 1}}},
            {"name": "workers", "replicas": 2,
             "template": {"spec": {"parallelism": 4, "completions": 4}}},
        ]}});
        assert_eq!(
            expected_members(&info(GroupKind::JobSet), Some(&jobset)),
            Some(9)
        );
        let pg = json!({"spec": {"minMember": 4}});
        assert_eq!(
            expected_members(&info(GroupKind::PodGroup), Some(&pg)),
            Some(4)
        );
        let job = json!({"spec": {"parallelism": 8, "completions": 3}});
        assert_eq!(
            expected_members(&info(GroupKind::IndexedJob), Some(&job)),
            Some(3)
        );
        // Unknown owner: wait, never guess.
        assert_eq!(expected_members(&info(GroupKind::JobSet), None), None);
        assert_eq!(
            expected_members(&info(GroupKind::PodGroup), Some(&json!({"spec": {}}))),
            None
        );
    }
}
