//! Time limits and termination, as a pure state machine over instants.
//!
//! Slurm ends a job the same way whether its time ran out or it was cancelled: SIGTERM to
//! every process of the job, `KillWait` seconds of grace, then SIGKILL. [`Enforcer`] decides
//! *which* signal is due *when*; the supervisor (`launch::job`) owns the clock and the
//! process group and only applies what it is told, so the escalation is tested without
//! sleeping.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// Slurm's default `KillWait`.
pub const DEFAULT_KILL_WAIT: Duration = Duration::from_secs(30);

/// Why a job is being ended by the worker rather than by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndCause {
    TimeLimit,
    /// `SignalJob` with signal 0: a cancel or preemption.
    Cancel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// SIGTERM was sent; SIGKILL follows at `kill_at`.
    Terminating {
        kill_at: Instant,
    },
    /// SIGKILL was sent; nothing more to do but wait for the exit.
    Killed,
}

/// Decides the signals that end a job. All methods take `now`; none reads a clock.
#[derive(Debug, Clone)]
pub struct Enforcer {
    deadline: Option<Instant>,
    kill_wait: Duration,
    phase: Phase,
    timed_out: bool,
    cancelled: bool,
}

impl Enforcer {
    /// `time_limit` of `None` is UNLIMITED.
    pub fn new(started: Instant, time_limit: Option<Duration>, kill_wait: Duration) -> Self {
        Self {
            deadline: time_limit.map(|l| started + l),
            kill_wait,
            phase: Phase::Running,
            timed_out: false,
            cancelled: false,
        }
    }

    /// When [`Enforcer::on_tick`] must next be called, if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => self.deadline,
            Phase::Terminating { kill_at } => Some(kill_at),
            Phase::Killed => None,
        }
    }

    /// The signal to send to the job's process group at `now`, if one is due.
    pub fn on_tick(&mut self, now: Instant) -> Option<Signal> {
        match self.phase {
            Phase::Running => match self.deadline {
                Some(d) if now >= d => self.terminate(now, EndCause::TimeLimit),
                _ => None,
            },
            Phase::Terminating { kill_at } if now >= kill_at => {
                self.phase = Phase::Killed;
                Some(Signal::SIGKILL)
            }
            _ => None,
        }
    }

    /// Starts ending the job. A second request while already ending changes nothing (the
    /// first cause is the one reported), except that it never delays a pending SIGKILL.
    pub fn terminate(&mut self, now: Instant, cause: EndCause) -> Option<Signal> {
        if self.phase != Phase::Running {
            return None;
        }
        match cause {
            EndCause::TimeLimit => self.timed_out = true,
            EndCause::Cancel => self.cancelled = true,
        }
        if self.kill_wait.is_zero() {
            self.phase = Phase::Killed;
            return Some(Signal::SIGKILL);
        }
        self.phase = Phase::Terminating {
            kill_at: now + self.kill_wait,
        };
        Some(Signal::SIGTERM)
    }

    /// Ends the job now, without grace (the controller abandoned it, or the worker stops).
    pub fn kill_now(&mut self) -> Option<Signal> {
        if self.phase == Phase::Killed {
            return None;
        }
        self.phase = Phase::Killed;
        Some(Signal::SIGKILL)
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    pub fn cancelled(&self) -> bool {
        self.cancelled
    }
}

/// How a process ended, in Slurm's `ExitCode` terms (`code:signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitReport {
    /// Exit status when the process exited; 0 when a signal killed it.
    pub exit_code: i32,
    /// Signal that killed the process, 0 if none.
    pub signal: i32,
}

impl ExitReport {
    pub fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(code), _) => Self {
                exit_code: code,
                signal: 0,
            },
            (None, Some(sig)) => Self {
                exit_code: 0,
                signal: sig,
            },
            // Neither code nor signal (a stopped process reported as ended): call it failed.
            (None, None) => Self {
                exit_code: 1,
                signal: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn time_limit_sends_term_then_kill_after_kill_wait() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, Some(60 * SEC), 30 * SEC);
        assert_eq!(e.next_wakeup(), Some(t0 + 60 * SEC));
        assert_eq!(e.on_tick(t0 + 59 * SEC), None, "early tick does nothing");
        assert_eq!(e.on_tick(t0 + 60 * SEC), Some(Signal::SIGTERM));
        assert!(e.timed_out());
        assert_eq!(e.next_wakeup(), Some(t0 + 90 * SEC));
        assert_eq!(e.on_tick(t0 + 89 * SEC), None);
        assert_eq!(e.on_tick(t0 + 90 * SEC), Some(Signal::SIGKILL));
        assert_eq!(e.next_wakeup(), None);
        assert_eq!(e.on_tick(t0 + 200 * SEC), None, "SIGKILL is sent once");
    }

    #[test]
    fn unlimited_job_never_wakes() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, None, 30 * SEC);
        assert_eq!(e.next_wakeup(), None);
        assert_eq!(e.on_tick(t0 + 1_000_000 * SEC), None);
        assert!(!e.timed_out());
    }

    #[test]
    fn cancel_escalates_like_a_timeout_but_reports_cancelled() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, Some(60 * SEC), 5 * SEC);
        assert_eq!(
            e.terminate(t0 + SEC, EndCause::Cancel),
            Some(Signal::SIGTERM)
        );
        assert!(e.cancelled() && !e.timed_out());
        // The time limit passing during the grace neither re-sends TERM nor flips the cause.
        assert_eq!(e.on_tick(t0 + 4 * SEC), None);
        assert_eq!(e.terminate(t0 + 4 * SEC, EndCause::TimeLimit), None);
        assert!(!e.timed_out());
        assert_eq!(e.on_tick(t0 + 6 * SEC), Some(Signal::SIGKILL));
    }

    #[test]
    fn zero_kill_wait_kills_at_once() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, Some(SEC), Duration::ZERO);
        assert_eq!(e.on_tick(t0 + SEC), Some(Signal::SIGKILL));
        assert!(e.timed_out());
        assert_eq!(e.next_wakeup(), None);
    }

    #[test]
    fn kill_now_skips_the_grace_once() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, None, 30 * SEC);
        assert_eq!(e.terminate(t0, EndCause::Cancel), Some(Signal::SIGTERM));
        assert_eq!(e.kill_now(), Some(Signal::SIGKILL));
        assert_eq!(e.kill_now(), None);
        assert_eq!(e.on_tick(t0 + 60 * SEC), None);
    }

    #[test]
    fn exit_report_separates_code_and_signal() {
        // Raw wait statuses: exit code in the high byte, terminating signal in the low bits.
        assert_eq!(
            ExitReport::from_status(ExitStatus::from_raw(3 << 8)),
            ExitReport {
                exit_code: 3,
                signal: 0
            }
        );
        assert_eq!(
            ExitReport::from_status(ExitStatus::from_raw(9)),
            ExitReport {
                exit_code: 0,
                signal: 9
            }
        );
        // A shell that exited 143 after its child got SIGTERM exited normally.
        assert_eq!(
            ExitReport::from_status(ExitStatus::from_raw(143 << 8)).exit_code,
            143
        );
    }
}
