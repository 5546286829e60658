//! A minimal OpenAPI v3 document: for each group-version, the write operations of each kind
//! with the `fieldValidation` query parameter. That is what `kubectl` looks for to use
//! server-side field validation (`kubectl apply/create` without `--validate=false`); there
//! are no schemas, so clients that need schemas (client-side validation, `kubectl explain`)
//! do not get them.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::resource::ResourceType;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group-version's document is.
pub fn root(types: &[Arc<ResourceType>]) -> Value {
    let gvs: BTreeSet<String> = types
        .iter()
        .flat_map(|t| t.versions.iter().map(|v| gv_path(&t.group, v)))
        .collect();
    let paths: Map<String, Value> = gvs
        .into_iter()
        .map(|p| {
            let url = format!("/openapi/v3/{p}");
            (p, json!({"serverRelativeURL": url}))
        })
        .collect();
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`.
pub fn group_version(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for rt in types
        .iter()
        .filter(|t| t.group == group && t.serves(version))
    {
        let gvk = json!({"group": group, "version": version, "kind": rt.kind});
        let params = json!([
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        ]);
        let op = |verb: &str| json!({"operationId": format!("{verb}{}", rt.kind), "x-kubernetes-action": verb, "x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {"200": {"description": "OK"}}});
        let base = if rt.namespaced {
            format!(
                "/{}/namespaces/{{namespace}}/{}",
                gv_path(group, version),
                rt.plural
            )
        } else {
            format!("/{}/{}", gv_path(group, version), rt.plural)
        };
        paths.insert(base.clone(), json!({"get": op("list"), "post": op("post")}));
        paths.insert(format!("{base}/{{name}}"), json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (tandem kube-sim)", "version": "v1.35.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
