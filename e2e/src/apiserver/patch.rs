//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch
//! (for the list fields this project uses), and server-side apply.
//!
//! # Simplifications
//! - Strategic merge knows merge keys by field name (`containers` by `name`, `conditions` by
//!   `type`, ...) instead of from the OpenAPI schema; every other list is replaced whole.
//!   Directives other than `$patch: delete|replace` and `$deleteFromPrimitiveList` are ignored.
//! - Server-side apply tracks field ownership only between *appliers*: a field set by a
//!   plain update is owned by nobody, so it never conflicts. Conflicts compare values; a
//!   conflicting apply gets 409 unless `force=true`, which takes the field over.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::error::{ApiError, ApiResult};

/// The four patch content types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or("").trim();
        match ct {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml"
            | "application/apply-patch+json"
            | "application/apply-patch+cbor" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// RFC 6902. A malformed document is 400; an operation that does not apply (a failed `test`
/// included) is 422 `Invalid`, with the real server's message, and changes nothing.
///
/// As the real server's library (evanphx/json-patch) does, a `test` for `null` passes where
/// the object has no such field: kube-rs's finalizer helper tests `/metadata/finalizers`
/// for `null` before adding the first one.
pub fn json_patch(doc: &mut Value, patch: &Value) -> ApiResult<()> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut out = doc.clone();
    for op in ops.iter() {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && absent_field(&out, t.path.as_str())
        {
            continue;
        }
        json_patch::patch(&mut out, std::slice::from_ref(op)).map_err(|_| {
            ApiError::new(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            )
        })?;
    }
    *doc = out;
    Ok(())
}

/// Whether `pointer` names a missing field of an existing object (not a missing array
/// element, nor anything under a missing parent).
fn absent_field(doc: &Value, pointer: &str) -> bool {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return false;
    };
    let key = last.replace("~1", "/").replace("~0", "~");
    doc.pointer(parent)
        .and_then(Value::as_object)
        .is_some_and(|o| !o.contains_key(&key))
}

/// RFC 7386.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// The merge key of a list field, by field name and its parent (`ports` differs in a Service
/// and in a container).
fn merge_key(parent: &str, field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" | "addresses" => "type",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        "ports" if parent == "spec" => "port",
        "ports" => "containerPort",
        _ => return None,
    })
}

/// Lists of strings merged as sets.
fn is_set_list(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch of `patch` into `doc`.
pub fn strategic_merge(doc: &mut Value, patch: &Value) {
    smp(doc, patch, "");
}

fn smp(doc: &mut Value, patch: &Value, parent: &str) {
    let Value::Object(p) = patch else {
        *doc = strip_directives(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *doc = strip_directives(patch);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(d) = doc else { return };
    for (k, pv) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Some(del)) = (d.get_mut(field), pv.as_array()) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                d.remove(k);
            }
            Value::Object(_) => smp(d.entry(k.clone()).or_insert(Value::Null), pv, k),
            Value::Array(items) => {
                let merged = match (d.get_mut(k), merge_key(parent, k)) {
                    (Some(Value::Array(cur)), Some(key)) if items.iter().all(Value::is_object) => {
                        merge_list_by_key(cur, items, key);
                        true
                    }
                    (Some(Value::Array(cur)), None) if is_set_list(k) => {
                        for it in items {
                            if !cur.contains(it) {
                                cur.push(it.clone());
                            }
                        }
                        true
                    }
                    _ => false,
                };
                if !merged {
                    let items: Vec<Value> = items
                        .iter()
                        .filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete"))
                        .map(strip_directives)
                        .collect();
                    d.insert(k.clone(), Value::Array(items));
                }
            }
            other => {
                d.insert(k.clone(), other.clone());
            }
        }
    }
}

fn merge_list_by_key(cur: &mut Vec<Value>, items: &[Value], key: &str) {
    for it in items {
        let kv = it.get(key);
        let pos = cur.iter().position(|c| c.get(key) == kv && kv.is_some());
        let delete = it.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => smp(&mut cur[i], it, ""),
            (None, false) => cur.push(strip_directives(it)),
        }
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

// === server-side apply ===

/// One step of a managed-field path, in `fieldsV1` spelling (`f:name`, `k:{"name":"a"}`,
/// `v:"x"`).
type Path = Vec<String>;

/// Metadata fields that apply manages (the rest are the server's).
const APPLIED_METADATA: &[&str] = &["labels", "annotations", "finalizers", "ownerReferences"];

/// The set of leaf paths an applied configuration sets.
pub fn field_set(applied: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Value::Object(m) = applied {
        for (k, v) in m {
            match k.as_str() {
                "apiVersion" | "kind" => {}
                "metadata" => {
                    if let Value::Object(mm) = v {
                        for f in APPLIED_METADATA {
                            if let Some(x) = mm.get(*f) {
                                collect(
                                    x,
                                    vec!["f:metadata".into(), format!("f:{f}")],
                                    "metadata",
                                    f,
                                    &mut out,
                                );
                            }
                        }
                    }
                }
                _ => collect(v, vec![format!("f:{k}")], "", k, &mut out),
            }
        }
    }
    out
}

fn collect(v: &Value, path: Path, parent: &str, field: &str, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                collect(c, p, field, k, out);
            }
        }
        Value::Array(items) => {
            if let Some(key) =
                merge_key(parent, field).filter(|_| items.iter().all(Value::is_object))
            {
                for it in items {
                    let mut p = path.clone();
                    p.push(format!(
                        "k:{}",
                        json!({ key: it.get(key).cloned().unwrap_or(Value::Null) })
                    ));
                    let mut item = p.clone();
                    item.push(".".into());
                    out.insert(item);
                    if let Value::Object(m) = it {
                        for (k, c) in m {
                            let mut cp = p.clone();
                            cp.push(format!("f:{k}"));
                            collect(c, cp, field, k, out);
                        }
                    }
                }
            } else if is_set_list(field) {
                for it in items {
                    let mut p = path.clone();
                    p.push(format!("v:{it}"));
                    out.insert(p);
                }
            } else {
                out.insert(path);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// `fieldsV1` as the real server encodes it: nested objects, `{}` at leaves, `.` for the item
/// itself.
pub fn encode_fields(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let next = cur
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(m) = next else { break };
            cur = m;
        }
    }
    Value::Object(root)
}

pub fn decode_fields(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, c) in m {
                    path.push(k.clone());
                    walk(c, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

fn lookup<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for seg in path {
        if seg == "." {
            return Some(cur);
        }
        cur = step(cur, seg)?;
    }
    Some(cur)
}

fn step<'a>(cur: &'a Value, seg: &str) -> Option<&'a Value> {
    if let Some(f) = seg.strip_prefix("f:") {
        return cur.get(f);
    }
    if let Some(k) = seg.strip_prefix("k:") {
        let want: Map<String, Value> = serde_json::from_str(k).ok()?;
        return cur
            .as_array()?
            .iter()
            .find(|it| want.iter().all(|(wk, wv)| it.get(wk) == Some(wv)));
    }
    if let Some(val) = seg.strip_prefix("v:") {
        let want: Value = serde_json::from_str(val).ok()?;
        return cur.as_array()?.iter().find(|it| **it == want);
    }
    None
}

/// Removes the field a path names (an item for `k:`/`v:` paths ending in `.`).
fn remove_path(doc: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let (target, parent_path) = if last == "." {
        match parents.split_last() {
            Some((item, pp)) => (item, pp),
            None => return,
        }
    } else {
        (last, parents)
    };
    let mut cur = doc;
    for seg in parent_path {
        let next = if let Some(f) = seg.strip_prefix("f:") {
            cur.get_mut(f)
        } else {
            let idx = index_of(cur, seg);
            match (idx, cur.as_array_mut()) {
                (Some(i), Some(a)) => a.get_mut(i),
                _ => None,
            }
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = target.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(i) = index_of(cur, target)
        && let Some(a) = cur.as_array_mut()
    {
        a.remove(i);
    }
}

fn index_of(list: &Value, seg: &str) -> Option<usize> {
    let found = step(list, seg)?;
    list.as_array()?.iter().position(|x| std::ptr::eq(x, found))
}

/// Applies `applied` for `manager` on top of `live` (None: the object does not exist yet).
/// Returns the new object with `metadata.managedFields` updated.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    resource: &str,
    name: &str,
) -> ApiResult<Value> {
    let new_set = field_set(applied);
    let api_version = applied["apiVersion"].clone();
    let mut managers: Vec<Value> = live
        .and_then(|l| l["metadata"]["managedFields"].as_array().cloned())
        .unwrap_or_default();
    let mut result = match live {
        Some(l) => l.clone(),
        None => Value::Object(Map::new()),
    };
    // Conflicts: fields another applier owns whose value this apply would change.
    let mut conflicts = Vec::new();
    for m in managers.iter_mut() {
        let other = m["manager"].as_str().unwrap_or_default().to_owned();
        if other == manager || m["operation"].as_str() != Some("Apply") {
            continue;
        }
        let mut owned = decode_fields(&m["fieldsV1"]);
        let clash: Vec<Path> = owned
            .iter()
            .filter(|p| new_set.contains(*p) && lookup(&result, p) != lookup(applied, p))
            .cloned()
            .collect();
        if clash.is_empty() {
            continue;
        }
        if force {
            for p in &clash {
                owned.remove(p);
            }
            m["fieldsV1"] = encode_fields(&owned);
        } else {
            conflicts.extend(
                clash
                    .iter()
                    .map(|p| format!("conflict with \"{other}\": .{}", display_path(p))),
            );
        }
    }
    if !conflicts.is_empty() {
        let mut e = ApiError::conflict(resource, name, "Apply failed with conflicts");
        e.message = format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            conflicts.join(", ")
        );
        return Err(e);
    }
    // Fields this manager applied before and no longer applies are removed, unless another
    // applier still owns them.
    let old_set = managers
        .iter()
        .find(|m| {
            m["manager"].as_str() == Some(manager) && m["operation"].as_str() == Some("Apply")
        })
        .map(|m| decode_fields(&m["fieldsV1"]))
        .unwrap_or_default();
    let others: BTreeSet<Path> = managers
        .iter()
        .filter(|m| {
            m["manager"].as_str() != Some(manager) && m["operation"].as_str() == Some("Apply")
        })
        .flat_map(|m| decode_fields(&m["fieldsV1"]))
        .collect();
    let mut dropped: Vec<&Path> = old_set
        .iter()
        .filter(|p| !new_set.contains(*p) && !others.contains(*p))
        .collect();
    // Deepest first, so removing an item does not hide its fields' paths.
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        remove_path(&mut result, p);
    }
    let mut patch = applied.clone();
    if let Some(m) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    strategic_merge(&mut result, &patch);
    // Re-applying the same configuration changes nothing, not even the entry's time, so a
    // controller that applies on every reconcile does not wake itself up.
    let without_fields = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        v
    };
    if let Some(l) = live
        && old_set == new_set
        && without_fields(l) == without_fields(&result)
    {
        return Ok(l.clone());
    }
    managers.retain(|m| {
        !(m["manager"].as_str() == Some(manager) && m["operation"].as_str() == Some("Apply"))
    });
    managers.push(json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": super::meta::now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": encode_fields(&new_set),
    }));
    super::meta::meta_mut(&mut result).insert("managedFields".into(), Value::Array(managers));
    Ok(result)
}

fn display_path(p: &Path) -> String {
    p.iter()
        .map(|s| s.trim_start_matches("f:").to_owned())
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategic_merge_merges_containers_by_name() {
        let mut doc = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
            "tolerations": [{"key": "k"}]}});
        strategic_merge(
            &mut doc,
            &json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}],
            "tolerations": [{"key": "t"}]}}),
        );
        assert_eq!(
            doc["spec"]["containers"],
            json!([{"name": "a", "image": "x"}, {"name": "b", "image": "z"}, {"name": "c", "image": "w"}])
        );
        assert_eq!(doc["spec"]["tolerations"], json!([{"key": "t"}]));
        strategic_merge(
            &mut doc,
            &json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
        );
        assert_eq!(doc["spec"]["containers"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn finalizers_merge_as_a_set() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        strategic_merge(&mut doc, &json!({"metadata": {"finalizers": ["a", "b"]}}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
    }

    #[test]
    fn apply_removes_fields_it_no_longer_sets_and_detects_conflicts() {
        let first = apply(None, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}}), "m1", false, "configmaps", "c").unwrap();
        let second = apply(Some(&first), &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}), "m1", false, "configmaps", "c").unwrap();
        assert_eq!(second["data"], json!({"a": "1"}));
        let err = apply(Some(&second), &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "9"}}), "m2", false, "configmaps", "c").unwrap_err();
        assert_eq!(err.code, 409);
        let forced = apply(Some(&second), &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "9"}}), "m2", true, "configmaps", "c").unwrap();
        assert_eq!(forced["data"]["a"], "9");
        // m1 lost "a" to m2, so m1 dropping it does not remove it.
        let third = apply(
            Some(&forced),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            "m1",
            false,
            "configmaps",
            "c",
        )
        .unwrap();
        assert_eq!(third["data"]["a"], "9");
    }

    #[test]
    fn fields_round_trip() {
        let set = field_set(
            &json!({"spec": {"containers": [{"name": "a", "image": "x"}]}, "metadata": {"labels": {"l": "v"}}}),
        );
        assert_eq!(decode_fields(&encode_fields(&set)), set);
    }
}
