//! Joining a job's cgroups in the forked child, for processes that keep the worker's
//! identity: no launcher process in between.
//!
//! A job's process must be inside its cgroups before it runs an instruction of its own, so
//! the join happens between `fork` and `exec`. When the process also drops from root to the
//! job's user, the launcher ([`super::exec`]) does the join, `setgroups`, `setgid`, `setuid`
//! and the `exec` (it can report which of them failed, and why). When it does not, all that
//! is left is one `write("0")` per join file (v1's `tasks`, v2's `cgroup.procs`), which a
//! `pre_exec` hook does on descriptors opened before the fork. That saves every such start an `exec` of the launcher
//! and a request file (measured at about a fifth of the CPU a trivial job costs the node).
//!
//! The module's only `unsafe` is `pre_exec`; the proof is at the call.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;

use tokio::process::Command;

/// Opens `procs` (each a join file: v1's `tasks`, v2's `cgroup.procs`) for writing now, and makes `cmd`'s child write
/// itself into each between `fork` and `exec`. An open failure is returned at once (the
/// cgroup is gone or not ours); a write failure in the child fails the spawn with its errno.
pub fn join_in_child(cmd: &mut Command, procs: &[PathBuf]) -> io::Result<()> {
    if procs.is_empty() {
        return Ok(());
    }
    let files = open_procs(procs)?;
    // SAFETY: the hook runs in the child after `fork` from a multi-threaded process, where
    // only async-signal-safe work is sound: no allocation, no lock another thread could
    // hold. It iterates a `Vec` built before the fork (no allocation) and calls `write(2)`,
    // which is async-signal-safe, through `nix::unistd::write`, a direct libc call whose
    // error path only reads `errno`; `io::Error::from(Errno)` stores the code inline, with
    // no allocation. The descriptors stay open for the hook's whole run: the closure owns
    // them, and the `Command` owns the closure until after `spawn` returns.
    unsafe {
        cmd.pre_exec(move || write_zero(&files));
    }
    Ok(())
}

/// Opens each join file for writing, close-on-exec (std's default: the job never
/// sees these descriptors); an error names the file.
pub fn open_procs(procs: &[PathBuf]) -> io::Result<Vec<File>> {
    procs
        .iter()
        .map(|p| {
            OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        })
        .collect()
}

/// `0` moves the writer into that cgroup: the process (v2's `cgroup.procs`) or the calling
/// thread (v1's `tasks`), which is the whole process of a child between fork and `exec`.
fn write_zero(files: &[File]) -> io::Result<()> {
    for f in files {
        nix::unistd::write(f, b"0")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain file stands in for `cgroup.procs`: what the child writes is what the kernel
    /// would read as "this process".
    #[tokio::test]
    async fn the_child_writes_itself_into_every_file_before_exec() {
        let dir = tempfile::tempdir().unwrap();
        let procs: Vec<PathBuf> = ["memory", "freezer"]
            .iter()
            .map(|c| {
                let p = dir.path().join(c);
                std::fs::write(&p, "").unwrap();
                p
            })
            .collect();
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exit 3"]);
        join_in_child(&mut cmd, &procs).unwrap();
        let status = cmd.status().await.unwrap();
        assert_eq!(status.code(), Some(3));
        for p in &procs {
            assert_eq!(std::fs::read_to_string(p).unwrap(), "0", "{}", p.display());
        }
    }

    #[tokio::test]
    async fn a_missing_cgroup_fails_before_any_process_starts() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &format!("touch {}", marker.display())]);
        let err = join_in_child(&mut cmd, &[dir.path().join("gone/cgroup.procs")]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("gone/cgroup.procs"), "{err}");
        assert!(!marker.exists());
    }

    #[tokio::test]
    async fn a_refused_write_fails_the_spawn_and_the_program_never_runs() {
        // Writing to a read-only descriptor fails with EBADF in the child: the spawn must
        // report it, and exec must not happen.
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let ro = File::open("/dev/null").unwrap();
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &format!("touch {}", marker.display())]);
        // SAFETY: as in `join_in_child`; the hook only calls `write(2)`.
        unsafe {
            cmd.pre_exec(move || write_zero(std::slice::from_ref(&ro)));
        }
        let err = cmd.spawn().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::EBADF), "{err}");
        assert!(!marker.exists());
    }
}
