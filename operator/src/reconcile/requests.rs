//! Request-sequence tests: a reconciler (or the daemon) runs against a mock API server
//! (`tower_test::mock`, as kube-rs's own examples test) that checks every request's method
//! and path, in order, and answers it from a script; the controller is the fake
//! ([`crate::batch::fake`]).
//!
//! Every scenario returns what the mock saw, and [`all_requests`] runs them all: the RBAC
//! test in [`crate::rbac`] checks the chart grants each request made here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};
use tandem_net::tls::ca::ClusterCa;
use tokio::task::JoinHandle;
use tower_test::mock;

use super::*;
use crate::batch::fake::FakeBatch;
use crate::crd::{LoginSet, WorkerSet};
use crate::labels::FINALIZER;
use crate::{defaults, render};

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const NS: &str = "lab";
const TC: &str = "research";
const CLUSTER_IP: &str = "10.96.0.10";

/// A request as the mock saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
}

/// How the mock answers a request.
enum Reply {
    /// 404, as the API server says it.
    NotFound,
    /// A failure status (`code`).
    Fail(u16),
    /// The request's body, 201 (a create).
    Echo,
    /// The request's body with the Service's clusterIP set, 201.
    EchoService,
    /// This object, 200.
    Json(Value),
    /// The object an earlier create in the scenario made at this path, 200.
    Stored,
}

struct Expect {
    method: &'static str,
    path: String,
    reply: Reply,
}

fn expect(method: &'static str, path: impl Into<String>, reply: Reply) -> Expect {
    Expect {
        method,
        path: path.into(),
        reply,
    }
}

/// `/api/v1/namespaces/lab/<rest>` (the core group).
fn core(rest: &str) -> String {
    format!("/api/v1/namespaces/{NS}/{rest}")
}

/// `/apis/tandem.dev/v1alpha1/namespaces/lab/<rest>`.
fn tandem(rest: &str) -> String {
    format!("/apis/tandem.dev/v1alpha1/namespaces/{NS}/{rest}")
}

fn event() -> Expect {
    expect(
        "POST",
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        Reply::Echo,
    )
}

fn status(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{reason} (mock)"), "reason": reason, "code": code,
    })
}

fn response(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

async fn seen(req: Request<Body>) -> Seen {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// Answers requests by `script`, in order, until the client is gone; fails on a request
/// out of order or beyond the script, and on one the script has that never came.
async fn serve(mut handle: Handle, script: Vec<Expect>) -> Vec<Seen> {
    let mut stored: BTreeMap<String, Value> = BTreeMap::new();
    let mut out = Vec::new();
    let mut script = script.into_iter();
    while let Some((req, send)) = handle.next_request().await {
        let s = seen(req).await;
        let Some(e) = script.next() else {
            panic!(
                "request #{} beyond the script: {} {}",
                out.len(),
                s.method,
                s.path
            );
        };
        // A path ending in `*` stands for any name (one the client generates).
        let path_ok = match e.path.strip_suffix('*') {
            Some(prefix) => s.path.starts_with(prefix),
            None => s.path == e.path,
        };
        assert!(
            s.method == e.method && path_ok,
            "request #{}: {} {}, expected {} {}",
            out.len(),
            s.method,
            s.path,
            e.method,
            e.path
        );
        let (code, body) = match e.reply {
            Reply::NotFound => (404, status(404, "NotFound")),
            Reply::Fail(code) => (code, status(code, "Forbidden")),
            Reply::Echo => (201, s.body.clone()),
            Reply::EchoService => {
                let mut b = s.body.clone();
                b["spec"]["clusterIP"] = json!(CLUSTER_IP);
                (201, b)
            }
            Reply::Json(v) => (200, v),
            Reply::Stored => match stored.get(&s.path) {
                Some(v) => (200, v.clone()),
                None => panic!("nothing was created at {}", s.path),
            },
        };
        if s.method == "POST" && code < 300 {
            let name = s.body["metadata"]["name"].as_str().unwrap_or_default();
            stored.insert(format!("{}/{name}", s.path), body.clone());
        }
        send.send_response(response(code, &body));
        out.push(s);
    }
    let left: Vec<String> = script.map(|e| format!("{} {}", e.method, e.path)).collect();
    assert!(left.is_empty(), "requests never made: {left:?}");
    out
}

/// A context over the mock and the fake controller, with these pods and nodes in its stores.
struct World {
    ctx: Arc<Context>,
    fake: FakeBatch,
    server: JoinHandle<Vec<Seen>>,
}

impl World {
    fn new(script: Vec<Expect>, pods: Vec<Pod>, nodes: Vec<Node>) -> World {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let (pod_store, mut pod_writer) = reflector::store();
        for p in pods {
            pod_writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let (node_store, mut node_writer) = reflector::store();
        for n in nodes {
            node_writer.apply_watcher_event(&watcher::Event::Apply(n));
        }
        let reporter = Reporter {
            controller: crate::labels::REPORTER.into(),
            instance: None,
        };
        let fake = FakeBatch::default();
        let ctx = Arc::new(Context::with_connections(
            client.clone(),
            Recorder::new(client, reporter),
            pod_store,
            node_store,
            Duration::from_secs(30),
            crate::connections::Connections::new(fake.clone()),
        ));
        World {
            ctx,
            fake,
            server: tokio::spawn(serve(handle, script)),
        }
    }

    /// What the mock saw, once every client is gone.
    async fn finish(self) -> Vec<Seen> {
        drop(self.ctx);
        match tokio::time::timeout(Duration::from_secs(10), self.server).await {
            Ok(Ok(seen)) => seen,
            Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
            Err(_) => panic!("the mock still had a client after 10 s"),
        }
    }
}

fn cluster(status: Value) -> TandemCluster {
    serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "TandemCluster",
        "metadata": {"name": TC, "namespace": NS, "generation": 1, "uid": "tc-uid"},
        "spec": {"partitions": [{"name": "gpu", "default": true}]},
        "status": status,
    }))
    .unwrap()
}

fn worker_set(replicas: i32, finalizers: &[&str]) -> WorkerSet {
    serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "WorkerSet",
        "metadata": {"name": "gpu", "namespace": NS, "generation": 1, "uid": "ws-uid",
                     "resourceVersion": "7", "finalizers": finalizers},
        "spec": {"clusterName": TC, "replicas": replicas, "partitions": ["gpu"]},
    }))
    .unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

fn to_json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap()
}

/// The events the mock was asked to create, as (type, reason, note).
fn events(seen: &[Seen]) -> Vec<(String, String, String)> {
    seen.iter()
        .filter(|s| s.path.ends_with("/events") && s.method == "POST")
        .map(|s| {
            let f = |k: &str| s.body[k].as_str().unwrap_or_default().to_owned();
            (f("type"), f("reason"), f("note"))
        })
        .collect()
}

/// The kind and name of every object created, in order.
fn created(seen: &[Seen]) -> Vec<(String, String)> {
    seen.iter()
        .filter(|s| s.method == "POST" && !s.path.ends_with("/events"))
        .map(|s| {
            let kind = s.path.rsplit('/').next().unwrap_or_default().to_owned();
            let name = s.body["metadata"]["name"].as_str().unwrap_or_default();
            (kind, name.to_owned())
        })
        .collect()
}

/// The first passes of a cluster on an empty namespace, up to the Service create, whose
/// answer is `service`.
fn cluster_script_to_service(service: Reply) -> Vec<Expect> {
    vec![
        expect("GET", core(&format!("secrets/{TC}-key")), Reply::NotFound),
        expect("POST", core("secrets"), Reply::Echo),
        expect("GET", core(&format!("secrets/{TC}-ca")), Reply::NotFound),
        expect("POST", core("secrets"), Reply::Echo),
        expect(
            "GET",
            core(&format!("services/{TC}-controller")),
            Reply::NotFound,
        ),
        expect("POST", core("services"), service),
    ]
}

/// A TandemCluster on an empty namespace: its Secrets, Service, certificate, PVC,
/// ConfigMap and controller pod are made in that order, then its status is patched.
pub async fn cluster_on_an_empty_namespace() -> Vec<Seen> {
    let tc = cluster(json!(null));
    let mut script = cluster_script_to_service(Reply::EchoService);
    script.extend([
        expect(
            "GET",
            core(&format!("secrets/{TC}-controller-tls")),
            Reply::NotFound,
        ),
        expect("POST", core("secrets"), Reply::Echo),
        event(),
        expect(
            "GET",
            core(&format!("persistentvolumeclaims/{TC}-state")),
            Reply::NotFound,
        ),
        expect("POST", core("persistentvolumeclaims"), Reply::Echo),
        // The controller connection: the key and CA just made.
        expect("GET", core(&format!("secrets/{TC}-key")), Reply::Stored),
        expect("GET", core(&format!("secrets/{TC}-ca")), Reply::Stored),
        expect(
            "PATCH",
            core(&format!("configmaps/{TC}-config")),
            Reply::Echo,
        ),
        expect("POST", core("pods"), Reply::Echo),
        event(),
        expect(
            "PATCH",
            tandem(&format!("tandemclusters/{TC}/status")),
            Reply::Json(to_json(&tc)),
        ),
    ]);
    let w = World::new(script, vec![], vec![]);
    let r = reconcile_cluster(Arc::new(tc), w.ctx.clone()).await;
    // Not ready yet: looked at again soon.
    assert_eq!(r.unwrap(), Requeue::requeue(Duration::from_secs(5)));
    let endpoint = format!("https://{CLUSTER_IP}:{}", defaults::CONTROLLER_PORT);
    assert_eq!(
        w.fake.calls(),
        [format!("connect({endpoint})"), "ListJobs()".into()]
    );
    let seen = w.finish().await;
    let names = |kind: &str, name: &str| (kind.to_owned(), name.to_owned());
    assert_eq!(
        created(&seen),
        [
            names("secrets", &format!("{TC}-key")),
            names("secrets", &format!("{TC}-ca")),
            names("services", &render::service_name(TC)),
            names("secrets", &format!("{TC}-controller-tls")),
            names("persistentvolumeclaims", &render::pvc_name(TC)),
            names("pods", &render::controller_pod_name(TC)),
        ]
    );
    let reasons: Vec<String> = events(&seen).into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["CertificateIssued", "ControllerPodCreated"]);
    // The ConfigMap goes by server-side apply, forced, as the operator's field manager.
    let cm = seen
        .iter()
        .find(|s| s.path.contains("/configmaps/"))
        .unwrap();
    assert!(
        cm.query.contains("fieldManager=tandem-operator"),
        "{}",
        cm.query
    );
    assert!(cm.query.contains("force=true"), "{}", cm.query);
    let patch = &seen.last().unwrap().body["status"];
    assert_eq!(patch["controllerEndpoint"], json!(endpoint));
    assert_eq!(patch["partitions"], json!(["gpu"]));
    seen
}

/// A step whose API call fails stops the pass there, and a Warning Event names it. The
/// retried pass fails the same way: kube's recorder folds the repeat into a series of the
/// first Event (a patch of its count).
pub async fn a_failed_step_is_told_by_name() -> Vec<Seen> {
    let mut script = cluster_script_to_service(Reply::Fail(403));
    script.push(event());
    script.extend(cluster_script_to_service(Reply::Fail(403)));
    script.push(expect(
        "PATCH",
        format!("/apis/events.k8s.io/v1/namespaces/{NS}/events/*"),
        Reply::Echo,
    ));
    let w = World::new(script, vec![], vec![]);
    let tc = Arc::new(cluster(json!(null)));
    for _ in 0..2 {
        let r = reconcile_cluster(tc.clone(), w.ctx.clone()).await;
        assert!(
            matches!(
                r,
                Err(Error::Kube {
                    step: "create Service",
                    ..
                })
            ),
            "{r:?}"
        );
    }
    let seen = w.finish().await;
    assert_eq!(seen.last().unwrap().body["series"]["count"], json!(2));
    let evs = events(&seen);
    assert_eq!(evs.len(), 1, "{evs:?}");
    let (type_, reason, note) = &evs[0];
    assert_eq!((type_.as_str(), reason.as_str()), ("Warning", STEP_FAILED));
    assert!(
        note.starts_with("step service failed: Kubernetes API call create Service failed: "),
        "{note}"
    );
    assert!(note.contains("Forbidden"), "{note}");
    seen
}

/// The cluster's key and CA Secrets, as the operator made them.
fn cluster_secrets(tc: &TandemCluster) -> (Value, Value) {
    let key = render::key_secret(tc, &crate::secrets::hex(&[7u8; 32])).unwrap();
    let ca = ClusterCa::generate().unwrap();
    let ca = render::ca_secret(tc, ca.cert_pem(), ca.key_pem()).unwrap();
    (to_json(&key), to_json(&ca))
}

/// A WorkerSet of two on two free nodes: a step certificate, then a pod, for each node,
/// then the plan's Events, then the status.
pub async fn worker_set_scales_out() -> Vec<Seen> {
    let endpoint = format!("https://{CLUSTER_IP}:{}", defaults::CONTROLLER_PORT);
    let tc = cluster(json!({"controllerEndpoint": endpoint}));
    let ws = worker_set(2, &[FINALIZER]);
    let (key, ca) = cluster_secrets(&tc);
    let mut script = vec![
        expect(
            "GET",
            tandem(&format!("tandemclusters/{TC}")),
            Reply::Json(to_json(&tc)),
        ),
        expect("GET", core(&format!("secrets/{TC}-key")), Reply::Json(key)),
        expect(
            "GET",
            core(&format!("secrets/{TC}-ca")),
            Reply::Json(ca.clone()),
        ),
        // Read again for the new pods' step certificates.
        expect("GET", core(&format!("secrets/{TC}-ca")), Reply::Json(ca)),
    ];
    for _ in ["kn-a", "kn-b"] {
        script.push(expect("POST", core("secrets"), Reply::Echo));
        script.push(expect("POST", core("pods"), Reply::Echo));
    }
    script.push(event());
    script.push(expect(
        "PATCH",
        tandem("workersets/gpu/status"),
        Reply::Json(to_json(&ws)),
    ));
    let w = World::new(script, vec![], vec![node("kn-b"), node("kn-a")]);
    let r = reconcile_workerset(Arc::new(ws), w.ctx.clone()).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        w.fake.calls(),
        [format!("connect({endpoint})"), "ListNodes()".into()]
    );
    let seen = w.finish().await;
    let names = |kind: &str, name: String| (kind.to_owned(), name);
    assert_eq!(
        created(&seen),
        [
            names(
                "secrets",
                render::worker_step_tls_secret_name("gpu", "kn-a")
            ),
            names("pods", render::worker_pod_name("gpu", "kn-a")),
            names(
                "secrets",
                render::worker_step_tls_secret_name("gpu", "kn-b")
            ),
            names("pods", render::worker_pod_name("gpu", "kn-b")),
        ]
    );
    let reasons: Vec<String> = events(&seen).into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["ScaledOut"]);
    let patch = &seen.last().unwrap().body["status"];
    assert_eq!(patch["members"], json!(["kn-a", "kn-b"]));
    seen
}

/// A settled cluster whose objects came from an older operator: the Service gets its new
/// ports, the controller certificate (from another CA) is reissued in place, and the
/// controller pod, whose hash no longer matches, is restarted.
pub async fn cluster_from_an_older_operator() -> Vec<Seen> {
    let tc = cluster(json!(null));
    let (key, ca) = cluster_secrets(&tc);
    let mut svc = to_json(&render::service(&tc).unwrap());
    svc["spec"]["clusterIP"] = json!(CLUSTER_IP);
    let mut old_svc = svc.clone();
    old_svc["spec"]["ports"] = json!([{"name": "grpc", "port": defaults::CONTROLLER_PORT}]);
    let other = ClusterCa::generate().unwrap();
    let names = render::controller_cert_names(&render::service_name(TC), NS, Some(CLUSTER_IP));
    let (cert, cert_key) = other.issue(&names).unwrap();
    let tls =
        render::controller_tls_secret(&tc, &names, &cert, &cert_key, other.cert_pem()).unwrap();
    let mut pod = render::controller_pod(&tc, "old-config", "old-cert").unwrap();
    pod.metadata.namespace = Some(NS.into());
    let pvc = json!({"metadata": {"name": render::pvc_name(TC)}});
    let script = vec![
        expect(
            "GET",
            core(&format!("secrets/{TC}-key")),
            Reply::Json(key.clone()),
        ),
        expect(
            "GET",
            core(&format!("secrets/{TC}-ca")),
            Reply::Json(ca.clone()),
        ),
        expect(
            "GET",
            core(&format!("services/{TC}-controller")),
            Reply::Json(old_svc),
        ),
        expect(
            "PATCH",
            core(&format!("services/{TC}-controller")),
            Reply::Json(svc),
        ),
        expect(
            "GET",
            core(&format!("secrets/{TC}-controller-tls")),
            Reply::Json(to_json(&tls)),
        ),
        expect(
            "PATCH",
            core(&format!("secrets/{TC}-controller-tls")),
            Reply::Echo,
        ),
        event(),
        expect(
            "GET",
            core(&format!("persistentvolumeclaims/{TC}-state")),
            Reply::Json(pvc),
        ),
        expect("GET", core(&format!("secrets/{TC}-key")), Reply::Json(key)),
        expect("GET", core(&format!("secrets/{TC}-ca")), Reply::Json(ca)),
        expect(
            "PATCH",
            core(&format!("configmaps/{TC}-config")),
            Reply::Echo,
        ),
        event(),
        expect(
            "DELETE",
            core(&format!("pods/{TC}-controller")),
            Reply::Json(to_json(&pod)),
        ),
        expect(
            "PATCH",
            tandem(&format!("tandemclusters/{TC}/status")),
            Reply::Json(to_json(&tc)),
        ),
    ];
    let w = World::new(script, vec![pod.clone()], vec![]);
    let r = reconcile_cluster(Arc::new(tc), w.ctx.clone()).await;
    assert_eq!(r.unwrap(), Requeue::requeue(Duration::from_secs(5)));
    let seen = w.finish().await;
    let reasons: Vec<String> = events(&seen).into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["CertificateIssued", "ControllerRestart"]);
    assert_eq!(seen[3].body["spec"]["ports"], render::service_ports());
    seen
}

/// A WorkerSet whose running worker was made before pods carried the pool toleration:
/// the pod gets it in place, and the set, ready, just reports so.
pub async fn worker_set_tolerates_the_pool() -> Vec<Seen> {
    let endpoint = format!("https://{CLUSTER_IP}:{}", defaults::CONTROLLER_PORT);
    let tc = cluster(json!({"controllerEndpoint": endpoint}));
    let ws = worker_set(1, &[FINALIZER]);
    let (key, ca) = cluster_secrets(&tc);
    let mut pod = render::worker_pod(&ws, "kn-a", None).unwrap();
    pod.metadata.namespace = Some(NS.into());
    let spec = pod.spec.as_mut().unwrap();
    spec.node_name = Some("kn-a".into());
    spec.tolerations = None;
    assert!(!render::has_pool_toleration(&pod));
    pod.status = Some(serde_json::from_value(json!({"phase": "Running"})).unwrap());
    let pod_path = core(&format!("pods/{}", render::worker_pod_name("gpu", "kn-a")));
    let script = vec![
        expect(
            "GET",
            tandem(&format!("tandemclusters/{TC}")),
            Reply::Json(to_json(&tc)),
        ),
        expect("PATCH", pod_path, Reply::Json(to_json(&pod))),
        expect("GET", core(&format!("secrets/{TC}-key")), Reply::Json(key)),
        expect("GET", core(&format!("secrets/{TC}-ca")), Reply::Json(ca)),
        expect(
            "PATCH",
            tandem("workersets/gpu/status"),
            Reply::Json(to_json(&ws)),
        ),
    ];
    let w = World::new(script, vec![pod], vec![node("kn-a")]);
    w.fake.0.lock().unwrap().nodes = vec![crate::plan::BatchNode {
        name: "kn-a".into(),
        state: crate::plan::NodeState::Idle,
        drain: false,
        reason: String::new(),
        running_jobs: 0,
        busy_until: None,
        kube_mode: false,
    }];
    let r = reconcile_workerset(Arc::new(ws), w.ctx.clone()).await;
    assert!(r.is_ok(), "{r:?}");
    let seen = w.finish().await;
    let status = &seen[4].body["status"];
    assert_eq!(status["readyReplicas"], json!(1));
    assert_eq!(status["members"], json!(["kn-a"]));
    seen
}

/// A WorkerSet without the operator's finalizer gets it first, guarded by its
/// resourceVersion, and nothing else happens in that pass.
pub async fn worker_set_gets_its_finalizer() -> Vec<Seen> {
    let ws = worker_set(1, &[]);
    let script = vec![expect(
        "PATCH",
        tandem("workersets/gpu"),
        Reply::Json(to_json(&ws)),
    )];
    let w = World::new(script, vec![], vec![node("kn-a")]);
    let r = reconcile_workerset(Arc::new(ws), w.ctx.clone()).await;
    assert_eq!(r.unwrap(), Requeue::requeue(Duration::from_millis(100)));
    let seen = w.finish().await;
    assert_eq!(
        seen[0].body["metadata"],
        json!({"finalizers": [FINALIZER], "resourceVersion": "7"})
    );
    seen
}

/// A LoginSet whose cluster is not there yet: its pod is made anyway, and its status says
/// the cluster is missing.
pub async fn login_set_without_its_cluster() -> Vec<Seen> {
    let ls: LoginSet = serde_json::from_value(json!({
        "apiVersion": "tandem.dev/v1alpha1", "kind": "LoginSet",
        "metadata": {"name": "login", "namespace": NS, "generation": 1},
        "spec": {"clusterName": TC, "replicas": 1},
    }))
    .unwrap();
    let script = vec![
        expect(
            "GET",
            tandem(&format!("tandemclusters/{TC}")),
            Reply::NotFound,
        ),
        expect("POST", core("pods"), Reply::Echo),
        expect(
            "PATCH",
            tandem("loginsets/login/status"),
            Reply::Json(to_json(&ls)),
        ),
    ];
    let w = World::new(script, vec![], vec![]);
    let r = reconcile_loginset(Arc::new(ls), w.ctx.clone()).await;
    assert_eq!(r.unwrap(), Requeue::requeue(Duration::from_secs(2)));
    let seen = w.finish().await;
    let cond = &seen[2].body["status"]["conditions"][0];
    assert_eq!(
        cond["message"],
        json!(format!("TandemCluster {TC} not found"))
    );
    seen
}

/// The daemon watching one namespace: every watch it starts (a list, then a watch), held
/// open until each resource has one; then it shuts down.
pub async fn daemon_watches() -> Vec<Seen> {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let args = Args {
        namespace: Some(NS.into()),
        ..Args::default()
    };
    let daemon = tokio::spawn(run_with_client(client, args, async {
        let _ = stopped.await;
    }));
    let want = [
        tandem("tandemclusters"),
        tandem("workersets"),
        tandem("loginsets"),
        core("pods"),
        core("configmaps"),
        "/api/v1/nodes".to_owned(),
    ];
    let mut out: Vec<Seen> = Vec::new();
    let mut held = Vec::new();
    let watched = |out: &[Seen], path: &str| {
        out.iter()
            .any(|s| s.path == path && s.query.contains("watch=true"))
    };
    let serve = async {
        while !want.iter().all(|p| watched(&out, p)) {
            let Some((req, send)) = handle.next_request().await else {
                break;
            };
            let s = seen(req).await;
            assert_eq!(s.method, "GET", "{s:?}");
            if s.query.contains("watch=true") {
                held.push(send);
            } else {
                let list = json!({"apiVersion": "v1", "kind": "List",
                                  "metadata": {"resourceVersion": "1"}, "items": []});
                send.send_response(response(200, &list));
            }
            out.push(s);
        }
    };
    tokio::time::timeout(Duration::from_secs(20), serve)
        .await
        .expect("a watch for every resource");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), daemon)
        .await
        .expect("the daemon stops")
        .unwrap()
        .unwrap();
    drop(held);
    out
}

/// Every request of every scenario above.
pub async fn all_requests() -> Vec<Seen> {
    let mut all = cluster_on_an_empty_namespace().await;
    all.extend(a_failed_step_is_told_by_name().await);
    all.extend(cluster_from_an_older_operator().await);
    all.extend(worker_set_tolerates_the_pool().await);
    all.extend(worker_set_scales_out().await);
    all.extend(worker_set_gets_its_finalizer().await);
    all.extend(login_set_without_its_cluster().await);
    all.extend(daemon_watches().await);
    all
}

#[tokio::test]
async fn a_cluster_makes_its_children_in_order_on_an_empty_namespace() {
    cluster_on_an_empty_namespace().await;
}

#[tokio::test]
async fn a_failed_step_stops_the_pass_and_a_warning_names_it() {
    a_failed_step_is_told_by_name().await;
}

#[tokio::test]
async fn a_worker_set_scales_out_a_certificate_then_a_pod_per_node() {
    worker_set_scales_out().await;
}

#[tokio::test]
async fn a_cluster_from_an_older_operator_is_brought_up_to_date() {
    cluster_from_an_older_operator().await;
}

#[tokio::test]
async fn a_worker_set_adds_the_pool_toleration_to_an_older_pod() {
    worker_set_tolerates_the_pool().await;
}

#[tokio::test]
async fn a_worker_set_gets_its_finalizer_first() {
    worker_set_gets_its_finalizer().await;
}

#[tokio::test]
async fn a_login_set_without_its_cluster_still_makes_its_pods() {
    login_set_without_its_cluster().await;
}

#[tokio::test]
async fn the_daemon_watches_every_resource_in_its_namespace() {
    daemon_watches().await;
}

#[test]
fn step_names_are_unique_within_each_reconciler() {
    fn unique<P>(steps: &[Step<P>]) {
        let mut names: Vec<&str> = steps.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before);
    }
    unique(cluster::STEPS);
    unique(workerset::STEPS);
    unique(loginset::STEPS);
}
