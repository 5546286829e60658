//! The resource types the server knows: a static table of built-in kinds plus the kinds that
//! CustomResourceDefinitions add at run time.

use std::sync::Arc;

use serde_json::Value;

/// JSON pointers of the scale subresource (`specReplicasPath` etc. as pointers).
#[derive(Clone, Debug)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// A printer column of a CRD (`additionalPrinterColumns`), used in Table output.
#[derive(Clone, Debug)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    /// JSON pointer derived from the column's simple JSONPath (`.spec.replicas`).
    pub pointer: String,
}

/// What the server needs to know about one resource type.
#[derive(Clone, Debug)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    /// Served versions, the storage (preferred) version first. Objects are stored once and
    /// served in every version unchanged apart from `apiVersion` (no conversion).
    pub versions: Vec<String>,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    /// Has a `status` subresource: writes to the main resource keep the old status, writes to
    /// `/status` change only the status, and status changes never bump `generation`.
    pub status: bool,
    pub scale: Option<ScalePaths>,
    /// Pod-only subresources (`binding`, `eviction`, `log`) named here for discovery.
    pub extra_subresources: Vec<&'static str>,
    /// Set for kinds that a CRD serves: per-version schemas and printer columns.
    pub custom: Option<Arc<crate::apiserver::crd::CustomInfo>>,
}

impl ResourceType {
    /// Storage key: `plural.group` (core kinds: plural alone), the same text the real
    /// server uses as the resource name in error messages.
    pub fn key(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn storage_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    status: bool,
    scale: bool,
}

#[allow(clippy::too_many_arguments)] // a table row, read positionally
const fn b(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    namespaced: bool,
    status: bool,
    scale: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        kind,
        plural,
        short,
        namespaced,
        status,
        scale,
    }
}

/// The built-in kinds this project touches. Anything else is a 404, as on a cluster
/// without that API.
const BUILTINS: &[Builtin] = &[
    b(
        "",
        "v1",
        "Namespace",
        "namespaces",
        &["ns"],
        false,
        true,
        false,
    ),
    b("", "v1", "Pod", "pods", &["po"], true, true, false),
    b("", "v1", "Node", "nodes", &["no"], false, true, false),
    b("", "v1", "Service", "services", &["svc"], true, true, false),
    b(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        &["ep"],
        true,
        false,
        false,
    ),
    b(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        &["cm"],
        true,
        false,
        false,
    ),
    b("", "v1", "Secret", "secrets", &[], true, false, false),
    b(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        &["sa"],
        true,
        false,
        false,
    ),
    b("", "v1", "Event", "events", &["ev"], true, false, false),
    b(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        &["pvc"],
        true,
        true,
        false,
    ),
    b(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        &["ev"],
        true,
        false,
        false,
    ),
    b(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        &[],
        true,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        &[],
        true,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        &[],
        true,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        &[],
        false,
        false,
        false,
    ),
    b(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        &[],
        false,
        false,
        false,
    ),
    b(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        &["deploy"],
        true,
        true,
        true,
    ),
    b(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        &["rs"],
        true,
        true,
        true,
    ),
    b(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        &["sts"],
        true,
        true,
        true,
    ),
    b(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        &["ds"],
        true,
        true,
        false,
    ),
    b("batch", "v1", "Job", "jobs", &[], true, true, false),
    b(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        &["hpa"],
        true,
        true,
        false,
    ),
    b(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        &["pdb"],
        true,
        true,
        false,
    ),
    b(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        &["pc"],
        false,
        false,
        false,
    ),
    // The in-tree Workload API (Kubernetes 1.35, alpha): pods name one in `spec.workloadRef`.
    b(
        "scheduling.k8s.io",
        "v1alpha1",
        "Workload",
        "workloads",
        &[],
        true,
        false,
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        &[],
        false,
        false,
        false,
    ),
    b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        &[],
        false,
        false,
        false,
    ),
    b(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        &["crd", "crds"],
        false,
        true,
        false,
    ),
];

/// Every built-in type, in discovery order.
pub fn builtin_types() -> Vec<Arc<ResourceType>> {
    BUILTINS
        .iter()
        .map(|b| {
            let extra = if b.plural == "pods" && b.group.is_empty() {
                vec!["binding", "eviction", "log"]
            } else {
                Vec::new()
            };
            let scale = b.scale.then(|| ScalePaths {
                spec_replicas: "/spec/replicas".into(),
                status_replicas: "/status/replicas".into(),
                label_selector: None,
            });
            Arc::new(ResourceType {
                group: b.group.into(),
                versions: vec![b.version.into()],
                kind: b.kind.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                short_names: b.short.iter().map(|s| (*s).to_owned()).collect(),
                namespaced: b.namespaced,
                status: b.status,
                scale,
                extra_subresources: extra,
                custom: None,
            })
        })
        .collect()
}

/// `.spec.replicas` -> `/spec/replicas` (the simple JSONPaths CRDs use for scale and printer
/// columns; anything fancier than dotted field names is not supported).
pub fn jsonpath_to_pointer(path: &str) -> Option<String> {
    let p = path.trim().trim_start_matches('$');
    if !p.starts_with('.') || p.contains('[') || p.contains('*') {
        return None;
    }
    Some(p.replace('.', "/"))
}

/// Reads a value by pointer, treating `null` as absent.
pub fn at<'a>(v: &'a Value, pointer: &str) -> Option<&'a Value> {
    v.pointer(pointer).filter(|v| !v.is_null())
}
