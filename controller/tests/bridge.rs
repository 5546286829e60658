//! The bridge's side of the controller (`tandem.v1.Bridge`), in-process with real gRPC: a
//! placeholder job is scheduled like a batch job onto a node that switches to `kube` mode,
//! is never launched on the worker, is found again by its pod group's UID, ends when the
//! bridge reports its pods gone, and is ended early (scancel, time limit) only by asking the
//! bridge, through the watch stream, to evict. Workers are `FakeWorker`s.

mod support;

use std::time::Duration;

use support::worker::{FakeWorker, register};
use support::{Controller, WAIT, alice};
use tandem_proto::auth::{Identity, Role};
use tandem_proto::endpoint::AuthChannel;
use tandem_proto::v1::bridge_client::BridgeClient;
use tandem_proto::v1::{self, JobState};

fn bridge() -> Identity {
    Identity::service(Role::Bridge, "tandem-bridge", 0, 0)
}

fn root() -> Identity {
    Identity::user("root", 0, 0)
}

async fn client(c: &Controller, who: &Identity) -> BridgeClient<AuthChannel> {
    BridgeClient::new(c.channel(who).await)
}

fn group(uid: &str, gpus: u32) -> v1::SubmitPlaceholderRequest {
    v1::SubmitPlaceholderRequest {
        group_uid: uid.into(),
        name: format!("serving/{uid}"),
        namespace: "serving".into(),
        account: "root".into(),
        nodes: 1,
        pods_per_node: 1,
        cpus_per_pod: 2,
        mem_mb_per_pod: 1024,
        gpus_per_pod: gpus,
        ..Default::default()
    }
}

struct Watch(tonic::Streaming<v1::PlaceholderEvent>);

impl Watch {
    /// Subscribes and reads the snapshot; returns the stream and the snapshot's events.
    async fn start(b: &mut BridgeClient<AuthChannel>) -> (Watch, Vec<v1::PlaceholderEvent>) {
        let s = b
            .watch_placeholders(v1::WatchPlaceholdersRequest {})
            .await
            .unwrap()
            .into_inner();
        let mut w = Watch(s);
        let mut snapshot = Vec::new();
        loop {
            let e = w.next().await;
            if e.snapshot_done {
                return (w, snapshot);
            }
            snapshot.push(e);
        }
    }

    async fn next(&mut self) -> v1::PlaceholderEvent {
        tokio::time::timeout(WAIT, self.0.message())
            .await
            .expect("no placeholder event in time")
            .unwrap()
            .expect("watch ended")
    }

    async fn until(
        &mut self,
        what: &str,
        f: impl Fn(&v1::PlaceholderEvent) -> bool,
    ) -> v1::PlaceholderEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            assert!(tokio::time::Instant::now() < deadline, "never saw {what}");
            let e = self.next().await;
            if f(&e) {
                return e;
            }
        }
    }
}

/// Reports a placeholder's pods gone now.
async fn end(
    b: &mut BridgeClient<AuthChannel>,
    job_id: u64,
) -> Result<v1::EndPlaceholderResponse, tonic::Status> {
    b.end_placeholder(v1::EndPlaceholderRequest {
        job_id,
        end_time: 0,
    })
    .await
    .map(tonic::Response::into_inner)
}

fn is(e: &v1::PlaceholderEvent, job: u64, state: JobState) -> bool {
    e.job_id == job && e.state == state as i32
}

#[tokio::test]
async fn placeholders_hold_kube_nodes_until_the_bridge_reports_the_pods_gone() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |_| {}).await;
    let mut k1 = FakeWorker::attach(&c, register("k1", 8, 8192, 2)).await;
    let mut b = client(&c, &bridge()).await;
    let (mut watch, snapshot) = Watch::start(&mut b).await;
    assert!(snapshot.is_empty());

    // Users cannot make placeholders, by either door.
    let e = client(&c, &alice())
        .await
        .submit_placeholder(group("g1", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let mut jobs = c.jobs(&alice()).await;
    let kube = v1::JobSpec {
        name: "sneaky".into(),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        mode: v1::NodeMode::Kube as i32,
        ..Default::default()
    };
    let e = jobs
        .submit(v1::SubmitRequest { spec: Some(kube) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // A broken request names its field and changes nothing.
    let mut bad = group("", 1);
    bad.account = "root".into();
    let e = b.submit_placeholder(bad).await.unwrap_err();
    assert!(e.message().starts_with("group_uid"), "{e:?}");

    // Submitted twice (a bridge restarted mid-way): one job.
    let first = b
        .submit_placeholder(group("g1", 2))
        .await
        .unwrap()
        .into_inner();
    let again = b
        .submit_placeholder(group("g1", 2))
        .await
        .unwrap()
        .into_inner();
    assert!(first.created && !again.created);
    assert_eq!(first.job_id, again.job_id);
    let id = first.job_id;
    let ev = watch
        .until("g1 running", |e| is(e, id, JobState::Running))
        .await;
    assert_eq!(ev.group_uid, "g1");
    assert_eq!(ev.nodes, vec!["k1".to_owned()]);
    assert_eq!(ev.pods_per_node, 1);
    assert_eq!(ev.ending, 0);

    // A batch job waits: k1 serves pods now, although it has CPUs free.
    let batch = jobs
        .submit(v1::SubmitRequest {
            spec: Some(v1::JobSpec {
                name: "train".into(),
                script: "#!/bin/sh\ntrue\n".into(),
                workdir: "/tmp".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;

    // scancel does not end it at once: the bridge is asked to evict the pods.
    let mut admin = c.jobs(&root()).await;
    admin
        .cancel(v1::CancelRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                array_tasks: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let ev = watch
        .until("g1 ending", |e| e.job_id == id && e.ending != 0)
        .await;
    assert_eq!(ev.state, JobState::Running as i32);
    assert_eq!(ev.ending, JobState::Cancelled as i32);

    // The pods are gone: the job ends CANCELLED, and only now does k1 take the batch job,
    // the first thing it is ever asked to launch (the placeholder never was).
    let ended = end(&mut b, id).await.unwrap();
    assert_eq!(ended.state, JobState::Cancelled as i32);
    watch
        .until("g1 cancelled", |e| is(e, id, JobState::Cancelled))
        .await;
    assert_eq!(k1.expect_launch().await.job_id, batch);
    // Reporting again is harmless; a batch job is not the bridge's to end.
    let again = end(&mut b, id).await.unwrap();
    assert_eq!(again.state, JobState::Cancelled as i32);
    let e = end(&mut b, batch).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    // A new group waits while k1 runs batch work, and survives a controller restart: the
    // restarted controller's snapshot has it, and resubmitting finds it.
    let g2 = b
        .submit_placeholder(group("g2", 1))
        .await
        .unwrap()
        .into_inner();
    watch
        .until("g2 pending", |e| is(e, g2.job_id, JobState::Pending))
        .await;
    drop((watch, b, k1, jobs, admin));
    c.stop().await;
    let c = Controller::start(dir.path(), |_| {}).await;
    let mut b = client(&c, &bridge()).await;
    let (_watch, snapshot) = Watch::start(&mut b).await;
    assert!(
        snapshot
            .iter()
            .any(|e| is(e, g2.job_id, JobState::Pending) && e.group_uid == "g2"),
        "{snapshot:?}"
    );
    let again = b
        .submit_placeholder(group("g2", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.job_id, again.created), (g2.job_id, false));
    c.stop().await;
}

#[tokio::test]
async fn a_placeholder_past_its_time_limit_is_asked_to_end_and_ends_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |_| {}).await;
    let _k1 = FakeWorker::attach(&c, register("k1", 8, 8192, 2)).await;
    let mut b = client(&c, &bridge()).await;
    let (mut watch, _) = Watch::start(&mut b).await;
    let mut g = group("short", 1);
    g.time_limit_s = 1;
    let id = b.submit_placeholder(g).await.unwrap().into_inner().job_id;
    watch
        .until("running", |e| is(e, id, JobState::Running))
        .await;
    let ev = watch
        .until("time-out notice", |e| e.job_id == id && e.ending != 0)
        .await;
    assert_eq!(ev.ending, JobState::Timeout as i32);
    let ended = end(&mut b, id).await.unwrap();
    assert_eq!(ended.state, JobState::Timeout as i32);
    c.stop().await;
}
