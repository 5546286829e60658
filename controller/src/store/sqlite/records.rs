//! Finished runs of jobs (`sacct`): the row the store keeps for each run and the query over
//! them. Apart from the active tables because this is the one table that only grows and is
//! read by filters, where the active ones are loaded once at start.

use rusqlite::params_from_iter;

use super::{Store, StoreError, sql};

/// A finished run of a job, with the columns `sacct` filters on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRecordRow {
    pub id: u64,
    pub run: u32,
    pub array_job_id: Option<u64>,
    pub array_task_id: Option<u32>,
    pub user: String,
    pub account: String,
    pub partition: String,
    pub name: String,
    pub state: String,
    pub submit_time: i64,
    pub start_time: Option<i64>,
    pub end_time: i64,
    /// prost-encoded `tandem.v1.JobInfo` with its steps.
    pub record: Vec<u8>,
}
/// `sacct` filters over finished runs. Empty lists match everything.
#[derive(Debug, Default, Clone)]
pub struct RecordFilter {
    /// Matches a job id or an array's job id (`sacct -j 12` shows all tasks of array 12).
    pub ids: Vec<u64>,
    /// Array tasks by array job id and indices (`sacct -j 12_3` shows task 3 of array 12
    /// only). A run matches when it matches `ids` or `tasks`.
    pub tasks: Vec<(u64, tandem_sched::array::IndexSet)>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub partitions: Vec<String>,
    pub states: Vec<String>,
    pub names: Vec<String>,
    /// Runs that ended at or after this time.
    pub ended_after: Option<i64>,
    /// Runs that started (or were submitted) at or before this time.
    pub started_before: Option<i64>,
    pub limit: Option<u32>,
}

impl Store {
    /// Finished runs matching `filter`, oldest end first.
    pub fn query_records(&self, f: &RecordFilter) -> Result<Vec<JobRecordRow>, StoreError> {
        let mut where_: Vec<String> = Vec::new();
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        // Job ids and array tasks name runs together: a run named by either matches.
        let mut named: Vec<String> = Vec::new();
        if !f.ids.is_empty() {
            let marks = vec!["?"; f.ids.len()].join(",");
            named.push(format!("id IN ({marks}) OR array_job_id IN ({marks})"));
            for _ in 0..2 {
                args.extend(
                    f.ids
                        .iter()
                        .map(|i| rusqlite::types::Value::Integer(*i as i64)),
                );
            }
        }
        // One arithmetic run of indices per term, so `12_[0-99999]` is one term, not
        // 100,000. The numbers are integers written by us, not text from the caller, so
        // they go in literally: a long index list cannot exceed SQLite's bound on
        // parameters.
        for (job, set) in &f.tasks {
            let job = *job as i64;
            for r in set.runs() {
                named.push(format!(
                    "(array_job_id = {job} AND array_task_id BETWEEN {} AND {} \
                     AND (array_task_id - {}) % {} = 0)",
                    r.start,
                    r.end,
                    r.start,
                    r.step.max(1)
                ));
            }
        }
        if !named.is_empty() {
            where_.push(format!("({})", named.join(" OR ")));
        }
        for (col, values) in [
            ("user", &f.users),
            ("account", &f.accounts),
            ("partition", &f.partitions),
            ("state", &f.states),
            ("name", &f.names),
        ] {
            if values.is_empty() {
                continue;
            }
            let marks = vec!["?"; values.len()].join(",");
            where_.push(format!("{col} IN ({marks})"));
            args.extend(
                values
                    .iter()
                    .map(|v| rusqlite::types::Value::Text(v.clone())),
            );
        }
        if let Some(t) = f.ended_after {
            where_.push("end_time >= ?".into());
            args.push(t.into());
        }
        if let Some(t) = f.started_before {
            where_.push("COALESCE(start_time, submit_time) <= ?".into());
            args.push(t.into());
        }
        let mut q = String::from(
            "SELECT id, run, array_job_id, array_task_id, user, account, partition, name, \
             state, submit_time, start_time, end_time, record FROM job_records",
        );
        if !where_.is_empty() {
            q.push_str(" WHERE ");
            q.push_str(&where_.join(" AND "));
        }
        q.push_str(" ORDER BY end_time, seq");
        if let Some(l) = f.limit {
            q.push_str(&format!(" LIMIT {l}"));
        }
        let mut st = self.conn.prepare(&q).map_err(sql("query job records"))?;
        let rows = st
            .query_map(params_from_iter(args), |r| {
                Ok(JobRecordRow {
                    id: r.get(0)?,
                    run: r.get(1)?,
                    array_job_id: r.get(2)?,
                    array_task_id: r.get(3)?,
                    user: r.get(4)?,
                    account: r.get(5)?,
                    partition: r.get(6)?,
                    name: r.get(7)?,
                    state: r.get(8)?,
                    submit_time: r.get(9)?,
                    start_time: r.get(10)?,
                    end_time: r.get(11)?,
                    record: r.get(12)?,
                })
            })
            .map_err(sql("query job records"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sql("query job records"))
    }
}
