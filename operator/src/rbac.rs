//! Every Kubernetes API call the operator makes, in one table, and the RBAC rules derived
//! from it (`tandem-operator rbac`, checked in at `charts/tandem-operator/files/rbac.yaml`,
//! which the chart turns into its roles).
//!
//! Each row says whether its resource is cluster-scoped. The chart grants:
//!
//! - watching every namespace (`watchNamespace: ""`): one ClusterRole with every rule;
//! - watching one namespace: a ClusterRole with the cluster-scoped rules only (Node
//!   list/watch: where worker pods may go) and a Role in the watched namespace with the rest
//!   (its pods, Secrets, Services, ... and the `tandem.dev` objects), so the operator holds
//!   no Secret or Pod verb anywhere else. Everything the operator reads or writes for a
//!   `TandemCluster` lives in that cluster's namespace ([`crate::reconcile`] builds every
//!   namespaced `Api` from the object's namespace), and in one-namespace mode its watches
//!   are namespaced too, so the Role is enough.
//!
//! The reconcilers name each `Api` after its resource (`pods`, `services`, ...). The tests
//! read `src/reconcile.rs` and fail both ways: on a verb in the table the code never uses,
//! and on a call the table does not grant. `e2e/tests/packaging.rs` renders the chart with
//! real Helm in both modes and compares what it grants with this table.

use serde_json::json;

/// Where a resource lives: what kind of role can grant it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Cluster-scoped (Nodes): only a ClusterRole can grant it.
    Cluster,
    /// In a namespace: a Role in the watched namespace when the operator watches one.
    Namespaced,
}

/// (API group, resource, verbs, scope). `list`/`watch` come with the watches of
/// `kube::runtime::Controller`.
pub const USES: &[(&str, &str, &[&str], Scope)] = &[
    (
        "tandem.dev",
        "tandemclusters",
        &["get", "list", "watch"],
        Scope::Namespaced,
    ),
    (
        "tandem.dev",
        "tandemclusters/status",
        &["patch"],
        Scope::Namespaced,
    ),
    // patch: the finalizer.
    (
        "tandem.dev",
        "workersets",
        &["list", "watch", "patch"],
        Scope::Namespaced,
    ),
    (
        "tandem.dev",
        "workersets/status",
        &["patch"],
        Scope::Namespaced,
    ),
    (
        "tandem.dev",
        "loginsets",
        &["list", "watch"],
        Scope::Namespaced,
    ),
    (
        "tandem.dev",
        "loginsets/status",
        &["patch"],
        Scope::Namespaced,
    ),
    // patch: drain marks, and the pool toleration added to older worker pods.
    (
        "",
        "pods",
        &["list", "watch", "create", "patch", "delete"],
        Scope::Namespaced,
    ),
    // patch: a Service from an older operator gets the scaler and metrics ports.
    (
        "",
        "services",
        &["get", "create", "patch"],
        Scope::Namespaced,
    ),
    // create + patch: server-side apply, which creates the object the first time.
    (
        "",
        "configmaps",
        &["list", "watch", "create", "patch"],
        Scope::Namespaced,
    ),
    // patch: the controller's certificate, reissued when the Service's names change.
    (
        "",
        "secrets",
        &["get", "create", "patch"],
        Scope::Namespaced,
    ),
    (
        "",
        "persistentvolumeclaims",
        &["get", "create"],
        Scope::Namespaced,
    ),
    // Which nodes a worker set may use (labels, taints, cordons).
    ("", "nodes", &["list", "watch"], Scope::Cluster),
    // patch: the recorder folds a repeated Event into a series and patches its count.
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Namespaced,
    ),
];

/// The variable name the reconcilers give each resource's `Api` (the tests' convention).
pub fn var_of(resource: &str) -> &'static str {
    match resource {
        "tandemclusters" | "tandemclusters/status" => "clusters",
        "workersets" | "workersets/status" => "sets",
        "loginsets" | "loginsets/status" => "logins",
        "pods" => "pods",
        "services" => "services",
        "configmaps" => "configmaps",
        "secrets" => "secrets",
        "persistentvolumeclaims" => "pvcs",
        "nodes" => "nodes",
        "events" => "recorder",
        _ => "?",
    }
}

/// The RBAC rules of the rows of `scope`, one rule per row.
pub fn rules(scope: Scope) -> Vec<serde_json::Value> {
    USES.iter()
        .filter(|(_, _, _, s)| *s == scope)
        .map(|(group, resource, verbs, _)| {
            json!({"apiGroups": [group], "resources": [resource], "verbs": verbs})
        })
        .collect()
}

/// What `files/rbac.yaml` holds: the rules by scope (the chart decides the role kinds).
pub fn rules_file() -> serde_json::Value {
    json!({
        "clusterRules": rules(Scope::Cluster),
        "namespacedRules": rules(Scope::Namespaced),
    })
}

/// `tandem-operator rbac`: [`rules_file`] as YAML, with how the chart uses it.
pub fn rules_yaml() -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated by `tandem-operator rbac`; do not edit.\n\
         # clusterRules: always granted by a ClusterRole (cluster-scoped resources).\n\
         # namespacedRules: a Role in the watched namespace when the operator watches one\n\
         # (`--namespace`, the chart's watchNamespace), else part of the ClusterRole.\n{}",
        serde_yaml::to_string(&rules_file())?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files that make API calls.
    const FILES: &[&str] = &[
        include_str!("daemon.rs"),
        include_str!("secrets.rs"),
        include_str!("connections.rs"),
        include_str!("events.rs"),
        include_str!("reconcile/mod.rs"),
        include_str!("reconcile/cluster.rs"),
        include_str!("reconcile/workerset.rs"),
        include_str!("reconcile/loginset.rs"),
    ];

    /// The source with whitespace removed before `.` and after `(` and `,`, so calls split
    /// over lines (`pods\n    .create(`) still match, and words stay apart.
    fn source() -> String {
        let raw = FILES.join("\n");
        let mut out = String::with_capacity(raw.len());
        let mut pending_ws = false;
        for c in raw.chars() {
            if c.is_whitespace() {
                pending_ws = true;
                continue;
            }
            let last = out.chars().next_back();
            if pending_ws && c != '.' && !matches!(last, Some('(' | ',')) {
                out.push(' ');
            }
            pending_ws = false;
            out.push(c);
        }
        out
    }

    /// Whether `pat` occurs in `src` as its own word (`nodes.get(` is not in `batch_nodes.get(`).
    fn occurs(src: &str, pat: &str) -> bool {
        src.match_indices(pat).any(|(i, _)| {
            !src[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    }

    /// Whether the source calls `verb` on the Api variable `var`.
    fn calls(var: &str, resource: &str, verb: &str) -> bool {
        let src = source();
        let has = |pat: &str| occurs(&src, pat);
        let status = resource.ends_with("/status");
        match verb {
            "get" => has(&format!("{var}.get(")) || has(&format!("{var}.get_opt(")),
            // kube's recorder creates an Event, then patches it into a series on a repeat.
            "create" | "patch" if var == "recorder" => has("recorder.publish("),
            "create" => {
                has(&format!("{var}.create("))
                    || has(&format!(
                        "{var}.patch(&render::config_map_name(name),&PatchParams::apply("
                    ))
            }
            "patch" if status => has(&format!("{var}.patch_status(")),
            "patch" => {
                has(&format!("{var}.patch(")) || has(&format!("finalizer::finalizer(&{var},"))
            }
            "delete" => has(&format!("{var}.delete(")),
            // Watched through the Controller (owns/watches) or a reflector.
            "list" | "watch" => has(&format!("watch: {var}")),
            _ => false,
        }
    }

    #[test]
    fn every_granted_verb_is_used_by_the_code() {
        for (_, resource, verbs, _) in USES {
            for verb in *verbs {
                assert!(
                    calls(var_of(resource), resource, verb),
                    "the ClusterRole grants {verb} on {resource}, which src/reconcile.rs never does"
                );
            }
        }
    }

    #[test]
    fn every_call_in_the_code_is_granted() {
        for var in [
            "clusters",
            "sets",
            "logins",
            "pods",
            "services",
            "configmaps",
            "secrets",
            "pvcs",
            "nodes",
        ] {
            for (method, verb, status) in [
                (".get(", "get", false),
                (".get_opt(", "get", false),
                (".create(", "create", false),
                (".patch(", "patch", false),
                (".patch_status(", "patch", true),
                (".delete(", "delete", false),
                (".replace(", "update", false),
                (".delete_collection(", "deletecollection", false),
            ] {
                if !occurs(&source(), &format!("{var}{method}")) {
                    continue;
                }
                let granted = USES.iter().any(|(_, r, verbs, _)| {
                    var_of(r) == var && r.ends_with("/status") == status && verbs.contains(&verb)
                });
                assert!(
                    granted,
                    "src/reconcile.rs calls {var}{method}) but the ClusterRole lacks {verb}"
                );
            }
        }
    }

    #[test]
    fn the_checked_in_rules_are_current() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/tandem-operator/files/rbac.yaml"
        );
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            have,
            rules_yaml().unwrap(),
            "regenerate: cargo run -p tandem-operator -- rbac > charts/tandem-operator/files/rbac.yaml"
        );
    }

    /// Only Nodes are cluster-scoped among what the operator touches; a Role cannot grant a
    /// cluster-scoped resource, so a row marked wrongly would leave the operator without it.
    #[test]
    fn scopes_are_the_resources_own() {
        for (group, resource, _, scope) in USES {
            let cluster_scoped = matches!((*group, *resource), ("", "nodes" | "namespaces"))
                || resource.starts_with("customresourcedefinitions")
                || resource.starts_with("clusterroles");
            assert_eq!(
                *scope == Scope::Cluster,
                cluster_scoped,
                "{group}/{resource} is marked {scope:?}"
            );
        }
        assert_eq!(rules(Scope::Cluster).len(), 1);
        assert_eq!(rules(Scope::Cluster)[0]["resources"][0], "nodes");
    }
}
