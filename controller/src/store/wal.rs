//! Room for the write-ahead log, written out before the first commit.
//!
//! A commit that appends to the WAL grows the file, so its fsync writes the file's new size
//! and block map as well as the frames; one that overwrites blocks the file already has
//! writes the frames alone. On the 2-core VM's disk that was about 300 against 150 µs per
//! fsync (40 KiB, `ext4`), in a commit that every acknowledged `sbatch` waits for. SQLite
//! rewinds the WAL to its start after each full checkpoint and never shrinks it (no
//! `journal_size_limit`), so a controller that has run a while overwrites only; but SQLite
//! deletes the file when the controller closes the database, so after every start the
//! first few hundred commits would append. Filling the file up front with zeros gives
//! those commits the steady state's cost.
//!
//! Zeros are safe in a WAL: recovery reads frames from the start and stops at the first
//! whose salt and checksum do not continue the chain, and a file whose header is zeros holds
//! no frames. Only bytes past the current end are written, so frames a crash left for
//! recovery are untouched. Real writes, not `fallocate`: a preallocated but unwritten
//! extent is converted on its first write, which is again a change of the block map.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The size the WAL reaches in steady state: its header and the frames (page plus frame
/// header) up to the automatic checkpoint, with room for the transaction that crosses it.
pub fn steady_size(page_size: u64, autocheckpoint_pages: u64) -> u64 {
    const WAL_HEADER: u64 = 32;
    const FRAME_HEADER: u64 = 24;
    /// Frames past the checkpoint threshold: the commit that crosses it writes its own.
    const SLACK_FRAMES: u64 = 256;
    WAL_HEADER + (autocheckpoint_pages + SLACK_FRAMES) * (page_size + FRAME_HEADER)
}

/// Extends the file at `path` (creating it) to `size` bytes of zeros and syncs it; a file
/// already that long is left alone. Returns the bytes written.
pub fn fill_to(path: &Path, size: u64) -> io::Result<u64> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let start = file.metadata()?.len();
    if start >= size {
        return Ok(0);
    }
    let chunk = vec![0u8; 1 << 20];
    let mut at = start;
    while at < size {
        let n = usize::try_from(size - at).map_or(chunk.len(), |left| left.min(chunk.len()));
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    Ok(size - start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_past_the_end_and_keeps_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("db-wal");
        std::fs::write(&p, b"frames").unwrap();
        assert_eq!(fill_to(&p, 3 << 20).unwrap(), (3 << 20) - 6);
        let data = std::fs::read(&p).unwrap();
        assert_eq!(data.len(), 3 << 20);
        assert_eq!(&data[..6], b"frames");
        assert!(data[6..].iter().all(|b| *b == 0));
        // Long enough already: nothing written, nothing cut.
        assert_eq!(fill_to(&p, 1024).unwrap(), 0);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 3 << 20);
    }

    #[test]
    fn the_steady_size_holds_the_checkpoint_threshold() {
        // SQLite's defaults: 4 KiB pages, a checkpoint after 1000 frames.
        let s = steady_size(4096, 1000);
        assert!(s > 32 + 1000 * (4096 + 24));
        assert!(s < 8 << 20);
    }
}
