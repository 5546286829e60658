//! The admission decision's tests: the managed pods' rules, the pool-node guard's, and
//! the identities it trusts, each through [`super::admit`] or [`super::guard_binding`] as
//! the endpoints call them.

use serde_json::json;

use super::*;

const ANYONE: Requester<'static> = Requester { username: "alice" };

/// A guard that knows no pool node (the managed-pod tests do not involve one).
fn no_guard() -> Guard<'static> {
    static NONE: BTreeSet<String> = BTreeSet::new();
    Guard {
        pool_nodes: Ok(&NONE),
        operators: &[],
        binders: &[],
        holders: &[],
    }
}

fn policies() -> Vec<NamespacePolicy> {
    vec![NamespacePolicy {
        namespace: "serving".into(),
        account: "inference".into(),
        allowed_accounts: vec!["research".into()],
        ..Default::default()
    }]
}

fn pod(v: Value) -> Pod {
    let mut base = json!({"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "schedulerName": "default-scheduler",
    }});
    crate_merge(&mut base, v);
    serde_json::from_value(base).unwrap()
}

/// A JSON merge of `patch` into `base` (objects merged, everything else replaced).
fn crate_merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                crate_merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

fn decide(mode: Mode, ns: &str, p: &Pod) -> Verdict {
    let ps = policies();
    let view = View {
        cluster: "pool",
        policies: Ok(&ps),
        guard: no_guard(),
    };
    admit(mode, Op::Create, ns, p, None, Requester::default(), view)
}

fn denied(v: Verdict) -> String {
    match v {
        Verdict::Deny(m) => m,
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[test]
fn a_pod_in_a_mapped_namespace_gets_the_scheduler_and_the_pool_toleration() {
    let v = decide(Mode::Mutate, "serving", &pod(json!({})));
    let Verdict::Patch(ops) = v else {
        panic!("{v:?}")
    };
    assert_eq!(
        ops,
        vec![
            json!({"op": "add", "path": "/spec/schedulerName", "value": "tandem"}),
            json!({"op": "add", "path": "/spec/tolerations", "value": [
                {"key": "tandem.dev/pool", "operator": "Equal", "value": "pool", "effect": "NoSchedule"}]}),
        ]
    );
    // Existing tolerations are kept: the pool's is appended.
    let p = pod(json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}));
    let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
        panic!()
    };
    assert_eq!(ops[1]["path"], "/spec/tolerations/-");
    // Already scheduled by tandem and tolerating the pool (a template written by hand,
    // or the webhook's own earlier answer): nothing to change.
    let p = pod(json!({"spec": {"schedulerName": "tandem", "tolerations": [
        {"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoSchedule"}]}}));
    assert_eq!(decide(Mode::Mutate, "serving", &p), Verdict::Allow);
    // A toleration of another cluster's pool does not count.
    let p = pod(json!({"spec": {"tolerations": [
        {"key": "tandem.dev/pool", "operator": "Equal", "value": "other", "effect": "NoSchedule"}]}}));
    let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
        panic!()
    };
    assert_eq!(ops.len(), 2);
}

#[test]
fn the_label_opts_in_anywhere_and_out_in_a_mapped_namespace() {
    // Unmapped, unlabelled: untouched, whatever its annotations say.
    let p = pod(json!({"metadata": {"annotations": {"tandem.dev/partiton": "x"}}}));
    assert_eq!(decide(Mode::Mutate, "web", &p), Verdict::Allow);
    // Labelled in an unmapped namespace: managed, and refused for want of an account.
    let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "true"}}}));
    let m = denied(decide(Mode::Mutate, "web", &p));
    assert!(
        m.starts_with("metadata.namespace: namespace web is not mapped"),
        "{m}"
    );
    // Opted out in a mapped namespace: left to the default scheduler.
    let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "false"}}}));
    assert_eq!(decide(Mode::Mutate, "serving", &p), Verdict::Allow);
    let p = pod(json!({"metadata": {"labels": {MANAGED_LABEL: "yes"}}}));
    let m = denied(decide(Mode::Mutate, "serving", &p));
    assert!(
        m.contains("metadata.labels[tandem.dev/managed]: \"yes\" is neither"),
        "{m}"
    );
    // Naming the tandem scheduler by hand in an unmapped namespace is asking for it.
    let p = pod(json!({"spec": {"schedulerName": "tandem"}}));
    assert!(denied(decide(Mode::Mutate, "web", &p)).contains("not mapped"));
}

#[test]
fn every_problem_is_refused_naming_its_field() {
    let p = pod(json!({"metadata": {"annotations": {"tandem.dev/time-limit": "soon"}}}));
    let m = denied(decide(Mode::Mutate, "serving", &p));
    assert!(
        m.starts_with("metadata.annotations: annotation tandem.dev/time-limit: \"soon\""),
        "{m}"
    );
    let p = pod(json!({"metadata": {"annotations": {"tandem.dev/acount": "b"}}}));
    assert!(
        denied(decide(Mode::Mutate, "serving", &p))
            .contains("unknown annotation tandem.dev/acount")
    );
    let p = pod(json!({"metadata": {"annotations": {"tandem.dev/account": "b"}}}));
    assert_eq!(
        denied(decide(Mode::Mutate, "serving", &p)),
        "metadata.annotations[tandem.dev/account]: namespace serving may not charge \
         account b; it may charge inference, research"
    );
    let p = pod(json!({"metadata": {"annotations": {"tandem.dev/account": "research"}}}));
    assert!(matches!(
        decide(Mode::Mutate, "serving", &p),
        Verdict::Patch(_)
    ));
    let p = pod(json!({"spec": {"nodeName": "k1"}}));
    assert!(
        denied(decide(Mode::Mutate, "serving", &p)).starts_with("spec.nodeName: preset to \"k1\"")
    );
    let p = pod(json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}));
    assert!(denied(decide(Mode::Mutate, "serving", &p)).starts_with("spec.resourceClaims:"));
    let p = pod(json!({"spec": {"containers": [{"name": "c",
        "ports": [{"containerPort": 80, "hostPort": 80}]}]}}));
    assert!(
        denied(decide(Mode::Mutate, "serving", &p))
            .starts_with("spec.containers[].ports[].hostPort 80:")
    );
    let p = pod(json!({"spec": {"schedulerName": "volcano"}}));
    assert!(
        denied(decide(Mode::Mutate, "serving", &p)).starts_with("spec.schedulerName: \"volcano\"")
    );
    // Several at once: all listed.
    let p = pod(
        json!({"metadata": {"annotations": {"tandem.dev/account": "b"}},
        "spec": {"nodeName": "k1"}}),
    );
    let m = denied(decide(Mode::Mutate, "serving", &p));
    assert!(
        m.contains("tandem.dev/account") && m.contains("; spec.nodeName"),
        "{m}"
    );
}

#[test]
fn validation_checks_the_final_object_and_never_patches() {
    // After mutation the pod names tandem: valid.
    let p = pod(json!({"spec": {"schedulerName": "tandem"}}));
    assert_eq!(decide(Mode::Validate, "serving", &p), Verdict::Allow);
    // A later mutating webhook set it back: refused.
    let p = pod(json!({}));
    assert!(denied(decide(Mode::Validate, "serving", &p)).starts_with("spec.schedulerName"));
    let p = pod(json!({"spec": {"schedulerName": "tandem", "nodeName": "k1"}}));
    assert!(denied(decide(Mode::Validate, "serving", &p)).starts_with("spec.nodeName"));
}

#[test]
fn updates_recheck_only_changed_annotations() {
    let ps = policies();
    let view = View {
        cluster: "pool",
        policies: Ok(&ps),
        guard: no_guard(),
    };
    let old = pod(json!({"spec": {"schedulerName": "tandem", "nodeName": "k1"}}));
    // The bridge writing its job id, a label change: allowed, no patch, even though
    // nodeName is set (by the binding).
    let new = pod(
        json!({"metadata": {"annotations": {"tandem.dev/job-id": "7"},
        "labels": {"x": "y"}}, "spec": {"schedulerName": "tandem", "nodeName": "k1"}}),
    );
    for mode in [Mode::Mutate, Mode::Validate] {
        assert_eq!(
            admit(mode, Op::Update, "serving", &new, Some(&old), ANYONE, view),
            Verdict::Allow
        );
    }
    // Annotations already invalid and not touched by the update: not refused again
    // (the scheduler reports them; the update may be what cleans the pod up).
    let bad = pod(json!({"metadata": {"annotations": {"tandem.dev/qos": ""}},
        "spec": {"schedulerName": "tandem"}}));
    let mut relabelled = bad.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_eq!(
        admit(
            Mode::Mutate,
            Op::Update,
            "serving",
            &relabelled,
            Some(&bad),
            ANYONE,
            view
        ),
        Verdict::Allow
    );
    let new = pod(
        json!({"metadata": {"annotations": {"tandem.dev/account": "b"}},
        "spec": {"schedulerName": "tandem", "nodeName": "k1"}}),
    );
    let m = denied(admit(
        Mode::Validate,
        Op::Update,
        "serving",
        &new,
        Some(&old),
        ANYONE,
        view,
    ));
    assert!(m.contains("may not charge account b"), "{m}");
    assert_eq!(
        admit(
            Mode::Mutate,
            Op::Other,
            "serving",
            &new,
            Some(&old),
            ANYONE,
            view
        ),
        Verdict::Allow
    );
}

#[test]
fn nothing_is_judged_before_the_namespace_map_is_read() {
    let view = View {
        cluster: "pool",
        policies: Err("TandemCluster default/pool not read yet"),
        guard: no_guard(),
    };
    let m = denied(admit(
        Mode::Mutate,
        Op::Create,
        "web",
        &pod(json!({})),
        None,
        ANYONE,
        view,
    ));
    assert!(m.contains("TandemCluster default/pool not read yet"), "{m}");
}

#[test]
fn a_pod_of_a_workload_is_admitted() {
    let p = pod(
        json!({"spec": {"workloadRef": {"name": "train", "podGroup": "workers",
                                                 "podGroupReplicaKey": "0"}}}),
    );
    // The field is read (the k8s-openapi version in use has it), and it refuses nothing.
    assert_eq!(
        p.spec
            .as_ref()
            .and_then(|s| s.workload_ref.as_ref())
            .map(|r| r.pod_group.as_str()),
        Some("workers")
    );
    let Verdict::Patch(ops) = decide(Mode::Mutate, "serving", &p) else {
        panic!("a Workload's pod is mutated like any other")
    };
    assert_eq!(ops[0]["path"], "/spec/schedulerName");
    let p = pod(json!({"spec": {"schedulerName": "tandem",
        "workloadRef": {"name": "train", "podGroup": "workers"}}}));
    assert_eq!(decide(Mode::Validate, "serving", &p), Verdict::Allow);
}

// --- the pool-node guard ---

const OPERATOR: &str = "system:serviceaccount:tandem:tandem-operator";
const BRIDGE: &str = "system:serviceaccount:tandem:tandem-bridge";

struct Pool {
    nodes: BTreeSet<String>,
    operators: Vec<String>,
    binders: Vec<String>,
    policies: Vec<NamespacePolicy>,
}

impl Pool {
    fn new() -> Self {
        Pool {
            nodes: ["b1".to_owned(), "k1".to_owned()].into(),
            operators: vec![OPERATOR.to_owned()],
            binders: vec![BRIDGE.to_owned(), "system:kube-scheduler".to_owned()],
            policies: policies(),
        }
    }

    fn guard(&self) -> Guard<'_> {
        Guard {
            pool_nodes: Ok(&self.nodes),
            operators: &self.operators,
            binders: &self.binders,
            holders: std::slice::from_ref(&self.binders[0]),
        }
    }

    fn judge(
        &self,
        mode: Mode,
        op: Op,
        ns: &str,
        p: &Pod,
        old: Option<&Pod>,
        user: &str,
    ) -> Verdict {
        let view = View {
            cluster: "pool",
            policies: Ok(&self.policies),
            guard: self.guard(),
        };
        admit(mode, op, ns, p, old, Requester { username: user }, view)
    }

    fn create(&self, mode: Mode, ns: &str, p: &Pod, user: &str) -> Verdict {
        self.judge(mode, Op::Create, ns, p, None, user)
    }
}

/// A worker pod as the operator renders it (labels, owner, pool toleration, node pin).
fn worker(extra: Value) -> Pod {
    let mut p = pod(json!({
        "metadata": {
            "labels": {
                "app.kubernetes.io/name": "tandem",
                "app.kubernetes.io/component": "worker",
                "app.kubernetes.io/managed-by": "tandem-operator",
                "tandem.dev/cluster": "pool",
                "tandem.dev/workerset": "gpu",
            },
            "ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet",
                "name": "gpu", "uid": "u", "controller": true}],
        },
        "spec": {"tolerations": [{"key": "tandem.dev/pool", "operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["b1"]}]}]}}}},
    }));
    let mut v = serde_json::to_value(&p).unwrap();
    crate_merge(&mut v, extra);
    p = serde_json::from_value(v).unwrap();
    p
}

#[test]
fn a_preset_node_name_onto_a_pool_node_is_refused_from_any_namespace() {
    let pool = Pool::new();
    let pinned = pod(json!({"spec": {"nodeName": "b1"}}));
    for mode in [Mode::Guard, Mode::Mutate, Mode::Validate] {
        let m = denied(pool.create(mode, "web", &pinned, "alice"));
        assert!(
            m.starts_with("spec.nodeName: \"b1\" is a Tandem pool node"),
            "{m}"
        );
    }
    // A node outside the pool: not the guard's business.
    let elsewhere = pod(json!({"spec": {"nodeName": "cpu-7"}}));
    assert_eq!(
        pool.create(Mode::Guard, "web", &elsewhere, "alice"),
        Verdict::Allow
    );
    // Naming the tandem scheduler does not make a preset node acceptable.
    let p = pod(json!({"spec": {"nodeName": "k1", "schedulerName": "tandem"}}));
    assert!(denied(pool.create(Mode::Guard, "web", &p, "alice")).contains("pool node"));
    // Before the Node list is read: refused, naming why; pods naming no node pass.
    let g = Guard {
        pool_nodes: Err("nodes not listed yet"),
        ..pool.guard()
    };
    let view = View {
        cluster: "pool",
        policies: Ok(&pool.policies),
        guard: g,
    };
    let m = denied(admit(
        Mode::Guard,
        Op::Create,
        "web",
        &elsewhere,
        None,
        ANYONE,
        view,
    ));
    assert!(
        m.contains("cannot tell yet") && m.contains("nodes not listed yet"),
        "{m}"
    );
    assert_eq!(
        admit(
            Mode::Guard,
            Op::Create,
            "web",
            &pod(json!({})),
            None,
            ANYONE,
            view
        ),
        Verdict::Allow
    );
}

#[test]
fn a_pod_tolerating_the_pool_taint_outside_tandem_is_refused() {
    let pool = Pool::new();
    for tol in [
        json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoSchedule"}),
        json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}),
        json!({"key": "tandem.dev/pool", "operator": "Equal", "value": "other"}),
        json!({"operator": "Exists"}),
        json!({"key": "", "operator": "Exists", "effect": "NoExecute"}),
    ] {
        let p = pod(json!({"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}, tol]}}));
        let m = denied(pool.create(Mode::Guard, "web", &p, "alice"));
        assert!(
            m.starts_with("spec.tolerations[1]: tolerates the Tandem pool taint tandem.dev/pool"),
            "{tol}: {m}"
        );
    }
    // Tolerations that do not reach the pool: fine.
    for tol in [
        json!({"key": "gpu", "operator": "Exists"}),
        json!({"key": "tandem.dev/pool", "operator": "Exists", "effect": "PreferNoSchedule"}),
        json!({"operator": "Exists", "effect": "PreferNoSchedule"}),
    ] {
        let p = pod(json!({"spec": {"tolerations": [tol]}}));
        assert_eq!(
            pool.create(Mode::Guard, "web", &p, "alice"),
            Verdict::Allow,
            "{tol}"
        );
    }
    // A pod the bridge schedules tolerates NoSchedule by design.
    let p = pod(json!({"spec": {"schedulerName": "tandem", "tolerations": [
        {"key": "tandem.dev/pool", "operator": "Equal", "value": "pool", "effect": "NoSchedule"}]}}));
    assert_eq!(
        pool.create(Mode::Guard, "serving", &p, "alice"),
        Verdict::Allow
    );
    // Pinned like a DaemonSet pod: allowed onto a node outside the pool, not onto one in it.
    let ds = |node: &str| {
        pod(json!({"spec": {"tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}}))
    };
    assert_eq!(
        pool.create(Mode::Guard, "monitoring", &ds("cpu-7"), "ds"),
        Verdict::Allow
    );
    assert!(
        denied(pool.create(Mode::Guard, "monitoring", &ds("b1"), "ds"))
            .starts_with("spec.tolerations[0]")
    );
    let p = pod(json!({"spec": {"nodeName": "cpu-7", "tolerations": [{"operator": "Exists"}]}}));
    assert_eq!(pool.create(Mode::Guard, "web", &p, "alice"), Verdict::Allow);
    // Both problems at once are both named.
    let p = pod(json!({"spec": {"nodeName": "b1", "tolerations": [{"operator": "Exists"}]}}));
    let m = denied(pool.create(Mode::Guard, "web", &p, "alice"));
    assert!(
        m.contains("spec.nodeName") && m.contains("; spec.tolerations[0]"),
        "{m}"
    );
}

#[test]
fn an_opted_out_pod_of_a_mapped_namespace_stays_off_the_pool() {
    let pool = Pool::new();
    let out = json!({"metadata": {"labels": {MANAGED_LABEL: "false"}}});
    let mut pinned = out.clone();
    crate_merge(&mut pinned, json!({"spec": {"nodeName": "b1"}}));
    let m = denied(pool.create(Mode::Mutate, "serving", &pod(pinned), "alice"));
    assert!(
        m.starts_with("spec.nodeName: \"b1\" is a Tandem pool node"),
        "{m}"
    );
    let mut tolerating = out.clone();
    crate_merge(
        &mut tolerating,
        json!({"spec": {"tolerations": [
        {"key": "tandem.dev/pool", "operator": "Exists"}]}}),
    );
    let m = denied(pool.create(Mode::Mutate, "serving", &pod(tolerating), "alice"));
    assert!(m.starts_with("spec.tolerations[0]"), "{m}");
    // Opted out and minding its own business: still allowed, unchanged.
    assert_eq!(
        pool.create(Mode::Mutate, "serving", &pod(out), "alice"),
        Verdict::Allow
    );
}

#[test]
fn gpu_holders_pass_only_when_the_bridge_creates_them() {
    let pool = Pool::new();
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "tandem.dev/v1alpha1".into(),
        kind: "TandemCluster".into(),
        name: "pool".into(),
        uid: "tc-uid".into(),
        ..Default::default()
    };
    let spec = crate::holder::Spec {
        cluster: "pool",
        namespace: "tandem",
        image: "img",
        owner: &owner,
    };
    let h = crate::holder::pod(&spec, "b1", 2);
    // The bridge's own: pinned to a batch-mode pool node, tolerating NoExecute.
    assert_eq!(
        pool.create(Mode::Guard, "tandem", &h, BRIDGE),
        Verdict::Allow
    );
    // The same labels from anyone else (or the operator) prove nothing.
    for who in ["alice", OPERATOR, "system:kube-scheduler", ""] {
        let m = denied(pool.create(Mode::Guard, "tandem", &h, who));
        assert!(
            m.contains("spec.nodeName") && m.contains("spec.tolerations"),
            "{m}"
        );
    }
    // The bridge's identity admits no other pod onto the pool.
    let mut other = h.clone();
    if let Some(l) = other.metadata.labels.as_mut() {
        l.insert("app.kubernetes.io/component".into(), "worker".into());
    }
    assert!(denied(pool.create(Mode::Guard, "tandem", &other, BRIDGE)).contains("pool node"));
    // Through the mutating endpoint of a mapped namespace too (it opts out).
    assert_eq!(
        pool.create(Mode::Mutate, "serving", &h, BRIDGE),
        Verdict::Allow
    );
}

#[test]
fn the_operators_own_pods_pass_only_when_the_operator_creates_them() {
    let pool = Pool::new();
    let w = worker(json!({}));
    assert_eq!(
        pool.create(Mode::Guard, "tandem", &w, OPERATOR),
        Verdict::Allow
    );
    let pinned = worker(json!({"spec": {"nodeName": "b1"}}));
    assert_eq!(
        pool.create(Mode::Guard, "tandem", &pinned, OPERATOR),
        Verdict::Allow
    );
    for kind in ["controller", "login"] {
        let owner = if kind == "login" {
            "LoginSet"
        } else {
            "TandemCluster"
        };
        let p = worker(json!({"metadata": {
            "labels": {"app.kubernetes.io/component": kind},
            "ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1", "kind": owner,
                "name": "x", "uid": "u", "controller": true}]}}));
        assert_eq!(
            pool.create(Mode::Guard, "tandem", &p, OPERATOR),
            Verdict::Allow,
            "{kind}"
        );
    }
    // The same pod from anyone else: the labels and owner are forgeable.
    assert!(
        denied(pool.create(Mode::Guard, "tandem", &w, "alice")).starts_with("spec.tolerations[0]")
    );
    assert!(
        denied(pool.create(Mode::Guard, "tandem", &pinned, BRIDGE)).starts_with("spec.nodeName")
    );
    // From the operator, but not shaped as its pods: refused.
    let bad = [
        json!({"metadata": {"labels": {"app.kubernetes.io/component": "sidecar"}}}),
        json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "helm"}}}),
        json!({"metadata": {"labels": {"tandem.dev/cluster": ""}}}),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1",
            "kind": "LoginSet", "name": "gpu", "uid": "u", "controller": true}]}}),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.devx/v1",
            "kind": "WorkerSet", "name": "gpu", "uid": "u", "controller": true}]}}),
        json!({"metadata": {"ownerReferences": [{"apiVersion": "tandem.dev/v1alpha1",
            "kind": "WorkerSet", "name": "gpu", "uid": "u", "controller": false}]}}),
    ];
    for extra in bad {
        let p = worker(extra.clone());
        assert!(
            matches!(
                pool.create(Mode::Guard, "tandem", &p, OPERATOR),
                Verdict::Deny(_)
            ),
            "{extra}"
        );
    }
    let mut unlabelled = w.clone();
    unlabelled.metadata.labels = None;
    assert!(matches!(
        pool.create(Mode::Guard, "tandem", &unlabelled, OPERATOR),
        Verdict::Deny(_)
    ));
}

#[test]
fn an_update_that_adds_a_pool_toleration_is_refused() {
    let pool = Pool::new();
    let old = pod(
        json!({"spec": {"nodeName": "cpu-7", "tolerations": [{"key": "gpu", "operator": "Exists"}]}}),
    );
    // nodeName is set (by a binding) but cpu-7 is outside the pool: pinned off it.
    let mut new = serde_json::to_value(&old).unwrap();
    new["spec"]["nodeName"] = json!("b1");
    new["spec"]["tolerations"] = json!([{"key": "gpu", "operator": "Exists"},
        {"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}]);
    let new: Pod = serde_json::from_value(new).unwrap();
    let m = denied(pool.judge(Mode::Guard, Op::Update, "web", &new, Some(&old), "alice"));
    assert!(m.starts_with("spec.tolerations[1]"), "{m}");
    // The update path does not judge nodeName (only a binding sets it, judged there).
    assert!(!m.contains("spec.nodeName"), "{m}");
    // A toleration the pod already had is not judged again (a label edit passes).
    let mut relabelled = new.clone();
    relabelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    assert_eq!(
        pool.judge(
            Mode::Guard,
            Op::Update,
            "web",
            &relabelled,
            Some(&new),
            "alice"
        ),
        Verdict::Allow
    );
    assert_eq!(
        pool.judge(Mode::Guard, Op::Other, "web", &new, Some(&old), "alice"),
        Verdict::Allow
    );
}

#[test]
fn only_the_named_binders_bind_onto_pool_nodes() {
    let pool = Pool::new();
    let g = pool.guard();
    let who = |u| Requester { username: u };
    assert_eq!(guard_binding("b1", who(BRIDGE), g), Verdict::Allow);
    assert_eq!(
        guard_binding("k1", who("system:kube-scheduler"), g),
        Verdict::Allow
    );
    let m = denied(guard_binding("b1", who("alice"), g));
    assert!(
        m.starts_with("target.name: \"b1\" is a Tandem pool node; only the tandem scheduler binds pods there (alice may not)"),
        "{m}"
    );
    assert!(denied(guard_binding("b1", who(""), g)).contains("an unnamed requester"));
    assert_eq!(guard_binding("cpu-7", who("alice"), g), Verdict::Allow);
    let unread = Guard {
        pool_nodes: Err("nodes not listed yet"),
        ..g
    };
    assert!(denied(guard_binding("cpu-7", who("alice"), unread)).contains("cannot tell yet"));
    assert_eq!(guard_binding("b1", who(BRIDGE), unread), Verdict::Allow);
}
