//! Rebuilds the scheduling core's `State` (and the controller's side tables) from the store
//! on start.
//!
//! Running jobs stay RUNNING: their nodes come back UNKNOWN and are reconciled when their
//! workers register (`State::register_node`), or go DOWN with their jobs NODE_FAIL/requeued
//! when a worker stays away longer than the node timeout.
//!
//! Configuration: partitions and scheduling parameters always come from this start's
//! config file (like slurm.conf); QOS, accounts and users come from the store when it has
//! them, because `sacctmgr`-style changes made at run time live there (like slurmdbd).
//! The config file seeds an empty store: the first start persists its QOS, accounts and
//! users at once, and from then on the store is authoritative (a later edit of those
//! sections is logged and ignored; change them with `sacctmgr`). The stored tree supplies
//! usage; its shape always follows the stored account and user lists.

use std::collections::HashMap;

use tandem_sched::config::ClusterConfig;
use tandem_sched::fairshare::AssocTree;
use tandem_sched::state::{RestoreError, RestoreInput};
use tandem_sched::{Job, JobId, Node, State};

use super::sqlite::Loaded;
use crate::steps::StepRec;

#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("stored {what} {key} cannot be decoded")]
    Decode {
        what: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("stored state is inconsistent")]
    Restore(#[from] RestoreError),
    #[error("stored meta value {key} is malformed: {value:?}")]
    Meta { key: &'static str, value: String },
}

/// The state actor's starting point.
#[derive(Debug)]
pub struct Recovered {
    pub state: State,
    pub idempotency: HashMap<String, (JobId, i64)>,
    pub steps: HashMap<JobId, Vec<StepRec>>,
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    key: impl Fn() -> String,
    bytes: &[u8],
) -> Result<T, RecoverError> {
    serde_json::from_slice(bytes).map_err(|source| RecoverError::Decode {
        what,
        key: key(),
        source,
    })
}

/// Rebuilds everything from what [`super::Store::load`] read.
pub fn recover(loaded: Loaded, mut config: ClusterConfig) -> Result<Recovered, RecoverError> {
    let meta = &loaded.meta;
    let seeded = meta.contains_key("cluster_config");
    if let Some(text) = meta.get("cluster_config") {
        let stored: ClusterConfig = decode("config", || "cluster_config".into(), text.as_bytes())?;
        if (&config.qos, &config.accounts, &config.users)
            != (&stored.qos, &stored.accounts, &stored.users)
        {
            tracing::warn!(
                "the config file's QOS, accounts or users differ from the store's; the store's \
                 (changed with sacctmgr) are used"
            );
        }
        config.qos = stored.qos;
        config.accounts = stored.accounts;
        config.users = stored.users;
    }
    let assoc: Option<AssocTree> = match meta.get("assoc_tree") {
        Some(t) => Some(decode(
            "account tree",
            || "assoc_tree".into(),
            t.as_bytes(),
        )?),
        None => None,
    };
    let int = |key: &'static str| -> Result<Option<i64>, RecoverError> {
        meta.get(key)
            .map(|v| {
                v.parse::<i64>().map_err(|_| RecoverError::Meta {
                    key,
                    value: v.clone(),
                })
            })
            .transpose()
    };
    let next_job_id = int("next_job_id")?.unwrap_or(1).max(1) as u64;
    let usage_charged_at = int("usage_charged_at")?;
    let mut jobs = Vec::with_capacity(loaded.jobs.len());
    for (i, bytes) in loaded.jobs.iter().enumerate() {
        jobs.push(decode::<Job>("job", || format!("row {i}"), bytes)?);
    }
    let mut nodes = Vec::with_capacity(loaded.nodes.len());
    for (name, bytes) in &loaded.nodes {
        nodes.push(decode::<Node>("node", || name.clone(), bytes)?);
    }
    let mut state = State::restore(RestoreInput {
        config,
        jobs,
        nodes,
        next_job_id,
        assoc,
        usage_charged_at,
    })?;
    if !seeded {
        // First start on this store: persist the config file's accounts, users and QOS now.
        state.mark_accounting_changed();
    }
    let mut steps: HashMap<JobId, Vec<StepRec>> = HashMap::new();
    for (job, step, bytes) in &loaded.steps {
        let rec: StepRec = decode("step", || format!("{job}.{step}"), bytes)?;
        steps.entry(JobId(*job)).or_default().push(rec);
    }
    let idempotency = loaded
        .idempotency
        .into_iter()
        .map(|(k, id, t)| (k, (JobId(id), t)))
        .collect();
    Ok(Recovered {
        state,
        idempotency,
        steps,
    })
}
