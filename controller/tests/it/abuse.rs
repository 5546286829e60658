//! The controller under abuse, in-process over real gRPC on loopback: a connection that
//! floods gets RESOURCE_EXHAUSTED and the controller keeps serving; an oversized request is
//! refused and changes nothing; listings served from the read view still show a job the
//! moment its submit returned, while other clients loop over the whole queue.

use crate::support;

use support::{Controller, WAIT, alice};
use tandem_net::endpoint::AuthChannel;
use tandem_proto::v1::{self, jobs_client::JobsClient};

fn spec(name: &str) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        ..Default::default()
    }
}

async fn fill(c: &JobsClient<AuthChannel>, n: usize) {
    let mut tasks = Vec::new();
    for lane in 0..16 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in (lane..n).step_by(16) {
                c.submit(v1::SubmitRequest {
                    spec: Some(spec(&format!("fill-{i}"))),
                })
                .await
                .expect("fill submit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("fill task");
    }
}

async fn listed(c: &mut JobsClient<AuthChannel>, id: u64) -> bool {
    let r = c
        .list_jobs(v1::ListJobsRequest {
            jobs: vec![v1::JobRef {
                job_id: id,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("list one job");
    r.into_inner().jobs.iter().any(|j| j.job_id == id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_with_too_many_requests_in_flight_gets_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let c = ctl
        .jobs(&alice())
        .await
        .max_decoding_message_size(tandem_net::endpoint::MAX_RESPONSE_BYTES);
    fill(&c, 1500).await;
    // Far more listings over one connection than it may have in flight (each walks 1,500
    // jobs, a few at a time on the listing pool, so most are still queued when the rest
    // arrive).
    let mut tasks = Vec::new();
    for _ in 0..600 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.list_jobs(v1::ListJobsRequest::default())
                .await
                .map(|r| r.into_inner().jobs.len())
        }));
    }
    let (mut ok, mut exhausted) = (0, 0);
    for t in tasks {
        match t.await.expect("listing task") {
            Ok(n) => {
                assert_eq!(n, 1500);
                ok += 1;
            }
            Err(s) if s.code() == tonic::Code::ResourceExhausted => exhausted += 1,
            Err(s) => panic!("unexpected error {s:?}"),
        }
    }
    eprintln!("flood: {ok} served, {exhausted} refused");
    assert!(exhausted > 0, "no request was refused ({ok} served)");
    assert!(ok > 0, "nothing was served");
    // The controller still serves this connection and others.
    let mut c2 = ctl.jobs(&alice()).await;
    let id = c2
        .submit(v1::SubmitRequest {
            spec: Some(spec("after-flood")),
        })
        .await
        .expect("submit after the flood")
        .into_inner()
        .job_id;
    assert!(listed(&mut c2, id).await);
    ctl.stop().await;
}

#[tokio::test]
async fn an_oversized_request_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let mut c = ctl.jobs(&alice()).await;
    let mut big = spec("too-big");
    big.script = format!(
        "#!/bin/sh\n# {}\n",
        "x".repeat(tandem_controller::api::jobs::MAX_REQUEST_BYTES + 1)
    );
    let err = c
        .submit(v1::SubmitRequest { spec: Some(big) })
        .await
        .expect_err("oversized submit must be refused");
    assert!(
        matches!(
            err.code(),
            tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
        ),
        "{err:?}"
    );
    let all = c
        .list_jobs(v1::ListJobsRequest {
            include_finished: true,
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert!(all.jobs.is_empty(), "refused request left {:?}", all.jobs);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn squeue_right_after_sbatch_shows_the_job_while_others_loop_squeue() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = Controller::start(dir.path(), |_| {}).await;
    let c = ctl
        .jobs(&alice())
        .await
        .max_decoding_message_size(tandem_net::endpoint::MAX_RESPONSE_BYTES);
    fill(&c, 1000).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut loopers = Vec::new();
    for _ in 0..4 {
        let mut c = ctl
            .jobs(&alice())
            .await
            .max_decoding_message_size(tandem_net::endpoint::MAX_RESPONSE_BYTES);
        let stop = stop.clone();
        loopers.push(tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.list_jobs(v1::ListJobsRequest::default())
                    .await
                    .expect("looping squeue");
                n += 1;
            }
            n
        }));
    }
    let mut c = c.clone();
    tokio::time::timeout(WAIT * 6, async {
        for i in 0..50 {
            let id = c
                .submit(v1::SubmitRequest {
                    spec: Some(spec(&format!("ryw-{i}"))),
                })
                .await
                .expect("submit")
                .into_inner()
                .job_id;
            assert!(
                listed(&mut c, id).await,
                "job {id} not listed right after its submit"
            );
        }
    })
    .await
    .expect("submits and listings finish");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loopers {
        assert!(l.await.expect("looper") > 0);
    }
    ctl.stop().await;
}
