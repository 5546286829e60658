//! Manifests in tests: multi-document YAML to objects, and creating them through
//! discovery as `kubectl create -f` does. Apart from [`super::TestCluster`] because it
//! needs only a client, and works the same on a real cluster.

use kube::api::{Api, PostParams};
use serde::Deserialize as _;

use super::TestkitError;

/// Parses a multi-document YAML manifest (an `examples/` file, a rendered chart) into
/// objects; empty documents are skipped.
pub fn objects_from_yaml(text: &str) -> Result<Vec<kube::api::DynamicObject>, TestkitError> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .map_err(|source| TestkitError::Yaml { index, source })?;
        if value.is_null() {
            continue;
        }
        let obj: kube::api::DynamicObject =
            serde_yaml::from_value(value).map_err(|source| TestkitError::Yaml { index, source })?;
        if obj.types.is_none() {
            return Err(TestkitError::NoKind { index });
        }
        out.push(obj);
    }
    Ok(out)
}

/// Creates every object of a manifest, in order, finding each kind through discovery (as
/// `kubectl create -f` does). Namespaced objects without a namespace go to `namespace`.
pub async fn create_all(
    client: &kube::Client,
    namespace: &str,
    objects: &[kube::api::DynamicObject],
) -> Result<Vec<kube::api::DynamicObject>, TestkitError> {
    let mut created = Vec::new();
    for (index, obj) in objects.iter().enumerate() {
        let types = obj.types.as_ref().ok_or(TestkitError::NoKind { index })?;
        let gvk = kube::api::GroupVersionKind::try_from(types)
            .map_err(|_| TestkitError::NoKind { index })?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let fail = |source| TestkitError::Create {
            kind: gvk.kind.clone(),
            name: name.clone(),
            source,
        };
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(fail)?;
        let api: Api<kube::api::DynamicObject> = match caps.scope {
            kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &ar),
            kube::discovery::Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().unwrap_or(namespace);
                Api::namespaced_with(client.clone(), ns, &ar)
            }
        };
        created.push(
            api.create(&PostParams::default(), obj)
                .await
                .map_err(fail)?,
        );
    }
    Ok(created)
}
