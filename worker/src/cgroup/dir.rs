//! A cgroup directory named relative to its node's base directory, which the worker holds
//! open.
//!
//! A job's cgroup files sit ten path components deep (`/sys/fs/cgroup/memory/<the worker's
//! own cgroup>/tandem/NODE/job_N/step_batch/...`), and every `mkdir`, `rmdir` and `open`
//! by full path makes the kernel walk and permission-check each component again. A job
//! costs some forty such calls on v1, and the walks were a fifth of the worker's own CPU per
//! trivial job. Relative to a descriptor of `tandem/NODE` (`O_PATH`: it grants nothing
//! beyond naming the directory) each call walks two or three components.
//!
//! Files are read without `fstat` (std sizes its buffer with one, which cgroupfs answers
//! with size 0 anyway) and written as `fs::write` does.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

#[derive(Debug)]
struct Base {
    fd: OwnedFd,
    path: PathBuf,
}

/// A directory at or below an open base directory.
#[derive(Debug, Clone)]
pub struct Dir {
    base: Arc<Base>,
    /// Relative to the base; `.` for the base itself.
    rel: PathBuf,
}

impl Dir {
    /// Opens `path` (an existing directory) as a base.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| with_path(e, path))?;
        Ok(Self {
            base: Arc::new(Base {
                fd,
                path: path.to_owned(),
            }),
            rel: PathBuf::from("."),
        })
    }

    /// The directory `name` below this one (which need not exist).
    pub fn join(&self, name: &str) -> Self {
        Self {
            base: Arc::clone(&self.base),
            rel: if self.rel == Path::new(".") {
                PathBuf::from(name)
            } else {
                self.rel.join(name)
            },
        }
    }

    /// The full path, for messages and for processes that open it themselves.
    pub fn path(&self) -> PathBuf {
        if self.rel == Path::new(".") {
            self.base.path.clone()
        } else {
            self.base.path.join(&self.rel)
        }
    }

    /// The last component (`job_7`, `step_batch`).
    pub fn name(&self) -> Option<&str> {
        self.rel.file_name().and_then(|n| n.to_str())
    }

    /// Creates this directory; its parent must exist. An existing one is an error
    /// (`AlreadyExists`): callers decide whether that is a stale directory to clear.
    pub fn create(&self) -> io::Result<()> {
        mkdirat(&self.base.fd, &self.rel, Mode::from_bits_truncate(0o755))
            .map_err(|e| with_path(e, &self.path()))
    }

    /// Removes this (empty, for cgroupfs: process-free and childless) directory.
    pub fn remove(&self) -> io::Result<()> {
        unlinkat(&self.base.fd, &self.rel, UnlinkatFlags::RemoveDir).map_err(io::Error::from)
    }

    pub fn is_dir(&self) -> bool {
        self.link_count().is_some()
    }

    /// The directory's link count (2 + its subdirectories where the file system keeps
    /// it, as cgroupfs does); `None` when it is not a directory or cannot be looked at.
    pub fn link_count(&self) -> Option<u64> {
        let st = fstatat(&self.base.fd, &self.rel, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        (SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
            .then_some(st.st_nlink)
    }

    /// Whether the file `name` exists here.
    pub fn has(&self, name: &str) -> bool {
        fstatat(
            &self.base.fd,
            &self.rel.join(name),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok()
    }

    /// The whole of the file `name`.
    pub fn read(&self, name: &str) -> io::Result<String> {
        let mut f = File::from(self.open_file(name, OFlag::O_RDONLY)?);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        String::from_utf8(out).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Writes `data` to the file `name` in one call, created if missing (a plain directory
    /// standing in for cgroupfs in tests), as `fs::write` does.
    pub fn write(&self, name: &str, data: impl AsRef<[u8]>) -> io::Result<()> {
        let fd = self.open_file(name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC)?;
        File::from(fd).write_all(data.as_ref())
    }

    fn open_file(&self, name: &str, flags: OFlag) -> io::Result<OwnedFd> {
        openat(
            &self.base.fd,
            &self.rel.join(name),
            flags | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(io::Error::from)
    }

    /// Names of the directories in this one (a listing: cgroupfs lists every control file
    /// too, so callers look at [`Dir::link_count`] first).
    pub fn list_dirs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.path()) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    }
}

fn with_path(e: Errno, path: &Path) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn works_relative_to_the_base_and_names_full_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let base = Dir::open(tmp.path()).unwrap();
        assert_eq!(base.path(), tmp.path());
        let job = base.join("job_7");
        assert_eq!(job.path(), tmp.path().join("job_7"));
        assert_eq!(job.name(), Some("job_7"));
        assert!(!job.is_dir());
        job.create().unwrap();
        let again = job.create().unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        assert!(again.to_string().contains("job_7"), "{again}");
        let step = job.join("step_batch");
        step.create().unwrap();
        assert_eq!(step.path(), tmp.path().join("job_7/step_batch"));
        assert_eq!(job.link_count(), Some(3));
        assert_eq!(job.list_dirs(), ["step_batch"]);

        step.write("cgroup.procs", "12\n13\n").unwrap();
        assert!(step.has("cgroup.procs"));
        assert!(!step.has("cgroup.kill"));
        assert_eq!(step.read("cgroup.procs").unwrap(), "12\n13\n");
        // Longer than one read.
        let long = "x".repeat(10_000);
        step.write("big", &long).unwrap();
        assert_eq!(step.read("big").unwrap(), long);
        assert_eq!(
            step.read("missing").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::remove_file(step.path().join("cgroup.procs")).unwrap();
        std::fs::remove_file(step.path().join("big")).unwrap();

        // Not empty: refused, and nothing removed.
        assert!(job.remove().is_err());
        step.remove().unwrap();
        job.remove().unwrap();
        assert!(!tmp.path().join("job_7").exists());
        assert_eq!(job.remove().unwrap_err().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_missing_base_is_an_error_naming_it() {
        let err = Dir::open(Path::new("/nonexistent/tandem/n1")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("/nonexistent/tandem/n1"), "{err}");
    }
}
