//! Pod volumes: materialised as files under the pod's sandbox (or a per-claim directory for
//! PVCs), then bind-mounted at each container's `mountPath` inside a private mount namespace
//! of the container's process, so the process finds its files where the manifest says
//! without any rewriting of its command.
//!
//! The mount namespace is made by `unshare --mount --propagation private` wrapped around the
//! container's command (see [`wrap`]): it execs (no fork), so the container's pid and
//! process group are unchanged, and the namespace ends with the last process in it. A
//! mount point that does not exist on the host is created (directories, or an empty file
//! for a file `subPath`) and removed again when the last pod using it is gone
//! ([`MountPoints`]).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, PersistentVolumeClaim, Pod, Secret, Volume,
};
use kube::api::Api;

use super::image::Launch;

/// A volume as files on this machine.
#[derive(Debug, Clone)]
struct Prepared {
    path: PathBuf,
}

/// One bind mount of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// A pod's volumes, prepared once before its first container starts.
#[derive(Debug, Default)]
pub struct PodVolumes {
    volumes: HashMap<String, Prepared>,
    /// Mount points this pod holds in [`MountPoints`] (released on [`PodVolumes::release`]).
    held: Vec<PathBuf>,
}

/// Where a pod's volumes are made.
#[derive(Debug, Clone, Copy)]
pub struct Roots<'a> {
    /// The pod's sandbox: `volumes/<name>` under it.
    pub sandbox: &'a Path,
    /// Persistent volumes: `<volumeName>` under it, shared by every node of the kubelet
    /// (as network storage would be).
    pub persistent: &'a Path,
}

/// Reads what the volumes are made from.
async fn config_map(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Option<ConfigMap>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .map_err(|e| format!("reading configmap \"{name}\": {e}"))
}

async fn secret(client: &kube::Client, ns: &str, name: &str) -> Result<Option<Secret>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    api.get_opt(name)
        .await
        .map_err(|e| format!("reading secret \"{name}\": {e}"))
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    out.extend(
        cm.binary_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone())),
    );
    out
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// A relative path inside a volume: no `..`, not absolute (the API server refuses these on
/// a real cluster; here the kubelet does).
fn inside(base: &Path, rel: &str) -> Result<PathBuf, String> {
    let p = Path::new(rel);
    if rel.is_empty()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "path {rel:?} must be relative and may not contain '..'"
        ));
    }
    Ok(base.join(p))
}

/// The files of a configMap/secret volume (or projection): `items` select and rename keys,
/// each with its mode or `default_mode`; a key named in `items` that is missing is an error
/// unless `optional`.
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    what: &str,
) -> Result<(), String> {
    let io = |p: &Path, e: std::io::Error| format!("writing {}: {e}", p.display());
    let mut files: Vec<(PathBuf, &[u8], u32)> = Vec::new();
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                let Some(bytes) = data.get(&it.key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("{what} has no key \"{}\"", it.key));
                };
                let mode = it.mode.map_or(default_mode, |m| (m as u32) & 0o7777);
                files.push((inside(dir, &it.path)?, bytes, mode));
            }
        }
        _ => {
            for (k, bytes) in data {
                files.push((inside(dir, k)?, bytes, default_mode));
            }
        }
    }
    for (path, bytes, mode) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        std::fs::write(&path, bytes).map_err(|e| io(&path, e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(&path, e))?;
    }
    Ok(())
}

fn mode_of(m: Option<i32>) -> u32 {
    // Kubernetes' default for configMap, secret and projected volumes.
    m.map_or(0o644, |m| (m as u32) & 0o7777)
}

/// Makes every volume of the pod. An error is what a kubelet reports as `FailedMount`;
/// the caller retries.
pub async fn prepare(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    roots: Roots<'_>,
) -> Result<PodVolumes, String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let fs_group = spec
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    let mut out = PodVolumes::default();
    for v in spec.volumes.iter().flatten() {
        let (path, read_only_kind) = prepare_one(client, ns, v, roots).await?;
        if let Some(gid) = fs_group
            && v.host_path.is_none()
        {
            apply_fs_group(&path, gid, read_only_kind)
                .map_err(|e| format!("volume \"{}\": applying fsGroup {gid}: {e}", v.name))?;
        }
        out.volumes.insert(v.name.clone(), Prepared { path });
    }
    Ok(out)
}

async fn prepare_one(
    client: &kube::Client,
    ns: &str,
    v: &Volume,
    roots: Roots<'_>,
) -> Result<(PathBuf, bool), String> {
    let dir = roots.sandbox.join("volumes").join(&v.name);
    let mkdir =
        |p: &Path| std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()));
    let fail = |msg: String| format!("MountVolume.SetUp failed for volume \"{}\" : {msg}", v.name);
    if v.empty_dir.is_some() {
        mkdir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| fail(e.to_string()))?;
        return Ok((dir, false));
    }
    if let Some(c) = &v.config_map {
        let optional = c.optional == Some(true);
        mkdir(&dir)?;
        match config_map(client, ns, &c.name).await.map_err(fail)? {
            Some(cm) => write_keys(
                &dir,
                &config_map_data(&cm),
                c.items.as_deref(),
                mode_of(c.default_mode),
                optional,
                &format!("configmap \"{}\"", c.name),
            )
            .map_err(fail)?,
            None if optional => {}
            None => return Err(fail(format!("configmap \"{}\" not found", c.name))),
        }
        return Ok((dir, true));
    }
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let optional = s.optional == Some(true);
        mkdir(&dir)?;
        match secret(client, ns, &name).await.map_err(fail)? {
            Some(sec) => write_keys(
                &dir,
                &secret_data(&sec),
                s.items.as_deref(),
                mode_of(s.default_mode),
                optional,
                &format!("secret \"{name}\""),
            )
            .map_err(fail)?,
            None if optional => {}
            None => return Err(fail(format!("secret \"{name}\" not found"))),
        }
        return Ok((dir, true));
    }
    if let Some(p) = &v.projected {
        mkdir(&dir)?;
        let default_mode = mode_of(p.default_mode);
        for src in p.sources.iter().flatten() {
            if let Some(c) = &src.config_map {
                let optional = c.optional == Some(true);
                match config_map(client, ns, &c.name).await.map_err(fail)? {
                    Some(cm) => write_keys(
                        &dir,
                        &config_map_data(&cm),
                        c.items.as_deref(),
                        default_mode,
                        optional,
                        &format!("configmap \"{}\"", c.name),
                    )
                    .map_err(fail)?,
                    None if optional => {}
                    None => return Err(fail(format!("configmap \"{}\" not found", c.name))),
                }
            } else if let Some(s) = &src.secret {
                let optional = s.optional == Some(true);
                match secret(client, ns, &s.name).await.map_err(fail)? {
                    Some(sec) => write_keys(
                        &dir,
                        &secret_data(&sec),
                        s.items.as_deref(),
                        default_mode,
                        optional,
                        &format!("secret \"{}\"", s.name),
                    )
                    .map_err(fail)?,
                    None if optional => {}
                    None => return Err(fail(format!("secret \"{}\" not found", s.name))),
                }
            } else {
                return Err(fail(
                    "the process kubelet projects only configMap and secret sources".into(),
                ));
            }
        }
        return Ok((dir, true));
    }
    if let Some(c) = &v.persistent_volume_claim {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let pvc = api
            .get_opt(&c.claim_name)
            .await
            .map_err(|e| {
                fail(format!(
                    "reading persistentvolumeclaim \"{}\": {e}",
                    c.claim_name
                ))
            })?
            .ok_or_else(|| {
                fail(format!(
                    "persistentvolumeclaim \"{}\" not found",
                    c.claim_name
                ))
            })?;
        let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
        let (true, Some(volume)) = (bound, volume) else {
            return Err(fail(format!(
                "persistentvolumeclaim \"{}\" is not bound",
                c.claim_name
            )));
        };
        let path = inside(roots.persistent, &volume).map_err(fail)?;
        mkdir(&path)?;
        return Ok((path, false));
    }
    if let Some(h) = &v.host_path {
        let path = PathBuf::from(&h.path);
        match h.type_.as_deref().unwrap_or("") {
            "DirectoryOrCreate" => mkdir(&path)?,
            "FileOrCreate" if !path.exists() => {
                std::fs::write(&path, b"").map_err(|e| fail(e.to_string()))?;
            }
            "Directory" if !path.is_dir() => {
                return Err(fail(format!(
                    "hostPath type check failed: {} is not a directory",
                    h.path
                )));
            }
            "File" if !path.is_file() => {
                return Err(fail(format!(
                    "hostPath type check failed: {} is not a file",
                    h.path
                )));
            }
            _ => {}
        }
        return Ok((path, false));
    }
    Err(fail(
        "the process kubelet supports emptyDir, configMap, secret, projected (configMap, secret), persistentVolumeClaim and hostPath volumes".into(),
    ))
}

/// What a kubelet does for `fsGroup`: group ownership of every file, group read (read-only
/// volumes) or read-write (others), and setgid directories.
fn apply_fs_group(path: &Path, gid: u32, read_only: bool) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::chown(path, None, Some(gid))?;
    let mut mode = meta.permissions().mode() & 0o7777;
    mode |= if read_only { 0o440 } else { 0o660 };
    if meta.is_dir() {
        mode |= 0o110 | 0o2000;
        for entry in std::fs::read_dir(path)? {
            apply_fs_group(&entry?.path(), gid, read_only)?;
        }
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

impl PodVolumes {
    /// A container's bind mounts, in `volumeMounts` order (parents before children, as a
    /// runtime sorts them).
    pub fn mounts(&self, container: &Container) -> Result<Vec<Mount>, String> {
        let mut out = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let v = self
                .volumes
                .get(&m.name)
                .ok_or_else(|| format!("volumeMount \"{}\" names no volume of the pod", m.name))?;
            let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => {
                    let p = inside(&v.path, sub)?;
                    if !p.exists() {
                        // A kubelet creates a missing subPath as a directory.
                        std::fs::create_dir_all(&p)
                            .map_err(|e| format!("creating subPath {}: {e}", p.display()))?;
                    }
                    p
                }
                None => v.path.clone(),
            };
            if !m.mount_path.starts_with('/') {
                return Err(format!("mountPath {:?} must be absolute", m.mount_path));
            }
            out.push(Mount {
                source,
                target: PathBuf::from(&m.mount_path),
                read_only: m.read_only == Some(true),
            });
        }
        out.sort_by_key(|m| m.target.components().count());
        Ok(out)
    }

    /// Creates the mount points `mounts` need on the host (held until [`Self::release`],
    /// or until the kubelet, which records them in `kubelet`, shuts down).
    pub fn hold(&mut self, mounts: &[Mount], kubelet: &Held) -> std::io::Result<()> {
        for m in mounts {
            if self.held.contains(&m.target) {
                continue;
            }
            MountPoints::global().acquire(&m.target, m.source.is_file())?;
            self.held.push(m.target.clone());
            kubelet.lock().push(m.target.clone());
        }
        Ok(())
    }

    /// Gives back the mount points (after every process of the pod is gone).
    pub fn release(&mut self, kubelet: &Held) {
        for t in self.held.drain(..) {
            let mut all = kubelet.lock();
            if let Some(i) = all.iter().position(|p| *p == t) {
                all.swap_remove(i);
            }
            drop(all);
            MountPoints::global().release(&t);
        }
    }
}

/// The mount points one kubelet's pods hold, so a kubelet stopped with pods still running
/// (the end of a test) gives them back too.
#[derive(Debug, Clone, Default)]
pub struct Held(std::sync::Arc<Mutex<Vec<PathBuf>>>);

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Releases everything still held (call once the processes are gone).
    pub fn release_all(&self) {
        let all: Vec<PathBuf> = self.lock().drain(..).collect();
        for t in all {
            MountPoints::global().release(&t);
        }
    }
}

/// The container's command inside a private mount namespace with its bind mounts.
/// `unshare` and `bash` exec in place, so the pid is the container's.
pub fn wrap(launch: &Launch, mounts: &[Mount]) -> Launch {
    if mounts.is_empty() {
        return launch.clone();
    }
    let q = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let mut script = String::from("set -e\n");
    for m in mounts {
        script.push_str(&format!("mount --bind {} {}\n", q(&m.source), q(&m.target)));
        if m.read_only {
            script.push_str(&format!("mount -o remount,bind,ro {}\n", q(&m.target)));
        }
    }
    script.push_str("a0=$1; shift\nexec -a \"$a0\" \"$@\"\n");
    let mut args: Vec<String> = [
        "--mount",
        "--propagation",
        "private",
        "--",
        "bash",
        "-c",
        &script,
        "bash",
        &launch.arg0,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push(launch.program.display().to_string());
    args.extend(launch.args.iter().cloned());
    Launch {
        program: PathBuf::from("unshare"),
        arg0: "unshare".into(),
        args,
        path: launch.path.clone(),
    }
}

/// Whether this process may make mount namespaces (it runs as root).
pub fn can_mount() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Mount points created on the host for pods, counted by the pods using them, so the last
/// one out removes what was created (and only that).
#[derive(Debug, Default)]
pub struct MountPoints(Mutex<HashMap<PathBuf, usize>>);

impl MountPoints {
    pub fn global() -> &'static MountPoints {
        static ALL: OnceLock<MountPoints> = OnceLock::new();
        ALL.get_or_init(MountPoints::default)
    }

    fn acquire(&self, target: &Path, file: bool) -> std::io::Result<()> {
        let mut created = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let chain: Vec<&Path> = target.ancestors().collect();
        // Shallowest first, so each component is created after its parent.
        for (i, p) in chain.iter().rev().enumerate() {
            let last = i + 1 == chain.len();
            if !created.contains_key(*p) && !p.exists() {
                if last && file {
                    std::fs::write(p, b"")?;
                } else {
                    std::fs::create_dir(p)?;
                }
                created.insert(p.to_path_buf(), 0);
            }
            if let Some(n) = created.get_mut(*p) {
                *n += 1;
            }
        }
        Ok(())
    }

    fn release(&self, target: &Path) {
        let mut created = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Deepest first: a directory goes only after what it held.
        for p in target.ancestors() {
            let Some(n) = created.get_mut(p) else {
                continue;
            };
            *n = n.saturating_sub(1);
            if *n == 0 {
                created.remove(p);
                let r = if p.is_dir() {
                    std::fs::remove_dir(p)
                } else {
                    std::fs::remove_file(p)
                };
                if let Err(e) = r {
                    tracing::warn!(path = %p.display(), error = %e, "removing a mount point");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_items_modes_and_optional() {
        let dir = tempfile::tempdir().unwrap();
        let data: BTreeMap<String, Vec<u8>> = [
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"2".to_vec()),
        ]
        .into();
        write_keys(dir.path(), &data, None, 0o400, false, "x").unwrap();
        let m = std::fs::metadata(dir.path().join("a")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o400);
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "sub/renamed".into(),
            mode: Some(0o600),
        }];
        let d2 = dir.path().join("two");
        write_keys(&d2, &data, Some(&items), 0o644, false, "x").unwrap();
        assert_eq!(std::fs::read(d2.join("sub/renamed")).unwrap(), b"2");
        assert!(!d2.join("a").exists());
        let missing = vec![KeyToPath {
            key: "zz".into(),
            path: "zz".into(),
            mode: None,
        }];
        assert!(write_keys(&d2, &data, Some(&missing), 0o644, false, "x").is_err());
        write_keys(&d2, &data, Some(&missing), 0o644, true, "x").unwrap();
        let escape = vec![KeyToPath {
            key: "a".into(),
            path: "../out".into(),
            mode: None,
        }];
        assert!(write_keys(&d2, &data, Some(&escape), 0o644, false, "x").is_err());
    }

    #[test]
    fn fs_group_makes_read_only_files_group_readable() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, b"k").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).unwrap();
        let gid = nix::unistd::getegid().as_raw();
        apply_fs_group(dir.path(), gid, true).unwrap();
        let m = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o440, "as a kubelet does for secrets with fsGroup");
    }

    #[test]
    fn mount_points_are_created_and_removed_by_the_last_user() {
        let dir = tempfile::tempdir().unwrap();
        let mp = MountPoints::default();
        let t = dir.path().join("etc/tandem/key");
        mp.acquire(&t, false).unwrap();
        mp.acquire(&t, false).unwrap();
        assert!(t.is_dir());
        mp.release(&t);
        assert!(t.is_dir(), "still used by one pod");
        mp.release(&t);
        assert!(
            !dir.path().join("etc").exists(),
            "created components removed"
        );
        assert!(dir.path().exists(), "what existed before stays");
    }

    #[test]
    fn wrap_keeps_argv0_and_args() {
        let l = Launch {
            program: PathBuf::from("/x/tandem"),
            arg0: "sbatch".into(),
            args: vec!["--wrap".into(), "echo 'hi'".into()],
            path: None,
        };
        let m = vec![Mount {
            source: PathBuf::from("/s"),
            target: PathBuf::from("/t"),
            read_only: true,
        }];
        let w = wrap(&l, &m);
        assert_eq!(w.program, PathBuf::from("unshare"));
        let tail: Vec<&str> = w
            .args
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(tail, ["sbatch", "/x/tandem", "--wrap", "echo 'hi'"]);
        assert!(w.args[6].contains("remount,bind,ro '/t'"));
        assert_eq!(wrap(&l, &[]), l);
    }
}
