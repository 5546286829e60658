//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for): Name and Age, the printer
//! columns a CRD declares, and a few columns of the built-in kinds tests look at.

use serde_json::{Value, json};

use super::resource::{ResourceType, at};

fn age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (k8s_openapi::jiff::Timestamp::now().as_second() - t.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn column(name: &str, type_: &str) -> Value {
    json!({"name": name, "type": type_, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": 0})
}

fn cell(v: Option<&Value>, type_: &str) -> Value {
    match (v, type_) {
        (None, _) => json!("<none>"),
        (Some(Value::String(s)), "date") => json!(age(Some(s))),
        (Some(v), _) => v.clone(),
    }
}

/// The computed pod columns `kubectl get pods` shows (`1/2`, `Terminating`, restarts).
fn pod_cell(pod: &Value, what: &str) -> Value {
    let statuses: Vec<&Value> = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    match what {
        "ready" => {
            let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|s| s["ready"] == true).count();
            json!(format!("{ready}/{total}"))
        }
        "restarts" => json!(
            statuses
                .iter()
                .map(|s| s["restartCount"].as_i64().unwrap_or(0))
                .sum::<i64>()
        ),
        _ => {
            if !pod["metadata"]["deletionTimestamp"].is_null() {
                return json!("Terminating");
            }
            let waiting = statuses
                .iter()
                .find_map(|s| s["state"]["waiting"]["reason"].as_str());
            let terminated = statuses
                .iter()
                .find_map(|s| s["state"]["terminated"]["reason"].as_str());
            let phase = pod["status"]["reason"]
                .as_str()
                .or(pod["status"]["phase"].as_str())
                .unwrap_or("Unknown");
            json!(waiting.or(terminated).unwrap_or(phase))
        }
    }
}

/// Built-in extra columns: (header, type, pointer).
fn builtin_columns(rt: &ResourceType) -> Vec<(&'static str, &'static str, &'static str)> {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => vec![
            ("Ready", "string", "#ready"),
            ("Status", "string", "#status"),
            ("Restarts", "integer", "#restarts"),
            ("Node", "string", "/spec/nodeName"),
        ],
        ("", "namespaces") => vec![("Status", "string", "/status/phase")],
        ("apps", "deployments") | ("apps", "replicasets") | ("apps", "statefulsets") => {
            vec![
                ("Replicas", "integer", "/spec/replicas"),
                ("Ready", "integer", "/status/readyReplicas"),
            ]
        }
        _ => Vec::new(),
    }
}

/// Turns a list (or a single object) into a Table.
pub fn to_table(rt: &ResourceType, version: &str, v: &Value) -> Value {
    let items: Vec<&Value> = match v.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().collect(),
        None => vec![v],
    };
    let custom: Vec<(String, String, String)> = rt
        .custom
        .as_ref()
        .and_then(|c| c.columns.get(version))
        .map(|cols| {
            cols.iter()
                .map(|c| (c.name.clone(), c.type_.clone(), c.pointer.clone()))
                .collect()
        })
        .unwrap_or_else(|| {
            builtin_columns(rt)
                .into_iter()
                .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
                .collect()
        });
    let mut defs = vec![column("Name", "string")];
    defs.extend(custom.iter().map(|(n, t, _)| column(n, t)));
    let has_age = custom.iter().any(|(n, _, _)| n == "Age");
    if !has_age {
        defs.push(column("Age", "string"));
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            cells.extend(custom.iter().map(|(_, t, p)| match p.strip_prefix('#') {
                Some(computed) => pod_cell(o, computed),
                None => cell(at(o, p), t),
            }));
            if !has_age {
                cells.push(json!(age(o["metadata"]["creationTimestamp"].as_str())));
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": v["metadata"]["resourceVersion"], "continue": v["metadata"]["continue"]},
        "columnDefinitions": defs,
        "rows": rows,
    })
}
