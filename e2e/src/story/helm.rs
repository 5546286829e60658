//! `helm install` and `helm uninstall` on the harness: a chart rendered by real Helm
//! (`charts/tests/render.py` in the venv `scripts/chart-tests --venv-only` makes), its
//! objects created in Helm's install order, its post-install hooks after them, and every
//! object it made deleted in reverse.

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::discovery::Scope;
use serde::Deserialize;
use serde_json::Value;

/// What Helm rendered for one release.
#[derive(Debug, Deserialize)]
pub struct Rendered {
    /// CRDs first, then the templates' objects in Helm's install order.
    pub objects: Vec<DynamicObject>,
    /// The post-install hooks, in the order Helm runs them.
    pub hooks: Vec<DynamicObject>,
    pub notes: String,
}

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("making the chart venv (scripts/chart-tests --venv-only)")]
    Venv(#[source] std::io::Error),
    #[error("scripts/chart-tests --venv-only failed: {0}")]
    VenvFailed(String),
    #[error("running charts/tests/render.py")]
    Spawn(#[source] std::io::Error),
    #[error("helm render of {chart} failed: {stderr}")]
    Failed { chart: String, stderr: String },
    #[error("reading what render.py printed for {chart}")]
    Parse {
        chart: String,
        #[source]
        source: serde_json::Error,
    },
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv's python, made (or found up to date) by `scripts/chart-tests --venv-only`.
pub fn python() -> Result<PathBuf, RenderError> {
    let out = Command::new(root().join("scripts/chart-tests"))
        .arg("--venv-only")
        .output()
        .map_err(RenderError::Venv)?;
    if !out.status.success() {
        return Err(RenderError::VenvFailed(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    Ok(target.join("chart-venv/bin/python"))
}

/// `helm template`: `chart` (a folder of `charts/`) as `release` in `namespace`.
pub fn render(
    python: &Path,
    chart: &str,
    release: &str,
    namespace: &str,
    values: &Value,
) -> Result<Rendered, RenderError> {
    let out = Command::new(python)
        .arg(root().join("charts/tests/render.py"))
        .arg(root().join("charts").join(chart))
        .args([release, namespace, &values.to_string()])
        .output()
        .map_err(RenderError::Spawn)?;
    if !out.status.success() {
        return Err(RenderError::Failed {
            chart: chart.to_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|source| RenderError::Parse {
        chart: chart.to_owned(),
        source,
    })
}

/// One object a release made, to delete it on uninstall.
#[derive(Debug, Clone)]
pub struct Made {
    pub resource: ApiResource,
    pub namespace: Option<String>,
    pub name: String,
}

impl Made {
    pub fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.resource),
            None => Api::all_with(client.clone(), &self.resource),
        }
    }

    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{} in {ns}", self.resource.kind, self.name),
            None => format!("{}/{}", self.resource.kind, self.name),
        }
    }
}

/// Creates `obj` (its namespace, else `namespace`), found through discovery as Helm does.
pub async fn create(
    client: &kube::Client,
    namespace: &str,
    obj: &DynamicObject,
) -> Result<Made, kube::Error> {
    let gvk = obj
        .types
        .as_ref()
        .and_then(|t| kube::api::GroupVersionKind::try_from(t).ok())
        .unwrap_or_else(|| kube::api::GroupVersionKind::gvk("", "v1", "Unknown"));
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let made = Made {
        resource,
        namespace: match caps.scope {
            Scope::Cluster => None,
            Scope::Namespaced => Some(
                obj.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| namespace.to_owned()),
            ),
        },
        name: obj.metadata.name.clone().unwrap_or_default(),
    };
    made.api(client).create(&PostParams::default(), obj).await?;
    Ok(made)
}

/// Deletes what a release made, last first (`helm uninstall`), with foreground
/// propagation so a Deployment's pods go with it. Already gone is fine.
pub async fn delete_all(client: &kube::Client, made: &[Made]) -> Vec<String> {
    let dp = DeleteParams::foreground();
    let mut failures = Vec::new();
    for m in made.iter().rev() {
        match m.api(client).delete(&m.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => failures.push(format!("{}: {e}", m.describe())),
        }
    }
    failures
}

/// The first container of a rendered workload (Deployment or Job): its pod template's
/// `containers[0]`, with the pod spec's volumes.
pub fn first_container(obj: &DynamicObject) -> (Value, Value) {
    let spec = &obj.data["spec"]["template"]["spec"];
    (spec["containers"][0].clone(), spec["volumes"].clone())
}

/// `command` + `args` of a container, as strings.
pub fn argv(container: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .flat_map(|k| container[*k].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn argv_is_command_then_args() {
        let c = json!({"command": ["tandem-bridge"], "args": ["run", "--cluster", "pool"]});
        assert_eq!(argv(&c), ["tandem-bridge", "run", "--cluster", "pool"]);
        assert_eq!(argv(&json!({"args": ["x"]})), ["x"]);
    }
}
