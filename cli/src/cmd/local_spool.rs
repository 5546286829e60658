//! The all-in-one cluster's batch-script spool, on the machine's memory file system.
//!
//! Each job's script is written to its worker's spool as it starts and removed as it ends. On
//! ext4 that `mkdir`, create, `unlink` and `rmdir` cost about 145 us of CPU per job, on tmpfs
//! 23 us (this project's VM), so `tandem up` gives its workers a spool under `/dev/shm` when
//! it can make one there. Its name is random and `up` creates it itself: `mkdir` fails on a
//! name somebody else took first, and the sticky bit of `/dev/shm` keeps others from
//! replacing it afterwards, so no other user can slip a script of theirs into a job. The path
//! is recorded in `DIR/workers/spool-root`; a later `up` reuses it only while it is still a
//! directory of this user's that nobody else may write, and `tandem down` removes it. The
//! scripts need not outlive a reboot: their jobs do not either. A `/dev/shm` mounted `noexec`
//! (as containers have it) is not used.

use std::fs;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Where the spool goes when the machine has it.
const SHM: &str = "/dev/shm";

/// The file in `DIR/workers/` that names the spool root.
const RECORD: &str = "spool-root";

/// The spool root of the cluster in `dir` (made, or the recorded one); each worker's spool
/// is `ROOT/NAME`. `None`: no memory file system to use, the workers keep their default.
pub fn prepare(dir: &Path) -> Option<PathBuf> {
    prepare_in(dir, Path::new(SHM))
}

/// Removes the spool root recorded for the cluster in `dir`, and the record.
pub fn remove(dir: &Path) {
    remove_in(dir, Path::new(SHM));
}

fn record_of(dir: &Path) -> PathBuf {
    dir.join("workers").join(RECORD)
}

/// The recorded root, if it is still one this user made under `shm`.
fn recorded(dir: &Path, shm: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string(record_of(dir)).ok()?;
    let root = PathBuf::from(text.trim_end_matches('\n'));
    (root.parent() == Some(shm) && private_dir_of_mine(&root)).then_some(root)
}

fn prepare_in(dir: &Path, shm: &Path) -> Option<PathBuf> {
    // Scripts are executed from the spool: a `noexec` mount (a container's `/dev/shm` by
    // default) would make every job fail at `execve`.
    let flags = nix::sys::statvfs::statvfs(shm).ok()?.flags();
    if flags.contains(nix::sys::statvfs::FsFlags::ST_NOEXEC) {
        return None;
    }
    if let Some(root) = recorded(dir, shm) {
        return Some(root);
    }
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).ok()?;
    let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let root = shm.join(format!("tandem-spool-{name}"));
    // Absent, not writable, or (astronomically unlikely) taken: the default spool serves.
    fs::DirBuilder::new().mode(0o700).create(&root).ok()?;
    // Job users traverse it to run their scripts (their own directories below are 0700);
    // set after the fact so that a umask cannot narrow it.
    let recorded = fs::set_permissions(&root, fs::Permissions::from_mode(0o711))
        .and_then(|()| fs::write(record_of(dir), root.as_os_str().as_encoded_bytes()));
    if recorded.is_err() {
        let _ = fs::remove_dir(&root);
        return None;
    }
    Some(root)
}

fn remove_in(dir: &Path, shm: &Path) {
    if let Some(root) = recorded(dir, shm) {
        let _ = fs::remove_dir_all(root);
    }
    let _ = fs::remove_file(record_of(dir));
}

/// A real directory (not a link) owned by this user that nobody else may write to.
fn private_dir_of_mine(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| {
        m.is_dir() && m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let shm = tmp.path().join("shm");
        fs::create_dir_all(dir.join("workers")).unwrap();
        fs::create_dir(&shm).unwrap();
        (tmp, dir, shm)
    }

    #[test]
    fn made_once_under_shm_reused_and_removed() {
        let (_tmp, dir, shm) = cluster();
        let root = prepare_in(&dir, &shm).unwrap();
        assert_eq!(root.parent(), Some(shm.as_path()));
        let mode = fs::metadata(&root).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o711);
        // A second `up` finds it again.
        assert_eq!(prepare_in(&dir, &shm).unwrap(), root);
        fs::create_dir_all(root.join("node-1/job1")).unwrap();
        remove_in(&dir, &shm);
        assert!(!root.exists());
        assert!(!record_of(&dir).exists());
        // Nothing recorded: nothing to do.
        remove_in(&dir, &shm);
    }

    #[test]
    fn a_record_that_points_elsewhere_or_at_a_writable_directory_is_not_trusted() {
        let (tmp, dir, shm) = cluster();
        // Outside the memory file system: neither used nor removed.
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        fs::write(record_of(&dir), elsewhere.as_os_str().as_encoded_bytes()).unwrap();
        let root = prepare_in(&dir, &shm).unwrap();
        assert_ne!(root, elsewhere);
        // Writable by others (somebody could put a script there): replaced too.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let again = prepare_in(&dir, &shm).unwrap();
        assert_ne!(again, root);
        // A link in its place is not a directory of ours.
        fs::write(record_of(&dir), root.as_os_str().as_encoded_bytes()).unwrap();
        fs::remove_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &root).unwrap();
        remove_in(&dir, &shm);
        assert!(elsewhere.is_dir(), "a link's target is never removed");
    }

    #[test]
    fn no_memory_file_system_means_the_default_spool() {
        let (tmp, dir, _shm) = cluster();
        assert_eq!(prepare_in(&dir, &tmp.path().join("absent")), None);
        assert!(!record_of(&dir).exists());
    }
}
