//! Starting a batch script as a real process.
//!
//! The script is written to the spool (`STATE_DIR/spool/job<ID>/slurm_script`, mode 0700) and
//! executed directly, so its `#!` line picks the interpreter as in Slurm. It runs in its own
//! process group (cancel and time limits signal the whole tree), in the job's working
//! directory, with exactly the environment from [`super::env`], stdin from `/dev/null` or the
//! `--input` file, and stdout/stderr in the job's output files (truncated, Slurm's default
//! open mode, or appended to with `--open-mode=append`).
//!
//! # Whose process it is
//!
//! A worker running as the job's user starts the script directly and opens the output files
//! itself. A worker running as root starts it as the submitting user, with the user's
//! supplementary groups, and must not open output files with root's rights, or
//! `--output=/etc/shadow` would clobber that file. Without `unsafe` there is no `pre_exec`
//! hook to open them after the switch, so the script is started through `/bin/sh`, which
//! performs the redirection *as the user* and then `exec`s the script (same pid, same process
//! group). The shell's stderr is a pipe to the worker until the redirection succeeds: anything
//! written there is a launch error. Any other uid is refused.
//!
//! # Through the launcher
//!
//! With a [`Confinement`] and a user to switch to, the process starts as the launcher
//! ([`super::exec`]), which joins the job's cgroup, sets the user's groups and ids and
//! `exec`s the redirecting shell in place. With cgroups but the worker's own identity, the
//! forked child joins the cgroups itself before `exec` ([`super::join`]), launcher binary or
//! not. A job that needs cgroups and a user switch on a worker without the launcher binary
//! does not start (an error, never a job outside its cgroups). Without cgroups and without
//! the launcher, std's `uid`/`gid` switch is used, which leaves the user without
//! supplementary groups.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::envp::{self, TASK_PID_VAR};
use super::exec::{self, Launcher, Request, User};
use super::output::{PatternFields, expand};

/// Slurm's default output file name.
const DEFAULT_OUTPUT: &str = "slurm-%j.out";
/// The batch script's file name in its spool directory (Slurm's).
const SCRIPT_NAME: &str = "slurm_script";
/// Shell used to open output files as the job's user.
const REDIRECT_SHELL: &str = "/bin/sh";
/// How long the shell may take to open the output files as the user.
const REDIRECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Redirects stdin (when `$3` is set) and stdout/stderr (same file when `$2` is empty;
/// appending when `$4` is `append`), then execs the script. Stdin goes first, while stderr
/// is still the pipe that reports a failed redirection.
const REDIRECT_SCRIPT: &str = r#"o=$1 e=$2 i=$3 m=$4 s=$5; shift 5
if [ -n "$i" ]; then exec <"$i"; fi
if [ "$m" = append ]; then
if [ -z "$e" ]; then exec >>"$o" 2>&1; else exec >>"$o" 2>>"$e"; fi
else
if [ -z "$e" ]; then exec >"$o" 2>&1; else exec >"$o" 2>"$e"; fi
fi
exec "$s" "$@""#;

/// Why a batch script could not be started; the text goes to the controller as
/// `JobEnded.launch_error` and from there to the user.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "this does not look like a batch script: the first line must start with #! followed by the path to an interpreter"
    )]
    NotABatchScript,
    #[error("working directory {path} is not usable")]
    Workdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the batch script to {path}")]
    Spool {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open output file {path}")]
    Output {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open input file {path}")]
    Input {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the input or output files as uid {uid}: {message}")]
    Redirect { uid: u32, message: String },
    #[error("this worker runs as uid {worker_uid} and cannot start jobs of uid {job_uid}")]
    Identity { worker_uid: u32, job_uid: u32 },
    #[error("cannot start the batch script")]
    Spawn {
        #[source]
        source: io::Error,
    },
}

impl LaunchError {
    /// The whole cause chain on one line, for `JobEnded.launch_error`.
    pub fn one_line(&self) -> String {
        let mut s = self.to_string();
        let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(self);
        while let Some(e) = cur {
            s.push_str(": ");
            s.push_str(&e.to_string());
            cur = e.source();
        }
        s
    }
}

/// Who the script runs as, decided from the worker's and the job's uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAs {
    /// The worker's own identity (the job's user started the worker).
    Worker,
    /// Drop from root to the job's user.
    User { uid: u32, gid: u32 },
}

impl RunAs {
    pub fn decide(worker_uid: u32, job_uid: u32, job_gid: u32) -> Result<Self, LaunchError> {
        if job_uid == worker_uid {
            Ok(Self::Worker)
        } else if worker_uid == 0 {
            Ok(Self::User {
                uid: job_uid,
                gid: job_gid,
            })
        } else {
            Err(LaunchError::Identity {
                worker_uid,
                job_uid,
            })
        }
    }
}

/// Everything needed to start one batch script.
#[derive(Debug, Clone)]
pub struct BatchSpec<'a> {
    pub job_id: u64,
    pub script: &'a str,
    pub argv: &'a [String],
    pub workdir: &'a Path,
    pub env: &'a BTreeMap<String, String>,
    /// Output patterns as the controller sent them (`%N` still to expand); empty = default.
    pub stdout: &'a str,
    pub stderr: &'a str,
    /// `--input` pattern as the controller sent it; empty = `/dev/null`.
    pub stdin: &'a str,
    /// `--open-mode=append`: keep what the output files hold.
    pub open_append: bool,
    /// The submitter's file-creation mask: the script's, and the output files' it creates;
    /// `None`: the worker's.
    pub umask: Option<u32>,
    pub node_name: &'a str,
    pub run_as: RunAs,
    /// Start through the launcher; `None` = spawn directly.
    pub confine: Option<Confinement<'a>>,
}

/// Whether a start goes through a [`Confinement`]: always with cgroups to join (a start
/// that must also switch user then needs the launcher, see [`Confinement::command`]), and
/// for a user switch whenever the launcher is there (it sets the user's supplementary
/// groups, std's switch does not).
pub fn confined(cgroups: bool, switches_user: bool, launcher: Option<&Launcher>) -> bool {
    cgroups || (switches_user && launcher.is_some())
}

/// What the launcher does for a job's process before it execs.
#[derive(Debug, Clone)]
pub struct Confinement<'a> {
    /// `None` on a worker without the launcher binary: a start that keeps the worker's
    /// identity still joins the cgroups (by itself); one that switches user cannot.
    pub launcher: Option<&'a Launcher>,
    /// The worker's private directory for launch requests.
    pub exec_dir: &'a Path,
    /// Request file name, unique among the processes starting now.
    pub request_name: String,
    /// The step's `cgroup.procs` files; empty without cgroups.
    pub cgroup_procs: Vec<PathBuf>,
    /// Exit code when the program cannot be executed (see [`Request::exec_failed_code`]).
    pub exec_failed_code: Option<u8>,
}

impl Confinement<'_> {
    /// A command that starts `program args` with `env` in `workdir`, in the step's cgroups,
    /// as `user` if given. With a user to switch to it goes through the launcher, and the
    /// command itself gets no environment and no working directory: the launcher applies
    /// them after the switch. Without one the child joins the cgroups itself
    /// ([`super::join`]) and `program` is the command's own.
    pub fn command(
        &self,
        program: &Path,
        args: Vec<std::ffi::OsString>,
        env: &BTreeMap<String, String>,
        workdir: &Path,
        user: Option<User>,
        umask: Option<u32>,
    ) -> io::Result<Command> {
        if user.is_none() {
            let mut cmd = plain_command(program, env, workdir, umask)?;
            cmd.args(args);
            super::join::join_in_child(&mut cmd, &self.cgroup_procs)?;
            return Ok(cmd);
        }
        let Some(launcher) = self.launcher else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the job runs as its user inside its cgroups, which takes the launcher \
                 (`tandem-slurm __job-exec`), and this worker found no launcher binary",
            ));
        };
        let request = Request {
            cgroup_procs: self.cgroup_procs.clone(),
            user,
            workdir: workdir.to_owned(),
            program: program.to_owned(),
            args,
            env: env.iter().map(|(k, v)| (k.into(), v.into())).collect(),
            pid_var: Some(TASK_PID_VAR.into()),
            umask,
            exec_failed_code: self.exec_failed_code,
        };
        let path = exec::write_request(self.exec_dir, &self.request_name, &request)?;
        let mut cmd = Command::new(&launcher.program);
        cmd.args(&launcher.args)
            .arg(path)
            .env_clear()
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(false);
        Ok(cmd)
    }
}

/// A started batch script.
#[derive(Debug)]
pub struct Started {
    pub child: JobProcess,
    pub pid: u32,
    /// Removed by the supervisor when the job ends.
    pub spool_dir: PathBuf,
}

/// A batch script's process: started by std (tokio), or by [`super::vfork`] when it joins
/// cgroups with the worker's identity.
#[derive(Debug)]
pub enum JobProcess {
    Std(Child),
    Vfork(super::vfork::Process),
}

impl JobProcess {
    /// The pid, until the process is reaped.
    pub fn id(&self) -> Option<u32> {
        match self {
            JobProcess::Std(c) => c.id(),
            JobProcess::Vfork(p) => Some(p.id()),
        }
    }

    /// Waits for the process to end and reaps it.
    pub async fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        match self {
            JobProcess::Std(c) => c.wait().await,
            JobProcess::Vfork(p) => p.wait().await,
        }
    }

    /// User and system CPU (microseconds) of the process and the children it waited for,
    /// once reaped; known where the worker reaps it itself (not through std).
    pub fn cpu_usec(&self) -> Option<(u64, u64)> {
        match self {
            JobProcess::Std(_) => None,
            JobProcess::Vfork(p) => p.cpu_usec(),
        }
    }
}

/// Resolves an output pattern to a path: `%N`/`%%` expanded, relative to the workdir.
pub fn output_path(pattern: &str, job_id: u64, node_name: &str, workdir: &Path) -> PathBuf {
    let fields = PatternFields {
        node_name: Some(node_name),
        // Only the default pattern carries %j here; the controller expanded the user's.
        job_id: pattern.is_empty().then_some(job_id),
        ..Default::default()
    };
    let pattern = if pattern.is_empty() {
        DEFAULT_OUTPUT
    } else {
        pattern
    };
    workdir.join(expand(pattern, &fields))
}

/// Resolves an `--input` pattern like an output one; `None` = `/dev/null`.
pub fn input_path(pattern: &str, node_name: &str, workdir: &Path) -> Option<PathBuf> {
    if pattern.is_empty() {
        return None;
    }
    let fields = PatternFields {
        node_name: Some(node_name),
        ..Default::default()
    };
    Some(workdir.join(expand(pattern, &fields)))
}

/// Where the script's streams go.
struct Streams<'a> {
    out: &'a Path,
    /// `None`: with stdout.
    err: Option<&'a Path>,
    /// `None`: `/dev/null`.
    input: Option<&'a Path>,
    append: bool,
}

/// Writes the script to the spool and starts it.
pub async fn start(spool: &Path, spec: &BatchSpec<'_>) -> Result<Started, LaunchError> {
    if !spec.script.starts_with("#!") {
        return Err(LaunchError::NotABatchScript);
    }
    match fs::metadata(spec.workdir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(LaunchError::Workdir {
                path: spec.workdir.to_owned(),
                source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        Err(source) => {
            return Err(LaunchError::Workdir {
                path: spec.workdir.to_owned(),
                source,
            });
        }
    }
    let spool_dir = spool.join(format!("job{}", spec.job_id));
    let script_path = write_script(&spool_dir, spec)?;

    let out_path = output_path(spec.stdout, spec.job_id, spec.node_name, spec.workdir);
    let err_path = (!spec.stderr.is_empty())
        .then(|| output_path(spec.stderr, spec.job_id, spec.node_name, spec.workdir))
        .filter(|p| *p != out_path);
    let in_path = input_path(spec.stdin, spec.node_name, spec.workdir);
    let streams = Streams {
        out: &out_path,
        err: err_path.as_deref(),
        input: in_path.as_deref(),
        append: spec.open_append,
    };

    let result = match spec.run_as {
        RunAs::Worker => start_as_worker(&script_path, spec, &streams).await,
        RunAs::User { uid, gid } => start_as_user(&script_path, spec, uid, gid, &streams)
            .await
            .map(JobProcess::Std),
    };
    match result {
        Ok(child) => {
            // A child that was spawned has a pid until it is reaped, which only we do.
            let pid = child.id().unwrap_or(0);
            Ok(Started {
                child,
                pid,
                spool_dir,
            })
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&spool_dir);
            Err(e)
        }
    }
}

/// Removes a job's spool directory: its script and the directory itself (two calls, where
/// a recursive removal stats, opens and lists first), or whatever else is there.
pub fn remove_spool(spool_dir: &Path) -> io::Result<()> {
    let _ = fs::remove_file(spool_dir.join(SCRIPT_NAME));
    match fs::remove_dir(spool_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => fs::remove_dir_all(spool_dir),
        Ok(()) => Ok(()),
    }
}

fn write_script(spool_dir: &Path, spec: &BatchSpec<'_>) -> Result<PathBuf, LaunchError> {
    let path = spool_dir.join(SCRIPT_NAME);
    let err = |source| LaunchError::Spool {
        path: path.clone(),
        source,
    };
    let mut dir = fs::DirBuilder::new();
    dir.mode(0o700);
    match dir.create(spool_dir) {
        // A leftover from a previous worker life with the same job id is stale.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_dir_all(spool_dir).map_err(err)?;
            dir.create(spool_dir).map_err(err)?;
        }
        r => r.map_err(err)?,
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(&path)
        .map_err(err)?;
    io::Write::write_all(&mut f, spec.script.as_bytes()).map_err(err)?;
    drop(f);
    if let RunAs::User { uid, gid } = spec.run_as {
        for p in [spool_dir, path.as_path()] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(err)?;
        }
    }
    Ok(path)
}

fn base_command(program: &Path, spec: &BatchSpec<'_>) -> io::Result<Command> {
    plain_command(program, spec.env, spec.workdir, spec.umask)
}

/// `program` with exactly `env` (and `SLURM_TASK_PID`, its own pid) and `umask` if given,
/// in `workdir`, stdin from `/dev/null`, in a process group of its own; nothing about
/// identity or cgroups.
pub(crate) fn plain_command(
    program: &Path,
    env: &BTreeMap<String, String>,
    workdir: &Path,
    umask: Option<u32>,
) -> io::Result<Command> {
    let mut cmd = Command::new(program);
    cmd.current_dir(workdir)
        .stdin(Stdio::null())
        // Own process group, so signals reach every process the script starts.
        .process_group(0)
        .kill_on_drop(false);
    envp::exec_with(&mut cmd, env, umask)?;
    Ok(cmd)
}

/// Opens (creates, and truncates or appends to) an output file. Non-blocking, so a FIFO
/// without a reader fails instead of hanging the worker; FIFOs and sockets are refused,
/// since a job's output must not wait on someone else's reader. Blocking mode is restored
/// for the job.
fn open_output(path: &Path, append: bool, umask: Option<u32>) -> Result<File, LaunchError> {
    let err = |source| LaunchError::Output {
        path: path.to_owned(),
        source,
    };
    let mut options = OpenOptions::new();
    if append {
        options.append(true);
    } else {
        options.write(true).truncate(true);
    }
    options.custom_flags(OFlag::O_NONBLOCK.bits());
    let Some(mask) = umask else {
        let file = options.create(true).mode(0o644).open(path).map_err(err)?;
        return refuse_fifo_then_block(file, err);
    };
    // The submitter's mask, as Slurm creates output files: a file made here gets exactly
    // what the mask allows (set again after the open, which the worker's own umask
    // narrowed); one that exists keeps its mode.
    let mode = 0o666 & !mask;
    let file = match options.clone().create_new(true).mode(mode).open(path) {
        Ok(f) => {
            f.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(err)?;
            f
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            options.create(true).mode(mode).open(path).map_err(err)?
        }
        Err(e) => return Err(err(e)),
    };
    refuse_fifo_then_block(file, err)
}

/// Opens the `--input` file for reading, under the same rules as output files: a FIFO with
/// no writer would block the job's start on someone else.
fn open_input(path: &Path) -> Result<File, LaunchError> {
    let err = |source| LaunchError::Input {
        path: path.to_owned(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(err)?;
    refuse_fifo_then_block(file, err)
}

fn refuse_fifo_then_block(
    file: File,
    err: impl Fn(io::Error) -> LaunchError,
) -> Result<File, LaunchError> {
    let kind = file.metadata().map_err(&err)?.file_type();
    if kind.is_fifo() || kind.is_socket() {
        return Err(err(io::Error::other("is a FIFO or socket, not a file")));
    }
    // Append mode lives in the status flags too; keep it while dropping O_NONBLOCK.
    let flags = fcntl(&file, FcntlArg::F_GETFL).map_err(|e| err(e.into()))?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(&file, FcntlArg::F_SETFL(flags)).map_err(|e| err(e.into()))?;
    Ok(file)
}

/// How often, and how long apart, an exec that failed with ETXTBSY is retried.
const TEXT_BUSY_RETRIES: u32 = 20;
const TEXT_BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// The job's stdin (if any), stdout and stderr, opened as the worker.
fn open_streams(
    input: Option<&Path>,
    out_path: &Path,
    err_path: Option<&Path>,
    append: bool,
    umask: Option<u32>,
) -> Result<(Option<File>, File, File), LaunchError> {
    let input = input.map(open_input).transpose()?;
    let out = open_output(out_path, append, umask)?;
    let err = match err_path {
        Some(p) => open_output(p, append, umask)?,
        // One open file description for both streams, so they share the offset.
        None => out.try_clone().map_err(|source| LaunchError::Output {
            path: out_path.to_owned(),
            source,
        })?,
    };
    Ok((input, out, err))
}

async fn start_as_worker(
    script: &Path,
    spec: &BatchSpec<'_>,
    streams: &Streams<'_>,
) -> Result<JobProcess, LaunchError> {
    let (out_path, err_path) = (streams.out, streams.err);
    // Opening can block (a hung network file system): off the runtime's threads.
    let (input, out, err) = {
        let (input, out, err) = (
            streams.input.map(Path::to_owned),
            out_path.to_owned(),
            err_path.map(Path::to_owned),
        );
        let (append, umask) = (streams.append, spec.umask);
        tokio::task::spawn_blocking(move || {
            open_streams(input.as_deref(), &out, err.as_deref(), append, umask)
        })
        .await
        .map_err(|e| LaunchError::Spawn {
            source: io::Error::other(e),
        })??
    };
    let clone = |f: &File, path: &Path| {
        f.try_clone().map_err(|source| LaunchError::Output {
            path: path.to_owned(),
            source,
        })
    };
    let mut attempt = 0;
    // Opened once, before the first attempt: the cgroup must be there and ours.
    let cgroup_procs = match &spec.confine {
        Some(c) => super::join::open_procs(&c.cgroup_procs)
            .map_err(|source| LaunchError::Spawn { source })?,
        None => Vec::new(),
    };
    let mut vfork = spec.confine.is_some();
    loop {
        if vfork {
            let spawned = super::vfork::spawn(&super::vfork::Spawn {
                program: script,
                args: &spec.argv.iter().map(Into::into).collect::<Vec<_>>(),
                env: spec.env,
                umask: spec.umask,
                workdir: spec.workdir,
                stdin: input.as_ref(),
                stdout: &out,
                stderr: &err,
                cgroup_procs: &cgroup_procs,
            });
            match spawned {
                Ok(p) => return Ok(JobProcess::Vfork(p)),
                // A kernel without CLONE_PIDFD: std's way below.
                Err(e) if e.kind() == io::ErrorKind::Unsupported => vfork = false,
                Err(e)
                    if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32)
                        && attempt < TEXT_BUSY_RETRIES =>
                {
                    attempt += 1;
                    tokio::time::sleep(TEXT_BUSY_PAUSE * attempt).await;
                    continue;
                }
                Err(source) => return Err(LaunchError::Spawn { source }),
            }
        }
        let mut cmd = match &spec.confine {
            Some(c) => c
                .command(
                    script,
                    spec.argv.iter().map(Into::into).collect(),
                    spec.env,
                    spec.workdir,
                    None,
                    spec.umask,
                )
                .map_err(|source| LaunchError::Spawn { source })?,
            None => base_command(script, spec).map_err(|source| LaunchError::Spawn { source })?,
        };
        if let (Some(f), Some(path)) = (&input, streams.input) {
            cmd.stdin(f.try_clone().map_err(|source| LaunchError::Input {
                path: path.to_owned(),
                source,
            })?);
        }
        if spec.confine.is_none() {
            cmd.args(spec.argv);
        }
        let spawned = cmd
            .stdout(clone(&out, out_path)?)
            .stderr(clone(&err, err_path.unwrap_or(out_path))?)
            .spawn();
        match spawned {
            // The script was written a moment ago; a process forked by another thread of
            // this worker in that window may still hold its write descriptor until that
            // child execs (close-on-exec), and exec of a file open for writing fails with
            // ETXTBSY. The window is short, so a brief retry is the standard remedy.
            Err(e)
                if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32)
                    && attempt < TEXT_BUSY_RETRIES =>
            {
                attempt += 1;
                tokio::time::sleep(TEXT_BUSY_PAUSE * attempt).await;
            }
            other => {
                return other
                    .map(JobProcess::Std)
                    .map_err(|source| LaunchError::Spawn { source });
            }
        }
    }
}

async fn start_as_user(
    script: &Path,
    spec: &BatchSpec<'_>,
    uid: u32,
    gid: u32,
    streams: &Streams<'_>,
) -> Result<Child, LaunchError> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "-c".into(),
        REDIRECT_SCRIPT.into(),
        "tandem-batch".into(),
        streams.out.into(),
        streams.err.map(Path::as_os_str).unwrap_or_default().into(),
        streams
            .input
            .map(Path::as_os_str)
            .unwrap_or_default()
            .into(),
        (if streams.append { "append" } else { "truncate" }).into(),
        script.into(),
    ];
    args.extend(spec.argv.iter().map(Into::into));
    let mut cmd = match &spec.confine {
        Some(c) => {
            let user = User {
                uid,
                gid,
                groups: exec::user_groups(uid, gid),
            };
            c.command(
                Path::new(REDIRECT_SHELL),
                args,
                spec.env,
                spec.workdir,
                Some(user),
                spec.umask,
            )
            .map_err(|source| LaunchError::Spawn { source })?
        }
        None => {
            let mut cmd = base_command(Path::new(REDIRECT_SHELL), spec)
                .map_err(|source| LaunchError::Spawn { source })?;
            cmd.args(args).uid(uid).gid(gid);
            cmd
        }
    };
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|source| LaunchError::Spawn { source })?;
    // EOF arrives when the shell's redirection replaced the pipe; text before it is an error.
    let mut message = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let read = tokio::time::timeout(REDIRECT_TIMEOUT, pipe.read_to_string(&mut message));
        if read.await.is_err() {
            // Opening blocked (a FIFO nobody reads, a hung file system): give up on the job.
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(LaunchError::Redirect {
                uid,
                message: format!(
                    "opening the input or output files did not finish within {}s",
                    REDIRECT_TIMEOUT.as_secs()
                ),
            });
        }
    }
    if message.trim().is_empty() {
        return Ok(child);
    }
    let _ = child.wait().await;
    Err(LaunchError::Redirect {
        uid,
        message: message.trim().to_owned(),
    })
}

/// Makes the spool directory, traversable by job users so they can execute their own
/// scripts.
pub fn prepare_spool(spool: &Path) -> io::Result<PathBuf> {
    fs::create_dir_all(spool)?;
    fs::set_permissions(spool, fs::Permissions::from_mode(0o711))?;
    Ok(spool.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spool_directory_goes_whatever_it_holds() {
        let tmp = tempfile::tempdir().unwrap();
        let usual = tmp.path().join("job1");
        fs::create_dir(&usual).unwrap();
        fs::write(usual.join(SCRIPT_NAME), "#!/bin/sh\n").unwrap();
        remove_spool(&usual).unwrap();
        assert!(!usual.exists());
        // Something else beside the script: the recursive removal takes it.
        let more = tmp.path().join("job2");
        fs::create_dir_all(more.join("sub")).unwrap();
        fs::write(more.join(SCRIPT_NAME), "").unwrap();
        fs::write(more.join("sub/x"), "").unwrap();
        remove_spool(&more).unwrap();
        assert!(!more.exists());
        // Gone already: nothing to do.
        remove_spool(&more).unwrap();
    }

    #[test]
    fn cgroups_always_confine_a_user_switch_only_with_the_launcher() {
        let launcher = Launcher {
            program: PathBuf::from("/usr/bin/tandem-slurm"),
            args: vec!["__job-exec".into()],
        };
        for (cgroups, user, with_launcher, want) in [
            (true, false, false, true),
            (true, true, false, true),
            (true, false, true, true),
            (false, true, true, true),
            (false, true, false, false),
            (false, false, true, false),
        ] {
            let l = with_launcher.then_some(&launcher);
            assert_eq!(
                confined(cgroups, user, l),
                want,
                "{cgroups} {user} {with_launcher}"
            );
        }
    }

    #[tokio::test]
    async fn without_the_launcher_a_job_still_joins_its_cgroups_or_does_not_start() {
        let tmp = tempfile::tempdir().unwrap();
        let procs = tmp.path().join("cgroup.procs");
        fs::write(&procs, "").unwrap();
        let confine = Confinement {
            launcher: None,
            exec_dir: tmp.path(),
            request_name: "job1.batch".into(),
            cgroup_procs: vec![procs.clone()],
            exec_failed_code: None,
        };
        let env = BTreeMap::new();
        // The worker's own identity: the child joins by itself.
        let mut cmd = confine
            .command(Path::new("/bin/true"), vec![], &env, tmp.path(), None, None)
            .unwrap();
        assert!(cmd.status().await.unwrap().success());
        assert_eq!(fs::read_to_string(&procs).unwrap(), "0");
        // A user switch inside cgroups takes the launcher: refused, not run unconfined.
        let user = User {
            uid: 1000,
            gid: 1000,
            groups: vec![1000],
        };
        let err = confine
            .command(
                Path::new("/bin/true"),
                vec![],
                &env,
                tmp.path(),
                Some(user),
                None,
            )
            .unwrap_err();
        assert!(err.to_string().contains("launcher"), "{err}");
        assert_eq!(
            fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no request written"
        );
    }

    #[test]
    fn run_as_follows_the_uids() {
        assert_eq!(RunAs::decide(1000, 1000, 100).unwrap(), RunAs::Worker);
        assert_eq!(
            RunAs::decide(0, 1000, 100).unwrap(),
            RunAs::User {
                uid: 1000,
                gid: 100
            }
        );
        assert_eq!(RunAs::decide(0, 0, 0).unwrap(), RunAs::Worker);
        let err = RunAs::decide(1000, 1001, 100).unwrap_err();
        assert!(err.to_string().contains("cannot start jobs of uid 1001"));
    }

    #[test]
    fn output_paths_expand_node_and_default() {
        let wd = Path::new("/work/alice");
        assert_eq!(
            output_path("", 42, "n1", wd),
            PathBuf::from("/work/alice/slurm-42.out")
        );
        assert_eq!(
            output_path("logs/%N-%j.out", 42, "n1", wd),
            PathBuf::from("/work/alice/logs/n1-%j.out"),
            "controller expands %j; worker only %N"
        );
        assert_eq!(
            output_path("/abs/x%%.out", 1, "n1", wd),
            PathBuf::from("/abs/x%.out")
        );
        // The controller sends `%%N` for a literal `%N`: one expansion here, not two.
        assert_eq!(
            output_path("/abs/x%%N.out", 1, "n1", wd),
            PathBuf::from("/abs/x%N.out")
        );
    }

    #[test]
    fn input_path_expands_the_node_and_defaults_to_none() {
        let wd = Path::new("/work/alice");
        assert_eq!(input_path("", "n1", wd), None);
        assert_eq!(
            input_path("in-%N.txt", "n1", wd),
            Some(PathBuf::from("/work/alice/in-n1.txt"))
        );
        assert_eq!(
            input_path("/dev/null", "n1", wd),
            Some(PathBuf::from("/dev/null"))
        );
    }

    #[test]
    fn launch_error_line_carries_the_cause() {
        let e = LaunchError::Workdir {
            path: PathBuf::from("/nope"),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        let line = e.one_line();
        assert!(line.starts_with("working directory /nope is not usable: "));
        assert!(!line.contains('\n'));
    }
}
