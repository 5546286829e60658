//! Discovery documents (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`)
//! in the legacy, non-aggregated form, which kube-rs and kubectl both accept.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::resource::ResourceType;

pub const KUBE_VERSION: (&str, &str) = ("1", "35");

pub fn version() -> Value {
    json!({
        "major": KUBE_VERSION.0,
        "minor": KUBE_VERSION.1,
        "gitVersion": format!("v{}.{}.0-tandem-sim", KUBE_VERSION.0, KUBE_VERSION.1),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (Rust)",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// Served versions per group, preferred first.
fn groups(types: &[Arc<ResourceType>]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rt in types.iter().filter(|t| !t.group.is_empty()) {
        let vs = out.entry(rt.group.clone()).or_default();
        for v in &rt.versions {
            if !vs.contains(v) {
                vs.push(v.clone());
            }
        }
    }
    out
}

pub fn group_list(types: &[Arc<ResourceType>]) -> Value {
    let list: Vec<Value> = groups(types)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": list})
}

pub fn group(types: &[Arc<ResourceType>], name: &str) -> Option<Value> {
    let g = groups(types);
    let vs = g.get(name)?;
    let mut doc = group_doc(name, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `kubectl get all` lists the kinds in the `all` category.
fn categories(rt: &ResourceType) -> Vec<&'static str> {
    let all = matches!(
        (rt.group.as_str(), rt.plural.as_str()),
        ("", "pods")
            | ("", "services")
            | ("apps", "deployments")
            | ("apps", "replicasets")
            | ("apps", "statefulsets")
            | ("apps", "daemonsets")
            | ("batch", "jobs")
            | ("autoscaling", "horizontalpodautoscalers")
    );
    if all { vec!["all"] } else { Vec::new() }
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn resource_list(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for rt in types
        .iter()
        .filter(|t| t.group == group && t.serves(version))
    {
        resources.push(json!({
            "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced, "kind": rt.kind,
            "verbs": ALL_VERBS, "shortNames": rt.short_names, "categories": categories(rt),
            "storageVersionHash": "",
        }));
        if rt.status {
            resources.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced, "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
        }
        if rt.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", rt.plural), "singularName": "", "namespaced": rt.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        for sub in &rt.extra_subresources {
            let (kind, verbs, group_version) = match *sub {
                "binding" => ("Binding", vec!["create"], None),
                "eviction" => ("Eviction", vec!["create"], Some(("policy", "v1"))),
                _ => ("Pod", vec!["get"], None),
            };
            let mut r = json!({"name": format!("{}/{sub}", rt.plural), "singularName": "", "namespaced": rt.namespaced, "kind": kind, "verbs": verbs});
            if let Some((g, v)) = group_version {
                r["group"] = json!(g);
                r["version"] = json!(v);
            }
            resources.push(r);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
