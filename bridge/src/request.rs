//! A pod group as one placeholder job: how many nodes, how many pods on each, and what
//! each pod's slot holds.
//!
//! Every node of a batch allocation gets the same amounts, so a gang of `P` pods becomes
//! `N` nodes of `ceil(P / N)` slots, `N` as small as the partition's nodes allow, and each
//! slot the envelope of the group's pods (a JobSet's leader and workers may differ; the
//! slot fits either). A single pod asks for exactly its own requests, so several small pods
//! share one `kube`-mode node up to its GPUs, CPUs and memory.

use thiserror::Error;

use crate::group::GroupInfo;
use crate::policy::Resolved;
use crate::resources::{PodResources, ResourceError};

/// What one node of the partition offers (its largest node, as the controller reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCaps {
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: u32,
}

/// The placeholder job for a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    /// The group's UID: the controller accepts one placeholder per UID, so a resubmission
    /// after a restart finds the job it already made.
    pub group_uid: String,
    /// `namespace/owner`, the job name `squeue` shows.
    pub name: String,
    /// The pods' namespace: the job's user in Tandem's accounting.
    pub namespace: String,
    pub settings: Resolved,
    pub pods: u32,
    pub nodes: u32,
    pub pods_per_node: u32,
    pub per_pod: PodResources,
    /// Nodes the pods may not run on ([`crate::fit`]).
    pub exclude: Vec<String>,
}

impl Placeholder {
    /// CPUs, memory (MB) and GPUs the job holds on each node.
    pub fn per_node(&self) -> (u32, u64, u32) {
        let k = self.pods_per_node;
        (
            self.per_pod.cpus().saturating_mul(k),
            self.per_pod.mem_mb().saturating_mul(u64::from(k)),
            self.per_pod.gpus.saturating_mul(k),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    #[error("the group has no pods")]
    Empty,
    #[error(transparent)]
    Resources(#[from] ResourceError),
    #[error("a pod needs {need} {what} but the partition's largest node has {have}")]
    NoFit {
        what: &'static str,
        need: u64,
        have: u64,
    },
}

/// Builds the placeholder for a group whose members request `pods` (one entry a pod).
pub fn placeholder(
    group_uid: &str,
    info: &GroupInfo,
    pods: &[PodResources],
    settings: Resolved,
    caps: NodeCaps,
) -> Result<Placeholder, RequestError> {
    let (first, rest) = pods.split_first().ok_or(RequestError::Empty)?;
    let per_pod = rest.iter().try_fold(first.clone(), |acc, p| acc.max(p))?;
    let count = u32::try_from(pods.len()).unwrap_or(u32::MAX);
    let fit = slots_per_node(&per_pod, caps)?;
    let nodes = count.div_ceil(fit);
    Ok(Placeholder {
        group_uid: group_uid.to_owned(),
        name: info.display.clone(),
        namespace: info.key.namespace.clone(),
        settings,
        pods: count,
        nodes,
        // Spread evenly: 9 pods at 4 a node is 3 nodes of 3, not 4 + 4 + 1.
        pods_per_node: count.div_ceil(nodes),
        per_pod,
        exclude: Vec::new(),
    })
}

/// How many slots of `per_pod` one node holds; at least one, or an error naming the
/// resource that does not fit.
fn slots_per_node(per_pod: &PodResources, caps: NodeCaps) -> Result<u32, RequestError> {
    let mut fit = u64::MAX;
    let mut check = |what: &'static str, need: u64, have: u64| {
        if need == 0 {
            return Ok(());
        }
        if need > have {
            return Err(RequestError::NoFit { what, need, have });
        }
        fit = fit.min(have / need);
        Ok(())
    };
    check("CPUs", u64::from(per_pod.cpus()), u64::from(caps.cpus))?;
    check("MB of memory", per_pod.mem_mb(), caps.mem_mb)?;
    check("GPUs", u64::from(per_pod.gpus), u64::from(caps.gpus))?;
    Ok(u32::try_from(fit).unwrap_or(u32::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{GroupKey, GroupKind};

    const CAPS: NodeCaps = NodeCaps {
        cpus: 64,
        mem_mb: 256 * 1024,
        gpus: 8,
    };

    fn info() -> GroupInfo {
        GroupInfo {
            key: GroupKey {
                namespace: "ml".into(),
                kind: GroupKind::JobSet,
                name: "train".into(),
            },
            display: "ml/train".into(),
            size_hint: None,
            rank: None,
        }
    }

    fn settings() -> Resolved {
        Resolved {
            account: "research".into(),
            partition: None,
            qos: None,
            time_limit: Some(3600),
        }
    }

    fn pod(cpu_milli: u64, gib: u64, gpus: u32) -> PodResources {
        PodResources {
            cpu_milli,
            memory_bytes: gib << 30,
            gpus,
            gpu_type: None,
        }
    }

    #[test]
    fn a_gang_takes_as_few_nodes_as_fit_and_spreads_evenly() {
        let pods = vec![pod(4000, 32, 2); 9];
        let p = placeholder("uid-1", &info(), &pods, settings(), CAPS).unwrap();
        // 8 GPUs a node / 2 a pod = 4 slots; 9 pods -> 3 nodes of 3.
        assert_eq!((p.nodes, p.pods_per_node, p.pods), (3, 3, 9));
        assert_eq!(p.per_node(), (12, 3 * 32 * 1024, 6));
        assert_eq!(p.name, "ml/train");
        assert_eq!(p.group_uid, "uid-1");
    }

    #[test]
    fn the_slot_is_the_envelope_of_differing_pods() {
        let pods = vec![pod(16_000, 8, 0), pod(1000, 64, 4), pod(1000, 64, 4)];
        let p = placeholder("u", &info(), &pods, settings(), CAPS).unwrap();
        assert_eq!(p.per_pod, pod(16_000, 64, 4));
        // 64/16 = 4, 256/64 = 4, 8/4 = 2 slots a node: 3 pods -> 2 nodes of 2.
        assert_eq!((p.nodes, p.pods_per_node), (2, 2));
    }

    #[test]
    fn a_single_small_pod_asks_for_itself_only() {
        let p = placeholder("u", &info(), &[pod(500, 1, 1)], settings(), CAPS).unwrap();
        assert_eq!((p.nodes, p.pods_per_node), (1, 1));
        assert_eq!(p.per_node(), (1, 1024, 1));
    }

    #[test]
    fn what_never_fits_says_which_resource() {
        let e = placeholder("u", &info(), &[pod(1000, 1, 16)], settings(), CAPS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a pod needs 16 GPUs but the partition's largest node has 8"
        );
        assert_eq!(
            placeholder("u", &info(), &[], settings(), CAPS),
            Err(RequestError::Empty)
        );
    }
}
