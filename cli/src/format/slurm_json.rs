//! Slurm 22.05's `--json` shapes, so scripts written against Slurm parse Tandem's answers:
//! `squeue`, `sinfo` and `scontrol show` as the OpenAPI v0.0.38 job, node and partition
//! objects, `sacct` as the accounting (dbv0.0.38) job with nested `state`, `time`,
//! `exit_code` and `steps`. Every document is `{"meta", "errors", <list>}`.
//!
//! Built from the same views as the tables. Fields Tandem has no value for are left out
//! rather than filled with made-up ones; Slurm's "unset" encodings are kept where Tandem has
//! the same notion (times are `0` until they happen, an unlimited time limit is `null`).
//!
//! This file holds the document envelope (`meta`, `errors`) and the encodings the objects
//! share (unset times, minutes, array ids, wait statuses, signal names); the objects live
//! in their own files, one per OpenAPI family: `job.rs` (squeue and scontrol's job),
//! `acct.rs` (sacct's accounting job and steps) and `node.rs` (node and partition).

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::view::{ExitCode, JobView};

mod acct;
mod job;
mod node;

pub use acct::{
    AcctArray, AcctComment, AcctExit, AcctJob, AcctState, AcctStep, AcctTime, AcctTres, Required,
    Signal, StepId, StepNodes, StepNumber, StepTasks, StepTime, StepTres, TresCount, acct_jobs,
};
pub use job::Job;
pub use node::{Node, Partition, sinfo_nodes};

/// The Slurm release whose JSON these shapes follow.
const SLURM_MAJOR: u32 = 22;
const SLURM_MINOR: u32 = 5;
/// The openapi plugin of that release whose objects squeue, sinfo and scontrol print.
pub const PLUGIN_V0038: &str = "openapi/v0.0.38";
/// The accounting one, for sacct.
pub const PLUGIN_DBV0038: &str = "openapi/dbv0.0.38";

/// `meta`: who answered. Tandem says so by name; `Slurm.version` is the release whose
/// output it mimics, so scripts that check it keep working.
#[derive(Debug, Serialize)]
pub struct Meta {
    pub plugin: Plugin,
    #[serde(rename = "Slurm")]
    pub slurm: SlurmRelease,
}

#[derive(Debug, Serialize)]
pub struct Plugin {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct SlurmRelease {
    pub version: Version,
    /// `22.05 (tandem 0.1.0)`: the shape's release and the program that printed it.
    pub release: String,
}

#[derive(Debug, Serialize)]
pub struct Version {
    pub major: u32,
    pub micro: u32,
    pub minor: u32,
}

impl Meta {
    pub fn new(plugin: &'static str) -> Meta {
        let tandem = env!("CARGO_PKG_VERSION");
        Meta {
            plugin: Plugin {
                kind: plugin,
                name: "tandem".to_string(),
            },
            slurm: SlurmRelease {
                version: Version {
                    major: SLURM_MAJOR,
                    micro: 0,
                    minor: SLURM_MINOR,
                },
                release: format!("{SLURM_MAJOR}.{SLURM_MINOR:02} (tandem {tandem})"),
            },
        }
    }
}

/// `{"meta": .., "errors": [], key: items}`, serialized straight from the items: squeue over
/// 100,000 jobs should not build a `serde_json::Value` tree first.
pub struct Document<'a, T> {
    pub plugin: &'static str,
    pub key: &'static str,
    pub items: &'a [T],
}

impl<T: Serialize> Serialize for Document<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        m.serialize_entry("meta", &Meta::new(self.plugin))?;
        // Errors end the command with a one-line message instead; a printed document
        // is always a successful answer.
        m.serialize_entry("errors", &[] as &[String])?;
        m.serialize_entry(self.key, self.items)?;
        m.end()
    }
}

fn unset_zero(t: Option<i64>) -> i64 {
    t.unwrap_or(0)
}

/// Slurm's time limits are minutes; `null` is unlimited.
fn minutes(s: Option<u64>) -> Option<u64> {
    s.map(|s| s.div_ceil(60))
}

/// The array fields of a job record: (array_job_id, array_task_id, array_task_string).
/// A folded pending record carries its indices (`6-99%4`) where a task carries its number.
fn array_of<'v>(v: &'v JobView<'_>) -> (u64, Option<u64>, &'v str) {
    match (v.array_job_id, v.array_task_id.as_deref()) {
        (Some(base), Some(t)) => match t.parse::<u64>() {
            Ok(task) => (base, Some(task), ""),
            Err(_) => (base, None, t),
        },
        (Some(base), None) => (base, None, ""),
        (None, _) => (0, None, ""),
    }
}

/// The C library's description of the signals jobs usually die of (what Slurm prints).
pub(crate) fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "Hangup",
        2 => "Interrupt",
        3 => "Quit",
        4 => "Illegal instruction",
        5 => "Trace/breakpoint trap",
        6 => "Aborted",
        7 => "Bus error",
        8 => "Floating point exception",
        9 => "Killed",
        10 => "User defined signal 1",
        11 => "Segmentation fault",
        12 => "User defined signal 2",
        13 => "Broken pipe",
        14 => "Alarm clock",
        15 => "Terminated",
        24 => "CPU time limit exceeded",
        _ => return None,
    })
}

/// The wait status Slurm keeps for a job: exit code in the high byte, signal in the low.
fn wait_status(e: ExitCode) -> i64 {
    if e.signal > 0 {
        i64::from(e.signal & 0x7f)
    } else {
        i64::from(e.code & 0xff) << 8
    }
}

#[cfg(test)]
mod tests;
