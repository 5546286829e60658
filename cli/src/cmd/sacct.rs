//! `sacct`: accounting records of jobs and their steps.

use anyhow::Context as _;
use clap::Parser;
use tandem_proto::v1::ListJobRecordsRequest;

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::columns::sacct_format;
use crate::format::view::{ExitCode, JobView};
use crate::format::{Columns, Human, Json, Output};

/// Show accounting data of jobs and steps.
#[derive(Debug, Parser)]
#[command(
    name = "sacct",
    version,
    infer_long_args = true,
    disable_help_flag = false
)]
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
    /// List the fields -o takes, and nothing else.
    #[arg(short = 'e', long = "helpformat")]
    pub helpformat: bool,
    /// Fields: JobID,JobName%20,State,... (JobName%20 sets a width). Given twice, the
    /// lists add up, as in Slurm (`-o JobID -o State` shows both).
    #[arg(short = 'o', long = "format", value_name = "FIELDS")]
    pub format: Vec<String>,
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
    /// Memory sizes (ReqMem, MaxRSS) in this unit: K, M, G, T or P.
    #[arg(long = "units", value_name = "UNIT")]
    pub units: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: Args) -> Exit {
    // As Slurm's: the list alone, whatever else the command line asks.
    if args.helpformat {
        print!("{}", crate::format::columns::sacct_helpformat());
        return Ok(0);
    }
    let mem_unit = args.units.as_deref().map(mem_unit).transpose()?;
    let format = match (args.format.is_empty(), args.brief) {
        (false, _) => Some(args.format.join(",")),
        (true, true) => Some("JobID,State,ExitCode".to_string()),
        (true, false) => None,
    };
    if let Some(f) = &format {
        sacct_format(f)?;
    }
    let now = crate::clock::now();
    let offset = crate::clock::local_utc_offset();
    let jobs = job_list(&args.jobs.join(",")).map_err(anyhow::Error::msg)?;
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
    // Slurm's words for a window that ends before it starts (the end defaults to now).
    let end_or_now = if end_time > 0 { end_time } else { now };
    if start_time > end_or_now {
        let at = |t: i64| tandem_sched::time::format_timestamp(t, offset);
        anyhow::bail!(
            "Start time ({}) requested is after end time ({}).",
            at(start_time),
            at(end_or_now)
        );
    }
    let (mut users, unknown) = super::resolve_users(&args.users);
    if let Some(u) = unknown.first() {
        anyhow::bail!("Invalid user id: {u}");
    }
    let mut client = Client::connect().await?;
    if users.is_empty() && !args.all_users && jobs.is_empty() && !client.identity().is_admin() {
        users.push(client.identity().user.clone());
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
        let steps: Vec<JobView> = j
            .steps
            .iter()
            .map(|s| JobView::from_step(&view, s, now))
            .collect();
        rows.extend(accounting_rows(view, steps, args.allocations));
    }
    let output: Box<dyn Output> = if args.json {
        Box::new(Json)
    } else {
        let wants_groups = format.as_deref().is_some_and(|f| {
            f.split(',').any(|c| {
                c.split('%')
                    .next()
                    .is_some_and(|n| n.eq_ignore_ascii_case("group"))
            })
        });
        let mut h = Human::new(format.map(Columns::Named), !args.noheader);
        h.ctx.mem_unit = mem_unit;
        h.ctx.cluster = client.cluster_name.clone();
        if wants_groups {
            h.ctx.groups = group_names(sorted.iter().map(|j| j.gid));
        }
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

/// `-j`: job ids and single array tasks, `12,12_3`. Slurm 22.05's sacct takes one task
/// index after `_`, no `12_[3-5]` list as squeue does: it fails with `sacct: fatal: Bad job
/// array element specified: 12` (exit 1), and so does this. (22.05 reads `12_3-5` as
/// `12_3`, ignoring what follows the number; that is refused here rather than guessed.)
fn job_list(text: &str) -> Result<Vec<tandem_proto::v1::JobRef>, String> {
    for part in crate::jobref::split_outside_brackets(text) {
        if let Some((id, task)) = part.trim().split_once('_')
            && (task.is_empty() || !task.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("Bad job array element specified: {id}"));
        }
    }
    crate::jobref::parse_list(text)
}

/// `--units`: one of Slurm's letters, either case.
fn mem_unit(text: &str) -> anyhow::Result<char> {
    let mut chars = text.chars();
    match (chars.next().map(|c| c.to_ascii_uppercase()), chars.next()) {
        (Some(c @ ('K' | 'M' | 'G' | 'T' | 'P')), None) => Ok(c),
        _ => anyhow::bail!("Invalid unit type '{text}'. Possible options are 'KMGTP'"),
    }
}

/// The rows sacct prints for one job: its allocation line, then (without `-X`) its steps,
/// with Slurm's accounting view of how the job ended. What Slurm 22.05 printed
/// (`sacct -o JobID,State,ExitCode,DerivedExitCode`):
///
/// ```text
/// 10          CANCELLED+      0:0             0:0    scancel of `sleep 300`
/// 10.batch     CANCELLED     0:15
/// 11             TIMEOUT      0:0             0:0    -t 1, `sleep 300`
/// 11.batch     CANCELLED     0:15
/// 13              FAILED      0:9             0:0    `kill -9 $$`
/// 13.batch     CANCELLED      0:9
/// 14           COMPLETED      0:0            0:15    `srun sh -c 'kill -TERM $$'; exit 0`
/// 14.batch     COMPLETED      0:0
/// 14.0         CANCELLED     0:15
/// ```
///
/// So: a job Slurm ended itself (cancelled, timed out) shows 0:0 on its allocation line and
/// the signal on `.batch` (`scontrol show job` still says 0:15: that is the job's own
/// record, and Tandem's squeue/scontrol keep it); a batch script a signal ended is
/// CANCELLED on its `.batch` line, whatever the job's state; DerivedExitCode is the highest
/// exit of the srun steps (the batch script's own does not count), blank on step lines.
pub fn accounting_rows<'a>(
    mut job: JobView<'a>,
    mut steps: Vec<JobView<'a>>,
    allocations_only: bool,
) -> Vec<JobView<'a>> {
    let derived = steps
        .iter()
        .filter(|s| !matches!(s.step_id, Some("batch" | "extern")))
        .map(|s| s.exit_code)
        .max_by_key(|e| e.wait_status())
        .unwrap_or(ExitCode { code: 0, signal: 0 });
    job.derived_exit_code = Some(derived);
    if matches!(job.state, "CANCELLED" | "TIMEOUT") {
        job.exit_code = ExitCode { code: 0, signal: 0 };
    }
    // Slurm's accounting keeps the reason a job waited for, not why it ended: its sacct
    // printed Reason `None` for jobs that ran, FAILED (squeue: NonZeroExitCode) and TIMEOUT
    // (TimeLimit) ones too.
    if job.start_time.is_some() {
        job.reason = "None";
    }
    if allocations_only {
        return vec![job];
    }
    for s in &mut steps {
        let ended_by_signal = s.exit_code.signal != 0 && s.end_time.is_some();
        if s.step_id == Some("batch")
            && ended_by_signal
            && matches!(s.state, "FAILED" | "TIMEOUT" | "CANCELLED")
        {
            s.state = "CANCELLED";
            s.state_compact = "CA";
        }
    }
    let mut rows = Vec::with_capacity(steps.len() + 1);
    rows.push(job);
    rows.extend(steps);
    rows
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
    Ok(tandem_sched::time::parse_past_with_offset(
        s,
        now,
        utc_offset_s,
    )?)
}

/// The group name of each gid, looked up once each (the group database may be remote).
fn group_names(gids: impl Iterator<Item = u32>) -> std::collections::HashMap<u32, String> {
    let mut names = std::collections::HashMap::new();
    for gid in gids {
        names.entry(gid).or_insert_with(|| {
            nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
                .ok()
                .flatten()
                .map_or_else(|| gid.to_string(), |g| g.name)
        });
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_list_takes_single_tasks_only() {
        let got = job_list("12,13_3").unwrap();
        assert_eq!(
            got.iter()
                .map(|r| (r.job_id, r.array_tasks.as_str()))
                .collect::<Vec<_>>(),
            vec![(12, ""), (13, "3")]
        );
        for bad in ["5_[0-2]", "5_[1,3]", "7,5_x", "5_", "5_1-2"] {
            assert_eq!(
                job_list(bad),
                Err("Bad job array element specified: 5".to_string()),
                "{bad}"
            );
        }
        assert!(job_list("x").is_err());
    }

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

    /// The cases of [`accounting_rows`]' doc, as the controller records them (the batch
    /// step carries the script's wait status, the job its state and the same status).
    #[test]
    fn allocation_and_batch_lines_read_as_slurms() {
        use tandem_proto::v1::{JobInfo, JobState, StepInfo};
        let step = |id: &str, state: JobState, code: i32, signal: i32| StepInfo {
            step_id: id.into(),
            state: state as i32,
            exit_code: code,
            signal,
            start_time: 10,
            end_time: 20,
            ..StepInfo::default()
        };
        let job = |state: JobState, code: i32, signal: i32, steps: Vec<StepInfo>| JobInfo {
            job_id: 1,
            array_task_id: -1,
            state: state as i32,
            exit_code: code,
            exit_signal: signal,
            start_time: 10,
            end_time: 20,
            steps,
            ..JobInfo::default()
        };
        let rows = |j: &JobInfo, x: bool| -> Vec<String> {
            let view = JobView::from_job(j, 30);
            let steps = j
                .steps
                .iter()
                .map(|s| JobView::from_step(&view, s, 30))
                .collect();
            accounting_rows(view, steps, x)
                .iter()
                .map(|r| {
                    let d = r
                        .derived_exit_code
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    format!("{} {} {} {d}", r.job_id, r.state, r.exit_code)
                        .trim_end()
                        .to_owned()
                })
                .collect()
        };
        use JobState::*;
        let cancelled = job(Cancelled, 0, 15, vec![step("batch", Cancelled, 0, 15)]);
        assert_eq!(
            rows(&cancelled, false),
            ["1 CANCELLED 0:0 0:0", "1.batch CANCELLED 0:15"]
        );
        let timeout = job(Timeout, 0, 15, vec![step("batch", Timeout, 0, 15)]);
        assert_eq!(
            rows(&timeout, false),
            ["1 TIMEOUT 0:0 0:0", "1.batch CANCELLED 0:15"]
        );
        assert_eq!(rows(&timeout, true), ["1 TIMEOUT 0:0 0:0"], "-X");
        let killed = job(Failed, 0, 9, vec![step("batch", Failed, 0, 9)]);
        assert_eq!(
            rows(&killed, false),
            ["1 FAILED 0:9 0:0", "1.batch CANCELLED 0:9"]
        );
        let failed = job(Failed, 3, 0, vec![step("batch", Failed, 3, 0)]);
        assert_eq!(
            rows(&failed, false),
            ["1 FAILED 3:0 0:0", "1.batch FAILED 3:0"]
        );
        // Slurm's sacct: Reason None for a job that ran, whatever squeue said it ended for.
        for (state, reason) in [(Failed, "NonZeroExitCode"), (Timeout, "TimeLimit")] {
            let ended = JobInfo {
                reason: reason.into(),
                ..job(state, 0, 0, Vec::new())
            };
            let view = JobView::from_job(&ended, 30);
            assert_eq!(accounting_rows(view, Vec::new(), true)[0].reason, "None");
        }
        let srun_killed = job(
            Completed,
            0,
            0,
            vec![
                step("batch", Completed, 0, 0),
                step("0", Cancelled, 0, 15),
                step("1", Completed, 0, 0),
            ],
        );
        assert_eq!(
            rows(&srun_killed, false),
            [
                "1 COMPLETED 0:0 0:15",
                "1.batch COMPLETED 0:0",
                "1.0 CANCELLED 0:15",
                "1.1 COMPLETED 0:0"
            ]
        );
        assert_eq!(
            rows(&srun_killed, true),
            ["1 COMPLETED 0:0 0:15"],
            "-X keeps the derived code"
        );
        // An exit code outranks a signal (wait status 2 << 8 > 15), as in Slurm.
        let mixed = job(
            Completed,
            0,
            0,
            vec![step("0", Cancelled, 0, 15), step("1", Failed, 2, 0)],
        );
        assert_eq!(rows(&mixed, true), ["1 COMPLETED 0:0 2:0"]);
        // A running job's batch line keeps its state.
        let mut running = job(Running, 0, 0, vec![step("batch", Running, 0, 0)]);
        running.end_time = 0;
        running.steps[0].end_time = 0;
        assert_eq!(
            rows(&running, false),
            ["1 RUNNING 0:0 0:0", "1.batch RUNNING 0:0"]
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
