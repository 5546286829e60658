//! The operator against the in-repo API server: what it creates for a `TandemCluster`, and
//! how bad specs are refused. Runs the real reconcilers in-process.
//!
//! Not here yet (they need the harness's pod networking and volume mounts, which this
//! branch does not have): a ready cluster whose `sinfo` in a login pod lists the workers,
//! jobs, scale in/out and deletion with real workers.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use tandem_e2e::testkit::{TestCluster, skip, wait_for};
use tandem_operator::crd::{TandemCluster, WorkerSet};

const T: Duration = Duration::from_secs(30);
/// For waits on real processes starting and registering (a loaded 2-core machine).
const LONG: Duration = Duration::from_secs(120);

async fn install_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in tandem_operator::crd::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

#[tokio::test]
async fn a_cluster_gets_its_key_secret_service_store_config_and_controller_pod_and_bad_specs_are_refused()
 {
    let test = "a_cluster_gets_its_children";
    let cluster = TestCluster::start().await.unwrap();
    if cluster.is_real() {
        skip(
            test,
            "it installs cluster-scoped CRDs; run it against the in-repo server",
        );
        return;
    }
    let client = cluster.client();
    install_crds(&client).await;
    let ns = cluster.namespace("op").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let op = tokio::spawn(tandem_operator::reconcile::run_with_client(
        client.clone(),
        tandem_operator::reconcile::Args {
            namespace: Some(ns.clone()),
        },
        async move {
            let _ = stopped.await;
        },
    ));

    let clusters: Api<TandemCluster> = Api::namespaced(client.clone(), &ns);
    let tc: TandemCluster = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": "research"},
        "spec": {
            "partitions": [{"name": "gpu", "default": true}],
            "accounts": [{"name": "physics", "shares": 70, "users": [{"name": "alice"}]}],
        },
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &tc).await.unwrap();

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let key = wait_for(&secrets, "research-key", "to exist", T, |_| true)
        .await
        .unwrap();
    let key_hex = key
        .data
        .as_ref()
        .and_then(|d| d.get("cluster.key"))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_owned())
        .or_else(|| {
            key.string_data
                .as_ref()
                .and_then(|d| d.get("cluster.key"))
                .map(|s| s.trim().to_owned())
        })
        .expect("the key Secret holds cluster.key");
    assert_eq!(key_hex.len(), 64);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    wait_for(&services, "research-controller", "to exist", T, |_| true)
        .await
        .unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    wait_for(&pvcs, "research-state", "to exist", T, |_| true)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = wait_for(&cms, "research-config", "to exist", T, |_| true)
        .await
        .unwrap();
    let cm_text = serde_json::to_string(&cm).unwrap();
    assert!(
        !cm_text.contains(&key_hex),
        "the key never goes into a ConfigMap"
    );
    assert!(cm.data.as_ref().unwrap()["controller.toml"].contains("\"gpu\""));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = wait_for(&pods, "research-controller", "to exist", T, |_| true)
        .await
        .unwrap();
    assert!(
        !serde_json::to_string(&pod).unwrap().contains(&key_hex),
        "nor into a pod spec"
    );
    assert_eq!(
        pod.metadata.owner_references.as_ref().unwrap()[0].kind,
        "TandemCluster"
    );
    let sc = pod
        .spec
        .as_ref()
        .unwrap()
        .security_context
        .as_ref()
        .unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));

    // Bad input, refused by the schema with the field named.
    let sets: Api<WorkerSet> = Api::namespaced(client.clone(), &ns);
    let negative: WorkerSet = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet",
        "metadata": {"name": "neg"},
        "spec": {"clusterName": "research", "replicas": -1, "partitions": ["gpu"]},
    }))
    .unwrap();
    let err = sets
        .create(&PostParams::default(), &negative)
        .await
        .unwrap_err();
    assert!(format!("{err}").contains("replicas"), "{err}");
    let shares = json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": "bad-shares"},
        "spec": {"partitions": [{"name": "gpu"}], "accounts": [{"name": "a", "shares": "lots"}]},
    });
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::erase::<TandemCluster>(&()),
    );
    let err = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(shares).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(format!("{err}").contains("shares"), "{err}");

    // An unknown partition: the schema cannot know, the operator says so and creates nothing.
    let tpu: WorkerSet = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet",
        "metadata": {"name": "tpu"},
        "spec": {"clusterName": "research", "replicas": 2, "partitions": ["tpu"]},
    }))
    .unwrap();
    sets.create(&PostParams::default(), &tpu).await.unwrap();
    let ws = wait_for(&sets, "tpu", "to be Degraded", T, |w| {
        w.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Degraded"
                    && c.status == "True"
                    && c.message.contains("spec.partitions[0]")
            })
        })
    })
    .await
    .unwrap();
    assert!(
        ws.status
            .unwrap()
            .conditions
            .iter()
            .any(|c| c.message.contains("\"tpu\""))
    );
    let worker_pods = pods
        .list(&ListParams::default().labels("tandem.dev/workerset=tpu"))
        .await
        .unwrap();
    assert!(
        worker_pods.items.is_empty(),
        "nothing is created for an invalid set"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
}

/// Diagnostics for a failed wait: every pod's phase and its log tail.
async fn dump(client: &kube::Client, ns: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut out = String::new();
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let log = pods
            .logs(
                &name,
                &kube::api::LogParams {
                    tail_lines: Some(15),
                    ..Default::default()
                },
            )
            .await
            .unwrap_or_else(|e| format!("<no log: {e}>"));
        out.push_str(&format!(
            "--- {name} on {:?} {}:\n{log}\n",
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            tandem_e2e::testkit::phase(&p)
        ));
    }
    out
}

/// Runs a command in the login pod; panics with its output unless it succeeds.
async fn login(cluster: &TestCluster, ns: &str, argv: &[&str]) -> String {
    let out = cluster.exec(ns, "login-0", None, argv).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{argv:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[tokio::test]
async fn a_cluster_with_three_workers_runs_a_two_node_job_submitted_from_a_login_pod() {
    let test = "three_workers_two_node_job";
    let Some(cluster) = TestCluster::start_with_kubelet(test).await.unwrap() else {
        return;
    };
    if tandem_e2e::testkit::tandem_bin().is_none() {
        skip(
            test,
            "target/<profile>/tandem is not built (cargo build -p tandem-cli)",
        );
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        skip(
            test,
            "the pods' volume mounts need root (a mount namespace per container)",
        );
        return;
    }
    let client = cluster.client();
    install_crds(&client).await;
    let nodes = cluster.declare_nodes("kn", 3, "4", "8Gi", 0).await.unwrap();
    let ns = cluster.namespace("hpc").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let op = tokio::spawn(tandem_operator::reconcile::run_with_client(
        client.clone(),
        tandem_operator::reconcile::Args {
            namespace: Some(ns.clone()),
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let manifest = r#"
apiVersion: tandem.dev/v1alpha1
kind: TandemCluster
metadata: {name: hpc}
spec:
  partitions: [{name: batch, default: true}]
---
apiVersion: tandem.dev/v1alpha1
kind: WorkerSet
metadata: {name: cpu}
spec: {clusterName: hpc, replicas: 3, partitions: [batch], cpus: 2, memory: 2G}
---
apiVersion: tandem.dev/v1alpha1
kind: LoginSet
metadata: {name: login}
spec: {clusterName: hpc, replicas: 1}
"#;
    tandem_e2e::testkit::create_all(
        &client,
        &ns,
        &tandem_e2e::testkit::objects_from_yaml(manifest).unwrap(),
    )
    .await
    .unwrap();
    let sets: Api<WorkerSet> = Api::namespaced(client.clone(), &ns);
    let ready = wait_for(&sets, "cpu", "to have 3 ready workers", LONG, |w| {
        w.status.as_ref().is_some_and(|s| s.ready_replicas == 3)
    })
    .await;
    if let Err(e) = ready {
        panic!("{e}\n{}", dump(&client, &ns).await);
    }
    let logins: Api<tandem_operator::crd::LoginSet> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = wait_for(&logins, "login", "to be ready", LONG, |l| {
        l.status.as_ref().is_some_and(|s| s.ready_replicas == 1)
    })
    .await
    {
        panic!("{e}\n{}", dump(&client, &ns).await);
    }

    // sinfo in the login pod: the three workers, named after their Kubernetes nodes.
    let sinfo = login(&cluster, &ns, &["sinfo", "-N", "-h", "-o", "%N %t"]).await;
    eprintln!("sinfo in the login pod:\n{sinfo}");
    let mut listed: Vec<&str> = sinfo
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    listed.sort_unstable();
    listed.dedup();
    assert_eq!(
        listed,
        nodes.iter().map(String::as_str).collect::<Vec<_>>(),
        "{sinfo}"
    );

    // A two-node job from the login pod runs, and sacct shows it.
    let id = login(
        &cluster,
        &ns,
        &[
            "sbatch",
            "--parsable",
            "-N",
            "2",
            "--wrap",
            "echo two nodes",
        ],
    )
    .await
    .trim()
    .to_owned();
    assert!(
        id.parse::<u64>().is_ok(),
        "sbatch --parsable prints the job id: {id:?}"
    );
    let began = std::time::Instant::now();
    let last = loop {
        let sacct = login(
            &cluster,
            &ns,
            &["sacct", "-j", &id, "-n", "-X", "-o", "JobID,State,NNodes"],
        )
        .await;
        if sacct.contains("COMPLETED") || began.elapsed() > LONG {
            break sacct;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        last.contains("COMPLETED"),
        "sacct: {last}\n{}",
        dump(&client, &ns).await
    );
    assert!(
        last.split_whitespace().any(|w| w == "2"),
        "two nodes: {last}"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), op).await;
}
