//! Lowest CPU priority for the calling thread: Linux's `SCHED_IDLE` policy.
//!
//! A crowd looping `squeue` keeps the listing threads runnable all the time. At nice 19 such
//! a thread still holds its core until the scheduler's next preemption check when a
//! commit, an actor turn or a reply wakes up (under EEVDF a waking task need not preempt the
//! current one at once), and the submit path is a chain of such wake-ups. A `SCHED_IDLE`
//! thread is preempted by any normal thread that wakes on its core, at once, and gets the
//! smallest share when both are runnable: work that runs only on what is left. An
//! unprivileged thread may move itself there (it may not come back, which is why listings
//! have threads of their own). Where the policy cannot be set, nice 19 is the fallback.
//!
//! The crate's only `unsafe`: the two libc calls (no wrapper in `rustix`, `nix` or `std`).

#![allow(unsafe_code)]

use std::io;

/// Nice value kept as well, for kernels or sandboxes that refuse `SCHED_IDLE`.
pub const FALLBACK_NICE: i32 = 19;

/// Moves the calling thread to `SCHED_IDLE` (and nice [`FALLBACK_NICE`]). An error names
/// which of the two failed; the thread runs on either way.
pub fn lower_this_thread() -> io::Result<()> {
    // Per thread on Linux: setpriority(PRIO_PROCESS, 0) names the caller.
    let nice = rustix::process::setpriority_process(None, FALLBACK_NICE);
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads one `sched_param` through the pointer during the
    // call; `param` is a live, initialized local that outlives it. Pid 0 is the calling
    // thread, so no other thread's state is touched. No memory is written.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    nice.map_err(io::Error::from)
}

/// Whether the calling thread runs under `SCHED_IDLE`.
pub fn this_thread_is_idle() -> bool {
    // SAFETY: sched_getscheduler takes no pointer and only reads the calling thread's
    // (pid 0) policy.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_thread_runs_under_sched_idle() {
        let t = std::thread::spawn(|| {
            let before = this_thread_is_idle();
            let r = lower_this_thread();
            (before, r.map_err(|e| e.to_string()), this_thread_is_idle())
        });
        let (before, r, after) = t.join().unwrap();
        assert!(!before, "a new thread starts under the normal policy");
        assert_eq!(r, Ok(()));
        assert!(after, "the thread moved to SCHED_IDLE");
        assert!(!this_thread_is_idle(), "only the calling thread moves");
    }
}
