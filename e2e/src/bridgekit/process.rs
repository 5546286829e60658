//! Child processes of a bridge test (the controller, workers, bridges): started with their
//! output in a log file, and killed when dropped so a failed test leaves nothing behind.
//! Apart from [`super::BridgeEnv`] because benches start such processes without one.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a killed process may take to die before it is left behind.
const KILL_LIMIT: Duration = Duration::from_secs(10);

/// A child process, killed (SIGKILL) when dropped; its output is in a log file.
pub struct Proc(Child);

impl Proc {
    /// Kills the process now (SIGKILL, as a crash) and reaps it.
    pub fn kill(&mut self) {
        crate::bounded::kill_and_reap(&mut self.0, KILL_LIMIT);
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.0.try_wait(), Ok(None))
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `bin` with `args`, stdout and stderr to `log`.
pub fn spawn(bin: &Path, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cloning {}: {e}", log.display()));
    let mut c = Command::new(bin);
    c.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, v) in env {
        c.env(k, v);
    }
    Proc(
        c.spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
    )
}

/// A loopback port free right now (the controller is restarted on another if it is taken
/// before it binds).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("picking a free port: {e}"))
}
