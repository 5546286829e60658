//! Column specifications: `squeue -o "%.18i %.9P %j"`, `squeue -O jobid:10,name`,
//! `sinfo -o "%P %a %D"` and `sacct --format JobID,JobName%30`, parsed into lists of fields
//! with width and alignment. Each field renders from a view ([`super::view`]), the same view
//! the JSON output reads.
//!
//! This file holds the public face only; the parts live in their own files, by
//! responsibility:
//!
//! - `spec.rs`: the two spec grammars (`%[.][#][width]X` and `name[:%][.]width` lists), the
//!   [`Format`] they produce and how a format lays out a header, rule and row;
//! - `squeue.rs`, `sinfo.rs`, `sacct.rs`: each command's field table (letters or names,
//!   headers, default layouts, how a field renders from its row);
//! - `units.rs`: sacct's time and size notation, shared by its fields.

mod sacct;
mod sinfo;
mod spec;
mod squeue;
mod units;

pub use sacct::{AcctField, SACCT_DEFAULT, sacct_format, sacct_helpformat};
pub use sinfo::{
    SINFO_DEFAULT, SINFO_LONG, SINFO_NODES, SINFO_NODES_LONG, SINFO_REASONS, SINFO_SUMMARY,
    SinfoField, SinfoRow, sinfo_format,
};
pub use spec::{
    Field, Format, FormatError, MAX_WIDTH, Piece, RenderCtx, parse_named, parse_percent,
};
pub use squeue::{
    JobField, SQUEUE_DEFAULT, SQUEUE_LONG, SQUEUE_START, squeue_format, squeue_named,
};
pub use units::kib_in_unit;

/// What the field tables' tests share.
#[cfg(test)]
mod testing {
    use crate::format::view::JobView;
    use tandem_proto::v1::{JobInfo, JobState};

    /// Views borrow their record; tests leak it to get one that lives long enough.
    pub(super) fn view(id: u64, state: JobState, reason: &str) -> JobView<'static> {
        JobView::from_job(
            Box::leak(Box::new(JobInfo {
                job_id: id,
                array_task_id: -1,
                name: "a-very-long-job-name".into(),
                user: "alice".into(),
                partition: "batch".into(),
                state: state as i32,
                reason: reason.into(),
                num_nodes: 2,
                nodelist: "node-[1-2]".into(),
                start_time: 100,
                ..JobInfo::default()
            })),
            161,
        )
    }
}
