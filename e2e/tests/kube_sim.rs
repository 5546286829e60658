//! The `kube-sim` binary with its command-line nodes: pods run on them, and SIGTERM ends the
//! server cleanly together with every pod's processes.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tandem_e2e::testkit::{phase, wait_for};

const T: Duration = Duration::from_secs(30);

fn alive(pid: i32) -> bool {
    // Signal 0: does the process exist (a zombie counts as gone: it is not running).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

#[tokio::test]
async fn kube_sim_serves_its_nodes_and_sigterm_ends_every_pod() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let bin_dir = dir.path().join("image");
    std::fs::create_dir(&bin_dir).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kubeconfig)
        .args([
            "--node",
            "gpu-a:cpu=64,memory=256Gi,nvidia.com/gpu=8",
            "--node",
            "cpu-b:cpu=2",
            "--image",
        ])
        .arg(format!("example.org/tools:1={}", bin_dir.display()))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // It prints the kubeconfig's path once the server is up.
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(
        T,
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line),
    )
    .await
    .expect("kube-sim prints the kubeconfig path")
    .unwrap();
    assert_eq!(line.trim(), kubeconfig.display().to_string());
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let gpu = wait_for(&nodes, "gpu-a", "to be registered", T, |_| true)
        .await
        .unwrap();
    let alloc = gpu.status.unwrap().allocatable.unwrap();
    assert_eq!(alloc["nvidia.com/gpu"].0, "8");
    assert_eq!(alloc["cpu"].0, "64");
    wait_for(&nodes, "cpu-b", "to be registered", T, |_| true)
        .await
        .unwrap();

    // A pod naming no node lands through the stand-in scheduler, from a --image directory.
    std::fs::write(bin_dir.join("nap"), "#!/bin/sh\nexec sleep 300\n").unwrap();
    std::fs::set_permissions(
        bin_dir.join("nap"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "napper"},
        "spec": {"containers": [{"name": "c", "image": "example.org/tools:1", "command": ["nap"],
                                 "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let running = wait_for(&pods, "napper", "to run", T, |p| phase(p) == "Running")
        .await
        .unwrap();
    assert_eq!(
        running.spec.as_ref().unwrap().node_name.as_deref(),
        Some("gpu-a"),
        "only gpu-a has GPUs"
    );
    let pid: i32 = running.status.unwrap().container_statuses.unwrap()[0]
        .container_id
        .as_deref()
        .unwrap()
        .trim_start_matches("process://")
        .parse()
        .unwrap();
    assert!(alive(pid));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::time::timeout(T, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "kube-sim exits cleanly on SIGTERM: {status}"
    );
    let began = Instant::now();
    while alive(pid) && began.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(pid), "the pod's process ended with kube-sim");
}
