//! HTTP front: parses Kubernetes REST paths and query strings and dispatches to the verbs.
//!
//! Paths: `/api/v1/...` (core) and `/apis/{group}/{version}/...`, then
//! `[namespaces/{ns}/]{plural}[/{name}[/{subresource}]]`. Bodies are JSON (YAML is accepted
//! for apply patches); responses are JSON, or a Table when the client asks for one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Ctx;
use super::discovery;
use super::error::{ApiError, ApiResult};
use super::list::{self, ListParams};
use super::openapi;
use super::ops::{self, Change, DeleteOpts, Deleted, Target, WriteOpts, present};
use super::patch::PatchKind;
use super::selector::{FieldSelector, LabelSelector};
use super::strategy::Part;
use super::subresource;
use super::table;
use super::watch::{self, WatchParams};

pub fn router(ctx: Arc<Ctx>) -> Router {
    // The real server's request body limit is 3 MiB.
    Router::new()
        .fallback(handle)
        .layer(axum::extract::DefaultBodyLimit::max(3 * 1024 * 1024))
        .with_state(ctx)
}

async fn handle(
    State(ctx): State<Arc<Ctx>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: HashMap<String, String> = uri
        .query()
        .map(|q| {
            q.split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (decode(k), decode(v))
                })
                .collect()
        })
        .unwrap_or_default();
    let result = route(&ctx, &method, &uri, &query, &headers, &body).await;
    match result {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%method, %uri, code = e.code, message = %e.message, "request failed");
            e.into_response()
        }
    }
}

/// Percent-decoding for query strings (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex.ok_or(()) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(code: u16, v: &Value) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    (code, axum::Json(v)).into_response()
}

fn parse_body(body: &Bytes, yaml_ok: bool) -> ApiResult<Value> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(e) if yaml_ok => serde_yaml::from_slice(body)
            .map_err(|y| ApiError::bad_request(format!("error decoding YAML: {y} (as JSON: {e})"))),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))),
    }
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get("accept")
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

async fn route(
    ctx: &Arc<Ctx>,
    method: &Method,
    uri: &Uri,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> ApiResult<Response> {
    let ct = headers
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or("");
    if !body.is_empty() && (ct.contains("protobuf") || ct.contains("cbor")) {
        return Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct}; this server speaks JSON only)"
        )));
    }
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let types = ctx.store.lock().all_types();
    let get_only = |v: Option<Value>| -> ApiResult<Response> {
        if method != Method::GET {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        v.map(|v| json_response(200, &v))
            .ok_or_else(|| ApiError::not_found("", uri.path()))
    };
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return get_only(Some(discovery::version())),
        ["healthz"] | ["livez"] | ["readyz"] => return Ok((StatusCode::OK, "ok").into_response()),
        ["api"] => return get_only(Some(discovery::core_versions())),
        ["openapi", "v3"] => return get_only(Some(openapi::root(&types))),
        ["openapi", "v3", "api", v] => return get_only(openapi::group_version(&types, "", v)),
        ["openapi", "v3", "apis", g, v] => return get_only(openapi::group_version(&types, g, v)),
        ["apis"] => return get_only(Some(discovery::group_list(&types))),
        ["api", v] => return get_only(discovery::resource_list(&types, "", v)),
        ["apis", g] => return get_only(discovery::group(&types, g)),
        ["apis", g, v] => return get_only(discovery::resource_list(&types, g, v)),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::not_found("", uri.path())),
    };
    let mut rest: Vec<&str> = rest.to_vec();
    let mut watch_flag = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    if rest.first() == Some(&"watch") {
        rest.remove(0);
        watch_flag = true;
    }
    let resolve = |plural: &str| {
        types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.serves(version))
            .cloned()
    };
    // `namespaces/{ns}/{plural}...` unless it is the namespace object itself (or its status).
    let (ns, plural, name, sub) = match rest.as_slice() {
        ["namespaces", ns, plural, tail @ ..] if resolve(plural).is_some_and(|r| r.namespaced) => (
            ns.to_string(),
            *plural,
            tail.first().copied(),
            tail.get(1).copied(),
        ),
        [plural, tail @ ..] => (
            String::new(),
            *plural,
            tail.first().copied(),
            tail.get(1).copied(),
        ),
        [] => return Err(ApiError::not_found("", uri.path())),
    };
    let rt = resolve(plural).ok_or_else(|| {
        ApiError::not_found(
            "",
            &format!(
                "the server could not find the requested resource ({})",
                uri.path()
            ),
        )
    })?;
    if rt.namespaced && ns.is_empty() && name.is_some() {
        return Err(ApiError::not_found(&rt.key(), name.unwrap_or_default()));
    }
    let t = Target {
        rt: rt.clone(),
        version: version.to_owned(),
        ns: ns.clone(),
        name: name.unwrap_or_default().to_owned(),
        sub: sub.unwrap_or_default().to_owned(),
    };
    let list_params = || -> ApiResult<ListParams> {
        Ok(ListParams {
            labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
            fields: FieldSelector::parse(
                q.get("fieldSelector").map_or("", String::as_str),
                &rt.group,
                &rt.plural,
                rt.custom.is_some(),
            )?,
            limit: q.get("limit").and_then(|l| l.parse().ok()),
            continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
            resource_version: q.get("resourceVersion").cloned(),
            resource_version_match: q.get("resourceVersionMatch").cloned(),
        })
    };
    let write_opts = WriteOpts {
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
        field_manager: q.get("fieldManager").cloned(),
        force: q.get("force").is_some_and(|f| f == "true"),
    };
    let ns_opt = (!ns.is_empty()).then_some(ns.clone());
    let respond = |code: u16, v: Value| -> Response {
        if wants_table(headers) {
            json_response(code, &table::to_table(&rt, version, &v))
        } else {
            json_response(code, &v)
        }
    };
    match (method.clone(), name, sub) {
        // === collection ===
        // A watch of the collection, or of one object (legacy `/watch/.../{name}` paths).
        (Method::GET, _, None) if watch_flag => {
            let mut p = list_params()?;
            if let Some(n) = name {
                p.fields = FieldSelector::parse(
                    &format!("metadata.name={n}"),
                    &rt.group,
                    &rt.plural,
                    rt.custom.is_some(),
                )?;
            }
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|t| t.parse().ok())
                .map_or(Duration::from_secs(1800), Duration::from_secs);
            watch::watch(
                ctx.clone(),
                rt.clone(),
                version.to_owned(),
                WatchParams {
                    list: p,
                    ns: ns_opt,
                    bookmarks: q.get("allowWatchBookmarks").is_some_and(|b| b == "true"),
                    send_initial_events: q.get("sendInitialEvents").map(|s| s == "true"),
                    timeout,
                    table: wants_table(headers),
                },
            )
        }
        (Method::GET, None, _) => {
            let p = list_params()?;
            let v = list::list(&ctx.store.lock(), &rt, version, ns_opt.as_deref(), &p)?;
            Ok(respond(200, v))
        }
        (Method::POST, None, _) => {
            let obj = ops::create(ctx, &t, parse_body(body, false)?, &write_opts).await?;
            Ok(json_response(201, &obj))
        }
        (Method::DELETE, None, _) => {
            let p = list_params()?;
            let mut opts = delete_opts(q);
            opts.merge_body(&parse_body(body, false)?);
            let names: Vec<String> = {
                let st = ctx.store.lock();
                st.iter(&rt, ns_opt.as_deref(), None)
                    .filter(|(_, o)| p.matches(o))
                    .map(|(k, _)| k.1.clone())
                    .collect()
            };
            let mut items = Vec::new();
            for n in names {
                let it = Target {
                    name: n,
                    ..t.clone()
                };
                match ops::delete(ctx, &it, &opts).await {
                    Ok(Deleted::Now(o)) | Ok(Deleted::Pending(o)) => {
                        items.push(present(&rt, version, o))
                    }
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = ctx.store.lock().rv();
            Ok(json_response(
                200,
                &json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(version), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            ))
        }
        // === one object ===
        (Method::GET, Some(_), None) => {
            let obj = ctx.store.lock().get(&rt, &ns, &t.name)?;
            Ok(respond(200, present(&rt, version, obj)))
        }
        (Method::PUT, Some(_), None) => {
            let b = parse_body(body, false)?;
            let (code, obj) =
                ops::update(ctx, &t, Change::Replace(&b), Part::Main, &write_opts).await?;
            Ok(json_response(code, &obj))
        }
        (Method::PATCH, Some(_), None) | (Method::PATCH, Some(_), Some("status")) => {
            let kind = patch_kind(headers)?;
            let b = parse_body(body, kind == PatchKind::Apply)?;
            let part = if sub == Some("status") {
                Part::Status
            } else {
                Part::Main
            };
            check_sub(&t, part)?;
            let (code, obj) =
                ops::update(ctx, &t, Change::Patch(kind, &b), part, &write_opts).await?;
            Ok(json_response(code, &obj))
        }
        (Method::DELETE, Some(_), None) => {
            let mut opts = delete_opts(q);
            opts.merge_body(&parse_body(body, false)?);
            match ops::delete(ctx, &t, &opts).await? {
                Deleted::Pending(o) => Ok(json_response(200, &present(&rt, version, o))),
                Deleted::Now(o)
                    if rt.custom.is_some() || (rt.group.is_empty() && rt.plural == "pods") =>
                {
                    Ok(json_response(200, &present(&rt, version, o)))
                }
                Deleted::Now(o) => Ok(json_response(
                    200,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": t.name, "group": rt.group, "kind": rt.plural, "uid": o["metadata"]["uid"]},
                    }),
                )),
            }
        }
        // === subresources ===
        (Method::GET, Some(_), Some("status")) => {
            check_sub(&t, Part::Status)?;
            let obj = ctx.store.lock().get(&rt, &ns, &t.name)?;
            Ok(json_response(200, &present(&rt, version, obj)))
        }
        (Method::PUT, Some(_), Some("status")) => {
            check_sub(&t, Part::Status)?;
            let b = parse_body(body, false)?;
            let (code, obj) =
                ops::update(ctx, &t, Change::Replace(&b), Part::Status, &write_opts).await?;
            Ok(json_response(code, &obj))
        }
        (Method::GET, Some(_), Some("scale")) => {
            let obj = ctx.store.lock().get(&rt, &ns, &t.name)?;
            Ok(json_response(200, &subresource::scale_of(&t, &obj)?))
        }
        (Method::PUT, Some(_), Some("scale")) => {
            let b = parse_body(body, false)?;
            Ok(json_response(
                200,
                &subresource::write_scale(ctx, &t, Change::Replace(&b), &write_opts).await?,
            ))
        }
        (Method::PATCH, Some(_), Some("scale")) => {
            let kind = patch_kind(headers)?;
            let b = parse_body(body, kind == PatchKind::Apply)?;
            Ok(json_response(
                200,
                &subresource::write_scale(ctx, &t, Change::Patch(kind, &b), &write_opts).await?,
            ))
        }
        (Method::POST, Some(_), Some("binding")) if rt.extra_subresources.contains(&"binding") => {
            Ok(json_response(
                201,
                &subresource::bind(ctx, &t, &parse_body(body, false)?).await?,
            ))
        }
        (Method::POST, Some(_), Some("eviction"))
            if rt.extra_subresources.contains(&"eviction") =>
        {
            Ok(json_response(
                201,
                &subresource::evict(ctx, &t, &parse_body(body, false)?).await?,
            ))
        }
        (Method::GET, Some(_), Some("log")) if rt.extra_subresources.contains(&"log") => {
            let passthrough: Vec<String> = [
                "follow",
                "tailLines",
                "timestamps",
                "previous",
                "sinceSeconds",
                "sinceTime",
                "limitBytes",
            ]
            .iter()
            .filter_map(|k| q.get(*k).map(|v| format!("{k}={v}")))
            .collect();
            subresource::log(
                ctx,
                &t,
                &passthrough.join("&"),
                q.get("container").map(String::as_str),
            )
            .await
        }
        (_, Some(_), Some(s)) => Err(ApiError::not_found("", &format!("{}/{s}", rt.key()))),
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        ))),
    }
}

fn check_sub(t: &Target, part: Part) -> ApiResult<()> {
    if part == Part::Status && !t.rt.status {
        return Err(ApiError::not_found("", &format!("{}/status", t.rt.key())));
    }
    Ok(())
}

fn patch_kind(headers: &HeaderMap) -> ApiResult<PatchKind> {
    let ct = headers
        .get("content-type")
        .and_then(|c| c.to_str().ok())
        .unwrap_or("");
    PatchKind::from_content_type(ct).ok_or_else(|| {
        ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct:?})"
        ))
    })
}

fn delete_opts(q: &HashMap<String, String>) -> DeleteOpts {
    DeleteOpts {
        grace_period: q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()),
        propagation: q.get("propagationPolicy").cloned(),
        precondition_uid: None,
        precondition_rv: None,
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
    }
}
