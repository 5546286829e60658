//! SQLite schema and the operations the controller needs: one-transaction batch writes, the
//! start-up load, payload reads at launch, and `sacct` queries.
//!
//! Rows hold opaque blobs produced by the state actor (serialized core records, prost-encoded
//! accounting records), plus the few columns queries filter on. The store does not know the
//! scheduling core's types, so a change there never needs a schema migration.
//!
//! - [`batch`]: [`Batch`], what one group of changes writes, and its write inside a
//!   transaction.
//! - [`records`]: the finished runs `sacct` reads ([`JobRecordRow`]) and their query.
//! - here: the schema, opening connections (writer, reader, checkpointer), the start-up load
//!   and payload reads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use tracing::{debug, warn};

mod batch;
mod records;

pub use batch::Batch;
pub use records::{JobRecordRow, RecordFilter};

/// Bumped when the schema changes incompatibly; a store with another version is refused
/// rather than misread.
const SCHEMA_VERSION: &str = "1";

/// How long a statement waits for a lock another connection holds (the reader, the
/// checkpoint thread) before failing with SQLITE_BUSY.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
-- Active jobs (pending, running, and array meta records), as the core's serialized Job.
-- Array tasks still pending live inside their array's record, so a large array is one row.
CREATE TABLE IF NOT EXISTS jobs (
    id     INTEGER PRIMARY KEY,
    record BLOB NOT NULL
);
-- Script, argv, environment, workdir and output patterns: read only at launch. An array's
-- tasks share the array's row.
CREATE TABLE IF NOT EXISTS job_payloads (
    id      INTEGER PRIMARY KEY,
    payload BLOB NOT NULL
);
-- Nodes by name; idx keeps the core's node-table order so allocations stay valid.
CREATE TABLE IF NOT EXISTS nodes (
    name   TEXT PRIMARY KEY,
    idx    INTEGER NOT NULL,
    record BLOB NOT NULL
);
-- Steps of active jobs; folded into the job's accounting record when it ends.
CREATE TABLE IF NOT EXISTS steps (
    job_id  INTEGER NOT NULL,
    step_id INTEGER NOT NULL,
    record  BLOB NOT NULL,
    PRIMARY KEY (job_id, step_id)
);
-- Finished runs of jobs (sacct). A requeued job has one row per run.
CREATE TABLE IF NOT EXISTS job_records (
    seq           INTEGER PRIMARY KEY,
    id            INTEGER NOT NULL,
    -- Which run of the job (0 = first; a requeue starts the next).
    run           INTEGER NOT NULL,
    array_job_id  INTEGER,
    array_task_id INTEGER,
    user          TEXT NOT NULL,
    account       TEXT NOT NULL,
    partition     TEXT NOT NULL,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,
    submit_time   INTEGER NOT NULL,
    start_time    INTEGER,
    end_time      INTEGER NOT NULL,
    record        BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS job_records_run ON job_records (id, run);
CREATE INDEX IF NOT EXISTS job_records_array ON job_records (array_job_id);
CREATE INDEX IF NOT EXISTS job_records_user_end ON job_records (user, end_time);
CREATE INDEX IF NOT EXISTS job_records_end ON job_records (end_time);
-- Submit idempotency keys, so a retried submit returns the first job.
CREATE TABLE IF NOT EXISTS idempotency (
    key     TEXT PRIMARY KEY,
    job_id  INTEGER NOT NULL,
    created INTEGER NOT NULL
);
";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create state directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open store {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "store {path} has schema version {found}, this controller understands {SCHEMA_VERSION}"
    )]
    SchemaVersion { path: PathBuf, found: String },
    #[error("store {operation} failed")]
    Sql {
        operation: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("store committer is gone (controller shutting down)")]
    Closed,
    /// A record could not be encoded for the store; the batch holding it is refused.
    #[error("cannot encode {what} for the store: {reason}")]
    Encode { what: String, reason: String },
    #[error("cannot start the store's checkpoint thread")]
    Thread(#[source] std::io::Error),
}

fn sql(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Sql { operation, source }
}
/// What the store holds for the active part of the cluster, read once at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub meta: HashMap<String, String>,
    pub jobs: Vec<Vec<u8>>,
    /// In node-table order.
    pub nodes: Vec<(String, Vec<u8>)>,
    pub steps: Vec<(u64, u32, Vec<u8>)>,
    pub idempotency: Vec<(String, u64, i64)>,
}
/// One connection to the store file.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
    durability: Durability,
}

/// When a commit counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced at every commit, so an acknowledged submit
    /// survives power loss as well as a controller crash. One fsync per group commit bounds
    /// the throughput of clients that wait for each acknowledgement.
    #[default]
    Full,
    /// `synchronous=NORMAL` in WAL mode: a commit is in the operating system's page cache
    /// when acknowledged and fsynced at checkpoints. A killed controller (even SIGKILL)
    /// loses nothing; a power loss or kernel crash may lose the last commits.
    Process,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Self::Full => "PRAGMA synchronous=FULL;",
            Self::Process => "PRAGMA synchronous=NORMAL;",
        }
    }
}

/// Fills the WAL up to its steady size (see [`super::wal`]). Only a cost saved is at stake,
/// so a failure (a full disk, say) is logged and the store opens as it is.
fn make_room_for_wal(conn: &Connection, db: &Path) {
    let pragma = |name: &str| -> Option<u64> {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .ok()
            .and_then(|v| u64::try_from(v).ok())
    };
    let (Some(page_size), Some(pages)) = (pragma("page_size"), pragma("wal_autocheckpoint")) else {
        return;
    };
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    match super::wal::fill_to(&wal, super::wal::steady_size(page_size, pages)) {
        Ok(0) => {}
        Ok(n) => debug!(path = %wal.display(), bytes = n, "WAL filled to its steady size"),
        Err(e) => {
            warn!(path = %wal.display(), error = %e, "cannot fill the WAL ahead; commits append")
        }
    }
}

impl Store {
    /// File name of the database inside the state directory.
    pub const FILE: &'static str = "tandem.db";

    /// Opens (creating if needed) the store in `state_dir` for writing, fsyncing every commit.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(state_dir, Durability::Full)
    }

    /// Opens the store with the given commit durability.
    pub fn open_with(state_dir: &Path, durability: Durability) -> Result<Self, StoreError> {
        Self::open_filling(state_dir, durability, durability == Durability::Full)
    }

    /// As [`Store::open`], with a WAL that is not filled ahead: its size then tells where
    /// the log started over, which the checkpoint tests read.
    #[cfg(test)]
    pub(super) fn open_unfilled(state_dir: &Path) -> Result<Self, StoreError> {
        Self::open_filling(state_dir, Durability::Full, false)
    }

    /// Opens the store; `fill_wal`: fill the WAL to its steady size (where every commit
    /// fsyncs, see [`super::wal`]).
    fn open_filling(
        state_dir: &Path,
        durability: Durability,
        fill_wal: bool,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|source| StoreError::CreateDir {
            path: state_dir.to_owned(),
            source,
        })?;
        let path = state_dir.join(Self::FILE);
        let open_err = |source| StoreError::Open {
            path: path.clone(),
            source,
        };
        let conn = Connection::open(&path).map_err(open_err)?;
        // WAL: readers never block the writer and a commit appends instead of rewriting
        // pages. See `Durability` for the synchronous setting.
        conn.execute_batch(durability.pragma()).map_err(open_err)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA foreign_keys=OFF;
             PRAGMA temp_store=MEMORY;
             PRAGMA cache_size=-8192;",
        )
        .map_err(open_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        if fill_wal {
            make_room_for_wal(&conn, &path);
        }
        let version: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(open_err)?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    [SCHEMA_VERSION],
                )
                .map_err(open_err)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(found) => return Err(StoreError::SchemaVersion { path, found }),
        }
        Ok(Self {
            conn,
            path,
            durability,
        })
    }

    /// A second, read-only connection for queries that must not wait for the committer.
    pub fn open_reader(&self) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open {
            path: self.path.clone(),
            source,
        };
        let conn = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        Ok(Self {
            conn,
            path: self.path.clone(),
            durability: self.durability,
        })
    }

    /// A second read-write connection, for the checkpoint thread (see [`super::checkpoint`]).
    /// It syncs as the writer does: a checkpoint's fsyncs are what make `--durability
    /// process` commits reach the disk.
    pub(super) fn open_checkpointer(&self) -> Result<Self, StoreError> {
        let open_err = |source| StoreError::Open {
            path: self.path.clone(),
            source,
        };
        let conn = Connection::open(&self.path).map_err(open_err)?;
        conn.execute_batch(self.durability.pragma())
            .map_err(open_err)?;
        // A RESTART checkpoint waits for the writer and readers through this.
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        Ok(Self {
            conn,
            path: self.path.clone(),
            durability: self.durability,
        })
    }

    /// Calls `f` with the number of frames in the WAL after each commit on this connection.
    /// This replaces SQLite's automatic checkpoint on it: nothing copies the WAL back unless
    /// someone checkpoints.
    pub(super) fn on_wal_commit(
        &mut self,
        mut f: impl FnMut(i32) + Send + 'static,
    ) -> Result<(), StoreError> {
        self.conn
            .wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages| {
                f(pages);
                Ok(())
            }))
            .map_err(sql("set wal hook"))
    }

    /// Copies WAL frames back into the database file. Returns the frames in the WAL and
    /// those copied back so far.
    pub(super) fn checkpoint(&self, mode: CheckpointMode) -> Result<(i32, i32), StoreError> {
        self.conn
            .wal_checkpoint_v2(rusqlite::DEFAULT_NAME, mode)
            .map_err(sql("checkpoint"))
    }

    /// [`Store::checkpoint`] that waits at most `wait` for a reader or another checkpoint
    /// holding the log (then SQLITE_BUSY), not the connection's whole busy timeout.
    pub(super) fn checkpoint_within(
        &self,
        mode: CheckpointMode,
        wait: Duration,
    ) -> Result<(i32, i32), StoreError> {
        self.conn.busy_timeout(wait).map_err(sql("busy timeout"))?;
        let result = self.checkpoint(mode);
        self.conn
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(sql("busy timeout"))?;
        result
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Writes several batches in one transaction: one fsync for all of them.
    pub fn commit(&mut self, batches: &[&Batch]) -> Result<(), StoreError> {
        let tx = self.conn.transaction().map_err(sql("begin"))?;
        for b in batches {
            batch::apply(&tx, b)?;
        }
        tx.commit().map_err(sql("commit"))
    }

    pub fn load(&self) -> Result<Loaded, StoreError> {
        let mut out = Loaded::default();
        let c = &self.conn;
        let mut st = c
            .prepare("SELECT key, value FROM meta")
            .map_err(sql("load meta"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql("load meta"))?;
        for r in rows {
            let (k, v) = r.map_err(sql("load meta"))?;
            out.meta.insert(k, v);
        }
        let mut st = c
            .prepare("SELECT record FROM jobs ORDER BY id")
            .map_err(sql("load jobs"))?;
        let rows = st.query_map([], |r| r.get(0)).map_err(sql("load jobs"))?;
        for r in rows {
            out.jobs.push(r.map_err(sql("load jobs"))?);
        }
        let mut st = c
            .prepare("SELECT name, record FROM nodes ORDER BY idx")
            .map_err(sql("load nodes"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql("load nodes"))?;
        for r in rows {
            out.nodes.push(r.map_err(sql("load nodes"))?);
        }
        let mut st = c
            .prepare("SELECT job_id, step_id, record FROM steps ORDER BY job_id, step_id")
            .map_err(sql("load steps"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(sql("load steps"))?;
        for r in rows {
            out.steps.push(r.map_err(sql("load steps"))?);
        }
        let mut st = c
            .prepare("SELECT key, job_id, created FROM idempotency")
            .map_err(sql("load idempotency keys"))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(sql("load idempotency keys"))?;
        for r in rows {
            out.idempotency
                .push(r.map_err(sql("load idempotency keys"))?);
        }
        Ok(out)
    }

    pub fn load_payload(&self, id: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.conn
            .prepare_cached("SELECT payload FROM job_payloads WHERE id = ?1")
            .map_err(sql("load payload"))?
            .query_row([id], |r| r.get(0))
            .optional()
            .map_err(sql("load payload"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, user: &str, end: i64) -> JobRecordRow {
        JobRecordRow {
            id,
            run: 0,
            array_job_id: None,
            array_task_id: None,
            user: user.into(),
            account: "root".into(),
            partition: "batch".into(),
            name: format!("job{id}"),
            state: "COMPLETED".into(),
            submit_time: end - 10,
            start_time: Some(end - 5),
            end_time: end,
            record: vec![id as u8],
        }
    }

    #[test]
    fn batch_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Store::open(dir.path()).unwrap();
            let b = Batch {
                meta: vec![("next_job_id".into(), "3".into())],
                jobs: vec![(1, b"one".to_vec()), (2, b"two".to_vec())],
                payloads: vec![(1, b"p1".to_vec()), (2, b"p2".to_vec())],
                nodes: vec![
                    ("n2".into(), 1, b"b".to_vec()),
                    ("n1".into(), 0, b"a".to_vec()),
                ],
                steps: vec![(1, 0, b"s".to_vec())],
                idempotency: vec![("k".into(), 1, 100)],
                ..Batch::default()
            };
            let later = Batch {
                removed_jobs: vec![2],
                removed_payloads: vec![2],
                records: vec![record(2, "alice", 50)],
                ..Batch::default()
            };
            s.commit(&[&b, &later]).unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let l = s.load().unwrap();
        assert_eq!(l.meta.get("next_job_id").map(String::as_str), Some("3"));
        assert_eq!(l.jobs, vec![b"one".to_vec()]);
        assert_eq!(
            l.nodes,
            vec![("n1".into(), b"a".to_vec()), ("n2".into(), b"b".to_vec())]
        );
        assert_eq!(l.steps, vec![(1, 0, b"s".to_vec())]);
        assert_eq!(l.idempotency, vec![("k".to_string(), 1, 100)]);
        assert_eq!(s.load_payload(1).unwrap(), Some(b"p1".to_vec()));
        assert_eq!(s.load_payload(2).unwrap(), None);
        let recs = s.query_records(&RecordFilter::default()).unwrap();
        assert_eq!(recs, vec![record(2, "alice", 50)]);
    }

    #[test]
    fn record_filters_combine() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        let mut task = record(9, "bob", 300);
        task.array_job_id = Some(7);
        task.array_task_id = Some(2);
        let mut other = record(10, "bob", 310);
        other.array_job_id = Some(7);
        other.array_task_id = Some(3);
        let b = Batch {
            records: vec![record(1, "alice", 100), record(2, "bob", 200), task, other],
            ..Batch::default()
        };
        s.commit(&[&b]).unwrap();
        let ids = |f: RecordFilter| -> Vec<u64> {
            s.query_records(&f).unwrap().iter().map(|r| r.id).collect()
        };
        assert_eq!(
            ids(RecordFilter {
                users: vec!["bob".into()],
                ..Default::default()
            }),
            vec![2, 9, 10]
        );
        assert_eq!(
            ids(RecordFilter {
                ids: vec![7],
                ..Default::default()
            }),
            vec![9, 10]
        );
        // A task by its index: only that task of the array, never the array's other
        // tasks, nor a job whose own id is the index.
        let tasks = |job: u64, set: &str| RecordFilter {
            tasks: vec![(
                job,
                tandem_sched::array::IndexSet::parse(set, 1000).unwrap(),
            )],
            ..Default::default()
        };
        assert_eq!(ids(tasks(7, "2")), vec![9]);
        assert_eq!(ids(tasks(7, "3")), vec![10]);
        assert_eq!(ids(tasks(7, "0-8:2")), vec![9]);
        assert_eq!(ids(tasks(7, "1,3")), vec![10]);
        assert_eq!(ids(tasks(7, "4")), Vec::<u64>::new());
        assert_eq!(ids(tasks(1, "0")), Vec::<u64>::new());
        assert_eq!(
            ids(RecordFilter {
                ids: vec![1],
                ..tasks(7, "3")
            }),
            vec![1, 10]
        );
        assert_eq!(
            ids(RecordFilter {
                ended_after: Some(150),
                started_before: Some(250),
                ..Default::default()
            }),
            vec![2]
        );
        assert_eq!(
            ids(RecordFilter {
                users: vec!["alice".into()],
                states: vec!["FAILED".into()],
                ..Default::default()
            }),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn reader_sees_committed_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        let r = s.open_reader().unwrap();
        s.commit(&[&Batch {
            records: vec![record(1, "a", 1)],
            ..Batch::default()
        }])
        .unwrap();
        assert_eq!(r.query_records(&RecordFilter::default()).unwrap().len(), 1);
    }

    #[test]
    fn commits_survive_a_crash_in_a_wal_filled_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join(format!("{}-wal", Store::FILE));
        let mut s = Store::open(dir.path()).unwrap();
        let filled = std::fs::metadata(&wal).unwrap().len();
        assert!(filled >= 4 << 20, "WAL filled ahead: {filled} bytes");
        for id in 1..=20u64 {
            s.commit(&[&Batch {
                jobs: vec![(id, vec![id as u8])],
                ..Batch::default()
            }])
            .unwrap();
        }
        // A crash: no close, so no checkpoint; the commits are frames followed by zeros.
        std::mem::forget(s);
        assert_eq!(std::fs::metadata(&wal).unwrap().len(), filled);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.load().unwrap().jobs.len(), 20);
    }

    #[test]
    fn foreign_schema_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = Store::open(dir.path()).unwrap();
            s.commit(&[&Batch {
                meta: vec![("schema_version".into(), "999".into())],
                ..Batch::default()
            }])
            .unwrap();
        }
        let err = Store::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("schema version 999"), "{err}");
    }
}
