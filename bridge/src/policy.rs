//! Which account, partition, QOS and time limit a pod group gets: the pod's annotations,
//! then its namespace's defaults, then the cluster's.
//!
//! The namespace map comes from the cluster's `TandemCluster` (through the controller):
//! each namespace charges one account by default and may pick only from a list. A pod can
//! never charge an account its namespace was not given; that is what stops one team from
//! spending another team's share.

use thiserror::Error;

use crate::annotations::PodAsks;

/// What one namespace may do and what it gets when a pod does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespacePolicy {
    pub namespace: String,
    /// The account pods charge unless they pick another.
    pub account: String,
    /// Further accounts pods of this namespace may pick with `tandem.dev/account`.
    pub allowed_accounts: Vec<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// Seconds; `Some(None)` = unlimited.
    pub time_limit: Option<Option<u64>>,
}

/// The placeholder job's accounting and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub account: String,
    /// `None`: the cluster's default partition.
    pub partition: Option<String>,
    /// `None`: the default QOS.
    pub qos: Option<String>,
    /// `None`: the partition's default time, as for `sbatch` without `-t`.
    pub time_limit: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PolicyError {
    #[error(
        "namespace {namespace} is not mapped to an account in the TandemCluster (spec.bridge.namespaces)"
    )]
    NamespaceNotMapped { namespace: String },
    #[error(
        "namespace {namespace} may not charge account {account}; it may charge {}",
        allowed.join(", ")
    )]
    AccountNotAllowed {
        namespace: String,
        account: String,
        allowed: Vec<String>,
    },
}

/// Resolves a pod group's settings in `namespace`.
pub fn resolve(
    namespace: &str,
    asks: &PodAsks,
    policies: &[NamespacePolicy],
) -> Result<Resolved, PolicyError> {
    let Some(p) = policies.iter().find(|p| p.namespace == namespace) else {
        return Err(PolicyError::NamespaceNotMapped {
            namespace: namespace.to_owned(),
        });
    };
    let account = match &asks.account {
        None => p.account.clone(),
        Some(a) if *a == p.account || p.allowed_accounts.contains(a) => a.clone(),
        Some(a) => {
            let mut allowed = vec![p.account.clone()];
            allowed.extend(p.allowed_accounts.iter().cloned());
            return Err(PolicyError::AccountNotAllowed {
                namespace: namespace.to_owned(),
                account: a.clone(),
                allowed,
            });
        }
    };
    Ok(Resolved {
        account,
        partition: asks.partition.clone().or_else(|| p.partition.clone()),
        qos: asks.qos.clone().or_else(|| p.qos.clone()),
        time_limit: asks.time_limit.or(p.time_limit).flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies() -> Vec<NamespacePolicy> {
        vec![
            NamespacePolicy {
                namespace: "serving".into(),
                account: "inference".into(),
                allowed_accounts: vec!["research".into()],
                partition: Some("gpu".into()),
                qos: Some("serving".into()),
                time_limit: Some(None),
            },
            NamespacePolicy {
                namespace: "team-b".into(),
                account: "b".into(),
                ..Default::default()
            },
        ]
    }

    #[test]
    fn annotations_win_then_the_namespace_then_the_cluster() {
        let ps = policies();
        let r = resolve("serving", &PodAsks::default(), &ps).unwrap();
        assert_eq!(r.account, "inference");
        assert_eq!(r.partition.as_deref(), Some("gpu"));
        assert_eq!(r.qos.as_deref(), Some("serving"));
        assert_eq!(r.time_limit, None);
        let asks = PodAsks {
            partition: Some("debug".into()),
            qos: Some("low".into()),
            account: Some("research".into()),
            time_limit: Some(Some(600)),
        };
        let r = resolve("serving", &asks, &ps).unwrap();
        assert_eq!(
            (r.account.as_str(), r.partition.as_deref(), r.qos.as_deref()),
            ("research", Some("debug"), Some("low"))
        );
        assert_eq!(r.time_limit, Some(600));
        // Nothing set anywhere: the cluster's defaults (None) apply.
        let r = resolve("team-b", &PodAsks::default(), &ps).unwrap();
        assert_eq!((r.partition, r.qos, r.time_limit), (None, None, None));
    }

    #[test]
    fn another_teams_account_is_refused_with_the_choices() {
        let asks = PodAsks {
            account: Some("b".into()),
            ..Default::default()
        };
        let e = resolve("serving", &asks, &policies()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "namespace serving may not charge account b; it may charge inference, research"
        );
        let e = resolve("elsewhere", &PodAsks::default(), &policies()).unwrap_err();
        assert!(matches!(e, PolicyError::NamespaceNotMapped { .. }), "{e}");
    }
}
