//! Outside an allocation srun makes its own: a job whose batch script (the holder) keeps
//! the nodes while the step runs, then ends COMPLETED or FAILED by a signal from srun, as
//! Slurm's srun leaves such a job in sacct.

use anyhow::bail;
use backon::{BackoffBuilder as _, ExponentialBuilder};
use tandem_proto::v1::{CancelRequest, JobRef, JobState, ListJobsRequest, SubmitRequest};

use super::layout::resolve_layout;
use super::{Allocation, Args, run_step};
use crate::Exit;
use crate::client::{Client, RpcResult as _};

/// The batch script of an allocation made by srun: it holds the nodes until srun signals
/// it, then ends COMPLETED (URG: the step succeeded) or FAILED (WINCH: it did not), so sacct
/// tells the two apart as Slurm's does. Both signals are ignored by default, so one that
/// arrives before the shell has read its `trap` lines is lost rather than fatal (a
/// `USR1` there ended the job FAILED, killed by the signal); srun sends it again until the
/// job is over.
const HOLDER_SCRIPT: &str = "#!/bin/sh\n\
# Holds the allocation for srun's step; srun signals the end.\n\
trap 'kill $! 2>/dev/null; exit 0' URG\n\
trap 'kill $! 2>/dev/null; exit 1' WINCH\n\
while :; do sleep 3600 & wait $!; done\n";

/// How long srun keeps signalling the holder before it cancels the job outright.
const RELEASE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Pauses between signals to the holder: 10 ms, doubling up to 200 ms, until
/// [`RELEASE_DEADLINE`].
const RELEASE_BACKOFF: ExponentialBuilder = ExponentialBuilder::new()
    .with_min_delay(std::time::Duration::from_millis(10))
    .with_max_delay(std::time::Duration::from_millis(200))
    .with_factor(2.0)
    .without_max_times();

/// Outside an allocation: a job whose batch script holds the allocation while the step
/// runs, ended through a signal when the step is over.
pub(super) async fn run_with_allocation(client: &mut Client, args: &Args) -> Exit {
    let ctx = crate::cmd::sbatch::submit_context()?;
    let name = args
        .command
        .first()
        .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
        .unwrap_or_else(|| "srun".to_string());
    // The job is shaped by the options as srun settles them: `-N2 -n3 --ntasks-per-node=2`
    // asks Slurm for 3 CPUs (`2,1`), not 2 on each node.
    let (layout, _) = resolve_layout(&args.opts, &ctx.env, Allocation::MadeHere);
    let mut opts = args.opts.clone();
    if let Some(range) = opts.nodes.as_mut()
        && layout.nodes > 0
        && layout.nodes < range.min
    {
        range.min = layout.nodes;
        range.max = layout.nodes;
    }
    if layout.ntasks_per_node == 0 {
        opts.ntasks_per_node = None;
    }
    let mut spec = opts.to_spec(HOLDER_SCRIPT.to_string(), Vec::new(), &name, &ctx)?;
    // Slurm shows the program as the job's `Command` (`srun sleep 3`: `sleep`).
    spec.script_path = args.command.first().cloned().unwrap_or_default();
    let resp = client
        .jobs
        .submit(SubmitRequest { spec: Some(spec) })
        .await
        .rpc()?;
    let job_id = resp.job_id;
    let result = async {
        if wait_running(client, job_id).await? {
            eprintln!("srun: job {job_id} has been allocated resources");
        }
        run_step(client, job_id, args, Allocation::MadeHere).await
    }
    .await;
    release_allocation(client, job_id, matches!(result, Ok(0))).await;
    result
}

/// Ends the holder job: a signal to its script, repeated until the job is over (the first
/// can land before the shell has set its traps), then a plain cancel if it lingers.
async fn release_allocation(client: &mut Client, job_id: u64, success: bool) {
    let job = || JobRef {
        job_id,
        array_tasks: String::new(),
    };
    let signal = if success {
        nix::sys::signal::Signal::SIGURG
    } else {
        nix::sys::signal::Signal::SIGWINCH
    };
    let deadline = tokio::time::Instant::now() + RELEASE_DEADLINE;
    for pause in RELEASE_BACKOFF.build() {
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let _ = client
            .jobs
            .cancel(CancelRequest {
                jobs: vec![job()],
                signal: signal as i32,
                batch_only: true,
                ..CancelRequest::default()
            })
            .await;
        tokio::time::sleep(pause).await;
        let done = client
            .jobs
            .list_jobs(ListJobsRequest {
                jobs: vec![job()],
                include_finished: true,
                ..ListJobsRequest::default()
            })
            .await
            .map(|r| {
                r.into_inner()
                    .jobs
                    .first()
                    .is_none_or(|j| !matches!(j.state(), JobState::Pending | JobState::Running))
            })
            .unwrap_or(false);
        if done {
            return;
        }
    }
    let _ = client
        .jobs
        .cancel(CancelRequest {
            jobs: vec![job()],
            ..CancelRequest::default()
        })
        .await;
}

/// Waits until the job runs; true if it had to wait (so srun says when it got its nodes).
async fn wait_running(client: &mut Client, job_id: u64) -> anyhow::Result<bool> {
    let mut said = false;
    loop {
        let resp = client
            .jobs
            .list_jobs(ListJobsRequest {
                jobs: vec![JobRef {
                    job_id,
                    array_tasks: String::new(),
                }],
                include_finished: true,
                ..ListJobsRequest::default()
            })
            .await
            .rpc()?;
        let Some(job) = resp.jobs.first() else {
            bail!("job {job_id} vanished");
        };
        match job.state() {
            JobState::Running => return Ok(said),
            JobState::Pending => {
                if !said {
                    eprintln!("srun: job {job_id} queued and waiting for resources");
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            other => bail!(
                "job {job_id} ended before it started: {}",
                crate::format::view::state_name(other)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses the hand-written doubling took before backon: 10 ms, 20, ... up to 200
    /// ms, never running out (the deadline ends the loop).
    #[test]
    fn release_pauses_double_from_10_to_200_ms() {
        // backon multiplies in f32: 20 ms doubled is 39.999999 ms, not 40 (the timer
        // rounds to whole milliseconds anyway).
        let got: Vec<std::time::Duration> = RELEASE_BACKOFF.build().take(7).collect();
        let want = [10, 20, 40, 80, 160, 200, 200].map(std::time::Duration::from_millis);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                g.abs_diff(w) < std::time::Duration::from_micros(1),
                "{got:?}"
            );
        }
        assert_eq!(RELEASE_BACKOFF.build().take(1000).count(), 1000);
    }

    /// Starts the holder script and signals it at once, before the shell can have read its
    /// traps, then again every few milliseconds as `release_allocation` does: the script
    /// must end with the step's verdict, never killed by the signal.
    fn holder_ends_with(signal: nix::sys::signal::Signal) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(HOLDER_SCRIPT)
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        for _ in 0..500 {
            let _ = nix::sys::signal::kill(pid, signal);
            if let Some(status) = child.try_wait().unwrap() {
                assert_eq!(status.signal(), None, "the holder died of {signal}");
                return status;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        panic!("the holder outlived {signal} sent for 2.5 s");
    }

    #[test]
    fn the_holder_takes_its_verdict_even_before_it_set_its_traps() {
        for _ in 0..5 {
            assert_eq!(
                holder_ends_with(nix::sys::signal::Signal::SIGURG).code(),
                Some(0)
            );
            assert_eq!(
                holder_ends_with(nix::sys::signal::Signal::SIGWINCH).code(),
                Some(1)
            );
        }
    }
}
