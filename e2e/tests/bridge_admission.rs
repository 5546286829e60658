//! The bridge's admission webhook end to end on the harness: the API server calls the real
//! `tandem-bridge webhook` over HTTPS through a Service reference, trusting only the
//! `caBundle` that `tandem-bridge webhook-certs` wrote (as the chart's install hook does).
//!
//! Shows: the hook job is idempotent; a pod in a mapped namespace gets
//! `schedulerName: tandem` and the pool toleration, an account its namespace may charge is
//! accepted; invalid annotations, another team's account, a preset `spec.nodeName` and
//! resource claims are refused with a message naming the field, and nothing is created; an
//! annotation edit to another team's account is refused and changes nothing; pods outside
//! mapped namespaces are untouched unless labelled `tandem.dev/managed: "true"`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tandem_e2e::bridgekit::{Proc, spawn};
use tandem_e2e::testkit::{TestCluster, skip};

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

/// The webhook configurations as the chart ships them (`caBundle` left to the hook job),
/// for the Service `SERVICE` in `ns`.
fn configurations(ns: &str) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let hook = |path: &str, name: &str| {
        json!({
            "name": name,
            "clientConfig": {"service": {"namespace": ns, "name": SERVICE, "path": path, "port": 443}},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                       "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            // The bridge's own namespace and the system's are never judged: the webhook
            // must not block the pods that serve it.
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                "operator": "NotIn", "values": ["kube-system", "kube-node-lease", ns]}]},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        })
    };
    let m = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": HOOK},
        "webhooks": [hook("/mutate", "mutate.bridge.tandem.dev")],
    }))
    .unwrap();
    let v = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": HOOK},
        "webhooks": [hook("/validate", "validate.bridge.tandem.dev")],
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

/// Runs `tandem-bridge webhook-certs` for the test's configurations; panics if it fails.
/// (Awaited, not blocking: the API server it talks to runs on this test's runtime.)
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

fn data(s: &Secret, key: &str) -> Vec<u8> {
    s.data.as_ref().unwrap()[key].0.clone()
}

fn pod(name: &str, extra: Value) -> Pod {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "60"]}]}});
    tandem_e2e::testkit::merge_json(&mut p, extra);
    serde_json::from_value(p).unwrap()
}

/// The address in the webhook's "serving ... on ADDR" log line, once it is there.
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

/// A refused create: its message. Asserts the refusal came from our webhook.
async fn refused(pods: &Api<Pod>, p: &Pod) -> String {
    let name = p.metadata.name.clone().unwrap();
    match pods.create(&PostParams::default(), p).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403, "{e:?}");
            assert!(
                e.message
                    .contains("admission webhook \"mutate.bridge.tandem.dev\" denied the request"),
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

#[tokio::test]
async fn the_webhook_steers_managed_pods_and_refuses_bad_ones_at_admission() {
    let test = "the_webhook_steers_managed_pods_and_refuses_bad_ones_at_admission";
    let cluster = TestCluster::start().await.unwrap();
    let Some(server) = cluster.server() else {
        // A real API server cannot reach a webhook running on the test's machine.
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
        "spec": {"bridge": {"namespaces": [
            {"namespace": serving, "account": "inference", "allowedAccounts": ["research"]},
            {"namespace": "team-b", "account": "b"},
        ]}},
    }))
    .unwrap();
    tcs.create(&PostParams::default(), &tc).await.unwrap();

    // The chart: the configurations without a caBundle, then the hook job.
    let (m, v) = configurations(&sys);
    let ms: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let vs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    ms.create(&PostParams::default(), &m).await.unwrap();
    vs.create(&PostParams::default(), &v).await.unwrap();
    webhook_certs(&bin, &kubeconfig, &sys).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &sys);
    let secret = secrets.get(SECRET).await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca = data(&secret, "ca.crt");
    let m_bundles: Vec<Option<Vec<u8>>> = ms
        .get(HOOK)
        .await
        .unwrap()
        .webhooks
        .unwrap()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0))
        .collect();
    assert_eq!(m_bundles, vec![Some(ca.clone())]);
    let v_before = vs.get(HOOK).await.unwrap();
    assert_eq!(
        v_before.webhooks.as_ref().unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .map(|b| b.0.clone()),
        Some(ca.clone())
    );
    // Idempotent: a second run keeps the Secret and writes nothing.
    let m_rv = ms.get(HOOK).await.unwrap().metadata.resource_version;
    webhook_certs(&bin, &kubeconfig, &sys).await;
    let again = secrets.get(SECRET).await.unwrap();
    assert_eq!(data(&again, "tls.crt"), data(&secret, "tls.crt"));
    assert_eq!(
        again.metadata.resource_version,
        secret.metadata.resource_version
    );
    assert_eq!(ms.get(HOOK).await.unwrap().metadata.resource_version, m_rv);
    assert_eq!(
        vs.get(HOOK).await.unwrap().metadata.resource_version,
        v_before.metadata.resource_version
    );

    // The webhook, serving with the Secret's certificate as it would mount it.
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, data(&secret, "tls.crt")).unwrap();
    std::fs::write(&key, data(&secret, "tls.key")).unwrap();
    let log = dir.path().join("webhook.log");
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
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let port = listen_port(&log).await;
    let svcs: Api<Service> = Api::namespaced(client.clone(), &sys);
    let svc: Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE},
        "spec": {"ports": [{"port": 443, "targetPort": port}]}}))
    .unwrap();
    svcs.create(&PostParams::default(), &svc).await.unwrap();

    // Ready once it has read the namespace map: a dry run of a managed pod goes through.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &serving);
    let deadline = tokio::time::Instant::now() + T;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    loop {
        match pods.create(&dry, &pod("probe", json!({}))).await {
            Ok(_) => break,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "the webhook never admitted a pod: {e}; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A pod of the mapped namespace: scheduled by tandem, tolerating the pool.
    let web = pods
        .create(&PostParams::default(), &pod("web", json!({})))
        .await
        .unwrap();
    let stored = pods.get("web").await.unwrap();
    for p in [&web, &stored] {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.scheduler_name.as_deref(), Some("tandem"));
        let tol = spec.tolerations.as_ref().unwrap();
        assert!(
            tol.iter()
                .any(|t| t.key.as_deref() == Some("tandem.dev/pool")
                    && t.value.as_deref() == Some("pool")
                    && t.effect.as_deref() == Some("NoSchedule")),
            "{tol:?}"
        );
    }
    // An account the namespace was given is fine.
    pods.create(
        &PostParams::default(),
        &pod(
            "research",
            json!({"metadata": {"annotations": {"tandem.dev/account": "research"}}}),
        ),
    )
    .await
    .unwrap();

    // Bad input: refused with the field named, and nothing created.
    let m = refused(
        &pods,
        &pod(
            "bad-time",
            json!({"metadata": {"annotations": {"tandem.dev/time-limit": "soon"}}}),
        ),
    )
    .await;
    assert!(
        m.contains("annotation tandem.dev/time-limit: \"soon\" is not a Slurm time limit"),
        "{m}"
    );
    let m = refused(
        &pods,
        &pod(
            "typo",
            json!({"metadata": {"annotations": {"tandem.dev/partiton": "gpu"}}}),
        ),
    )
    .await;
    assert!(m.contains("unknown annotation tandem.dev/partiton"), "{m}");
    let m = refused(
        &pods,
        &pod(
            "spoof",
            json!({"metadata": {"annotations": {"tandem.dev/account": "b"}}}),
        ),
    )
    .await;
    assert!(
        m.contains(&format!(
            "metadata.annotations[tandem.dev/account]: namespace {serving} may not charge account b; it may charge inference, research"
        )),
        "{m}"
    );
    let m = refused(&pods, &pod("pinned", json!({"spec": {"nodeName": "k1"}}))).await;
    assert!(m.contains("spec.nodeName: preset to \"k1\""), "{m}");
    let m = refused(
        &pods,
        &pod(
            "claims",
            json!({"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}),
        ),
    )
    .await;
    assert!(m.contains("spec.resourceClaims:"), "{m}");

    // An edit to another team's account is refused; the pod keeps what it had.
    let e = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"tandem.dev/account": "b"}}})),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("may not charge account b"), "{e}");
    let now = pods.get("web").await.unwrap();
    assert!(
        !now.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("tandem.dev/account")
    );
    assert_eq!(
        now.metadata.resource_version,
        stored.metadata.resource_version
    );

    let mut names: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["research", "web"], "only the accepted pods exist");

    // Outside the map: untouched, unless the pod opts in (and then its namespace must be
    // mapped to an account).
    let others: Api<Pod> = Api::namespaced(client.clone(), &other);
    let plain = others
        .create(&PostParams::default(), &pod("plain", json!({})))
        .await
        .unwrap();
    let spec = plain.spec.unwrap();
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    assert!(
        !spec
            .tolerations
            .unwrap_or_default()
            .iter()
            .any(|t| t.key.as_deref() == Some("tandem.dev/pool"))
    );
    let m = refused(
        &others,
        &pod(
            "opted-in",
            json!({"metadata": {"labels": {"tandem.dev/managed": "true"}}}),
        ),
    )
    .await;
    assert!(
        m.contains(&format!("namespace {other} is not mapped to an account")),
        "{m}"
    );
}
