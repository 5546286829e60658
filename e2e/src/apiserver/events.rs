//! `core/v1` Events and `events.k8s.io/v1` Events are one storage in a real server, served
//! through two APIs with a field conversion. Here each API has its own store and every write
//! through one is mirrored into the other (same name and uid, converted fields), so a
//! `kube::runtime::events::Recorder` event shows up in `kubectl get events` too.

use serde_json::{Map, Value, json};

use super::meta;
use super::resource::ResourceType;
use super::store::State;

const CORE: &str = "events";
const NEW: &str = "events.events.k8s.io";

/// `(core field, events.k8s.io field)`; the other fields have the same name in both.
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("reportingComponent", "reportingController"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];
const SAME: &[&str] = &[
    "related",
    "reason",
    "type",
    "action",
    "eventTime",
    "series",
    "reportingInstance",
];

pub fn is_event(rt: &ResourceType) -> bool {
    rt.plural == "events" && (rt.group.is_empty() || rt.group == "events.k8s.io")
}

/// Converts an event body to the other API's field names.
fn convert(obj: &Value, to_core: bool) -> Value {
    let mut out = Map::new();
    let mut m = obj["metadata"].clone();
    if let Some(mm) = m.as_object_mut() {
        // The mirror has its own version; the rest of the metadata is shared.
        for f in ["resourceVersion", "generation", "managedFields"] {
            mm.remove(f);
        }
    }
    out.insert("metadata".into(), m);
    out.insert(
        "apiVersion".into(),
        json!(if to_core { "v1" } else { "events.k8s.io/v1" }),
    );
    out.insert("kind".into(), json!("Event"));
    for (core, new) in RENAMES {
        let (from, to) = if to_core { (new, core) } else { (core, new) };
        if let Some(v) = obj.get(*from).filter(|v| !v.is_null()) {
            out.insert((*to).to_owned(), v.clone());
        }
    }
    for f in SAME {
        if let Some(v) = obj.get(*f).filter(|v| !v.is_null()) {
            out.insert((*f).to_owned(), v.clone());
        }
    }
    Value::Object(out)
}

/// After a stored create or update of an event: write its mirror.
pub fn mirror_write(st: &mut State, rt: &ResourceType, obj: &Value) {
    let to_core = !rt.group.is_empty();
    let key = if to_core { CORE } else { NEW };
    let Some(other) = st.types.get(key).map(|t| t.rt.clone()) else {
        return;
    };
    let converted = convert(obj, to_core);
    let (ns, name) = (meta::namespace(obj).to_owned(), meta::name(obj).to_owned());
    let result = match st.get(&other, &ns, &name) {
        Ok(existing) => {
            let mut new = converted;
            let rv = meta::resource_version(&existing)
                .unwrap_or_default()
                .to_owned();
            meta::meta_mut(&mut new).insert("resourceVersion".into(), json!(rv));
            st.update(&other, new, &rv).map(|_| ())
        }
        Err(_) => st.create(&other, converted).map(|_| ()),
    };
    if let Err(e) = result {
        tracing::debug!(%ns, %name, error = %e, "mirroring an event failed");
    }
}

/// After an event is removed: remove its mirror.
pub fn mirror_delete(st: &mut State, rt: &ResourceType, ns: &str, name: &str) {
    let key = if rt.group.is_empty() { NEW } else { CORE };
    if let Some(other) = st.types.get(key).map(|t| t.rt.clone())
        && st.try_get(key, ns, name).is_some()
    {
        let _ = st.remove(&other, ns, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_round_trips() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e", "namespace": "d"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "Started", "type": "Normal",
            "reportingController": "tandem", "reportingInstance": "x", "action": "Run", "eventTime": "2026-01-01T00:00:00.000000Z"});
        let core = convert(&new, true);
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["reportingComponent"], "tandem");
        assert_eq!(convert(&core, false), new);
    }
}
