//! Time limits and termination, as a pure state machine over instants.
//!
//! Slurm ends a job the same way whether its time ran out or it was cancelled: SIGTERM to
//! every process of the job, `KillWait` seconds of grace, then SIGKILL. A job may also ask
//! for a warning signal some seconds before its time limit (`--signal`), to checkpoint.
//!
//! A preempted job whose QOS has a `GraceTime` gets that ending late: SIGTERM at once as
//! notice, then, once the grace has passed, the usual SIGTERM, `KillWait`, SIGKILL (Slurm
//! moves the job's end time to now + GraceTime and ends it there). A time limit or a
//! cancel that falls inside the grace brings the end forward; nothing delays it.
//! [`Enforcer`] decides *which* signal is due *when*; the supervisor (`crate::jobs`) owns
//! the clock and the process group and only applies what it is told, so the escalation is
//! tested without sleeping.

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
    /// SIGTERM was sent as notice (preemption with a grace time); the usual end begins at
    /// `end_at`.
    Notified {
        end_at: Instant,
    },
    /// SIGTERM was sent; SIGKILL follows at `kill_at`.
    Terminating {
        kill_at: Instant,
    },
    /// SIGKILL was sent; nothing more to do but wait for the exit.
    Killed,
}

/// `--signal`: what to send ahead of the time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warning {
    pub signal: Signal,
    pub before: Duration,
    /// Only the batch shell, not every process of the job.
    pub batch_only: bool,
}

/// Who gets a signal that is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every process of the job: its process group and its steps.
    Job,
    /// The batch shell alone (`--signal=B:`).
    BatchShell,
    /// The job's steps (`srun` tasks) but not the batch script's own processes: Slurm's
    /// `--signal` without `B:`. A shell that does not trap the signal must not die of it,
    /// and an `srun` client killed by it would cut its step's output.
    Steps,
}

/// A signal the supervisor must deliver now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub signal: Signal,
    pub to: Target,
}

impl Due {
    fn job(signal: Signal) -> Self {
        Self {
            signal,
            to: Target::Job,
        }
    }
}

/// Decides the signals that end a job. All methods take `now`; none reads a clock.
#[derive(Debug, Clone)]
pub struct Enforcer {
    deadline: Option<Instant>,
    kill_wait: Duration,
    phase: Phase,
    timed_out: bool,
    cancelled: bool,
    /// The `--signal` warning and when it is due; `None` once sent, or if there is none
    /// (or no time limit to count back from).
    warning: Option<(Instant, Warning)>,
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
            warning: None,
        }
    }

    /// Adds a `--signal` warning. A lead time longer than the whole limit sends it at once.
    pub fn with_warning(mut self, started: Instant, warning: Option<Warning>) -> Self {
        self.warning = match (self.deadline, warning) {
            (Some(deadline), Some(w)) => {
                let at = deadline
                    .checked_sub(w.before)
                    .unwrap_or(started)
                    .max(started);
                Some((at, w))
            }
            _ => None,
        };
        self
    }

    /// When [`Enforcer::on_tick`] must next be called, if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => match (self.warning, self.deadline) {
                (Some((at, _)), Some(d)) => Some(at.min(d)),
                (None, d) => d,
                (Some((at, _)), None) => Some(at),
            },
            // The time limit still holds during a preemption grace.
            Phase::Notified { end_at } => Some(self.deadline.map_or(end_at, |d| d.min(end_at))),
            Phase::Terminating { kill_at } => Some(kill_at),
            Phase::Killed => None,
        }
    }

    /// The signal due at `now`, if any. One per call: when the warning and the time limit
    /// fall due together the warning goes first, and [`Enforcer::next_wakeup`] is already
    /// past for the rest.
    pub fn on_tick(&mut self, now: Instant) -> Option<Due> {
        match self.phase {
            Phase::Running => {
                if let Some((at, w)) = self.warning
                    && now >= at
                {
                    self.warning = None;
                    return Some(Due {
                        signal: w.signal,
                        to: if w.batch_only {
                            Target::BatchShell
                        } else {
                            Target::Steps
                        },
                    });
                }
                match self.deadline {
                    Some(d) if now >= d => self
                        .terminate(now, EndCause::TimeLimit, Duration::ZERO)
                        .map(Due::job),
                    _ => None,
                }
            }
            Phase::Notified { end_at }
                if now >= end_at || self.deadline.is_some_and(|d| now >= d) =>
            {
                Some(Due::job(self.end(now)))
            }
            Phase::Terminating { kill_at } if now >= kill_at => {
                self.phase = Phase::Killed;
                Some(Due::job(Signal::SIGKILL))
            }
            _ => None,
        }
    }

    /// Starts ending the job: SIGTERM, `KillWait`, SIGKILL, or with a `grace` first a
    /// SIGTERM as notice and that sequence only when the grace has passed.
    ///
    /// A second request changes nothing (the first cause is the one reported), except that
    /// one with an earlier end cuts a running grace short: a cancel during a preemption
    /// grace ends the job now. Nothing delays an end already set.
    pub fn terminate(&mut self, now: Instant, cause: EndCause, grace: Duration) -> Option<Signal> {
        match self.phase {
            Phase::Running => {
                match cause {
                    EndCause::TimeLimit => self.timed_out = true,
                    EndCause::Cancel => self.cancelled = true,
                }
                if grace.is_zero() {
                    Some(self.end(now))
                } else {
                    self.phase = Phase::Notified {
                        end_at: now + grace,
                    };
                    Some(Signal::SIGTERM)
                }
            }
            Phase::Notified { end_at } if now + grace < end_at => {
                if grace.is_zero() {
                    Some(self.end(now))
                } else {
                    self.phase = Phase::Notified {
                        end_at: now + grace,
                    };
                    None
                }
            }
            _ => None,
        }
    }

    /// The usual end from `now`: SIGTERM now and SIGKILL after `KillWait`, or SIGKILL at
    /// once when there is no wait.
    fn end(&mut self, now: Instant) -> Signal {
        if self.kill_wait.is_zero() {
            self.phase = Phase::Killed;
            return Signal::SIGKILL;
        }
        self.phase = Phase::Terminating {
            kill_at: now + self.kill_wait,
        };
        Signal::SIGTERM
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
        assert_eq!(e.on_tick(t0 + 60 * SEC), Some(Due::job(Signal::SIGTERM)));
        assert!(e.timed_out());
        assert_eq!(e.next_wakeup(), Some(t0 + 90 * SEC));
        assert_eq!(e.on_tick(t0 + 89 * SEC), None);
        assert_eq!(e.on_tick(t0 + 90 * SEC), Some(Due::job(Signal::SIGKILL)));
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
            e.terminate(t0 + SEC, EndCause::Cancel, Duration::ZERO),
            Some(Signal::SIGTERM)
        );
        assert!(e.cancelled() && !e.timed_out());
        // The time limit passing during the grace neither re-sends TERM nor flips the cause.
        assert_eq!(e.on_tick(t0 + 4 * SEC), None);
        assert_eq!(
            e.terminate(t0 + 4 * SEC, EndCause::TimeLimit, Duration::ZERO),
            None
        );
        assert!(!e.timed_out());
        assert_eq!(e.on_tick(t0 + 6 * SEC), Some(Due::job(Signal::SIGKILL)));
    }

    /// Slurm's preemption GraceTime: notice at once, the usual end only after the grace,
    /// so SIGKILL comes at preemption + grace + KillWait.
    #[test]
    fn preemption_grace_delays_the_end_by_the_grace() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, None, 5 * SEC);
        assert_eq!(
            e.terminate(t0, EndCause::Cancel, 30 * SEC),
            Some(Signal::SIGTERM),
            "SIGTERM at once, as notice"
        );
        assert!(e.cancelled());
        assert_eq!(e.next_wakeup(), Some(t0 + 30 * SEC));
        assert_eq!(e.on_tick(t0 + 29 * SEC), None, "still in its grace");
        assert_eq!(e.on_tick(t0 + 30 * SEC), Some(Due::job(Signal::SIGTERM)));
        assert_eq!(e.next_wakeup(), Some(t0 + 35 * SEC));
        assert_eq!(e.on_tick(t0 + 34 * SEC), None);
        assert_eq!(e.on_tick(t0 + 35 * SEC), Some(Due::job(Signal::SIGKILL)));
        assert_eq!(e.next_wakeup(), None);
    }

    #[test]
    fn grace_never_outlasts_the_time_limit_or_a_later_cancel() {
        let t0 = Instant::now();
        // The time limit falls inside the grace: the end starts there.
        let mut e = Enforcer::new(t0, Some(60 * SEC), 5 * SEC);
        assert_eq!(
            e.terminate(t0 + 50 * SEC, EndCause::Cancel, 30 * SEC),
            Some(Signal::SIGTERM)
        );
        assert_eq!(e.next_wakeup(), Some(t0 + 60 * SEC));
        assert_eq!(e.on_tick(t0 + 60 * SEC), Some(Due::job(Signal::SIGTERM)));
        assert!(e.cancelled() && !e.timed_out(), "the first cause stays");
        assert_eq!(e.on_tick(t0 + 65 * SEC), Some(Due::job(Signal::SIGKILL)));

        // A cancel during the grace ends the job now; a longer grace changes nothing.
        let mut e = Enforcer::new(t0, None, 5 * SEC);
        e.terminate(t0, EndCause::Cancel, 30 * SEC);
        assert_eq!(e.terminate(t0 + SEC, EndCause::Cancel, 60 * SEC), None);
        assert_eq!(e.next_wakeup(), Some(t0 + 30 * SEC));
        assert_eq!(
            e.terminate(t0 + 2 * SEC, EndCause::Cancel, Duration::ZERO),
            Some(Signal::SIGTERM)
        );
        assert_eq!(e.next_wakeup(), Some(t0 + 7 * SEC));

        // With no KillWait the grace ends in SIGKILL.
        let mut e = Enforcer::new(t0, None, Duration::ZERO);
        assert_eq!(
            e.terminate(t0, EndCause::Cancel, 3 * SEC),
            Some(Signal::SIGTERM)
        );
        assert_eq!(e.on_tick(t0 + 3 * SEC), Some(Due::job(Signal::SIGKILL)));
    }

    #[test]
    fn zero_kill_wait_kills_at_once() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, Some(SEC), Duration::ZERO);
        assert_eq!(e.on_tick(t0 + SEC), Some(Due::job(Signal::SIGKILL)));
        assert!(e.timed_out());
        assert_eq!(e.next_wakeup(), None);
    }

    #[test]
    fn kill_now_skips_the_grace_once() {
        let t0 = Instant::now();
        let mut e = Enforcer::new(t0, None, 30 * SEC);
        assert_eq!(
            e.terminate(t0, EndCause::Cancel, Duration::ZERO),
            Some(Signal::SIGTERM)
        );
        assert_eq!(e.kill_now(), Some(Signal::SIGKILL));
        assert_eq!(e.kill_now(), None);
        assert_eq!(e.on_tick(t0 + 60 * SEC), None);
    }

    #[test]
    fn warning_goes_out_once_ahead_of_the_limit_then_the_limit_applies() {
        let t0 = Instant::now();
        let usr1 = Warning {
            signal: Signal::SIGUSR1,
            before: 20 * SEC,
            batch_only: true,
        };
        let mut e = Enforcer::new(t0, Some(60 * SEC), 30 * SEC).with_warning(t0, Some(usr1));
        assert_eq!(e.next_wakeup(), Some(t0 + 40 * SEC));
        assert_eq!(e.on_tick(t0 + 39 * SEC), None);
        assert_eq!(
            e.on_tick(t0 + 40 * SEC),
            Some(Due {
                signal: Signal::SIGUSR1,
                to: Target::BatchShell
            })
        );
        assert!(!e.timed_out(), "a warning is not the end");
        assert_eq!(e.next_wakeup(), Some(t0 + 60 * SEC));
        assert_eq!(e.on_tick(t0 + 50 * SEC), None, "sent once");
        assert_eq!(e.on_tick(t0 + 60 * SEC), Some(Due::job(Signal::SIGTERM)));
        assert!(e.timed_out());
    }

    #[test]
    fn warning_edge_cases() {
        let t0 = Instant::now();
        let warn = |before| {
            Some(Warning {
                signal: Signal::SIGUSR2,
                before,
                batch_only: false,
            })
        };
        let usr2 = Some(Due {
            signal: Signal::SIGUSR2,
            to: Target::Steps,
        });
        // Longer lead than the limit: at once.
        let mut e = Enforcer::new(t0, Some(10 * SEC), SEC).with_warning(t0, warn(600 * SEC));
        assert_eq!(e.next_wakeup(), Some(t0));
        assert_eq!(e.on_tick(t0), usr2);
        // Lead 0: the warning, then SIGTERM, at the limit.
        let mut e = Enforcer::new(t0, Some(10 * SEC), SEC).with_warning(t0, warn(Duration::ZERO));
        assert_eq!(e.on_tick(t0 + 10 * SEC), usr2);
        assert_eq!(e.next_wakeup(), Some(t0 + 10 * SEC));
        assert_eq!(e.on_tick(t0 + 10 * SEC), Some(Due::job(Signal::SIGTERM)));
        // No time limit: nothing to count back from.
        let mut e = Enforcer::new(t0, None, SEC).with_warning(t0, warn(SEC));
        assert_eq!(e.next_wakeup(), None);
        assert_eq!(e.on_tick(t0 + 1_000 * SEC), None);
        // Cancelled before the warning: it is never sent.
        let mut e = Enforcer::new(t0, Some(60 * SEC), SEC).with_warning(t0, warn(30 * SEC));
        e.terminate(t0 + SEC, EndCause::Cancel, Duration::ZERO);
        assert_eq!(e.next_wakeup(), Some(t0 + 2 * SEC));
        assert_eq!(e.on_tick(t0 + 40 * SEC), Some(Due::job(Signal::SIGKILL)));
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
