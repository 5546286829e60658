//! Object metadata helpers: timestamps, uids, generated names and name validation.

use rand::Rng;
use serde_json::{Map, Value};

use super::error::Cause;

/// RFC 3339 with whole seconds, as `metav1.Time` serializes.
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A random version-4 UUID string.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The 5-character suffix `generateName` gets (same alphabet as the real server: no vowels,
/// no confusable digits).
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// `metadata` as a mutable map, created if missing or not an object.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let o = obj.as_object_mut().expect("just made an object");
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("just made an object")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or("")
}

pub fn resource_version(obj: &Value) -> Option<&str> {
    meta_str(obj, "resourceVersion").filter(|s| !s.is_empty())
}

pub fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata")?.get("labels")?.as_object()
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_deleting(obj: &Value) -> bool {
    meta_str(obj, "deletionTimestamp").is_some()
}

pub fn owner_uids(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// DNS-1123 subdomain (most object names).
pub fn check_subdomain(field: &str, value: &str) -> Option<Cause> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    (!ok).then(|| {
        Cause::new(
            "FieldValueInvalid",
            field,
            format!(
                "Invalid value: \"{value}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        )
    })
}

/// DNS-1123 label (namespaces, services).
pub fn check_label(field: &str, value: &str) -> Option<Cause> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    (!ok).then(|| {
        Cause::new(
            "FieldValueInvalid",
            field,
            format!(
                "Invalid value: \"{value}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character"
            ),
        )
    })
}

/// Label keys and values (`prefix/name` = `value`).
pub fn check_labels(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let Some(labels) = labels(obj) else {
        return out;
    };
    for (k, v) in labels {
        let (prefix, name) = k
            .rsplit_once('/')
            .map_or((None, k.as_str()), |(p, n)| (Some(p), n));
        let name_ok = !name.is_empty() && name.len() <= 63 && qualified_ok(name);
        let prefix_ok = prefix.is_none_or(|p| check_subdomain("", p).is_none());
        if !name_ok || !prefix_ok {
            out.push(Cause::new(
                "FieldValueInvalid",
                "metadata.labels",
                format!("Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.'"),
            ));
        }
        match v.as_str() {
            Some(s) if s.is_empty() || (s.len() <= 63 && qualified_ok(s)) => {}
            _ => out.push(Cause::new(
                "FieldValueInvalid",
                "metadata.labels",
                format!("Invalid value: {v}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'"),
            )),
        }
    }
    out
}

fn qualified_ok(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_is_v4_shaped() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(new_uid(), u);
    }

    #[test]
    fn names_follow_rfc1123() {
        assert!(check_subdomain("n", "a.b-c").is_none());
        assert!(check_subdomain("n", "A").is_some());
        assert!(check_subdomain("n", "-a").is_some());
        assert!(check_label("n", "a.b").is_some());
        assert!(check_label("n", "ok-1").is_none());
    }
}
