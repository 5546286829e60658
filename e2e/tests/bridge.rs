//! The bridge end to end on the harness: the real `tandem controller`, real `tandem worker`
//! processes named after the harness's Kubernetes nodes (as the operator names them), the
//! real `tandem-bridge`, and an inference Deployment with `schedulerName: tandem`.
//!
//! Shows: pods are bound by the bridge to nodes the controller allocated (kube mode), several
//! small pods share one node up to its GPUs, a batch job waits while the pool serves pods and
//! runs once the Deployment scales to zero, invalid annotations leave a pod `Unschedulable`
//! with the reason, `squeue` lists the bridged groups as `namespace/owner`, and the pool
//! nodes carry the pool taint and a `tandem.dev/mode` label that follows the controller
//! (`kube` under pods, `batch` again once a batch job took the node, with a `ModeChanged`
//! Event).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_e2e::testkit::{TestCluster, tandem_bin, wait_for};

const T: Duration = Duration::from_secs(60);

/// A child process killed (with its output kept in `dir`) when the test ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(bin: &Path, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Proc {
    let out = std::fs::File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    let mut c = Command::new(bin);
    c.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, v) in env {
        c.env(k, v);
    }
    Proc(
        c.spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display())),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn bridge_bin(tandem: &Path) -> PathBuf {
    tandem.with_file_name(format!("tandem-bridge{}", std::env::consts::EXE_SUFFIX))
}

/// Runs a CLI command against the controller; its stdout.
fn cli(tandem: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = Command::new(tandem);
    c.args(args).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "tandem {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + T;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_inference_deployment_and_batch_jobs_take_turns_on_one_pool() {
    let test = "an_inference_deployment_and_batch_jobs_take_turns_on_one_pool";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let Some(tandem) = tandem_bin() else {
        panic!("target/<profile>/tandem is missing: run `cargo build --workspace --bins` first");
    };
    let bridge = bridge_bin(&tandem);
    assert!(
        bridge.is_file(),
        "{} is missing: build the workspace's binaries",
        bridge.display()
    );
    let client = cluster.client();
    for n in ["k1", "k2"] {
        cluster.declare_node(n, "8", "16Gi", 2).await.unwrap();
    }

    // The batch side: a controller and one worker per Kubernetes node, named after it.
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let key = state.join("tandem.key");
    let addr = format!("127.0.0.1:{}", free_port());
    let url = format!("http://{addr}");
    let (state_s, key_s) = (state.to_str().unwrap(), key.to_str().unwrap());
    let _controller = spawn(
        &tandem,
        &[
            "controller",
            "--listen",
            &addr,
            "--state-dir",
            state_s,
            "--key-file",
            key_s,
            "--heartbeat-interval",
            "200ms",
            "--kill-wait",
            "1s",
            // Loopback only, as the flag requires; the TLS path has its own tests.
            "--insecure-plaintext",
        ],
        &dir.path().join("controller.log"),
        &[],
    );
    wait_until("the cluster key", || key.is_file()).await;
    let env = [
        ("TANDEM_CONTROLLER", url.as_str()),
        ("TANDEM_KEY_FILE", key_s),
    ];
    let mut workers = Vec::new();
    for n in ["k1", "k2"] {
        let spool = dir.path().join(format!("spool-{n}"));
        workers.push(spawn(
            &tandem,
            &[
                "worker",
                "--controller",
                &url,
                "--key-file",
                key_s,
                "--name",
                n,
                "--cpus",
                "8",
                "--mem",
                "16G",
                "--gpus",
                "2",
                "--state-dir",
                spool.to_str().unwrap(),
                "--insecure-plaintext",
            ],
            &dir.path().join(format!("worker-{n}.log")),
            &[],
        ));
    }
    wait_until("both workers in sinfo", || {
        let out = cli(&tandem, &env, &["sinfo", "-N", "-h", "-o", "%N %t"]);
        out.lines().filter(|l| l.ends_with("idle")).count() == 2
    })
    .await;

    // The namespace map lives in the TandemCluster; the bridge reads it from there.
    let ns = cluster.namespace("serving").await.unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in tandem_operator::crd::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let tcs: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource {
            group: "tandem.dev".into(),
            version: "v1alpha1".into(),
            api_version: "tandem.dev/v1alpha1".into(),
            kind: "TandemCluster".into(),
            plural: "tandemclusters".into(),
        },
    );
    let tc: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": "pool"},
        "spec": {"bridge": {"namespaces": [{"namespace": ns, "account": "root"}]}},
    }))
    .unwrap();
    tcs.create(&PostParams::default(), &tc).await.unwrap();
    let server = cluster.server().unwrap().url();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n\
             contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n\
             current-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let _bridge = spawn(
        &bridge,
        &[
            "run",
            "--controller",
            &url,
            "--key-file",
            key_s,
            "--cluster",
            "pool",
            "--cluster-namespace",
            &ns,
        ],
        &dir.path().join("bridge.log"),
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );

    // Three one-GPU replicas on two 2-GPU nodes: two share a node, all bound by the bridge.
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "schedulerName": "tandem",
                    "containers": [{"name": "serve", "image": "busybox",
                        "command": ["sh", "-c", "sleep 300"],
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "limits": {"nvidia.com/gpu": "1"}}}],
                },
            },
        },
    }))
    .unwrap();
    deploys.create(&PostParams::default(), &d).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = ListParams::default().labels("app=web");
    let deadline = tokio::time::Instant::now() + T;
    let running = loop {
        let list = pods.list(&lp).await.unwrap().items;
        let running: Vec<&Pod> = list
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        if running.len() == 3 {
            break list;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "3 running pods expected; bridge log:\n{}",
            std::fs::read_to_string(dir.path().join("bridge.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &running {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        *per_node.entry(node).or_default() += 1;
        let job = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("tandem.dev/job-id"));
        assert!(job.is_some(), "bound pods carry their job id");
    }
    assert_eq!(
        per_node
            .values()
            .copied()
            .collect::<Vec<_>>()
            .iter()
            .sum::<usize>(),
        3
    );
    assert!(per_node.values().all(|n| *n <= 2), "{per_node:?}");
    let q = cli(&tandem, &env, &["squeue", "-h", "-o", "%j %T"]);
    assert_eq!(
        q.lines()
            .filter(|l| l.starts_with(&format!("{ns}/web-")))
            .count(),
        3,
        "{q}"
    );
    let s = cli(&tandem, &env, &["sinfo", "-N", "-h", "-o", "%N %t"]);
    assert_eq!(s.lines().count(), 2, "{s}");
    // The time partition shows in Kubernetes: nodes hosting pods are labelled `kube` and
    // carry the pool taint; sinfo shows the same mode.
    let node_api: Api<Node> = Api::all(client.clone());
    for node in per_node.keys() {
        wait_for(
            &node_api,
            node,
            "tandem.dev/mode=kube and the pool taint",
            T,
            |n: &Node| mode_of(n) == Some("kube") && has_pool_taint(n),
        )
        .await
        .unwrap();
        let m = cli(
            &tandem,
            &env,
            &["sinfo", "-N", "-h", "-n", node, "-o", "%N %k"],
        );
        assert_eq!(m.trim(), format!("{node} kube"), "{m}");
    }

    // A pod with an invalid annotation waits, saying why.
    let bad: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "typo", "annotations": {"tandem.dev/partiton": "gpu"}},
        "spec": {"schedulerName": "tandem", "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &bad).await.unwrap();
    wait_for(
        &pods,
        "typo",
        "Unschedulable with the annotation named",
        T,
        |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                            && c.message
                                .as_deref()
                                .is_some_and(|m| m.contains("tandem.dev/partiton"))
                    })
                })
        },
    )
    .await
    .unwrap();

    // A batch job needing a whole node waits while both nodes serve pods, and runs once the
    // Deployment scales to zero and its placeholders end.
    let out = cli(
        &tandem,
        &env,
        &[
            "sbatch",
            "--parsable",
            "-N1",
            "--gpus-per-node=2",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    let batch = out.trim().to_owned();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let st = cli(&tandem, &env, &["squeue", "-h", "-j", &batch, "-o", "%T"]);
    assert_eq!(
        st.trim(),
        "PENDING",
        "the pool serves pods; the batch job must wait"
    );
    deploys
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    wait_until("the batch job to run once the pods are gone", || {
        let st = cli(
            &tandem,
            &env,
            &["sacct", "-X", "-n", "-j", &batch, "-o", "State"],
        );
        st.trim() == "COMPLETED"
    })
    .await;
    // The node the batch job ran on is back in `batch` mode, still tainted, with an Event
    // for the flip.
    let ran_on = cli(
        &tandem,
        &env,
        &["sacct", "-X", "-n", "-j", &batch, "-o", "NodeList%40"],
    )
    .trim()
    .to_owned();
    assert!(per_node.contains_key(&ran_on), "{ran_on:?} {per_node:?}");
    wait_for(
        &node_api,
        &ran_on,
        "tandem.dev/mode=batch and the pool taint",
        T,
        |n: &Node| mode_of(n) == Some("batch") && has_pool_taint(n),
    )
    .await
    .unwrap();
    let events: Api<KubeEvent> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let flips = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("ModeChanged")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&ran_on)
            })
            .count();
        if flips >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a ModeChanged Event on {ran_on}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn mode_of(n: &Node) -> Option<&str> {
    n.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("tandem.dev/mode"))
        .map(String::as_str)
}

fn has_pool_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == "tandem.dev/pool"
                    && t.value.as_deref() == Some("pool")
                    && t.effect == "NoSchedule"
            })
        })
}
