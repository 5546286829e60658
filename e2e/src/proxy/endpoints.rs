//! Which pod addresses back which Service port (pure): the endpoints controller's selection
//! and kube-proxy's forwarding table, computed from Services, Pods and (for Services
//! without a selector) hand-written Endpoints objects.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One address behind a Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    pub addr: SocketAddrV4,
    pub ready: bool,
    /// The pod it belongs to (`None` for a hand-written Endpoints address).
    pub pod: Option<String>,
    pub node: Option<String>,
}

/// The backends of one port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEndpoints {
    /// The Service port's name (`""` when unnamed, as Endpoints write it).
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub backends: Vec<Backend>,
}

/// Whether a pod counts as ready for Services (the endpoints controller's rule): it has an
/// IP, is not terminating or finished, and its `Ready` condition is `True`.
pub fn pod_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        && !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
        && pod.metadata.deletion_timestamp.is_none()
}

fn pod_ip(pod: &Pod) -> Option<Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

/// The selector of a Service that selects pods (`None`: no selector, endpoints are
/// written by hand).
fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()?
        .selector
        .as_ref()
        .filter(|s| !s.is_empty())
}

fn matches(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The port a pod serves a Service port on: a number as given, a name looked up among the
/// pod's container ports (`None`: the pod has no port of that name, so it is skipped for
/// this port, as the endpoints controller does).
pub fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    let n = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => {
                pod.spec
                    .as_ref()?
                    .containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .find(|p| p.name.as_deref() == Some(name.as_str()))?
                    .container_port
            }
        },
    };
    u16::try_from(n).ok().filter(|p| *p > 0)
}

/// The endpoints of each port of `svc`, from the pods of its namespace (`pods` may hold any
/// pods; those of other namespaces are ignored). Services without a selector take their
/// addresses from `manual` (the Endpoints object of the same name), if any.
pub fn service_endpoints<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    manual: Option<&Endpoints>,
) -> Vec<PortEndpoints> {
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(sel) = selector(svc) else {
        return manual
            .map(|e| manual_endpoints(ports, e))
            .unwrap_or_default();
    };
    let mut pods: Vec<&Pod> = pods
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or("default") == ns)
        .filter(|p| matches(sel, p))
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    ports
        .iter()
        .map(|port| {
            let backends = pods
                .iter()
                .filter_map(|pod| {
                    let ip = pod_ip(pod)?;
                    let finished = matches!(
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    );
                    if finished || pod.metadata.deletion_timestamp.is_some() {
                        return None;
                    }
                    let ready = pod_ready(pod) || publish_not_ready;
                    Some(Backend {
                        addr: SocketAddrV4::new(ip, target_port(port, pod)?),
                        ready,
                        pod: pod.metadata.name.clone(),
                        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    })
                })
                .collect();
            PortEndpoints {
                name: port.name.clone().unwrap_or_default(),
                port: port.port,
                protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                backends,
            }
        })
        .collect()
}

/// A hand-written Endpoints object's addresses for each Service port (matched by port name,
/// as kube-proxy does).
fn manual_endpoints(ports: &[ServicePort], ep: &Endpoints) -> Vec<PortEndpoints> {
    ports
        .iter()
        .map(|port| {
            let name = port.name.clone().unwrap_or_default();
            let mut backends = BTreeSet::new();
            for subset in ep.subsets.iter().flatten() {
                let Some(ep_port) = subset
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.clone().unwrap_or_default() == name)
                    .and_then(|p| u16::try_from(p.port).ok())
                else {
                    continue;
                };
                let lists = [
                    (&subset.addresses, true),
                    (&subset.not_ready_addresses, false),
                ];
                for (list, ready) in lists {
                    for a in list.iter().flatten() {
                        if let Ok(ip) = a.ip.parse::<Ipv4Addr>() {
                            backends.insert(Backend {
                                addr: SocketAddrV4::new(ip, ep_port),
                                ready,
                                pod: None,
                                node: a.node_name.clone(),
                            });
                        }
                    }
                }
            }
            PortEndpoints {
                name,
                port: port.port,
                protocol: port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                backends: backends.into_iter().collect(),
            }
        })
        .collect()
}

/// The cluster IP a Service is reached on, if it has one the proxy can serve (an IPv4
/// address; headless and ExternalName services have none).
pub fn cluster_ip(svc: &Service) -> Option<Ipv4Addr> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    spec.cluster_ip.as_deref()?.parse().ok()
}

/// kube-proxy's table: every `clusterIP:port` (TCP) of `services` and the ready backends
/// it forwards to. Ports without a ready backend are left out: nothing listens there, so a
/// client is refused, as a real cluster's REJECT rule does.
pub fn forwarding_table<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    pods: &[&Pod],
    endpoints: &BTreeMap<(String, String), &Endpoints>,
) -> BTreeMap<SocketAddrV4, Vec<SocketAddrV4>> {
    let mut table = BTreeMap::new();
    for svc in services {
        let Some(ip) = cluster_ip(svc) else { continue };
        let key = (
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        );
        let manual = endpoints.get(&key).copied();
        for port in service_endpoints(svc, pods.iter().copied(), manual) {
            if port.protocol != "TCP" {
                continue;
            }
            let Ok(p) = u16::try_from(port.port) else {
                continue;
            };
            let ready: Vec<SocketAddrV4> = port
                .backends
                .iter()
                .filter(|b| b.ready)
                .map(|b| b.addr)
                .collect();
            if !ready.is_empty() {
                table.insert(SocketAddrV4::new(ip, p), ready);
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool, labels: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "ports": [{"name": "grpc", "containerPort": 6817}]}]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn controller_svc() -> Service {
        svc(
            json!({"metadata": {"name": "ctl", "namespace": "ns"}, "spec": {
            "clusterIP": "127.128.0.9", "selector": {"app": "ctl"},
            "ports": [{"name": "grpc", "port": 80, "targetPort": "grpc", "protocol": "TCP"},
                      {"name": "metrics", "port": 9090, "targetPort": 9091, "protocol": "TCP"},
                      {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
        )
    }

    #[test]
    fn selected_ready_pods_back_each_port_by_number_or_name() {
        let a = pod("a", "127.64.0.2", true, json!({"app": "ctl"}));
        let b = pod("b", "127.64.0.3", false, json!({"app": "ctl"}));
        let other = pod("c", "127.64.0.4", true, json!({"app": "worker"}));
        let mut elsewhere = pod("d", "127.64.0.5", true, json!({"app": "ctl"}));
        elsewhere.metadata.namespace = Some("other".into());
        let pods = [&a, &b, &other, &elsewhere];
        let eps = service_endpoints(&controller_svc(), pods, None);
        assert_eq!(eps.len(), 3);
        assert_eq!(eps[0].name, "grpc");
        let addrs: Vec<(String, bool)> = eps[0]
            .backends
            .iter()
            .map(|b| (b.addr.to_string(), b.ready))
            .collect();
        assert_eq!(
            addrs,
            vec![
                ("127.64.0.2:6817".into(), true),
                ("127.64.0.3:6817".into(), false)
            ]
        );
        assert_eq!(eps[1].backends[0].addr.to_string(), "127.64.0.2:9091");
        assert_eq!(
            eps[2].backends[0].addr.to_string(),
            "127.64.0.2:53",
            "no targetPort: the port itself"
        );

        let table = forwarding_table([&controller_svc()], &pods, &BTreeMap::new());
        let got: Vec<(String, Vec<String>)> = table
            .iter()
            .map(|(k, v)| (k.to_string(), v.iter().map(|a| a.to_string()).collect()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("127.128.0.9:80".into(), vec!["127.64.0.2:6817".into()]),
                ("127.128.0.9:9090".into(), vec!["127.64.0.2:9091".into()]),
            ],
            "only TCP ports with ready backends are forwarded"
        );
    }

    #[test]
    fn terminating_finished_and_unaddressed_pods_are_no_endpoints() {
        let mut gone = pod("a", "127.64.0.2", true, json!({"app": "ctl"}));
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let mut done = pod("b", "127.64.0.3", true, json!({"app": "ctl"}));
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut pending = pod("c", "127.64.0.4", false, json!({"app": "ctl"}));
        pending.status.as_mut().unwrap().pod_ip = None;
        let eps = service_endpoints(&controller_svc(), [&gone, &done, &pending], None);
        assert!(eps.iter().all(|p| p.backends.is_empty()), "{eps:?}");
    }

    #[test]
    fn a_pod_without_the_named_port_is_skipped_for_that_port_only() {
        let mut p = pod("a", "127.64.0.2", true, json!({"app": "ctl"}));
        p.spec.as_mut().unwrap().containers[0].ports = None;
        let eps = service_endpoints(&controller_svc(), [&p], None);
        assert!(eps[0].backends.is_empty());
        assert_eq!(eps[1].backends.len(), 1);
    }

    #[test]
    fn not_ready_pods_are_published_when_asked() {
        let mut s = controller_svc();
        s.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
        let p = pod("a", "127.64.0.2", false, json!({"app": "ctl"}));
        let table = forwarding_table([&s], &[&p], &BTreeMap::new());
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn services_without_selectors_use_their_endpoints_object() {
        let s = svc(
            json!({"metadata": {"name": "ext", "namespace": "ns"}, "spec": {
            "clusterIP": "127.128.0.10", "ports": [{"name": "web", "port": 80}]}}),
        );
        let ep: Endpoints = serde_json::from_value(json!({"metadata": {"name": "ext", "namespace": "ns"},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "notReadyAddresses": [{"ip": "127.0.0.2"}],
                         "ports": [{"name": "web", "port": 8080}]}]}))
        .unwrap();
        let mut manual = BTreeMap::new();
        manual.insert(("ns".to_string(), "ext".to_string()), &ep);
        let table = forwarding_table([&s], &[], &manual);
        assert_eq!(
            table.get(&"127.128.0.10:80".parse().unwrap()),
            Some(&vec!["127.0.0.1:8080".parse().unwrap()])
        );
        let headless = svc(
            json!({"metadata": {"name": "h", "namespace": "ns"}, "spec": {
            "clusterIP": "None", "selector": {"app": "ctl"}, "ports": [{"port": 80}]}}),
        );
        let p = pod("a", "127.64.0.2", true, json!({"app": "ctl"}));
        assert!(forwarding_table([&headless], &[&p], &BTreeMap::new()).is_empty());
    }
}
