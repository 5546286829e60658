//! The installed components as processes: the built binaries, found beside `tandem`, each
//! run with its log in a file and killed when its handle drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The three binaries the story runs (the image's contents).
#[derive(Debug, Clone)]
pub struct Bins {
    pub tandem: PathBuf,
    pub operator: PathBuf,
    pub bridge: PathBuf,
}

impl Bins {
    /// The binaries in `dir` (`target/<profile>`).
    pub fn in_dir(dir: &Path) -> Self {
        let exe = |n: &str| dir.join(format!("{n}{}", std::env::consts::EXE_SUFFIX));
        Self {
            tandem: exe("tandem"),
            operator: exe("tandem-operator"),
            bridge: exe("tandem-bridge"),
        }
    }

    /// Those not built yet.
    pub fn missing(&self) -> Vec<&Path> {
        [&self.tandem, &self.operator, &self.bridge]
            .into_iter()
            .filter(|p| !p.is_file())
            .map(PathBuf::as_path)
            .collect()
    }
}

/// A child process, killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `bin args` with `env` added, stdout and stderr to `log`.
    pub fn spawn(
        bin: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
        log: PathBuf,
    ) -> std::io::Result<Self> {
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let mut c = Command::new(bin);
        c.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
        for (k, v) in env {
            c.env(k, v);
        }
        Ok(Self {
            child: c.spawn()?,
            log,
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        crate::bounded::kill_and_reap(&mut self.child, std::time::Duration::from_secs(10));
    }
}
