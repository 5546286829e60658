//! Label selectors (equality- and set-based) and field selectors, parsed from query strings.

use serde_json::Value;

use super::error::{ApiError, ApiResult};
use super::meta;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector`: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for term in split_top_level(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_req(term).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unable to parse requirement: invalid label selector term {term:?}"
                ))
            })?);
        }
        Ok(Self(reqs))
    }

    /// Builds from a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`).
    pub fn from_object(sel: &Value) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Req::In(
                    k.clone(),
                    vec![v.as_str().unwrap_or_default().to_owned()],
                ));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            reqs.push(match e.get("operator").and_then(Value::as_str) {
                Some("In") => Req::In(key, values),
                Some("NotIn") => Req::NotIn(key, values),
                Some("Exists") => Req::Exists(key),
                Some("DoesNotExist") => Req::NotExists(key),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "{other:?} is not a valid label selector operator"
                    )));
                }
            });
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = meta::labels(obj);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
            Req::In(k, vs) => get(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            Req::NotIn(k, vs) => get(k).is_none_or(|v| vs.iter().all(|x| x != v)),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn parse_req(t: &str) -> Option<Req> {
    if let Some(k) = t.strip_prefix('!') {
        let k = k.trim();
        return valid_key(k).then(|| Req::NotExists(k.to_owned()));
    }
    for (op, neg) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = t.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) || !valid_value(v) {
                return None;
            }
            let vs = vec![v.to_owned()];
            return Some(if neg {
                Req::NotIn(k.to_owned(), vs)
            } else {
                Req::In(k.to_owned(), vs)
            });
        }
    }
    if let Some(open) = t.find('(') {
        let close = t.rfind(')')?;
        if close != t.len() - 1 {
            return None;
        }
        let head: Vec<&str> = t[..open].split_whitespace().collect();
        let [k, op] = head.as_slice() else {
            return None;
        };
        let values: Vec<String> = t[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect();
        if !valid_key(k) || values.is_empty() || !values.iter().all(|v| valid_value(v)) {
            return None;
        }
        return match *op {
            "in" => Some(Req::In((*k).to_owned(), values)),
            "notin" => Some(Req::NotIn((*k).to_owned(), values)),
            _ => None,
        };
    }
    valid_key(t).then(|| Req::Exists(t.to_owned()))
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma-separated.
#[derive(Clone, Debug, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Field labels each kind supports besides `metadata.name` and `metadata.namespace`
/// (the real server rejects others with 400).
fn supported_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.schedulerName",
            "spec.restartPolicy",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "events") => &[
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
            "reason",
            "type",
            "reportingController",
        ],
        ("batch", "jobs") => &["status.successful"],
        _ => &[],
    }
}

impl FieldSelector {
    pub fn parse(s: &str, group: &str, plural: &str, custom: bool) -> ApiResult<Self> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = term.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let k = k.trim();
            let generic = k == "metadata.name" || k == "metadata.namespace";
            if !generic && !supported_fields(group, plural).contains(&k) {
                // CRDs may declare selectableFields; this server supports only the generic two.
                let what = if custom { "custom resources" } else { plural };
                return Err(ApiError::bad_request(format!(
                    "\"{k}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\" (field label not supported for {what})"
                )));
            }
            reqs.push((k.to_owned(), neg, v.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, neg, want)| {
            let got = field_value(obj, path);
            (got == *want) != *neg
        })
    }
}

/// A field's value as text; absent fields read as `""` (so `spec.nodeName=` finds unbound pods).
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn set_based_in_and_not_exists() {
        let s = LabelSelector::parse("a in (x,y),!b").unwrap();
        assert!(s.matches(&pod(json!({"a": "x"}))));
        assert!(s.matches(&pod(json!({"a": "y", "c": "1"}))));
        assert!(!s.matches(&pod(json!({"a": "z"}))));
        assert!(!s.matches(&pod(json!({"a": "x", "b": ""}))));
        assert!(!s.matches(&pod(json!({}))));
    }

    #[test]
    fn equality_and_notin() {
        let s = LabelSelector::parse("a=1, b!=2, c notin (3)").unwrap();
        assert!(s.matches(&pod(json!({"a": "1"}))));
        assert!(!s.matches(&pod(json!({"a": "1", "b": "2"}))));
        assert!(!s.matches(&pod(json!({"a": "1", "c": "3"}))));
        assert!(LabelSelector::parse("a in x").is_err());
        assert!(LabelSelector::parse("a=(").is_err());
    }

    #[test]
    fn field_selector_on_pods() {
        let s = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", "", "pods", false)
            .unwrap();
        assert!(s.matches(&json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})));
        assert!(!s.matches(&json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}})));
        let unbound = FieldSelector::parse("spec.nodeName=", "", "pods", false).unwrap();
        assert!(unbound.matches(&json!({"spec": {}})));
        assert!(FieldSelector::parse("spec.foo=1", "", "pods", false).is_err());
    }
}
