//! The `tandem-slurm` binary: the Slurm commands and the job launcher without the daemons
//! (see `tandem_cli::slurm_main_from_env`).
//!
//! It starts at C's `main` (`#![no_main]`), not through Rust's runtime start-up. On Linux
//! that start-up reads the whole of `/proc/self/maps` (glibc's `pthread_getattr_np` for the
//! main thread, to place the stack overflow guard) and maps an alternate signal stack: about
//! 0.1 ms of CPU in every `sbatch` of a researcher's loop. What of it the commands rely on is
//! done here instead: standard descriptors that were closed are opened on `/dev/null` (so
//! that a socket opened later never becomes stdout), SIGPIPE is ignored (a closed pipe is an
//! error the commands handle; programs they start get the default back, as `std::process`
//! restores it), and stdout is flushed at exit (`std::process::exit` runs Rust's exit
//! clean-up). What is given up: a stack overflow ends a command with SIGSEGV instead of a
//! message saying so.
#![no_main]
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int};

// SAFETY: `#![no_main]` leaves this the binary's only `main` symbol (a second one would
// fail the link), with the signature the C runtime calls it with; Rust's standard library
// works without its start-up (arguments and environment come from glibc).
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    open_closed_standard_fds();
    // SAFETY: SIG_IGN installs no handler: no code of ours runs in a signal's context.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    std::process::exit(c_int::from(tandem_cli::slurm_main_from_env()))
}

/// Opens `/dev/null` in place of each of stdin, stdout and stderr that is closed, as Rust's
/// start-up does.
fn open_closed_standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is three valid `pollfd`s, alive for the call; timeout 0 never blocks.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for p in fds {
        if p.revents & libc::POLLNVAL != 0 {
            // The lowest free descriptor is the closed one; left open for the process's
            // life, as stdin, stdout or stderr.
            // SAFETY: the path is a NUL-terminated constant.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// C's `pow`, so that the binary needs no `libm.so.6`: tokio's multi-threaded scheduler,
/// linked in though the commands run on one thread, is the only caller. Loading one more
/// shared library cost every command about 60 us of the loader's time (measured with a C
/// program linked with and without `-lm`); `--as-needed` drops it once nothing wants it.
///
/// SAFETY: the symbol is C's `pow` with C's signature and semantics (the `libm` crate is a
/// port of musl's); defined in the executable, it is what the static link binds the call
/// to, and no shared library this binary loads calls `pow`.
#[unsafe(no_mangle)]
extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}
