//! Autoscaling signals end to end: the controller in-process with `--scaler-listen` and
//! `--metrics-listen`, asked as KEDA asks (a real gRPC `ExternalScaler` client, no Tandem
//! credential) and scraped as Prometheus scrapes (HTTP GET /metrics, every line checked
//! against the OpenMetrics text format). Jobs of several shapes are submitted with the
//! real Jobs API; a worker stand-in (`FakeWorker`, speaking WorkerLink) runs one so the
//! scaler sees a busy worker, then ends it: scale to zero.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::metrics::{free_addr, parse_openmetrics, scrape, scrape_until};
use support::worker::{FakeWorker, register};
use support::{Controller, WAIT, alice};
use tandem_proto::externalscaler::external_scaler_client::ExternalScalerClient;
use tandem_proto::externalscaler::{GetMetricsRequest, ScaledObjectRef};
use tandem_proto::v1;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_sched::partition::Partition;
use tonic::transport::Channel;

fn shape(kv: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: "workers".into(),
        namespace: "hpc".into(),
        scaler_metadata: kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn gpu8() -> ScaledObjectRef {
    shape(&[
        ("partition", "gpu"),
        ("gpusPerNode", "8"),
        ("cpusPerNode", "64"),
        ("memoryPerNode", "512G"),
        ("workerSet", "h100"),
    ])
}

fn job(gpus_per_node: u32, nodes: u32) -> v1::JobSpec {
    v1::JobSpec {
        name: "train".into(),
        script: "#!/bin/sh\ntrue\n".into(),
        workdir: "/tmp".into(),
        partition: "gpu".into(),
        gpus_per_node,
        nodes_min: nodes,
        ..Default::default()
    }
}

async fn submit(c: &mut JobsClient<tandem_net::endpoint::AuthChannel>, s: v1::JobSpec) -> u64 {
    c.submit(v1::SubmitRequest { spec: Some(s) })
        .await
        .unwrap()
        .into_inner()
        .job_id
}

/// The scaler over TLS, verified against the controller's CA (as KEDA does with the
/// trigger's `caCert`).
async fn scaler(
    addr: SocketAddr,
    security: &tandem_net::net::ClientSecurity,
) -> ExternalScalerClient<Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}")).unwrap();
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(c) = tandem_net::net::connect(&endpoint, security).await {
                return ExternalScalerClient::new(c);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("scaler listener did not come up")
}

async fn workers(s: &mut ExternalScalerClient<Channel>, r: &ScaledObjectRef) -> i64 {
    let resp = s
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(r.clone()),
            metric_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.metric_values.len(), 1);
    let v = &resp.metric_values[0];
    assert_eq!(v.metric_value as f64, v.metric_value_float);
    v.metric_value
}

/// Polls until the scaler reports `want` workers for `r` (passes run on events and on a
/// short timer here; a loaded machine may take a while).
async fn wait_workers(s: &mut ExternalScalerClient<Channel>, r: &ScaledObjectRef, want: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = workers(s, r).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "scaler reports {got} workers for {:?}, want {want}",
            r.scaler_metadata
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn is_active(s: &mut ExternalScalerClient<Channel>, r: &ScaledObjectRef) -> bool {
    s.is_active(r.clone()).await.unwrap().into_inner().result
}

/// A worker stand-in on the WorkerLink stream: registers, is told to launch, reports ends.
/// An 8-GPU worker of the `gpu` partition.
async fn gpu_worker(c: &Controller, name: &str) -> FakeWorker {
    let reg = v1::Register {
        partitions: vec!["gpu".into()],
        ..register(name, 64, 512 * 1024, 8)
    };
    FakeWorker::attach(c, reg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_scaler_reports_shape_aware_demand_and_scales_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (scaler_addr, metrics_addr) = (free_addr(), free_addr());
    let c = Controller::start(dir.path(), |cfg| {
        cfg.scaler_listen = Some(scaler_addr);
        cfg.metrics_listen = Some(metrics_addr);
        cfg.sched_interval = Duration::from_millis(200);
        let mut gpu = Partition::new("gpu");
        gpu.default = true;
        cfg.cluster.partitions = vec![gpu, Partition::new("cpu")];
    })
    .await;
    let mut s = scaler(scaler_addr, &c.security).await;
    let mut jobs = c.jobs(&alice()).await;

    // Nothing queued, no nodes: inactive, zero workers.
    let spec = s.get_metric_spec(gpu8()).await.unwrap().into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].metric_name, "tandem-workers-h100");
    assert_eq!(spec.metric_specs[0].target_size, 1);
    assert_eq!(spec.metric_specs[0].target_size_float, 1.0);
    assert!(!is_active(&mut s, &gpu8()).await);
    assert_eq!(workers(&mut s, &gpu8()).await, 0);
    let mut stream = s.stream_is_active(gpu8()).await.unwrap().into_inner();
    let first = tokio::time::timeout(WAIT, stream.message()).await.unwrap();
    assert!(!first.unwrap().unwrap().result);

    // Bad metadata is refused with the key named.
    for (meta, want) in [
        (shape(&[("gpusPerNode", "8")]), "partition is required"),
        (
            shape(&[("partition", "gpu"), ("gpusPerNode", "eight")]),
            "gpusPerNode",
        ),
        (shape(&[("partition", "nosuch")]), "no such partition"),
    ] {
        let e = s.is_active(meta.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(want), "{}", e.message());
        let e = s
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(meta),
                metric_name: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    // Several shapes on an empty (scaled-to-zero) partition:
    //   a 2-node x 8-GPU job          -> 2 workers
    //   ten 1-GPU jobs                -> 8 + 2 GPUs -> 2 workers
    //   a 16-GPU-per-node job         -> never fits an 8-GPU worker: 0
    //   a held 8-GPU job              -> not demand
    let wide = submit(&mut jobs, job(8, 2)).await;
    for _ in 0..10 {
        submit(&mut jobs, job(1, 1)).await;
    }
    submit(&mut jobs, job(16, 1)).await;
    submit(
        &mut jobs,
        v1::JobSpec {
            hold: true,
            ..job(8, 1)
        },
    )
    .await;
    wait_workers(&mut s, &gpu8(), 4).await;
    assert!(is_active(&mut s, &gpu8()).await);
    let next = tokio::time::timeout(WAIT, stream.message()).await.unwrap();
    assert!(
        next.unwrap().unwrap().result,
        "the stream pushes the change"
    );
    // The same queue on 16-GPU workers: the wide job takes 2 (8 GPUs left on each), the
    // big one 1, the ten small ones fill what the wide job left: 3.
    let gpu16 = shape(&[("partition", "gpu"), ("gpusPerNode", "16")]);
    wait_workers(&mut s, &gpu16, 3).await;
    // The other partition's workers see nothing.
    let cpu = shape(&[("partition", "cpu"), ("cpusPerNode", "32")]);
    assert!(!is_active(&mut s, &cpu).await);

    let m = scrape(metrics_addr).await;
    let g = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("no {k} in {m:?}"))
    };
    assert_eq!(g("tandem_partition_jobs_pending{partition=\"gpu\"}"), 13.0);
    assert_eq!(g("tandem_partition_jobs_hold{partition=\"gpu\"}"), 1.0);
    assert_eq!(
        g("tandem_partition_jobs_gpus_pending{partition=\"gpu\"}"),
        16.0 + 10.0 + 16.0 + 8.0
    );
    assert_eq!(
        g("tandem_partition_jobs_nodes_pending{partition=\"gpu\"}"),
        13.0 + 1.0
    );
    assert_eq!(g("tandem_partition_jobs_pending{partition=\"cpu\"}"), 0.0);
    assert_eq!(g("tandem_jobs_submitted_total"), 13.0);
    assert_eq!(g("tandem_nodes"), 0.0);
    assert!(g("tandem_schedule_cycle_seconds_count") >= 1.0);
    assert!(g("tandem_user_fairshare{account=\"root\",user=\"alice\"}") > 0.0);

    // Cancel all but the wide job; two workers join and run it: nothing is pending, and
    // the two busy workers keep the set at 2 and active.
    let all: Vec<u64> = (wide + 1..wide + 13).collect();
    jobs.cancel(v1::CancelRequest {
        jobs: all
            .iter()
            .map(|id| v1::JobRef {
                job_id: *id,
                array_tasks: String::new(),
            })
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_workers(&mut s, &gpu8(), 2).await;
    let mut w1 = gpu_worker(&c, "gpu-1").await;
    let mut w2 = gpu_worker(&c, "gpu-2").await;
    assert_eq!(w1.expect_launch().await.job_id, wide);
    // Running on both workers, nothing pending: still 2 (busy), still active.
    let m = scrape_until(metrics_addr, "tandem_nodes_alloc", 2.0).await;
    assert_eq!(m["tandem_partition_jobs_running{partition=\"gpu\"}"], 1.0);
    assert_eq!(m["tandem_partition_jobs_pending{partition=\"gpu\"}"], 0.0);
    assert_eq!(workers(&mut s, &gpu8()).await, 2);
    assert!(is_active(&mut s, &gpu8()).await);

    // The job ends: idle workers, nothing pending -> zero and inactive (scale to zero).
    w1.end(wide, 0).await;
    w2.confirm_gone(wide).await;
    wait_workers(&mut s, &gpu8(), 0).await;
    assert!(!is_active(&mut s, &gpu8()).await);
    let last = tokio::time::timeout(WAIT, stream.message()).await.unwrap();
    assert!(
        !last.unwrap().unwrap().result,
        "the stream pushes inactivity"
    );
    let m = scrape_until(metrics_addr, "tandem_nodes_idle", 2.0).await;
    assert_eq!(m["tandem_partition_nodes_idle{partition=\"gpu\"}"], 2.0);
    assert_eq!(m["tandem_nodes_batch"], 2.0);
    drop(w2);
    c.stop().await;
}

#[test]
fn the_checker_rejects_malformed_exposition() {
    let ok = "# TYPE a gauge\na{p=\"x\"} 1\n# EOF\n";
    assert_eq!(parse_openmetrics(ok)["a{p=\"x\"}"], 1.0);
    for bad in [
        "# TYPE a gauge\na 1\n",             // no EOF
        "b 1\n# EOF\n",                      // no TYPE
        "# TYPE a gauge\na{p=x} 1\n# EOF\n", // unquoted label
        "# TYPE a gauge\na one\n# EOF\n",    // not a number
        "# TYPE a counter\na 1\n# EOF\n",    // counter without _total
    ] {
        assert!(
            std::panic::catch_unwind(|| parse_openmetrics(bad)).is_err(),
            "{bad:?}"
        );
    }
}
