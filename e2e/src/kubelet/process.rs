//! Container processes: each container instance runs in its own process group, so signals
//! reach everything it started, the way a container runtime signals a whole container.

use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::task::JoinHandle;

use super::image::Launch;
use super::logs::LogStore;

/// How long an exit report waits for the container's output to be written.
const LOG_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Every process group this kubelet started and that may still be alive, so dropping the
/// kubelet can kill them all: a test that panics must not leave processes behind.
#[derive(Debug, Clone, Default)]
pub struct ProcessGroups(Arc<Mutex<HashSet<i32>>>);

impl ProcessGroups {
    fn insert(&self, pgid: i32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pgid);
    }

    fn remove(&self, pgid: i32) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pgid);
    }

    /// SIGKILLs every group still alive.
    pub fn kill_all(&self) {
        let groups: Vec<i32> = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for pgid in groups {
            signal_group(pgid, Signal::SIGKILL);
        }
    }
}

/// Sends a signal to a process group; a group that is already gone is not an error.
pub fn signal_group(pgid: i32, signal: Signal) {
    if let Err(e) = killpg(Pid::from_raw(pgid), signal)
        && e != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pgid, ?signal, error = %e, "signalling container process group failed");
    }
}

/// A started container instance.
#[derive(Debug)]
pub struct Started {
    /// The process id, which is also the group id.
    pub pid: i32,
    pub started_at: Timestamp,
    /// Resolves to the exit code (`128 + signal` for a signal) once the main process has
    /// exited and the rest of its group has been killed.
    pub exit: JoinHandle<i32>,
}

/// Where a container runs and what it is called, for logs and the environment.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub container: &'a str,
    /// The working directory (the pod's sandbox, or `workingDir` inside it).
    pub cwd: &'a Path,
}

/// Starts a container's process with exactly `env` (plus `PATH`, and `HOME`/`HOSTNAME` as
/// a runtime sets them), output captured into `logs`.
pub async fn start(
    launch: &Launch,
    env: &[(String, String)],
    target: Target<'_>,
    logs: &LogStore,
    groups: &ProcessGroups,
) -> std::io::Result<Started> {
    tokio::fs::create_dir_all(target.cwd).await?;
    let mut cmd = tokio::process::Command::new(&launch.program);
    cmd.arg0(&launch.arg0)
        .args(&launch.args)
        .current_dir(target.cwd)
        .env_clear()
        .env("PATH", image_path(launch))
        .env("HOME", target.cwd)
        .env("HOSTNAME", target.pod)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let started_at = Timestamp::now();
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("spawned process has no pid"))?;
    groups.insert(pid);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        signal_group(pid, Signal::SIGKILL);
        return Err(std::io::Error::other("spawned process has no output pipes"));
    };
    let captured = match logs
        .capture(
            target.namespace,
            target.pod,
            target.container,
            stdout,
            stderr,
        )
        .await
    {
        Ok(task) => task,
        Err(e) => {
            signal_group(pid, Signal::SIGKILL);
            return Err(e);
        }
    };
    let groups = groups.clone();
    let exit = tokio::spawn(async move {
        let status = child.wait().await;
        // The container ends with its main process: whatever it left running goes too,
        // as when a PID namespace's init exits.
        signal_group(pid, Signal::SIGKILL);
        groups.remove(pid);
        // Report the exit only once its output is in the log, as a container runtime
        // does, so a reader who sees the container terminated sees all it wrote. A process
        // that escaped the group may hold the pipes open: do not wait for it forever.
        let _ = tokio::time::timeout(LOG_DRAIN, captured).await;
        match status {
            Ok(s) => exit_code(s),
            Err(_) => 128 + Signal::SIGKILL as i32,
        }
    });
    Ok(Started {
        pid,
        started_at,
        exit,
    })
}

/// The `PATH` a container starts with: the image's directory (its `ENV PATH`), then the
/// host's, whose tools stand in for the image's base layers.
fn image_path(launch: &Launch) -> std::ffi::OsString {
    let host = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    match &launch.path {
        Some(dir) => {
            let mut path = dir.as_os_str().to_owned();
            path.push(":");
            path.push(host);
            path
        }
        None => host,
    }
}

/// The exit code a container runtime reports: the code, or 128 + the signal number.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn sh(script: &str) -> Launch {
        Launch {
            program: PathBuf::from("sh"),
            arg0: "sh".into(),
            args: vec!["-c".into(), script.into()],
            path: None,
        }
    }

    #[tokio::test]
    async fn exit_codes_env_and_group_kill() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogStore::new(dir.path().join("logs"));
        logs.register_pod("ns", "p", "u", vec!["c".into()]);
        let groups = ProcessGroups::default();
        let cwd = dir.path().join("sandbox");
        let target = Target {
            namespace: "ns",
            pod: "p",
            container: "c",
            cwd: &cwd,
        };
        let env = vec![("X".to_string(), "7".to_string())];
        let done = start(&sh("exit $X"), &env, target, &logs, &groups)
            .await
            .unwrap();
        assert_eq!(done.exit.await.unwrap(), 7);

        let long = start(&sh("sleep 30 & sleep 30"), &[], target, &logs, &groups)
            .await
            .unwrap();
        signal_group(long.pid, Signal::SIGTERM);
        assert_eq!(long.exit.await.unwrap(), 128 + 15);
        assert!(
            groups.0.lock().unwrap().is_empty(),
            "exited groups are forgotten"
        );
    }
}
