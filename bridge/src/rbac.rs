//! Every Kubernetes API call `tandem-bridge run` makes, in one table: the chart's
//! ClusterRole (`charts/tandem-bridge/templates/rbac.yaml`) grants exactly these rules,
//! no more (least privilege), and the tests below fail both ways: on a verb granted that
//! the code never uses, and on a call in the code the table does not grant.
//!
//! The calls are found in the bridge's sources by the kube-rs method that makes them (the
//! Api type of each call site is fixed by the module: pods in `apply.rs`, Nodes in
//! `scheduler/modes.rs`, owners in `scheduler/work.rs`, the GPU holders' pods in
//! `scheduler/modes/holders.rs`); the hook Job's `webhook-certs` (Secrets and webhook
//! configurations) has its own Role in `certjob.yaml`.

/// (API group, resource, verbs) for the bridge's ClusterRole. The Lease of leader election
/// is in [`LEASE`], granted by a Role in the release namespace.
pub const USES: &[(&str, &str, &[&str])] = &[
    // get: a 409 on a binding reads the pod back; list/watch: the scheduler's pod watch
    // (list: the GPU holders too); patch: the slot finalizer, added before binding and
    // removed once the kubelet reported the containers stopped; delete: a pod whose
    // evictions a PodDisruptionBudget refused past --eviction-timeout, and GPU holders.
    ("", "pods", &["get", "list", "watch", "patch", "delete"]),
    ("", "pods/binding", &["create"]),
    ("", "pods/eviction", &["create"]),
    // PodScheduled=False, reason Unschedulable.
    ("", "pods/status", &["patch"]),
    // The mode label and the pool taints; the watches of the scheduler and the webhook.
    ("", "nodes", &["list", "watch", "patch"]),
    // kube-runtime's recorder creates an Event, and patches it into a series on a repeat.
    ("events.k8s.io", "events", &["create", "patch"]),
    ("tandem.dev", "tandemclusters", &["list", "watch"]),
    // A group's owner: its UID and size, read once per group.
    ("scheduling.x-k8s.io", "podgroups", &["get"]),
    ("scheduling.k8s.io", "workloads", &["get"]),
    ("jobset.x-k8s.io", "jobsets", &["get"]),
    ("batch", "jobs", &["get"]),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", &["get"]),
];

/// Leader election's Lease, in the release namespace.
pub const LEASE: (&str, &str, &[&str]) = (
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update"],
);

/// The GPU holders ([`crate::holder`]) are created in the release namespace only: a Role
/// there grants it (listing and deleting them are the ClusterRole's pods rule).
pub const HOLDERS: (&str, &str, &[&str]) = ("", "pods", &["create"]);

/// The ClusterRole's rules, one a row.
pub fn rules() -> Vec<serde_json::Value> {
    USES.iter()
        .map(|(group, resource, verbs)| {
            serde_json::json!({"apiGroups": [group], "resources": [resource], "verbs": verbs})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sources that make API calls, each with the resource its `Api` is of (or `*` for
    /// the calls whose resource the pattern itself names).
    const SOURCES: &[(&str, &str)] = &[
        ("pods", include_str!("apply.rs")),
        ("nodes", include_str!("scheduler/modes.rs")),
        ("owners", include_str!("scheduler/work.rs")),
        ("*", include_str!("scheduler.rs")),
        ("*", include_str!("webhook/state.rs")),
        ("leases", include_str!("leader.rs")),
        ("holders", include_str!("scheduler/modes/holders.rs")),
    ];

    /// (source's resource, code pattern) -> the (group, resource, verb) it needs.
    const CALLS: &[(&str, &str, (&str, &str, &str))] = &[
        ("pods", "api.get(", ("", "pods", "get")),
        ("pods", "api.patch(", ("", "pods", "patch")),
        ("pods", "api.delete(", ("", "pods", "delete")),
        ("pods", "\"binding\"", ("", "pods/binding", "create")),
        ("pods", "api.evict(", ("", "pods/eviction", "create")),
        ("pods", "api.patch_status(", ("", "pods/status", "patch")),
        (
            "pods",
            "recorder.publish(",
            ("events.k8s.io", "events", "create"),
        ),
        (
            "pods",
            "recorder.publish(",
            ("events.k8s.io", "events", "patch"),
        ),
        ("nodes", ".patch(", ("", "nodes", "patch")),
        ("*", "Api::<Node>::all(", ("", "nodes", "list")),
        ("*", "Api::<Node>::all(", ("", "nodes", "watch")),
        (
            "*",
            "let api: Api<Node> = Api::all(",
            ("", "nodes", "watch"),
        ),
        (
            "*",
            "let pod_api: Api<Pod> = Api::all(",
            ("", "pods", "list"),
        ),
        (
            "*",
            "let pod_api: Api<Pod> = Api::all(",
            ("", "pods", "watch"),
        ),
        (
            "*",
            "cluster::api_resource()",
            ("tandem.dev", "tandemclusters", "list"),
        ),
        (
            "*",
            "cluster::api_resource()",
            ("tandem.dev", "tandemclusters", "watch"),
        ),
        (
            "owners",
            "\"podgroups\"",
            ("scheduling.x-k8s.io", "podgroups", "get"),
        ),
        (
            "owners",
            "\"workloads\"",
            ("scheduling.k8s.io", "workloads", "get"),
        ),
        (
            "owners",
            "\"jobsets\"",
            ("jobset.x-k8s.io", "jobsets", "get"),
        ),
        ("owners", "\"jobs\"", ("batch", "jobs", "get")),
        (
            "owners",
            "\"leaderworkersets\"",
            ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
        ),
        (
            "leases",
            ".get_opt(",
            ("coordination.k8s.io", "leases", "get"),
        ),
        (
            "leases",
            ".create(",
            ("coordination.k8s.io", "leases", "create"),
        ),
        (
            "leases",
            ".replace(",
            ("coordination.k8s.io", "leases", "update"),
        ),
        ("holders", "api.list(", ("", "pods", "list")),
        ("holders", "api.create(", ("", "pods", "create")),
        ("holders", "api.delete(", ("", "pods", "delete")),
        (
            "holders",
            "recorder.publish(",
            ("events.k8s.io", "events", "create"),
        ),
        (
            "holders",
            "recorder.publish(",
            ("events.k8s.io", "events", "patch"),
        ),
    ];

    /// The source without whitespace, so calls split over lines still match.
    fn squeezed(s: &str) -> String {
        s.chars().filter(|c| !c.is_whitespace()).collect()
    }

    fn used(src_kind: &str, pattern: &str) -> bool {
        let p = squeezed(pattern);
        SOURCES
            .iter()
            .filter(|(k, _)| *k == src_kind)
            .any(|(_, text)| {
                // Only the code before the file's tests.
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                squeezed(code).contains(&p)
            })
    }

    fn granted(group: &str, resource: &str, verb: &str) -> bool {
        USES.iter()
            .chain([&LEASE, &HOLDERS])
            .any(|(g, r, v)| *g == group && *r == resource && v.contains(&verb))
    }

    #[test]
    fn every_call_in_the_code_is_granted() {
        for (kind, pattern, (group, resource, verb)) in CALLS {
            if used(kind, pattern) {
                assert!(
                    granted(group, resource, verb),
                    "the code calls {pattern} ({verb} {group}/{resource}) but the role lacks it"
                );
            }
        }
        // A delete or evict anywhere else would be a call this table does not know.
        for (kind, text) in SOURCES {
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for call in [".delete(", ".evict(", ".replace(", ".create("] {
                let expected = CALLS
                    .iter()
                    .any(|(k, p, _)| k == kind && squeezed(p).ends_with(call));
                assert!(
                    !code.contains(call) || expected,
                    "a source of kind {kind} calls {call} that the RBAC table does not list"
                );
            }
        }
    }

    #[test]
    fn every_granted_verb_is_used_by_the_code() {
        for (group, resource, verbs) in USES.iter().chain([&LEASE, &HOLDERS]) {
            for verb in *verbs {
                let used_by = CALLS.iter().any(|(kind, pattern, need)| {
                    *need == (*group, *resource, *verb) && used(kind, pattern)
                });
                assert!(
                    used_by,
                    "the role grants {verb} {group}/{resource}, which the code never does"
                );
            }
        }
    }

    #[test]
    fn the_charts_cluster_role_is_this_table() {
        let chart = include_str!("../../charts/tandem-bridge/templates/rbac.yaml");
        // The ClusterRole's rules: the block after its `rules:` up to the document's end.
        let after = chart
            .split_once("kind: ClusterRole\n")
            .and_then(|(_, rest)| rest.split_once("rules:\n"))
            .map(|(_, rest)| rest.split("\n---").next().unwrap_or_default())
            .unwrap_or_default();
        let rules: Vec<serde_json::Value> =
            serde_yaml::from_str(after).unwrap_or_else(|e| panic!("the ClusterRole's rules: {e}"));
        assert_eq!(
            rules,
            super::rules(),
            "charts/tandem-bridge/templates/rbac.yaml"
        );
        let lease = chart
            .split_once("}}-leader\n")
            .and_then(|(_, rest)| rest.split_once("rules:\n"))
            .map(|(_, rest)| rest.split("\n---").next().unwrap_or_default())
            .unwrap_or_default();
        let lease: Vec<serde_json::Value> =
            serde_yaml::from_str(lease).unwrap_or_else(|e| panic!("the Lease Role's rules: {e}"));
        let (g, r, v) = LEASE;
        assert_eq!(
            lease,
            vec![serde_json::json!({"apiGroups": [g], "resources": [r], "verbs": v})]
        );
        let holders = chart
            .split_once("-gpu-holders\n")
            .and_then(|(_, rest)| rest.split_once("rules:\n"))
            .map(|(_, rest)| rest.split("\n---").next().unwrap_or_default())
            .unwrap_or_default();
        let holders: Vec<serde_json::Value> = serde_yaml::from_str(holders)
            .unwrap_or_else(|e| panic!("the GPU holders' Role's rules: {e}"));
        let (g, r, v) = HOLDERS;
        assert_eq!(
            holders,
            vec![serde_json::json!({"apiGroups": [g], "resources": [r], "verbs": v})]
        );
    }
}
