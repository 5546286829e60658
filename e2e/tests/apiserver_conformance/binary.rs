//! The `kube-sim` process: its kubeconfig loads unchanged in `kube`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::test]
async fn kube_sim_writes_a_kubeconfig_that_kube_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&path)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let kc = super::eventually(
        "the kubeconfig to be written",
        Duration::from_secs(10),
        || {
            let path = path.clone();
            async move { Kubeconfig::read_from(&path).ok() }
        },
    )
    .await;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert!(cfg.cluster_url.to_string().starts_with("http://127.0.0.1:"));
    let client = kube::Client::try_from(cfg).unwrap();
    let nss: Api<Namespace> = Api::all(client);
    let n = nss.list(&ListParams::default()).await.unwrap();
    assert!(
        n.items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("default"))
    );
    child.start_kill().unwrap();
    let _ = child.wait().await;
}
