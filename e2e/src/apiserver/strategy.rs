//! Per-kind rules a real server applies on write: defaulting, status handling, and
//! validation. Pure functions over JSON.

use serde_json::{Value, json};

use super::crd;
use super::error::{ApiError, ApiResult, Cause};
use super::meta;
use super::resource::ResourceType;

/// Which part of an object a write targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

fn is(rt: &ResourceType, group: &str, plural: &str) -> bool {
    rt.group == group && rt.plural == plural
}

/// Defaulting and status initialisation on create.
pub fn prepare_create(rt: &ResourceType, obj: &mut Value) {
    set_type_meta(rt, rt.storage_version(), obj);
    if rt.status && !is(rt, "", "nodes") {
        // Status is the server's (or a controller's) to set; a create cannot set it.
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
    }
    let m = meta::meta_mut(obj);
    for f in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        m.remove(f);
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => default_pod(obj),
        ("", "namespaces") => {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
            let name = meta::name(obj).to_owned();
            let labels = meta::meta_mut(obj)
                .entry("labels")
                .or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
        }
        ("", "services") => default_service(obj),
        ("", "secrets") => fold_string_data(obj),
        ("", "persistentvolumeclaims") => {
            // No provisioner: claims are bound at once to an imaginary volume.
            let uid_hint = meta::random_suffix();
            obj["spec"]["volumeName"] = json!(format!("pvc-{uid_hint}"));
            obj["status"] = json!({
                "phase": "Bound",
                "accessModes": obj["spec"]["accessModes"].clone(),
                "capacity": obj["spec"]["resources"]["requests"].clone(),
            });
        }
        ("apps", "deployments") | ("apps", "replicasets") | ("apps", "statefulsets")
            if obj["spec"]["replicas"].is_null() =>
        {
            obj["spec"]["replicas"] = json!(1);
        }
        ("batch", "jobs") => {
            for (f, d) in [("parallelism", 1), ("completions", 1), ("backoffLimit", 6)] {
                default_to(&mut obj["spec"], f, json!(d));
            }
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            obj["status"] = crd::established_status(obj);
            // Held until the type's objects are gone (see gc.rs).
            let f = meta::meta_mut(obj)
                .entry("finalizers")
                .or_insert_with(|| json!([]));
            if let Some(a) = f.as_array_mut()
                && !a
                    .iter()
                    .any(|x| x == "customresourcecleanup.apiextensions.k8s.io")
            {
                a.push(json!("customresourcecleanup.apiextensions.k8s.io"));
            }
        }
        _ => {}
    }
    default_custom(rt, obj);
}

/// Sets `obj[key]` to `value` where the client left it unset (null or absent).
fn default_to(obj: &mut Value, key: &str, value: Value) {
    if obj[key].is_null() {
        obj[key] = value;
    }
}

/// The elements of the array `obj[key]`; none where it is absent or not an array.
fn items_mut<'a>(obj: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    obj.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

fn default_pod(obj: &mut Value) {
    let spec = &mut obj["spec"];
    for (f, d) in [
        ("restartPolicy", json!("Always")),
        ("schedulerName", json!("default-scheduler")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("serviceAccountName", json!("default")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
    ] {
        default_to(spec, f, d);
    }
    for list in ["containers", "initContainers"] {
        for c in items_mut(spec, list) {
            let image = c["image"].as_str().unwrap_or_default().to_owned();
            if c["imagePullPolicy"].is_null() {
                let latest = image.ends_with(":latest")
                    || !image.rsplit('/').next().unwrap_or("").contains(':');
                c["imagePullPolicy"] = json!(if latest { "Always" } else { "IfNotPresent" });
            }
            default_to(c, "terminationMessagePath", json!("/dev/termination-log"));
            default_to(c, "terminationMessagePolicy", json!("File"));
            for p in items_mut(c, "ports") {
                default_to(p, "protocol", json!("TCP"));
            }
        }
    }
    let qos = qos_class(&obj["spec"]);
    obj["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// The pod's QoS class from its containers' requests and limits.
fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let any = containers.iter().any(|c| {
        c["resources"]["requests"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
            || c["resources"]["limits"]
                .as_object()
                .is_some_and(|m| !m.is_empty())
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        let l = &c["resources"]["limits"];
        let r = &c["resources"]["requests"];
        ["cpu", "memory"]
            .iter()
            .all(|k| !l[*k].is_null() && (r[*k].is_null() || r[*k] == l[*k]))
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

fn default_service(obj: &mut Value) {
    let spec = &mut obj["spec"];
    default_to(spec, "type", json!("ClusterIP"));
    // Cluster IPs come from a loopback block (see `crate::net`), so the harness's service
    // proxy can bind them; a real cluster's service CIDR (10.96.0.0/12) routes nowhere here.
    // ExternalName services get none, as on a real server.
    if spec["clusterIP"].is_null() && spec["type"] != "ExternalName" {
        let ip = crate::net::SERVICE_BLOCK.random().to_string();
        spec["clusterIP"] = json!(ip);
        spec["clusterIPs"] = json!([ip]);
    } else if spec["clusterIPs"].is_null() && spec["clusterIP"].is_string() {
        spec["clusterIPs"] = json!([spec["clusterIP"].clone()]);
    }
    if spec["clusterIP"] != "None" && spec["type"] != "ExternalName" {
        default_to(spec, "ipFamilies", json!(["IPv4"]));
        default_to(spec, "ipFamilyPolicy", json!("SingleStack"));
        default_to(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    default_to(spec, "sessionAffinity", json!("None"));
    for p in items_mut(spec, "ports") {
        default_to(p, "protocol", json!("TCP"));
        if p["targetPort"].is_null() {
            p["targetPort"] = p["port"].clone();
        }
    }
    obj["status"] = json!({"loadBalancer": {}});
}

fn default_custom(rt: &ResourceType, obj: &mut Value) {
    if let Some(info) = &rt.custom
        && let Some(vs) = info.schemas.get(rt.storage_version())
    {
        crd::prune_and_default(obj, &vs.schema, true);
    }
}

fn set_type_meta(rt: &ResourceType, version: &str, obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(rt.api_version(version)));
        o.insert("kind".into(), json!(rt.kind));
    }
}

/// Builds the object to store from the old one and the client's new one.
pub fn prepare_update(rt: &ResourceType, old: &Value, new: &Value, part: Part) -> Value {
    let mut out = match part {
        Part::Main => {
            let mut n = new.clone();
            if rt.status {
                match old.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(o) = n.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            n
        }
        Part::Status => {
            let mut n = old.clone();
            match new.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            n
        }
    };
    set_type_meta(rt, rt.storage_version(), &mut out);
    // System metadata is the server's.
    let old_meta = old["metadata"].clone();
    let m = meta::meta_mut(&mut out);
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "name",
        "namespace",
    ] {
        match old_meta.get(f) {
            Some(v) => {
                m.insert(f.into(), v.clone());
            }
            None => {
                m.remove(f);
            }
        }
    }
    if !m.contains_key("managedFields")
        && let Some(mf) = old_meta.get("managedFields")
    {
        m.insert("managedFields".into(), mf.clone());
    }
    m.remove("selfLink");
    if part == Part::Main {
        default_custom(rt, &mut out);
        if is(rt, "", "secrets") {
            fold_string_data(&mut out);
        }
    }
    out
}

/// A Secret's `stringData` folded into `data`, as the real server's conversion does on every
/// write (create, update, patch, apply): each value base64 of its UTF-8 string, over any
/// `data` entry of the same key. `stringData` is write-only: never stored nor returned.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine as _;
    let Some(o) = obj.as_object_mut() else { return };
    let Some(Value::Object(strings)) = o.remove("stringData") else {
        return;
    };
    if strings.is_empty() {
        return;
    }
    if !o.get("data").is_some_and(Value::is_object) {
        o.insert("data".into(), json!({}));
    }
    let Some(Value::Object(data)) = o.get_mut("data") else {
        return;
    };
    for (k, v) in strings {
        let text = v.as_str().unwrap_or_default();
        let encoded = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
        data.insert(k, json!(encoded));
    }
}

/// Validation on create (`old` None) and update. Returns 422 with causes.
pub fn validate(
    rt: &ResourceType,
    version: &str,
    obj: &Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    let name = meta::name(obj);
    let mut causes = Vec::new();
    let label_named = matches!(
        (rt.group.as_str(), rt.plural.as_str()),
        ("", "namespaces") | ("", "services")
    );
    let c = if label_named {
        meta::check_label("metadata.name", name)
    } else {
        meta::check_subdomain("metadata.name", name)
    };
    if name.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    } else if let Some(c) = c {
        causes.push(c);
    }
    causes.extend(meta::check_labels(obj));
    if let Some(old) = old
        && meta::is_deleting(old)
    {
        let before = meta::finalizers(old);
        if meta::finalizers(obj).iter().any(|f| !before.contains(f)) {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "metadata.finalizers",
                "Forbidden: no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    if is(rt, "", "pods") {
        validate_pod(obj, old, &mut causes);
    }
    if rt.custom.is_some() {
        causes.extend(crd::validate(rt, version, obj));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&rt.kind, &rt.group, name, causes))
    }
}

fn validate_pod(obj: &Value, old: Option<&Value>, causes: &mut Vec<Cause>) {
    let containers = obj["spec"]["containers"].as_array();
    if containers.is_none_or(Vec::is_empty) {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.containers",
            "Required value",
        ));
    }
    for (i, c) in containers.into_iter().flatten().enumerate() {
        if c["name"].as_str().is_none_or(str::is_empty) {
            causes.push(Cause::new(
                "FieldValueRequired",
                format!("spec.containers[{i}].name"),
                "Required value",
            ));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            causes.push(Cause::new(
                "FieldValueRequired",
                format!("spec.containers[{i}].image"),
                "Required value",
            ));
        }
    }
    if let Some(old) = old {
        // Pod specs are immutable apart from a few fields; binding goes through `binding`.
        let scrub = |v: &Value| {
            let mut s = v["spec"].clone();
            for list in ["containers", "initContainers"] {
                for c in s
                    .get_mut(list)
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    c["image"] = Value::Null;
                }
            }
            if let Some(o) = s.as_object_mut() {
                o.remove("activeDeadlineSeconds");
                o.remove("tolerations");
                o.remove("terminationGracePeriodSeconds");
            }
            s
        };
        if scrub(old) != scrub(obj) {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "spec",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
            ));
        }
    }
}
