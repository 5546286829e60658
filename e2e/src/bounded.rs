//! Bounds on the harness's own waits for processes and requests. A component that stops
//! answering (a CLI call to a wedged controller, a list from a stuck API server, a process
//! that cannot die) fails the test that waited for it, saying what it waited for, instead of
//! hanging the whole suite until CI gives up on it.

use std::future::Future;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long one CLI call or one API request of the harness may take: far beyond any
/// healthy answer, short of the suite's own deadline.
pub const CALL_LIMIT: Duration = Duration::from_secs(60);

/// Runs `cmd` to its end with stdout and stderr captured; kills it (SIGKILL) once `limit`
/// has passed and says so.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", cmd.get_program()))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    // `wait_with_output` reads both pipes to their ends and reaps; the kill below ends it.
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.map_err(|e| format!("waiting for {:?}: {e}", cmd.get_program())),
        Err(_) => {
            // Not reaped yet (the thread is still waiting for it), so the pid is still this
            // child's and cannot name another process.
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            Err(format!(
                "{:?} {:?} gave no answer within {} s (killed)",
                cmd.get_program(),
                cmd.get_args().collect::<Vec<_>>(),
                limit.as_secs()
            ))
        }
    }
}

/// `fut`'s output, or an error naming `what` if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> Result<F::Output, String> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what}: no answer within {} s", limit.as_secs()))
}

/// Kills `child` (SIGKILL) and reaps it, waiting at most `limit`. A process the kernel
/// holds (uninterruptible sleep, a frozen cgroup) cannot act on SIGKILL until released;
/// it is left behind with a message rather than hanging the test. Whether it was reaped.
pub fn kill_and_reap(child: &mut Child, limit: Duration) -> bool {
    let _ = child.kill();
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => {
                eprintln!(
                    "process {} did not die within {} s of SIGKILL; left behind ({})",
                    child.id(),
                    limit.as_secs(),
                    crate::watchdog::describe_process(child.id())
                );
                return false;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_answers_gives_its_output() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            CALL_LIMIT,
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn a_command_that_hangs_is_killed_and_named() {
        let started = Instant::now();
        let err =
            output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
        assert!(err.contains("sleep") && err.contains("no answer"), "{err}");
    }

    #[test]
    fn a_killed_child_is_reaped() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(kill_and_reap(&mut child, Duration::from_secs(10)));
        assert!(child.try_wait().unwrap().is_some());
    }

    #[tokio::test]
    async fn a_future_past_its_limit_is_an_error() {
        let slow = tokio::time::sleep(Duration::from_secs(30));
        let err = within(Duration::from_millis(50), "the slow one", slow)
            .await
            .unwrap_err();
        assert!(err.starts_with("the slow one: no answer"), "{err}");
        assert_eq!(within(CALL_LIMIT, "quick", async { 7 }).await, Ok(7));
    }
}
