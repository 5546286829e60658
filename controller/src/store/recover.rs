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
//! usage; its shape always follows the stored account and user lists, plus the user
//! associations created on first use (a submit without association enforcement), which no
//! list names and the tree alone records.

use std::collections::{HashMap, HashSet};

use tandem_sched::config::ClusterConfig;
use tandem_sched::fairshare::{AssocKind, AssocTree};
use tandem_sched::state::{RestoreError, RestoreInput};
use tandem_sched::{Job, JobId, Node, State};

use super::sqlite::Loaded;
use crate::steps::StepRec;

/// Meta keys of the accounting state: written by [`accounting_meta`], read by [`recover`].
const CLUSTER_CONFIG: &str = "cluster_config";
const ASSOC_TREE: &str = "assoc_tree";
const USAGE_CHARGED_AT: &str = "usage_charged_at";

/// The meta rows that store `st`'s accounting state: its QOS, account and user lists if
/// `config` changed, its association tree (usage, and the associations created on first
/// use, which no list names) if `assoc` changed. The actor puts them in the batch of the
/// change, so the job whose submit created an association commits with it.
pub fn accounting_meta(st: &State, config: bool, assoc: bool) -> Vec<(String, String)> {
    let mut meta = Vec::new();
    let mut put = |key: &str, value: Result<String, serde_json::Error>| match value {
        Ok(v) => meta.push((key.to_owned(), v)),
        Err(e) => tracing::error!(key, error = %e, "cannot encode accounting state"),
    };
    if config {
        put(CLUSTER_CONFIG, serde_json::to_string(st.config()));
    }
    if assoc {
        put(ASSOC_TREE, serde_json::to_string(st.assoc()));
        if let Some(t) = st.usage_charged_at() {
            put(USAGE_CHARGED_AT, Ok(t.to_string()));
        }
    }
    meta
}

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

/// A tree stored before associations created on first use were marked as such holds them
/// unmarked, and a restart would drop them (issue 29). Where the store holds the lists,
/// the lists and the tree are always written in one batch, so a user association the
/// lists do not name can only have been created on first use: marked here.
fn mark_unlisted_users_auto(tree: &mut AssocTree, config: &ClusterConfig) {
    let listed: HashSet<(&str, &str)> = config
        .users
        .iter()
        .map(|u| (u.user.as_str(), u.account.as_str()))
        .collect();
    let unlisted: Vec<_> = tree
        .walk()
        .into_iter()
        .filter(|(i, _)| {
            tree.kind(*i) == AssocKind::User && {
                let account = tree.parent(*i).map_or("", |p| tree.name(p));
                !listed.contains(&(tree.name(*i), account))
            }
        })
        .map(|(i, _)| i)
        .collect();
    for idx in unlisted {
        tree.mark_auto(idx);
    }
}

/// Rebuilds everything from what [`super::Store::load`] read.
pub fn recover(loaded: Loaded, mut config: ClusterConfig) -> Result<Recovered, RecoverError> {
    let meta = &loaded.meta;
    let seeded = meta.contains_key(CLUSTER_CONFIG);
    if let Some(text) = meta.get(CLUSTER_CONFIG) {
        let stored: ClusterConfig = decode("config", || CLUSTER_CONFIG.into(), text.as_bytes())?;
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
    let assoc: Option<AssocTree> = match meta.get(ASSOC_TREE) {
        Some(t) => {
            let mut tree: AssocTree = decode("account tree", || ASSOC_TREE.into(), t.as_bytes())?;
            if seeded {
                mark_unlisted_users_auto(&mut tree, &config);
            }
            Some(tree)
        }
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
    let usage_charged_at = int(USAGE_CHARGED_AT)?;
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

#[cfg(test)]
mod tests {
    use tandem_sched::JobSpec;
    use tandem_sched::account::AccountConfig;

    use super::*;
    use crate::store::{Batch, Store};

    /// What the actor's flush writes for these jobs: their records, the node records and
    /// the accounting meta.
    fn batch(st: &State, jobs: &[JobId]) -> Batch {
        Batch {
            meta: accounting_meta(st, true, true),
            jobs: jobs
                .iter()
                .map(|id| (id.0, serde_json::to_vec(st.job(*id).unwrap()).unwrap()))
                .collect(),
            nodes: st
                .nodes()
                .map(|n| (n.name.clone(), n.id.0, serde_json::to_vec(n).unwrap()))
                .collect(),
            ..Batch::default()
        }
    }

    /// `(account/user, shares, own usage, created on first use)` in sshare's order.
    fn tree(st: &State) -> Vec<(String, u32, f64, bool)> {
        let t = st.assoc();
        t.walk()
            .into_iter()
            .map(|(i, _)| {
                let parent = t.parent(i).map_or("", |p| t.name(p));
                (
                    format!("{parent}/{}", t.name(i)),
                    t.shares(i),
                    t.own_usage(i),
                    t.is_auto(i),
                )
            })
            .collect()
    }

    /// Issue 29: the association a submit creates on first use is committed with the job
    /// and comes back from the store, with the usage charged to it since, though the
    /// lists (and the config file) name no user.
    #[test]
    fn associations_created_on_first_use_come_back_with_their_usage() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = State::test_cluster(1, 4, 8_000, 0);
        st.add_account(AccountConfig::new("serving", 5)).unwrap();
        let file_config = st.config().clone();
        let mut store = Store::open(dir.path()).unwrap();
        store.commit(&[&batch(&st, &[])]).unwrap();
        st.take_changes();

        let job = st
            .submit(JobSpec::test().user("zed").account("serving"), 0)
            .unwrap();
        let changes = st.take_changes();
        assert!(changes.assoc && !changes.config, "{changes:?}");
        store.commit(&[&batch(&st, &[job])]).unwrap();
        // Runs for a minute: usage charged to the new association.
        st.charge_usage(1);
        st.schedule(1);
        st.charge_usage(61);
        let zed = st.assoc().user("zed", "serving").unwrap();
        assert!(st.assoc().own_usage(zed) > 0.0);
        store.commit(&[&batch(&st, &[job])]).unwrap();
        let want = tree(&st);
        drop(store);

        let store = Store::open(dir.path()).unwrap();
        let back = recover(store.load().unwrap(), file_config).unwrap().state;
        assert_eq!(tree(&back), want);
        assert!(
            want.iter()
                .any(|(name, _, usage, auto)| name == "serving/zed" && *usage > 0.0 && *auto),
            "{want:?}"
        );
        assert_eq!(back.usage_charged_at(), Some(61));
    }

    /// A tree stored before first-use associations were marked (issue 29) holds them
    /// unmarked; the lists stored beside it tell them apart, so the first restart after
    /// the upgrade keeps them too.
    #[test]
    fn unmarked_first_use_associations_of_an_older_store_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut st = State::test_cluster(1, 4, 8_000, 0);
        st.add_account(AccountConfig::new("serving", 5)).unwrap();
        let file_config = st.config().clone();
        let job = st
            .submit(JobSpec::test().user("zed").account("serving"), 0)
            .unwrap();
        st.charge_usage(1);
        st.schedule(1);
        st.charge_usage(31);
        let mut old = batch(&st, &[job]);
        for (key, value) in &mut old.meta {
            if key == ASSOC_TREE {
                assert!(value.contains(r#","auto":true"#), "{value}");
                *value = value.replace(r#","auto":true"#, "");
            }
        }
        Store::open(dir.path()).unwrap().commit(&[&old]).unwrap();

        let store = Store::open(dir.path()).unwrap();
        let back = recover(store.load().unwrap(), file_config).unwrap().state;
        assert_eq!(tree(&back), tree(&st));
    }
}
