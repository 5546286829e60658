//! A container's environment as the kubelet builds it (pure): `envFrom`, then `env` in
//! order, each value expanded against the variables defined before it, with downward-API
//! `fieldRef`s, `resourceFieldRef`s and ConfigMap/Secret references resolved.
//!
//! ConfigMaps and Secrets are fetched by the caller (see [`referenced_objects`]) and handed
//! in, so this module never does I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVarSource, Pod};
use thiserror::Error;

use super::admit::{Resources, container_requests};
use super::quantity::parse_milli;

/// Data of fetched objects by name; a name missing from the map was not found.
pub type ObjectData = BTreeMap<String, BTreeMap<String, String>>;

/// Everything env resolution may read besides the container itself.
#[derive(Debug, Clone, Copy)]
pub struct EnvContext<'a> {
    pub pod: &'a Pod,
    /// Limits left unset resolve to the node's allocatable, as on a real kubelet.
    pub node_allocatable: &'a Resources,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub config_maps: &'a ObjectData,
    pub secrets: &'a ObjectData,
    /// Service link variables ([`service_env`]); the container's own env wins over them.
    pub service_env: &'a [(String, String)],
}

/// Why a container's environment cannot be built; the kubelet shows it as the waiting
/// reason `CreateContainerConfigError` with this text as the message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct EnvError(pub String);

/// The ConfigMaps and Secrets (by name, in the pod's namespace) a container's env reads.
pub fn referenced_objects(container: &Container) -> (Vec<String>, Vec<String>) {
    let mut maps = Vec::new();
    let mut secrets = Vec::new();
    for from in container.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            maps.push(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    for var in container.env.iter().flatten() {
        if let Some(src) = &var.value_from {
            if let Some(r) = &src.config_map_key_ref {
                maps.push(r.name.clone());
            }
            if let Some(r) = &src.secret_key_ref {
                secrets.push(r.name.clone());
            }
        }
    }
    maps.sort();
    maps.dedup();
    secrets.sort();
    secrets.dedup();
    (maps, secrets)
}

/// The container's environment in definition order (a later definition of a name replaces
/// an earlier one in place, as the runtime sees only the last).
pub fn container_env(
    ctx: &EnvContext<'_>,
    container: &Container,
) -> Result<Vec<(String, String)>, EnvError> {
    let ns = ctx.pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut env: Vec<(String, String)> = Vec::new();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| match env
        .iter_mut()
        .find(|(n, _)| *n == name)
    {
        Some(slot) => slot.1 = value,
        None => env.push((name, value)),
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, optional, source) = if let Some(r) = &from.config_map_ref {
            ("configmap", &r.name, r.optional, ctx.config_maps)
        } else if let Some(r) = &from.secret_ref {
            ("secret", &r.name, r.optional, ctx.secrets)
        } else {
            continue;
        };
        match source.get(name) {
            Some(data) => {
                for (k, v) in data {
                    set(&mut env, format!("{prefix}{k}"), v.clone());
                }
            }
            None if optional == Some(true) => {}
            None => return Err(EnvError(format!("{kind} \"{name}\" not found"))),
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (_, Some(src)) => match resolve_source(ctx, container, ns, src)? {
                Some(v) => v,
                None => continue, // optional reference that is absent: the variable is unset
            },
            (Some(v), None) => {
                let lookup = |n: &str| {
                    env.iter()
                        .chain(ctx.service_env)
                        .find(|(k, _)| k == n)
                        .map(|(_, v)| v.as_str())
                };
                expand(v, lookup)
            }
            (None, None) => String::new(),
        };
        set(&mut env, var.name.clone(), value);
    }
    for (name, value) in ctx.service_env {
        if !env.iter().any(|(k, _)| k == name) {
            env.push((name.clone(), value.clone()));
        }
    }
    Ok(env)
}

/// The container with `$(VAR)` expanded in every element of `command` and `args` against
/// its environment, as the kubelet does before handing them to the runtime.
pub fn expand_command(container: &Container, env: &[(String, String)]) -> Container {
    let lookup = |n: &str| env.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let expand_all = |list: &Option<Vec<String>>| {
        list.as_ref()
            .map(|l| l.iter().map(|a| expand(a, lookup)).collect())
    };
    let mut out = container.clone();
    out.command = expand_all(&container.command);
    out.args = expand_all(&container.args);
    out
}

/// The service link variables a kubelet gives every container of a namespace's pods
/// (`FOO_SERVICE_HOST`, `FOO_SERVICE_PORT`, `FOO_PORT_80_TCP_ADDR`, ...), for Services
/// with a cluster IP, exactly as a real kubelet writes them: the cluster IP and the
/// Service's port (the harness's service proxy forwards that address to the endpoints).
pub fn service_env(services: &[k8s_openapi::api::core::v1::Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut services: Vec<_> = services.iter().collect();
    services.sort_by_key(|s| s.metadata.name.clone());
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let host = match spec.cluster_ip.as_deref() {
            None | Some("") | Some("None") => continue,
            Some(ip) => ip,
        };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let name = svc
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .to_uppercase()
            .replace('-', "_");
        let reach = |p: &k8s_openapi::api::core::v1::ServicePort| p.port;
        out.push((format!("{name}_SERVICE_HOST"), host.to_owned()));
        out.push((format!("{name}_SERVICE_PORT"), reach(first).to_string()));
        for p in ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                let key = port_name.to_uppercase().replace('-', "_");
                out.push((format!("{name}_SERVICE_PORT_{key}"), reach(p).to_string()));
            }
        }
        let proto = |p: &k8s_openapi::api::core::v1::ServicePort| {
            p.protocol.as_deref().unwrap_or("TCP").to_owned()
        };
        out.push((
            format!("{name}_PORT"),
            format!("{}://{host}:{}", proto(first).to_lowercase(), reach(first)),
        ));
        for p in ports {
            let (upper, port) = (proto(p).to_uppercase(), reach(p));
            let prefix = format!("{name}_PORT_{}_{upper}", p.port);
            out.push((
                prefix.clone(),
                format!("{}://{host}:{port}", upper.to_lowercase()),
            ));
            out.push((format!("{prefix}_PROTO"), upper.to_lowercase()));
            out.push((format!("{prefix}_PORT"), port.to_string()));
            out.push((format!("{prefix}_ADDR"), host.to_owned()));
        }
    }
    out
}

fn resolve_source(
    ctx: &EnvContext<'_>,
    container: &Container,
    ns: &str,
    src: &EnvVarSource,
) -> Result<Option<String>, EnvError> {
    if let Some(f) = &src.field_ref {
        return field_value(ctx, &f.field_path).map(Some);
    }
    if let Some(r) = &src.resource_field_ref {
        let target = match r.container_name.as_deref() {
            None | Some("") => container,
            Some(name) => ctx
                .pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .find(|c| c.name == name)
                .ok_or_else(|| EnvError(format!("container {name} not found in pod")))?,
        };
        let divisor = r.divisor.as_ref().map_or("1", |q| q.0.as_str());
        return resource_value(ctx, target, &r.resource, divisor).map(Some);
    }
    let (kind, title, name, key, optional, source) = if let Some(r) = &src.config_map_key_ref {
        (
            "configmap",
            "ConfigMap",
            &r.name,
            &r.key,
            r.optional,
            ctx.config_maps,
        )
    } else if let Some(r) = &src.secret_key_ref {
        ("secret", "Secret", &r.name, &r.key, r.optional, ctx.secrets)
    } else {
        return Err(EnvError("env var valueFrom names no source".into()));
    };
    let optional = optional == Some(true);
    match source.get(name) {
        None if optional => Ok(None),
        None => Err(EnvError(format!("{kind} \"{name}\" not found"))),
        Some(data) => match data.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(EnvError(format!(
                "couldn't find key {key} in {title} {ns}/{name}"
            ))),
        },
    }
}

/// A downward-API `fieldRef` path.
pub fn field_value(ctx: &EnvContext<'_>, path: &str) -> Result<String, EnvError> {
    let meta = &ctx.pod.metadata;
    let spec = ctx.pod.spec.as_ref();
    let map_key = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.to_owned(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_owned(),
        _ => {
            if let Some(key) = map_key("metadata.labels") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .cloned()
                    .unwrap_or_default()
            } else if let Some(key) = map_key("metadata.annotations") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .cloned()
                    .unwrap_or_default()
            } else {
                return Err(EnvError(format!("unsupported fieldRef fieldPath {path:?}")));
            }
        }
    };
    Ok(value)
}

/// A `resourceFieldRef` value: the amount divided by the divisor, rounded up.
fn resource_value(
    ctx: &EnvContext<'_>,
    container: &Container,
    resource: &str,
    divisor: &str,
) -> Result<String, EnvError> {
    let bad = |e: super::quantity::QuantityError| EnvError(e.to_string());
    let (kind, name) = resource.split_once('.').ok_or_else(|| {
        EnvError(format!(
            "unsupported resourceFieldRef resource {resource:?}"
        ))
    })?;
    let amount = match kind {
        "limits" => {
            let limit = container
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(name));
            match limit {
                Some(q) => parse_milli(&q.0).map_err(bad)?,
                None => ctx.node_allocatable.get(name).copied().unwrap_or(0),
            }
        }
        "requests" => container_requests(container)
            .map_err(bad)?
            .get(name)
            .copied()
            .unwrap_or(0),
        _ => {
            return Err(EnvError(format!(
                "unsupported resourceFieldRef resource {resource:?}"
            )));
        }
    };
    let divisor = parse_milli(divisor).map_err(bad)?;
    if divisor <= 0 {
        return Err(EnvError(format!(
            "resourceFieldRef divisor must be positive: {divisor}"
        )));
    }
    Ok(((amount + divisor - 1) / divisor).to_string())
}

/// Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, and
/// anything else (undefined names, a lone `$`, an unclosed `$(`) is left as written.
pub fn expand<'v>(input: &str, lookup: impl Fn(&str) -> Option<&'v str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(close) => {
                    let name = &body[..close];
                    match lookup(name) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1",
                          "labels": {"app": "train"}, "annotations": {"a/b": "c"}},
            "spec": {"nodeName": "gpu-01", "containers": [{"name": "c",
                "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1500m"}}}]}
        }))
        .unwrap()
    }

    fn container(env: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "c", "env": env,
            "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "1500m"}}}))
        .unwrap()
    }

    fn resolve(env: serde_json::Value) -> Result<Vec<(String, String)>, EnvError> {
        let pod = pod();
        let alloc: Resources = [("cpu".to_string(), 8000)].into();
        let maps: ObjectData = [(
            "cm".to_string(),
            [("k".to_string(), "v".to_string())].into(),
        )]
        .into();
        let secrets = ObjectData::new();
        let ctx = EnvContext {
            pod: &pod,
            node_allocatable: &alloc,
            pod_ip: "127.0.0.1",
            host_ip: "127.0.0.1",
            config_maps: &maps,
            secrets: &secrets,
            service_env: &[],
        };
        container_env(&ctx, &container(env))
    }

    fn field(name: &str, path: &str) -> serde_json::Value {
        json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    }

    #[test]
    fn downward_api_fields_resolve() {
        let env = resolve(json!([
            field("NODE", "spec.nodeName"),
            field("NAME", "metadata.name"),
            field("NS", "metadata.namespace"),
            field("UID", "metadata.uid"),
            field("IP", "status.podIP"),
            field("APP", "metadata.labels['app']"),
            field("ANN", "metadata.annotations['a/b']"),
        ]))
        .unwrap();
        let want = [
            ("NODE", "gpu-01"),
            ("NAME", "p"),
            ("NS", "ns"),
            ("UID", "u-1"),
            ("IP", "127.0.0.1"),
            ("APP", "train"),
            ("ANN", "c"),
        ];
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn resource_field_refs_divide_and_default_limits_to_the_node() {
        let env = resolve(json!([
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
            {"name": "CPU_LIM_M", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
        ]))
        .unwrap();
        assert_eq!(env[0].1, "1024");
        assert_eq!(env[1].1, "2", "1500m rounds up to 2 whole cpus");
        assert_eq!(env[2].1, "8000", "no cpu limit: the node's allocatable");
    }

    #[test]
    fn values_expand_earlier_variables_and_later_definitions_win() {
        let env = resolve(json!([
            {"name": "A", "value": "x"},
            {"name": "B", "value": "$(A)-$(MISSING)-$$(A)-$"},
            {"name": "A", "value": "y"},
        ]))
        .unwrap();
        assert_eq!(
            env,
            vec![
                ("A".into(), "y".into()),
                ("B".into(), "x-$(MISSING)-$(A)-$".into())
            ]
        );
    }

    #[test]
    fn config_map_refs_resolve_and_missing_ones_fail_like_a_kubelet() {
        let ok = resolve(
            json!([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]),
        );
        assert_eq!(ok.unwrap(), vec![("K".into(), "v".into())]);
        let missing_key = resolve(
            json!([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "nope"}}}]),
        );
        assert_eq!(
            missing_key.unwrap_err().0,
            "couldn't find key nope in ConfigMap ns/cm"
        );
        let missing = resolve(
            json!([{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        );
        assert_eq!(missing.unwrap_err().0, "secret \"s\" not found");
        let optional = resolve(
            json!([{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": true}}}]),
        );
        assert_eq!(optional.unwrap(), vec![]);
    }

    #[test]
    fn service_links_name_the_cluster_ip_and_the_service_port() {
        let svc = |v: serde_json::Value| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(v).unwrap()
        };
        let services = [
            svc(
                json!({"metadata": {"name": "tandem-ctl"}, "spec": {"clusterIP": "127.128.0.7",
                "ports": [{"name": "grpc", "port": 80, "targetPort": 6817, "protocol": "TCP"}]}}),
            ),
            svc(
                json!({"metadata": {"name": "headless"}, "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}),
            ),
        ];
        let env = service_env(&services);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("TANDEM_CTL_SERVICE_HOST"), Some("127.128.0.7"));
        assert_eq!(get("TANDEM_CTL_SERVICE_PORT"), Some("80"));
        assert_eq!(get("TANDEM_CTL_SERVICE_PORT_GRPC"), Some("80"));
        assert_eq!(get("TANDEM_CTL_PORT"), Some("tcp://127.128.0.7:80"));
        assert_eq!(get("TANDEM_CTL_PORT_80_TCP"), Some("tcp://127.128.0.7:80"));
        assert_eq!(get("TANDEM_CTL_PORT_80_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("TANDEM_CTL_PORT_80_TCP_PORT"), Some("80"));
        assert_eq!(get("TANDEM_CTL_PORT_80_TCP_ADDR"), Some("127.128.0.7"));
        assert!(
            get("HEADLESS_SERVICE_HOST").is_none(),
            "headless services get no variables"
        );
    }

    #[test]
    fn command_and_args_expand_against_the_environment() {
        let c: Container = serde_json::from_value(json!({"name": "c",
            "command": ["$(BIN)", "--x=$(X)"], "args": ["$$(X)", "$(NOPE)", "$(X)$(X)"]}))
        .unwrap();
        let env = vec![
            ("BIN".to_string(), "tandem".to_string()),
            ("X".into(), "1".into()),
        ];
        let got = expand_command(&c, &env);
        assert_eq!(got.command.unwrap(), vec!["tandem", "--x=1"]);
        assert_eq!(got.args.unwrap(), vec!["$(X)", "$(NOPE)", "11"]);
        let bare: Container = serde_json::from_value(json!({"name": "c"})).unwrap();
        assert!(
            expand_command(&bare, &env).command.is_none(),
            "unset stays unset"
        );
    }

    #[test]
    fn expansion_edge_cases() {
        let lookup = |n: &str| (n == "X").then_some("1");
        assert_eq!(expand("$(X)$(X)", lookup), "11");
        assert_eq!(expand("$(X", lookup), "$(X");
        assert_eq!(expand("a$b", lookup), "a$b");
        assert_eq!(expand("$$$$", lookup), "$$");
    }
}
