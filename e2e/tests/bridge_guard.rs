//! Batch-mode pool nodes keep every other pod off (issue 29), end to end on the harness.
//!
//! Admission (the real `tandem-bridge webhook` behind a mutating entry for the mapped
//! namespace and the cluster-wide `/guard` entry, as the chart registers them): a pod that
//! presets `spec.nodeName` to a pool node is refused from an unmapped namespace; a pod that
//! tolerates the pool taint under the default scheduler is refused, at create and when an
//! update adds the toleration; an opted-out (`tandem.dev/managed: "false"`) pod of a mapped
//! namespace naming a pool node is refused; a bind onto a pool node by anyone but the
//! bridge's service account is refused (the harness admits `pods/binding` as a real server
//! does). Pods and binds that stay off the pool pass.
//!
//! Node taints (the real controller, workers and bridge): a pool node carries
//! `tandem.dev/pool=<cluster>:NoExecute` exactly while it is in `batch` mode, beside the
//! `NoSchedule` taint it always has.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Service};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_e2e::bridgekit::{BridgeEnv, Proc, Setup, deployment, running, scale, spawn};
use tandem_e2e::testkit::{TestCluster, skip, wait_for};

const T: Duration = Duration::from_secs(60);
const SERVICE: &str = "tandem-bridge-webhook";
const SECRET: &str = "tandem-bridge-webhook-tls";
const HOOK: &str = "tandem-bridge";

fn bridge_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let mut dir = exe.parent().unwrap().to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(format!("tandem-bridge{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --bins -p tandem-bridge` first",
        bin.display()
    );
    bin
}

/// The configurations as the chart renders them with `managedNamespaces: [mapped]`
/// (`caBundle` left to the hook job): the mutating entry for the mapped namespace, and the
/// guard for pods and bindings of every namespace but the system's.
fn configurations(
    ns: &str,
    mapped: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let service = |path: &str| json!({"service": {"namespace": ns, "name": SERVICE, "path": path, "port": 443}});
    let m = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": HOOK},
        "webhooks": [{
            "name": "mutate.bridge.tandem.dev",
            "clientConfig": service("/mutate"),
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                       "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                "operator": "In", "values": [mapped]}]},
            "failurePolicy": "Fail", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    }))
    .unwrap();
    let v = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": HOOK},
        "webhooks": [{
            "name": "guard.bridge.tandem.dev",
            "clientConfig": service("/guard"),
            "rules": [
                {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["pods"], "scope": "Namespaced"},
                {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                 "resources": ["pods/binding"], "scope": "Namespaced"},
            ],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                "operator": "NotIn", "values": ["kube-system", "kube-node-lease", "kube-public"]}]},
            "failurePolicy": "Fail", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "timeoutSeconds": 5,
        }],
    }))
    .unwrap();
    (m, v)
}

fn kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n\
             contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n\
             current-context: sim\nusers:\n- name: sim\n  user: {{}}\n"
        ),
    )
    .unwrap();
    path
}

async fn webhook_certs(bin: &Path, kubeconfig: &Path, ns: &str) {
    let out = tokio::process::Command::new(bin)
        .args([
            "webhook-certs",
            "--namespace",
            ns,
            "--secret",
            SECRET,
            "--service",
            SERVICE,
            "--mutating-webhook",
            HOOK,
            "--validating-webhook",
            HOOK,
        ])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "webhook-certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn listen_port(log: &Path) -> u16 {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("over TLS on ").nth(1) {
            let addr: std::net::SocketAddr = rest
                .split_whitespace()
                .next()
                .unwrap()
                .trim_end_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap();
            return addr.port();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the webhook never said where it serves; its log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod(name: &str, extra: Value) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}]}});
    tandem_e2e::testkit::merge_json(&mut p, extra);
    serde_json::from_value(p).unwrap()
}

/// A Node, a pool node in batch mode as the bridge marks one when `pool`.
fn node(name: &str, pool: bool) -> Node {
    let (labels, taints) = if pool {
        (
            json!({"tandem.dev/mode": "batch"}),
            json!([{"key": "tandem.dev/pool", "value": "pool", "effect": "NoSchedule"},
                   {"key": "tandem.dev/pool", "value": "pool", "effect": "NoExecute"}]),
        )
    } else {
        (json!({}), json!([]))
    };
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
    .unwrap()
}

/// A refused create: its message. Asserts a 403 from one of our webhooks and that nothing
/// was created.
async fn refused(pods: &Api<Pod>, p: &Pod) -> String {
    let name = p.metadata.name.clone().unwrap();
    match pods.create(&PostParams::default(), p).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{e:?}");
            assert!(
                e.message
                    .contains(".bridge.tandem.dev\" denied the request"),
                "{}",
                e.message
            );
            assert!(
                pods.get_opt(&name).await.unwrap().is_none(),
                "a refused pod {name} exists"
            );
            e.message
        }
        other => panic!("pod {name} was not refused: {other:?}"),
    }
}

async fn bind(pods: &Api<Pod>, name: &str, node: &str) -> Result<Value, kube::Error> {
    let b = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    pods.create_subresource::<_, Value>("binding", name, &PostParams::default(), &b)
        .await
}

#[tokio::test]
async fn admission_keeps_pods_tandem_does_not_schedule_off_pool_nodes() {
    let test = "admission_keeps_pods_tandem_does_not_schedule_off_pool_nodes";
    let cluster = TestCluster::start().await.unwrap();
    let Some(server) = cluster.server() else {
        return skip(
            test,
            "it needs the in-repo API server to reach a local webhook",
        );
    };
    let bin = bridge_bin();
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig(dir.path(), &server.url());

    let sys = cluster.namespace("tandem").await.unwrap();
    let serving = cluster.namespace("serving").await.unwrap();
    let other = cluster.namespace("other").await.unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in tandem_operator::crd::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let tcs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &sys,
        &kube::api::ApiResource {
            group: "tandem.dev".into(),
            version: "v1alpha1".into(),
            api_version: "tandem.dev/v1alpha1".into(),
            kind: "TandemCluster".into(),
            plural: "tandemclusters".into(),
        },
    );
    let tc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": "pool"},
        "spec": {"bridge": {"namespaces": [{"namespace": serving, "account": "inference"}]}},
    }))
    .unwrap();
    tcs.create(&PostParams::default(), &tc).await.unwrap();
    // A pool node in batch mode and a node outside the pool. Unique names: the harness's
    // Nodes are cluster-wide and other tests share the server.
    let suffix = &other[other.len().saturating_sub(6)..];
    let (b1, cpu) = (format!("b1-{suffix}"), format!("cpu-{suffix}"));
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node(&b1, true))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node(&cpu, false))
        .await
        .unwrap();

    let (m, v) = configurations(&sys, &serving);
    let ms: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let vs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    ms.create(&PostParams::default(), &m).await.unwrap();
    vs.create(&PostParams::default(), &v).await.unwrap();
    webhook_certs(&bin, &kubeconfig, &sys).await;
    let secret = Api::<Secret>::namespaced(client.clone(), &sys)
        .get(SECRET)
        .await
        .unwrap();
    let data = |k: &str| secret.data.as_ref().unwrap()[k].0.clone();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, data("tls.crt")).unwrap();
    std::fs::write(&key, data("tls.key")).unwrap();
    let log = dir.path().join("webhook.log");
    // The harness authenticates nobody (every request is `system:admin`), so this test's
    // client is neither the bridge nor the operator: the trusted names are the chart's.
    let binders = format!("system:serviceaccount:{sys}:tandem-bridge,system:kube-scheduler");
    let operators = format!("system:serviceaccount:{sys}:tandem-operator");
    let _webhook: Proc = spawn(
        &bin,
        &[
            "webhook",
            "--cluster",
            "pool",
            "--cluster-namespace",
            &sys,
            "--webhook-listen",
            "127.0.0.1:0",
            "--webhook-cert-file",
            cert.to_str().unwrap(),
            "--webhook-key-file",
            key.to_str().unwrap(),
        ],
        &log,
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("TANDEM_BRIDGE_GUARD_BINDERS", &binders),
            ("TANDEM_BRIDGE_GUARD_OPERATORS", &operators),
        ],
    );
    let port = listen_port(&log).await;
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE},
        "spec": {"ports": [{"port": 443, "targetPort": port}]}}))
    .unwrap();
    Api::<Service>::namespaced(client.clone(), &sys)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();

    // Ready once the Node list is read: a dry run naming the node outside the pool passes.
    let others: Api<Pod> = Api::namespaced(client.clone(), &other);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let p = pod("probe", json!({"spec": {"nodeName": cpu}}));
        match others.create(&dry, &p).await {
            Ok(_) => break,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "the guard never admitted a pod: {e}; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An unmapped namespace presetting a batch-mode pool node: refused.
    let m = refused(&others, &pod("pinned", json!({"spec": {"nodeName": b1}}))).await;
    assert!(
        m.contains(&format!("spec.nodeName: \"{b1}\" is a Tandem pool node")),
        "{m}"
    );
    // A pod tolerating the pool taint under the default scheduler: refused.
    let m = refused(
        &others,
        &pod(
            "tolerant",
            json!({"spec": {"tolerations": [
                {"key": "tandem.dev/pool", "operator": "Exists", "effect": "NoExecute"}]}}),
        ),
    )
    .await;
    assert!(
        m.contains("spec.tolerations[0]: tolerates the Tandem pool taint tandem.dev/pool"),
        "{m}"
    );
    // Tolerating everything is tolerating the pool.
    refused(
        &others,
        &pod(
            "wildcard",
            json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
        ),
    )
    .await;
    // A mapped namespace's opted-out pod naming the pool node: refused.
    let servings: Api<Pod> = Api::namespaced(client.clone(), &serving);
    let m = refused(
        &servings,
        &pod(
            "opted-out",
            json!({"metadata": {"labels": {"tandem.dev/managed": "false"}},
                   "spec": {"nodeName": b1}}),
        ),
    )
    .await;
    assert!(m.contains("is a Tandem pool node"), "{m}");

    // What stays off the pool passes: a pod on the other node, a plain pod, an opted-out
    // pod minding its own business.
    others
        .create(
            &PostParams::default(),
            &pod("elsewhere", json!({"spec": {"nodeName": cpu}})),
        )
        .await
        .unwrap();
    let plain = others
        .create(&PostParams::default(), &pod("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(
        plain.spec.unwrap().scheduler_name.as_deref(),
        Some("default-scheduler"),
        "an unmapped namespace's pod is not handed to Tandem"
    );
    servings
        .create(
            &PostParams::default(),
            &pod(
                "sidecar",
                json!({"metadata": {"labels": {"tandem.dev/managed": "false"}}}),
            ),
        )
        .await
        .unwrap();

    // The stand-in default scheduler bound the plain pod to the node outside the pool,
    // through the binding subresource: the guard let that bind through.
    let d = tokio::time::Instant::now() + T;
    while others
        .get("plain")
        .await
        .unwrap()
        .spec
        .unwrap()
        .node_name
        .as_deref()
        != Some(&cpu)
    {
        assert!(
            tokio::time::Instant::now() < d,
            "plain was never bound to {cpu}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A pod no scheduler takes (gated), for what follows.
    others
        .create(
            &PostParams::default(),
            &pod(
                "gated",
                json!({"spec": {"schedulingGates": [{"name": "test"}]}}),
            ),
        )
        .await
        .unwrap();
    // An update that adds the pool toleration: refused, the pod unchanged.
    let e = others
        .patch(
            "gated",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"tolerations": [
                {"key": "tandem.dev/pool", "operator": "Exists"}]}})),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("tolerates the Tandem pool taint"),
        "{e}"
    );
    assert!(
        others
            .get("gated")
            .await
            .unwrap()
            .spec
            .unwrap()
            .tolerations
            .unwrap_or_default()
            .iter()
            .all(|t| t.key.as_deref() != Some("tandem.dev/pool"))
    );

    // A bind onto the pool node by someone other than the bridge: refused, nothing bound.
    match bind(&others, "gated", &b1).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{e:?}");
            assert!(
                e.message.contains(&format!(
                    "target.name: \"{b1}\" is a Tandem pool node; only the tandem scheduler binds pods there (system:admin may not)"
                )),
                "{}",
                e.message
            );
        }
        other => panic!("the bind onto {b1} was not refused: {other:?}"),
    }
    assert_eq!(
        others.get("gated").await.unwrap().spec.unwrap().node_name,
        None
    );
}

fn has_taint(n: &Node, effect: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == "tandem.dev/pool"
                    && t.value.as_deref() == Some("pool")
                    && t.effect == effect
            })
        })
}

fn mode_of(n: &Node) -> Option<&str> {
    n.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("tandem.dev/mode"))
        .map(String::as_str)
}

#[tokio::test]
async fn a_pool_node_carries_no_execute_exactly_while_in_batch_mode() {
    let test = "a_pool_node_carries_no_execute_exactly_while_in_batch_mode";
    let cluster = TestCluster::start().await.unwrap();
    if !cluster.needs_process_kubelet(test) {
        return;
    }
    let client = cluster.client();
    let mut env = BridgeEnv::start(
        &cluster,
        Setup::new(tandem_operator::crd::all())
            .node("k1", 8, 16, 2)
            .namespace("serving", "root", json!({})),
    )
    .await;
    let ns = env.ns("serving").to_owned();
    let _bridge = env.spawn_bridge(&[]);
    let node_api: Api<Node> = Api::all(client.clone());

    // An idle pool node is a batch node: both taints.
    wait_for(
        &node_api,
        "k1",
        "tandem.dev/mode=batch with NoSchedule and NoExecute",
        T,
        |n: &Node| {
            mode_of(n) == Some("batch") && has_taint(n, "NoSchedule") && has_taint(n, "NoExecute")
        },
    )
    .await
    .unwrap();

    // A bridged pod takes it: kube mode, NoSchedule only (the pod tolerates just that).
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deploys
        .create(&PostParams::default(), &deployment("web", 1, 1))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let lp = kube::api::ListParams::default().labels("app=web");
    env.wait_pods(&pods, &lp, "1 running pod", |ps| {
        ps.len() == 1 && ps.iter().all(running)
    })
    .await;
    wait_for(
        &node_api,
        "k1",
        "tandem.dev/mode=kube with NoSchedule and without NoExecute",
        T,
        |n: &Node| {
            mode_of(n) == Some("kube") && has_taint(n, "NoSchedule") && !has_taint(n, "NoExecute")
        },
    )
    .await
    .unwrap();
    env.assert_mode("k1", "kube");

    // The pod goes and a batch job takes the node: NoExecute is back.
    scale(&deploys, "web", 0).await;
    let job = env.sbatch(&["-N1", "--gpus-per-node=2"], "sleep 1");
    env.wait_until("the batch job to complete", || {
        let st = env.cli(&["sacct", "-X", "-n", "-j", &job, "-o", "State"]);
        st.trim() == "COMPLETED"
    })
    .await;
    wait_for(
        &node_api,
        "k1",
        "tandem.dev/mode=batch with NoExecute again",
        T,
        |n: &Node| {
            mode_of(n) == Some("batch") && has_taint(n, "NoSchedule") && has_taint(n, "NoExecute")
        },
    )
    .await
    .unwrap();
}
