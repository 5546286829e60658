//! Starting a batch script that keeps the worker's identity without copying the worker:
//! `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`, the way `posix_spawn` starts a process.
//!
//! The script must be inside its cgroups before it runs an instruction of its own, so the
//! join (`write("0")` to each join file) happens between clone and `exec`. std only
//! offers that through `pre_exec`, which makes it `fork`: the kernel copies the worker's
//! page tables, every page the worker's threads then write is copied on fault until the
//! child execs, and exec tears the copy down again. That was about a sixth of what a
//! trivial job costs the node. Here the child runs on a small stack of its own in the
//! worker's memory while the cloning thread waits (`CLONE_VFORK`); it makes only direct
//! system calls on values prepared before the clone, then `exec`s or exits.
//!
//! The child does what std's child does and nothing more: signal dispositions the worker
//! set back to default (a handler must never run in the shared memory; SIGPIPE, which the
//! Rust runtime ignores, too), the join, its own process group, the three standard streams,
//! the working directory, the job's file-creation mask, an empty signal mask, its pid into
//! the environment
//! (`SLURM_TASK_PID`), `execve`. A failure before `exec` is
//! reported through memory shared with the parent (which step, which errno), and the
//! spawn returns it as an error, as std does.
//!
//! The process comes back as a pidfd, so waiting is an ordinary readiness wait on the
//! runtime, and the pid cannot be reused before it is reaped here.
//!
//! Kernels before 5.2 have no `CLONE_PIDFD`: the spawn then reports
//! [`io::ErrorKind::Unsupported`] and the caller starts the process the std way.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use nix::libc;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

use super::envp::Envp;

/// The child's stack. Its frame is a few hundred bytes; the rest is headroom for libc's
/// wrappers. A guard page below it turns an overflow into a fault, not corruption.
const STACK_BYTES: usize = 64 * 1024;
const PAGE: usize = 4096;
/// Signals 1..=64 (Linux's `_NSIG - 1`).
const LAST_SIGNAL: libc::c_int = 64;

/// What a spawn starts.
pub struct Spawn<'a> {
    pub program: &'a Path,
    /// `argv[1..]`; `argv[0]` is the program path.
    pub args: &'a [std::ffi::OsString],
    /// The whole environment; `SLURM_TASK_PID` is added (the child's pid, see
    /// [`super::envp`]).
    pub env: &'a BTreeMap<String, String>,
    pub workdir: &'a Path,
    /// `None`: `/dev/null`.
    pub stdin: Option<&'a File>,
    pub stdout: &'a File,
    pub stderr: &'a File,
    /// The cgroups' join files (v1's `tasks`, v2's `cgroup.procs`), open for writing.
    pub cgroup_procs: &'a [File],
    /// File-creation mask; `None`: the worker's.
    pub umask: Option<u32>,
}

/// A process started by [`spawn`]; reaped by [`Process::wait`], or in the background
/// when dropped before it was.
#[derive(Debug)]
pub struct Process {
    pid: Pid,
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
    /// User and system CPU from `wait4`, once reaped.
    cpu_usec: Option<(u64, u64)>,
}

/// Where the child reports a failure; written by the child only, read by the parent only
/// after the child has exec'd or exited (`CLONE_VFORK`).
#[derive(Default)]
struct Report {
    /// 0: none; otherwise the [`Stage`] that failed.
    stage: AtomicU32,
    errno: AtomicI32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Stage {
    Signals = 1,
    Cgroup,
    ProcessGroup,
    Streams,
    Workdir,
    Exec,
}

impl Stage {
    fn from_u32(v: u32) -> Option<Stage> {
        [
            Stage::Signals,
            Stage::Cgroup,
            Stage::ProcessGroup,
            Stage::Streams,
            Stage::Workdir,
            Stage::Exec,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }

    fn what(self) -> &'static str {
        match self {
            Stage::Signals => "resetting signal handling",
            Stage::Cgroup => "joining the job's cgroup",
            Stage::ProcessGroup => "starting a process group",
            Stage::Streams => "setting up the standard streams",
            Stage::Workdir => "changing to the working directory",
            Stage::Exec => "executing the program",
        }
    }
}

/// Everything the child reads, as raw pointers into values the parent keeps alive until
/// the clone returns.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const Envp,
    workdir: *const libc::c_char,
    /// Descriptors for 0, 1, 2; each is 3 or above (see [`above_stdio`]).
    stdio: [RawFd; 3],
    procs: *const RawFd,
    procs_len: usize,
    /// Negative: keep the worker's.
    umask: libc::c_int,
    report: *const Report,
}

/// Starts `spec` and returns once the program has been exec'd (or failed to be).
pub fn spawn(spec: &Spawn<'_>) -> io::Result<Process> {
    let program = cstring(spec.program.as_os_str())?;
    let argv_owned: Vec<CString> = std::iter::once(Ok(program.clone()))
        .chain(spec.args.iter().map(|a| cstring(a)))
        .collect::<io::Result<_>>()?;
    let envp = Envp::new(spec.env)?;
    let workdir = cstring(spec.workdir.as_os_str())?;
    let argv = null_terminated(&argv_owned);

    let devnull;
    let stdin = match spec.stdin {
        Some(f) => f,
        None => {
            devnull = File::open("/dev/null")?;
            &devnull
        }
    };
    // Descriptors below 3 would be overwritten by the dup2 of an earlier stream.
    let streams = [
        above_stdio(stdin)?,
        above_stdio(spec.stdout)?,
        above_stdio(spec.stderr)?,
    ];
    let procs: Vec<RawFd> = spec.cgroup_procs.iter().map(AsRawFd::as_raw_fd).collect();
    let report = Report::default();
    let args = ChildArgs {
        program: program.as_ptr(),
        argv: argv.as_ptr(),
        envp: &raw const envp,
        workdir: workdir.as_ptr(),
        stdio: [
            streams[0].as_raw_fd(),
            streams[1].as_raw_fd(),
            streams[2].as_raw_fd(),
        ],
        procs: procs.as_ptr(),
        procs_len: procs.len(),
        umask: spec.umask.map_or(-1, |m| (m & 0o777) as libc::c_int),
        report: &report,
    };
    let stack = Stack::new()?;

    let mut pidfd: libc::c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    let pid = {
        let _blocked = BlockedSignals::all()?;
        // SAFETY: `clone` with CLONE_VM runs `child_main` in this process's memory on
        // `stack`, a private mapping nothing else uses, sized for it and with a guard page.
        // CLONE_VFORK suspends this thread until the child has exec'd or exited, so
        // everything `args` points to (locals of this frame, alive until after the call)
        // stays valid and unchanged while the child reads it, and the child's writes to
        // `report` are complete when we read them. Other threads of the worker run on but
        // never touch this frame or the stack mapping. The child makes no allocation and
        // takes no lock: `child_main` only calls async-signal-safe system-call wrappers,
        // with every signal blocked until it has reset every handler (see there).
        // `pidfd` is a valid `int` the kernel writes the pidfd into (CLONE_PIDFD passes
        // it as the parent-tid argument).
        unsafe {
            libc::clone(
                child_main,
                stack.top(),
                flags,
                std::ptr::from_ref(&args).cast_mut().cast(),
                &raw mut pidfd,
            )
        }
    };
    if pid < 0 {
        let e = io::Error::last_os_error();
        return Err(if e.raw_os_error() == Some(libc::EINVAL) {
            io::Error::new(io::ErrorKind::Unsupported, "clone: no CLONE_PIDFD here")
        } else {
            e
        });
    }
    let pid = Pid::from_raw(pid);
    // SAFETY: with CLONE_PIDFD a successful clone stores a new descriptor that nothing
    // else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    if let Some(stage) = Stage::from_u32(report.stage.load(Ordering::SeqCst)) {
        // The child has exited (`_exit` after the failure): reap it now.
        let _ = waitpid(pid, None);
        let e = io::Error::from_raw_os_error(report.errno.load(Ordering::SeqCst));
        // A failed exec is reported as std reports it (the bare errno: callers retry
        // ETXTBSY); the other steps say which one failed.
        return Err(if stage == Stage::Exec {
            e
        } else {
            io::Error::new(e.kind(), format!("{}: {e}", stage.what()))
        });
    }
    // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which keeps it open, and its
    // `as_raw_fd` always returns the same descriptor, for the `AsyncFd`'s whole life.
    let registered =
        unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
    let pidfd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            // Without a way to wait, do not leave the process unowned: reap it elsewhere.
            Process::orphan(pid);
            return Err(e.into());
        }
    };
    Ok(Process {
        pid,
        pidfd,
        reaped: false,
        cpu_usec: None,
    })
}

impl Process {
    pub fn id(&self) -> u32 {
        u32::try_from(self.pid.as_raw()).unwrap_or(0)
    }

    /// Waits for the process to end and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            let mut ready = self.pidfd.readable().await?;
            let mut status: libc::c_int = 0;
            // SAFETY: all-zero bytes are a valid `rusage` (integers and `timeval`s only).
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: `wait4` writes only `status` and `usage`, locals borrowed exclusively
            // for the call; WNOHANG makes it return at once.
            let reaped = unsafe {
                libc::wait4(
                    self.pid.as_raw(),
                    &raw mut status,
                    libc::WNOHANG,
                    &raw mut usage,
                )
            };
            if reaped < 0 {
                return Err(io::Error::last_os_error());
            }
            // 0: not yet; stopped or continued (no WUNTRACED, so not expected): go on waiting.
            if reaped == 0 || !(libc::WIFEXITED(status) || libc::WIFSIGNALED(status)) {
                ready.clear_ready();
                continue;
            }
            self.reaped = true;
            self.cpu_usec = Some((usec(usage.ru_utime), usec(usage.ru_stime)));
            return Ok(ExitStatus::from_raw(status));
        }
    }

    /// User and system CPU of the process and the children it waited for, in microseconds,
    /// once it has been reaped.
    pub fn cpu_usec(&self) -> Option<(u64, u64)> {
        self.cpu_usec
    }
}

fn usec(t: libc::timeval) -> u64 {
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let micros = u64::try_from(t.tv_usec).unwrap_or(0);
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.reaped {
            // Not waited for (the supervisor was cancelled): no zombie left behind.
            Process::orphan(self.pid);
        }
    }
}

impl Process {
    /// Reaps `pid` now if it has ended, else on a thread of its own when it does.
    fn orphan(pid: Pid) {
        if matches!(
            waitpid(pid, Some(WaitPidFlag::WNOHANG)),
            Ok(WaitStatus::StillAlive)
        ) {
            let _ = std::thread::Builder::new()
                .name("tandem-reap".into())
                .spawn(move || waitpid(pid, None));
        }
    }
}

/// The child. Runs on its own stack in the parent's memory with every signal blocked;
/// calls only system-call wrappers; never returns on success (execve replaces it).
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` in `spawn`'s frame, alive and unchanged while this
    // runs (CLONE_VFORK); its pointers point at NUL-terminated strings, NULL-terminated
    // arrays and the environment block built there, and `procs` at `procs_len` descriptors.
    let args = unsafe { &*arg.cast::<ChildArgs>() };
    let report = |stage: Stage| -> libc::c_int {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        // SAFETY: `report` points at the `Report` in `spawn`'s frame (see above).
        let r = unsafe { &*args.report };
        r.errno.store(errno, Ordering::SeqCst);
        r.stage.store(stage as u32, Ordering::SeqCst);
        // SAFETY: `_exit` ends this process at once, running nothing of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY (for each call below): thin wrappers of system calls on values prepared by
    // the parent: they allocate nothing, take no lock and touch no memory but their
    // arguments and this thread's errno (which belongs to the suspended cloning thread,
    // whose errno nobody reads until the clone returns).
    unsafe {
        // Handlers back to default before any signal can be delivered here, so none runs
        // in the shared memory; ignored signals stay ignored, as across exec, except
        // SIGPIPE, which only the Rust runtime ignored.
        for signal in 1..=LAST_SIGNAL {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut old = KernelSigaction::default();
            if rt_sigaction(signal, None, Some(&mut old)) != 0 {
                return report(Stage::Signals);
            }
            let handled = old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN;
            let pipe_ignored = signal == libc::SIGPIPE && old.handler == libc::SIG_IGN;
            if (handled || pipe_ignored)
                && rt_sigaction(signal, Some(&KernelSigaction::default()), None) != 0
            {
                return report(Stage::Signals);
            }
        }
        let procs = std::slice::from_raw_parts(args.procs, args.procs_len);
        for &fd in procs {
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return report(Stage::Cgroup);
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return report(Stage::ProcessGroup);
        }
        for (target, &fd) in args.stdio.iter().enumerate() {
            // dup2 leaves the new descriptor without close-on-exec.
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            if libc::dup2(fd, target as RawFd) < 0 {
                return report(Stage::Streams);
            }
        }
        if libc::chdir(args.workdir) != 0 {
            return report(Stage::Workdir);
        }
        if let Ok(mask) = libc::mode_t::try_from(args.umask) {
            libc::umask(mask);
        }
        let empty: u64 = 0;
        if libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::c_long::from(libc::SIG_SETMASK),
            &raw const empty,
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        ) != 0
        {
            return report(Stage::Signals);
        }
        // The child is the only thread using the block until it execs (CLONE_VFORK).
        let envp = &*args.envp;
        envp.fill_pid();
        libc::execve(args.program, args.argv, envp.as_ptr());
        report(Stage::Exec)
    }
}

/// The kernel's `struct sigaction` for `rt_sigaction(2)`. glibc's `sigaction` refuses the
/// two signals it keeps for itself (32, 33), whose handlers must be reset here too.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// # Safety
/// A direct system call; the references are valid for its duration.
unsafe fn rt_sigaction(
    signal: libc::c_int,
    new: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> libc::c_long {
    let new = new.map_or(std::ptr::null(), std::ptr::from_ref);
    let old = old.map_or(std::ptr::null_mut(), std::ptr::from_mut);
    // SAFETY: per this function's contract; the kernel reads `new` and writes `old`, both
    // the layout it expects, with an 8-byte signal set.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            libc::c_long::from(signal),
            new,
            old,
            std::mem::size_of::<u64>(),
        )
    }
}

/// Blocks every signal on this thread until dropped, so none is delivered to the child
/// (which inherits the mask) before it has reset the handlers.
struct BlockedSignals(nix::sys::signal::SigSet);

impl BlockedSignals {
    fn all() -> io::Result<BlockedSignals> {
        let mut old = nix::sys::signal::SigSet::empty();
        nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&nix::sys::signal::SigSet::all()),
            Some(&mut old),
        )?;
        Ok(BlockedSignals(old))
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        let _ = nix::sys::signal::pthread_sigmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&self.0),
            None,
        );
    }
}

/// The child's stack: an anonymous mapping with its lowest page inaccessible.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new() -> io::Result<Stack> {
        let len = STACK_BYTES + PAGE;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the first page of the mapping just made, which nothing uses.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The highest address, where a downward-growing stack starts (16-byte aligned: the
    /// mapping is page aligned and its length a multiple of the page).
    fn top(&self) -> *mut libc::c_void {
        self.base.cast::<u8>().wrapping_add(self.len).cast()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, used by nobody once the clone returned.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{s:?} contains a NUL byte"),
        )
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// A duplicate of `f` numbered 3 or above, close-on-exec (the child's dup2 makes its own
/// copy without the flag).
fn above_stdio(f: &File) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::fcntl(f, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Read as _;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    struct Out {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        file: File,
    }

    impl Out {
        /// `program args` with `env` in `/`, stdin from `/dev/null`, both streams to this
        /// file, no cgroup.
        fn spec<'a>(
            &'a self,
            program: &'a str,
            args: &'a [std::ffi::OsString],
            env: &'a BTreeMap<String, String>,
        ) -> Spawn<'a> {
            Spawn {
                program: Path::new(program),
                args,
                env,
                workdir: Path::new("/"),
                stdin: None,
                stdout: &self.file,
                stderr: &self.file,
                cgroup_procs: &[],
                umask: None,
            }
        }
    }

    fn out() -> Out {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let file = File::create(&path).unwrap();
        Out {
            _dir: dir,
            path,
            file,
        }
    }

    fn sh(script: &str) -> Vec<std::ffi::OsString> {
        vec!["-c".into(), script.into()]
    }

    #[tokio::test]
    async fn the_program_gets_its_streams_environment_directory_mask_and_process_group() {
        let o = out();
        let work = tempfile::tempdir().unwrap();
        let input = work.path().join("in");
        std::fs::write(&input, "from stdin\n").unwrap();
        let input = File::open(&input).unwrap();
        let args = sh("read line; echo \"$line\"; echo \"$GREETING\"; pwd; \
             cut -d' ' -f5 /proc/$$/stat; echo $$; umask; echo $SLURM_TASK_PID; echo err >&2; \
             exit 7");
        let env = env(&[("GREETING", "hello"), ("PATH", "/usr/bin:/bin")]);
        let mut p = spawn(&Spawn {
            program: Path::new("/bin/sh"),
            args: &args,
            env: &env,
            workdir: work.path(),
            stdin: Some(&input),
            stdout: &o.file,
            stderr: &o.file,
            cgroup_procs: &[],
            umask: Some(0o027),
        })
        .unwrap();
        let pid = p.id();
        let status = p.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let text = std::fs::read_to_string(&o.path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let workdir = work.path().canonicalize().unwrap();
        assert_eq!(
            lines[..3],
            ["from stdin", "hello", workdir.to_str().unwrap()]
        );
        // Leader of its own process group.
        assert_eq!(lines[3], pid.to_string(), "{text}");
        assert_eq!(lines[4], pid.to_string(), "{text}");
        // The mask asked for; its own pid in the environment (Slurm's SLURM_TASK_PID).
        assert_eq!(lines[5], "0027", "{text}");
        assert_eq!(lines[6], pid.to_string(), "{text}");
        assert_eq!(lines[7], "err");
    }

    #[tokio::test]
    async fn the_program_starts_with_no_blocked_signals_and_sigpipe_at_default() {
        let o = out();
        // The program reads its own status (a shell would change its mask while it waits).
        let args = vec!["/proc/self/status".into()];
        let mut p = spawn(&o.spec("/bin/cat", &args, &env(&[("PATH", "/usr/bin:/bin")]))).unwrap();
        assert!(p.wait().await.unwrap().success());
        let text = std::fs::read_to_string(&o.path).unwrap();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap()
        };
        assert_eq!(field("SigBlk:"), 0, "{text}");
        // The test runner ignores SIGPIPE (Rust's runtime); the job must not.
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
    }

    #[tokio::test]
    async fn the_child_writes_itself_into_every_cgroup_file_before_exec() {
        let o = out();
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<_> = ["memory", "freezer"]
            .iter()
            .map(|c| dir.path().join(c))
            .collect();
        let files: Vec<File> = paths
            .iter()
            .map(|p| {
                OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(p)
                    .unwrap()
            })
            .collect();
        // The program reads the files: the join happened before it ran.
        let args = sh(&format!(
            "cat {} {}",
            paths[0].display(),
            paths[1].display()
        ));
        let mut p = spawn(&Spawn {
            cgroup_procs: &files,
            ..o.spec("/bin/sh", &args, &env(&[("PATH", "/usr/bin:/bin")]))
        })
        .unwrap();
        assert!(p.wait().await.unwrap().success());
        assert_eq!(std::fs::read_to_string(&o.path).unwrap(), "00");
    }

    #[tokio::test]
    async fn a_refused_cgroup_write_fails_the_spawn_and_the_program_never_runs() {
        let o = out();
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        // Read-only: the child's write fails with EBADF.
        let ro = File::open("/dev/null").unwrap();
        let args = sh(&format!("touch {}", marker.display()));
        let err = spawn(&Spawn {
            cgroup_procs: std::slice::from_ref(&ro),
            ..o.spec("/bin/sh", &args, &BTreeMap::new())
        })
        .unwrap_err();
        assert_eq!(err.raw_os_error(), None, "wrapped with the stage: {err}");
        let msg = err.to_string();
        assert!(msg.contains("joining the job's cgroup"), "{msg}");
        assert!(msg.contains("Bad file descriptor"), "{msg}");
        assert!(!marker.exists());
    }

    #[tokio::test]
    async fn exec_and_workdir_failures_are_reported_as_errors() {
        let o = out();
        let no_env = BTreeMap::new();
        let spec = |program: &'static str, workdir: &'static str| Spawn {
            workdir: Path::new(workdir),
            ..o.spec(program, &[], &no_env)
        };
        let err = spawn(&spec("/nonexistent/program", "/")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
        let err = spawn(&spec("/bin/true", "/nonexistent/dir")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(
            err.to_string()
                .contains("changing to the working directory"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_nul_in_the_environment_is_refused_before_any_process_starts() {
        let o = out();
        let err = spawn(&o.spec("/bin/true", &[], &env(&[("BAD", "a\0b")]))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn a_killed_program_reports_its_signal() {
        let o = out();
        let args = sh("kill -TERM $$");
        let mut p = spawn(&o.spec("/bin/sh", &args, &BTreeMap::new())).unwrap();
        let status = p.wait().await.unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        let mut s = String::new();
        File::open(&o.path).unwrap().read_to_string(&mut s).unwrap();
        assert!(s.is_empty(), "{s}");
    }
}
