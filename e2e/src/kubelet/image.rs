//! The image table: which local program stands in for which container image (pure).
//!
//! There is no container runtime here, so an image is described by what a process needs
//! from it: its `ENTRYPOINT`/`CMD` and where its executables live on this machine. A test
//! maps `tandem:dev` to the freshly built `tandem` binary and `busybox`-like images to the
//! host's own shell and tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

/// What one image provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The image's `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// The image's `CMD`.
    pub cmd: Vec<String>,
    /// Executables the image carries, by file name (so `/usr/bin/sbatch` and `sbatch` both
    /// find the entry `sbatch`). The process sees the name it was called by as `argv[0]`,
    /// which is what a multi-call binary dispatches on.
    pub bins: BTreeMap<String, PathBuf>,
    /// Directories whose executables the image also carries, by file name (looked up when
    /// a container starts, so binaries built after the table was made are found).
    pub dirs: Vec<PathBuf>,
    /// Whether a command not in `bins` is looked up on this machine's `PATH` (a
    /// busybox-like image that has `sh`, `sleep`, `echo`, ...).
    pub host_tools: bool,
    /// A directory of links the image puts first on its containers' `PATH` (its `ENV
    /// PATH`), made when a container starts: name -> the file it runs. So a process the
    /// container starts by name (a batch script calling `scontrol`) finds the image's
    /// commands, as in the real image, whose Dockerfile links the CLI names.
    pub path_links: Option<PathLinks>,
}

/// The links an image's `PATH` directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathLinks {
    pub dir: PathBuf,
    pub links: BTreeMap<String, PathBuf>,
}

impl PathLinks {
    /// Makes (or refreshes) every link. Concurrent kubelets may do this at once: each link
    /// is made under a unique name and renamed into place, which is atomic.
    fn ensure(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        for (name, target) in &self.links {
            let link = self.dir.join(name);
            if std::fs::read_link(&link).is_ok_and(|t| t == *target) {
                continue;
            }
            let tmp = self.dir.join(format!(
                ".{name}.{}.{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::os::unix::fs::symlink(target, &tmp)?;
            std::fs::rename(&tmp, &link)?;
        }
        Ok(())
    }
}

impl Image {
    /// A busybox/alpine-like image: every command comes from the host, `CMD` is `sh`.
    pub fn host_shell() -> Self {
        Self {
            entrypoint: Vec::new(),
            cmd: vec!["sh".into()],
            bins: BTreeMap::new(),
            dirs: Vec::new(),
            host_tools: true,
            path_links: None,
        }
    }

    /// An image whose entrypoint is one binary, reachable under each of `names` (a
    /// multi-call binary such as `tandem`, also called as `sbatch`, `squeue`, ...). Other
    /// commands (`sh` in a script) come from the host.
    pub fn binary(path: impl Into<PathBuf>, names: &[&str]) -> Self {
        let path = path.into();
        let main = names.first().copied().unwrap_or("entrypoint");
        Self {
            entrypoint: vec![main.to_owned()],
            cmd: Vec::new(),
            bins: names
                .iter()
                .map(|n| ((*n).to_owned(), path.clone()))
                .collect(),
            dirs: Vec::new(),
            host_tools: true,
            path_links: None,
        }
    }

    /// An image holding every executable in `dir` under its file name (no `ENTRYPOINT`:
    /// containers name their command), plus the host's tools.
    pub fn directory(dir: impl Into<PathBuf>) -> Self {
        Self {
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            bins: BTreeMap::new(),
            dirs: vec![dir.into()],
            host_tools: true,
            path_links: None,
        }
    }

    /// Tandem's image (`ghcr.io/tandem-dev/tandem`) from a build directory
    /// (`target/debug`): every binary there (`tandem`, `tandem-operator`, `tandem-bridge`),
    /// the CLI names (`sbatch`, `squeue`, ...) as names of `tandem`, `ENTRYPOINT ["tandem"]`,
    /// and those names on the containers' `PATH` as the Dockerfile links them (in
    /// `<build_dir>/tandem-image-bin`, since the build directory has only `tandem`).
    pub fn tandem(build_dir: impl Into<PathBuf>) -> Self {
        let dir = build_dir.into();
        let tandem = dir.join(format!("tandem{}", std::env::consts::EXE_SUFFIX));
        let path_links = PathLinks {
            dir: dir.join("tandem-image-bin"),
            links: TANDEM_NAMES
                .iter()
                .map(|n| ((*n).to_owned(), tandem.clone()))
                .collect(),
        };
        Self {
            dirs: vec![dir],
            path_links: Some(path_links),
            ..Self::binary(tandem, &TANDEM_NAMES)
        }
    }

    /// The file for a command name, if the image has one.
    fn find(&self, file_name: &str) -> Option<PathBuf> {
        if let Some(path) = self.bins.get(file_name) {
            return Some(path.clone());
        }
        self.dirs
            .iter()
            .map(|d| d.join(file_name))
            .find(|p| is_executable(p))
    }
}

/// The names the multi-call `tandem` binary answers to (by `argv[0]`): `tandem` and
/// `tandem_cli::SLURM_COMMANDS`, what `tandem links` makes and the Dockerfile links.
pub const TANDEM_NAMES: [&str; 11] = [
    "tandem", "sbatch", "squeue", "scancel", "sinfo", "sacct", "scontrol", "srun", "sacctmgr",
    "sshare", "sprio",
];

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Images by reference. A key with a tag (`tandem:dev`) matches that tag only; a key
/// without one (`busybox`) matches every tag and digest of that repository.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageTable {
    images: BTreeMap<String, Image>,
}

/// How to start a container's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The file to execute, or a bare name to find on `PATH`.
    pub program: PathBuf,
    /// `argv[0]` as the container called it.
    pub arg0: String,
    pub args: Vec<String>,
    /// A directory to put first on the process's `PATH` (the image's `ENV PATH`); the
    /// container's own `PATH` variable, if it sets one, still wins.
    pub path: Option<PathBuf>,
}

/// Why a container cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchError {
    /// The image is not in the table: the kubelet's `ErrImagePull`.
    UnknownImage(String),
    /// Neither the container nor the image names a command (`CreateContainerError`).
    NoCommand,
    /// The command is not in the image (the runtime's `StartError`, exit code 128).
    NotFound(String),
    /// The image's `PATH` links could not be made.
    PathLinks(String),
}

impl ImageTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces an image.
    pub fn with(mut self, reference: impl Into<String>, image: Image) -> Self {
        self.images.insert(reference.into(), image);
        self
    }

    /// The usual table for Tandem's tests: `busybox`, `alpine`, `ubuntu` and `debian` run
    /// host tools; `tandem:dev` is the given `tandem` binary.
    pub fn standard(tandem: Option<&Path>) -> Self {
        let mut table = Self::new();
        for name in ["busybox", "alpine", "ubuntu", "debian"] {
            table = table.with(name, Image::host_shell());
        }
        if let Some(path) = tandem {
            table = table.with("tandem:dev", Image::binary(path, &TANDEM_NAMES));
        }
        table
    }

    /// The image a reference names, if the table has it.
    pub fn lookup(&self, reference: &str) -> Option<&Image> {
        if let Some(image) = self.images.get(reference) {
            return Some(image);
        }
        let (repo, tag) = split_reference(reference);
        self.images
            .get(&format!("{repo}:{tag}"))
            .or_else(|| self.images.get(repo))
    }

    /// The process for a container, by Docker's rules: `command` replaces `ENTRYPOINT` (and
    /// drops `CMD`), `args` replaces `CMD`; the container's `$(VAR)`s are expanded by the
    /// caller.
    pub fn launch(&self, container: &Container) -> Result<Launch, LaunchError> {
        let reference = container.image.as_deref().unwrap_or_default();
        let image = self
            .lookup(reference)
            .ok_or_else(|| LaunchError::UnknownImage(reference.to_owned()))?;
        let argv: Vec<String> = match (&container.command, &container.args) {
            (Some(cmd), args) => cmd.iter().chain(args.iter().flatten()).cloned().collect(),
            (None, Some(args)) => image.entrypoint.iter().chain(args).cloned().collect(),
            (None, None) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
        };
        let Some((arg0, args)) = argv.split_first() else {
            return Err(LaunchError::NoCommand);
        };
        let file_name = Path::new(arg0)
            .file_name()
            .map_or(arg0.as_str(), |n| n.to_str().unwrap_or(arg0));
        let program = match image.find(file_name) {
            Some(path) => path,
            // A host tool: `sh` is found on PATH, `/bin/sh` is used as written.
            None if image.host_tools => PathBuf::from(arg0),
            None => return Err(LaunchError::NotFound(arg0.clone())),
        };
        let path = match &image.path_links {
            Some(links) => {
                links
                    .ensure()
                    .map_err(|e| LaunchError::PathLinks(format!("{}: {e}", links.dir.display())))?;
                Some(links.dir.clone())
            }
            None => None,
        };
        Ok(Launch {
            program,
            arg0: file_name.to_owned(),
            args: args.to_vec(),
            path,
        })
    }
}

/// `docker.io/library/busybox:1.36@sha256:..` -> (`busybox`, `1.36`); no tag -> `latest`.
fn split_reference(reference: &str) -> (&str, &str) {
    let no_digest = reference.split('@').next().unwrap_or(reference);
    let (repo, tag) = match no_digest.rsplit_once(':') {
        // A colon before the last slash is a registry port, not a tag.
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (no_digest, "latest"),
    };
    let repo = repo
        .strip_prefix("docker.io/library/")
        .or_else(|| repo.strip_prefix("docker.io/"))
        .unwrap_or(repo);
    (repo, tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    fn table() -> ImageTable {
        ImageTable::standard(Some(Path::new("/build/tandem")))
    }

    #[test]
    fn references_match_by_repository_or_exact_tag() {
        let t = table();
        assert!(t.lookup("busybox").is_some());
        assert!(t.lookup("docker.io/library/busybox:1.36").is_some());
        assert!(t.lookup("busybox@sha256:abc").is_some());
        assert!(t.lookup("tandem:dev").is_some());
        assert!(
            t.lookup("tandem:other").is_none(),
            "a tagged key matches its tag only"
        );
        assert!(t.lookup("registry.local:5000/busybox").is_none());
        assert!(t.lookup("nginx").is_none());
    }

    #[test]
    fn command_and_args_follow_docker_rules() {
        let t = table();
        let cases = [
            // (container, want program, want arg0, want args)
            (
                json!({"name": "c", "image": "busybox", "command": ["sh", "-c", "exit 3"]}),
                "sh",
                "sh",
                vec!["-c", "exit 3"],
            ),
            (json!({"name": "c", "image": "busybox"}), "sh", "sh", vec![]),
            (
                json!({"name": "c", "image": "tandem:dev", "args": ["worker", "--x"]}),
                "/build/tandem",
                "tandem",
                vec!["worker", "--x"],
            ),
            (
                json!({"name": "c", "image": "tandem:dev", "command": ["/usr/local/bin/sbatch"], "args": ["a.sh"]}),
                "/build/tandem",
                "sbatch",
                vec!["a.sh"],
            ),
            (
                json!({"name": "c", "image": "tandem:dev", "command": ["/bin/sh", "-c", "true"]}),
                "/bin/sh",
                "sh",
                vec!["-c", "true"],
            ),
        ];
        for (c, program, arg0, args) in cases {
            let got = t.launch(&container(c.clone())).unwrap();
            assert_eq!(got.program, PathBuf::from(program), "{c}");
            assert_eq!(got.arg0, arg0, "{c}");
            assert_eq!(got.args, args, "{c}");
        }
    }

    #[test]
    fn directory_images_find_executables_when_a_container_starts() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let t = ImageTable::new().with("ghcr.io/tandem-dev/tandem", Image::tandem(dir.path()));
        let c = |cmd: &str| {
            container(
                json!({"name": "c", "image": "ghcr.io/tandem-dev/tandem:0.1.0", "command": [cmd]}),
            )
        };
        let op = dir.path().join("tandem-operator");
        std::fs::write(&op, "#!/bin/sh\n").unwrap();
        assert_eq!(
            t.launch(&c("tandem-operator")).unwrap().program,
            PathBuf::from("tandem-operator"),
            "not executable: not in the image (left to the host's PATH)"
        );
        std::fs::set_permissions(&op, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            t.launch(&c("/usr/local/bin/tandem-operator"))
                .unwrap()
                .program,
            op
        );
        let sbatch = t.launch(&c("sbatch")).unwrap();
        assert_eq!(
            (sbatch.program, sbatch.arg0.as_str()),
            (dir.path().join("tandem"), "sbatch")
        );
        let default = t
            .launch(&container(json!({"name": "c", "image": "ghcr.io/tandem-dev/tandem:x", "args": ["controller"]})))
            .unwrap();
        assert_eq!(
            (default.arg0.as_str(), default.args),
            ("tandem", vec!["controller".to_string()])
        );
    }

    #[test]
    fn the_tandem_image_puts_its_cli_names_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let t = ImageTable::new().with("tandem", Image::tandem(dir.path()));
        let c = container(json!({"name": "c", "image": "tandem", "args": ["worker"]}));
        let bin = dir.path().join("tandem-image-bin");
        let first = t.launch(&c).unwrap();
        assert_eq!(first.path.as_deref(), Some(bin.as_path()));
        for name in ["scontrol", "srun", "sbatch", "tandem"] {
            assert_eq!(
                std::fs::read_link(bin.join(name)).unwrap(),
                dir.path().join("tandem"),
                "{name} links to the multi-call binary"
            );
        }
        // A second start keeps the links (no error on existing ones).
        assert_eq!(t.launch(&c).unwrap().path, first.path);
        assert_eq!(
            table()
                .launch(&container(json!({"name": "c", "image": "busybox"})))
                .unwrap()
                .path,
            None,
            "host-tool images add nothing to PATH"
        );
    }

    #[test]
    fn unknown_images_and_missing_commands_are_errors() {
        let t = ImageTable::new().with(
            "only-bins",
            Image {
                host_tools: false,
                ..Image::binary("/x", &["x"])
            },
        );
        assert_eq!(
            t.launch(&container(json!({"name": "c", "image": "nginx:1"}))),
            Err(LaunchError::UnknownImage("nginx:1".into()))
        );
        assert_eq!(
            t.launch(&container(
                json!({"name": "c", "image": "only-bins", "command": ["sh"]})
            )),
            Err(LaunchError::NotFound("sh".into()))
        );
        let empty = ImageTable::new().with(
            "e",
            Image {
                cmd: vec![],
                ..Image::host_shell()
            },
        );
        assert_eq!(
            t.launch(&container(json!({"name": "c", "image": "only-bins"})))
                .unwrap()
                .arg0,
            "x"
        );
        assert_eq!(
            empty.launch(&container(json!({"name": "c", "image": "e"}))),
            Err(LaunchError::NoCommand)
        );
    }
}
