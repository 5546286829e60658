//! How the query commands print: one [`Output`] trait, a human implementation (Slurm's
//! fixed-width columns and `key=value` blocks) and a JSON one.
//!
//! # Layout
//!
//! - `view.rs`: display models derived once from the wire types (state names, ids, times).
//! - `columns.rs`: `-o`/`-O`/`--format` parsing and the fields each command knows.
//! - `table.rs`: padding and cutting cells.
//! - `detail.rs`: `scontrol show` key=value blocks.
//! - `slurm_json.rs`: `--json` in Slurm 22.05's shapes.
//! - `task_exits.rs`: srun's lines for tasks that failed.
//!
//! Both implementations read the same views, so `--json` and `-o` cannot drift apart.

pub mod columns;
pub mod detail;
pub mod slurm_json;
pub mod table;
pub mod task_exits;
pub mod view;

use std::io::Write;

use columns::{
    AcctField, Format, FormatError, JobField, RenderCtx, SACCT_DEFAULT, SQUEUE_DEFAULT, SinfoRow,
};
use tandem_proto::v1::JobInfo;
use view::{JobView, NodeView, PartitionView};

/// Prints the answer of a query command.
pub trait Output {
    /// squeue.
    fn jobs(&self, jobs: &[JobView]) -> Result<String, FormatError>;
    /// squeue over wire records, written to `out` as they are rendered.
    fn write_jobs(&self, jobs: &[&JobInfo], now: i64, out: &mut dyn Write) -> anyhow::Result<()> {
        let views: Vec<JobView> = jobs.iter().map(|j| JobView::from_job(j, now)).collect();
        out.write_all(self.jobs(&views)?.as_bytes())?;
        Ok(())
    }
    /// sacct: jobs and their steps.
    fn records(&self, rows: &[JobView]) -> Result<String, FormatError>;
    /// sinfo: one row per partition and node group.
    fn sinfo(&self, rows: &[SinfoRow]) -> Result<String, FormatError>;
    /// scontrol show job.
    fn job_details(&self, jobs: &[JobView]) -> String;
    /// scontrol show node.
    fn node_details(&self, nodes: &[NodeView]) -> String;
    /// scontrol show partition.
    fn partition_details(&self, parts: &[PartitionView]) -> String;
}

/// A user's column choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Columns {
    /// `%.18i %j` style (squeue -o, sinfo -o).
    Percent(String),
    /// `jobid:10,name` (squeue -O) or `JobID,JobName%20` (sacct --format).
    Named(String),
}

/// Slurm's tables.
#[derive(Debug, Clone)]
pub struct Human {
    /// `None`: the command's default columns.
    pub columns: Option<Columns>,
    pub header: bool,
    /// `sacct -P`/`-p`: fields joined by `|` instead of padded (`true` = trailing `|` too).
    pub delimited: Option<bool>,
    pub ctx: RenderCtx,
}

impl Human {
    pub fn new(columns: Option<Columns>, header: bool) -> Human {
        Human {
            columns,
            header,
            delimited: None,
            ctx: RenderCtx {
                utc_offset_s: crate::clock::local_utc_offset(),
                ..RenderCtx::default()
            },
        }
    }

    fn table<R, F: columns::Field<R>>(&self, f: &Format<F>, rows: &[R], rule: bool) -> String {
        let mut out = String::new();
        if let Some(trailing) = self.delimited {
            let end = if trailing { "|" } else { "" };
            if self.header {
                out.push_str(&f.delimited::<R>(None, &self.ctx, "|"));
                out.push_str(end);
                out.push('\n');
            }
            for r in rows {
                out.push_str(&f.delimited(Some(r), &self.ctx, "|"));
                out.push_str(end);
                out.push('\n');
            }
            return out;
        }
        // Rows are mostly shorter than this; one allocation up front instead of a dozen
        // regrowths of a multi-megabyte buffer.
        out.reserve(rows.len() * 80);
        if self.header {
            out.push_str(&f.header::<R>());
            out.push('\n');
            if rule {
                out.push_str(&f.rule::<R>());
                out.push('\n');
            }
        }
        for r in rows {
            f.row_into(&mut out, r, &self.ctx);
            out.push('\n');
        }
        out
    }

    /// The `squeue` columns this output prints.
    pub fn job_format(&self) -> Result<Format<JobField>, FormatError> {
        match &self.columns {
            None => columns::squeue_format(SQUEUE_DEFAULT),
            Some(Columns::Percent(s)) => columns::squeue_format(s),
            Some(Columns::Named(s)) => columns::squeue_named(s),
        }
    }

    fn acct_format(&self) -> Result<Format<AcctField>, FormatError> {
        match &self.columns {
            Some(Columns::Named(s)) | Some(Columns::Percent(s)) => columns::sacct_format(s),
            None => columns::sacct_format(SACCT_DEFAULT),
        }
    }
}

/// Rows rendered between two writes by [`Human::write_jobs`].
const ROWS_PER_WRITE: usize = 1024;

impl Output for Human {
    fn jobs(&self, jobs: &[JobView]) -> Result<String, FormatError> {
        Ok(self.table(&self.job_format()?, jobs, false))
    }

    /// One view and one output line at a time: 100,000 jobs never hold 100,000 views (over
    /// 40 MB) nor their whole text at once, and the first lines leave before the last are made.
    fn write_jobs(&self, jobs: &[&JobInfo], now: i64, out: &mut dyn Write) -> anyhow::Result<()> {
        let f = self.job_format()?;
        if self.delimited.is_some() {
            let views: Vec<JobView> = jobs.iter().map(|j| JobView::from_job(j, now)).collect();
            out.write_all(self.table(&f, &views, false).as_bytes())?;
            return Ok(());
        }
        let mut text = String::with_capacity(ROWS_PER_WRITE * 100);
        if self.header {
            text.push_str(&f.header::<JobView>());
            text.push('\n');
        }
        for chunk in jobs.chunks(ROWS_PER_WRITE) {
            for j in chunk {
                f.row_into(&mut text, &JobView::from_job(j, now), &self.ctx);
                text.push('\n');
            }
            out.write_all(text.as_bytes())?;
            text.clear();
        }
        out.write_all(text.as_bytes())?;
        Ok(())
    }

    fn records(&self, rows: &[JobView]) -> Result<String, FormatError> {
        Ok(self.table(&self.acct_format()?, rows, true))
    }

    fn sinfo(&self, rows: &[SinfoRow]) -> Result<String, FormatError> {
        let spec = match &self.columns {
            Some(Columns::Percent(s)) | Some(Columns::Named(s)) => s.as_str(),
            None => columns::SINFO_DEFAULT,
        };
        Ok(self.table(&columns::sinfo_format(spec)?, rows, false))
    }

    fn job_details(&self, jobs: &[JobView]) -> String {
        detail::jobs(jobs, &self.ctx)
    }

    fn node_details(&self, nodes: &[NodeView]) -> String {
        detail::nodes(nodes, &self.ctx)
    }

    fn partition_details(&self, parts: &[PartitionView]) -> String {
        detail::partitions(parts)
    }
}

/// Machine-readable output: Slurm 22.05's `--json` documents ([`slurm_json`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

fn json<T: serde::Serialize>(plugin: &'static str, key: &'static str, items: &[T]) -> String {
    let doc = slurm_json::Document { plugin, key, items };
    // Serializing these plain structs into a string cannot fail.
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".to_string());
    s.push('\n');
    s
}

fn squeue_jobs<'v>(jobs: &'v [JobView<'_>]) -> Vec<slurm_json::Job<'v>> {
    jobs.iter().map(slurm_json::Job::from_view).collect()
}

impl Output for Json {
    fn jobs(&self, jobs: &[JobView]) -> Result<String, FormatError> {
        Ok(json(slurm_json::PLUGIN_V0038, "jobs", &squeue_jobs(jobs)))
    }

    fn records(&self, rows: &[JobView]) -> Result<String, FormatError> {
        Ok(json(
            slurm_json::PLUGIN_DBV0038,
            "jobs",
            &slurm_json::acct_jobs(rows),
        ))
    }

    /// Slurm 22.05's `sinfo --json` lists nodes, not sinfo's grouped rows.
    fn sinfo(&self, rows: &[SinfoRow]) -> Result<String, FormatError> {
        Ok(json(
            slurm_json::PLUGIN_V0038,
            "nodes",
            &slurm_json::sinfo_nodes(rows),
        ))
    }

    fn job_details(&self, jobs: &[JobView]) -> String {
        json(slurm_json::PLUGIN_V0038, "jobs", &squeue_jobs(jobs))
    }

    fn node_details(&self, nodes: &[NodeView]) -> String {
        let nodes: Vec<slurm_json::Node> = nodes.iter().map(slurm_json::Node::from_view).collect();
        json(slurm_json::PLUGIN_V0038, "nodes", &nodes)
    }

    fn partition_details(&self, parts: &[PartitionView]) -> String {
        let parts: Vec<slurm_json::Partition> =
            parts.iter().map(slurm_json::Partition::from_view).collect();
        json(slurm_json::PLUGIN_V0038, "partitions", &parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_proto::v1::{JobInfo, JobState};

    #[test]
    fn human_and_json_show_the_same_values() {
        let info = JobInfo {
            job_id: 5,
            array_job_id: 5,
            array_pending: "3-9".into(),
            name: "sweep".into(),
            state: JobState::Pending as i32,
            reason: "Priority".into(),
            ..JobInfo::default()
        };
        let j = JobView::from_job(&info, 0);
        let human = Human::new(Some(Columns::Percent("%i %T %r".into())), false);
        assert_eq!(
            human.jobs(std::slice::from_ref(&j)).unwrap(),
            "5_[3-9] PENDING Priority\n"
        );
        let v: serde_json::Value = serde_json::from_str(&Json.jobs(&[j]).unwrap()).unwrap();
        let job = &v["jobs"][0];
        assert_eq!(
            (
                &job["job_id"],
                &job["array_task_string"],
                &job["job_state"],
                &job["state_reason"]
            ),
            (
                &serde_json::json!(5),
                &serde_json::json!("3-9"),
                &serde_json::json!("PENDING"),
                &serde_json::json!("Priority")
            )
        );
    }

    #[test]
    fn parsable_output() {
        let info = JobInfo {
            job_id: 5,
            array_task_id: -1,
            name: "x".into(),
            state: JobState::Completed as i32,
            ..JobInfo::default()
        };
        let j = JobView::from_job(&info, 0);
        let mut h = Human::new(Some(Columns::Named("JobID,State,ExitCode".into())), true);
        h.delimited = Some(false);
        assert_eq!(
            h.records(std::slice::from_ref(&j)).unwrap(),
            "JobID|State|ExitCode\n5|COMPLETED|0:0\n"
        );
        h.delimited = Some(true);
        h.header = false;
        assert_eq!(h.records(&[j]).unwrap(), "5|COMPLETED|0:0|\n");
    }
}
