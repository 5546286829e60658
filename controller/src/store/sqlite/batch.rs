//! One group of state changes as the store writes it: [`Batch`], filled by the state actor
//! and written by the committer inside one transaction. Apart from the connection code
//! because it is the store's whole write path: every row the controller writes goes
//! through [`apply`], in the order its fields give.

use rusqlite::{Transaction, params};

use super::{JobRecordRow, StoreError, sql};

/// Everything one group of state changes writes. Applied in field order inside one
/// transaction; several batches in one transaction are applied one after another, so a
/// later batch's removal wins over an earlier batch's upsert.
#[derive(Debug, Default)]
pub struct Batch {
    pub meta: Vec<(String, String)>,
    pub jobs: Vec<(u64, Vec<u8>)>,
    pub payloads: Vec<(u64, Vec<u8>)>,
    pub nodes: Vec<(String, u32, Vec<u8>)>,
    pub steps: Vec<(u64, u32, Vec<u8>)>,
    pub records: Vec<JobRecordRow>,
    pub idempotency: Vec<(String, u64, i64)>,
    pub removed_jobs: Vec<u64>,
    pub removed_payloads: Vec<u64>,
    /// All steps of these jobs.
    pub removed_steps: Vec<u64>,
    /// Idempotency keys created before this time are forgotten.
    pub expire_idempotency_before: Option<i64>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
            && self.jobs.is_empty()
            && self.payloads.is_empty()
            && self.nodes.is_empty()
            && self.steps.is_empty()
            && self.records.is_empty()
            && self.idempotency.is_empty()
            && self.removed_jobs.is_empty()
            && self.removed_payloads.is_empty()
            && self.removed_steps.is_empty()
            && self.expire_idempotency_before.is_none()
    }

    /// Rows written, for logs.
    pub fn rows(&self) -> usize {
        self.meta.len()
            + self.jobs.len()
            + self.payloads.len()
            + self.nodes.len()
            + self.steps.len()
            + self.records.len()
            + self.idempotency.len()
            + self.removed_jobs.len()
            + self.removed_payloads.len()
            + self.removed_steps.len()
    }
}

/// Writes one batch inside `tx`.
pub(super) fn apply(tx: &Transaction<'_>, b: &Batch) -> Result<(), StoreError> {
    if !b.meta.is_empty() {
        let mut st = tx
            .prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")
            .map_err(sql("write meta"))?;
        for (k, v) in &b.meta {
            st.execute(params![k, v]).map_err(sql("write meta"))?;
        }
    }
    if !b.jobs.is_empty() {
        let mut st = tx
            .prepare_cached("INSERT OR REPLACE INTO jobs (id, record) VALUES (?1, ?2)")
            .map_err(sql("write job"))?;
        for (id, rec) in &b.jobs {
            st.execute(params![id, rec]).map_err(sql("write job"))?;
        }
    }
    if !b.payloads.is_empty() {
        let mut st = tx
            .prepare_cached("INSERT OR REPLACE INTO job_payloads (id, payload) VALUES (?1, ?2)")
            .map_err(sql("write payload"))?;
        for (id, p) in &b.payloads {
            st.execute(params![id, p]).map_err(sql("write payload"))?;
        }
    }
    if !b.nodes.is_empty() {
        let mut st = tx
            .prepare_cached("INSERT OR REPLACE INTO nodes (name, idx, record) VALUES (?1, ?2, ?3)")
            .map_err(sql("write node"))?;
        for (name, idx, rec) in &b.nodes {
            st.execute(params![name, idx, rec])
                .map_err(sql("write node"))?;
        }
    }
    if !b.steps.is_empty() {
        let mut st = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO steps (job_id, step_id, record) VALUES (?1, ?2, ?3)",
            )
            .map_err(sql("write step"))?;
        for (job, step, rec) in &b.steps {
            st.execute(params![job, step, rec])
                .map_err(sql("write step"))?;
        }
    }
    if !b.records.is_empty() {
        let mut st = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO job_records (id, run, array_job_id, array_task_id, user, \
                 account, partition, name, state, submit_time, start_time, end_time, record) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )
            .map_err(sql("write job record"))?;
        for r in &b.records {
            st.execute(params![
                r.id,
                r.run,
                r.array_job_id,
                r.array_task_id,
                r.user,
                r.account,
                r.partition,
                r.name,
                r.state,
                r.submit_time,
                r.start_time,
                r.end_time,
                r.record
            ])
            .map_err(sql("write job record"))?;
        }
    }
    if !b.idempotency.is_empty() {
        let mut st = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO idempotency (key, job_id, created) VALUES (?1, ?2, ?3)",
            )
            .map_err(sql("write idempotency key"))?;
        for (k, id, t) in &b.idempotency {
            st.execute(params![k, id, t])
                .map_err(sql("write idempotency key"))?;
        }
    }
    let delete = |q: &str, ids: &[u64], op: &'static str| -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut st = tx.prepare_cached(q).map_err(sql(op))?;
        for id in ids {
            st.execute([id]).map_err(sql(op))?;
        }
        Ok(())
    };
    delete(
        "DELETE FROM jobs WHERE id = ?1",
        &b.removed_jobs,
        "delete job",
    )?;
    delete(
        "DELETE FROM job_payloads WHERE id = ?1",
        &b.removed_payloads,
        "delete payload",
    )?;
    delete(
        "DELETE FROM steps WHERE job_id = ?1",
        &b.removed_steps,
        "delete steps",
    )?;
    if let Some(t) = b.expire_idempotency_before {
        tx.prepare_cached("DELETE FROM idempotency WHERE created < ?1")
            .map_err(sql("expire idempotency keys"))?
            .execute([t])
            .map_err(sql("expire idempotency keys"))?;
    }
    Ok(())
}
