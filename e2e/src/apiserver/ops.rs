//! The write verbs (create, update, patch, delete) with the order of steps a real server
//! uses: decode, default, mutating admission, validate, validating admission, commit.
//! Updates retry when a concurrent writer moved the object and the client gave no version.

use std::sync::Arc;

use serde_json::{Value, json};

use super::Ctx;
use super::admission::{self, Attrs};
use super::crd;
use super::error::{ApiError, ApiResult};
use super::events;
use super::meta;
use super::patch::{self, PatchKind};
use super::resource::ResourceType;
use super::store::State;
use super::strategy::{self, Part};

/// Where a request points.
#[derive(Clone, Debug)]
pub struct Target {
    pub rt: Arc<ResourceType>,
    pub version: String,
    /// `""` for cluster-scoped kinds.
    pub ns: String,
    pub name: String,
    /// `""`, `status`, `scale`, `binding`, `eviction`, `log`.
    pub sub: String,
}

/// Options of a write request.
#[derive(Clone, Debug, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub force: bool,
}

/// Options of a delete (query string and `DeleteOptions` body merged; body wins).
#[derive(Clone, Debug, Default)]
pub struct DeleteOpts {
    pub grace_period: Option<i64>,
    /// `Background`, `Foreground`, `Orphan`.
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

impl DeleteOpts {
    pub fn merge_body(&mut self, body: &Value) {
        if let Some(g) = body["gracePeriodSeconds"].as_i64() {
            self.grace_period = Some(g);
        }
        if let Some(p) = body["propagationPolicy"].as_str() {
            self.propagation = Some(p.to_owned());
        }
        if body["orphanDependents"].as_bool() == Some(true) {
            self.propagation = Some("Orphan".into());
        }
        if let Some(u) = body["preconditions"]["uid"].as_str() {
            self.precondition_uid = Some(u.to_owned());
        }
        if let Some(r) = body["preconditions"]["resourceVersion"].as_str() {
            self.precondition_rv = Some(r.to_owned());
        }
        if body["dryRun"].as_array().is_some_and(|a| !a.is_empty()) {
            self.dry_run = true;
        }
    }
}

/// The object as served in the requested version (objects are stored once; see
/// [`ResourceType::versions`]).
pub fn present(rt: &ResourceType, version: &str, mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(rt.api_version(version)));
        o.insert("kind".into(), json!(rt.kind));
    }
    obj
}

fn check_type(rt: &ResourceType, body: &Value) -> ApiResult<()> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request was in an unknown format",
        ));
    }
    if let Some(k) = body["kind"].as_str()
        && !k.is_empty()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): kind {k:?} does not match",
            rt.kind
        )));
    }
    Ok(())
}

fn check_namespace(t: &Target, body: &mut Value) -> ApiResult<()> {
    let given = meta::namespace(body).to_owned();
    if t.rt.namespaced {
        if !given.is_empty() && given != t.ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta::meta_mut(body).insert("namespace".into(), json!(t.ns));
    } else {
        meta::meta_mut(body).remove("namespace");
    }
    Ok(())
}

fn attrs<'a>(t: &'a Target, op: &'static str, name: &'a str, dry_run: bool) -> Attrs<'a> {
    Attrs {
        operation: op,
        rt: &t.rt,
        version: &t.version,
        subresource: &t.sub,
        namespace: &t.ns,
        name,
        dry_run,
    }
}

// === create ===

pub async fn create(ctx: &Ctx, t: &Target, mut body: Value, opts: &WriteOpts) -> ApiResult<Value> {
    check_type(&t.rt, &body)?;
    check_namespace(t, &mut body)?;
    if meta::resource_version(&body).is_some() {
        // What the real storage layer says (as a 500, like the real server).
        return Err(ApiError::internal(
            "Internal error occurred: resourceVersion should not be set on objects to be created",
        ));
    }
    if meta::name(&body).is_empty()
        && let Some(g) = meta::meta_str(&body, "generateName").filter(|g| !g.is_empty())
    {
        let name = format!("{g}{}", meta::random_suffix());
        meta::meta_mut(&mut body).insert("name".into(), json!(name));
    }
    if t.rt.group == "apiextensions.k8s.io" {
        // Reject a bad CRD before storing it.
        crd::type_from_crd(&body)?;
    }
    strategy::prepare_create(&t.rt, &mut body);
    let name = meta::name(&body).to_owned();
    let a = attrs(t, "CREATE", &name, opts.dry_run);
    let mut obj = admission::mutate(&ctx.store, &a, body, None).await?;
    strategy::prepare_create(&t.rt, &mut obj);
    check_namespace(t, &mut obj)?;
    strategy::validate(&t.rt, &t.version, &obj, None)?;
    admission::validate(&ctx.store, &a, &obj, None).await?;
    if opts.dry_run {
        return Ok(present(&t.rt, &t.version, obj));
    }
    let stored = ctx.store.with(|st| {
        let stored = st.create(&t.rt, obj)?;
        after_write(st, &t.rt, &stored)?;
        Ok::<_, ApiError>(stored)
    })?;
    Ok(present(&t.rt, &t.version, stored))
}

/// Follow-up effects of a stored write that a real cluster's built-in controllers would make
/// shortly after; done at once here.
fn after_write(st: &mut State, rt: &ResourceType, obj: &Value) -> ApiResult<()> {
    if events::is_event(rt) {
        if st
            .try_get(&rt.key(), meta::namespace(obj), meta::name(obj))
            .is_some()
        {
            events::mirror_write(st, rt, obj);
        } else {
            events::mirror_delete(st, rt, meta::namespace(obj), meta::name(obj));
        }
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("apiextensions.k8s.io", "customresourcedefinitions") if !meta::is_deleting(obj) => {
            st.add_type(Arc::new(crd::type_from_crd(obj)?));
        }
        ("", "namespaces") if !meta::is_deleting(obj) => {
            // The service-account controller's default account.
            let ns = meta::name(obj).to_owned();
            if let Some(sa_type) = st.resolve("", "v1", "serviceaccounts")
                && st.try_get("serviceaccounts", &ns, "default").is_none()
            {
                let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
                st.create(&sa_type, sa)?;
            }
        }
        _ => {}
    }
    Ok(())
}

// === update and patch ===

/// What a write does to the current object.
pub enum Change<'a> {
    /// PUT with a full object.
    Replace(&'a Value),
    Patch(PatchKind, &'a Value),
}

/// Update or patch; `Part::Status` for the status subresource. A server-side apply of a
/// missing object creates it.
pub async fn update(
    ctx: &Ctx,
    t: &Target,
    change: Change<'_>,
    part: Part,
    opts: &WriteOpts,
) -> ApiResult<(u16, Value)> {
    if let Change::Patch(PatchKind::Strategic, _) = change
        && t.rt.custom.is_some()
    {
        return Err(ApiError::unsupported_media(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current = ctx.store.lock().get(&t.rt, &t.ns, &t.name);
        let old = match current {
            Ok(o) => o,
            Err(e) if e.code == 404 => {
                if let Change::Patch(PatchKind::Apply, body) = change
                    && part == Part::Main
                {
                    let manager = apply_manager(opts)?;
                    check_type(&t.rt, body)?;
                    let mut applied =
                        patch::apply(None, body, &manager, opts.force, &t.rt.key(), &t.name)?;
                    meta::meta_mut(&mut applied).insert("name".into(), json!(t.name));
                    let obj = create(ctx, t, applied, opts).await?;
                    return Ok((201, obj));
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let old_rv = meta::resource_version(&old).unwrap_or_default().to_owned();
        let (candidate, client_rv) = match change {
            Change::Replace(body) => {
                check_type(&t.rt, body)?;
                if !meta::name(body).is_empty() && meta::name(body) != t.name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({})",
                        meta::name(body),
                        t.name
                    )));
                }
                let mut b = body.clone();
                check_namespace(t, &mut b)?;
                (b, meta::resource_version(body).map(str::to_owned))
            }
            Change::Patch(kind, body) => {
                let mut doc = old.clone();
                match kind {
                    PatchKind::Json => patch::json_patch(&mut doc, body)?,
                    PatchKind::Merge => patch::merge_patch(&mut doc, body),
                    PatchKind::Strategic => patch::strategic_merge(&mut doc, body),
                    PatchKind::Apply => {
                        check_type(&t.rt, body)?;
                        doc = patch::apply(
                            Some(&old),
                            body,
                            &apply_manager(opts)?,
                            opts.force,
                            &t.rt.key(),
                            &t.name,
                        )?;
                    }
                }
                let rv = body["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_owned);
                if meta::name(&doc) != t.name || meta::namespace(&doc) != t.ns {
                    return Err(ApiError::bad_request(
                        "metadata.name and metadata.namespace cannot be changed by a patch",
                    ));
                }
                (doc, rv)
            }
        };
        if let Some(rv) = &client_rv
            && *rv != old_rv
        {
            return Err(ApiError::stale(&t.rt.key(), &t.name));
        }
        let new = strategy::prepare_update(&t.rt, &old, &candidate, part);
        let a = attrs(t, "UPDATE", &t.name, opts.dry_run);
        let mut new = admission::mutate(&ctx.store, &a, new, Some(&old)).await?;
        // Again after the webhooks: they cannot change what this part of the API may not.
        new = strategy::prepare_update(&t.rt, &old, &new, part);
        strategy::validate(&t.rt, &t.version, &new, Some(&old))?;
        admission::validate(&ctx.store, &a, &new, Some(&old)).await?;
        if opts.dry_run {
            return Ok((200, present(&t.rt, &t.version, new)));
        }
        let result = ctx.store.with(|st| {
            let stored = st.update(&t.rt, new, &old_rv)?;
            after_write(st, &t.rt, &stored)?;
            Ok::<_, ApiError>(stored)
        });
        match result {
            Ok(v) => return Ok((200, present(&t.rt, &t.version, v))),
            Err(e) if e.reason == "Conflict" && client_rv.is_none() && attempts < 10 => continue,
            Err(e) => return Err(e),
        }
    }
}

fn apply_manager(opts: &WriteOpts) -> ApiResult<String> {
    opts.field_manager
        .clone()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requests must supply a fieldManager",
            )
        })
}

// === delete ===

/// What a delete did.
pub enum Deleted {
    /// Gone now; the last state of the object.
    Now(Value),
    /// Deletion started (finalizers or a grace period hold it).
    Pending(Value),
}

pub async fn delete(ctx: &Ctx, t: &Target, opts: &DeleteOpts) -> ApiResult<Deleted> {
    let old = ctx.store.lock().get(&t.rt, &t.ns, &t.name)?;
    let a = attrs(t, "DELETE", &t.name, opts.dry_run);
    admission::validate(&ctx.store, &a, &old, Some(&old)).await?;
    if opts.dry_run {
        return Ok(Deleted::Pending(old));
    }
    ctx.store
        .with(|st| delete_in(st, &t.rt, &t.ns, &t.name, opts))
}

/// The delete itself, under the store lock; the garbage collector uses it too.
pub fn delete_in(
    st: &mut State,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    opts: &DeleteOpts,
) -> ApiResult<Deleted> {
    let old = st.get(rt, ns, name)?;
    if let Some(u) = &opts.precondition_uid
        && u != meta::uid(&old)
    {
        return Err(ApiError::conflict(
            &rt.key(),
            name,
            &format!(
                "Precondition failed: UID in precondition: {u}, UID in object meta: {}",
                meta::uid(&old)
            ),
        ));
    }
    if let Some(r) = &opts.precondition_rv
        && Some(r.as_str()) != meta::resource_version(&old)
    {
        return Err(ApiError::conflict(
            &rt.key(),
            name,
            "Precondition failed: ResourceVersion in precondition does not match",
        ));
    }
    let rv = meta::resource_version(&old).unwrap_or_default().to_owned();
    let is_pod = rt.group.is_empty() && rt.plural == "pods";
    let is_ns = rt.group.is_empty() && rt.plural == "namespaces";
    let mut new = old.clone();
    let mut finalizers = meta::finalizers(&old);
    let default_policy = if rt.group == "batch" && rt.plural == "jobs" {
        "Orphan"
    } else {
        "Background"
    };
    match opts.propagation.as_deref().unwrap_or(default_policy) {
        "Foreground" if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
            finalizers.push("foregroundDeletion".into())
        }
        "Orphan"
            if !finalizers.iter().any(|f| f == "orphan") && has_dependents(st, meta::uid(&old)) =>
        {
            finalizers.push("orphan".into())
        }
        "Background" | "Foreground" | "Orphan" => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy {other:?} is not supported"
            )));
        }
    }
    // A bound, running pod is deleted gracefully: the kubelet stops it and then deletes it
    // with grace 0. Unbound or finished pods go at once.
    let grace = if is_pod {
        let phase = old["status"]["phase"].as_str().unwrap_or("");
        let bound = old["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty());
        let g = opts
            .grace_period
            .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30);
        if !bound || phase == "Succeeded" || phase == "Failed" {
            0
        } else {
            g.max(0)
        }
    } else {
        0
    };
    let already = meta::is_deleting(&old);
    let old_grace = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
    if finalizers.is_empty() && grace == 0 && !is_ns {
        let gone = st.remove(rt, ns, name)?;
        if events::is_event(rt) {
            events::mirror_delete(st, rt, ns, name);
        }
        return Ok(Deleted::Now(gone));
    }
    if already && old_grace.is_some_and(|g| g <= grace) && finalizers == meta::finalizers(&old) {
        return Ok(Deleted::Pending(old));
    }
    let m = meta::meta_mut(&mut new);
    if !already || grace > 0 {
        let at = k8s_openapi::jiff::Timestamp::now()
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(grace))
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
        m.insert(
            "deletionTimestamp".into(),
            json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
        );
    }
    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), json!(finalizers));
    }
    if is_ns {
        new["status"]["phase"] = json!("Terminating");
    }
    let stored = st.update(rt, new, &rv)?;
    if meta::resource_version(&stored).is_some() && st.try_get(&rt.key(), ns, name).is_none() {
        return Ok(Deleted::Now(stored));
    }
    Ok(Deleted::Pending(stored))
}

fn has_dependents(st: &State, uid: &str) -> bool {
    st.types.values().any(|ts| {
        ts.objects
            .values()
            .any(|o| meta::owner_uids(o).iter().any(|u| u == uid))
    })
}
