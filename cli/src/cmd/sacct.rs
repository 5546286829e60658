//! `sacct`: accounting records of jobs and their steps.

use anyhow::Context as _;
use clap::Parser;
use tandem_proto::v1::ListJobRecordsRequest;

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::columns::sacct_format;
use crate::format::view::JobView;
use crate::format::{Columns, Human, Json, Output};

/// Show accounting data of jobs and steps.
#[derive(Debug, Parser)]
#[command(name = "sacct", infer_long_args = true, disable_help_flag = false)]
pub struct Args {
    /// Only these jobs: 12, 12_3 (comma list). Without -S, any age.
    #[arg(short = 'j', long = "jobs", value_name = "IDS")]
    pub jobs: Vec<String>,
    /// Only these users' jobs (default: yours; root sees everyone's).
    #[arg(short = 'u', long = "user", value_name = "USERS")]
    pub users: Vec<String>,
    /// Every user's jobs.
    #[arg(short = 'a', long = "allusers")]
    pub all_users: bool,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "accounts", value_name = "ACCOUNTS")]
    pub accounts: Vec<String>,
    /// Only jobs in these partitions.
    #[arg(short = 'r', long = "partition", value_name = "PARTITIONS")]
    pub partitions: Vec<String>,
    /// Only jobs in these states.
    #[arg(short = 's', long = "state", value_name = "STATES")]
    pub states: Vec<String>,
    /// Only jobs with these names.
    #[arg(long = "name", value_name = "NAMES")]
    pub names: Vec<String>,
    /// Jobs eligible after this time (default: midnight today): YYYY-MM-DD[THH:MM[:SS]], now-N[units].
    #[arg(
        short = 'S',
        long = "starttime",
        value_name = "TIME",
        allow_hyphen_values = true
    )]
    pub start: Option<String>,
    /// Jobs eligible before this time.
    #[arg(
        short = 'E',
        long = "endtime",
        value_name = "TIME",
        allow_hyphen_values = true
    )]
    pub end: Option<String>,
    /// Only allocations, not steps.
    #[arg(short = 'X', long = "allocations")]
    pub allocations: bool,
    /// Fields: JobID,JobName%20,State,... (JobName%20 sets a width).
    #[arg(short = 'o', long = "format", value_name = "FIELDS")]
    pub format: Option<String>,
    /// Brief: JobID, State, ExitCode.
    #[arg(short = 'b', long = "brief")]
    pub brief: bool,
    /// Fields separated by '|' with a trailing '|'.
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// Fields separated by '|' without a trailing '|'.
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Do not print the header.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// Show every run of a requeued job, not only the latest.
    #[arg(short = 'D', long = "duplicates")]
    pub duplicates: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: Args) -> Exit {
    let format = match (&args.format, args.brief) {
        (Some(f), _) => Some(f.clone()),
        (None, true) => Some("JobID,State,ExitCode".to_string()),
        (None, false) => None,
    };
    if let Some(f) = &format {
        sacct_format(f)?;
    }
    let now = crate::clock::now();
    let offset = crate::clock::local_utc_offset();
    let jobs = crate::jobref::parse_list(&args.jobs.join(",")).map_err(anyhow::Error::msg)?;
    let start_time = match &args.start {
        Some(s) => parse_when(s, now, offset).context("invalid --starttime")?,
        // Slurm's default window is since midnight, unless jobs are named.
        None if jobs.is_empty() => now - (now + i64::from(offset)).rem_euclid(86_400),
        None => 0,
    };
    let end_time = match &args.end {
        Some(s) => parse_when(s, now, offset).context("invalid --endtime")?,
        None => 0,
    };
    let mut client = Client::connect().await?;
    let mut users = super::split_commas(&args.users);
    if users.is_empty() && !args.all_users && jobs.is_empty() && !client.identity.is_admin() {
        users.push(client.identity.user.clone());
    }
    let req = ListJobRecordsRequest {
        jobs,
        users,
        accounts: super::split_commas(&args.accounts),
        partitions: super::split_commas(&args.partitions),
        start_time,
        end_time,
        include_active: true,
        states: super::parse_states(&args.states)?
            .into_iter()
            .map(|s| crate::format::view::state_name(s).to_string())
            .collect(),
        names: super::split_commas(&args.names),
    };
    let resp = client.accounting.list_job_records(req).await.rpc()?;
    let mut rows = Vec::new();
    let mut sorted = if args.duplicates {
        resp.jobs
    } else {
        latest_runs(resp.jobs)
    };
    sorted.sort_by_key(|j| {
        (
            if j.array_job_id > 0 {
                j.array_job_id
            } else {
                j.job_id
            },
            j.array_task_id,
            j.job_id,
        )
    });
    for j in &sorted {
        let view = JobView::from_job(j, now);
        let steps: Vec<JobView> = if args.allocations {
            Vec::new()
        } else {
            j.steps
                .iter()
                .map(|s| JobView::from_step(&view, s, now))
                .collect()
        };
        rows.push(view);
        rows.extend(steps);
    }
    let output: Box<dyn Output> = if args.json {
        Box::new(Json)
    } else {
        let mut h = Human::new(format.map(Columns::Named), !args.noheader);
        if args.parsable2 {
            h.delimited = Some(false);
        } else if args.parsable {
            h.delimited = Some(true);
        }
        Box::new(h)
    };
    crate::emit(&output.records(&rows)?)?;
    Ok(0)
}

/// A requeued job has one record per run; like Slurm's sacct without `-D`, keep only the
/// most recent run of each job id: the active one (pending again after a requeue, or
/// running) if any, else the latest start, then the latest end, then the controller's order.
pub fn latest_runs(jobs: Vec<tandem_proto::v1::JobInfo>) -> Vec<tandem_proto::v1::JobInfo> {
    // A requeued job waiting to run again has no start time, yet it is newer than every
    // run that ended: ranking by start alone showed it as its last run's PREEMPTED.
    let key = |j: &tandem_proto::v1::JobInfo| (j.end_time == 0, j.start_time, j.end_time);
    let mut best: std::collections::HashMap<u64, (usize, tandem_proto::v1::JobInfo)> =
        std::collections::HashMap::new();
    for (i, j) in jobs.into_iter().enumerate() {
        match best.get(&j.job_id) {
            Some((_, b)) if key(b) > key(&j) => {}
            _ => {
                best.insert(j.job_id, (i, j));
            }
        }
    }
    let mut out: Vec<(usize, tandem_proto::v1::JobInfo)> = best.into_values().collect();
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, j)| j).collect()
}

/// sacct's times: `now`, `now-N[unit]`, or a date (and time) as `--begin` takes it.
pub fn parse_when(s: &str, now: i64, utc_offset_s: i32) -> anyhow::Result<i64> {
    let lower = s.trim().to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("now-") {
        let split = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, unit) = rest.split_at(split);
        let n: i64 = digits
            .parse()
            .map_err(|_| anyhow::anyhow!("invalid time {s:?}"))?;
        let mult = match unit {
            "" | "s" | "sec" | "secs" | "seconds" => 1,
            "m" | "min" | "mins" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => anyhow::bail!("invalid time {s:?}: unknown unit {unit:?}"),
        };
        return n
            .checked_mul(mult)
            .map(|d| now - d)
            .ok_or_else(|| anyhow::anyhow!("invalid time {s:?}"));
    }
    Ok(tandem_sched::time::parse_begin_with_offset(
        s,
        now,
        utc_offset_s,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_run_of_a_requeued_job_is_shown() {
        use tandem_proto::v1::{JobInfo, JobState};
        let run = |id: u64, start: i64, end: i64, state: JobState| JobInfo {
            job_id: id,
            start_time: start,
            end_time: end,
            state: state as i32,
            ..JobInfo::default()
        };
        let jobs = vec![
            run(1, 100, 100, JobState::NodeFail),
            run(2, 50, 60, JobState::Completed),
            run(1, 100, 130, JobState::Completed),
            run(3, 10, 20, JobState::NodeFail),
            run(3, 30, 0, JobState::Running),
            run(4, 10, 20, JobState::Preempted),
            run(4, 0, 0, JobState::Pending),
        ];
        let kept: Vec<(u64, JobState)> = latest_runs(jobs)
            .iter()
            .map(|j| (j.job_id, j.state()))
            .collect();
        assert_eq!(
            kept,
            [
                (2, JobState::Completed),
                (1, JobState::Completed),
                (3, JobState::Running),
                (4, JobState::Pending)
            ]
        );
    }

    #[test]
    fn relative_and_absolute_times() {
        assert_eq!(parse_when("now-2hours", 10_000, 0).unwrap(), 10_000 - 7200);
        assert_eq!(parse_when("now", 10_000, 0).unwrap(), 10_000);
        assert_eq!(
            parse_when("2024-01-02", 2_000_000_000, 0).unwrap(),
            1_704_153_600
        );
        assert!(parse_when("now-xyz", 0, 0).is_err());
        assert!(parse_when("yesterdayish", 0, 0).is_err());
    }
}
