//! CustomResourceDefinitions: turning a CRD into a served type, and the structural-schema
//! work a real server does on custom resources (pruning, defaulting, validation).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::error::{ApiError, ApiResult, Cause};
use super::resource::{PrinterColumn, ResourceType, ScalePaths, jsonpath_to_pointer};

/// Per-version schema of a custom resource.
pub struct VersionSchema {
    /// The `openAPIV3Schema` as written (pruning and defaulting walk it).
    pub schema: Value,
    /// The same schema compiled as JSON Schema (`nullable` rewritten as a `null` type).
    pub validator: jsonschema::Validator,
}

impl std::fmt::Debug for VersionSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionSchema").finish_non_exhaustive()
    }
}

/// What a CRD adds beyond [`ResourceType`].
#[derive(Debug, Default)]
pub struct CustomInfo {
    pub schemas: BTreeMap<String, VersionSchema>,
    pub columns: BTreeMap<String, Vec<PrinterColumn>>,
}

/// Builds the served type from a CRD object, or says which field is wrong.
pub fn type_from_crd(crd: &Value) -> ApiResult<ResourceType> {
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default();
    let kind = names["kind"].as_str().unwrap_or_default();
    let invalid = |causes: Vec<Cause>| {
        ApiError::invalid(
            "CustomResourceDefinition",
            "apiextensions.k8s.io",
            name,
            causes,
        )
    };
    let mut causes = Vec::new();
    if group.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.group",
            "Required value",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.plural",
            "Required value",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value",
        ));
    }
    if name != format!("{plural}.{group}") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let scope = spec["scope"].as_str().unwrap_or_default();
    if scope != "Namespaced" && scope != "Cluster" {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            "spec.scope",
            format!(
                "Unsupported value: \"{scope}\": supported values: \"Cluster\", \"Namespaced\""
            ),
        ));
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    let storage: Vec<&Value> = versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .collect();
    if storage.len() != 1 {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    if !causes.is_empty() {
        return Err(invalid(causes));
    }
    let storage = storage[0];
    let mut served: Vec<String> = vec![storage["name"].as_str().unwrap_or_default().to_owned()];
    for v in &versions {
        let n = v["name"].as_str().unwrap_or_default();
        if v["served"].as_bool() == Some(true) && !served.iter().any(|s| s == n) {
            served.push(n.to_owned());
        }
    }
    if storage["served"].as_bool() != Some(true) {
        served.remove(0);
    }
    let mut info = CustomInfo::default();
    for (i, v) in versions.iter().enumerate() {
        let vname = v["name"].as_str().unwrap_or_default().to_owned();
        if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
            let validator = jsonschema::validator_for(&to_json_schema(schema)).map_err(|e| {
                invalid(vec![Cause::new(
                    "FieldValueInvalid",
                    format!("spec.versions[{i}].schema.openAPIV3Schema"),
                    format!("Invalid value: {e}"),
                )])
            })?;
            info.schemas.insert(
                vname.clone(),
                VersionSchema {
                    schema: schema.clone(),
                    validator,
                },
            );
        }
        let columns = v["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some(PrinterColumn {
                    name: c["name"].as_str()?.to_owned(),
                    type_: c["type"].as_str().unwrap_or("string").to_owned(),
                    pointer: jsonpath_to_pointer(c["jsonPath"].as_str()?)?,
                })
            })
            .collect();
        info.columns.insert(vname, columns);
    }
    let subresources = &storage["subresources"];
    let scale = subresources
        .get("scale")
        .filter(|s| s.is_object())
        .and_then(|s| {
            Some(ScalePaths {
                spec_replicas: jsonpath_to_pointer(s["specReplicasPath"].as_str()?)?,
                status_replicas: jsonpath_to_pointer(s["statusReplicasPath"].as_str()?)?,
                label_selector: s["labelSelectorPath"]
                    .as_str()
                    .and_then(jsonpath_to_pointer),
            })
        });
    Ok(ResourceType {
        group: group.to_owned(),
        versions: served,
        kind: kind.to_owned(),
        plural: plural.to_owned(),
        singular: names["singular"]
            .as_str()
            .map_or_else(|| kind.to_lowercase(), str::to_owned),
        short_names: names["shortNames"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        namespaced: scope == "Namespaced",
        status: subresources.get("status").is_some_and(Value::is_object),
        scale,
        extra_subresources: Vec::new(),
        custom: Some(Arc::new(info)),
    })
}

/// The status a real server reports once the names are accepted and the type is served.
pub fn established_status(crd: &Value) -> Value {
    let now = super::meta::now_rfc3339();
    let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "lastTransitionTime": now, "reason": reason, "message": msg});
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .map(|v| v["name"].clone())
        .collect();
    json!({
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": storage,
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
    })
}

/// OpenAPI v3 (Kubernetes dialect) to JSON Schema: `nullable: true` becomes an extra `null`
/// type. `x-kubernetes-*` keywords are unknown to JSON Schema and so ignored by validation.
fn to_json_schema(s: &Value) -> Value {
    match s {
        Value::Object(m) => {
            let mut out: serde_json::Map<String, Value> = m
                .iter()
                .map(|(k, v)| (k.clone(), to_json_schema(v)))
                .collect();
            // `properties` maps names to schemas; recursion above already converted them.
            if m.get("nullable").and_then(Value::as_bool) == Some(true)
                && let Some(Value::String(t)) = m.get("type")
            {
                out.insert("type".into(), json!([t, "null"]));
            }
            if m.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true) {
                out.remove("type");
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

/// Prunes fields the schema does not know and fills `default`s, as a real server does for
/// structural schemas. `root` keeps `apiVersion`, `kind` and `metadata`.
pub fn prune_and_default(v: &mut Value, s: &Value, root: bool) {
    let preserve = s["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    match v {
        Value::Object(obj) => {
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            let embedded = s["x-kubernetes-embedded-resource"].as_bool() == Some(true);
            obj.retain(|k, _| {
                (root || embedded) && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                    || props.is_some_and(|p| p.contains_key(k))
                    || additional.is_some_and(|a| a.is_object() || a.as_bool() == Some(true))
                    || preserve
            });
            if let Some(props) = props {
                for (k, ps) in props {
                    if !obj.contains_key(k)
                        && let Some(d) = ps.get("default")
                    {
                        obj.insert(k.clone(), d.clone());
                    }
                }
            }
            for (k, child) in obj.iter_mut() {
                if root && k == "metadata" {
                    continue;
                }
                if let Some(ps) = props.and_then(|p| p.get(k)) {
                    prune_and_default(child, ps, false);
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    prune_and_default(child, a, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items {
                    prune_and_default(item, is, false);
                }
            }
        }
        _ => {}
    }
}

/// Validates a custom resource against its version's schema; causes name the field.
pub fn validate(rt: &ResourceType, version: &str, obj: &Value) -> Vec<Cause> {
    let Some(info) = &rt.custom else {
        return Vec::new();
    };
    let Some(vs) = info
        .schemas
        .get(version)
        .or_else(|| info.schemas.get(rt.storage_version()))
    else {
        return Vec::new();
    };
    let mut instance = obj.clone();
    if let Some(o) = instance.as_object_mut() {
        // metadata is validated by the server's own rules, not the CRD schema.
        o.remove("metadata");
    }
    let mut causes = Vec::new();
    for e in vs.validator.iter_errors(&instance) {
        let mut field = pointer_to_field(e.instance_path().as_str());
        let (reason, message) = match e.kind() {
            jsonschema::error::ValidationErrorKind::Required { property } => {
                let p = property.as_str().unwrap_or_default();
                field = if field.is_empty() {
                    p.to_owned()
                } else {
                    format!("{field}.{p}")
                };
                ("FieldValueRequired", "Required value".to_owned())
            }
            jsonschema::error::ValidationErrorKind::Type { .. } => (
                "FieldValueTypeInvalid",
                format!(
                    "Invalid value: {}: {field} in body {}",
                    e.instance(),
                    strip_instance(&e.to_string())
                ),
            ),
            jsonschema::error::ValidationErrorKind::Enum { .. } => (
                "FieldValueNotSupported",
                format!("Unsupported value: {}: {}", e.instance(), e),
            ),
            _ => (
                "FieldValueInvalid",
                format!("Invalid value: {}: {}", e.instance(), e),
            ),
        };
        causes.push(Cause::new(reason, field, message));
    }
    causes
}

fn strip_instance(msg: &str) -> String {
    // jsonschema says `"x" is not of type "integer"`; the real server says
    // `must be of type integer`.
    match msg.rsplit_once("is not of type ") {
        Some((_, t)) => format!("must be of type {}", t.replace('"', "")),
        None => msg.to_owned(),
    }
}

/// `/spec/items/0/name` -> `spec.items[0].name`
pub fn pointer_to_field(p: &str) -> String {
    let mut out = String::new();
    for seg in p.split('/').filter(|s| !s.is_empty()) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&seg);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_to_field_uses_brackets_for_indices() {
        assert_eq!(pointer_to_field("/spec/items/0/name"), "spec.items[0].name");
        assert_eq!(pointer_to_field(""), "");
    }

    #[test]
    fn pruning_drops_unknown_and_fills_defaults() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "default": 1},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }}
        }});
        let mut v = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"}, "bogus": 1,
            "spec": {"extra": true, "free": {"any": 1}, "labels": {"a": "b"}}});
        prune_and_default(&mut v, &schema, true);
        assert_eq!(
            v,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"replicas": 1, "free": {"any": 1}, "labels": {"a": "b"}}})
        );
    }
}
