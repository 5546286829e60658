//! Which pods are scheduled together, and how many members a group waits for.
//!
//! One group becomes one placeholder job, so a gang is placed all at once: a pod group of
//! an in-tree `scheduling.k8s.io/v1alpha1` Workload (`spec.workloadRef`, Kubernetes 1.35), a
//! scheduler-plugins PodGroup, a **whole JobSet** (all its replicated jobs together, where
//! slurm-bridge makes each pod its own job), a LeaderWorkerSet group (leader and workers),
//! an indexed Job's pods, or else a single pod. The most specific marker wins: a JobSet's
//! pods are also an indexed Job's pods, and a `workloadRef` (a spec field, immutable) or a
//! PodGroup label is the user's explicit word.
//!
//! A Workload pod group is keyed by (namespace, Workload, pod group, replica key): each
//! replica key is a gang of its own, as in kube-scheduler. Its policy is on the Workload:
//! `gang` waits for `minCount` pods, `basic` means no gang, so once the Workload is read each
//! of its pods becomes a group of its own ([`single`]).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1alpha1::Workload;
use thiserror::Error;

use crate::labels::{
    JOB_COMPLETION_INDEX, JOB_NAME, JOBSET_NAME, LEGACY_JOB_NAME, LWS_GROUP_KEY, LWS_NAME,
    LWS_SIZE, POD_GROUP,
};

/// What kind of workload a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKind {
    /// A pod group of an in-tree Workload (`spec.workloadRef`).
    Workload,
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
    /// The PodGroup, JobSet or Job name, the LWS group key, or the pod name; for a
    /// Workload `workload/podGroup[/replicaKey]` (none of the three may contain `/`: DNS
    /// subdomain and labels), read back by [`workload_ref`].
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
    #[error("spec.workloadRef: {0}")]
    BadWorkloadRef(&'static str),
}

/// Why a Workload group cannot be placed yet. The message is what its pods are told
/// (`PodScheduled=False`, `Unschedulable`), so it says what the user must do.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WorkloadError {
    #[error(
        "Workload {namespace}/{workload} (scheduling.k8s.io/v1alpha1) not found; the pods wait \
         until it exists"
    )]
    Missing { namespace: String, workload: String },
    #[error(
        "Workload {namespace}/{workload} has no pod group {pod_group:?}; the pods wait until \
         the Workload is recreated with it"
    )]
    NoPodGroup {
        namespace: String,
        workload: String,
        pod_group: String,
    },
    #[error("Workload {namespace}/{workload} cannot be used: {why}")]
    Invalid {
        namespace: String,
        workload: String,
        why: String,
    },
}

/// A Workload pod group's scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadPolicy {
    /// Standard scheduling: each pod on its own.
    Basic,
    /// All or nothing, once `min_count` pods exist.
    Gang { min_count: u32 },
}

/// A Workload group as its Workload defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadGroup {
    pub policy: WorkloadPolicy,
    /// The placeholder's key: the Workload's UID, the pod group and the replica key (one
    /// Workload holds several gangs), at most [`MAX_GROUP_UID`] characters.
    pub uid: String,
}

/// The longest group UID the controller accepts.
pub const MAX_GROUP_UID: usize = 128;

/// The parts of a Workload group's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadRef<'a> {
    pub workload: &'a str,
    pub pod_group: &'a str,
    pub replica_key: Option<&'a str>,
}

/// The group a pod belongs to.
pub fn group_of(pod: &Pod) -> Result<GroupInfo, GroupError> {
    let meta = &pod.metadata;
    let (Some(_), Some(ns)) = (meta.name.as_deref(), meta.namespace.as_deref()) else {
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
    if let Some(r) = pod.spec.as_ref().and_then(|s| s.workload_ref.as_ref()) {
        if r.name.is_empty() || r.pod_group.is_empty() {
            return Err(GroupError::BadWorkloadRef("name and podGroup are required"));
        }
        let replica = r.pod_group_replica_key.as_deref().filter(|k| !k.is_empty());
        // A slash would make the key ambiguous; the API server refuses them anyway.
        if [r.name.as_str(), r.pod_group.as_str()]
            .into_iter()
            .chain(replica)
            .any(|p| p.contains('/'))
        {
            return Err(GroupError::BadWorkloadRef("names may not contain '/'"));
        }
        let name = match replica {
            Some(k) => format!("{}/{}/{k}", r.name, r.pod_group),
            None => format!("{}/{}", r.name, r.pod_group),
        };
        return Ok(GroupInfo {
            key: key(GroupKind::Workload, &name),
            display: format!("{ns}/{}", r.name),
            size_hint: None,
            rank: completion_index,
        });
    }
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
    single(pod)
}

/// The pod as a group of its own, shown by its controller (a Deployment's pod by its
/// ReplicaSet): what a pod with no gang marker is, and each pod of a `basic` Workload group.
pub fn single(pod: &Pod) -> Result<GroupInfo, GroupError> {
    let meta = &pod.metadata;
    let (Some(name), Some(ns)) = (meta.name.as_deref(), meta.namespace.as_deref()) else {
        return Err(GroupError::Unnamed);
    };
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map_or(name, |o| o.name.as_str());
    Ok(GroupInfo {
        key: GroupKey {
            namespace: ns.to_owned(),
            kind: GroupKind::Pod,
            name: name.to_owned(),
        },
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

/// The Workload, pod group and replica key of a [`GroupKind::Workload`] key; `None` for other
/// kinds.
pub fn workload_ref(key: &GroupKey) -> Option<WorkloadRef<'_>> {
    if key.kind != GroupKind::Workload {
        return None;
    }
    let mut parts = key.name.splitn(3, '/');
    Some(WorkloadRef {
        workload: parts.next()?,
        pod_group: parts.next()?,
        replica_key: parts.next(),
    })
}

/// The policy and placeholder UID of the Workload group `key`, from its Workload as JSON
/// (`None`: absent or unreadable, so the pods wait; they are never placed one by one).
pub fn workload_group(
    key: &GroupKey,
    workload: Option<&serde_json::Value>,
) -> Result<WorkloadGroup, WorkloadError> {
    let namespace = key.namespace.clone();
    let Some(r) = workload_ref(key) else {
        return Err(WorkloadError::Invalid {
            namespace,
            workload: key.name.clone(),
            why: "not a Workload group".into(),
        });
    };
    let invalid = |why: String| WorkloadError::Invalid {
        namespace: key.namespace.clone(),
        workload: r.workload.to_owned(),
        why,
    };
    let Some(w) = workload else {
        return Err(WorkloadError::Missing {
            namespace,
            workload: r.workload.to_owned(),
        });
    };
    let w: Workload = serde_json::from_value(w.clone()).map_err(|e| invalid(e.to_string()))?;
    let Some(uid) = w.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return Err(invalid("it has no metadata.uid".into()));
    };
    let Some((index, group)) = w
        .spec
        .pod_groups
        .iter()
        .enumerate()
        .find(|(_, g)| g.name == r.pod_group)
    else {
        return Err(WorkloadError::NoPodGroup {
            namespace,
            workload: r.workload.to_owned(),
            pod_group: r.pod_group.to_owned(),
        });
    };
    let policy = match (&group.policy.gang, &group.policy.basic) {
        (Some(g), None) => match u32::try_from(g.min_count) {
            Ok(n) if n > 0 => WorkloadPolicy::Gang { min_count: n },
            _ => {
                return Err(invalid(format!(
                    "pod group {:?} has gang minCount {}, not a positive number",
                    r.pod_group, g.min_count
                )));
            }
        },
        (None, Some(_)) => WorkloadPolicy::Basic,
        _ => {
            return Err(invalid(format!(
                "pod group {:?} must set exactly one of policy.basic and policy.gang",
                r.pod_group
            )));
        }
    };
    Ok(WorkloadGroup {
        policy,
        uid: workload_uid(uid, r.pod_group, index, r.replica_key),
    })
}

/// The UID a group's placeholder is keyed by, from its owner object: a Workload group's
/// [`WorkloadGroup::uid`], else the owner's `metadata.uid`.
pub fn owner_uid(key: &GroupKey, owner: Option<&serde_json::Value>) -> Option<String> {
    match key.kind {
        GroupKind::Workload => workload_group(key, owner).ok().map(|g| g.uid),
        _ => Some(owner?.pointer("/metadata/uid")?.as_str()?.to_owned()),
    }
}

/// `uid/podGroup[/replicaKey]`, or with the pod group's index (the list is immutable) where
/// the names would make it longer than the controller accepts.
fn workload_uid(uid: &str, pod_group: &str, index: usize, replica: Option<&str>) -> String {
    let with = |g: &str| match replica {
        Some(k) => format!("{uid}/{g}/{k}"),
        None => format!("{uid}/{g}"),
    };
    let named = with(pod_group);
    if named.len() <= MAX_GROUP_UID {
        named
    } else {
        with(&format!("#{index}"))
    }
}

/// Members a group must have before it is submitted: a Workload gang's `minCount`, the
/// PodGroup's `minMember`, every pod of a JobSet (sum over replicated jobs of replicas x
/// parallelism), the indexed Job's parallelism, the LWS size, or 1. `owner` is the Workload, PodGroup, JobSet or Job as JSON
/// (`None` when it could not be read: the group then waits, it is never guessed).
pub fn expected_members(info: &GroupInfo, owner: Option<&serde_json::Value>) -> Option<u32> {
    match info.key.kind {
        GroupKind::Pod | GroupKind::LeaderWorkerSet => info.size_hint,
        // A `basic` group is split into single pods before it is decided (see [`single`]).
        GroupKind::Workload => match workload_group(&info.key, owner).ok()?.policy {
            WorkloadPolicy::Gang { min_count } => Some(min_count),
            WorkloadPolicy::Basic => Some(1),
        },
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

/// The pod specs of every member of a group whose owner starts its pods in stages (a
/// JobSet with `startupPolicy.startupPolicyOrder: InOrder`, or whose replicated jobs
/// `dependsOn` others): later stages are created only once earlier ones run, so waiting
/// for every member before submitting would wait forever. Such a group is one gang
/// submitted for all its members as soon as the first exist; later pods bind to the
/// allocation as they appear. `None` for a group that starts all at once.
pub fn staged_members(
    info: &GroupInfo,
    owner: Option<&serde_json::Value>,
) -> Option<Vec<k8s_openapi::api::core::v1::PodSpec>> {
    match info.key.kind {
        GroupKind::JobSet => {}
        GroupKind::LeaderWorkerSet => return lws_members(owner?),
        _ => return None,
    }
    let spec = owner?.get("spec")?;
    let rjs = spec.get("replicatedJobs")?.as_array()?;
    let in_order = spec
        .pointer("/startupPolicy/startupPolicyOrder")
        .and_then(|o| o.as_str())
        == Some("InOrder");
    let depends = rjs.iter().any(|rj| {
        rj.get("dependsOn")
            .and_then(|d| d.as_array())
            .is_some_and(|d| !d.is_empty())
    });
    if !in_order && !depends {
        return None;
    }
    let mut out = Vec::new();
    for rj in rjs {
        let replicas = rj.get("replicas").map_or(Some(1), |r| r.as_u64())?;
        let job = rj.pointer("/template/spec")?;
        let per_job = job_pods(job)?;
        let pod: k8s_openapi::api::core::v1::PodSpec =
            serde_json::from_value(job.pointer("/template/spec")?.clone()).ok()?;
        let n = u32::try_from(replicas).ok()?.checked_mul(per_job)?;
        // A bound on what one owner object can make the bridge hold in memory.
        if out.len().saturating_add(n as usize) > 100_000 {
            return None;
        }
        out.extend(std::iter::repeat_n(pod, n as usize));
    }
    Some(out)
}

/// A LeaderWorkerSet with `startupPolicy: LeaderReady`: its leader (the leader template,
/// else the worker template) and `size - 1` workers.
fn lws_members(owner: &serde_json::Value) -> Option<Vec<k8s_openapi::api::core::v1::PodSpec>> {
    let spec = owner.get("spec")?;
    if spec.get("startupPolicy").and_then(|p| p.as_str()) != Some("LeaderReady") {
        return None;
    }
    let t = spec.get("leaderWorkerTemplate")?;
    let size = t.get("size").map_or(Some(1), |s| s.as_u64())?;
    let size = usize::try_from(size)
        .ok()
        .filter(|s| (1..=100_000).contains(s))?;
    let parse = |v: &serde_json::Value| -> Option<k8s_openapi::api::core::v1::PodSpec> {
        serde_json::from_value(v.get("spec")?.clone()).ok()
    };
    let worker = parse(t.get("workerTemplate")?)?;
    let leader = match t.get("leaderTemplate") {
        Some(l) => parse(l)?,
        None => worker.clone(),
    };
    let mut out = vec![leader];
    out.extend(std::iter::repeat_n(worker, size - 1));
    Some(out)
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
    fn a_jobset_started_in_order_is_one_gang_of_all_its_templates() {
        let info = GroupInfo {
            key: GroupKey {
                namespace: "ml".into(),
                kind: GroupKind::JobSet,
                name: "train".into(),
            },
            display: "ml/train".into(),
            size_hint: None,
            rank: None,
        };
        let template = |gpus: u32| {
            json!({"spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}}}})
        };
        let js = |policy: serde_json::Value, depends: bool| {
            let mut workers = json!({"name": "workers", "replicas": 2, "template": template(2)});
            if depends {
                workers["dependsOn"] = json!([{"name": "leader", "status": "Ready"}]);
            }
            json!({"spec": {"startupPolicy": policy, "replicatedJobs": [
                {"name": "leader", "replicas": 1, "template": template(0)}, workers]}})
        };
        let staged = staged_members(
            &info,
            Some(&js(json!({"startupPolicyOrder": "InOrder"}), false)),
        )
        .unwrap();
        assert_eq!(staged.len(), 6, "1 x 2 leaders and 2 x 2 workers");
        assert_eq!(
            Some(staged.len() as u32),
            expected_members(&info, Some(&js(json!({}), false)))
        );
        assert!(staged_members(&info, Some(&js(json!({}), true))).is_some());
        // Started all at once: not staged.
        assert!(
            staged_members(
                &info,
                Some(&js(json!({"startupPolicyOrder": "AnyOrder"}), false))
            )
            .is_none()
        );
        assert!(staged_members(&info, None).is_none());
    }

    #[test]
    fn a_leader_ready_lws_is_one_gang_of_its_leader_and_workers() {
        let info = GroupInfo {
            key: GroupKey {
                namespace: "ml".into(),
                kind: GroupKind::LeaderWorkerSet,
                name: "0a1b2c".into(),
            },
            display: "ml/infer".into(),
            size_hint: Some(4),
            rank: None,
        };
        let tpl = |gpus: u32| {
            json!({"spec": {"containers": [{"name": "c",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}})
        };
        let lws = |policy: &str| {
            json!({"spec": {"startupPolicy": policy, "leaderWorkerTemplate": {
                "size": 4, "leaderTemplate": tpl(0), "workerTemplate": tpl(2)}}})
        };
        let staged = staged_members(&info, Some(&lws("LeaderReady"))).unwrap();
        assert_eq!(staged.len(), 4);
        let gpus = |s: &k8s_openapi::api::core::v1::PodSpec| {
            crate::resources::pod_resources(s).unwrap().gpus
        };
        assert_eq!(
            staged.iter().map(gpus).collect::<Vec<_>>(),
            vec![0, 2, 2, 2]
        );
        // LeaderCreated (the default) makes every pod at once: a plain gang.
        assert!(staged_members(&info, Some(&lws("LeaderCreated"))).is_none());
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

    /// A pod of Workload `w`'s pod group `pg` (replica key `replica`).
    fn workload_pod(name: &str, pg: &str, replica: Option<&str>) -> Pod {
        let mut r = json!({"name": "w", "podGroup": pg});
        if let Some(k) = replica {
            r["podGroupReplicaKey"] = json!(k);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml",
                         "labels": {POD_GROUP: "other", JOBSET_NAME: "train"}},
            "spec": {"containers": [], "workloadRef": r},
        }))
        .unwrap()
    }

    fn workload(pod_groups: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
               "metadata": {"name": "w", "namespace": "ml", "uid": "u-1"},
               "spec": {"podGroups": pod_groups}})
    }

    #[test]
    fn a_workload_ref_groups_by_workload_pod_group_and_replica_key() {
        let a = group_of(&workload_pod("a", "workers", None)).unwrap();
        let b = group_of(&workload_pod("b", "workers", None)).unwrap();
        // The spec field wins over the PodGroup and JobSet labels the pod also carries.
        assert_eq!(a.key.kind, GroupKind::Workload);
        assert_eq!(a.key, b.key);
        assert_eq!((a.display.as_str(), a.size_hint), ("ml/w", None));
        let driver = group_of(&workload_pod("d", "driver", None)).unwrap();
        assert_ne!(driver.key, a.key);
        let r0 = group_of(&workload_pod("r0", "workers", Some("0"))).unwrap();
        let r0b = group_of(&workload_pod("r0b", "workers", Some("0"))).unwrap();
        let r1 = group_of(&workload_pod("r1", "workers", Some("1"))).unwrap();
        assert_eq!(r0.key, r0b.key);
        assert_ne!(r0.key, r1.key);
        assert_ne!(r0.key, a.key);
        assert_eq!(
            workload_ref(&r1.key),
            Some(WorkloadRef {
                workload: "w",
                pod_group: "workers",
                replica_key: Some("1"),
            })
        );
        assert_eq!(workload_ref(&a.key).unwrap().replica_key, None);
        assert_eq!(
            workload_ref(&group_of(&pod(json!({}), json!({}))).unwrap().key),
            None
        );
        // A key that would read back wrong is refused rather than merged with another.
        let bad = workload_pod("x", "a/b", None);
        assert_eq!(
            group_of(&bad).unwrap_err().to_string(),
            "spec.workloadRef: names may not contain '/'"
        );
        assert!(group_of(&workload_pod("y", "", None)).is_err());
    }

    #[test]
    fn a_workload_pod_group_is_a_gang_of_min_count_or_single_pods() {
        let key = group_of(&workload_pod("a", "workers", None)).unwrap().key;
        let rkey = group_of(&workload_pod("a", "workers", Some("3")))
            .unwrap()
            .key;
        let w = workload(json!([
            {"name": "driver", "policy": {"basic": {}}},
            {"name": "workers", "policy": {"gang": {"minCount": 4}}},
        ]));
        let g = workload_group(&key, Some(&w)).unwrap();
        assert_eq!(g.policy, WorkloadPolicy::Gang { min_count: 4 });
        // One Workload holds several gangs: each its own placeholder.
        assert_eq!(g.uid, "u-1/workers");
        assert_eq!(
            workload_group(&rkey, Some(&w)).unwrap().uid,
            "u-1/workers/3"
        );
        assert_eq!(owner_uid(&rkey, Some(&w)).as_deref(), Some("u-1/workers/3"));
        let info = group_of(&workload_pod("a", "workers", None)).unwrap();
        assert_eq!(expected_members(&info, Some(&w)), Some(4));
        assert_eq!(expected_members(&info, None), None);

        let dkey = group_of(&workload_pod("d", "driver", None)).unwrap().key;
        assert_eq!(
            workload_group(&dkey, Some(&w)).unwrap().policy,
            WorkloadPolicy::Basic
        );
        // Each pod of a basic group is a group of its own.
        let d = single(&workload_pod("d", "driver", None)).unwrap();
        assert_eq!((d.key.kind, d.key.name.as_str()), (GroupKind::Pod, "d"));
        assert_eq!(d.size_hint, Some(1));
    }

    #[test]
    fn a_missing_or_unusable_workload_makes_its_pods_wait_with_why() {
        let key = group_of(&workload_pod("a", "workers", None)).unwrap().key;
        assert_eq!(
            workload_group(&key, None).unwrap_err().to_string(),
            "Workload ml/w (scheduling.k8s.io/v1alpha1) not found; the pods wait until it \
             exists"
        );
        assert_eq!(owner_uid(&key, None), None);
        let other = workload(json!([{"name": "driver", "policy": {"basic": {}}}]));
        assert!(matches!(
            workload_group(&key, Some(&other)),
            Err(WorkloadError::NoPodGroup { pod_group, .. }) if pod_group == "workers"
        ));
        let zero = workload(json!([{"name": "workers", "policy": {"gang": {"minCount": 0}}}]));
        let e = workload_group(&key, Some(&zero)).unwrap_err().to_string();
        assert!(e.contains("minCount 0"), "{e}");
        let none = workload(json!([{"name": "workers", "policy": {}}]));
        assert!(matches!(
            workload_group(&key, Some(&none)),
            Err(WorkloadError::Invalid { .. })
        ));
        let mut no_uid = workload(json!([{"name": "workers", "policy": {"basic": {}}}]));
        no_uid["metadata"]["uid"] = serde_json::Value::Null;
        assert!(workload_group(&key, Some(&no_uid)).is_err());
    }

    #[test]
    fn a_long_workload_uid_stays_within_the_controllers_limit() {
        let pg = "p".repeat(63);
        let replica = "r".repeat(63);
        let key = group_of(&workload_pod("a", &pg, Some(&replica)))
            .unwrap()
            .key;
        let w = workload(json!([
            {"name": "x", "policy": {"basic": {}}},
            {"name": pg, "policy": {"gang": {"minCount": 2}}},
        ]));
        let uid = workload_group(&key, Some(&w)).unwrap().uid;
        assert!(uid.len() <= MAX_GROUP_UID, "{uid}");
        assert_eq!(uid, format!("u-1/#1/{replica}"));
    }
}
