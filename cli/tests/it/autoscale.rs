//! The real `tandem controller` process with `--scaler-listen` and `--metrics-listen`, jobs
//! submitted with the real `sbatch`, asked as KEDA asks (a gRPC `ExternalScaler` client with
//! no Tandem credential) and scraped over HTTP: the flags, the listeners and the demand
//! numbers from the binary users run.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tandem_proto::externalscaler::external_scaler_client::ExternalScalerClient;
use tandem_proto::externalscaler::{GetMetricsRequest, ScaledObjectRef};
use tonic::transport::Channel;

const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The controller process; SIGTERM and a wait on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.0.wait();
    }
}

fn gpu8() -> ScaledObjectRef {
    ScaledObjectRef {
        name: "h100".into(),
        namespace: "tandem".into(),
        scaler_metadata: [
            ("partition", "gpu"),
            ("gpusPerNode", "8"),
            ("cpusPerNode", "64"),
            ("workerSet", "h100"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    }
}

async fn workers(s: &mut ExternalScalerClient<Channel>) -> i64 {
    s.get_metrics(GetMetricsRequest {
        scaled_object_ref: Some(gpu8()),
        metric_name: "tandem-workers-h100".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .metric_values[0]
        .metric_value
}

async fn wait_workers(s: &mut ExternalScalerClient<Channel>, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = workers(s).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{got} workers, want {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn scrape(addr: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_binary_serves_the_keda_scaler_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // `tandem controller` writes the key before it creates the state directory (reported
    // to the lead); `tandem up` makes the directory first, as this does.
    std::fs::create_dir_all(&state).unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[[partition]]\nname = \"gpu\"\ndefault = true\n[[partition]]\nname = \"cpu\"\n",
    )
    .unwrap();
    let (grpc, scaler, metrics) = (free_addr(), free_addr(), free_addr());
    let log = std::fs::File::create(dir.path().join("controller.log")).unwrap();
    let _daemon = Daemon(
        Command::new(TANDEM)
            .args(["controller", "--state-dir"])
            .arg(&state)
            .arg("--config")
            .arg(&config)
            .args(["--listen", &grpc.to_string()])
            .args(["--scaler-listen", &scaler.to_string()])
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--sched-interval", "200ms"])
            // This test is about the scaler's numbers; TLS is tested in security.rs.
            .arg("--insecure-plaintext")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let mut s = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(c) = ExternalScalerClient::connect(format!("http://{scaler}")).await {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "scaler did not come up: {}",
                std::fs::read_to_string(dir.path().join("controller.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // No work: inactive (scaled to zero stays there).
    assert!(!s.is_active(gpu8()).await.unwrap().into_inner().result);
    assert_eq!(workers(&mut s).await, 0);

    let sbatch = |args: &[&str]| {
        let out = Command::new(TANDEM)
            .arg("sbatch")
            .args(args)
            .env("HOME", dir.path())
            .env("TANDEM_CONTROLLER", format!("http://{grpc}"))
            .env("TANDEM_KEY_FILE", state.join("cluster.key"))
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sbatch {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A 2-node x 8-GPU job and three 4-GPU jobs: 2 + 2 workers of 8 GPUs.
    sbatch(&[
        "-p",
        "gpu",
        "-N",
        "2",
        "--gpus-per-node=8",
        "--wrap",
        "true",
    ]);
    for _ in 0..3 {
        sbatch(&["-p", "gpu", "--gpus-per-node=4", "--wrap", "true"]);
    }
    wait_workers(&mut s, 4).await;
    assert!(s.is_active(gpu8()).await.unwrap().into_inner().result);
    let text = scrape(metrics);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("tandem_partition_jobs_pending{partition=\"gpu\"} 4\n"),
        "{text}"
    );
    assert!(
        text.contains("tandem_partition_jobs_gpus_pending{partition=\"gpu\"} 28\n"),
        "{text}"
    );
    assert!(text.contains("tandem_jobs_submitted_total 4\n"), "{text}");
}
