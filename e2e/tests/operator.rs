//! The operator against the in-repo API server, its reconcilers running in-process.
//!
//! Without pods running: what it creates for a `TandemCluster`, and how the schema and the
//! operator refuse bad specs.
//!
//! With the process kubelet running the real controller, worker and login pods (the image is
//! `target/<profile>/`, so `cargo build --workspace --bins` first; root, for the pods' mount
//! namespaces), each on Kubernetes nodes `kn-0`, `kn-1`, ... and driven from a login pod as
//! a user would (`sbatch`, `sinfo`, `sacct` through the harness's `kubectl exec`):
//! - a 3-worker set becomes a cluster whose `sinfo` lists its nodes; a 2-node job runs;
//! - scale-in while a job runs: the set's and the cluster's node counts follow the job within
//!   the status refresh period, with no spec change; the idle worker goes at once, the busy
//!   victim is drained and its pod deleted only once its job ended (Events `VictimChosen`,
//!   `DrainStarted`);
//! - scale to zero, then a pending job makes the KEDA external scaler (asked through the
//!   controller Service's `scaler` port, as KEDA asks) report demand, and scaling back
//!   through the scale subresource runs the job;
//! - deleting a worker set removes its pods and its nodes before its finalizer goes;
//! - pool nodes in batch mode (`NoSchedule` and `NoExecute` pool taints) get workers whose
//!   template tolerates only `NoSchedule`: the operator adds the pool toleration;
//! - a running cluster and worker set made invalid: `Degraded` naming the field and an
//!   `InvalidSpec` Event, and nothing running is touched.
//!
//! Every wait is on a condition (an object's state, or a command's output polled) with a
//! generous timeout, and prints the pods' logs when it fails.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_e2e::testkit::{TestCluster, skip, wait_for, wait_for_deletion};
use tandem_net::net::ClientSecurity;
use tandem_operator::crd::{LoginSet, TandemCluster, WorkerSet, WorkerSetStatus};
use tandem_operator::labels::{DRAIN_FOR, WORKER_SET};
use tandem_proto::externalscaler::external_scaler_client::ExternalScalerClient;
use tandem_proto::externalscaler::{GetMetricsRequest, ScaledObjectRef};

const T: Duration = Duration::from_secs(30);
/// The operator's status refresh period here (`--status-refresh-seconds`): short, so a test
/// can tell a refresh from a pass some other change triggered.
const REFRESH: Duration = Duration::from_secs(5);
/// For waits on real processes starting and registering (a loaded 2-core machine).
const LONG: Duration = Duration::from_secs(120);

type Operator = tokio::task::JoinHandle<anyhow::Result<()>>;

/// The operator's reconcilers in this process, watching namespace `ns`, until the sender is
/// used or dropped.
fn spawn_operator(client: &kube::Client, ns: &str) -> (tokio::sync::oneshot::Sender<()>, Operator) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let op = tokio::spawn(tandem_operator::reconcile::run_with_client(
        client.clone(),
        tandem_operator::reconcile::Args {
            namespace: Some(ns.to_owned()),
            status_refresh_seconds: REFRESH.as_secs(),
        },
        async move {
            let _ = stopped.await;
        },
    ));
    (stop, op)
}

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
    let (stop, op) = spawn_operator(&client, &ns);

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
        .expect("the key Secret holds cluster.key (the API server returns stringData as data)");
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
        let containers: Vec<String> = p
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().map(|c| c.name.clone()))
            .collect();
        out.push_str(&format!(
            "--- {name} on {:?} {}:\n",
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            tandem_e2e::testkit::phase(&p)
        ));
        for c in containers {
            let log = pods
                .logs(
                    &name,
                    &kube::api::LogParams {
                        container: Some(c.clone()),
                        tail_lines: Some(15),
                        ..Default::default()
                    },
                )
                .await
                .unwrap_or_else(|e| format!("<no log: {e}>"));
            out.push_str(&format!("[{c}]\n{log}\n"));
        }
    }
    out
}

/// One test's namespace on a cluster with the process kubelet and nodes `kn-0`, `kn-1`, ...,
/// and the operator watching that namespace, in-process.
struct Harness {
    cluster: TestCluster,
    client: kube::Client,
    ns: String,
    nodes: Vec<String>,
    stop: tokio::sync::oneshot::Sender<()>,
    op: Operator,
}

impl Harness {
    /// `None` (after a SKIP line) where the pods cannot run: a real cluster, no `tandem`
    /// binary built, not root.
    async fn start(test: &str, nodes: usize, cpu: &str) -> Option<Harness> {
        let cluster = TestCluster::start_with_kubelet(test).await.unwrap()?;
        if tandem_e2e::testkit::tandem_bin().is_none() {
            skip(
                test,
                "target/<profile>/tandem is not built (cargo build -p tandem-cli)",
            );
            return None;
        }
        if !nix::unistd::geteuid().is_root() {
            skip(
                test,
                "the pods' volume mounts need root (a mount namespace per container)",
            );
            return None;
        }
        let client = cluster.client();
        install_crds(&client).await;
        let nodes = cluster
            .declare_nodes("kn", nodes, cpu, "8Gi", 0)
            .await
            .unwrap();
        let ns = cluster.namespace("hpc").await.unwrap();
        let (stop, op) = spawn_operator(&client, &ns);
        Some(Harness {
            cluster,
            client,
            ns,
            nodes,
            stop,
            op,
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn apply(&self, manifest: &str) {
        tandem_e2e::testkit::create_all(
            &self.client,
            &self.ns,
            &tandem_e2e::testkit::objects_from_yaml(manifest).unwrap(),
        )
        .await
        .unwrap();
    }

    /// Panics with `msg` and every pod's log tail.
    async fn fail(&self, msg: impl std::fmt::Display) -> ! {
        panic!("{msg}\n{}", dump(&self.client, &self.ns).await)
    }

    async fn wait_set(&self, name: &str, what: &str, cond: impl Fn(&WorkerSetStatus) -> bool) {
        self.wait_set_within(name, what, LONG, cond).await
    }

    async fn wait_set_within(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        cond: impl Fn(&WorkerSetStatus) -> bool,
    ) {
        let sets: Api<WorkerSet> = self.api();
        if let Err(e) = wait_for(&sets, name, what, within, |w| {
            w.status.as_ref().is_some_and(&cond)
        })
        .await
        {
            self.fail(e).await;
        }
    }

    /// Waits until the set has exactly `n` pods, all with a registered, ready worker.
    async fn workers_ready(&self, set: &str, n: i32) {
        self.wait_set(set, &format!("to have {n} ready workers"), |s| {
            s.replicas == n && s.ready_replicas == n
        })
        .await;
    }

    /// `CLUSTER_AND_LOGIN` and a worker set `cpu` of `replicas` 2-CPU workers (`extra`:
    /// more of its spec, as `, key: value` flow YAML), all running, registered and reachable
    /// from the login pod.
    async fn cluster_with_workers(&self, replicas: i32, extra: &str) {
        self.apply(CLUSTER_AND_LOGIN).await;
        self.apply(&format!(
            "{{apiVersion: tandem.dev/v1alpha1, kind: WorkerSet, metadata: {{name: cpu}},
              spec: {{clusterName: hpc, replicas: {replicas}, partitions: [batch], cpus: 2,
                      memory: 2G{extra}}}}}"
        ))
        .await;
        self.workers_ready("cpu", replicas).await;
        self.login_ready().await;
    }

    async fn login_ready(&self) {
        let logins: Api<LoginSet> = self.api();
        if let Err(e) = wait_for(&logins, "login", "to be ready", LONG, |l| {
            l.status.as_ref().is_some_and(|s| s.ready_replicas == 1)
        })
        .await
        {
            self.fail(e).await;
        }
    }

    /// Runs a command in the login pod; panics with its output unless it succeeds.
    async fn login(&self, argv: &[&str]) -> String {
        let out = self
            .cluster
            .exec(&self.ns, "login-0", None, argv)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            self.fail(format!(
                "{argv:?} failed: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            ))
            .await;
        }
        text
    }

    /// Runs `argv` in the login pod every half second until its output satisfies `done`.
    async fn poll_login(&self, argv: &[&str], what: &str, done: impl Fn(&str) -> bool) -> String {
        let began = std::time::Instant::now();
        loop {
            let out = self.login(argv).await;
            if done(&out) {
                return out;
            }
            if began.elapsed() > LONG {
                self.fail(format!(
                    "timed out after {LONG:?} waiting for {argv:?} to show {what}; last output:\n{out}"
                ))
                .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `sinfo` in the login pod until `done` holds for its nodes and their compact states.
    async fn sinfo_until(
        &self,
        what: &str,
        done: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let out = self
            .poll_login(&["sinfo", "-N", "-h", "-o", "%N %t"], what, |o| {
                done(&node_states(o))
            })
            .await;
        node_states(&out)
    }

    async fn sbatch(&self, args: &[&str]) -> String {
        let mut argv = vec!["sbatch", "--parsable"];
        argv.extend_from_slice(args);
        let id = self.login(&argv).await.trim().to_owned();
        assert!(
            id.parse::<u64>().is_ok(),
            "sbatch --parsable prints the job id: {id:?}"
        );
        id
    }

    /// Polls `squeue` until the job is in `state` (`PENDING`, `RUNNING`).
    async fn job_in(&self, id: &str, state: &str) {
        self.poll_login(&["squeue", "-h", "-j", id, "-o", "%T"], state, |o| {
            o.trim() == state
        })
        .await;
    }

    /// Polls `sacct` until the job is COMPLETED; returns its line.
    async fn completed(&self, id: &str) -> String {
        self.poll_login(
            &["sacct", "-j", id, "-n", "-X", "-o", "JobID,State,NNodes"],
            "COMPLETED",
            |o| o.contains("COMPLETED"),
        )
        .await
    }

    async fn worker_pods(&self, set: &str) -> Vec<Pod> {
        let pods: Api<Pod> = self.api();
        pods.list(&ListParams::default().labels(&format!("{WORKER_SET}={set}")))
            .await
            .unwrap()
            .items
    }

    /// The (reason, message, count) of every Event about object `kind`/`name`.
    async fn events(&self, kind: &str, name: &str) -> Vec<(String, String, i32)> {
        let events: Api<Event> = self.api();
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
            })
            .map(|e| {
                let count = e
                    .series
                    .as_ref()
                    .and_then(|s| s.count)
                    .or(e.count)
                    .unwrap_or(1);
                (
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                    count,
                )
            })
            .collect()
    }

    /// Waits until an Event about `kind`/`name` has `reason`; returns them all.
    async fn wait_event(&self, kind: &str, name: &str, reason: &str) -> Vec<(String, String, i32)> {
        let began = std::time::Instant::now();
        loop {
            let events = self.events(kind, name).await;
            if events.iter().any(|e| e.0 == reason) {
                return events;
            }
            if began.elapsed() > LONG {
                self.fail(format!(
                    "no {reason} Event about {kind} {name} after {LONG:?}; its Events: {events:?}"
                ))
                .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn scale(&self, set: &str, replicas: i64) {
        let sets: Api<WorkerSet> = self.api();
        sets.patch_scale(
            set,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
    }

    /// Asks the cluster's KEDA external scaler about `r` as KEDA does: over the controller
    /// Service's `scaler` port at its cluster IP, with TLS verified against the cluster CA
    /// (`<tc>-ca`, what a `ScaledObject`'s `caCert` holds) when the operator made one.
    /// `(IsActive, GetMetrics)`, or why there is no answer (yet). A new connection each time:
    /// a controller restart (a reissued certificate) must not wedge the test.
    async fn ask_scaler(&self, tc: &str, r: &ScaledObjectRef) -> Result<(bool, i64), String> {
        let services: Api<Service> = self.api();
        let svc = services
            .get(&format!("{tc}-controller"))
            .await
            .map_err(|e| e.to_string())?;
        let spec = svc.spec.unwrap_or_default();
        let ip = spec.cluster_ip.ok_or("the Service has no cluster IP")?;
        let port = spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("scaler"))
            .map(|p| p.port)
            .ok_or("the Service has no port named scaler")?;
        let secrets: Api<Secret> = self.api();
        let ca = secrets
            .get_opt(&format!("{tc}-ca"))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|s| s.data?.get("ca.crt").map(|b| b.0.clone()));
        let (scheme, security) = match ca {
            Some(pem) => (
                "https",
                ClientSecurity::Tls(
                    tandem_net::tls::client_config_pem(&pem).map_err(|e| e.to_string())?,
                ),
            ),
            None => ("http", ClientSecurity::Plaintext),
        };
        let endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{ip}:{port}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10));
        let channel = tandem_net::net::connect(&endpoint, &security)
            .await
            .map_err(|e| format!("connecting {scheme}://{ip}:{port}: {e}"))?;
        let mut c = ExternalScalerClient::new(channel);
        let active = c
            .is_active(r.clone())
            .await
            .map_err(|e| format!("IsActive: {e}"))?
            .into_inner()
            .result;
        let m = c
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(r.clone()),
                metric_name: format!("tandem-workers-{}", r.name),
            })
            .await
            .map_err(|e| format!("GetMetrics: {e}"))?
            .into_inner();
        let value = m
            .metric_values
            .first()
            .map(|v| v.metric_value)
            .ok_or("GetMetrics returned no value")?;
        Ok((active, value))
    }

    /// Asks the scaler every half second until it answers `want` (IsActive, workers).
    async fn scaler_says(&self, tc: &str, r: &ScaledObjectRef, want: (bool, i64)) {
        let began = std::time::Instant::now();
        loop {
            let got = self.ask_scaler(tc, r).await;
            if got == Ok(want) {
                return;
            }
            if began.elapsed() > LONG {
                self.fail(format!(
                    "the KEDA scaler did not answer {want:?} (IsActive, workers) within {LONG:?}; last: {got:?}"
                ))
                .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.op).await;
    }
}

/// `sinfo -N -h -o "%N %t"` as node -> compact state (a node in two partitions shows twice).
fn node_states(sinfo: &str) -> BTreeMap<String, String> {
    sinfo
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// A folder jobs may read (every worker mounts it with [`gate_mount`]).
fn gate() -> tempfile::TempDir {
    let gate = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        gate.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    gate
}

/// A worker set's `template` (as `, template: ...` for [`Harness::cluster_with_workers`])
/// mounting `gate` at `/gate` in every worker: a job waits there for a file the test makes,
/// so nothing depends on timing.
fn gate_mount(gate: &tempfile::TempDir) -> String {
    format!(
        ", template: {{volumes: [{{name: gate, hostPath: {{path: '{}', type: Directory}}}}],
                       volumeMounts: [{{name: gate, mountPath: /gate}}]}}",
        gate.path().display()
    )
}

const CLUSTER_AND_LOGIN: &str = r#"
apiVersion: tandem.dev/v1alpha1
kind: TandemCluster
metadata: {name: hpc}
spec:
  partitions: [{name: batch, default: true}]
---
apiVersion: tandem.dev/v1alpha1
kind: LoginSet
metadata: {name: login}
spec: {clusterName: hpc, replicas: 1}
"#;

#[tokio::test]
async fn a_cluster_with_three_workers_runs_a_two_node_job_submitted_from_a_login_pod() {
    let Some(h) = Harness::start("three_workers_two_node_job", 3, "4").await else {
        return;
    };
    h.cluster_with_workers(3, "").await;

    // sinfo in the login pod: the three workers, named after their Kubernetes nodes.
    let sinfo = h.login(&["sinfo", "-N", "-h", "-o", "%N %t"]).await;
    eprintln!("sinfo in the login pod:\n{sinfo}");
    let listed: Vec<String> = node_states(&sinfo).into_keys().collect();
    assert_eq!(listed, h.nodes, "{sinfo}");

    // A two-node job from the login pod runs, and sacct shows it.
    let id = h.sbatch(&["-N", "2", "--wrap", "echo two nodes"]).await;
    let last = h.completed(&id).await;
    assert!(
        last.split_whitespace().any(|w| w == "2"),
        "two nodes: {last}"
    );

    // srun from the login pod reaches two workers' step services at their pod IPs and
    // verifies each as its node: the certificates the operator issued into each pod's
    // Secret name the node alone, and no worker pod holds the CA key.
    let out = h
        .login(&["srun", "-N", "2", "-l", "sh", "-c", "echo stepped"])
        .await;
    assert_eq!(out.matches("stepped").count(), 2, "{out}");
    let secrets: Api<Secret> = h.api();
    for pod in h.worker_pods("cpu").await {
        let spec = pod.spec.unwrap_or_default();
        let node = spec.node_name.clone().unwrap_or_default();
        let volumes = serde_json::to_string(&spec.volumes).unwrap();
        assert!(!volumes.contains("ca.key"), "{volumes}");
        let secret = secrets.get(&format!("cpu-{node}-step-tls")).await.unwrap();
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        let cert = &secret.data.unwrap()["tls.crt"].0;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tls.crt");
        std::fs::write(&path, cert).unwrap();
        tandem_net::tls::check_certificate_name(&path, &node).unwrap();
        let pod_ip = pod.status.and_then(|s| s.pod_ip).unwrap_or_default();
        assert!(
            pod_ip.parse::<std::net::IpAddr>().is_ok(),
            "{node}: {pod_ip:?}"
        );
        assert!(
            tandem_net::tls::check_certificate_name(&path, &pod_ip).is_err(),
            "the certificate of {node} names its pod IP {pod_ip}"
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn scaling_in_while_a_job_runs_removes_the_idle_worker_at_once_and_the_busy_one_after_its_job()
 {
    let Some(h) = Harness::start("scale_in_while_a_job_runs", 3, "2").await else {
        return;
    };
    // The job waits for a file the test creates: a hostPath every worker mounts.
    let gate = gate();
    let extra = format!(
        ", scaleIn: {{drainDeadlineSeconds: 600}}{}",
        gate_mount(&gate)
    );
    h.cluster_with_workers(3, &extra).await;

    // A two-node job holds two of the three workers until the test opens the gate.
    let id = h
        .sbatch(&[
            "-N",
            "2",
            "--wrap",
            "while [ ! -e /gate/go ]; do sleep 0.2; done; echo released",
        ])
        .await;
    h.job_in(&id, "RUNNING").await;
    let before = h
        .sinfo_until("two busy nodes", |s| {
            s.len() == 3 && s.values().filter(|t| *t != "idle").count() == 2
        })
        .await;
    let idle = before
        .iter()
        .find(|(_, t)| *t == "idle")
        .map(|(n, _)| n.clone())
        .unwrap();
    eprintln!("before scale-in: {before:?}");
    // The job changed no Kubernetes object: the set's and the cluster's node columns follow
    // the controller within the refresh period all the same (slack for a loaded machine).
    let sets: Api<WorkerSet> = h.api();
    let spec_before = sets.get("cpu").await.unwrap().metadata.generation;
    h.wait_set_within(
        "cpu",
        "to count the job's two nodes as allocated",
        REFRESH * 4,
        |s| s.allocated == 2 && s.idle == 1,
    )
    .await;
    let clusters: Api<TandemCluster> = h.api();
    if let Err(e) = wait_for(
        &clusters,
        "hpc",
        "to count the job's two nodes as busy",
        REFRESH * 4,
        |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.nodes.allocated + s.nodes.mixed == 2 && s.nodes.idle == 1)
        },
    )
    .await
    {
        h.fail(e).await;
    }
    assert_eq!(
        sets.get("cpu").await.unwrap().metadata.generation,
        spec_before,
        "no spec change brought the refresh"
    );

    // Down to one: the idle worker and one busy worker must go.
    h.scale("cpu", 1).await;
    let pods: Api<Pod> = h.api();
    let idle_pod = tandem_operator::render::worker_pod_name("cpu", &idle);
    if let Err(e) = wait_for_deletion(&pods, &idle_pod, LONG).await {
        h.fail(e).await;
    }
    let during = h
        .sinfo_until("the idle node gone and one busy node draining", |s| {
            !s.contains_key(&idle)
                && s.len() == 2
                && s.values().filter(|t| *t == "drng").count() == 1
        })
        .await;
    eprintln!("idle worker gone, busy victim draining: {during:?}");
    let victim = during
        .iter()
        .find(|(_, t)| *t == "drng")
        .map(|(n, _)| n.clone())
        .unwrap();
    let keeper = during.keys().find(|n| **n != victim).unwrap().clone();
    assert!(
        during[&keeper] == "mix" || during[&keeper] == "alloc",
        "the worker that stays is not drained: {during:?}"
    );
    // The busy victim's pod stays while its job runs (the deadline is far off).
    h.job_in(&id, "RUNNING").await;
    let victim_pod = pods
        .get(&tandem_operator::render::worker_pod_name("cpu", &victim))
        .await
        .unwrap();
    assert!(
        victim_pod.metadata.deletion_timestamp.is_none(),
        "a busy worker is not deleted before its job ends"
    );
    assert_eq!(
        victim_pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DRAIN_FOR))
            .map(String::as_str),
        Some("scale-in")
    );
    h.wait_set("cpu", "to count the draining worker", |s| s.drain == 1)
        .await;

    // The job ends; then the victim's pod goes, and its node leaves the controller.
    std::fs::write(gate.path().join("go"), b"").unwrap();
    let done = h.completed(&id).await;
    assert!(done.split_whitespace().any(|w| w == "2"), "{done}");
    if let Err(e) = wait_for_deletion(&pods, &victim_pod.metadata.name.clone().unwrap(), LONG).await
    {
        h.fail(e).await;
    }
    let after = h
        .sinfo_until("only the worker that stays, idle", |s| {
            s.len() == 1 && s.get(&keeper).map(String::as_str) == Some("idle")
        })
        .await;
    eprintln!("after the job: {after:?}");
    h.workers_ready("cpu", 1).await;
    let left: Vec<String> = h
        .worker_pods("cpu")
        .await
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(left, vec![keeper]);

    // The decisions were told as Events, one per victim: each names its pod as `related`,
    // so the recorder does not fold the second victim's into the first's series.
    let events = h.wait_event("WorkerSet", "cpu", "WorkerDrained").await;
    let noted = |reason: &str, words: &[&str]| {
        events
            .iter()
            .any(|e| e.0 == reason && words.iter().all(|w| e.1.contains(w)))
    };
    assert!(noted("VictimChosen", &[&idle, "idle"]), "{events:?}");
    assert!(
        noted("VictimChosen", &[&victim, "running job"]),
        "both victims were chosen: {events:?}"
    );
    assert!(noted("DrainStarted", &["scale-in"]), "{events:?}");
    assert!(
        noted("DrainStarted", &[&victim]),
        "the busy victim's drain was told: {events:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_set_scaled_to_zero_comes_back_when_the_keda_scaler_reports_a_pending_job() {
    let Some(h) = Harness::start("scale_to_zero_and_back", 1, "2").await else {
        return;
    };
    h.cluster_with_workers(1, "").await;
    // What a ScaledObject for this set says in its trigger's metadata.
    let keda = ScaledObjectRef {
        name: "cpu".into(),
        namespace: h.ns.clone(),
        scaler_metadata: [
            ("partition", "batch"),
            ("cpusPerNode", "2"),
            ("workerSet", "cpu"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    };
    h.scaler_says("hpc", &keda, (false, 0)).await;

    // To zero: the pod and the node go.
    h.scale("cpu", 0).await;
    h.wait_set("cpu", "to have no workers", |s| {
        s.replicas == 0 && s.members.is_empty()
    })
    .await;
    assert!(h.worker_pods("cpu").await.is_empty());
    h.sinfo_until("no node", BTreeMap::is_empty).await;

    // A job waits; the scaler reports the one worker it needs.
    let id = h
        .sbatch(&["-N", "1", "--wrap", "echo back from zero"])
        .await;
    h.job_in(&id, "PENDING").await;
    h.scaler_says("hpc", &keda, (true, 1)).await;

    // As KEDA's HPA would: replicas from the metric, through the scale subresource.
    h.scale("cpu", 1).await;
    h.completed(&id).await;
    h.workers_ready("cpu", 1).await;
    // Nothing waits or runs any more: back to inactive.
    h.scaler_says("hpc", &keda, (false, 0)).await;
    h.stop().await;
}

/// Pool nodes in batch mode carry `tandem.dev/pool=<cluster>` as `NoSchedule` and
/// `NoExecute`. A worker set whose template tolerates only `NoSchedule` (what platform
/// teams wrote before) still gets its workers there: the operator counts those nodes and
/// renders every worker pod with the pool toleration of every effect, which the harness's
/// scheduler checks as kube-scheduler does.
#[tokio::test]
async fn workers_run_on_batch_mode_pool_nodes_whatever_their_template_tolerates() {
    let Some(h) = Harness::start("workers_on_batch_mode_pool_nodes", 3, "2").await else {
        return;
    };
    // kn-1 and kn-2 are pool nodes in batch mode; kn-0 (no taint) takes the controller and
    // the login pod.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(h.client.clone());
    for n in &h.nodes[1..] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {"labels": {"pool": "gpu", "tandem.dev/mode": "batch"}},
                    "spec": {"taints": [
                        {"key": "tandem.dev/pool", "value": "hpc", "effect": "NoSchedule"},
                        {"key": "tandem.dev/pool", "value": "hpc", "effect": "NoExecute"},
                    ]},
                })),
            )
            .await
            .unwrap();
    }
    h.cluster_with_workers(
        2,
        ", template: {nodeSelector: {pool: gpu}, tolerations: [{key: tandem.dev/pool, \
           operator: Exists, effect: NoSchedule}]}",
    )
    .await;
    let pods = h.worker_pods("cpu").await;
    let mut on: Vec<String> = pods
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    on.sort();
    assert_eq!(on, h.nodes[1..].to_vec(), "workers on the pool nodes");
    for p in &pods {
        let tols = p
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let first = serde_json::to_value(&tols[0]).unwrap();
        assert_eq!(
            first,
            json!({"key": "tandem.dev/pool", "operator": "Exists"}),
            "{tols:?}"
        );
    }
    // And they are the batch nodes: a two-node job runs on them.
    let id = h.sbatch(&["-N", "2", "--wrap", "hostname"]).await;
    let last = h.completed(&id).await;
    assert!(last.split_whitespace().any(|w| w == "2"), "{last}");
    h.stop().await;
}

#[tokio::test]
async fn deleting_a_worker_set_removes_its_pods_and_nodes_before_it_goes() {
    let Some(h) = Harness::start("delete_worker_set", 2, "2").await else {
        return;
    };
    h.cluster_with_workers(2, "").await;
    h.sinfo_until("both workers", |s| s.len() == 2).await;

    let sets: Api<WorkerSet> = h.api();
    sets.delete("cpu", &DeleteParams::default()).await.unwrap();
    if let Err(e) = wait_for_deletion(&sets, "cpu", LONG).await {
        h.fail(e).await;
    }
    // The finalizer went only after the cleanup: nothing is left to wait for.
    assert!(
        h.worker_pods("cpu").await.is_empty(),
        "the set's pods are gone"
    );
    let sinfo = h.login(&["sinfo", "-N", "-h", "-o", "%N %t"]).await;
    assert!(
        node_states(&sinfo).is_empty(),
        "the controller lists no node of the deleted set:\n{sinfo}"
    );
    h.stop().await;
}

#[tokio::test]
async fn invalid_specs_on_a_running_cluster_are_reported_and_touch_nothing_running() {
    let Some(h) = Harness::start("invalid_specs_touch_nothing", 1, "2").await else {
        return;
    };
    h.apply(
        "{apiVersion: tandem.dev/v1alpha1, kind: TandemCluster, metadata: {name: hpc},
          spec: {partitions: [{name: batch, default: true}],
                 accounts: [{name: physics, shares: 10}]}}",
    )
    .await;
    h.apply(
        "{apiVersion: tandem.dev/v1alpha1, kind: WorkerSet, metadata: {name: cpu},
          spec: {clusterName: hpc, replicas: 1, partitions: [batch], cpus: 2, memory: 2G}}",
    )
    .await;
    h.workers_ready("cpu", 1).await;
    let pods: Api<Pod> = h.api();
    let controller = pods.get("hpc-controller").await.unwrap();
    let worker = h.worker_pods("cpu").await.pop().unwrap();

    // An account whose parent is not declared. A server evaluating the CRD's CEL rules
    // refuses it naming the rule; this one does not, and the operator says so.
    let clusters: Api<TandemCluster> = h.api();
    let bad_parent = json!({"spec": {"accounts": [
        {"name": "physics", "shares": 10},
        {"name": "theory", "parent": "nope"},
    ]}});
    match clusters
        .patch("hpc", &PatchParams::default(), &Patch::Merge(&bad_parent))
        .await
    {
        Err(e) => assert!(format!("{e}").contains("parent"), "{e}"),
        Ok(_) => {
            if let Err(e) = wait_for(&clusters, "hpc", "to be Degraded", LONG, |t| {
                t.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Degraded"
                            && c.status == "True"
                            && c.reason == "InvalidSpec"
                            && c.message.contains("spec.accounts[1].parent")
                            && c.message.contains("\"nope\"")
                    })
                })
            })
            .await
            {
                h.fail(e).await;
            }
            let events = h.wait_event("TandemCluster", "hpc", "InvalidSpec").await;
            assert!(
                events
                    .iter()
                    .any(|e| e.0 == "InvalidSpec" && e.1.contains("spec.accounts[1].parent")),
                "{events:?}"
            );
        }
    }

    // A running set's partition that the cluster does not have.
    let sets: Api<WorkerSet> = h.api();
    sets.patch(
        "cpu",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"partitions": ["nope"]}})),
    )
    .await
    .unwrap();
    h.wait_set("cpu", "to be Degraded naming spec.partitions[0]", |s| {
        s.conditions.iter().any(|c| {
            c.type_ == "Degraded"
                && c.status == "True"
                && c.reason == "InvalidSpec"
                && c.message.contains("spec.partitions[0]")
        })
    })
    .await;
    let events = h.wait_event("WorkerSet", "cpu", "InvalidSpec").await;
    assert!(
        events
            .iter()
            .any(|e| e.0 == "InvalidSpec" && e.1.contains("\"nope\"")),
        "{events:?}"
    );

    // Nothing running was touched: the same pods, running, not draining.
    for before in [&controller, &worker] {
        let now = pods
            .get(&before.metadata.name.clone().unwrap())
            .await
            .unwrap();
        assert_eq!(
            uid(&now),
            uid(before),
            "{:?} was replaced",
            now.metadata.name
        );
        assert!(now.metadata.deletion_timestamp.is_none());
        assert_eq!(tandem_e2e::testkit::phase(&now), "Running");
        assert!(
            now.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key(DRAIN_FOR)),
            "{:?} is not drained",
            now.metadata.name
        );
    }
    // Fixed again, the set is ready with the worker it had all along.
    sets.patch(
        "cpu",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"partitions": ["batch"]}})),
    )
    .await
    .unwrap();
    h.wait_set("cpu", "to be ready and not Degraded", |s| {
        s.ready_replicas == 1
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.status == "False")
    })
    .await;
    assert_eq!(
        uid(&h.worker_pods("cpu").await.pop().unwrap()),
        uid(&worker)
    );
    h.stop().await;
}

#[tokio::test]
async fn a_lost_controller_pod_is_recreated_and_the_running_job_survives() {
    let Some(h) = Harness::start("controller_pod_lost", 2, "4").await else {
        return;
    };
    let gate = gate();
    h.cluster_with_workers(1, &gate_mount(&gate)).await;
    let id = h
        .sbatch(&[
            "--wrap",
            "while [ ! -e /gate/go ]; do sleep 0.2; done; echo survived",
        ])
        .await;
    h.job_in(&id, "RUNNING").await;

    // The controller pod is lost (deleted, as a node drain or an eviction would): the
    // operator makes a new one on the same store, and the worker reconnects to it through
    // the Service.
    let pods: Api<Pod> = h.api();
    let name = tandem_operator::render::controller_pod_name("hpc");
    let old = pods.get(&name).await.unwrap();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    let new = wait_for(&pods, &name, "a new controller pod, ready", LONG, |p| {
        uid(p) != uid(&old) && ready(p)
    })
    .await;
    if let Err(e) = new {
        h.fail(e).await;
    }

    // The job kept running through it, and ends as it would have.
    h.job_in(&id, "RUNNING").await;
    std::fs::write(gate.path().join("go"), b"").unwrap();
    let done = h.completed(&id).await;
    eprintln!("after the controller's replacement: {done}");
    // Told as it happened: the first start and the replacement (one Event series).
    let created: i32 = h
        .events("TandemCluster", "hpc")
        .await
        .into_iter()
        .filter(|e| e.0 == "ControllerPodCreated")
        .map(|e| e.2)
        .sum();
    assert!(created >= 2, "controller pod creations told: {created}");
    h.stop().await;
}
