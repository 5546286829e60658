//! The bridge's side of the controller (`tandem.v1.Bridge`), in-process with real gRPC: a
//! placeholder job is scheduled like a batch job onto a node that switches to `kube` mode,
//! is never launched on the worker, is found again by its pod group's UID, ends when the
//! bridge reports its pods gone, and is ended early (scancel, time limit) only by asking the
//! bridge, through the watch stream, to evict: by scancel or the time limit. A node drained or
//! lost is asked back alone and held until the bridge releases it. Workers are `FakeWorker`s.

use crate::support;

use std::time::Duration;

use support::worker::{FakeWorker, register};
use support::{Controller, WAIT, alice};
use tandem_net::auth::{Identity, Role};
use tandem_net::endpoint::AuthChannel;
use tandem_proto::v1::bridge_client::BridgeClient;
use tandem_proto::v1::nodes_client::NodesClient;
use tandem_proto::v1::{self, JobState, controller_message, worker_message};

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
        namespace: "serving".into(),
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

fn two_node_group(uid: &str) -> v1::SubmitPlaceholderRequest {
    v1::SubmitPlaceholderRequest {
        nodes: 2,
        ..group(uid, 1)
    }
}

fn batch_spec(name: &str) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        ..Default::default()
    }
}

async fn node(c: &Controller, name: &str) -> v1::NodeInfo {
    let mut nodes = NodesClient::new(c.channel(&root()).await);
    let mut list = nodes
        .list_nodes(v1::ListNodesRequest {
            nodes: name.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(list.len(), 1, "{list:?}");
    list.remove(0)
}

/// Fails if the worker is sent a launch within `window`: a node the placeholder still holds
/// must not be given to batch work.
async fn no_launch(w: &mut FakeWorker, window: Duration) {
    let until = tokio::time::Instant::now() + window;
    while let Ok(m) = tokio::time::timeout_at(until, w.rx.message()).await {
        if let Ok(Some(v1::ControllerMessage {
            msg: Some(controller_message::Msg::LaunchJob(l)),
        })) = m
        {
            panic!("job {} launched on a node the placeholder holds", l.job_id);
        }
    }
}

/// `scontrol update State=DOWN` on one node of a two-node placeholder: the placeholder is
/// not ended (its pods run under the kubelet, not the worker); the bridge is asked to evict
/// them (ending NODE_FAIL), both nodes stay held in `kube` mode, and only the bridge's report
/// ends the job NODE_FAIL and frees them. The node cannot be removed meanwhile.
/// Releases `nodes` of a placeholder for `namespace`.
async fn release(
    b: &mut BridgeClient<AuthChannel>,
    job_id: u64,
    nodes: &[&str],
    namespace: &str,
) -> Result<v1::ReleasePlaceholderNodesResponse, tonic::Status> {
    b.release_placeholder_nodes(v1::ReleasePlaceholderNodesRequest {
        job_id,
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        end_time: 0,
        namespace: namespace.into(),
    })
    .await
    .map(tonic::Response::into_inner)
}

/// DOWN of one node of a two-node placeholder: the bridge is asked to clear that node
/// alone; the node stays held (and cannot be removed) until the bridge releases it, then
/// leaves the job, which serves on from the other node.
#[tokio::test]
async fn a_downed_node_is_asked_back_alone_and_held_until_the_bridge_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |_| {}).await;
    let _k1 = FakeWorker::attach(&c, register("k1", 8, 8192, 2)).await;
    let mut k2 = FakeWorker::attach(&c, register("k2", 8, 8192, 2)).await;
    let mut b = client(&c, &bridge()).await;
    let (mut watch, _) = Watch::start(&mut b).await;
    let id = b
        .submit_placeholder(two_node_group("g2n"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let ev = watch
        .until("running", |e| is(e, id, JobState::Running))
        .await;
    assert_eq!(ev.nodes, vec!["k1".to_owned(), "k2".to_owned()]);
    let mut jobs = c.jobs(&alice()).await;
    let batch = jobs
        .submit(v1::SubmitRequest {
            spec: Some(batch_spec("train")),
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;

    let mut admin = NodesClient::new(c.channel(&root()).await);
    admin
        .update_node(v1::UpdateNodeRequest {
            nodes: "k1".into(),
            state: "DOWN".into(),
            reason: "bad gpu".into(),
        })
        .await
        .unwrap();
    let ev = watch
        .until("k1 asked back", |e| {
            e.job_id == id && !e.releasing.is_empty()
        })
        .await;
    assert_eq!(ev.releasing, vec!["k1".to_owned()]);
    assert_eq!((ev.state, ev.ending), (JobState::Running as i32, 0));
    assert_eq!(ev.nodes, vec!["k1".to_owned(), "k2".to_owned()]);
    no_launch(&mut k2, Duration::from_secs(1)).await;
    let n1 = node(&c, "k1").await;
    assert_eq!(n1.state, "DOWN");
    assert_eq!(n1.running_jobs, vec![id]);
    assert_eq!(n1.mode, v1::NodeMode::Kube as i32);

    // The node cannot leave the controller while the pods may run there, forced or not.
    for force in [true, false] {
        let e = admin
            .remove_node(v1::RemoveNodeRequest {
                nodes: "k1".into(),
                force,
                reason: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    }

    // Refused, changing nothing: another namespace; a node not asked back; an unknown node;
    // a release without nodes.
    let e = release(&mut b, id, &["k1"], "mallory").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = release(&mut b, id, &["k2"], "serving").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let e = release(&mut b, id, &["k1", "nope"], "serving")
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = release(&mut b, id, &[], "serving").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(node(&c, "k1").await.running_jobs, vec![id]);

    // The pods on k1 are gone: k1 leaves the job, which keeps k2.
    let r = release(&mut b, id, &["k1"], "serving").await.unwrap();
    assert_eq!(
        (r.state, r.nodes.clone()),
        (JobState::Running as i32, vec!["k2".to_owned()])
    );
    let ev = watch
        .until("the job on k2 alone", |e| {
            e.job_id == id && e.nodes.len() == 1
        })
        .await;
    assert_eq!((ev.nodes, ev.releasing), (vec!["k2".to_owned()], vec![]));
    assert!(node(&c, "k1").await.running_jobs.is_empty());
    assert_eq!(node(&c, "k2").await.running_jobs, vec![id]);
    // A repeat is harmless.
    let r = release(&mut b, id, &["k1"], "serving").await.unwrap();
    assert_eq!(r.nodes, vec!["k2".to_owned()]);
    no_launch(&mut k2, Duration::from_millis(300)).await;

    // The last pods end: COMPLETED on k2, and only now does k2 take the batch job.
    let ended = end(&mut b, id).await.unwrap();
    assert_eq!(ended.state, JobState::Completed as i32);
    assert_eq!(k2.expect_launch().await.job_id, batch);
    assert_eq!(node(&c, "k1").await.state, "DOWN");
    let rec = c
        .acct(&root())
        .await
        .list_job_records(v1::ListJobRecordsRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                array_tasks: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(rec.len(), 1, "{rec:?}");
    assert_eq!(rec[0].nodelist, "k2");
    admin
        .remove_node(v1::RemoveNodeRequest {
            nodes: "k1".into(),
            force: false,
            reason: String::new(),
        })
        .await
        .unwrap();
    c.stop().await;
}

/// The worker under one node of a placeholder goes silent: the same, by the timeout; and
/// when the other node is drained too, releasing it (the last) ends the job.
#[tokio::test]
async fn a_silent_worker_under_a_placeholder_asks_the_bridge_for_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |cfg| {
        cfg.node_timeout = Duration::from_millis(600);
    })
    .await;
    let _k1 = FakeWorker::attach(&c, register("k1", 8, 8192, 2)).await;
    let mut k2 = FakeWorker::attach(&c, register("k2", 8, 8192, 2)).await;
    // k2 stays alive; k1 never heartbeats.
    let beat = k2.tx.clone();
    let beating = tokio::spawn(async move {
        loop {
            let hb = v1::WorkerMessage {
                msg: Some(worker_message::Msg::Heartbeat(v1::Heartbeat::default())),
            };
            if beat.send(hb).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut b = client(&c, &bridge()).await;
    let (mut watch, _) = Watch::start(&mut b).await;
    let id = b
        .submit_placeholder(two_node_group("silent"))
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let batch = c
        .jobs(&alice())
        .await
        .submit(v1::SubmitRequest {
            spec: Some(batch_spec("train")),
        })
        .await
        .unwrap()
        .into_inner()
        .job_id;
    let ev = watch
        .until("k1 asked back", |e| {
            e.job_id == id && !e.releasing.is_empty()
        })
        .await;
    assert_eq!((ev.releasing, ev.ending), (vec!["k1".to_owned()], 0));
    assert_eq!(node(&c, "k1").await.state, "DOWN");
    release(&mut b, id, &["k1"], "serving").await.unwrap();

    // A drain of k2, its last node, asks for it too; releasing it ends the job COMPLETED
    // (its pods are gone), and the drained node then takes no batch job.
    NodesClient::new(c.channel(&root()).await)
        .update_node(v1::UpdateNodeRequest {
            nodes: "k2".into(),
            state: "DRAIN".into(),
            reason: "rollout".into(),
        })
        .await
        .unwrap();
    let ev = watch
        .until("k2 asked back", |e| {
            e.job_id == id && e.releasing == vec!["k2".to_owned()]
        })
        .await;
    assert_eq!(ev.ending, 0);
    let r = release(&mut b, id, &["k2"], "serving").await.unwrap();
    assert_eq!(r.state, JobState::Completed as i32);
    assert!(r.nodes.is_empty());
    watch
        .until("completed", |e| is(e, id, JobState::Completed))
        .await;
    let n2 = node(&c, "k2").await;
    assert!(n2.running_jobs.is_empty());
    assert_eq!(n2.state, "DRAINED");
    no_launch(&mut k2, Duration::from_millis(500)).await;
    let _ = batch;
    beating.abort();
    c.stop().await;
}

#[tokio::test]
async fn a_group_is_its_namespaces_and_only_its_namespace_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), |_| {}).await;
    let _k1 = FakeWorker::attach(&c, register("k1", 8, 8192, 2)).await;
    let _k2 = FakeWorker::attach(&c, register("k2", 8, 8192, 2)).await;
    let mut b = client(&c, &bridge()).await;
    let (mut watch, _) = Watch::start(&mut b).await;

    // The same group UID from another namespace (an LWS group key is a hash anyone can
    // compute; labels can be copied) is another group: its own job, charged to its own
    // namespace, never the victim's found again.
    let victim = b
        .submit_placeholder(group("lws-abc", 2))
        .await
        .unwrap()
        .into_inner();
    let mut forged = group("lws-abc", 2);
    forged.namespace = "mallory".into();
    let theirs = b.submit_placeholder(forged).await.unwrap().into_inner();
    assert!(victim.created && theirs.created, "{victim:?} {theirs:?}");
    assert_ne!(victim.job_id, theirs.job_id);
    let ev = watch
        .until("the victim's placeholder running", |e| {
            is(e, victim.job_id, JobState::Running)
        })
        .await;
    assert_eq!(ev.namespace, "serving");
    let ev = watch
        .until("the other namespace's placeholder running", |e| {
            is(e, theirs.job_id, JobState::Running)
        })
        .await;
    assert_eq!(ev.namespace, "mallory");

    // An end report from another namespace is refused and changes nothing; one without a
    // namespace is refused too.
    let e = b
        .end_placeholder(v1::EndPlaceholderRequest {
            job_id: victim.job_id,
            end_time: 0,
            namespace: "mallory".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let e = b
        .end_placeholder(v1::EndPlaceholderRequest {
            job_id: victim.job_id,
            end_time: 0,
            namespace: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let mut admin = c.jobs(&root()).await;
    let listed = admin
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let state = listed
        .jobs
        .iter()
        .find(|j| j.job_id == victim.job_id)
        .map(|j| j.state);
    assert_eq!(state, Some(JobState::Running as i32), "still running");

    // Its own namespace ends it.
    let ended = end(&mut b, victim.job_id).await.unwrap();
    assert_eq!(ended.state, JobState::Completed as i32);
}
