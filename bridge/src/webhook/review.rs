//! AdmissionReview (`admission.k8s.io/v1`) in and out: the wire format around
//! [`admit`](super::admit::admit). Pure: bytes and a view in, the response review out.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;

use super::admit::{Mode, Op, Requester, Verdict, View, admit, guard_binding};

/// The response review for the request `body`, as JSON. A body that is not a Pod review is
/// refused (the API server then reports the message), never allowed blindly.
pub fn respond(mode: Mode, body: &[u8], view: View<'_>) -> Value {
    to_wire(decide(mode, body, view))
}

/// The review as the API server reads it: `response.patch` is a base64 string (Go's
/// encoding of `[]byte`), where serde would write the bytes as an array of numbers.
fn to_wire(review: AdmissionReview<DynamicObject>) -> Value {
    let mut v = serde_json::to_value(&review).unwrap_or_default();
    if let Some(patch) = review.response.as_ref().and_then(|r| r.patch.as_ref()) {
        v["response"]["patch"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(patch));
    }
    v
}

fn decide(mode: Mode, body: &[u8], view: View<'_>) -> AdmissionReview<DynamicObject> {
    // A binding is not a Pod: tell the two apart before reading the object as one.
    let binding = serde_json::from_slice::<Value>(body).ok().is_some_and(|v| {
        v.pointer("/request/subResource").and_then(Value::as_str) == Some("binding")
    });
    if binding {
        return decide_binding(mode, body, view);
    }
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return unreadable(body, &format!("not a Pod AdmissionReview: {e}")),
    };
    let req: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(_) => return unreadable(body, "AdmissionReview without a request"),
    };
    let resp = AdmissionResponse::from(&req);
    let op = match req.operation {
        Operation::Create => Op::Create,
        Operation::Update => Op::Update,
        Operation::Delete | Operation::Connect => Op::Other,
    };
    // Only whole pods (and bindings, above) are judged; another subresource here is a
    // configuration mistake that must not block status writes or evictions.
    if req.sub_resource.is_some() || op == Op::Other {
        return resp.into_review();
    }
    let Some(pod) = req.object.as_ref() else {
        return deny(resp, "the request carries no pod").into_review();
    };
    let namespace = req
        .namespace
        .as_deref()
        .or(pod.metadata.namespace.as_deref())
        .unwrap_or_default();
    let who = requester(&req.user_info);
    match admit(mode, op, namespace, pod, req.old_object.as_ref(), who, view) {
        Verdict::Allow => resp.into_review(),
        Verdict::Deny(msg) => deny(resp, &msg).into_review(),
        Verdict::Patch(ops) => {
            let patched = serde_json::from_value::<json_patch::Patch>(Value::Array(ops))
                .map_err(|e| e.to_string())
                .and_then(|p| resp.clone().with_patch(p).map_err(|e| e.to_string()));
            match patched {
                Ok(r) => r.into_review(),
                Err(e) => deny(resp, &format!("building the patch: {e}")).into_review(),
            }
        }
    }
}

/// A `pods/binding` `CREATE`: the pod goes to `target.name`. Judged by the guard alone
/// (every endpoint gives the same answer, so a configuration that sends bindings to
/// `/mutate` is not a hole).
fn decide_binding(_mode: Mode, body: &[u8], view: View<'_>) -> AdmissionReview<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return unreadable(body, &format!("not a Binding AdmissionReview: {e}")),
    };
    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(_) => return unreadable(body, "AdmissionReview without a request"),
    };
    let resp = AdmissionResponse::from(&req);
    if req.operation != Operation::Create {
        return resp.into_review();
    }
    let target = req
        .object
        .as_ref()
        .and_then(|b| b.data.pointer("/target/name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty());
    let Some(node) = target else {
        return deny(resp, "target.name: the binding names no node").into_review();
    };
    match guard_binding(node, requester(&req.user_info), view.guard) {
        Verdict::Deny(msg) => deny(resp, &msg).into_review(),
        Verdict::Allow | Verdict::Patch(_) => resp.into_review(),
    }
}

fn requester(u: &k8s_openapi::api::authentication::v1::UserInfo) -> Requester<'_> {
    Requester {
        username: u.username.as_deref().unwrap_or_default(),
    }
}

/// A refusal as the API server shows it: `403 Forbidden` with the message.
fn deny(resp: AdmissionResponse, msg: &str) -> AdmissionResponse {
    let mut r = resp.deny(msg);
    r.result.code = 403;
    r.result.reason = "Forbidden".to_owned();
    r
}

/// A refusal for a body that could not be read; the uid is copied if it can be found, so
/// the API server shows this message rather than a uid mismatch.
fn unreadable(body: &[u8], why: &str) -> AdmissionReview<DynamicObject> {
    let mut r = AdmissionResponse::invalid(why);
    if let Ok(v) = serde_json::from_slice::<Value>(body)
        && let Some(uid) = v.pointer("/request/uid").and_then(Value::as_str)
    {
        r.uid = uid.to_owned();
    }
    r.into_review()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::NamespacePolicy;
    use serde_json::json;

    fn review(op: &str, ns: &str, pod: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "p", "namespace": ns, "operation": op,
                "userInfo": {"username": "alice"},
                "object": pod, "oldObject": null, "dryRun": false,
            }
        }))
        .unwrap()
    }

    fn answer(mode: Mode, body: &[u8]) -> Value {
        let ps = vec![NamespacePolicy {
            namespace: "serving".into(),
            account: "inference".into(),
            ..Default::default()
        }];
        let pool: std::collections::BTreeSet<String> = ["b1".to_owned()].into();
        let binders = vec!["system:serviceaccount:tandem:tandem-bridge".to_owned()];
        let view = View {
            cluster: "pool",
            policies: Ok(&ps),
            guard: super::super::admit::Guard {
                pool_nodes: Ok(&pool),
                operators: &[],
                binders: &binders,
                holders: &[],
            },
        };
        respond(mode, body, view)
    }

    /// A `pods/binding` review of pod `p` onto `node` by `user`.
    fn binding(user: &str, node: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-2",
                "kind": {"group": "", "version": "v1", "kind": "Binding"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "binding",
                "name": "p", "namespace": "web", "operation": "CREATE",
                "userInfo": {"username": user, "groups": ["system:authenticated"]},
                "object": {"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": "p", "namespace": "web"},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
                "oldObject": null, "dryRun": false,
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_binding_onto_a_pool_node_is_refused_unless_the_binder_is_trusted() {
        for mode in [Mode::Guard, Mode::Mutate, Mode::Validate] {
            let r = answer(mode, &binding("alice", "b1"));
            let resp = &r["response"];
            assert_eq!(resp["uid"], "u-2");
            assert_eq!(resp["allowed"], false, "{mode:?}");
            assert_eq!(resp["status"]["code"], 403);
            let m = resp["status"]["message"].as_str().unwrap();
            assert!(
                m.contains("\"b1\" is a Tandem pool node") && m.contains("alice may not"),
                "{m}"
            );
        }
        let r = answer(
            Mode::Guard,
            &binding("system:serviceaccount:tandem:tandem-bridge", "b1"),
        );
        assert_eq!(r["response"]["allowed"], true);
        let r = answer(Mode::Guard, &binding("alice", "cpu-1"));
        assert_eq!(r["response"]["allowed"], true);
        let r = answer(Mode::Guard, &binding("alice", ""));
        assert_eq!(r["response"]["allowed"], false);
    }

    #[test]
    fn the_guard_reads_the_requester_from_the_review() {
        // A pod naming a pool node in a namespace nobody maps: refused by the guard, which
        // needs no namespace map; the same pod on another node passes untouched.
        let r = answer(
            Mode::Guard,
            &review("CREATE", "web", pod(json!({"nodeName": "b1"}))),
        );
        assert_eq!(r["response"]["allowed"], false);
        let r = answer(
            Mode::Guard,
            &review("CREATE", "web", pod(json!({"nodeName": "n2"}))),
        );
        assert_eq!(r["response"]["allowed"], true);
        assert!(r["response"].get("patch").is_none());
    }

    fn pod(extra: Value) -> Value {
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "serving"},
            "spec": {"containers": [{"name": "c", "image": "x"}]}});
        if let (Some(p), Some(e)) = (p["spec"].as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        p
    }

    #[test]
    fn a_mutation_comes_back_as_a_base64_json_patch() {
        let r = answer(Mode::Mutate, &review("CREATE", "serving", pod(json!({}))));
        assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(r["kind"], "AdmissionReview");
        let resp = &r["response"];
        assert_eq!(
            (resp["uid"].as_str(), resp["allowed"].as_bool()),
            (Some("u-1"), Some(true))
        );
        assert_eq!(resp["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().unwrap())
            .unwrap();
        let patch: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(patch[0]["path"], "/spec/schedulerName");
        assert_eq!(patch[1]["value"][0]["key"], "tandem.dev/pool");
        // Validation of the same pod never patches.
        let r = answer(
            Mode::Validate,
            &review("CREATE", "serving", pod(json!({"schedulerName": "tandem"}))),
        );
        assert_eq!(r["response"]["allowed"], true);
        assert!(r["response"].get("patch").is_none());
    }

    #[test]
    fn a_refusal_is_403_with_the_message() {
        let r = answer(
            Mode::Mutate,
            &review("CREATE", "serving", pod(json!({"nodeName": "k1"}))),
        );
        let resp = &r["response"];
        assert_eq!(resp["allowed"], false);
        assert_eq!(resp["status"]["code"], 403);
        assert!(
            resp["status"]["message"]
                .as_str()
                .unwrap()
                .starts_with("spec.nodeName")
        );
    }

    #[test]
    fn deletes_pass_and_garbage_is_refused_with_its_uid() {
        let r = answer(Mode::Mutate, &review("DELETE", "serving", Value::Null));
        assert_eq!(r["response"]["allowed"], true);
        let r = answer(Mode::Mutate, br#"{"request": {"uid": "u-9", "object": 5}}"#);
        assert_eq!(r["response"]["uid"], "u-9");
        assert_eq!(r["response"]["allowed"], false);
        let r = answer(Mode::Mutate, b"not json");
        assert_eq!(r["response"]["allowed"], false);
    }
}
