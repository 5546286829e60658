//! The job launcher: the last step between the worker and a job's program when it drops from
//! root to the job's user, run as a process of its own (`tandem __job-exec REQUEST` or the
//! `tandem-job-exec` test binary). (A process that keeps the worker's identity joins its
//! cgroups in the forked child instead: [`super::join`].)
//!
//! In a separate process, every step is ordinary safe code that can say what failed (a
//! `pre_exec` hook after a multi-threaded fork may not allocate, so it could only pass an
//! errno back). The launcher joins the cgroup, takes the user's supplementary groups and
//! drops root, then `exec`s the program in place (same pid, same process group):
//!
//! 1. writes `0` ("this process") into each of its step's join files (v1's `tasks`, v2's
//!    `cgroup.procs`; it has no other thread yet), so the job is inside its cgroup before it
//!    runs a single instruction of its own;
//! 2. as root: `setgroups(the user's groups)`, `setgid`, `setuid` (the order `initgroups`
//!    followed by a privilege drop needs);
//! 3. `chdir` to the working directory as the user and `exec` with the job's environment.
//!
//! The request travels in a file in the worker's private `exec` directory (mode 0700,
//! the worker's own), never in the launcher's environment or arguments: the launcher runs
//! as root, so a job environment's `LD_PRELOAD` must not apply to it, and arguments are
//! world-readable in `/proc/PID/cmdline`. The launcher reads and removes the file first.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::unistd::{Gid, Uid};

/// The subcommand of the `tandem` binary that runs [`main`].
pub const SUBCOMMAND: &str = "__job-exec";
/// Exit code when the launcher itself fails (the shell's "command not found or not run").
pub const EXIT_LAUNCH_FAILED: u8 = 127;
/// A request larger than this is refused (environments are far smaller).
const MAX_REQUEST: u64 = 64 << 20;
const TEXT_BUSY_RETRIES: u32 = 20;

/// The user a job runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary gid included, as `initgroups` sets them).
    pub groups: Vec<u32>,
}

/// Everything the launcher does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub cgroup_procs: Vec<PathBuf>,
    /// `None`: keep the launcher's identity (the worker's).
    pub user: Option<User>,
    pub workdir: PathBuf,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    /// A variable the launcher sets to its own pid, which the program keeps across `exec`
    /// (`SLURM_TASK_PID`).
    pub pid_var: Option<OsString>,
    /// File-creation mask the program runs with; `None`: the launcher's (the worker's).
    pub umask: Option<u32>,
    /// Exit code when the program cannot be executed; `None` = [`EXIT_LAUNCH_FAILED`]
    /// (steps use 2, as slurmstepd does).
    pub exec_failed_code: Option<u8>,
}

/// How to start the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub program: PathBuf,
    /// Arguments before the request file (`__job-exec` for the `tandem` binary).
    pub args: Vec<OsString>,
}

/// The binary installed beside `tandem` with the Slurm commands and [`SUBCOMMAND`] only
/// (no daemons): the worker starts jobs through it when it is there.
pub const SLIM_BINARY: &str = "tandem-slurm";

impl Launcher {
    /// `tandem-slurm __job-exec` when [`SLIM_BINARY`] sits beside the running binary with
    /// the same owner and no wider write access, else the running binary itself.
    ///
    /// Every job start execs the launcher as root; the slim binary is a tenth of `tandem`'s
    /// size, so the exec maps, faults in and relocates that much less (measured: ~0.3 ms
    /// less CPU per start on a 2-core VM, at a few hundred jobs a second).
    pub fn for_this_binary() -> io::Result<Self> {
        let exe = std::env::current_exe()?;
        let slim = exe.with_file_name(SLIM_BINARY);
        let program = if is_trusted_like(&slim, &exe) {
            slim
        } else {
            exe
        };
        Ok(Self {
            program,
            args: vec![SUBCOMMAND.into()],
        })
    }
}

/// Whether `candidate` is a regular file that nobody can replace who could not already
/// replace `exe`: same owner, and group/other write bits a subset of `exe`'s.
fn is_trusted_like(candidate: &Path, exe: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(c), Ok(e)) = (fs::metadata(candidate), fs::metadata(exe)) else {
        return false;
    };
    let wider = c.mode() & 0o022 & !(e.mode() & 0o022);
    c.is_file() && c.uid() == e.uid() && wider == 0
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("launch request field {0:?} is unknown")]
    UnknownField(String),
    #[error("launch request field {field} has a bad value {value:?}")]
    BadValue { field: &'static str, value: String },
    #[error("launch request has no program")]
    NoProgram,
    #[error("launch request names a gid or groups without a uid")]
    PartialUser,
}

/// NUL-separated `key=value` records (neither arguments nor environment can hold a NUL).
pub fn encode(r: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    let mut put = |k: &str, v: &[u8]| {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v);
        out.push(0);
    };
    for p in &r.cgroup_procs {
        put("cgroup", p.as_os_str().as_bytes());
    }
    if let Some(u) = &r.user {
        put("uid", u.uid.to_string().as_bytes());
        put("gid", u.gid.to_string().as_bytes());
        for g in &u.groups {
            put("group", g.to_string().as_bytes());
        }
    }
    put("cwd", r.workdir.as_os_str().as_bytes());
    put("program", r.program.as_os_str().as_bytes());
    for a in &r.args {
        put("arg", a.as_bytes());
    }
    if let Some(code) = r.exec_failed_code {
        put("failcode", code.to_string().as_bytes());
    }
    if let Some(var) = &r.pid_var {
        put("pidvar", var.as_bytes());
    }
    if let Some(m) = r.umask {
        put("umask", m.to_string().as_bytes());
    }
    for (k, v) in &r.env {
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        put("env", &kv);
    }
    out
}

pub fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
    let mut r = Request::default();
    let (mut uid, mut gid, mut groups) = (None, None, Vec::new());
    let mut program = None;
    let num = |field: &'static str, v: &[u8]| -> Result<u32, DecodeError> {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| DecodeError::BadValue {
                field,
                value: String::from_utf8_lossy(v).into_owned(),
            })
    };
    for rec in bytes.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let eq = rec.iter().position(|b| *b == b'=');
        let (key, value) = match eq {
            Some(i) => (&rec[..i], &rec[i + 1..]),
            None => (rec, &[][..]),
        };
        let os = |v: &[u8]| OsString::from_vec(v.to_vec());
        match key {
            b"cgroup" => r.cgroup_procs.push(PathBuf::from(os(value))),
            b"uid" => uid = Some(num("uid", value)?),
            b"gid" => gid = Some(num("gid", value)?),
            b"group" => groups.push(num("group", value)?),
            b"cwd" => r.workdir = PathBuf::from(os(value)),
            b"failcode" => {
                let code = num("failcode", value)?;
                r.exec_failed_code =
                    Some(u8::try_from(code).map_err(|_| DecodeError::BadValue {
                        field: "failcode",
                        value: code.to_string(),
                    })?);
            }
            b"program" => program = Some(PathBuf::from(os(value))),
            b"arg" => r.args.push(os(value)),
            b"pidvar" => r.pid_var = Some(os(value)),
            b"umask" => r.umask = Some(num("umask", value)? & 0o777),
            b"env" => {
                let Some(i) = value.iter().position(|b| *b == b'=').filter(|i| *i > 0) else {
                    return Err(DecodeError::BadValue {
                        field: "env",
                        value: String::from_utf8_lossy(value).into_owned(),
                    });
                };
                r.env.push((os(&value[..i]), os(&value[i + 1..])));
            }
            other => {
                return Err(DecodeError::UnknownField(
                    String::from_utf8_lossy(other).into_owned(),
                ));
            }
        }
    }
    r.program = program
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or(DecodeError::NoProgram)?;
    r.user = match (uid, gid) {
        (Some(uid), Some(gid)) => Some(User { uid, gid, groups }),
        (None, None) if groups.is_empty() => None,
        _ => return Err(DecodeError::PartialUser),
    };
    Ok(r)
}

/// The supplementary groups of `uid` as `initgroups` would set them: its groups from the
/// group database, `gid` included. A uid without a passwd entry gets `gid` alone.
pub fn user_groups(uid: u32, gid: u32) -> Vec<u32> {
    let name = nix::unistd::User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .and_then(|u| std::ffi::CString::new(u.name).ok());
    let mut groups: Vec<u32> = name
        .and_then(|n| nix::unistd::getgrouplist(&n, Gid::from_raw(gid)).ok())
        .map(|g| g.into_iter().map(Gid::as_raw).collect())
        .unwrap_or_default();
    if !groups.contains(&gid) {
        groups.insert(0, gid);
    }
    groups
}

/// `tandem __job-exec REQUEST`: reads the request, joins, drops, execs. Returns only on
/// failure, after printing why on stderr (the worker's pipe or the job's error file).
pub fn main(args: &[OsString]) -> ExitCode {
    ExitCode::from(main_code(args))
}

/// [`main`], returning the exit code as a number (for a caller that exits by itself).
pub fn main_code(args: &[OsString]) -> u8 {
    let (err, code) = match args {
        [path] => run(Path::new(path)),
        _ => (
            format!("usage: tandem {SUBCOMMAND} REQUEST_FILE (started by the worker)"),
            None,
        ),
    };
    eprintln!("tandem: job launch failed: {err}");
    code.unwrap_or(EXIT_LAUNCH_FAILED)
}

/// Does the launch; returns only the reason it failed, and the exit code to fail with.
fn run(path: &Path) -> (String, Option<u8>) {
    let request = match read_request(path) {
        Ok(r) => r,
        Err(e) => return (e, None),
    };
    (prepare_and_exec(&request), request.exec_failed_code)
}

fn prepare_and_exec(request: &Request) -> String {
    for procs in &request.cgroup_procs {
        if let Err(e) = fs::write(procs, "0") {
            return format!("cannot join cgroup {}: {e}", procs.display());
        }
    }
    if let Some(u) = &request.user {
        let groups: Vec<Gid> = u.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        if let Err(e) = nix::unistd::setgroups(&groups) {
            return format!("setgroups({:?}): {e}", u.groups);
        }
        if let Err(e) = nix::unistd::setgid(Gid::from_raw(u.gid)) {
            return format!("setgid({}): {e}", u.gid);
        }
        if let Err(e) = nix::unistd::setuid(Uid::from_raw(u.uid)) {
            return format!("setuid({}): {e}", u.uid);
        }
        // setuid from root drops every privilege; being able to get root back would mean
        // the drop did not happen.
        if u.uid != 0 && nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
            return "privileges were not dropped".into();
        }
    }
    if let Some(m) = request.umask {
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(m & 0o777));
    }
    let mut attempt = 0;
    loop {
        let mut cmd = std::process::Command::new(&request.program);
        cmd.args(&request.args)
            .env_clear()
            .envs(
                request
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_os_str(), v.as_os_str())),
            )
            .current_dir(&request.workdir);
        if let Some(var) = &request.pid_var {
            // `exec` keeps this process's pid: it is the program's.
            cmd.env(var, std::process::id().to_string());
        }
        let e = cmd.exec();
        // See `process::start_as_worker`: a freshly written script may be briefly busy.
        if e.raw_os_error() == Some(nix::errno::Errno::ETXTBSY as i32)
            && attempt < TEXT_BUSY_RETRIES
        {
            attempt += 1;
            std::thread::sleep(std::time::Duration::from_millis(5 * u64::from(attempt)));
            continue;
        }
        return format!("{}: {e}", display(request.program.as_os_str()));
    }
}

fn display(s: &OsStr) -> String {
    s.to_string_lossy().into_owned()
}

fn read_request(path: &Path) -> Result<Request, String> {
    let mut bytes = Vec::new();
    let file = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.take(MAX_REQUEST)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Read once: removed before anything else happens.
    let _ = fs::remove_file(path);
    decode(&bytes).map_err(|e| e.to_string())
}

/// Writes a request for the launcher into `dir` (the worker's private directory) under
/// `name`; the launcher removes it.
pub fn write_request(dir: &Path, name: &str, r: &Request) -> io::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let _ = fs::remove_file(&path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    io::Write::write_all(&mut f, &encode(r))?;
    Ok(path)
}

/// The worker's private directory for launch requests.
pub fn prepare_dir(state_dir: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = state_dir.join("exec");
    fs::create_dir_all(&dir)?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Request {
        Request {
            cgroup_procs: vec![
                "/sys/fs/cgroup/memory/tandem/n1/job_7/step_batch/cgroup.procs".into(),
                "/sys/fs/cgroup/freezer/tandem/n1/job_7/step_batch/cgroup.procs".into(),
            ],
            user: Some(User {
                uid: 1000,
                gid: 100,
                groups: vec![100, 27, 999],
            }),
            workdir: "/home/a b".into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "echo \"$1\"\nexit 3".into(), "x=y".into()],
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("EQ".into(), "a=b=c".into()),
                ("EMPTY".into(), "".into()),
                ("NL".into(), "two\nlines".into()),
            ],
            pid_var: Some("SLURM_TASK_PID".into()),
            umask: Some(0o027),
            exec_failed_code: Some(2),
        }
    }

    #[test]
    fn a_slim_launcher_is_used_only_when_nobody_else_could_have_put_it_there() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("tandem");
        let slim = dir.path().join(SLIM_BINARY);
        fs::write(&exe, "").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(!is_trusted_like(&slim, &exe), "missing");
        fs::create_dir(&slim).unwrap();
        assert!(!is_trusted_like(&slim, &exe), "a directory");
        fs::remove_dir(&slim).unwrap();
        fs::write(&slim, "").unwrap();
        fs::set_permissions(&slim, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(is_trusted_like(&slim, &exe));
        fs::set_permissions(&slim, fs::Permissions::from_mode(0o757)).unwrap();
        assert!(
            !is_trusted_like(&slim, &exe),
            "world-writable beside a 0755 tandem"
        );
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(is_trusted_like(&slim, &exe), "no wider than tandem itself");
    }

    #[test]
    fn requests_round_trip() {
        let r = sample();
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        let plain = Request {
            program: "/x".into(),
            ..Default::default()
        };
        assert_eq!(decode(&encode(&plain)).unwrap(), plain);
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(decode(b"cwd=/\0"), Err(DecodeError::NoProgram));
        assert_eq!(
            decode(b"program=/x\0shell=/bin/sh\0"),
            Err(DecodeError::UnknownField("shell".into()))
        );
        assert!(matches!(
            decode(b"program=/x\0uid=root\0gid=0\0"),
            Err(DecodeError::BadValue { field: "uid", .. })
        ));
        assert_eq!(
            decode(b"program=/x\0gid=0\0"),
            Err(DecodeError::PartialUser)
        );
        assert!(matches!(
            decode(b"program=/x\0env==v\0"),
            Err(DecodeError::BadValue { field: "env", .. })
        ));
    }

    #[test]
    fn groups_always_hold_the_primary_gid() {
        // uid 0 exists everywhere; its groups come from the database, gid included.
        let g = user_groups(0, 0);
        assert!(g.contains(&0), "{g:?}");
        // A uid without a passwd entry gets its primary group only.
        assert_eq!(user_groups(4_000_000_000, 4242), vec![4242]);
    }

    #[test]
    fn request_files_are_private_and_read_once() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = prepare_dir(tmp.path()).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let p = write_request(&dir, "job7", &sample()).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(read_request(&p).unwrap(), sample());
        assert!(!p.exists(), "removed once read");
    }
}
