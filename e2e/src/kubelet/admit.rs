//! Pod admission on a node, as the kubelet's resource fit check does it (pure).
//!
//! A kubelet re-checks every pod bound to it before starting it, because the binding may
//! come from something other than the default scheduler (Tandem's bridge, or a test writing
//! `spec.nodeName` directly). A pod that does not fit is failed at once with reason
//! `OutOf<resource>` and never started.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{QuantityError, milli_to_units, parse_milli};

/// Resource amounts in milli-units by resource name (`cpu`, `memory`, `nvidia.com/gpu`, ...).
pub type Resources = BTreeMap<String, i128>;

/// Why a pod was refused, in the words a kubelet writes into the pod's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// `status.reason`, e.g. `OutOfnvidia.com/gpu`.
    pub reason: String,
    /// `status.message`, e.g. `Pod was rejected: Node didn't have enough resource: ...`.
    pub message: String,
}

/// What a node offers: its allocatable resources and the pod count limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocatable {
    pub resources: Resources,
    pub pods: i128,
}

/// The requests the scheduler and the kubelet account for one pod: the sum over its
/// containers, at least the largest init container, plus the pod overhead.
///
/// A resource with a limit and no request counts its limit: the API server defaults
/// requests to limits on create, and this harness's API server need not do that for us
/// (extended resources such as `nvidia.com/gpu` are usually given as limits only).
pub fn pod_requests(spec: &PodSpec) -> Result<Resources, QuantityError> {
    let mut total = Resources::new();
    for container in &spec.containers {
        for (name, milli) in container_requests(container)? {
            *total.entry(name).or_default() += milli;
        }
    }
    for init in spec.init_containers.iter().flatten() {
        for (name, milli) in container_requests(init)? {
            let slot = total.entry(name).or_default();
            *slot = (*slot).max(milli);
        }
    }
    for (name, q) in spec.overhead.iter().flatten() {
        *total.entry(name.clone()).or_default() += parse_milli(&q.0)?;
    }
    Ok(total)
}

/// One container's effective requests (requests, defaulted from limits).
pub fn container_requests(container: &Container) -> Result<Resources, QuantityError> {
    let mut out = Resources::new();
    let Some(res) = &container.resources else {
        return Ok(out);
    };
    let mut put = |map: &BTreeMap<String, Quantity>, overwrite: bool| {
        for (name, q) in map {
            let milli = parse_milli(&q.0)?;
            if overwrite || !out.contains_key(name) {
                out.insert(name.clone(), milli);
            }
        }
        Ok::<(), QuantityError>(())
    };
    if let Some(requests) = &res.requests {
        put(requests, true)?;
    }
    if let Some(limits) = &res.limits {
        put(limits, false)?;
    }
    Ok(out)
}

/// The kubelet's fit check: `requests` against what is left of `node` after `used` (the
/// requests of the `pods_running` pods already admitted and not finished).
///
/// Checks run in the kubelet's order (pods, cpu, memory, ephemeral-storage, then other
/// resources by name) and the first shortfall is reported, as the kubelet reports only
/// the first failed predicate.
pub fn admit(
    requests: &Resources,
    node: &NodeAllocatable,
    used: &Resources,
    pods_running: usize,
) -> Result<(), Rejection> {
    let running = pods_running as i128;
    if running + 1 > node.pods {
        return Err(insufficient("pods", 1, running, node.pods));
    }
    let first = ["cpu", "memory", "ephemeral-storage"];
    let rest = requests.keys().filter(|k| !first.contains(&k.as_str()));
    for name in first.iter().copied().chain(rest.map(String::as_str)) {
        let want = requests.get(name).copied().unwrap_or(0);
        if want <= 0 {
            continue;
        }
        let Some(&have) = node.resources.get(name) else {
            // Like the kubelet, an extended resource the node does not report at all is not
            // checked here: it is left to the device manager (or a scheduler extender).
            if is_extended(name) {
                continue;
            }
            return Err(insufficient(name, show_units(name, want), 0, 0));
        };
        let taken = used.get(name).copied().unwrap_or(0);
        if want > have - taken {
            let show = |m: i128| show_units(name, m);
            return Err(insufficient(name, show(want), show(taken), show(have)));
        }
    }
    Ok(())
}

/// `spec.nodeSelector` against the node's labels (the kubelet's NodeAffinity predicate;
/// required node affinity terms are not evaluated, see DIFFERENCES.md).
pub fn check_node_selector(
    spec: &PodSpec,
    node_labels: &BTreeMap<String, String>,
) -> Result<(), Rejection> {
    let selector = spec.node_selector.iter().flatten();
    for (key, value) in selector {
        if node_labels.get(key) != Some(value) {
            return Err(Rejection {
                reason: "NodeAffinity".into(),
                message: "Pod was rejected: Predicate NodeAffinity failed".into(),
            });
        }
    }
    Ok(())
}

/// CPU is compared and printed in millicores, everything else in whole units.
fn show_units(name: &str, milli: i128) -> i128 {
    if name == "cpu" {
        milli
    } else {
        milli_to_units(milli)
    }
}

/// `v1helper.IsExtendedResourceName`: a domain-prefixed name outside `kubernetes.io`.
fn is_extended(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, _)) => !domain.ends_with("kubernetes.io") && !name.starts_with("requests."),
        None => false,
    }
}

fn insufficient(name: &str, requested: i128, used: i128, capacity: i128) -> Rejection {
    Rejection {
        reason: format!("OutOf{name}"),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn node(cpu: &str, mem: &str, gpus: i128) -> NodeAllocatable {
        let mut resources = Resources::new();
        resources.insert("cpu".into(), parse_milli(cpu).unwrap());
        resources.insert("memory".into(), parse_milli(mem).unwrap());
        if gpus > 0 {
            resources.insert("nvidia.com/gpu".into(), gpus * 1000);
        }
        NodeAllocatable {
            resources,
            pods: 110,
        }
    }

    fn gpu_pod(gpus: u32) -> PodSpec {
        spec(json!({"containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": gpus.to_string()},
            "requests": {"cpu": "500m"}}}]}))
    }

    #[test]
    fn limits_default_requests_and_containers_add_up() {
        let s = spec(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "250m"}}}
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
            "overhead": {"memory": "10Mi"}
        }));
        let r = pod_requests(&s).unwrap();
        assert_eq!(
            r["cpu"], 2000,
            "the largest init container wins over the 500m sum"
        );
        assert_eq!(r["memory"], ((1 << 30) + 10 * (1 << 20)) * 1000);
    }

    #[test]
    fn gpu_shortfall_is_out_of_nvidia_gpu_with_the_kubelet_message() {
        let used: Resources = [("nvidia.com/gpu".to_string(), 1000)].into();
        let got = admit(
            &pod_requests(&gpu_pod(2)).unwrap(),
            &node("4", "8Gi", 2),
            &used,
            1,
        );
        assert_eq!(
            got,
            Err(Rejection {
                reason: "OutOfnvidia.com/gpu".into(),
                message: "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 2, used: 1, capacity: 2".into(),
            })
        );
    }

    #[test]
    fn fits_exactly_and_unknown_extended_resources_are_not_checked() {
        let req = pod_requests(&gpu_pod(2)).unwrap();
        assert_eq!(
            admit(&req, &node("4", "8Gi", 2), &Resources::new(), 0),
            Ok(())
        );
        // A node without the GPU device plugin does not report nvidia.com/gpu at all; the
        // kubelet's fit check skips it (the device manager would not allocate anything).
        assert_eq!(
            admit(&req, &node("4", "8Gi", 0), &Resources::new(), 0),
            Ok(())
        );
        // A node reporting zero GPUs does refuse them.
        let mut zero = node("4", "8Gi", 0);
        zero.resources.insert("nvidia.com/gpu".into(), 0);
        let err = admit(&req, &zero, &Resources::new(), 0).unwrap_err();
        assert_eq!(err.reason, "OutOfnvidia.com/gpu");
        assert!(err.message.ends_with("capacity: 0"), "{}", err.message);
    }

    #[test]
    fn cpu_is_reported_in_millicores_and_checked_before_memory() {
        let req = pod_requests(&spec(json!({"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "3", "memory": "100Gi"}}}]})))
        .unwrap();
        let used: Resources = [("cpu".to_string(), 2000)].into();
        let err = admit(&req, &node("4", "8Gi", 0), &used, 1).unwrap_err();
        assert_eq!(err.reason, "OutOfcpu");
        assert!(
            err.message
                .contains("requested: 3000, used: 2000, capacity: 4000"),
            "{}",
            err.message
        );
    }

    #[test]
    fn pod_count_limit_comes_first() {
        let mut n = node("4", "8Gi", 0);
        n.pods = 2;
        let err = admit(&Resources::new(), &n, &Resources::new(), 2).unwrap_err();
        assert_eq!(err.reason, "OutOfpods");
    }

    #[test]
    fn node_selector_must_match_labels() {
        let s = spec(json!({"containers": [], "nodeSelector": {"pool": "gpu"}}));
        let labels: BTreeMap<String, String> = [("pool".to_string(), "gpu".to_string())].into();
        assert_eq!(check_node_selector(&s, &labels), Ok(()));
        let err = check_node_selector(&s, &BTreeMap::new()).unwrap_err();
        assert_eq!(err.reason, "NodeAffinity");
    }
}
