//! `squeue`: pending and running jobs.

use clap::Parser;
use tandem_proto::v1::ListJobsRequest;

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::columns::{SQUEUE_LONG, squeue_format, squeue_named};
use crate::format::view::JobView;
use crate::format::{Columns, Human, Json, Output};

/// Show queued and running jobs.
#[derive(Debug, Parser)]
#[command(name = "squeue", infer_long_args = true, disable_help_flag = true)]
pub struct Args {
    /// Print help (-h is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// Only these users' jobs (comma list).
    #[arg(short = 'u', long = "user", value_name = "USERS")]
    pub users: Vec<String>,
    /// Only the current user's jobs.
    #[arg(long)]
    pub me: bool,
    /// Only these jobs: 12, 12_3, 12_[3-5] (comma list).
    #[arg(short = 'j', long = "jobs", value_name = "IDS")]
    pub jobs: Vec<String>,
    /// Only jobs in these states: PD, R, PENDING, RUNNING, ... or all.
    #[arg(short = 't', long = "states", value_name = "STATES")]
    pub states: Vec<String>,
    /// Only jobs in these partitions.
    #[arg(short = 'p', long = "partition", value_name = "PARTITIONS")]
    pub partitions: Vec<String>,
    /// Only jobs with these names.
    #[arg(short = 'n', long = "name", value_name = "NAMES")]
    pub names: Vec<String>,
    /// Only jobs charged to these accounts.
    #[arg(short = 'A', long = "account", value_name = "ACCOUNTS")]
    pub accounts: Vec<String>,
    /// Do not print the header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Columns as %-fields, e.g. "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R".
    #[arg(short = 'o', long = "format", value_name = "FORMAT")]
    pub format: Option<String>,
    /// Columns by name, e.g. "jobid:10,name:20,state".
    #[arg(short = 'O', long = "Format", value_name = "FIELDS")]
    pub named: Option<String>,
    /// Long format (full state and time limit).
    #[arg(short = 'l', long)]
    pub long: bool,
    /// Show every array task on its own line instead of folding pending tasks.
    #[arg(short = 'r', long = "array")]
    pub array: bool,
    /// Sort keys: %-field letters, comma separated, '-' for descending (default: job id).
    #[arg(short = 'S', long = "sort", value_name = "KEYS")]
    pub sort: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Accepted for compatibility (all partitions are always shown).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
}

pub async fn run(args: Args) -> Exit {
    let output = output_of(&args)?;
    let mut users = super::split_commas(&args.users);
    if args.me {
        users.push(crate::client::user_name());
    }
    let req = ListJobsRequest {
        jobs: crate::jobref::parse_list(&args.jobs.join(",")).map_err(anyhow::Error::msg)?,
        users,
        partitions: super::split_commas(&args.partitions),
        states: super::parse_states(&args.states)?
            .into_iter()
            .map(|s| s as i32)
            .collect(),
        names: super::split_commas(&args.names),
        accounts: super::split_commas(&args.accounts),
        include_finished: false,
        fold_arrays: !args.array,
    };
    let mut client = Client::connect().await?;
    let resp = client.jobs.list_jobs(req).await.rpc()?;
    let mut views: Vec<JobView> = resp
        .jobs
        .iter()
        .map(|j| JobView::from_job(j, resp.now))
        .collect();
    sort(&mut views, args.sort.as_deref())?;
    crate::emit(&output.jobs(&views)?)?;
    Ok(0)
}

fn output_of(args: &Args) -> anyhow::Result<Box<dyn Output>> {
    if args.json {
        return Ok(Box::new(Json));
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
        (None, None, true) => Some(Columns::Percent(SQUEUE_LONG.to_string())),
        (None, None, false) => None,
    };
    Ok(Box::new(Human::new(columns, !args.noheader)))
}

/// Sorts by job id unless keys are given; keys are squeue's letters (`i`, `P`, `t`, `u`, `j`,
/// `Q`, `M`, `S`, `V`, `D`), `-` reverses one.
fn sort(jobs: &mut [JobView], keys: Option<&str>) -> anyhow::Result<()> {
    let id_key = |j: &JobView| (j.array_job_id.unwrap_or(j.job_id_raw), j.job_id_raw);
    jobs.sort_by_key(id_key);
    let Some(keys) = keys else { return Ok(()) };
    let mut parsed = Vec::new();
    for k in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        let (desc, letter) = match k.strip_prefix('-') {
            Some(l) => (true, l),
            None => (false, k.strip_prefix('+').unwrap_or(k)),
        };
        let mut chars = letter.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            anyhow::bail!("invalid sort key {k:?}");
        };
        if !"iPtTujQMSVD".contains(c) {
            anyhow::bail!("invalid sort key {k:?}");
        }
        parsed.push((desc, c));
    }
    jobs.sort_by(|a, b| {
        for (desc, c) in &parsed {
            let ord = match c {
                'i' => id_key(a).cmp(&id_key(b)),
                'P' => a.partition.cmp(b.partition),
                't' | 'T' => a.state.cmp(b.state),
                'u' => a.user.cmp(b.user),
                'j' => a.name.cmp(b.name),
                'Q' => a.priority.cmp(&b.priority),
                'M' => a.elapsed_s.cmp(&b.elapsed_s),
                'S' => a.start_time.cmp(&b.start_time),
                'V' => a.submit_time.cmp(&b.submit_time),
                _ => a.nodes.cmp(&b.nodes),
            };
            let ord = if *desc { ord.reverse() } else { ord };
            if ord.is_ne() {
                return ord;
            }
        }
        std::cmp::Ordering::Equal
    });
    Ok(())
}
