//! The controller in-process on 127.0.0.1:0, driven by real gRPC clients and a fake worker
//! that speaks the WorkerLink stream (named `FakeWorker`: it runs nothing, it reports what a
//! test tells it to).
//!
//! What belongs here: the controller's contract end to end (submit -> launch -> end ->
//! accounting, restarts, lost workers, group commit under concurrency). Multi-process tests
//! with real workers and the CLI live in `cli/tests/`.

use crate::support;

use std::time::Duration;

use support::{Controller, WAIT, alice};
use tandem_net::auth::Identity;
use tandem_net::endpoint::AuthChannel;
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;
use tandem_proto::v1::{self, controller_message, worker_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn bob() -> Identity {
    Identity::user("bob", 1001, 1001)
}

fn spec(name: &str) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        script: "#!/bin/sh\necho hello\n".into(),
        workdir: "/tmp/work".into(),
        environment: [("HOME".to_owned(), "/home/alice".to_owned())].into(),
        ..Default::default()
    }
}

async fn submit(c: &mut JobsClient<AuthChannel>, s: v1::JobSpec) -> u64 {
    c.submit(v1::SubmitRequest { spec: Some(s) })
        .await
        .unwrap()
        .into_inner()
        .job_id
}

/// A worker stand-in speaking WorkerLink.
struct FakeWorker {
    tx: mpsc::Sender<v1::WorkerMessage>,
    rx: tonic::Streaming<v1::ControllerMessage>,
}

impl FakeWorker {
    async fn attach(c: &Controller, name: &str, cpus: u32, running: Vec<u64>) -> FakeWorker {
        let ch = c.channel(&Identity::worker(name, 0, 0)).await;
        let mut client = WorkerLinkClient::new(ch);
        let (tx, rx) = mpsc::channel(64);
        tx.send(v1::WorkerMessage {
            msg: Some(worker_message::Msg::Register(v1::Register {
                node_name: name.into(),
                resources: Some(v1::Tres {
                    cpus,
                    mem_mb: 8192,
                    gpus: 2,
                    gpu_type: String::new(),
                }),
                step_address: "127.0.0.1:1".into(),
                version: "test".into(),
                running_jobs: running,
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut rx = client
            .attach(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        match next(&mut rx).await {
            controller_message::Msg::Registered(r) => assert_eq!(r.heartbeat_interval_ms, 200),
            other => panic!("expected Registered, got {other:?}"),
        }
        FakeWorker { tx, rx }
    }

    async fn send(&self, msg: worker_message::Msg) {
        self.tx
            .send(v1::WorkerMessage { msg: Some(msg) })
            .await
            .unwrap();
    }

    async fn next(&mut self) -> controller_message::Msg {
        next(&mut self.rx).await
    }

    async fn expect_launch(&mut self) -> v1::LaunchJob {
        match self.next().await {
            controller_message::Msg::LaunchJob(l) => l,
            other => panic!("expected LaunchJob, got {other:?}"),
        }
    }

    /// Answers the controller's `EndJob` for `job` (this node is not the job's batch host)
    /// with `JobGone`: the next message must be that `EndJob`.
    async fn confirm_gone(&mut self, job: u64) {
        match self.next().await {
            controller_message::Msg::EndJob(e) => assert_eq!(e.job_id, job),
            other => panic!("expected EndJob, got {other:?}"),
        }
        self.send(worker_message::Msg::JobGone(v1::JobGone { job_id: job }))
            .await;
    }

    /// The job ended on this node; a stand-in runs nothing, so nothing of it is left here.
    async fn end(&self, job: u64, exit_code: i32) {
        self.send(worker_message::Msg::JobEnded(v1::JobEnded {
            job_id: job,
            exit_code,
            processes_gone: true,
            ..Default::default()
        }))
        .await;
    }
}

async fn next(rx: &mut tonic::Streaming<v1::ControllerMessage>) -> controller_message::Msg {
    tokio::time::timeout(WAIT, rx.message())
        .await
        .expect("no message from the controller in time")
        .unwrap()
        .expect("stream ended")
        .msg
        .unwrap()
}

async fn job(c: &mut JobsClient<AuthChannel>, id: u64) -> Option<v1::JobInfo> {
    c.list_jobs(v1::ListJobsRequest {
        jobs: vec![v1::JobRef {
            job_id: id,
            array_tasks: String::new(),
        }],
        include_finished: true,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .jobs
    .into_iter()
    .next()
}

async fn wait_state(c: &mut JobsClient<AuthChannel>, id: u64, want: v1::JobState) -> v1::JobInfo {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(j) = job(c, id).await
                && j.state == want as i32
            {
                return j;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("job {id} never reached {want:?}"))
}

#[tokio::test]
async fn submit_launch_end_and_account_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w = FakeWorker::attach(&ctl, "n1", 4, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;

    let mut s = spec("hello");
    s.gpus_per_node = 1;
    let id = submit(&mut jobs, s).await;
    assert_eq!(id, 1);

    let launch = w.expect_launch().await;
    assert_eq!(launch.job_id, id);
    assert_eq!(launch.user, "alice");
    assert_eq!(launch.workdir, "/tmp/work");
    assert_eq!(launch.stdout, "/tmp/work/slurm-1.out");
    assert_eq!(launch.gpus.len(), 1);
    assert_eq!(launch.kill_wait_s, 1);
    let env = &launch.environment;
    assert_eq!(env["SLURM_JOB_ID"], "1");
    assert_eq!(env["SLURM_JOB_NODELIST"], "n1");
    assert_eq!(env["SLURM_JOB_PARTITION"], "batch");
    assert_eq!(env["HOME"], "/home/alice");
    assert!(launch.script.contains("echo hello"));

    // Watch from before the end to the terminal state.
    let mut watch = jobs
        .watch_job(v1::WatchJobRequest {
            job: Some(v1::JobRef {
                job_id: id,
                array_tasks: String::new(),
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.state, v1::JobState::Running as i32);

    w.send(worker_message::Msg::JobStarted(v1::JobStarted {
        job_id: id,
        pid: 42,
        start_time: 0,
    }))
    .await;
    w.end(id, 0).await;
    let last = tokio::time::timeout(WAIT, async {
        let mut last = first;
        while let Some(m) = watch.message().await.unwrap() {
            last = m;
        }
        last
    })
    .await
    .unwrap();
    assert_eq!(last.state, v1::JobState::Completed as i32);

    // sacct sees the run with its node and the batch step.
    let mut acct = AccountingClient::new(ctl.channel(&alice()).await);
    let recs = acct
        .list_job_records(v1::ListJobRecordsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].state, v1::JobState::Completed as i32);
    assert_eq!(recs[0].nodelist, "n1");
    assert_eq!(recs[0].steps[0].step_id, "batch");

    // A second job stays RUNNING across a controller restart.
    let id2 = submit(&mut jobs, spec("long")).await;
    assert_eq!(w.expect_launch().await.job_id, id2);
    drop(jobs);
    drop(acct);
    ctl.stop().await;
    drop(w);

    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut jobs = ctl.jobs(&alice()).await;
    assert_eq!(
        job(&mut jobs, id).await.unwrap().state,
        v1::JobState::Completed as i32
    );
    assert_eq!(
        job(&mut jobs, id2).await.unwrap().state,
        v1::JobState::Running as i32
    );
    let w = FakeWorker::attach(&ctl, "n1", 4, vec![id2]).await;
    w.end(id2, 3).await;
    let j2 = wait_state(&mut jobs, id2, v1::JobState::Failed).await;
    assert_eq!(j2.exit_code, 3);
    // Ids are never reused.
    assert_eq!(submit(&mut jobs, spec("third")).await, 3);
    ctl.stop().await;
}

#[tokio::test]
async fn worker_reporting_unknown_job_is_told_to_abandon_it() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w = FakeWorker::attach(&ctl, "n1", 4, vec![77]).await;
    match w.next().await {
        controller_message::Msg::AbandonJob(a) => assert_eq!(a.job_id, 77),
        other => panic!("expected AbandonJob, got {other:?}"),
    }
    ctl.stop().await;
}

#[tokio::test]
async fn lost_worker_fails_its_jobs_and_node_goes_down() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |c| {
        c.node_timeout = Duration::from_millis(600);
    })
    .await;
    let mut w = FakeWorker::attach(&ctl, "n1", 4, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut s = spec("doomed");
    s.no_requeue = true;
    let id = submit(&mut jobs, s).await;
    assert_eq!(w.expect_launch().await.job_id, id);
    // The worker goes silent (no heartbeats).
    let j = wait_state(&mut jobs, id, v1::JobState::NodeFail).await;
    assert_eq!(j.reason, "NodeDown");
    let mut nodes = NodesClient::new(ctl.channel(&alice()).await);
    let n = nodes
        .list_nodes(v1::ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(n[0].state, "DOWN");
    drop(w);
    ctl.stop().await;
}

#[tokio::test]
async fn users_cancel_only_their_own_jobs_and_bad_input_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut a = ctl.jobs(&alice()).await;
    let mut b = ctl.jobs(&bob()).await;
    // No worker: jobs stay pending.
    let id = submit(&mut a, spec("mine")).await;

    let r = b
        .cancel(v1::CancelRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                array_tasks: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.cancelled.is_empty());
    assert!(r.errors[0].contains("denied"), "{:?}", r.errors);

    for (mutate, want) in [
        (
            Box::new(|s: &mut v1::JobSpec| s.partition = "nope".into())
                as Box<dyn Fn(&mut v1::JobSpec)>,
            "partition",
        ),
        (
            Box::new(|s: &mut v1::JobSpec| s.workdir = "relative".into()),
            "workdir",
        ),
        (
            Box::new(|s: &mut v1::JobSpec| s.array = "9-1".into()),
            "array",
        ),
    ] {
        let mut s = spec("bad");
        mutate(&mut s);
        let err = a
            .submit(v1::SubmitRequest { spec: Some(s) })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains(want), "{want}: {}", err.message());
    }
    // Nothing was created: the next id follows the first.
    assert_eq!(submit(&mut a, spec("next")).await, id + 1);

    let r = a
        .cancel(v1::CancelRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                array_tasks: String::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.cancelled, vec![id]);
    assert_eq!(
        job(&mut a, id).await.unwrap().state,
        v1::JobState::Cancelled as i32
    );
    // Unauthenticated calls are refused.
    let raw = tandem_net::net::connect(
        &tonic::transport::Endpoint::from_shared(ctl.addr.clone()).unwrap(),
        &ctl.security,
    )
    .await
    .unwrap();
    let err = JobsClient::new(raw)
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // A plain-text client is not served at all (an unserved request would be refused as
    // Unauthenticated; this one never reaches the services).
    let plain = tandem_net::net::connect(
        &tonic::transport::Endpoint::from_shared(ctl.addr.clone()).unwrap(),
        &tandem_net::net::ClientSecurity::Plaintext,
    )
    .await;
    if let Ok(ch) = plain {
        let err = JobsClient::new(ch)
            .list_jobs(v1::ListJobsRequest::default())
            .await
            .unwrap_err();
        assert_ne!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    }
    ctl.stop().await;
}

#[tokio::test]
async fn concurrent_submits_are_group_committed_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    const CLIENTS: usize = 16;
    const EACH: usize = 100;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = ctl.jobs(&alice()).await;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..EACH {
                let mut s = spec(&format!("c{c}-{i}"));
                s.idempotency_key = format!("{c}-{i}");
                ids.push(submit(&mut client, s).await);
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), CLIENTS * EACH);

    // A retried submit with the same key returns the first job.
    let mut a = ctl.jobs(&alice()).await;
    let mut s = spec("retry");
    s.idempotency_key = "0-0".into();
    let again = submit(&mut a, s).await;
    assert!(all.contains(&again));
    ctl.stop().await;

    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut a = ctl.jobs(&alice()).await;
    let listed = a
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let mut ids: Vec<u64> = listed.iter().map(|j| j.job_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, all);
    // The key survived the restart too.
    let mut s = spec("retry");
    s.idempotency_key = "3-7".into();
    assert!(all.contains(&submit(&mut a, s).await));
    ctl.stop().await;
}

#[tokio::test]
async fn arrays_launch_tasks_with_array_variables() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut s = spec("sweep");
    s.array = "0-4:2".into();
    s.stdout = "out-%A_%a.log".into();
    let id = submit(&mut jobs, s).await;
    // Folded while no node exists.
    let folded = jobs
        .list_jobs(v1::ListJobsRequest {
            fold_arrays: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(folded.len(), 1);
    assert_eq!(folded[0].array_pending, "0-4:2");
    // One pending task by its index, and all of them unfolded.
    let one = jobs
        .list_jobs(v1::ListJobsRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                array_tasks: "2".into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(one.len(), 1);
    assert_eq!(
        (one[0].array_task_id, one[0].state),
        (2, v1::JobState::Pending as i32)
    );
    let all = jobs
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let idx: Vec<i64> = all.iter().map(|j| j.array_task_id).collect();
    assert_eq!(idx, vec![0, 2, 4]);
    let mut w = FakeWorker::attach(&ctl, "n1", 8, vec![]).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let l = w.expect_launch().await;
        assert_eq!(l.environment["SLURM_ARRAY_JOB_ID"], id.to_string());
        assert_eq!(l.environment["SLURM_ARRAY_TASK_COUNT"], "3");
        assert_eq!(l.environment["SLURM_ARRAY_TASK_STEP"], "2");
        let t = l.environment["SLURM_ARRAY_TASK_ID"].clone();
        assert_eq!(l.stdout, format!("/tmp/work/out-{id}_{t}.log"));
        seen.push(t);
        w.end(l.job_id, 0).await;
    }
    seen.sort();
    assert_eq!(seen, vec!["0", "2", "4"]);
    wait_state(&mut jobs, id, v1::JobState::Completed).await;
    ctl.stop().await;
}

/// `--signal`, `--open-mode` and `--input` travel from the submit to the worker's launch,
/// `SLURM_CPUS_ON_NODE` is the job's share, and only the job's batch node may end it.
#[tokio::test]
async fn launch_options_reach_the_worker_and_only_the_batch_node_ends_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut n1 = FakeWorker::attach(&ctl, "n1", 8, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut s = spec("opts");
    s.cpus_per_task = 3;
    s.signal_number = 10;
    s.signal_before_s = 90;
    s.signal_batch_only = true;
    s.open_mode_append = true;
    s.stdin = "in-%j-%%N.txt".into();
    s.stdout = "out-%x-%%.log".into();
    s.environment
        .insert("SLURM_CPUS_ON_NODE".into(), "64".into());
    let id = submit(&mut jobs, s).await;
    let l = n1.expect_launch().await;
    assert_eq!(l.job_id, id);
    assert_eq!(
        (l.signal_number, l.signal_before_s, l.signal_batch_only),
        (10, 90, true)
    );
    assert!(l.open_append);
    assert_eq!(l.stdin, format!("/tmp/work/in-{id}-%%N.txt"));
    assert_eq!(
        l.stdout, "/tmp/work/out-opts-%%.log",
        "%% is left for the worker"
    );
    assert_eq!(l.environment["SLURM_CPUS_ON_NODE"], "3");

    let mut bad = spec("bad-signal");
    bad.signal_number = 99;
    let err = jobs
        .submit(v1::SubmitRequest { spec: Some(bad) })
        .await
        .unwrap_err();
    assert!(err.message().contains("signal"), "{}", err.message());

    // Another node reporting the job's end (a stale report from a worker that lost it) is
    // ignored; the batch node's report ends it.
    let n2 = FakeWorker::attach(&ctl, "n2", 8, vec![]).await;
    n2.end(id, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let j = job(&mut jobs, id).await.unwrap();
    assert_eq!(j.state, v1::JobState::Running as i32, "{j:?}");
    n1.end(id, 0).await;
    wait_state(&mut jobs, id, v1::JobState::Completed).await;
    ctl.stop().await;
}

#[tokio::test]
async fn steps_holds_and_node_administration() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w1 = FakeWorker::attach(&ctl, "n1", 4, vec![]).await;
    let mut w2 = FakeWorker::attach(&ctl, "n2", 4, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let jref = |id| v1::JobRef {
        job_id: id,
        array_tasks: String::new(),
    };

    // A held job waits; releasing it lets it start.
    let mut s = spec("held");
    s.hold = true;
    let held = submit(&mut jobs, s).await;
    assert_eq!(job(&mut jobs, held).await.unwrap().reason, "JobHeldUser");
    let err = ctl
        .jobs(&bob())
        .await
        .update_job(v1::UpdateJobRequest {
            job: Some(jref(held)),
            action: Some(v1::update_job_request::Action::Release(true)),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    jobs.update_job(v1::UpdateJobRequest {
        job: Some(jref(held)),
        action: Some(v1::update_job_request::Action::Release(true)),
    })
    .await
    .unwrap();
    let l = w1.expect_launch().await;
    assert_eq!(l.job_id, held);
    w1.end(held, 0).await;
    wait_state(&mut jobs, held, v1::JobState::Completed).await;

    // A two-node job: a step over both nodes, then sacct shows it.
    let mut s = spec("mpi");
    s.nodes_min = 2;
    s.ntasks_per_node = 2;
    let id = submit(&mut jobs, s).await;
    let l = w1.expect_launch().await;
    assert_eq!(l.job_id, id);
    assert_eq!(l.environment["SLURM_JOB_NODELIST"], "n[1-2]");
    assert_eq!(l.environment["SLURM_NTASKS"], "4");
    let step = jobs
        .create_step(v1::CreateStepRequest {
            job_id: id,
            argv: vec!["hostname".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(step.step_id, 0);
    assert_eq!(step.nodelist, "n[1-2]");
    assert_eq!(step.ntasks, 4);
    assert_eq!(step.targets[1].task_ids, vec![2, 3]);
    assert!(!step.launch_token.is_empty());
    let t = ctl
        .key
        .verify_step(&step.launch_token, tandem_net::auth::unix_now())
        .unwrap();
    assert_eq!((t.job_id, t.step_id, t.uid), (id, 0, 1000));
    assert_eq!(t.nodes, vec!["n1".to_owned(), "n2".to_owned()]);
    jobs.complete_step(v1::CompleteStepRequest {
        job_id: id,
        step_id: 0,
        exit_code: 0,
        signal: 0,
    })
    .await
    .unwrap();
    w1.end(id, 0).await;
    // The other node is held (COMPLETING) until its worker says the job is gone there.
    w2.confirm_gone(id).await;
    wait_state(&mut jobs, id, v1::JobState::Completed).await;
    let mut acct = AccountingClient::new(ctl.channel(&alice()).await);
    let rec = acct
        .list_job_records(v1::ListJobRecordsRequest {
            jobs: vec![jref(id)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(rec.len(), 1);
    let steps: Vec<&str> = rec[0].steps.iter().map(|s| s.step_id.as_str()).collect();
    assert_eq!(steps, vec!["batch", "0"]);
    assert_eq!(rec[0].nodelist, "n[1-2]");

    // Only operators drain; a drained node takes no new work.
    let mut nodes = NodesClient::new(ctl.channel(&alice()).await);
    let err = nodes
        .update_node(v1::UpdateNodeRequest {
            nodes: "n1".into(),
            state: "DRAIN".into(),
            reason: "maintenance".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let mut admin = NodesClient::new(ctl.channel(&Identity::user("root", 0, 0)).await);
    admin
        .update_node(v1::UpdateNodeRequest {
            nodes: "n1".into(),
            state: "DRAIN".into(),
            reason: "maintenance".into(),
        })
        .await
        .unwrap();
    let next = submit(&mut jobs, spec("after-drain")).await;
    let l = w2.expect_launch().await;
    assert_eq!(l.job_id, next);
    let n1 = nodes
        .list_nodes(v1::ListNodesRequest {
            nodes: "n1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(
        (n1[0].state.as_str(), n1[0].reason.as_str()),
        ("DRAINED", "maintenance")
    );
    drop(w1);
    drop(w2);
    ctl.stop().await;
}

/// `info` with only the fields numbered `keep`, cut at the wire level so the test does not
/// restate which struct field is which.
fn only_fields(info: &v1::JobInfo, keep: &[u32]) -> v1::JobInfo {
    use prost::Message as _;
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = buf[0];
            *buf = &buf[1..];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let bytes = info.encode_to_vec();
    let mut rest = bytes.as_slice();
    let mut kept = Vec::new();
    while !rest.is_empty() {
        let field = rest;
        let key = varint(&mut rest);
        match key & 7 {
            0 => {
                varint(&mut rest);
            }
            2 => {
                let len = usize::try_from(varint(&mut rest)).unwrap();
                rest = &rest[len..];
            }
            wire => panic!("JobInfo uses no wire type {wire}"),
        }
        if keep.contains(&u32::try_from(key >> 3).unwrap()) {
            kept.extend_from_slice(&field[..field.len() - rest.len()]);
        }
    }
    v1::JobInfo::decode(kept.as_slice()).unwrap()
}

#[tokio::test]
async fn list_jobs_fills_only_the_fields_asked_for() {
    use tandem_controller::api::convert::{JOB_INFO_FIELDS, job_field};
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut n1 = FakeWorker::attach(&ctl, "n1", 8, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut running = spec("running");
    running.gpus_per_node = 1;
    running.comment = "a comment".into();
    let run_id = submit(&mut jobs, running).await;
    n1.expect_launch().await;
    let mut held = spec("held");
    held.hold = true;
    held.dependency = format!("afterok:{run_id}");
    submit(&mut jobs, held).await;
    wait_state(&mut jobs, run_id, v1::JobState::Running).await;

    let list = |fields: Vec<String>| {
        let mut jobs = jobs.clone();
        async move {
            jobs.list_jobs(v1::ListJobsRequest {
                fields,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().jobs)
        }
    };
    let full = list(Vec::new()).await.unwrap();
    assert_eq!(full.len(), 2);
    // The fixture exercises the costly fields: allocation, GPUs, payload, dependency.
    let (r, h) = (&full[0], &full[1]);
    assert!(!r.nodelist.is_empty() && !r.gpu_binding.is_empty() && r.tres.is_some());
    assert_eq!(
        (r.workdir.as_str(), r.comment.as_str()),
        ("/tmp/work", "a comment")
    );
    assert_eq!(
        (h.reason.as_str(), h.dependency.is_empty()),
        ("JobHeldUser", false)
    );

    let always = [
        job_field::JOB_ID,
        job_field::ARRAY_JOB_ID,
        job_field::ARRAY_TASK_ID,
        job_field::ARRAY_PENDING,
        job_field::STATE,
    ];
    for (name, number) in JOB_INFO_FIELDS {
        let masked = list(vec![(*name).to_string()]).await.unwrap();
        let mut keep = always.to_vec();
        keep.push(*number);
        let want: Vec<v1::JobInfo> = full.iter().map(|j| only_fields(j, &keep)).collect();
        assert_eq!(masked, want, "fields = [{name:?}]");
    }
    let two = list(vec!["user".into(), "nodelist".into()]).await.unwrap();
    assert_eq!((two[0].user.as_str(), two[0].name.as_str()), ("alice", ""));
    assert_eq!(two[0].nodelist, r.nodelist);

    let err = list(vec!["name".into(), "colour".into()])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"colour\""), "{}", err.message());
    ctl.stop().await;
}

/// sacct lists every job exactly once while jobs end under it. Regression: the store was
/// read before the jobs in memory, so a job that ended between the two reads was in
/// neither and vanished from that listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_records_list_each_job_once_while_jobs_end() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const JOBS: u64 = 150;
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w = FakeWorker::attach(&ctl, "n1", 64, vec![]).await;
    // The worker ends each job the moment it is launched.
    let worker = tokio::spawn(async move {
        for _ in 0..JOBS {
            let id = w.expect_launch().await.job_id;
            w.end(id, 0).await;
        }
        w
    });
    // Highest id whose submit has returned; ids are handed out in order from 1.
    let submitted = Arc::new(AtomicU64::new(0));
    let submitter_done = Arc::new(AtomicBool::new(false));
    let submitter = {
        let mut jobs = ctl.jobs(&alice()).await;
        let submitted = Arc::clone(&submitted);
        tokio::spawn(async move {
            for _ in 0..JOBS {
                let id = submit(&mut jobs, spec("quick")).await;
                submitted.fetch_max(id, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    // Several listers at once: each listing has a short window for the race.
    let mut listers = Vec::new();
    for _ in 0..4 {
        let mut acct = AccountingClient::new(ctl.channel(&alice()).await);
        let submitted = Arc::clone(&submitted);
        let submitter_done = Arc::clone(&submitter_done);
        listers.push(tokio::spawn(async move {
            let mut listings = 0;
            loop {
                let done = submitter_done.load(Ordering::SeqCst);
                let known = submitted.load(Ordering::SeqCst);
                let recs = acct
                    .list_job_records(v1::ListJobRecordsRequest {
                        include_active: true,
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .jobs;
                let mut seen: BTreeMap<u64, Vec<i32>> = BTreeMap::new();
                for r in &recs {
                    seen.entry(r.job_id).or_default().push(r.state);
                }
                for id in 1..=known {
                    let states = seen.get(&id).map_or(&[][..], Vec::as_slice);
                    assert_eq!(
                        states.len(),
                        1,
                        "listing {listings}: job {id} listed {} times: {states:?}",
                        states.len()
                    );
                }
                listings += 1;
                if done {
                    return listings;
                }
            }
        }));
    }
    submitter.await.unwrap();
    submitter_done.store(true, Ordering::SeqCst);
    let mut listings = 0;
    for l in listers {
        listings += l.await.unwrap();
    }
    drop(tokio::time::timeout(WAIT, worker).await.unwrap().unwrap());
    assert!(
        listings > 20,
        "only {listings} listings overlapped the jobs"
    );
    ctl.stop().await;
}

/// A preemption carries the victim QOS's GraceTime to the worker, which sends SIGTERM at
/// once and starts KillWait only after the grace (the worker's side is tested in
/// `worker/tests/it/batch.rs`, the whole story in `cli/tests/it/policy.rs`).
#[tokio::test]
async fn preemption_signal_carries_the_victims_qos_grace_time() {
    use tandem_sched::qos::Qos;
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |c| {
        let mut low = Qos::new("low");
        low.grace_time_s = 7;
        let mut high = Qos::new("high");
        high.priority = 100;
        high.preempt = vec!["low".into()];
        c.cluster.qos.extend([low, high]);
    })
    .await;
    let mut w = FakeWorker::attach(&ctl, "n1", 4, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut victim = spec("victim");
    victim.qos = "low".into();
    victim.gpus_per_node = 2;
    let victim = submit(&mut jobs, victim).await;
    assert_eq!(w.expect_launch().await.job_id, victim);
    w.send(worker_message::Msg::JobStarted(v1::JobStarted {
        job_id: victim,
        pid: 42,
        start_time: 0,
    }))
    .await;
    let mut urgent = spec("urgent");
    urgent.qos = "high".into();
    urgent.gpus_per_node = 2;
    submit(&mut jobs, urgent).await;
    match w.next().await {
        controller_message::Msg::SignalJob(s) => {
            assert_eq!(
                (s.job_id, s.signal, s.reason.as_str(), s.grace_s),
                (victim, 0, "preempt", 7),
                "{s:?}"
            );
        }
        other => panic!("expected SignalJob, got {other:?}"),
    }
    ctl.stop().await;
}

/// The operator's node lifecycle: busy_until and the drain flag in the listing; removal
/// refused while jobs run, forced removal requeues them, idle removal hides the node.
#[tokio::test]
async fn remove_node_refuses_busy_nodes_unless_forced_and_requeues() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w1 = FakeWorker::attach(&ctl, "n1", 4, vec![]).await;
    let _w2 = FakeWorker::attach(&ctl, "n2", 4, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let mut s = spec("long");
    s.time_limit_s = 600;
    let id = submit(&mut jobs, s).await;
    // Wherever it started, find its node.
    let info = wait_state(&mut jobs, id, v1::JobState::Running).await;
    let host = info.nodelist.clone();
    if host == "n1" {
        let l = w1.expect_launch().await;
        w1.send(worker_message::Msg::JobStarted(v1::JobStarted {
            job_id: l.job_id,
            start_time: info.start_time,
            ..Default::default()
        }))
        .await;
    }
    let mut admin = NodesClient::new(ctl.channel(&Identity::user("root", 0, 0)).await);
    let listed = admin
        .list_nodes(v1::ListNodesRequest {
            nodes: host.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(listed[0].busy_until, info.start_time + 600);
    assert!(!listed[0].drain);

    let mut user = NodesClient::new(ctl.channel(&alice()).await);
    let err = user
        .remove_node(v1::RemoveNodeRequest {
            nodes: host.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    let err = admin
        .remove_node(v1::RemoveNodeRequest {
            nodes: format!("{host},n9"),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(
        job(&mut jobs, id).await.unwrap().state,
        v1::JobState::Running as i32
    );

    let r = admin
        .remove_node(v1::RemoveNodeRequest {
            nodes: format!("{host},n9"),
            force: true,
            reason: "tandem-operator: test".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.removed, vec![host.clone()]);
    assert_eq!(r.unknown, vec!["n9".to_owned()]);
    // The job was requeued (default JobRequeue) and runs again on the remaining node or waits.
    let after = job(&mut jobs, id).await.unwrap();
    let running_there = after.state == v1::JobState::Running as i32 && after.nodelist == host;
    assert!(!running_there, "{after:?}");
    assert_ne!(
        after.state,
        v1::JobState::NodeFail as i32,
        "requeued, not failed: {after:?}"
    );
    let names: Vec<String> = admin
        .list_nodes(v1::ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert!(!names.contains(&host), "{names:?}");
    // Idempotent.
    let again = admin
        .remove_node(v1::RemoveNodeRequest {
            nodes: host.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.unknown, vec![host]);
    ctl.stop().await;
}

/// A submit that the scheduler can start at once commits together with its start: one
/// transaction (one fsync) per job in a stream of submits, where the pass after each submit
/// used to commit the start on its own. The reply still comes only once both are durable.
#[tokio::test]
async fn a_submit_commits_together_with_the_start_it_allows() {
    use support::metrics::{free_addr, scrape};
    let dir = tempfile::tempdir().unwrap();
    let metrics = free_addr();
    let ctl = Controller::start(dir.path(), |cfg| {
        cfg.metrics_listen = Some(metrics);
        // Every pass joins, even on a slow debug build.
        cfg.quick_pass = Duration::from_secs(1);
    })
    .await;
    let mut w = FakeWorker::attach(&ctl, "n1", 64, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let commits = || async { scrape(metrics).await["tandem_store_commits_total"] };
    let before = commits().await;
    let started = std::time::Instant::now();
    const JOBS: u64 = 20;
    let mut ids = Vec::new();
    for i in 0..JOBS {
        let id = submit(&mut jobs, spec(&format!("j{i}"))).await;
        assert_eq!(w.expect_launch().await.job_id, id);
        ids.push(id);
    }
    let during = commits().await - before;
    // The actor's tick (every 200 ms) may commit on its own; at most one commit each.
    let ticks = (started.elapsed().as_millis() / 200) as f64 + 1.0;
    assert!(
        during <= JOBS as f64 + ticks,
        "{during} commits for {JOBS} submits in {:?}",
        started.elapsed()
    );
    ctl.stop().await;
    // What was acknowledged is durable: every job is RUNNING after a restart.
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut jobs = ctl.jobs(&alice()).await;
    for id in ids {
        assert_eq!(
            job(&mut jobs, id).await.map(|j| j.state),
            Some(v1::JobState::Running as i32),
            "job {id}"
        );
    }
    ctl.stop().await;
}

#[tokio::test]
async fn a_job_submitted_to_a_full_cluster_says_why_it_waits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut w = FakeWorker::attach(&ctl, "n1", 1, vec![]).await;
    let mut jobs = ctl.jobs(&alice()).await;
    let runs = submit(&mut jobs, spec("runs")).await;
    assert_eq!(w.expect_launch().await.job_id, runs);
    wait_state(&mut jobs, runs, v1::JobState::Running).await;
    // No CPU is free, so no pass looks at these; the submit itself says what one would.
    let waits = submit(&mut jobs, spec("waits")).await;
    let mut held = spec("held");
    held.hold = true;
    let held = submit(&mut jobs, held).await;
    let info = job(&mut jobs, waits).await.unwrap();
    assert_eq!(info.reason, "Resources");
    assert!(info.priority > 0, "priority {}", info.priority);
    let info = job(&mut jobs, held).await.unwrap();
    assert_eq!((info.reason.as_str(), info.priority), ("JobHeldUser", 0));
    ctl.stop().await;
    // Written with the submit: the same after a restart, before any pass.
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut jobs = ctl.jobs(&alice()).await;
    assert_eq!(job(&mut jobs, waits).await.unwrap().reason, "Resources");
    ctl.stop().await;
}
