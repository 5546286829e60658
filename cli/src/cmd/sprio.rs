//! `sprio`: the parts of each pending job's multifactor priority, as Slurm prints them.
//!
//! Weighted columns are the factor times its `PriorityWeight*`, rounded for display; the
//! unrounded sum minus nice, truncated, is PRIORITY (`--json` carries the exact values).
//! As in Slurm, a factor whose weight is 0 gets no column, and TRES lists only the TRES
//! with a weight. Held jobs are not listed (their priority is 0).

use anyhow::Context as _;
use clap::Parser;
use serde_json::json;
use tandem_proto::v1;

use super::acct_table::{Column, Layout, render_trimmed};
use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::table::Align;

/// Show the factors of pending jobs' scheduling priorities.
#[derive(Debug, Parser)]
#[command(name = "sprio", version, disable_help_flag = true)]
pub struct Args {
    /// Print help (-h is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Only these jobs (comma separated: -j12,13).
    #[arg(short = 'j', long = "jobs", value_name = "JOBS", action = clap::ArgAction::Set)]
    pub jobs: Vec<String>,
    /// Only jobs of these users (comma separated).
    #[arg(short = 'u', long = "user", value_name = "USERS", action = clap::ArgAction::Set)]
    pub users: Vec<String>,
    /// Also USER's account, QOS name and NICE.
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// The factors before weighting (each in [0, 1]).
    #[arg(short = 'n', long = "norm")]
    pub norm: bool,
    /// Print the configured weights only.
    #[arg(short = 'w', long = "weights")]
    pub weights: bool,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: Args) -> Exit {
    let (jobs, tasks) = job_filter(&super::split_commas(&args.jobs))?;
    let asked_for_jobs = !jobs.is_empty() || !tasks.is_empty();
    let users = super::split_commas(&args.users);
    let mut client = Client::connect().await?;
    let resp = client
        .accounting
        .list_priorities(v1::ListPrioritiesRequest { jobs, users, tasks })
        .await
        .rpc()?;
    let text = if args.json {
        let mut s = serde_json::to_string_pretty(&to_json(&resp))?;
        s.push('\n');
        s
    } else if asked_for_jobs && resp.rows.is_empty() {
        // Slurm's words, on stdout and with status 0, header or not; only for `-j` (a
        // `-u` that matches nothing prints the header alone, as here).
        "Unable to find jobs matching user/id(s) specified\n".to_owned()
    } else {
        let view = View {
            long: args.long,
            norm: args.norm,
            weights_only: args.weights,
        };
        table(&resp, view, !args.noheader)
    };
    crate::emit(&text)?;
    Ok(0)
}

/// `-j` entries: `12` (a job, or a whole array) or `12_3` (one array task).
fn job_filter(items: &[String]) -> anyhow::Result<(Vec<u64>, Vec<v1::ArrayTaskRef>)> {
    let mut jobs = Vec::new();
    let mut tasks = Vec::new();
    for j in items {
        let bad = || format!("Invalid job id: {j:?} (expected JOBID or ARRAYID_TASK)");
        match j.split_once('_') {
            None => jobs.push(j.parse::<u64>().with_context(bad)?),
            Some((array, task)) => tasks.push(v1::ArrayTaskRef {
                array_job_id: array.parse::<u64>().with_context(bad)?,
                task_id: task.parse::<u32>().with_context(bad)?,
            }),
        }
    }
    Ok((jobs, tasks))
}

/// Which table to print.
#[derive(Debug, Clone, Copy, Default)]
pub struct View {
    pub long: bool,
    pub norm: bool,
    pub weights_only: bool,
}

/// A factor column: header, weight, value out of a factor set.
struct Factor {
    name: &'static str,
    weight: u32,
    get: fn(&v1::PriorityFactors) -> f64,
}

impl Factor {
    fn new(name: &'static str, weight: u32, get: fn(&v1::PriorityFactors) -> f64) -> Self {
        Self { name, weight, get }
    }
}

fn factors(w: &v1::PriorityWeights) -> Vec<Factor> {
    vec![
        Factor::new("AGE", w.age, |f| f.age),
        Factor::new("FAIRSHARE", w.fairshare, |f| f.fairshare),
        Factor::new("JOBSIZE", w.job_size, |f| f.job_size),
        Factor::new("PARTITION", w.partition, |f| f.partition),
        Factor::new("QOS", w.qos, |f| f.qos),
    ]
}

/// `cpu=..,mem=..,gres/gpu=..` over the TRES with a weight.
fn tres_cell(w: &v1::PriorityWeights, f: Option<&v1::PriorityFactors>, norm: bool) -> String {
    let items = [
        ("cpu", w.tres_cpu, f.map_or(0.0, |f| f.tres_cpu)),
        ("mem", w.tres_mem, f.map_or(0.0, |f| f.tres_mem)),
        ("gres/gpu", w.tres_gpu, f.map_or(0.0, |f| f.tres_gpu)),
    ];
    items
        .iter()
        .filter(|(_, weight, _)| *weight > 0)
        .map(|(n, weight, v)| match (f, norm) {
            (None, _) => format!("{n}={weight}"),
            (Some(_), true) => format!("{n}={v:.2}"),
            (Some(_), false) => format!("{n}={v:.0}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Slurm's sprio table (or, with `weights_only`, its weights line).
pub fn table(resp: &v1::ListPrioritiesResponse, view: View, header: bool) -> String {
    let w = resp.weights.unwrap_or_default();
    let shown: Vec<Factor> = factors(&w).into_iter().filter(|f| f.weight > 0).collect();
    let has_tres = w.tres_cpu > 0 || w.tres_mem > 0 || w.tres_gpu > 0;
    let col = |n: &str, width: usize, a: Align| -> Column { (n.to_owned(), width, a) };
    let mut cols = vec![
        col("JOBID", 15, Align::Right),
        col("PARTITION", 9, Align::Left),
    ];
    cols.push(col("USER", 8, Align::Right));
    if view.long {
        cols.push(col("ACCOUNT", 8, Align::Right));
    }
    cols.push(col("PRIORITY", 10, Align::Right));
    for f in &shown {
        cols.push(col(f.name, 10, Align::Right));
    }
    if view.long {
        cols.push(col("QOSNAME", 10, Align::Right));
        cols.push(col("NICE", 6, Align::Right));
    }
    if has_tres {
        cols.push(col("TRES", 20, Align::Left));
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    if view.weights_only {
        let mut r = vec!["Weights".to_owned(), String::new(), String::new()];
        if view.long {
            r.push(String::new());
        }
        r.push(String::new());
        r.extend(shown.iter().map(|f| f.weight.to_string()));
        if view.long {
            r.extend([String::new(), String::new()]);
        }
        if has_tres {
            r.push(tres_cell(&w, None, false));
        }
        rows.push(r);
    } else {
        for j in &resp.rows {
            let parts = if view.norm {
                j.normalized.unwrap_or_default()
            } else {
                j.weighted.unwrap_or_default()
            };
            let mut r = vec![j.display_id.clone(), j.partition.clone(), j.user.clone()];
            if view.long {
                r.push(j.account.clone());
            }
            r.push(if view.norm {
                format!("{:.8}", j.priority as f64 / f64::from(u32::MAX))
            } else {
                j.priority.to_string()
            });
            for f in &shown {
                let v = (f.get)(&parts);
                r.push(if view.norm {
                    format!("{v:.7}")
                } else {
                    format!("{v:.0}")
                });
            }
            if view.long {
                r.push(j.qos.clone());
                r.push(j.nice.to_string());
            }
            if has_tres {
                r.push(tres_cell(&w, Some(&parts), view.norm));
            }
            rows.push(r);
        }
    }
    render_trimmed(&cols, &rows, Layout::Fixed, header)
}

fn to_json(resp: &v1::ListPrioritiesResponse) -> serde_json::Value {
    let w = resp.weights.unwrap_or_default();
    let fjson = |f: &v1::PriorityFactors| {
        json!({
            "age": f.age, "fairshare": f.fairshare, "job_size": f.job_size,
            "partition": f.partition, "qos": f.qos,
            "tres": {"cpu": f.tres_cpu, "mem": f.tres_mem, "gres/gpu": f.tres_gpu},
        })
    };
    json!({
        "weights": {
            "age": w.age, "fairshare": w.fairshare, "job_size": w.job_size,
            "partition": w.partition, "qos": w.qos,
            "tres": {"cpu": w.tres_cpu, "mem": w.tres_mem, "gres/gpu": w.tres_gpu},
        },
        "jobs": resp.rows.iter().map(|j| json!({
            "job_id": j.job_id,
            "id": j.display_id,
            "partition": j.partition,
            "user": j.user,
            "account": j.account,
            "qos": j.qos,
            "priority": j.priority,
            "nice": j.nice,
            "fixed": j.fixed,
            "normalized": fjson(&j.normalized.unwrap_or_default()),
            "weighted": fjson(&j.weighted.unwrap_or_default()),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp() -> v1::ListPrioritiesResponse {
        v1::ListPrioritiesResponse {
            weights: Some(v1::PriorityWeights {
                age: 1000,
                fairshare: 10000,
                job_size: 0,
                partition: 1000,
                qos: 2000,
                tres_gpu: 500,
                ..Default::default()
            }),
            rows: vec![v1::PriorityRow {
                job_id: 7,
                display_id: "7".into(),
                partition: "batch".into(),
                user: "alice".into(),
                account: "physics".into(),
                qos: "normal".into(),
                priority: 7751,
                normalized: Some(v1::PriorityFactors {
                    age: 0.25,
                    fairshare: 0.5,
                    tres_gpu: 0.5,
                    ..Default::default()
                }),
                weighted: Some(v1::PriorityFactors {
                    age: 250.4,
                    fairshare: 5000.0,
                    partition: 2000.0,
                    tres_gpu: 250.0,
                    ..Default::default()
                }),
                nice: 0,
                fixed: false,
            }],
        }
    }

    fn words(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn zero_weights_get_no_column_and_tres_lists_weighted_ones() {
        let out = table(&resp(), View::default(), true);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            words(lines[0]),
            [
                "JOBID",
                "PARTITION",
                "USER",
                "PRIORITY",
                "AGE",
                "FAIRSHARE",
                "PARTITION",
                "QOS",
                "TRES"
            ]
        );
        assert_eq!(
            words(lines[2]),
            [
                "7",
                "batch",
                "alice",
                "7751",
                "250",
                "5000",
                "2000",
                "0",
                "gres/gpu=250"
            ]
        );
    }

    #[test]
    fn weights_and_normalized_views() {
        let out = table(
            &resp(),
            View {
                weights_only: true,
                ..View::default()
            },
            false,
        );
        assert_eq!(
            words(&out),
            ["Weights", "1000", "10000", "1000", "2000", "gres/gpu=500"]
        );
        let out = table(
            &resp(),
            View {
                norm: true,
                long: true,
                ..View::default()
            },
            false,
        );
        let w = words(&out);
        assert_eq!(w[3], "physics");
        assert_eq!(&w[5..7], ["0.2500000", "0.5000000"]);
        assert_eq!(&w[9..], ["normal", "0", "gres/gpu=0.50"]);
    }

    #[test]
    fn job_ids_keep_their_array_task() {
        let items = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (jobs, tasks) = job_filter(&items(&["12", "12_3", "7_0"])).unwrap();
        assert_eq!(jobs, [12]);
        assert_eq!(
            tasks,
            [
                v1::ArrayTaskRef {
                    array_job_id: 12,
                    task_id: 3
                },
                v1::ArrayTaskRef {
                    array_job_id: 7,
                    task_id: 0
                },
            ]
        );
        for bad in ["12_", "_3", "12_x", "12_3_4", "12_[1-3]", "12_-1", "x"] {
            let err = format!("{:#}", job_filter(&items(&[bad])).unwrap_err());
            assert!(err.starts_with("Invalid job id"), "{bad}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn large_tres_weights_do_not_overflow() {
        let mut r = resp();
        r.weights = Some(v1::PriorityWeights {
            tres_cpu: u32::MAX,
            tres_mem: u32::MAX,
            tres_gpu: 2,
            ..Default::default()
        });
        let out = table(&r, View::default(), true);
        assert!(out.lines().next().unwrap().contains("TRES"), "{out}");
        r.weights = Some(v1::PriorityWeights::default());
        let out = table(&r, View::default(), true);
        assert!(!out.contains("TRES"), "{out}");
    }
}
