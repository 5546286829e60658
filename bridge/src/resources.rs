//! A pod's effective requests, computed as the scheduler and the kubelet do, and what
//! Tandem schedules of them: CPUs, memory and GPUs (whole GPUs or one MIG profile).
//!
//! Kubernetes' rule (KEP-753, sidecars included): the larger of (a) the app containers plus
//! every restartable init container (sidecar) and (b) for each ordinary init container,
//! itself plus the sidecars started before it; then the pod overhead on top. A resource
//! given only as a limit counts its limit, as the API server defaults requests to limits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use thiserror::Error;

use crate::quantity::{QuantityError, milli_to_units, parse_milli};

/// Whole GPUs, the device plugin's resource.
pub const GPU: &str = "nvidia.com/gpu";
/// MIG slices: `nvidia.com/mig-1g.10gb` and the like (the device plugin's "mixed" strategy).
pub const MIG_PREFIX: &str = "nvidia.com/mig-";

/// Amounts in milli-units by resource name.
pub type Amounts = BTreeMap<String, i128>;

/// What Tandem schedules for one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodResources {
    pub cpu_milli: u64,
    pub memory_bytes: u64,
    pub gpus: u32,
    /// `Some("mig-1g.10gb")` for a MIG profile: nodes offer those as typed GPUs.
    pub gpu_type: Option<String>,
}

impl PodResources {
    /// Whole CPUs, as a batch allocation counts them (a fraction rounds up; at least one).
    pub fn cpus(&self) -> u32 {
        u32::try_from(self.cpu_milli.div_ceil(1000).max(1)).unwrap_or(u32::MAX)
    }

    /// Memory in MB (2^20 bytes, Slurm's unit), rounded up.
    pub fn mem_mb(&self) -> u64 {
        self.memory_bytes.div_ceil(1 << 20)
    }

    /// The envelope of two pods: what a slot must offer so either fits.
    pub fn max(&self, other: &PodResources) -> Result<PodResources, ResourceError> {
        let gpu_type = match (&self.gpu_type, &other.gpu_type) {
            (a, b) if a == b => a.clone(),
            (Some(a), None) | (None, Some(a)) if self.gpus == 0 || other.gpus == 0 => {
                Some(a.clone())
            }
            (a, b) => {
                return Err(ResourceError::MixedGpuTypes(format!(
                    "{} and {}",
                    a.as_deref().unwrap_or("nvidia.com/gpu"),
                    b.as_deref().unwrap_or("nvidia.com/gpu")
                )));
            }
        };
        Ok(PodResources {
            cpu_milli: self.cpu_milli.max(other.cpu_milli),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
            gpus: self.gpus.max(other.gpus),
            gpu_type,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResourceError {
    #[error("resource {name}: {source}")]
    Quantity {
        name: String,
        #[source]
        source: QuantityError,
    },
    #[error("resource {name} = {value}: out of range")]
    OutOfRange { name: String, value: String },
    #[error(
        "resource {0} is not scheduled by Tandem (it schedules cpu, memory, {GPU} and {MIG_PREFIX}<profile>)"
    )]
    Unsupported(String),
    #[error("a pod or group uses one kind of GPU; found {0}")]
    MixedGpuTypes(String),
    #[error("resource claims (spec.resourceClaims) are not scheduled by Tandem yet")]
    ResourceClaims,
}

/// Resources a node has that Tandem does not allocate but that pods may request; the
/// kubelet still enforces them on the node.
const IGNORED: [&str; 2] = ["ephemeral-storage", "pods"];

/// The pod's requests in Tandem's terms.
pub fn pod_resources(spec: &PodSpec) -> Result<PodResources, ResourceError> {
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(ResourceError::ResourceClaims);
    }
    let total = effective_requests(spec)?;
    let mut out = PodResources::default();
    for (name, milli) in &total {
        let units = || {
            u64::try_from(milli_to_units(*milli)).map_err(|_| ResourceError::OutOfRange {
                name: name.clone(),
                value: format!("{milli}m"),
            })
        };
        match name.as_str() {
            "cpu" => {
                out.cpu_milli = u64::try_from(*milli).map_err(|_| ResourceError::OutOfRange {
                    name: name.clone(),
                    value: format!("{milli}m"),
                })?;
            }
            "memory" => out.memory_bytes = units()?,
            GPU => out.gpus = gpu_count(name, units()?)?,
            n if n.starts_with(MIG_PREFIX) => {
                let count = gpu_count(name, units()?)?;
                if count == 0 {
                    continue;
                }
                let ty = n.trim_start_matches("nvidia.com/").to_owned();
                if out.gpu_type.is_some() {
                    return Err(ResourceError::MixedGpuTypes(format!(
                        "two MIG profiles ({} and {ty})",
                        out.gpu_type.as_deref().unwrap_or_default()
                    )));
                }
                out.gpu_type = Some(ty);
                out.gpus = out.gpus.max(count);
            }
            n if IGNORED.contains(&n) || n.starts_with("hugepages-") => {}
            n => return Err(ResourceError::Unsupported(n.to_owned())),
        }
    }
    if out.gpu_type.is_some() && total.get(GPU).is_some_and(|m| *m > 0) {
        return Err(ResourceError::MixedGpuTypes(format!(
            "{GPU} and {}",
            out.gpu_type.as_deref().unwrap_or_default()
        )));
    }
    Ok(out)
}

fn gpu_count(name: &str, n: u64) -> Result<u32, ResourceError> {
    u32::try_from(n).map_err(|_| ResourceError::OutOfRange {
        name: name.to_owned(),
        value: n.to_string(),
    })
}

/// Kubernetes' effective pod request per resource, in milli-units.
pub fn effective_requests(spec: &PodSpec) -> Result<Amounts, ResourceError> {
    let mut apps = Amounts::new();
    for c in &spec.containers {
        add(&mut apps, &container_requests(c)?);
    }
    let mut sidecars = Amounts::new();
    let mut init_peak = Amounts::new();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &req);
        } else {
            // This init container runs beside the sidecars started before it.
            let mut during = sidecars.clone();
            add(&mut during, &req);
            for (name, v) in during {
                let slot = init_peak.entry(name).or_default();
                *slot = (*slot).max(v);
            }
        }
    }
    add(&mut apps, &sidecars);
    for (name, v) in init_peak {
        let slot = apps.entry(name).or_default();
        *slot = (*slot).max(v);
    }
    for (name, q) in spec.overhead.iter().flatten() {
        let v = parse(name, &q.0)?;
        *apps.entry(name.clone()).or_default() += v;
    }
    Ok(apps)
}

/// One container's requests, defaulted from its limits.
pub fn container_requests(c: &Container) -> Result<Amounts, ResourceError> {
    let mut out = Amounts::new();
    let Some(res) = &c.resources else {
        return Ok(out);
    };
    for (name, q) in res.requests.iter().flatten() {
        out.insert(name.clone(), parse(name, &q.0)?);
    }
    for (name, q) in res.limits.iter().flatten() {
        if !out.contains_key(name) {
            out.insert(name.clone(), parse(name, &q.0)?);
        }
    }
    Ok(out)
}

fn parse(name: &str, text: &str) -> Result<i128, ResourceError> {
    let v = parse_milli(text).map_err(|source| ResourceError::Quantity {
        name: name.to_owned(),
        source,
    })?;
    if v < 0 {
        return Err(ResourceError::OutOfRange {
            name: name.to_owned(),
            value: text.to_owned(),
        });
    }
    Ok(v)
}

fn add(into: &mut Amounts, from: &Amounts) {
    for (name, v) in from {
        *into.entry(name.clone()).or_default() += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn ctr(name: &str, requests: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"requests": requests}})
    }

    #[test]
    fn containers_add_up_and_limits_stand_in_for_requests() {
        let s = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"cpu": "500m", "memory": "1Gi"})),
            {"name": "b", "resources": {"limits": {"cpu": "2", "nvidia.com/gpu": "2"}}},
        ]}));
        let r = pod_resources(&s).unwrap();
        assert_eq!(r.cpu_milli, 2500);
        assert_eq!(r.cpus(), 3);
        assert_eq!(r.memory_bytes, 1 << 30);
        assert_eq!(r.mem_mb(), 1024);
        assert_eq!((r.gpus, r.gpu_type), (2, None));
    }

    #[test]
    fn sidecars_count_beside_the_app_and_init_containers_peak_alone() {
        let s = spec(serde_json::json!({
            "initContainers": [
                // A sidecar: runs for the pod's whole life.
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "1"}}},
                // An ordinary init container: runs before the app, beside the proxy.
                ctr("warmup", serde_json::json!({"cpu": "6"})),
            ],
            "containers": [ctr("app", serde_json::json!({"cpu": "2"}))],
            "overhead": {"cpu": "250m"},
        }));
        // max(app 2 + proxy 1, warmup 6 + proxy 1) + overhead 0.25 = 7.25
        assert_eq!(effective_requests(&s).unwrap()["cpu"], 7250);
        assert_eq!(pod_resources(&s).unwrap().cpus(), 8);
    }

    #[test]
    fn a_mig_profile_is_a_typed_gpu() {
        let s = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"nvidia.com/mig-1g.10gb": "2", "cpu": "1"})),
        ]}));
        let r = pod_resources(&s).unwrap();
        assert_eq!((r.gpus, r.gpu_type.as_deref()), (2, Some("mig-1g.10gb")));
        let mixed = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"nvidia.com/mig-1g.10gb": "1"})),
            ctr("b", serde_json::json!({"nvidia.com/gpu": "1"})),
        ]}));
        assert!(matches!(
            pod_resources(&mixed),
            Err(ResourceError::MixedGpuTypes(_))
        ));
    }

    #[test]
    fn what_tandem_cannot_schedule_is_refused_by_name() {
        let s = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"example.com/fpga": "1", "ephemeral-storage": "1Gi"})),
        ]}));
        let e = pod_resources(&s).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("resource example.com/fpga is not scheduled"),
            "{e}"
        );
        let s = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"cpu": "lots"})),
        ]}));
        assert!(
            pod_resources(&s)
                .unwrap_err()
                .to_string()
                .starts_with("resource cpu:")
        );
        let s = spec(serde_json::json!({"containers": [
            ctr("a", serde_json::json!({"memory": "-1Gi"})),
        ]}));
        assert!(matches!(
            pod_resources(&s),
            Err(ResourceError::OutOfRange { .. })
        ));
        let s = spec(serde_json::json!({
            "containers": [ctr("a", serde_json::json!({}))],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
        }));
        assert_eq!(pod_resources(&s), Err(ResourceError::ResourceClaims));
    }

    #[test]
    fn envelopes_take_the_larger_of_each() {
        let a = PodResources {
            cpu_milli: 4000,
            memory_bytes: 10,
            gpus: 1,
            gpu_type: None,
        };
        let b = PodResources {
            cpu_milli: 1000,
            memory_bytes: 20,
            gpus: 0,
            gpu_type: None,
        };
        let m = a.max(&b).unwrap();
        assert_eq!((m.cpu_milli, m.memory_bytes, m.gpus), (4000, 20, 1));
        let mig = PodResources {
            gpus: 1,
            gpu_type: Some("mig-1g.10gb".into()),
            ..b.clone()
        };
        assert!(a.max(&mig).is_err());
        assert_eq!(
            b.max(&mig).unwrap().gpu_type.as_deref(),
            Some("mig-1g.10gb")
        );
    }
}
