//! `scancel`: cancel or signal jobs.

use std::str::FromStr;

use anyhow::bail;
use clap::Parser;
use tandem_proto::v1::{CancelFailureKind, CancelRequest};

use crate::Exit;
use crate::client::{Client, RpcResult as _};

/// Cancel jobs, array tasks or whole arrays, or send them a signal.
#[derive(Debug, Parser)]
#[command(name = "scancel", version, infer_long_args = true)]
pub struct Args {
    /// Jobs: 12, 12_3, 12_[3-5].
    #[arg(value_name = "JOB")]
    pub jobs: Vec<String>,
    /// Only jobs of this user.
    #[arg(short = 'u', long = "user", value_name = "USER")]
    pub user: Option<String>,
    /// Only jobs with this name.
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs in this partition.
    #[arg(short = 'p', long = "partition", value_name = "PARTITION")]
    pub partition: Option<String>,
    /// Only jobs in these states.
    #[arg(short = 't', long = "state", value_name = "STATES", action = clap::ArgAction::Set)]
    pub states: Vec<String>,
    /// Only jobs of this account.
    #[arg(short = 'A', long = "account", value_name = "ACCOUNT")]
    pub account: Option<String>,
    /// Send this signal instead of ending the jobs (name or number).
    #[arg(short = 's', long = "signal", value_name = "SIGNAL")]
    pub signal: Option<String>,
    /// With --signal: signal only the batch shell.
    #[arg(short = 'b', long = "batch")]
    pub batch: bool,
    /// Only the current user's jobs.
    #[arg(long)]
    pub me: bool,
    /// Say what is being done, and why a job was not cancelled even when that is not an
    /// error (it had ended, or never existed).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
}

pub async fn run(args: Args) -> Exit {
    let mut jobs = Vec::new();
    for j in &args.jobs {
        jobs.extend(crate::jobref::parse_list(j).map_err(anyhow::Error::msg)?);
    }
    let user = match (args.user, args.me) {
        (Some(u), _) => {
            let (known, unknown) = super::resolve_users(std::slice::from_ref(&u));
            if let Some(u) = unknown.first() {
                bail!("Invalid user name: {u}");
            }
            known.into_iter().next().unwrap_or(u)
        }
        (None, true) => crate::client::user_name(),
        (None, false) => String::new(),
    };
    let states = super::parse_states(&args.states)?;
    let has_filter = !user.is_empty()
        || args.name.is_some()
        || args.partition.is_some()
        || args.account.is_some()
        || !states.is_empty();
    if jobs.is_empty() && !has_filter {
        bail!("No job identification provided");
    }
    let signal = match &args.signal {
        None => 0,
        Some(s) => parse_signal(s)?,
    };
    if args.batch && signal == 0 {
        bail!("--batch needs --signal");
    }
    let req = CancelRequest {
        jobs,
        user,
        name: args.name.unwrap_or_default(),
        partition: args.partition.unwrap_or_default(),
        states: states.into_iter().map(|s| s as i32).collect(),
        account: args.account.unwrap_or_default(),
        signal,
        batch_only: args.batch,
    };
    if args.verbose > 0 {
        for j in &args.jobs {
            eprintln!("scancel: Terminating job {j}");
        }
    }
    let mut client = Client::connect().await?;
    let resp = client.jobs.cancel(req).await.rpc()?;
    if resp.failures.len() != resp.errors.len() {
        // A controller that does not classify its failures: every one is an error.
        for e in &resp.errors {
            eprintln!("scancel: error: {e}");
        }
        return Ok(u8::from(!resp.errors.is_empty()));
    }
    let mut failed = false;
    for (f, text) in resp.failures.iter().zip(&resp.errors) {
        let kind = CancelFailureKind::try_from(f.kind).unwrap_or_default();
        let Some((why, error)) = failure_line(kind, signal != 0) else {
            eprintln!("scancel: error: {text}");
            failed = true;
            continue;
        };
        if error || args.verbose > 0 {
            eprintln!("scancel: error: Kill job error on job id {}: {why}", f.job);
        }
        failed |= error;
    }
    Ok(u8::from(failed))
}

/// Slurm 22.05's words for a job scancel could not end or signal, and whether it is an
/// error. Cancelling a job that has ended or does not exist is not: scancel says so only
/// with `-v` and exits 0 (a clean-up that cancels a job that just finished must not fail);
/// signalling one is. `None`: no Slurm wording, the controller's text is shown.
fn failure_line(kind: CancelFailureKind, signal: bool) -> Option<(&'static str, bool)> {
    Some(match kind {
        CancelFailureKind::NotFound => ("Invalid job id specified", signal),
        CancelFailureKind::Ended if signal => ("Invalid job id specified", true),
        CancelFailureKind::Ended => ("Job/step already completing or completed", false),
        CancelFailureKind::Denied => ("Access/permission denied", true),
        CancelFailureKind::NotRunning => ("Job can not be altered now, try again later", true),
        CancelFailureKind::Unspecified => return None,
    })
}

/// `TERM`, `SIGTERM`, `15`.
pub fn parse_signal(s: &str) -> anyhow::Result<i32> {
    if let Ok(n) = s.parse::<i32>() {
        if nix::sys::signal::Signal::try_from(n).is_ok() {
            return Ok(n);
        }
        bail!("Unknown job signal: {s}");
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    nix::sys::signal::Signal::from_str(&name)
        .map(|sig| sig as i32)
        .map_err(|_| anyhow::anyhow!("Unknown job signal: {s}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ended_or_unknown_jobs_are_errors_only_when_signalled() {
        use CancelFailureKind::*;
        assert_eq!(
            failure_line(NotFound, false),
            Some(("Invalid job id specified", false))
        );
        assert_eq!(
            failure_line(Ended, false),
            Some(("Job/step already completing or completed", false))
        );
        assert_eq!(
            failure_line(Ended, true),
            Some(("Invalid job id specified", true))
        );
        assert_eq!(
            failure_line(Denied, false),
            Some(("Access/permission denied", true))
        );
        assert_eq!(failure_line(Unspecified, false), None);
    }

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(
            parse_signal("sigusr1").unwrap(),
            nix::sys::signal::Signal::SIGUSR1 as i32
        );
        assert_eq!(parse_signal("9").unwrap(), 9);
        assert!(parse_signal("BOGUS").is_err());
        assert!(parse_signal("999").is_err());
    }
}
