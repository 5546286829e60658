//! The dbv0.0.38 accounting job that `sacct --json` prints: a job with its `state`, `time`,
//! `exit_code`, TRES and nested `steps`, regrouped from sacct's rows.

use serde::Serialize;

use super::{array_of, minutes, signal_name, unset_zero};
use crate::format::view::{AllocTres, ExitCode, JobView};

/// A job as sacct shows it (dbv0.0.38 `job`), with its steps nested.
#[derive(Debug, Serialize)]
pub struct AcctJob<'a> {
    pub account: &'a str,
    /// Nodes the job holds or held; 0 before it starts.
    pub allocation_nodes: u32,
    pub array: AcctArray<'a>,
    pub comment: AcctComment<'a>,
    pub constraints: &'a str,
    /// The highest exit of the job's steps; SUCCESS without steps, as Slurm prints it.
    pub derived_exit_code: AcctExit,
    pub exit_code: AcctExit,
    pub job_id: u64,
    pub name: &'a str,
    /// `None assigned` before it starts, as sacct says.
    pub nodes: &'a str,
    pub partition: &'a str,
    pub priority: u64,
    pub qos: &'a str,
    pub required: Required,
    pub state: AcctState<'a>,
    pub steps: Vec<AcctStep<'a>>,
    pub time: AcctTime,
    pub tres: AcctTres,
    pub user: &'a str,
    pub working_directory: &'a str,
}

#[derive(Debug, Serialize)]
pub struct AcctArray<'a> {
    /// 0 outside arrays.
    pub job_id: u64,
    /// The folded pending indices, `null` otherwise.
    pub task: Option<&'a str>,
    pub task_id: Option<u64>,
}

/// Only the user's comment: Tandem keeps no admin or system comments.
#[derive(Debug, Serialize)]
pub struct AcctComment<'a> {
    pub job: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct Required {
    #[serde(rename = "CPUs")]
    pub cpus: u32,
}

#[derive(Debug, Serialize)]
pub struct AcctState<'a> {
    pub current: &'static str,
    pub reason: &'a str,
}

#[derive(Debug, Serialize)]
pub struct AcctTime {
    pub elapsed: u64,
    pub eligible: i64,
    pub end: i64,
    /// Minutes, `null` = UNLIMITED.
    pub limit: Option<u64>,
    pub start: i64,
    pub submission: i64,
}

/// `{"status": "SUCCESS"|"FAILED"|"SIGNALED", "return_code": n, "signal": {..}}`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct AcctExit {
    pub status: &'static str,
    /// `null` when a signal ended the job.
    pub return_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<Signal>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Signal {
    pub signal_id: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'static str>,
}

impl AcctExit {
    pub fn from_exit(e: ExitCode) -> AcctExit {
        if e.signal > 0 {
            return AcctExit {
                status: "SIGNALED",
                return_code: None,
                signal: Some(Signal {
                    signal_id: e.signal,
                    name: signal_name(e.signal),
                }),
            };
        }
        AcctExit {
            status: if e.code == 0 { "SUCCESS" } else { "FAILED" },
            return_code: Some(e.code),
            signal: None,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AcctTres {
    /// Empty until the job starts.
    pub allocated: Vec<TresCount>,
    pub requested: Vec<TresCount>,
}

/// One TRES of a list. Slurm's database ids are left out: Tandem has no TRES table.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct TresCount {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub name: Option<&'static str>,
    pub count: u64,
}

/// cpu, mem (MB), node, billing (a job's, not a step's) and gres/gpu, in Slurm's TRES order;
/// GPUs only when there are some. (22.05: `{"type": "billing", "count": 12}` after node.)
pub(super) fn tres_list(t: &AllocTres) -> Vec<TresCount> {
    let plain = |kind, count| TresCount {
        kind,
        name: None,
        count,
    };
    let mut v = vec![
        plain("cpu", u64::from(t.cpus)),
        plain("mem", t.mem_mb),
        plain("node", u64::from(t.nodes)),
    ];
    if let Some(b) = t.billing {
        v.push(plain("billing", b));
    }
    if t.gpus > 0 {
        v.push(TresCount {
            kind: "gres",
            name: Some("gpu"),
            count: u64::from(t.gpus),
        });
    }
    v
}

/// A step of a sacct job.
#[derive(Debug, Serialize)]
pub struct AcctStep<'a> {
    pub exit_code: AcctExit,
    pub nodes: StepNodes<'a>,
    pub state: &'static str,
    pub step: StepId<'a>,
    pub tasks: StepTasks,
    pub time: StepTime,
    pub tres: StepTres,
}

#[derive(Debug, Serialize)]
pub struct StepNodes<'a> {
    pub count: u32,
    pub range: &'a str,
}

#[derive(Debug, Serialize)]
pub struct StepId<'a> {
    pub job_id: u64,
    /// `"batch"`, `"extern"`, or a number for srun's steps: Slurm 22.05 prints
    /// `"id": "batch"` and `"id": 0`.
    pub id: StepNumber<'a>,
    pub name: &'a str,
}

/// A step id as Slurm's JSON writes it: a number where it is one.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum StepNumber<'a> {
    Number(u64),
    Name(&'a str),
}

impl<'a> StepNumber<'a> {
    pub fn of(id: &'a str) -> StepNumber<'a> {
        id.parse().map_or(StepNumber::Name(id), StepNumber::Number)
    }
}

#[derive(Debug, Serialize)]
pub struct StepTasks {
    pub count: u32,
}

#[derive(Debug, Serialize)]
pub struct StepTime {
    pub elapsed: u64,
    pub end: i64,
    pub start: i64,
}

#[derive(Debug, Serialize)]
pub struct StepTres {
    pub allocated: Vec<TresCount>,
}

impl<'a> AcctJob<'a> {
    /// `v` is a job row (no step id); its steps come from sacct's following rows.
    pub fn from_view(v: &'a JobView<'_>) -> AcctJob<'a> {
        let (array_job_id, task_id, task) = array_of(v);
        let started = v.start_time.is_some();
        AcctJob {
            account: v.account,
            allocation_nodes: if started { v.nodes } else { 0 },
            array: AcctArray {
                job_id: array_job_id,
                task: (!task.is_empty()).then_some(task),
                task_id,
            },
            comment: AcctComment {
                job: (!v.comment.is_empty()).then_some(v.comment),
            },
            constraints: v.constraint,
            derived_exit_code: AcctExit::from_exit(
                v.derived_exit_code
                    .unwrap_or(ExitCode { code: 0, signal: 0 }),
            ),
            exit_code: AcctExit::from_exit(v.exit_code),
            job_id: v.job_id_raw,
            name: v.name,
            nodes: if v.nodelist.is_empty() {
                "None assigned"
            } else {
                v.nodelist
            },
            partition: v.partition,
            priority: v.priority,
            qos: v.qos,
            required: Required { cpus: v.cpus },
            state: AcctState {
                current: v.state,
                reason: v.reason,
            },
            steps: Vec::new(),
            time: AcctTime {
                elapsed: v.elapsed_s,
                eligible: unset_zero(v.eligible_time),
                end: unset_zero(v.end_time),
                limit: minutes(v.time_limit_s),
                start: unset_zero(v.start_time),
                submission: unset_zero(v.submit_time),
            },
            tres: AcctTres {
                allocated: if started {
                    tres_list(&v.tres)
                } else {
                    Vec::new()
                },
                requested: tres_list(&v.tres),
            },
            user: v.user,
            working_directory: v.workdir,
        }
    }
}

impl<'a> AcctStep<'a> {
    pub fn from_view(v: &'a JobView<'_>, step_id: &'a str) -> AcctStep<'a> {
        AcctStep {
            exit_code: AcctExit::from_exit(v.exit_code),
            nodes: StepNodes {
                count: v.nodes,
                range: v.nodelist,
            },
            state: v.state,
            step: StepId {
                job_id: v.job_id_raw,
                id: StepNumber::of(step_id),
                name: v.name,
            },
            tasks: StepTasks { count: v.tasks },
            time: StepTime {
                elapsed: v.elapsed_s,
                end: unset_zero(v.end_time),
                start: unset_zero(v.start_time),
            },
            tres: StepTres {
                allocated: tres_list(&v.tres),
            },
        }
    }
}

/// sacct's rows (each job followed by its steps) regrouped into jobs with nested steps.
pub fn acct_jobs<'a>(rows: &'a [JobView<'_>]) -> Vec<AcctJob<'a>> {
    let mut jobs: Vec<AcctJob<'a>> = Vec::new();
    for r in rows {
        match (r.step_id, jobs.last_mut()) {
            (Some(id), Some(job)) => job.steps.push(AcctStep::from_view(r, id)),
            // A step without its job cannot be placed; sacct never sends one.
            (Some(_), None) => {}
            (None, _) => jobs.push(AcctJob::from_view(r)),
        }
    }
    jobs
}
