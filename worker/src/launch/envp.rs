//! A job process's environment as `execve` takes it, built before the fork, with the one
//! variable only the child can fill: `SLURM_TASK_PID`, which Slurm sets to the pid of the
//! process that sees it (the batch script, each task of a step). The pid is known only once
//! the process exists, so the entry is reserved here with room for any pid, and the child
//! writes its own between fork (or clone) and exec, without allocating.
//!
//! A process started by std's `Command` gets it through [`Envp::install_in_child`]: the
//! command keeps the worker's environment as far as std is concerned, and a `pre_exec` hook
//! points the child's `environ` at this block, which std's `execvp` then passes on (and
//! searches `PATH` in, as it does for an environment it was given).

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;

use nix::libc;

/// Slurm's variable for the pid of the process it is in.
pub const TASK_PID_VAR: &str = "SLURM_TASK_PID";

/// Decimal digits of the largest pid (`i32::MAX`).
const PID_DIGITS: usize = 10;
/// `SLURM_TASK_PID=`, the digits and the terminating NUL.
const SLOT_BYTES: usize = TASK_PID_VAR.len() + 1 + PID_DIGITS + 1;

unsafe extern "C" {
    /// glibc's (and POSIX's) pointer to the process's environment.
    static mut environ: *const *const libc::c_char;
}

/// `KEY=VALUE` strings and the NULL-terminated array of pointers to them.
pub struct Envp {
    /// Owns what `ptrs` points at (but the slot).
    _strings: Vec<CString>,
    /// The `SLURM_TASK_PID=` entry; boxed, so its address in `ptrs` stays put, and in a
    /// cell, because the child writes it through a shared reference.
    slot: Box<UnsafeCell<[u8; SLOT_BYTES]>>,
    ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the pointers in `ptrs` point into heap memory this value owns (`_strings`, `slot`)
// and moves with it. The only write is `fill_pid`'s, whose contract confines it to a child
// process between fork and exec, where no other thread runs; otherwise the block is only
// read.
unsafe impl Send for Envp {}
// SAFETY: as for `Send`: shared references only read, except in the single-threaded child.
unsafe impl Sync for Envp {}

impl Envp {
    /// `env` with `SLURM_TASK_PID` reserved (a value of that name in `env`, inherited from
    /// a submitting job, is replaced). Fails on a NUL byte in a name or value.
    pub fn new(env: &BTreeMap<String, String>) -> io::Result<Envp> {
        let strings: Vec<CString> = env
            .iter()
            .filter(|(k, _)| k.as_str() != TASK_PID_VAR)
            .map(|(k, v)| {
                CString::new(format!("{k}={v}")).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("environment variable {k} contains a NUL byte"),
                    )
                })
            })
            .collect::<io::Result<_>>()?;
        let mut bytes = [0u8; SLOT_BYTES];
        bytes[..TASK_PID_VAR.len()].copy_from_slice(TASK_PID_VAR.as_bytes());
        bytes[TASK_PID_VAR.len()] = b'=';
        let slot = Box::new(UnsafeCell::new(bytes));
        let mut ptrs: Vec<*const libc::c_char> =
            strings.iter().map(|s| s.as_ptr()).collect::<Vec<_>>();
        ptrs.push(slot.get().cast::<libc::c_char>().cast_const());
        ptrs.push(std::ptr::null());
        Ok(Envp {
            _strings: strings,
            slot,
            ptrs,
        })
    }

    /// The array `execve` takes.
    pub fn as_ptr(&self) -> *const *const libc::c_char {
        self.ptrs.as_ptr()
    }

    /// Writes the calling process's pid into the reserved entry.
    ///
    /// # Safety
    /// Only in a child between fork (or `clone`) and exec, where no other thread can read
    /// or write this block meanwhile. Async-signal-safe: one system call, no allocation.
    pub unsafe fn fill_pid(&self) {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let digits = pid_digits(pid);
        let base = self.slot.get().cast::<u8>();
        let start = TASK_PID_VAR.len() + 1;
        // SAFETY: `base` points at the slot's `SLOT_BYTES` bytes, which nothing else
        // touches now (this function's contract); `start + PID_DIGITS + 1 == SLOT_BYTES`.
        unsafe {
            let mut at = start;
            for d in digits.iter().copied().filter(|d| *d != 0) {
                base.add(at).write(d);
                at += 1;
            }
            base.add(at).write(0);
        }
    }

    /// In a `pre_exec` hook: fills the pid and makes this block the environment std's
    /// `execvp` will hand on.
    ///
    /// # Safety
    /// As [`Envp::fill_pid`]; and the block must outlive the exec (the hook's closure owns
    /// it, and the command owns the closure until after `spawn`).
    pub unsafe fn install_in_child(&self) {
        // SAFETY: per this function's contract; writing `environ` in the single-threaded
        // child changes nothing in the parent.
        unsafe {
            self.fill_pid();
            (&raw mut environ).write(self.as_ptr());
        }
    }
}

/// Makes `cmd`'s child exec with exactly `env` and its own `SLURM_TASK_PID` (see the
/// module docs), and with file-creation mask `umask` when given: the command's own
/// environment must be left as it is. Fails on a NUL byte in `env`.
pub fn exec_with(
    cmd: &mut tokio::process::Command,
    env: &BTreeMap<String, String>,
    umask: Option<u32>,
) -> io::Result<()> {
    let envp = Envp::new(env)?;
    let mask = umask.map(|m| (m & 0o777) as libc::mode_t);
    // SAFETY: the hook runs in the child after `fork` from a multi-threaded process: it
    // makes two system calls (umask, getpid) and writes memory the closure owns and the
    // child's `environ`, nothing that allocates or locks (`install_in_child`). The closure
    // owns the block, and the command the closure, until after `spawn`. With the command's
    // environment untouched, std swaps no other block in after the hooks.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(m) = mask {
                libc::umask(m);
            }
            envp.install_in_child();
            Ok(())
        });
    }
    Ok(())
}

/// `pid`'s decimal digits, left-padded with zero bytes (no allocation: runs in a child).
fn pid_digits(pid: libc::pid_t) -> [u8; PID_DIGITS] {
    let mut out = [0u8; PID_DIGITS];
    let mut n = pid.unsigned_abs();
    let mut i = PID_DIGITS;
    loop {
        i -= 1;
        #[allow(clippy::cast_possible_truncation)]
        {
            out[i] = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn entries(e: &Envp) -> Vec<String> {
        let mut out = Vec::new();
        let mut p = e.as_ptr();
        // SAFETY: `as_ptr` is a NULL-terminated array of NUL-terminated strings.
        unsafe {
            while !(*p).is_null() {
                out.push(CStr::from_ptr(*p).to_string_lossy().into_owned());
                p = p.add(1);
            }
        }
        out
    }

    #[test]
    fn the_pid_entry_is_written_in_place_and_replaces_an_inherited_one() {
        let env: BTreeMap<String, String> = [
            ("A".to_owned(), "1".to_owned()),
            (TASK_PID_VAR.to_owned(), "999".to_owned()),
        ]
        .into();
        let e = Envp::new(&env).unwrap();
        assert_eq!(entries(&e), ["A=1", "SLURM_TASK_PID="]);
        // SAFETY: this test's thread is the only one that sees `e`.
        unsafe { e.fill_pid() };
        let want = format!("SLURM_TASK_PID={}", std::process::id());
        assert_eq!(entries(&e), ["A=1", want.as_str()]);
    }

    #[test]
    fn digits_of_small_and_largest_pids() {
        let text = |p| {
            pid_digits(p)
                .iter()
                .filter(|d| **d != 0)
                .map(|d| char::from(*d))
                .collect::<String>()
        };
        assert_eq!(text(1), "1");
        assert_eq!(text(40_960), "40960");
        assert_eq!(text(i32::MAX), "2147483647");
    }

    #[test]
    fn a_nul_byte_is_refused() {
        let env: BTreeMap<String, String> = [("A".to_owned(), "x\0y".to_owned())].into();
        let err = Envp::new(&env).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
