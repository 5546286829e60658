//! The durable store: everything the controller must not forget.
//!
//! # Why SQLite
//!
//! SQLite (through `rusqlite`, compiled in with the `bundled` feature so a fresh machine needs
//! nothing installed) in WAL mode with `synchronous=FULL` (or `NORMAL` with `--durability
//! process`, see [`Durability`]):
//! - crash safe: a transaction is on disk when `COMMIT` returns, and a SIGKILL at any moment
//!   leaves the last committed state (the WAL is replayed on open);
//! - one file (plus its WAL) in the state directory, no server to run;
//! - one fsync per transaction however many rows it holds, which is what makes group commit
//!   pay: thousands of submits share one fsync;
//! - SQL with indexes for `sacct`'s filters over finished jobs, which never live in memory;
//! - readers do not block the writer under WAL, so `sacct` queries run on their own
//!   connection while the committer writes.
//!
//! `redb` would also do (pure Rust, MVCC, crash safe); SQLite won on ad-hoc indexed queries
//! for accounting and on being inspectable with the `sqlite3` shell during an incident.
//!
//! # Record encoding
//!
//! Job, node and configuration records are JSON (serde): about 0.9 KB per pending job.
//! Profiled under a submit flood, all JSON work (records plus token claims) is under 2% of
//! the controller's CPU per submit, against ~5% for SQLite itself and most of the rest in
//! HTTP/2 and the kernel, so a binary encoding would buy little and lose what JSON gives: rows
//! readable with the `sqlite3` shell, and fields added with `#[serde(default)]` that old
//! stores load without a migration.
//!
//! # Format versions
//!
//! Two layers, versioned separately:
//! - the SQL schema: `meta.schema_version` (`SCHEMA_VERSION` in [`sqlite`], now `1`). Tables
//!   and columns only ever grow with `CREATE ... IF NOT EXISTS` and defaulted columns within
//!   one version; a change an older reader would misread bumps it, and a store of another
//!   version is refused at open with a clear error instead of being misread;
//! - the records in the blobs: serde JSON of the scheduling core's types (jobs, nodes,
//!   configuration, fair-share tree) and prost messages (payloads, accounting records). A
//!   field added to a stored serde type carries `#[serde(default)]`, and prost fields are
//!   additive by construction, so a store written by the previous release loads in this one
//!   without a migration. `tests/it/store_compat.rs` opens the v0.1.0 store kept as a SQL
//!   dump in `tests/fixtures/store-v0.1.0/` and checks every job, payload and record survives.
//!
//! # Layout
//!
//! - [`sqlite`]: schema, the one-transaction [`Batch`] write, loads and queries.
//! - [`commit`]: the committer thread that merges queued batches into one transaction
//!   (group commit) and runs each batch's after-commit effects in order.
//! - [`checkpoint`]: with `--durability process`, copies the WAL back into the database file
//!   on its own thread, so no commit waits for it.
//! - [`recover`]: rebuilds the scheduling core's `State` from the store on start.
//! - [`wal`]: fills the write-ahead log to its steady size at open, so that commits
//!   overwrite instead of growing the file.
//!
//! # Invariants
//!
//! - Only the committer thread writes. Batches commit in the order they were queued, so an
//!   effect (a reply, a launch) never runs before the writes it depends on are durable.
//! - Job payloads (script, environment, ...) live only here, never in the controller's memory
//!   except while a launch message is built.

pub mod checkpoint;
pub mod commit;
pub mod recover;
pub mod sqlite;
mod wal;

pub use commit::{Committer, Effect};
pub use sqlite::{Batch, Durability, JobRecordRow, Loaded, RecordFilter, Store, StoreError};
