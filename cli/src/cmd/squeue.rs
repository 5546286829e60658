//! `squeue`: pending and running jobs.

use std::io::Write as _;

use clap::Parser;
use tandem_proto::v1::{JobInfo, ListJobsRequest};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::columns::{JobField, SQUEUE_LONG, SQUEUE_START, squeue_format, squeue_named};
use crate::format::view::{elapsed_s, state_name};
use crate::format::{Columns, Human, Json, Output};

/// Show queued and running jobs.
#[derive(Debug, Parser)]
#[command(
    name = "squeue",
    version,
    infer_long_args = true,
    disable_help_flag = true
)]
pub struct Args {
    /// Print help (-h is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Only these users' jobs (comma list).
    #[arg(short = 'u', long = "user", value_name = "USERS", action = clap::ArgAction::Set)]
    pub users: Vec<String>,
    /// Only the current user's jobs.
    #[arg(long)]
    pub me: bool,
    /// Only these jobs: 12, 12_3, 12_[3-5] (comma list).
    #[arg(short = 'j', long = "jobs", value_name = "IDS", action = clap::ArgAction::Set)]
    pub jobs: Vec<String>,
    /// Only jobs in these states: PD, R, PENDING, RUNNING, ... or all.
    #[arg(short = 't', long = "states", value_name = "STATES", action = clap::ArgAction::Set)]
    pub states: Vec<String>,
    /// Only jobs in these partitions.
    #[arg(short = 'p', long = "partition", value_name = "PARTITIONS", action = clap::ArgAction::Set)]
    pub partitions: Vec<String>,
    /// Only jobs with these names.
    #[arg(short = 'n', long = "name", value_name = "NAMES", action = clap::ArgAction::Set)]
    pub names: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_name = "ACCOUNTS", action = clap::ArgAction::Set)]
    pub accounts: Vec<String>,
    /// Do not print the header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Columns as %-fields, e.g. "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R".
    #[arg(short = 'o', long = "format", value_name = "FORMAT")]
    pub format: Option<String>,
    /// Columns by name, e.g. "jobid:10,name:20,state".
    // Slurm 22.05 refuses the pair ("-O (--Format) is incompatible with -o (--format)").
    #[arg(
        short = 'O',
        long = "Format",
        value_name = "FIELDS",
        conflicts_with = "format"
    )]
    pub named: Option<String>,
    /// Long format (full state and time limit).
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Show every array task on its own line instead of folding pending tasks.
    #[arg(short = 'r', long = "array")]
    pub array: bool,
    /// Sort keys: %-field letters, comma separated, '-' for descending (default: job id).
    #[arg(
        short = 'S',
        long = "sort",
        value_name = "KEYS",
        allow_hyphen_values = true
    )]
    pub sort: Option<String>,
    /// Pending jobs with the scheduler's expected start and nodes (N/A: no estimate yet),
    /// soonest first.
    #[arg(long = "start")]
    pub start: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Accepted for compatibility (all partitions are always shown).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
}

pub async fn run(args: Args) -> Exit {
    let (output, fields) = output_of(&args)?;
    // Slurm's squeue reports a user it does not know and lists the others' jobs (none when
    // it knew none of them), exiting 0.
    let (mut users, unknown) = super::resolve_users(&args.users);
    for u in &unknown {
        eprintln!("squeue: error: Invalid user: {u}");
    }
    if users.is_empty() {
        // Names no job has: the controller lists nothing rather than everything.
        users = unknown;
    }
    if args.me {
        users.push(crate::client::user_name());
    }
    let jobs = crate::jobref::parse_list(&args.jobs.join(",")).map_err(anyhow::Error::msg)?;
    let states = super::parse_states(&args.states)?;
    // Slurm's squeue shows finished jobs the controller still holds (its MinJobAge) when
    // asked for their states (`-t CD`, `-t all`), and tells one job id it does not know
    // from one that has ended: the first is an error, the second an empty listing.
    let all_states = super::split_commas(&args.states)
        .iter()
        .any(|s| s.eq_ignore_ascii_case("all"));
    let single = jobs.len() == 1 && args.states.is_empty() && !args.start;
    let include_finished = all_states || states.iter().any(|s| finished(*s)) || single;
    let req = ListJobsRequest {
        jobs,
        users,
        partitions: super::split_commas(&args.partitions),
        states: if args.start && args.states.is_empty() {
            vec![tandem_proto::v1::JobState::Pending as i32]
        } else {
            states.into_iter().map(|s| s as i32).collect()
        },
        names: super::split_commas(&args.names),
        accounts: super::split_commas(&args.accounts),
        include_finished,
        fold_arrays: !args.array,
        fields,
    };
    let mut keys = sort_keys(args.sort.as_deref())?;
    if keys.is_empty() && !args.start {
        keys = DEFAULT_SORT.to_vec();
    }
    let mut client = Client::connect().await?;
    let resp = client.jobs.list_jobs(req).await.rpc()?;
    if single && resp.jobs.is_empty() {
        anyhow::bail!("Invalid job id specified");
    }
    let mut jobs: Vec<&JobInfo> = resp
        .jobs
        .iter()
        .filter(|j| !single || !finished(j.state()))
        .collect();
    sort(&mut jobs, &keys, resp.now);
    if args.start && keys.is_empty() {
        // Soonest expected start first, jobs without an estimate last (in id order).
        jobs.sort_by_key(|j| {
            let t = shown_start(j);
            (t <= 0, t)
        });
    }
    let mut out = std::io::stdout().lock();
    let dated = args.long && !args.noheader && !args.json;
    let written = (|| -> anyhow::Result<()> {
        if dated {
            writeln!(out, "{}", crate::clock::long_listing_time(resp.now))?;
        }
        output.write_jobs(&jobs, resp.now, &mut out)?;
        Ok(out.flush()?)
    })();
    match written {
        // `squeue | head` closes the pipe early: the reader has what it wanted.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(0)
        }
        r => r.map(|()| 0),
    }
}

/// How the jobs are printed, and the `JobInfo` fields that needs (none named: all of them).
fn output_of(args: &Args) -> anyhow::Result<(Box<dyn Output>, Vec<String>)> {
    if args.long && (args.format.is_some() || args.named.is_some()) {
        // Slurm's words (it exits there too).
        anyhow::bail!(
            "Options -o(--format) and -l(--long) are mutually exclusive. Please remove one \
             and retry."
        );
    }
    if args.json {
        return Ok((Box::new(Json), Vec::new()));
    }
    let columns = match (&args.format, &args.named, args.long) {
        (Some(f), _, _) => {
            squeue_format(f)?;
            Some(Columns::Percent(f.clone()))
        }
        (None, Some(n), _) => {
            squeue_named(n)?;
            Some(Columns::Named(n.clone()))
        }
        (None, None, _) if args.start => Some(Columns::Percent(SQUEUE_START.to_string())),
        (None, None, true) => Some(Columns::Percent(SQUEUE_LONG.to_string())),
        (None, None, false) => None,
    };
    let human = Human::new(columns, !args.noheader);
    // Sort keys are column letters too (`sort_keys` refuses the others); without -S, the
    // default order's.
    let default_keys: String = DEFAULT_SORT.iter().map(|(_, c)| *c).collect();
    let sort_keys = args.sort.as_deref().unwrap_or(&default_keys).chars();
    let mut fields: Vec<String> = human
        .job_format()?
        .fields()
        .chain(sort_keys.filter_map(JobField::from_letter))
        .flat_map(JobField::wire_fields)
        .map(|f| (*f).to_string())
        .collect();
    fields.sort_unstable();
    fields.dedup();
    if fields.is_empty() {
        // An empty mask means every field; the ids alone are always sent.
        fields.push("job_id".to_string());
    }
    Ok((Box::new(human), fields))
}

/// Slurm's order without `-S` (`P,t,-p`): by partition, then state (its short name: CD,
/// F, PD, R), then highest priority first; ties in job id order.
const DEFAULT_SORT: [(bool, char); 3] = [(false, 'P'), (false, 't'), (true, 'p')];

/// `-S` keys: squeue's letters (`i`, `P`, `t`, `u`, `j`, `Q`, `M`, `S`, `V`, `D`), comma
/// separated, `-` for descending. Checked before anything is asked of the controller.
fn sort_keys(keys: Option<&str>) -> anyhow::Result<Vec<(bool, char)>> {
    let mut parsed = Vec::new();
    for k in keys.unwrap_or("").split(',').map(str::trim) {
        if k.is_empty() {
            continue;
        }
        let (desc, letter) = match k.strip_prefix('-') {
            Some(l) => (true, l),
            None => (false, k.strip_prefix('+').unwrap_or(k)),
        };
        let mut chars = letter.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            anyhow::bail!("invalid sort key {k:?}");
        };
        if !"iPtTujpQMSVD".contains(c) {
            anyhow::bail!("invalid sort key {k:?}");
        }
        parsed.push((desc, c));
    }
    Ok(parsed)
}

/// A state the job does not leave (squeue lists it only when asked to).
fn finished(state: tandem_proto::v1::JobState) -> bool {
    use tandem_proto::v1::JobState::*;
    !matches!(
        state,
        Unspecified | Pending | Running | Suspended | Completing | Requeued
    )
}

/// The start `%S` shows: a pending job's expected start, else when it started.
fn shown_start(j: &JobInfo) -> i64 {
    if j.state() == tandem_proto::v1::JobState::Pending {
        j.expected_start
    } else {
        j.start_time
    }
}

/// Sorts by job id, then by `keys` (from [`sort_keys`]). Works on the wire records: a view
/// per job would cost more than the sort.
fn sort(jobs: &mut [&JobInfo], keys: &[(bool, char)], now: i64) {
    // An array's records (pending meta and started tasks) sort under the array's id.
    let id_key = |j: &JobInfo| {
        let base = if j.array_job_id > 0 {
            j.array_job_id
        } else {
            j.job_id
        };
        (base, j.job_id)
    };
    jobs.sort_by_key(|j| id_key(j));
    if keys.is_empty() {
        return;
    }
    let state = |j: &JobInfo| state_name(j.state());
    let compact = |j: &JobInfo| crate::format::view::state_compact(j.state());
    let elapsed = |j: &JobInfo| elapsed_s(j.start_time, j.end_time, now);
    jobs.sort_by(|a, b| {
        for (desc, c) in keys {
            let ord = match c {
                'i' => id_key(a).cmp(&id_key(b)),
                'P' => a.partition.cmp(&b.partition),
                't' => compact(a).cmp(compact(b)),
                'T' => state(a).cmp(state(b)),
                'u' => a.user.cmp(&b.user),
                'j' => a.name.cmp(&b.name),
                'Q' | 'p' => a.priority.cmp(&b.priority),
                'M' => elapsed(a).cmp(&elapsed(b)),
                // Unset times (0) first, as None sorts before Some.
                'S' => shown_start(a).max(0).cmp(&shown_start(b).max(0)),
                'V' => a.submit_time.max(0).cmp(&b.submit_time.max(0)),
                _ => a.num_nodes.cmp(&b.num_nodes),
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord.is_ne() {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_for(argv: &[&str]) -> Vec<String> {
        let args = Args::try_parse_from(std::iter::once("squeue").chain(argv.iter().copied()));
        output_of(&args.unwrap()).unwrap().1
    }

    #[test]
    fn asks_for_the_columns_and_sort_keys_it_uses() {
        assert_eq!(
            fields_for(&[]),
            [
                "end_time",
                "name",
                "nodelist",
                "num_nodes",
                "partition",
                "priority",
                "reason",
                "start_time",
                "user"
            ]
        );
        assert_eq!(
            fields_for(&["-o", "%i %u", "-S", "-Q"]),
            ["priority", "user"]
        );
        // The default order (partition, state, priority) needs its fields too.
        assert_eq!(
            fields_for(&["-O", "jobid,state"]),
            ["partition", "priority"]
        );
        // JSON carries every field.
        assert!(fields_for(&["--json"]).is_empty());
    }

    fn job(id: u64, array_job_id: u64, priority: u64, user: &str) -> JobInfo {
        JobInfo {
            job_id: id,
            array_job_id,
            priority,
            user: user.into(),
            ..JobInfo::default()
        }
    }

    #[test]
    fn sorts_by_id_with_array_records_together_then_by_keys() {
        let records = [
            job(9, 0, 5, "bob"),
            job(12, 3, 1, "alice"),
            job(3, 3, 7, "alice"),
            job(4, 0, 7, "carol"),
        ];
        let ids = |keys: &str| {
            let mut jobs: Vec<&JobInfo> = records.iter().collect();
            sort(&mut jobs, &sort_keys(Some(keys)).unwrap(), 0);
            jobs.iter().map(|j| j.job_id).collect::<Vec<_>>()
        };
        // Task 12 of array 3 sorts with its array.
        assert_eq!(ids(""), [3, 12, 4, 9]);
        assert_eq!(ids("-Q"), [3, 4, 9, 12]);
        assert_eq!(ids("u,-i"), [12, 3, 9, 4]);
        assert!(sort_keys(Some("x")).is_err());
        assert!(sort_keys(Some("PP")).is_err());
    }

    /// Slurm 22.05's squeue without `-S`, a running job 1, held 2, dependent 3 and a held
    /// array 4: `3 PD (Dependency)`, `4_[0-3] PD (JobHeldUser)`, `2 PD (JobHeldUser)`,
    /// `1 R`; with `-t all`, state by short name: CA, CD, F, PD, R.
    #[test]
    fn the_default_order_is_slurms_partition_state_then_priority() {
        use tandem_proto::v1::JobState;
        let with = |id: u64, state: JobState, priority: u64| JobInfo {
            state: state as i32,
            partition: "batch".into(),
            ..job(id, 0, priority, "root")
        };
        let records = [
            with(1, JobState::Running, 100),
            with(2, JobState::Pending, 0),
            with(3, JobState::Pending, 100),
            with(5, JobState::Failed, 100),
            with(6, JobState::Completed, 100),
            with(7, JobState::Cancelled, 100),
            JobInfo {
                partition: "a-first".into(),
                ..with(8, JobState::Running, 1)
            },
        ];
        let mut jobs: Vec<&JobInfo> = records.iter().collect();
        sort(&mut jobs, &DEFAULT_SORT, 0);
        let ids: Vec<u64> = jobs.iter().map(|j| j.job_id).collect();
        assert_eq!(ids, [8, 7, 6, 5, 3, 2, 1]);
    }
}
