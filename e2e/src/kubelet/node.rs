//! Declared nodes: the Node object a kubelet registers, and its heartbeat (a Lease in
//! `kube-node-lease` renewed every interval, plus the Ready condition's heartbeat time).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::admit::{NodeAllocatable, Resources};
use super::quantity::{QuantityError, parse_milli};

/// The namespace where node leases live on every cluster.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// How long a lease holds without renewal (the kubelet's default).
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// The version the kubelet reports for itself; says plainly what it is.
pub const KUBELET_VERSION: &str = "v1.35.0-tandem-e2e-process-kubelet";

/// A node the test declares, and that the process kubelet serves.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    /// CPU capacity as a quantity (`"4"`, `"500m"`).
    pub cpu: String,
    /// Memory capacity as a quantity (`"8Gi"`).
    pub memory: String,
    /// `nvidia.com/gpu` capacity; 0 leaves the resource off the node, as on a node without
    /// the device plugin.
    pub gpus: u32,
    /// The pod count limit (`pods` capacity).
    pub pods: u32,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}

impl NodeSpec {
    /// A node with the kubelet's default pod limit and the given shape.
    pub fn new(name: &str, cpu: &str, memory: &str, gpus: u32) -> Self {
        Self {
            name: name.to_owned(),
            cpu: cpu.to_owned(),
            memory: memory.to_owned(),
            gpus,
            pods: 110,
            labels: BTreeMap::new(),
            taints: Vec::new(),
        }
    }

    /// Parses `kube-sim --node`: `NAME:cpu=64,memory=256Gi,nvidia.com/gpu=8` (each
    /// resource optional: 4 CPUs, 8Gi, no GPUs by default; `pods=N` sets the pod limit).
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, resources) = text.split_once(':').unwrap_or((text, ""));
        if name.is_empty() {
            return Err(format!(
                "{text:?}: the node needs a name (NAME:cpu=..,memory=..)"
            ));
        }
        let mut spec = Self::new(name, "4", "8Gi", 0);
        for kv in resources.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{text:?}: {kv:?} is not RESOURCE=QUANTITY"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{text:?}: {k}={v:?}: {e}");
            match k {
                "cpu" => {
                    super::quantity::parse_milli(v).map_err(|e| bad(&e))?;
                    spec.cpu = v.to_owned();
                }
                "memory" => {
                    super::quantity::parse_milli(v).map_err(|e| bad(&e))?;
                    spec.memory = v.to_owned();
                }
                "nvidia.com/gpu" => spec.gpus = v.parse().map_err(|e| bad(&e))?,
                "pods" => spec.pods = v.parse().map_err(|e| bad(&e))?,
                other => {
                    return Err(format!(
                        "{text:?}: unknown resource {other:?} (cpu, memory, nvidia.com/gpu, pods)"
                    ));
                }
            }
        }
        Ok(spec)
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_owned(),
            value: Some(value.to_owned()),
            effect: effect.to_owned(),
            time_added: None,
        });
        self
    }

    pub fn max_pods(mut self, pods: u32) -> Self {
        self.pods = pods;
        self
    }

    /// Capacity (= allocatable: nothing is reserved for the system here) as strings.
    pub fn capacity(&self) -> BTreeMap<String, String> {
        let mut c = BTreeMap::from([
            ("cpu".to_owned(), self.cpu.clone()),
            ("memory".to_owned(), self.memory.clone()),
            ("pods".to_owned(), self.pods.to_string()),
            ("ephemeral-storage".to_owned(), "100Gi".to_owned()),
        ]);
        if self.gpus > 0 {
            c.insert("nvidia.com/gpu".to_owned(), self.gpus.to_string());
        }
        c
    }

    /// Allocatable resources as admission counts them; fails on a malformed quantity.
    pub fn allocatable(&self) -> Result<NodeAllocatable, (&'static str, QuantityError)> {
        let mut resources = Resources::new();
        for (name, q) in self.capacity() {
            if name == "pods" {
                continue;
            }
            let field = match name.as_str() {
                "cpu" => "cpu",
                "memory" => "memory",
                _ => "capacity",
            };
            resources.insert(name, parse_milli(&q).map_err(|e| (field, e))?);
        }
        Ok(NodeAllocatable {
            resources,
            pods: i128::from(self.pods),
        })
    }

    /// Node labels: the well-known ones a kubelet sets, then the declared ones.
    pub fn all_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), self.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("kubernetes.io/arch".to_owned(), go_arch().to_owned()),
        ]);
        labels.extend(self.labels.clone());
        labels
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node's status: capacity, Ready and the pressure conditions, addresses and the
/// kubelet endpoint that serves logs.
pub fn node_status(spec: &NodeSpec, log_port: u16, now: &str) -> serde_json::Value {
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "capacity": spec.capacity(),
        "allocatable": spec.capacity(),
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": spec.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": log_port}},
        "nodeInfo": {
            "architecture": go_arch(),
            "bootID": "",
            "containerRuntimeVersion": "process://tandem-e2e",
            "kernelVersion": "",
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "machineID": "",
            "operatingSystem": "linux",
            "osImage": "host processes (tandem e2e process kubelet)",
            "systemUUID": "",
        },
    })
}

/// Creates the Node (or takes over an existing one) and publishes its status. Returns the
/// Node's uid, for the lease's owner reference.
pub async fn register(
    client: &kube::Client,
    spec: &NodeSpec,
    log_port: u16,
) -> Result<String, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = node_status(spec, log_port, &now);
    let object: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": spec.all_labels()},
        "spec": {"taints": spec.taints},
        "status": status,
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let meta =
                json!({"metadata": {"labels": spec.all_labels()}, "spec": {"taints": spec.taints}});
            nodes
                .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&meta))
                .await?;
        }
        Err(e) => return Err(e),
    }
    // Servers differ in whether a create keeps status; the status subresource always does.
    let node = nodes
        .patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await?;
    Ok(node.metadata.uid.unwrap_or_default())
}

/// One heartbeat: renew the node's Lease (creating it, and its namespace, if missing) and
/// refresh the Ready condition's heartbeat time.
pub async fn heartbeat(
    client: &kube::Client,
    spec: &NodeSpec,
    node_uid: &str,
    log_port: u16,
) -> Result<(), kube::Error> {
    let now_ts = k8s_openapi::jiff::Timestamp::now();
    let micro = now_ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let renew = json!({"spec": {"renewTime": micro, "holderIdentity": spec.name}});
    match leases
        .patch(&spec.name, &PatchParams::default(), &Patch::Merge(&renew))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {
            create_lease(client, spec, node_uid, &micro).await?
        }
        Err(e) => return Err(e),
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let status = node_status(spec, log_port, &now_ts.to_string());
    nodes
        .patch_status(
            &spec.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await?;
    Ok(())
}

async fn create_lease(
    client: &kube::Client,
    spec: &NodeSpec,
    node_uid: &str,
    micro: &str,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {
            "name": spec.name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": spec.name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": micro,
        },
    }))
    .map_err(kube::Error::SerdeError)?;
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            // A fresh in-repo server has no kube-node-lease namespace; a real cluster does.
            let namespaces: Api<Namespace> = Api::all(client.clone());
            let ns: Namespace =
                serde_json::from_value(json!({"metadata": {"name": LEASE_NAMESPACE}}))
                    .map_err(kube::Error::SerdeError)?;
            match namespaces.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_flags_parse_and_bad_ones_say_why() {
        let n = NodeSpec::parse("gpu-01:cpu=64,memory=256Gi,nvidia.com/gpu=8").unwrap();
        assert_eq!(
            (n.name.as_str(), n.cpu.as_str(), n.memory.as_str(), n.gpus),
            ("gpu-01", "64", "256Gi", 8)
        );
        let d = NodeSpec::parse("plain").unwrap();
        assert_eq!((d.cpu.as_str(), d.gpus), ("4", 0));
        assert!(NodeSpec::parse(":cpu=1").unwrap_err().contains("name"));
        assert!(NodeSpec::parse("a:cpu=lots").unwrap_err().contains("cpu"));
        assert!(
            NodeSpec::parse("a:tpu=1")
                .unwrap_err()
                .contains("unknown resource")
        );
        assert!(
            NodeSpec::parse("a:cpu")
                .unwrap_err()
                .contains("RESOURCE=QUANTITY")
        );
    }

    #[test]
    fn capacity_and_allocatable_agree() {
        let spec = NodeSpec::new("gpu-01", "8", "32Gi", 4).label("pool", "a");
        let cap = spec.capacity();
        assert_eq!(cap["nvidia.com/gpu"], "4");
        assert_eq!(cap["pods"], "110");
        let alloc = spec.allocatable().unwrap();
        assert_eq!(alloc.resources["cpu"], 8000);
        assert_eq!(alloc.resources["nvidia.com/gpu"], 4000);
        assert_eq!(spec.all_labels()["kubernetes.io/hostname"], "gpu-01");
        assert_eq!(spec.all_labels()["pool"], "a");
        assert!(
            !NodeSpec::new("cpu-01", "1", "1Gi", 0)
                .capacity()
                .contains_key("nvidia.com/gpu")
        );
    }

    #[test]
    fn bad_quantities_name_the_field() {
        let err = NodeSpec::new("n", "lots", "1Gi", 0)
            .allocatable()
            .unwrap_err();
        assert_eq!(err.0, "cpu");
    }

    #[test]
    fn status_deserialises_as_a_node_status() {
        let status = node_status(
            &NodeSpec::new("n", "1", "1Gi", 1),
            4321,
            "2026-01-01T00:00:00Z",
        );
        let parsed: k8s_openapi::api::core::v1::NodeStatus =
            serde_json::from_value(status).unwrap();
        assert_eq!(
            parsed
                .daemon_endpoints
                .unwrap()
                .kubelet_endpoint
                .unwrap()
                .port,
            4321
        );
        let ready = parsed
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
    }
}
