//! Subresources: `scale` (as `autoscaling/v1` Scale over the paths the type declares),
//! pod `binding`, pod `eviction` and pod `log`.
//!
//! `log` is proxied to the kubelet serving the pod's node, as a real API server does: it reads
//! the node's `InternalIP` address and `status.daemonEndpoints.kubeletEndpoint.Port` and asks
//! `http://IP:PORT/containerLogs/{namespace}/{pod}/{container}` with the same query
//! (`follow`, `tailLines`, `timestamps`, `previous`, `sinceSeconds`, `limitBytes`).
//! Plain HTTP instead of the kubelet's HTTPS.

use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use super::Ctx;
use super::error::{ApiError, ApiResult};
use super::meta;
use super::ops::{self, Change, DeleteOpts, Deleted, Target, WriteOpts};
use super::patch::{self, PatchKind};
use super::resource::at;
use super::strategy::Part;

/// The Scale view of an object.
pub fn scale_of(t: &Target, obj: &Value) -> ApiResult<Value> {
    let paths =
        t.rt.scale
            .as_ref()
            .ok_or_else(|| ApiError::not_found(&format!("{}/scale", t.rt.key()), &t.name))?;
    let mut status =
        json!({"replicas": at(obj, &paths.status_replicas).cloned().unwrap_or(json!(0))});
    let selector = match &paths.label_selector {
        Some(p) => at(obj, p).cloned(),
        // Built-in workloads: the selector of the spec, in string form.
        None => obj
            .pointer("/spec/selector")
            .map(|s| json!(selector_string(s))),
    };
    if let Some(s) = selector {
        status["selector"] = s;
    }
    let m = &obj["metadata"];
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"],
        },
        "spec": {"replicas": at(obj, &paths.spec_replicas).cloned().unwrap_or(json!(0))},
        "status": status,
    }))
}

fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        parts.extend(
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())),
        );
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let vals: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str() {
            Some("In") => format!("{key} in ({})", vals.join(",")),
            Some("NotIn") => format!("{key} notin ({})", vals.join(",")),
            Some("Exists") => key.to_owned(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

/// PUT or PATCH of `scale`: computes the new Scale, then writes `spec.replicas` of the object
/// (through the normal update path, so versions, generation and admission all apply).
pub async fn write_scale(
    ctx: &Ctx,
    t: &Target,
    change: Change<'_>,
    opts: &WriteOpts,
) -> ApiResult<Value> {
    let paths =
        t.rt.scale
            .clone()
            .ok_or_else(|| ApiError::not_found(&format!("{}/scale", t.rt.key()), &t.name))?;
    let obj = ctx.store.lock().get(&t.rt, &t.ns, &t.name)?;
    let current = scale_of(t, &obj)?;
    let mut scale = current.clone();
    match change {
        Change::Replace(body) => scale = body.clone(),
        Change::Patch(PatchKind::Json, body) => patch::json_patch(&mut scale, body)?,
        Change::Patch(PatchKind::Merge, body) | Change::Patch(PatchKind::Apply, body) => {
            patch::merge_patch(&mut scale, body)
        }
        Change::Patch(PatchKind::Strategic, body) => patch::strategic_merge(&mut scale, body),
    }
    let replicas = scale["spec"]["replicas"].as_i64().ok_or_else(|| {
        ApiError::invalid(
            "Scale",
            "autoscaling",
            &t.name,
            vec![super::error::Cause::new(
                "FieldValueRequired",
                "spec.replicas",
                "Required value",
            )],
        )
    })?;
    if replicas < 0 {
        return Err(ApiError::invalid(
            "Scale",
            "autoscaling",
            &t.name,
            vec![super::error::Cause::new(
                "FieldValueInvalid",
                "spec.replicas",
                format!("Invalid value: {replicas}: must be greater than or equal to 0"),
            )],
        ));
    }
    let mut updated = obj.clone();
    let pointer = paths.spec_replicas.clone();
    set_pointer(&mut updated, &pointer, json!(replicas));
    // The Scale's resourceVersion is the object's: a stale one conflicts.
    match meta::resource_version(&scale) {
        Some(rv) => meta::meta_mut(&mut updated).insert("resourceVersion".into(), json!(rv)),
        None => meta::meta_mut(&mut updated).remove("resourceVersion"),
    };
    let main = Target {
        sub: "scale".into(),
        ..t.clone()
    };
    let (_, stored) = ops::update(ctx, &main, Change::Replace(&updated), Part::Main, opts).await?;
    scale_of(t, &stored)
}

fn is_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// `minAvailable`/`maxUnavailable` as a count of `total` (percentages round up).
fn budget_count(v: &Value, total: usize) -> Option<usize> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
        Value::String(s) => {
            let pct: usize = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total).div_ceil(100))
        }
        _ => None,
    }
}

/// The name of a budget that forbids evicting this (Ready) pod now.
fn blocking_budget(st: &super::store::State, pod: &Value) -> Option<String> {
    if !is_ready(pod) {
        return None;
    }
    let ns = meta::namespace(pod);
    let pdbs = st.types.get("poddisruptionbudgets.policy")?;
    for pdb in pdbs.objects.values().filter(|b| meta::namespace(b) == ns) {
        let Ok(sel) = super::selector::LabelSelector::from_object(&pdb["spec"]["selector"]) else {
            continue;
        };
        if pdb["spec"]["selector"].is_null() || !sel.matches(pod) {
            continue;
        }
        let pods: Vec<&Value> = st
            .types
            .get("pods")
            .map(|t| {
                t.objects
                    .values()
                    .filter(|p| meta::namespace(p) == ns && sel.matches(p) && !meta::is_deleting(p))
                    .collect()
            })
            .unwrap_or_default();
        let total = pods.len();
        let healthy = pods.iter().filter(|p| is_ready(p)).count();
        let allowed = if let Some(min) = budget_count(&pdb["spec"]["minAvailable"], total) {
            healthy.saturating_sub(min)
        } else if let Some(max) = budget_count(&pdb["spec"]["maxUnavailable"], total) {
            max.saturating_sub(total - healthy)
        } else {
            continue;
        };
        if allowed == 0 {
            return Some(meta::name(pdb).to_owned());
        }
    }
    None
}

fn set_pointer(v: &mut Value, pointer: &str, new: Value) {
    let mut cur = v;
    for seg in pointer.split('/').filter(|s| !s.is_empty()) {
        if !cur.is_object() {
            *cur = json!({});
        }
        cur = cur
            .as_object_mut()
            .map(|o| o.entry(seg.to_owned()).or_insert(Value::Null))
            .expect("made an object");
    }
    *cur = new;
}

/// POST pods/{name}/binding: sets `spec.nodeName` once. Admitted first as a real server
/// does (`CREATE` of `pods/binding`, the Binding as the object, mutating then validating
/// webhooks), so a webhook can refuse a bind.
pub async fn bind(ctx: &Ctx, t: &Target, body: &Value) -> ApiResult<Value> {
    let a = super::admission::Attrs {
        operation: "CREATE",
        rt: &t.rt,
        version: &t.version,
        subresource: "binding",
        namespace: &t.ns,
        name: &t.name,
        dry_run: false,
    };
    let body = super::admission::mutate(&ctx.store, &a, body.clone(), None).await?;
    super::admission::validate(&ctx.store, &a, &body, None).await?;
    let body = &body;
    let node = body["target"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "Binding",
                "",
                &t.name,
                vec![super::error::Cause::new(
                    "FieldValueRequired",
                    "target.name",
                    "Required value",
                )],
            )
        })?;
    let node = node.to_owned();
    ctx.store.with(|st| {
        let pod = st.get(&t.rt, &t.ns, &t.name)?;
        if let Some(u) = body["metadata"]["uid"].as_str().filter(|u| !u.is_empty())
            && u != meta::uid(&pod)
        {
            return Err(ApiError::conflict("pods", &t.name, "Precondition failed: UID mismatch"));
        }
        if meta::is_deleting(&pod) {
            return Err(ApiError::conflict("pods/binding", &t.name, "pod is being deleted, cannot be assigned to a host"));
        }
        if let Some(cur) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict("pods/binding", &t.name, &format!("pod {} is already assigned to node \"{cur}\"", t.name)));
        }
        let rv = meta::resource_version(&pod).unwrap_or_default().to_owned();
        let mut new = pod.clone();
        new["spec"]["nodeName"] = json!(node);
        let conds = new["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now_rfc3339()}));
        new["status"]["conditions"] = json!(conds);
        for (k, v) in body["metadata"]["annotations"].as_object().into_iter().flatten() {
            meta::meta_mut(&mut new).entry("annotations").or_insert_with(|| json!({}))[k] = v.clone();
        }
        st.update(&t.rt, new, &rv)
    })?;
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// POST pods/{name}/eviction: marks the pod `DisruptionTarget` and deletes it with the
/// eviction's delete options, unless a
/// PodDisruptionBudget of its namespace selects it and allows no disruption now (429, as
/// the real server answers). The budget is computed on the spot from the pods' Ready
/// conditions (a real server reads the disruption controller's `status.disruptionsAllowed`);
/// a pod that is not Ready may always be evicted.
pub async fn evict(ctx: &Ctx, t: &Target, body: &Value) -> ApiResult<Value> {
    {
        let st = ctx.store.lock();
        let pod = st.get(&t.rt, &t.ns, &t.name)?;
        if let Some(pdb) = blocking_budget(&st, &pod) {
            return Err(ApiError::new(
                429,
                "TooManyRequests",
                format!(
                    "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget {pdb} needs more healthy pods."
                ),
            ));
        }
    }
    // As kube-apiserver does since 1.26 (PodDisruptionConditions, GA in 1.31): the pod is
    // marked `DisruptionTarget` before it is deleted, which is how a client tells an
    // eviction from a plain delete.
    ctx.store.with(|st| {
        let pod = st.get(&t.rt, &t.ns, &t.name)?;
        if meta::is_deleting(&pod) {
            return Ok(pod);
        }
        let rv = meta::resource_version(&pod).unwrap_or_default().to_owned();
        let mut new = pod.clone();
        let conds = new["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds.into_iter().filter(|c| c["type"] != "DisruptionTarget").collect();
        conds.push(json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting", "lastProbeTime": null, "lastTransitionTime": meta::now_rfc3339()}));
        new["status"]["conditions"] = json!(conds);
        st.update(&t.rt, new, &rv)
    })?;
    let mut opts = DeleteOpts::default();
    opts.merge_body(&body["deleteOptions"]);
    let main = Target {
        sub: String::new(),
        ..t.clone()
    };
    match ops::delete(ctx, &main, &opts).await? {
        Deleted::Now(_) | Deleted::Pending(_) => {}
    }
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// GET pods/{name}/log, proxied to the node's kubelet.
pub async fn log(
    ctx: &Ctx,
    t: &Target,
    query: &str,
    container: Option<&str>,
) -> ApiResult<Response> {
    let (pod, node) = {
        let st = ctx.store.lock();
        let pod = st.get(&t.rt, &t.ns, &t.name)?;
        let node_name = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let node = st.try_get("nodes", "", &node_name).cloned();
        (pod, node)
    };
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match container {
        Some(c) => c.to_owned(),
        None if names.len() == 1 => names[0].to_owned(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {}, choose one of: [{}]",
                t.name,
                names.join(" ")
            )));
        }
    };
    let Some(node) = node else {
        return Err(ApiError::bad_request(format!(
            "pod {} does not have a host assigned",
            t.name
        )));
    };
    let addr = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or(0);
    if port == 0 {
        return Err(ApiError::internal(format!(
            "node {} reports no kubelet endpoint port",
            meta::name(&node)
        )));
    }
    let q = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    let url = format!(
        "http://{addr}:{port}/containerLogs/{}/{}/{container}{q}",
        t.ns, t.name
    );
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| ApiError::internal(format!("bad kubelet url {url}: {e}")))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    let resp = client
        .get(uri)
        .await
        .map_err(|e| ApiError::internal(format!("Get \"{url}\": {e}")))?;
    let status = resp.status();
    if !status.is_success() {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(ApiError::new(
            status.as_u16(),
            if status.as_u16() == 404 {
                "NotFound"
            } else {
                "BadRequest"
            },
            String::from_utf8_lossy(&body).trim().to_owned(),
        ));
    }
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::new(resp.into_body()))
        .map_err(|e| ApiError::internal(e.to_string()))
}
