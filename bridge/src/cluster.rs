//! The namespace map from the cluster's `TandemCluster` (`spec.bridge.namespaces`), read as
//! plain JSON so the bridge does not depend on the operator's crate (they share only `tandem-kubeclient`).

use kube::api::ApiResource;
use serde::Deserialize;

use crate::policy::NamespacePolicy;

/// The `TandemCluster` API the bridge reads.
pub const GROUP: &str = "tandem.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "TandemCluster";
pub const PLURAL: &str = "tandemclusters";

/// The `TandemCluster` resource, for a dynamic `Api` (the bridge has no typed CRD).
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        plural: PLURAL.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mapping {
    namespace: String,
    account: String,
    #[serde(default)]
    partition: Option<String>,
    #[serde(default)]
    qos: Option<String>,
    #[serde(default)]
    time_limit: Option<String>,
    #[serde(default)]
    allowed_accounts: Vec<String>,
}

/// The policies of a `TandemCluster` object. A mapping that does not parse is an error
/// naming it: the bridge then keeps the policies it had (fail closed, not open).
pub fn policies(cluster: &serde_json::Value) -> Result<Vec<NamespacePolicy>, String> {
    let Some(list) = cluster.pointer("/spec/bridge/namespaces") else {
        return Ok(Vec::new());
    };
    let maps: Vec<Mapping> =
        serde_json::from_value(list.clone()).map_err(|e| format!("spec.bridge.namespaces: {e}"))?;
    maps.into_iter()
        .map(|m| {
            let time_limit = m
                .time_limit
                .as_deref()
                .map(tandem_sched::time::parse_duration)
                .transpose()
                .map_err(|e| format!("spec.bridge.namespaces[{}].timeLimit: {e}", m.namespace))?;
            Ok(NamespacePolicy {
                namespace: m.namespace,
                account: m.account,
                allowed_accounts: m.allowed_accounts,
                partition: m.partition,
                qos: m.qos,
                time_limit,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_namespace_map() {
        let tc = serde_json::json!({"spec": {"bridge": {"namespaces": [
            {"namespace": "serving", "account": "inference", "qos": "serving",
             "timeLimit": "1-0", "allowedAccounts": ["research"]},
            {"namespace": "team-b", "account": "b"},
        ]}}});
        let p = policies(&tc).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].time_limit, Some(Some(86_400)));
        assert_eq!(p[0].allowed_accounts, vec!["research".to_owned()]);
        assert_eq!(p[1].qos, None);
        assert!(
            policies(&serde_json::json!({"spec": {}}))
                .unwrap()
                .is_empty()
        );
        let bad = serde_json::json!({"spec": {"bridge": {"namespaces": [
            {"namespace": "x", "account": "a", "timeLimit": "soon"}]}}});
        assert!(
            policies(&bad)
                .unwrap_err()
                .contains("namespaces[x].timeLimit")
        );
    }
}
