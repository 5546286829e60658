//! Accounts and user associations as configured, with their limits.
//!
//! The tree itself (shares, usage, Fair Tree ranking) lives in `fairshare::AssocTree`; this
//! module holds what the tree does not: limits, and which account a user charges by default.

use serde::{Deserialize, Serialize};

/// An account (`sacctmgr add account NAME parent=P fairshare=S`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccountConfig {
    pub name: String,
    /// `None` = under `root`.
    pub parent: Option<String>,
    pub shares: u32,
    pub limits: AssocLimits,
    /// `Description=`; empty shows as the account's name, as Slurm defaults it.
    #[serde(default)]
    pub description: String,
    /// `Organization=`; empty shows as the account's name.
    #[serde(default)]
    pub organization: String,
}

/// A user's association with an account.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserConfig {
    pub user: String,
    pub account: String,
    pub shares: u32,
    /// The account jobs of this user charge when they name none.
    pub default: bool,
}

/// Group limits of an account (over its whole subtree's running jobs). `None` = no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssocLimits {
    /// `GrpTRES=gres/gpu=N` -> pending reason `AssocGrpGRES`.
    pub grp_gpus: Option<u32>,
    /// `GrpJobs` -> `AssocGrpJobsLimit`.
    pub grp_jobs: Option<u32>,
    /// `MaxJobs` per user in this account -> `AssocMaxJobsLimit`.
    pub max_jobs_per_user: Option<u32>,
}

impl AccountConfig {
    pub fn new(name: impl Into<String>, shares: u32) -> AccountConfig {
        AccountConfig {
            name: name.into(),
            parent: None,
            shares,
            limits: AssocLimits::default(),
            description: String::new(),
            organization: String::new(),
        }
    }
}
