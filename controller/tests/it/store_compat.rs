//! Store schema evolution: a store written by the previous release (v0.1.0's format, the
//! `fixtures/store-v0.1.0/tandem.sql` dump) opens in this version with every job, payload and
//! accounting record intact.
//!
//! The dump was written by the previous release itself (commit c483ddf, the last landed
//! main before this format's fields were added): this file's [`scenario`] and
//! `write_fixture` were run in a checkout of that commit, so the records lack every field
//! added since and must load through their defaults. For the next release, run
//! `cargo test -p tandem-controller --test it -- --ignored store_compat::write_fixture` in a
//! checkout of this one (it dumps the store with the `sqlite3` shell) and keep the older
//! dumps beside it under their own versions' names.

use crate::support;

use std::path::Path;

use support::{Controller, alice};
use tandem_net::auth::Identity;
use tandem_proto::v1::{self, JobState};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/store-v0.1.0/tandem.sql"
);

fn bob() -> Identity {
    Identity::user("bob", 1001, 1001)
}

fn spec(name: &str) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        script: format!("#!/bin/sh\necho {name}\n"),
        workdir: "/tmp/compat".into(),
        environment: [("COMPAT".to_owned(), name.to_owned())].into(),
        ..Default::default()
    }
}

/// What the fixture holds: four active jobs of two users (one held, one an array) and one
/// cancelled job in accounting. No worker, so nothing starts.
async fn scenario(c: &Controller) {
    let mut a = c.jobs(&alice()).await;
    let mut b = c.jobs(&bob()).await;
    let submit = |s: v1::JobSpec| v1::SubmitRequest { spec: Some(s) };
    a.submit(submit(spec("compat-pending"))).await.unwrap();
    let mut held = spec("compat-held");
    held.hold = true;
    a.submit(submit(held)).await.unwrap();
    let mut array = spec("compat-array");
    array.array = "0-3".into();
    a.submit(submit(array)).await.unwrap();
    b.submit(submit(spec("compat-bob"))).await.unwrap();
    let gone = b
        .submit(submit(spec("compat-cancelled")))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    b.cancel(v1::CancelRequest {
        jobs: vec![v1::JobRef {
            job_id: gone,
            array_tasks: String::new(),
        }],
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; run by hand when the store format changes"]
async fn write_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |_| {}).await;
    scenario(&c).await;
    c.stop().await;
    let db = dir.path().join(tandem_controller::store::Store::FILE);
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg(".dump")
        .output()
        .expect("the sqlite3 shell");
    assert!(out.status.success(), "{out:?}");
    std::fs::write(FIXTURE, out.stdout).unwrap();
}

/// The fixture's store, rebuilt from its SQL dump in `dir`.
fn restore_fixture(dir: &Path) {
    let sql = std::fs::read_to_string(FIXTURE).unwrap();
    let db = dir.join(tandem_controller::store::Store::FILE);
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(&sql).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_the_previous_release_loads_intact() {
    let dir = tempfile::tempdir().unwrap();
    restore_fixture(dir.path());
    let c = Controller::start(dir.path(), |_| {}).await;
    let mut jobs = c.jobs(&Identity::user("root", 0, 0)).await;
    let listed = jobs
        .list_jobs(v1::ListJobsRequest {
            fold_arrays: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let mut got: Vec<(String, String, i32, u64)> = listed
        .iter()
        .map(|j| (j.name.clone(), j.user.clone(), j.state, j.array_job_id))
        .collect();
    got.sort();
    let pending = JobState::Pending as i32;
    let names: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "compat-array",
            "compat-bob",
            "compat-held",
            "compat-pending"
        ],
        "{listed:#?}"
    );
    assert!(got.iter().all(|g| g.2 == pending), "{got:?}");
    let by_name = |n: &str| listed.iter().find(|j| j.name == n).unwrap();
    assert_eq!(by_name("compat-bob").user, "bob");
    assert_eq!(by_name("compat-pending").user, "alice");
    assert_eq!(
        by_name("compat-held").reason,
        "JobHeldUser",
        "hold survives"
    );
    let array = by_name("compat-array");
    assert_ne!(array.array_job_id, 0, "still an array: {array:?}");
    // The cancelled job's accounting record.
    let mut acct = c.acct(&Identity::user("root", 0, 0)).await;
    let records = acct
        .list_job_records(v1::ListJobRecordsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let cancelled: Vec<_> = records
        .iter()
        .filter(|r| r.name == "compat-cancelled")
        .collect();
    assert_eq!(cancelled.len(), 1, "{records:#?}");
    assert_eq!(cancelled[0].state, JobState::Cancelled as i32);
    assert_eq!(cancelled[0].user, "bob");
    // New submits continue the id sequence rather than reusing a stored id.
    let next = jobs
        .submit(v1::SubmitRequest {
            spec: Some(spec("after-upgrade")),
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let max_stored = listed
        .iter()
        .map(|j| j.job_id.max(j.array_job_id))
        .chain(records.iter().map(|r| r.job_id))
        .max()
        .unwrap();
    assert!(next > max_stored, "{next} after {max_stored}");
    c.stop().await;

    // Payloads (script, environment) are read only at launch: each is still there, whole.
    let store = tandem_controller::store::Store::open(dir.path()).unwrap();
    for j in &listed {
        let id = if j.array_job_id != 0 {
            j.array_job_id
        } else {
            j.job_id
        };
        let payload = store.load_payload(id).unwrap().expect("payload kept");
        let script = format!("#!/bin/sh\necho {}\n", j.name);
        assert!(
            payload
                .windows(script.len())
                .any(|w| w == script.as_bytes()),
            "job {id}'s script is intact"
        );
    }
}
