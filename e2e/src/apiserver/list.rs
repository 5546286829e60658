//! Lists with selectors and pagination (`limit`/`continue`).
//!
//! A continue token carries the list's resourceVersion and the last key returned. Later pages
//! read the current state after that key (a real server reads a snapshot at the version) and
//! report the first page's version; a token older than the type's event window gets 410.

use base64::Engine;
use serde_json::{Value, json};

use super::error::{ApiError, ApiResult};
use super::ops::present;
use super::resource::ResourceType;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{ObjKey, Since, State};

/// The query of a list or watch.
#[derive(Clone, Debug, Default)]
pub struct ListParams {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

impl ListParams {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

fn encode_token(rv: u64, key: &ObjKey) -> String {
    let raw = json!({"rv": rv, "ns": key.0, "name": key.1}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_token(t: &str) -> ApiResult<(u64, ObjKey)> {
    let bad = || ApiError::bad_request("continue key is not valid: the token could not be decoded");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let key = (
        v["ns"].as_str().ok_or_else(bad)?.to_owned(),
        v["name"].as_str().ok_or_else(bad)?.to_owned(),
    );
    Ok((rv, key))
}

/// A `<Kind>List` in the requested version.
pub fn list(
    st: &State,
    rt: &ResourceType,
    version: &str,
    ns: Option<&str>,
    p: &ListParams,
) -> ApiResult<Value> {
    let (list_rv, after) = match &p.continue_token {
        Some(t) => {
            let (rv, key) = decode_token(t)?;
            if let Since::TooOld = st.since(&rt.key(), rv) {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            (rv, Some(key))
        }
        None => {
            if p.resource_version_match.as_deref() == Some("Exact")
                && let Some(rv) = &p.resource_version
                && rv.parse::<u64>().ok() != Some(st.rv())
            {
                return Err(ApiError::gone(format!(
                    "too old resource version: {rv} ({})",
                    st.rv()
                )));
            }
            (st.rv(), None)
        }
    };
    let limit = p.limit.filter(|l| *l > 0);
    let mut items = Vec::new();
    let mut last_key = None;
    let mut remaining = 0usize;
    for (k, obj) in st.iter(rt, ns, after.as_ref()) {
        if !p.matches(obj) {
            continue;
        }
        if limit.is_some_and(|l| items.len() >= l) {
            remaining += 1;
            continue;
        }
        items.push(present(rt, version, obj.clone()));
        last_key = Some(k.clone());
    }
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if remaining > 0
        && let Some(k) = last_key
    {
        metadata["continue"] = json!(encode_token(list_rv, &k));
        // Only exact when no selector filtered items out, as on a real server.
        if p.labels.is_empty() && p.fields.is_empty() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    Ok(json!({
        "kind": rt.list_kind(),
        "apiVersion": rt.api_version(version),
        "metadata": metadata,
        "items": items,
    }))
}
