//! The process kubelet against the in-repo API server: a pod's life from binding to
//! removal, as a real kubelet drives it. Every test here needs the process kubelet, so
//! against a real cluster (`KUBECONFIG` set) each prints a SKIP line and returns.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ContainerStateTerminated, ContainerStatus, Event, Pod, PodCondition,
};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use tandem_e2e::testkit::{
    self, PodFixture, TestCluster, exit_code, phase, wait_for, wait_for_deletion, wait_for_log,
};

const WAIT: Duration = Duration::from_secs(20);

async fn cluster(test: &str) -> Option<(TestCluster, Api<Pod>)> {
    let cluster = TestCluster::start_with_kubelet(test).await.unwrap()?;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    Some((cluster, pods))
}

/// The usual stage: a kubelet cluster with one plain node, `node-a` (4 CPUs, 8 GiB, no GPUs).
async fn cluster_with_node_a(test: &str) -> Option<(TestCluster, Api<Pod>)> {
    let (cluster, pods) = cluster(test).await?;
    cluster.declare_node("node-a", "4", "8Gi", 0).await.unwrap();
    Some((cluster, pods))
}

async fn create(pods: &Api<Pod>, pod: PodFixture) {
    pods.create(&PostParams::default(), &pod.build())
        .await
        .unwrap();
}

/// Waits for the pod to reach `want` (Running, Succeeded, Failed) and returns it.
async fn wait_for_phase(pods: &Api<Pod>, name: &str, want: &str) -> Pod {
    wait_for(pods, name, &format!("to be {want}"), WAIT, |p| {
        phase(p) == want
    })
    .await
    .unwrap()
}

/// The pod's whole current log, read once.
async fn log(pods: &Api<Pod>, name: &str) -> String {
    pods.logs(name, &LogParams::default()).await.unwrap()
}

/// Deletes the pod with its own grace period and waits until the kubelet has removed it;
/// returns the last status written and how long the removal took.
async fn delete_and_time(pods: &Api<Pod>, name: &str) -> (Pod, Duration) {
    let began = Instant::now();
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    let last = wait_for_deletion(pods, name, WAIT).await.unwrap().unwrap();
    (last, began.elapsed())
}

fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn is_ready(pod: &Pod) -> bool {
    condition(pod, "Ready").is_some_and(|c| c.status == "True")
}

/// The status of the pod's first (here: only) container; panics when there is none yet.
fn first_container(pod: &Pod) -> &ContainerStatus {
    &pod.status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
}

/// How the first container's previous run ended.
fn last_terminated(status: &ContainerStatus) -> &ContainerStateTerminated {
    status
        .last_state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
}

/// The first container's waiting state, once the kubelet has reported one.
fn first_container_waiting(pod: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStateWaiting> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs[0].state.as_ref()?.waiting.clone())
}

#[tokio::test]
async fn failing_pod_reports_exit_code_and_logs_its_node_name() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("failing_pod_reports_exit_code_and_logs_its_node_name").await
    else {
        return;
    };
    let pod = PodFixture::new("echo-node")
        .node("node-a")
        .env_field("NODE", "spec.nodeName")
        .sh("echo $NODE; exit 3");
    create(&pods, pod).await;

    let done = wait_for_phase(&pods, "echo-node", "Failed").await;
    assert_eq!(exit_code(&done), Some(3));
    let status = first_container(&done);
    let terminated = status.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(terminated.reason.as_deref(), Some("Error"));
    assert!(terminated.started_at.is_some() && terminated.finished_at.is_some());
    let ready = condition(&done, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("PodCompleted"))
    );
    let ip: std::net::Ipv4Addr = done
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        tandem_e2e::net::POD_BLOCK.contains(ip),
        "{ip} is a pod IP of its own"
    );

    assert_eq!(log(&pods, "echo-node").await, "node-a\n");
}

#[tokio::test]
async fn running_pod_has_ready_conditions_and_downward_env() {
    let Some((cluster, pods)) =
        cluster_with_node_a("running_pod_has_ready_conditions_and_downward_env").await
    else {
        return;
    };
    let pod = PodFixture::new("envy")
        .node("node-a")
        .label("team", "ml")
        .env("GREETING", "hi")
        .env("SAID", "$(GREETING) there")
        .env_field("POD", "metadata.name")
        .env_field("NS", "metadata.namespace")
        .env_field("IP", "status.podIP")
        .env_field("TEAM", "metadata.labels['team']")
        .sh("echo \"$SAID $POD $NS $IP $TEAM\"; exec sleep 30");
    create(&pods, pod).await;

    let running = wait_for(&pods, "envy", "to be ready", WAIT, is_ready)
        .await
        .unwrap();
    assert_eq!(phase(&running), "Running");
    for type_ in ["Initialized", "ContainersReady", "PodScheduled"] {
        assert_eq!(
            condition(&running, type_).map(|c| c.status.as_str()),
            Some("True"),
            "{type_}"
        );
    }
    let cs = first_container(&running);
    assert!(
        cs.ready
            && cs
                .state
                .as_ref()
                .unwrap()
                .running
                .as_ref()
                .unwrap()
                .started_at
                .is_some()
    );
    let logs = wait_for_log(&pods, "envy", "\n", WAIT).await.unwrap();
    let ip = running.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert_eq!(logs, format!("hi there envy default {ip} ml\n"));

    // The kubelet told the story in events, as `kubectl describe pod` shows it.
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let about_envy = ListParams::default().fields("involvedObject.name=envy");
    let mut reasons = Vec::new();
    for _ in 0..50 {
        reasons = events
            .list(&about_envy)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        if reasons.iter().any(|r| r == "Started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for want in ["Pulled", "Created", "Started"] {
        assert!(
            reasons.iter().any(|r| r == want),
            "no {want} event among {reasons:?}"
        );
    }

    // A running pod costs the kubelet nothing: no status rewrites, no polling.
    let kubelet = cluster.kubelet_requests().unwrap();
    let quiet_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // (Node heartbeats every 10 s are expected; pod traffic is not.)
    let idle: Vec<_> = kubelet
        .since(quiet_from)
        .into_iter()
        .filter(|r| r.path.contains("/pods"))
        .collect();
    assert!(
        idle.is_empty(),
        "kubelet pod requests while the pod just ran: {idle:?}"
    );
}

/// A container that traps SIGTERM exits at once; one that ignores it is SIGKILLed when the
/// grace period ends. Either way the kubelet writes the final status, then removes the pod.
#[tokio::test]
async fn deletion_sends_sigterm_then_sigkill_after_the_grace_period() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("deletion_sends_sigterm_then_sigkill_after_the_grace_period").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("got-term");
    let trap = PodFixture::new("traps-term")
        .node("node-a")
        .grace(10)
        .env("MARK", mark.to_str().unwrap())
        .sh(
            "trap 'echo term > \"$MARK\"; exit 0' TERM; echo ready; while true; do sleep 0.1; done",
        );
    let ignore = PodFixture::new("ignores-term")
        .node("node-a")
        .grace(2)
        .sh("trap '' TERM; echo ready; while true; do sleep 0.1; done");
    create(&pods, trap).await;
    create(&pods, ignore).await;
    wait_for_log(&pods, "traps-term", "ready", WAIT)
        .await
        .unwrap();
    wait_for_log(&pods, "ignores-term", "ready", WAIT)
        .await
        .unwrap();

    let (last, took) = delete_and_time(&pods, "traps-term").await;
    assert!(
        took < Duration::from_secs(5),
        "a trapping pod ends well inside its 10 s grace, took {took:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&mark).unwrap(),
        "term\n",
        "the trap ran"
    );
    assert_eq!(exit_code(&last), Some(0));
    assert_eq!(phase(&last), "Succeeded");

    let (last, took) = delete_and_time(&pods, "ignores-term").await;
    assert!(
        took >= Duration::from_millis(1900),
        "SIGKILL came before the 2 s grace ended: {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "SIGKILL came long after the grace period: {took:?}"
    );
    assert_eq!(exit_code(&last), Some(137), "killed by SIGKILL");
    assert_eq!(phase(&last), "Failed");
}

#[tokio::test]
async fn gpu_request_beyond_free_allocatable_fails_with_out_of_nvidia_gpu() {
    let Some((cluster, pods)) =
        cluster("gpu_request_beyond_free_allocatable_fails_with_out_of_nvidia_gpu").await
    else {
        return;
    };
    cluster
        .declare_node("gpu-01", "8", "32Gi", 2)
        .await
        .unwrap();
    let holder = PodFixture::new("holder")
        .node("gpu-01")
        .gpus(2)
        .sh("exec sleep 30");
    create(&pods, holder).await;
    wait_for_phase(&pods, "holder", "Running").await;

    let late = PodFixture::new("late")
        .node("gpu-01")
        .gpus(1)
        .sh("echo should not run");
    create(&pods, late).await;
    let rejected = wait_for_phase(&pods, "late", "Failed").await;
    let status = rejected.status.as_ref().unwrap();
    assert_eq!(status.reason.as_deref(), Some("OutOfnvidia.com/gpu"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 2, capacity: 2"
        )
    );
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let events = events.list(&ListParams::default()).await.unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("OutOfnvidia.com/gpu")
                && e.involved_object.name.as_deref() == Some("late")),
        "a Warning event names the rejection"
    );

    // The GPUs come back when the holder goes.
    pods.delete(
        "holder",
        &DeleteParams {
            grace_period_seconds: Some(1),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    wait_for_deletion(&pods, "holder", WAIT).await.unwrap();
    let next = PodFixture::new("next").node("gpu-01").gpus(2).sh("exit 0");
    create(&pods, next).await;
    wait_for_phase(&pods, "next", "Succeeded").await;
}

#[tokio::test]
async fn on_failure_restarts_with_backoff_and_keeps_the_previous_log() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("on_failure_restarts_with_backoff_and_keeps_the_previous_log").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("n");
    let pod = PodFixture::new("flaky")
        .node("node-a")
        .restart("OnFailure")
        .env("F", counter.to_str().unwrap())
        .sh("n=$(cat \"$F\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$F\"; echo attempt $n; [ $n -ge 3 ]");
    create(&pods, pod).await;

    // Succeeds on its third try.
    let done = wait_for_phase(&pods, "flaky", "Succeeded").await;
    let cs = first_container(&done);
    assert_eq!(cs.restart_count, 2);
    assert_eq!(last_terminated(cs).exit_code, 1);
    assert_eq!(log(&pods, "flaky").await, "attempt 3\n");
    let previous = LogParams {
        previous: true,
        ..LogParams::default()
    };
    assert_eq!(pods.logs("flaky", &previous).await.unwrap(), "attempt 2\n");
}

#[tokio::test]
async fn unknown_image_waits_in_image_pull_back_off() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("unknown_image_waits_in_image_pull_back_off").await
    else {
        return;
    };
    let pod = PodFixture::new("nope")
        .node("node-a")
        .image("example.com/no-such-image:1")
        .sh("true");
    create(&pods, pod).await;
    let waiting = wait_for(&pods, "nope", "to back off pulling", WAIT, |p| {
        first_container_waiting(p).and_then(|w| w.reason).as_deref() == Some("ImagePullBackOff")
    })
    .await
    .unwrap();
    assert_eq!(phase(&waiting), "Pending");
    // Deleting a pod that never ran removes it promptly.
    pods.delete("nope", &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&pods, "nope", WAIT).await.unwrap();
}

#[tokio::test]
async fn declaring_a_node_registers_it_ready_with_a_lease() {
    let Some((cluster, _)) = cluster("declaring_a_node_registers_it_ready_with_a_lease").await
    else {
        return;
    };
    cluster
        .declare(
            tandem_e2e::kubelet::NodeSpec::new("gpu-07", "16", "64Gi", 8).label("pool", "train"),
        )
        .await
        .unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.client());
    let node = nodes.get("gpu-07").await.unwrap();
    let status = node.status.unwrap();
    assert_eq!(
        status.allocatable.as_ref().unwrap()["nvidia.com/gpu"].0,
        "8"
    );
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(node.metadata.labels.unwrap()["pool"], "train");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client(), "kube-node-lease");
    let lease = leases.get("gpu-07").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("gpu-07")
    );
    assert!(
        cluster.declare_node("gpu-07", "1", "1Gi", 0).await.is_err(),
        "a node is declared once"
    );
    let _ = testkit::tandem_bin(); // exercised by the image table; may be None before `cargo build --bins`
}

#[tokio::test]
async fn init_containers_run_first_and_yaml_manifests_create_pods() {
    let Some((cluster, pods)) =
        cluster_with_node_a("init_containers_run_first_and_yaml_manifests_create_pods").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("handoff");
    let manifest = format!(
        r#"
---
apiVersion: v1
kind: Pod
metadata:
  name: staged
spec:
  nodeName: node-a
  restartPolicy: Never
  initContainers:
  - name: prepare
    image: busybox:1.36
    command: ["sh", "-c", "echo prepared > {shared}"]
  containers:
  - name: main
    image: docker.io/library/busybox
    command: ["sh", "-c", "cat {shared}"]
"#,
        shared = shared.display()
    );
    let objects = testkit::objects_from_yaml(&manifest).unwrap();
    assert_eq!(objects.len(), 1, "the empty leading document is skipped");
    testkit::create_all(&cluster.client(), "default", &objects)
        .await
        .unwrap();
    let done = wait_for_phase(&pods, "staged", "Succeeded").await;
    let init = &done
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        init.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("Completed")
    );
    let main = LogParams {
        container: Some("main".into()),
        ..LogParams::default()
    };
    assert_eq!(pods.logs("staged", &main).await.unwrap(), "prepared\n");
}

#[tokio::test]
async fn always_restarts_even_after_success_and_stays_running() {
    let Some((cluster, pods)) =
        cluster_with_node_a("always_restarts_even_after_success_and_stays_running").await
    else {
        return;
    };
    let pod = PodFixture::new("loop")
        .node("node-a")
        .restart("Always")
        .sh("echo run; exit 0");
    create(&pods, pod).await;
    let restarted = wait_for(&pods, "loop", "to restart twice", WAIT, |p| {
        let cs = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        cs.is_some_and(|cs| cs[0].restart_count >= 2)
    })
    .await
    .unwrap();
    assert_eq!(
        phase(&restarted),
        "Running",
        "an Always pod never finishes on its own"
    );
    let last = last_terminated(first_container(&restarted));
    assert_eq!(last.reason.as_deref(), Some("Completed"));
    // Back-off keeps the kubelet's traffic low even for a pod that exits at once.
    let sent = cluster.kubelet_requests().unwrap().max_per_second();
    assert!(sent < 60, "kubelet sent {sent} requests in one second");
}

#[tokio::test]
async fn following_a_log_streams_lines_until_the_container_exits() {
    use futures::{AsyncBufReadExt, TryStreamExt};
    let Some((_cluster, pods)) =
        cluster_with_node_a("following_a_log_streams_lines_until_the_container_exits").await
    else {
        return;
    };
    let pod = PodFixture::new("ticker")
        .node("node-a")
        .sh("echo one; sleep 0.5; echo two; sleep 0.5; echo three");
    create(&pods, pod).await;
    wait_for_log(&pods, "ticker", "one", WAIT).await.unwrap();
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let began = Instant::now();
    let lines: Vec<String> = pods
        .log_stream("ticker", &follow)
        .await
        .unwrap()
        .lines()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(lines, ["one", "two", "three"]);
    assert!(
        began.elapsed() >= Duration::from_millis(400),
        "the stream waited for later lines"
    );
    let tail = LogParams {
        tail_lines: Some(1),
        ..LogParams::default()
    };
    assert_eq!(pods.logs("ticker", &tail).await.unwrap(), "three\n");
}

/// A missing ConfigMap holds the container in CreateContainerConfigError; once it exists,
/// the kubelet's next try starts the container with its values.
#[tokio::test]
async fn config_map_env_waits_for_the_config_map_then_runs() {
    let Some((cluster, pods)) =
        cluster_with_node_a("config_map_env_waits_for_the_config_map_then_runs").await
    else {
        return;
    };
    // A merge replaces the containers list whole (RFC 7386).
    let pod = PodFixture::new("configured").node("node-a").merge(serde_json::json!({
        "spec": {"containers": [{
            "name": "main", "image": "busybox", "command": ["sh", "-c", "echo $MODE $PREFIX_region"],
            "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}],
            "envFrom": [{"prefix": "PREFIX_", "configMapRef": {"name": "settings"}}],
        }]}
    }));
    create(&pods, pod).await;
    wait_for(&pods, "configured", "to wait for its config", WAIT, |p| {
        first_container_waiting(p).is_some_and(|w| {
            w.reason.as_deref() == Some("CreateContainerConfigError")
                && w.message.as_deref() == Some("configmap \"settings\" not found")
        })
    })
    .await
    .unwrap();

    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client(), "default");
    let cm = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "settings"}, "data": {"mode": "fast", "region": "eu"}
    }))
    .unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    wait_for_phase(&pods, "configured", "Succeeded").await;
    assert_eq!(log(&pods, "configured").await, "fast eu\n");
}

#[tokio::test]
async fn service_links_and_command_expansion_name_the_cluster_ip() {
    let Some((cluster, pods)) =
        cluster_with_node_a("service_links_and_command_expansion_name_the_cluster_ip").await
    else {
        return;
    };
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(cluster.client(), "default");
    let svc = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "tandem-ctl"},
        "spec": {"selector": {"app": "ctl"}, "ports": [{"name": "grpc", "port": 80, "targetPort": 6817}]}
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    // `$(VAR)` in args, from an env value that itself expands service links; `$$` escapes.
    let pod = PodFixture::new("client")
        .node("node-a")
        .env(
            "ADDR",
            "http://$(TANDEM_CTL_SERVICE_HOST):$(TANDEM_CTL_SERVICE_PORT_GRPC)",
        )
        .command(&["sh", "-c", "echo \"$1 $2\"", "sh"])
        .args(&["$(ADDR)", "$$(ADDR)"]);
    create(&pods, pod).await;
    wait_for_phase(&pods, "client", "Succeeded").await;
    assert_eq!(
        log(&pods, "client").await,
        format!("http://{ip}:80 $(ADDR)\n")
    );
}

#[tokio::test]
async fn readiness_probe_holds_ready_until_it_passes() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("readiness_probe_holds_ready_until_it_passes").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("ready");
    // A merge replaces the containers list whole (RFC 7386).
    let pod = PodFixture::new("warming")
        .node("node-a")
        .merge(serde_json::json!({"spec": {"containers": [{
            "name": "main", "image": "busybox", "command": ["sh", "-c", "exec sleep 30"],
            "env": [{"name": "MARK", "value": mark.to_str().unwrap()}],
            "readinessProbe": {"exec": {"command": ["sh", "-c", "test -f \"$MARK\""]}, "periodSeconds": 1},
        }]}}));
    create(&pods, pod).await;
    let running = wait_for_phase(&pods, "warming", "Running").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let unready = pods.get("warming").await.unwrap();
    let ready = condition(&unready, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("False", Some("ContainersNotReady"))
    );
    assert!(!first_container(&running).ready);

    std::fs::write(&mark, "").unwrap();
    let began = Instant::now();
    wait_for(&pods, "warming", "to become ready", WAIT, is_ready)
        .await
        .unwrap();
    assert!(
        began.elapsed() < Duration::from_secs(4),
        "a 1 s probe noticed within a few periods"
    );
}

#[tokio::test]
async fn active_deadline_fails_the_pod_with_deadline_exceeded() {
    let Some((_cluster, pods)) =
        cluster_with_node_a("active_deadline_fails_the_pod_with_deadline_exceeded").await
    else {
        return;
    };
    let pod = PodFixture::new("slow")
        .node("node-a")
        .grace(1)
        .sh("exec sleep 30")
        .merge(serde_json::json!({"spec": {"activeDeadlineSeconds": 1}}));
    create(&pods, pod).await;
    let began = Instant::now();
    let failed = wait_for_phase(&pods, "slow", "Failed").await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "took {:?}",
        began.elapsed()
    );
    let status = failed.status.as_ref().unwrap();
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(exit_code(&failed), Some(143), "sleep ended by SIGTERM");
}

#[tokio::test]
async fn volumes_are_mounted_at_their_mount_paths_in_a_private_mount_namespace() {
    let test = "volumes_are_mounted";
    let Some((cluster, pods)) = cluster_with_node_a(test).await else {
        return;
    };
    if !nix::unistd::geteuid().is_root() {
        testkit::skip(
            test,
            "volume mounts need a mount namespace, which needs root",
        );
        return;
    }
    let client = cluster.client();
    let ns = "default";
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("shared.txt"), "from the host\n").unwrap();
    // Mount points that do not exist on the host: made for the pod, removed after it.
    let tag = format!("{:08x}", rand::random::<u32>());
    let base = format!("/tmp/tandem-e2e-mounts-{tag}");
    let objects = format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: vol-cm}}
data: {{a.conf: "alpha\n", b.conf: "beta\n"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: vol-secret}}
stringData: {{cluster.key: "s3cret\n"}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: vol-claim}}
spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: vols}}
spec:
  nodeName: node-a
  restartPolicy: Never
  securityContext: {{fsGroup: 0}}
  containers:
  - name: c
    image: busybox
    command: [sh, -c]
    args:
    - |
      set -e
      cat {base}/conf/renamed
      test ! -e {base}/conf/a.conf
      stat -c 'cm %a' {base}/conf/renamed
      cat {base}/key/cluster.key
      stat -c 'key %a' {base}/key/cluster.key
      echo written > {base}/scratch/x && cat {base}/scratch/x
      if (echo no > {base}/key/new) 2>/dev/null; then echo key-writable; fi
      cat {base}/one.conf
      cat {base}/host/shared.txt
      echo persisted > {base}/state/file
    volumeMounts:
    - {{name: conf, mountPath: {base}/conf, readOnly: true}}
    - {{name: key, mountPath: {base}/key, readOnly: true}}
    - {{name: scratch, mountPath: {base}/scratch}}
    - {{name: conf-all, mountPath: {base}/one.conf, subPath: b.conf}}
    - {{name: host, mountPath: {base}/host}}
    - {{name: state, mountPath: {base}/state}}
  volumes:
  - name: conf
    configMap: {{name: vol-cm, items: [{{key: a.conf, path: renamed, mode: 384}}]}}
  - name: conf-all
    configMap: {{name: vol-cm}}
  - name: key
    secret: {{secretName: vol-secret, defaultMode: 256}}
  - name: scratch
    emptyDir: {{}}
  - name: host
    hostPath: {{path: {host}, type: Directory}}
  - name: state
    persistentVolumeClaim: {{claimName: vol-claim}}
"#,
        host = host.path().display()
    );
    let objs = testkit::objects_from_yaml(&objects).unwrap();
    testkit::create_all(&client, ns, &objs).await.unwrap();
    let pod = wait_for_phase(&pods, "vols", "Succeeded").await;
    let out = log(&pods, "vols").await;
    assert_eq!(exit_code(&pod), Some(0), "{out}");
    // fsGroup adds group read to the read-only volumes' files, as a kubelet does.
    assert_eq!(
        out, "alpha\ncm 640\ns3cret\nkey 440\nwritten\nbeta\nfrom the host\n",
        "every volume at its mountPath, modes as set"
    );
    assert!(
        !std::path::Path::new(&base).join("key/cluster.key").exists(),
        "mounts are private to the pod"
    );
    pods.delete("vols", &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&pods, "vols", WAIT).await.unwrap();
    let gone = Instant::now();
    while std::path::Path::new(&base).exists() && gone.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !std::path::Path::new(&base).exists(),
        "the mount points made for the pod are removed with it"
    );

    // The claim's volume outlives the pod: a second pod sees what the first wrote.
    let second = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: vols-again}}
spec:
  nodeName: node-a
  restartPolicy: Never
  containers:
  - name: c
    image: busybox
    command: [cat, {base}/state/file]
    volumeMounts: [{{name: state, mountPath: {base}/state}}]
  volumes: [{{name: state, persistentVolumeClaim: {{claimName: vol-claim}}}}]
"#
    );
    testkit::create_all(&client, ns, &testkit::objects_from_yaml(&second).unwrap())
        .await
        .unwrap();
    wait_for_phase(&pods, "vols-again", "Succeeded").await;
    assert_eq!(log(&pods, "vols-again").await, "persisted\n");
}

#[tokio::test]
async fn a_missing_secret_holds_the_pod_in_container_creating_with_failed_mount() {
    let test = "missing_secret_failed_mount";
    let Some((cluster, pods)) = cluster_with_node_a(test).await else {
        return;
    };
    let objects = r#"
apiVersion: v1
kind: Pod
metadata: {name: nokey}
spec:
  nodeName: node-a
  containers:
  - {name: c, image: busybox, command: [sleep, "30"], volumeMounts: [{name: k, mountPath: /tmp/tandem-e2e-nokey}]}
  volumes: [{name: k, secret: {secretName: absent}}]
"#;
    testkit::create_all(
        &cluster.client(),
        "default",
        &testkit::objects_from_yaml(objects).unwrap(),
    )
    .await
    .unwrap();
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let began = Instant::now();
    loop {
        let list = events.list(&ListParams::default()).await.unwrap();
        if let Some(e) = list
            .items
            .iter()
            .find(|e| e.reason.as_deref() == Some("FailedMount"))
        {
            assert!(
                e.message
                    .as_deref()
                    .unwrap_or("")
                    .contains("secret \"absent\" not found")
            );
            break;
        }
        assert!(began.elapsed() < WAIT, "no FailedMount event");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pod = pods.get("nokey").await.unwrap();
    assert_eq!(phase(&pod), "Pending");
    assert_eq!(
        first_container_waiting(&pod)
            .and_then(|w| w.reason)
            .as_deref(),
        Some("ContainerCreating")
    );
}
