//! `sbatch`: submit a batch script.
//!
//! Order of work: read the script, parse its `#SBATCH` lines, merge the command line over
//! them, validate, and only then talk to the controller. The submit carries a random
//! idempotency key, so retrying after a lost connection cannot create the job twice.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use backon::{ExponentialBuilder, Retryable as _};
use clap::Parser;
use tandem_proto::v1::{JobRef, JobState, SubmitRequest, WatchJobRequest};

use crate::Exit;
use crate::client::{Client, RpcResult as _, status_error};
use crate::opts::{JobOpts, SubmitContext, wrap_script};
use crate::{clock, directives};

/// Submit a batch script to the cluster.
#[derive(Debug, Parser)]
#[command(name = "sbatch", version, infer_long_args = true)]
pub struct Args {
    #[command(flatten)]
    pub opts: JobOpts,
    /// The batch script, then arguments passed to it (stdin when absent).
    #[arg(value_name = "SCRIPT [ARGS]", trailing_var_arg = true)]
    pub script: Vec<String>,
}

/// A script ready to submit: its text, arguments, default name and merged options.
#[derive(Debug)]
pub struct Prepared {
    pub opts: JobOpts,
    pub script: String,
    /// The file the script came from, as `Command` shows it; empty for `--wrap` and stdin.
    pub script_path: String,
    pub argv: Vec<String>,
    pub default_name: String,
}

/// Reads the script and merges its directives under the command-line options. `cwd` is
/// where a script named without a `/` is looked for first (then `PATH` from `env`).
pub fn prepare(args: Args, env: &[(String, String)], cwd: &Path) -> anyhow::Result<Prepared> {
    let Args { opts, script } = args;
    let mut words = script.into_iter();
    let (text, script_path, default_name, argv) = match (&opts.wrap, words.next()) {
        (Some(_), Some(extra)) => {
            bail!("--wrap takes no script file, but {extra:?} was given")
        }
        (Some(cmd), None) => (
            wrap_script(cmd),
            String::new(),
            "wrap".to_string(),
            Vec::new(),
        ),
        (None, Some(name)) => {
            let path_var = env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.as_str());
            let path = locate_script(&name, cwd, path_var);
            let text = crate::client::read_file(&path)?;
            let base = Path::new(&name)
                .file_name()
                .map_or_else(|| name.clone(), |n| n.to_string_lossy().into_owned());
            (
                text,
                path.to_string_lossy().into_owned(),
                base,
                words.collect(),
            )
        }
        (None, None) => {
            let mut stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!("no batch script given: name a script file, pipe one in, or use --wrap");
            }
            let mut text = String::new();
            stdin
                .read_to_string(&mut text)
                .context("reading the batch script from standard input")?;
            (text, String::new(), "sbatch".to_string(), Vec::new())
        }
    };
    let from_script = if opts.wrap.is_some() {
        JobOpts::default()
    } else {
        JobOpts::from_directives(&directives::parse(&text)?)?
    };
    Ok(Prepared {
        opts: from_script.merge(JobOpts::from_env(env)?).merge(opts),
        script: text,
        script_path,
        argv,
        default_name,
    })
}

/// Where sbatch reads a script from, as Slurm's sbatch finds it: a name with a `/` as
/// given; a bare name in the working directory, else in the first `PATH` directory that
/// has it (`sbatch myjob.sh` runs the installed `myjob.sh` from anywhere). Found in neither,
/// the name as given, whose read then fails with the usual message.
pub fn locate_script(name: &str, cwd: &Path, path_var: Option<&str>) -> PathBuf {
    if name.contains('/') {
        return PathBuf::from(name);
    }
    std::iter::once(cwd)
        .chain(
            path_var
                .unwrap_or_default()
                .split(':')
                .filter(|d| !d.is_empty())
                .map(Path::new),
        )
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The caller's side of a submit: environment, directory, host, clock.
pub fn submit_context() -> anyhow::Result<SubmitContext> {
    let cwd: PathBuf = std::env::current_dir().context("cannot read the current directory")?;
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    // Slurm's sbatch puts its own scheduling priority (nice value) into the environment it
    // sends, so the job sees it under every `--export` (a `SLURM_` variable).
    if let Ok(nice) = rustix::process::getpriority_process(None) {
        env.push(("SLURM_PRIO_PROCESS".into(), nice.to_string()));
    }
    Ok(SubmitContext {
        env,
        cwd,
        hostname: crate::client::hostname(),
        sid: nix::unistd::getsid(None).map_or(0, |s| u32::try_from(s.as_raw()).unwrap_or(0)),
        umask: crate::client::umask(),
        now: clock::now(),
        utc_offset_s: None,
    })
}

pub async fn run(args: Args) -> Exit {
    let ctx = submit_context()?;
    let mut prepared = prepare(args, &ctx.env, &ctx.cwd)?;
    for line in prepared
        .opts
        .settle_node_count(crate::opts::NodelistOverflow::Refuse)?
    {
        eprintln!("sbatch: {line}");
    }
    let mut spec =
        prepared
            .opts
            .to_spec(prepared.script, prepared.argv, &prepared.default_name, &ctx)?;
    spec.script_path = std::mem::take(&mut prepared.script_path);
    let mut client = Client::connect().await?;
    if prepared.opts.test_only {
        return test_only(&mut client, spec).await;
    }
    spec.idempotency_key = idempotency_key()?;
    let resp = submit_with_retry(&mut client, spec).await?;
    for w in &resp.warnings {
        eprintln!("sbatch: warning: {w}");
    }
    if prepared.opts.parsable {
        // Slurm adds ";cluster" only when talking to a cluster other than the local one.
        if resp.cluster.is_empty() || resp.cluster == client.cluster_name {
            println!("{}", resp.job_id);
        } else {
            println!("{};{}", resp.job_id, resp.cluster);
        }
    } else {
        println!("Submitted batch job {}", resp.job_id);
    }
    if prepared.opts.wait {
        return wait_for(&mut client, resp.job_id).await;
    }
    Ok(0)
}

/// `--test-only`: when and where the job would start, in Slurm's words on stderr; nothing
/// is submitted. A refusal is an "allocation failure", as Slurm's will-run test says it.
async fn test_only(client: &mut Client, spec: tandem_proto::v1::JobSpec) -> Exit {
    let req = SubmitRequest { spec: Some(spec) };
    let w = match client.jobs.will_run(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            eprintln!("allocation failure: {}", capitalized(s.message()));
            return Ok(1);
        }
        Err(s) => return Err(status_error(s)),
    };
    eprintln!(
        "sbatch: Job {} to start at {} using {} processors on nodes {} in partition {}",
        w.job_id,
        crate::format::view::timestamp(Some(w.start_time), crate::clock::local_utc_offset()),
        w.cpus,
        w.nodes,
        w.partition
    );
    Ok(0)
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Pauses between submit attempts: 50 ms, doubling up to 1 s, for as long as
/// [`submit_with_retry`]'s deadline allows.
const SUBMIT_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(Duration::from_millis(50))
    .with_max_delay(Duration::from_secs(1))
    .with_factor(2.0)
    .without_max_times();

/// Retries only transport failures, for a short while, with the same idempotency key: the
/// controller may have committed the first attempt before the connection broke.
async fn submit_with_retry(
    client: &mut Client,
    spec: tandem_proto::v1::JobSpec,
) -> anyhow::Result<tandem_proto::v1::SubmitResponse> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let jobs = &client.jobs;
    let submit = || {
        let mut jobs = jobs.clone();
        let req = SubmitRequest {
            spec: Some(spec.clone()),
        };
        async move { jobs.submit(req).await }
    };
    submit
        .retry(SUBMIT_BACKOFF)
        .when(|s: &tonic::Status| s.code() == tonic::Code::Unavailable)
        // A pause that would end past the deadline is not taken: the last error stands.
        .adjust(|_, pause| pause.filter(|p| tokio::time::Instant::now() + *p < deadline))
        .await
        .map(tonic::Response::into_inner)
        .map_err(status_error)
}

/// `--wait`: follow the job until it ends and exit with its exit code (1 if it ended
/// without one, e.g. cancelled).
pub async fn wait_for(client: &mut Client, job_id: u64) -> Exit {
    let mut stream = client
        .jobs
        .watch_job(WatchJobRequest {
            job: Some(JobRef {
                job_id,
                array_tasks: String::new(),
            }),
        })
        .await
        .rpc()?;
    let mut last = None;
    while let Some(info) = stream.message().await.map_err(status_error)? {
        last = Some(info);
    }
    let Some(info) = last else {
        bail!("lost track of job {job_id}");
    };
    Ok(exit_status_of(info.state(), info.exit_code))
}

/// The process exit status that reports a finished job.
pub fn exit_status_of(state: JobState, exit_code: i32) -> u8 {
    match (state, exit_code) {
        (JobState::Completed, 0) => 0,
        (_, code) if code > 0 => u8::try_from(code.min(255)).unwrap_or(1),
        _ => 1,
    }
}

fn idempotency_key() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses the hand-written doubling took before backon: 50 ms, 100, ... up to 1 s,
    /// never running out (the deadline ends the retries).
    #[test]
    fn submit_pauses_double_from_50_ms_to_1_s() {
        use backon::BackoffBuilder as _;
        // backon multiplies in f32: 20 ms doubled is 39.999999 ms, not 40 (the timer
        // rounds to whole milliseconds anyway).
        let got: Vec<std::time::Duration> = SUBMIT_BACKOFF.build().take(8).collect();
        let want = [50, 100, 200, 400, 800, 1000, 1000, 1000].map(std::time::Duration::from_millis);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.abs_diff(w) < std::time::Duration::from_micros(1),
                "{got:?}"
            );
        }
        assert_eq!(SUBMIT_BACKOFF.build().take(1000).count(), 1000);
    }

    #[test]
    fn a_script_is_found_as_slurm_finds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (cwd, bin) = (tmp.path().join("work"), tmp.path().join("bin"));
        for d in [&cwd, &bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(bin.join("installed.sh"), "#!/bin/sh\n").unwrap();
        std::fs::write(bin.join("both.sh"), "#!/bin/sh\n").unwrap();
        std::fs::write(cwd.join("both.sh"), "#!/bin/sh\n").unwrap();
        // A directory of the same name on PATH is not a script.
        std::fs::create_dir_all(tmp.path().join("other/installed.sh")).unwrap();
        let path = format!("::{}:{}", tmp.path().join("other").display(), bin.display());
        let find = |name: &str| locate_script(name, &cwd, Some(&path));

        // The working directory wins over PATH; both give an absolute path.
        assert_eq!(find("both.sh"), cwd.join("both.sh"));
        assert_eq!(find("installed.sh"), bin.join("installed.sh"));
        // A name with a slash is taken as typed, even when PATH has the base name.
        assert_eq!(find("./installed.sh"), PathBuf::from("./installed.sh"));
        assert_eq!(find("sub/both.sh"), PathBuf::from("sub/both.sh"));
        // Nowhere: the name itself, so that reading it reports the name the user typed.
        assert_eq!(find("missing.sh"), PathBuf::from("missing.sh"));
        assert_eq!(
            locate_script("installed.sh", &cwd, None),
            PathBuf::from("installed.sh")
        );
    }
}
