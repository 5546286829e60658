//! One pod's life on a node: admit, start containers, restart them by policy, publish
//! status after every change, and on deletion SIGTERM, wait the grace period, SIGKILL,
//! publish the final status and remove the pod (`gracePeriodSeconds=0`, uid precondition).
//!
//! Each pod has its own task ([`run`]) fed the latest Pod object through a `watch`
//! channel (`None`: gone from the API). A task never blocks another: the only shared state
//! is the node's admission ledger.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Event, Pod, Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use nix::sys::signal::Signal;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::admit::{self, NodeAllocatable, Rejection, Resources};
use super::env::{self, EnvContext, ObjectData};
use super::image::{ImageTable, LaunchError};
use super::logs::LogStore;
use super::probe::Readiness;
use super::process::{self, ProcessGroups, Target, signal_group};
use super::status::{self, ContainerRecord, PodRuntime, State, Termination};

/// The node's address, which `hostNetwork` pods share (see `crate::net` for pod IPs).
pub const HOST_IP: &str = "127.0.0.1";

/// Restart back-off: `initial` doubling up to `max`, reset after a container ran for
/// `max` without failing. Far shorter than a real kubelet's 10 s .. 5 min, so tests of
/// restart behaviour take seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(3),
        }
    }
}

impl Backoff {
    pub fn delay(&self, failures: u32) -> Duration {
        self.initial
            .saturating_mul(1 << failures.min(16))
            .min(self.max)
    }
}

/// What every pod task on one node shares.
pub struct NodeCtx {
    pub client: kube::Client,
    pub node: String,
    pub allocatable: NodeAllocatable,
    pub labels: BTreeMap<String, String>,
    pub images: Arc<ImageTable>,
    pub logs: Arc<LogStore>,
    pub groups: ProcessGroups,
    /// Parent of the pods' working directories.
    pub sandboxes: PathBuf,
    /// Persistent volumes (one directory per bound claim's volume), shared by the nodes.
    pub persistent: PathBuf,
    /// Mount points this kubelet's pods hold.
    pub mounts: super::volume::Held,
    pub backoff: Backoff,
    /// The invariant checker's harness id, for the container marks (see
    /// [`crate::invariant`]); `None`: no marks.
    pub harness: Option<String>,
    /// Requests of the admitted pods that have not finished, by uid: what admission
    /// subtracts from allocatable. A mutex because admission must see every earlier
    /// decision (two pods racing for the last GPU).
    pub admitted: Mutex<BTreeMap<String, Resources>>,
}

impl NodeCtx {
    /// The Node's labels now, as a kubelet's node lister has them (labels added after
    /// registration count); the registered ones if the Node cannot be read.
    async fn current_labels(&self) -> BTreeMap<String, String> {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.client.clone());
        match nodes.get(&self.node).await {
            Ok(n) => n.metadata.labels.unwrap_or_default(),
            Err(e) => {
                tracing::debug!(error = %e, "reading the Node for admission; using its registered labels");
                self.labels.clone()
            }
        }
    }

    fn try_admit(
        &self,
        uid: &str,
        pod: &Pod,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), Rejection> {
        let spec = pod.spec.clone().unwrap_or_default();
        admit::check_node_selector(&spec, labels)?;
        let requests = admit::pod_requests(&spec).map_err(|e| Rejection {
            reason: "UnexpectedAdmissionError".into(),
            message: format!("Pod was rejected: {e}"),
        })?;
        let mut ledger = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let mut used = Resources::new();
        for other in ledger.values() {
            for (name, milli) in other {
                *used.entry(name.clone()).or_default() += milli;
            }
        }
        admit::admit(&requests, &self.allocatable, &used, ledger.len())?;
        ledger.insert(uid.to_owned(), requests);
        Ok(())
    }

    fn release(&self, uid: &str) {
        self.admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Init,
    Main,
}

/// One container across its restarts.
#[derive(Debug)]
struct Slot {
    spec: Container,
    record: ContainerRecord,
    /// The running instance's process (group) id.
    pid: Option<i32>,
    started: Option<(Instant, Timestamp)>,
    /// When to try again (image pull, config error, crash back-off).
    retry_at: Option<Instant>,
    failures: u32,
    /// Whether an instance ever ran, so the next start counts as a restart.
    ran: bool,
    /// Done for good: terminated and not to be restarted.
    settled: bool,
    /// The running instance's readiness probe.
    readiness: Option<Readiness>,
}

impl Slot {
    fn new(spec: &Container, waiting: &str) -> Self {
        let mut record =
            ContainerRecord::new(&spec.name, spec.image.as_deref().unwrap_or_default());
        record.state = State::Waiting {
            reason: waiting.into(),
            message: None,
        };
        Self {
            spec: spec.clone(),
            record,
            pid: None,
            started: None,
            retry_at: None,
            failures: 0,
            ran: false,
            settled: false,
            readiness: None,
        }
    }

    fn due(&self, now: Instant) -> bool {
        self.pid.is_none() && !self.settled && self.retry_at.is_none_or(|t| t <= now)
    }
}

// Sync as well as Send: the worker is borrowed across awaits inside a spawned task.
type Exit = std::pin::Pin<Box<dyn std::future::Future<Output = (Kind, usize, i32)> + Send + Sync>>;

struct Worker {
    ctx: Arc<NodeCtx>,
    updates: watch::Receiver<Option<Pod>>,
    /// The latest Pod object seen.
    pod: Pod,
    /// The pod is gone from the API (deleted without waiting for us).
    gone: bool,
    ns: String,
    name: String,
    uid: String,
    policy: String,
    init: Vec<Slot>,
    main: Vec<Slot>,
    start_time: Timestamp,
    /// Tearing down: nothing restarts, and the phase must become terminal.
    terminal: bool,
    /// The pod reached Succeeded/Failed and its resources went back to the node.
    finished: bool,
    exits: FuturesUnordered<Exit>,
    dirty: bool,
    /// When `activeDeadlineSeconds` runs out, counted from when this kubelet took the pod.
    deadline: Option<Instant>,
    /// Pod-level reason and message (`DeadlineExceeded`).
    reason: Option<(String, String)>,
    /// The pod's own loopback address, given at admission (`hostNetwork`: the node's).
    pod_ip: Option<std::net::Ipv4Addr>,
    host_network: bool,
    /// The pod's volumes, made before its first container starts.
    volumes: Option<super::volume::PodVolumes>,
}

/// Runs one pod until it is gone from the API. `updates` starts with the pod.
pub async fn run(ctx: Arc<NodeCtx>, updates: watch::Receiver<Option<Pod>>) {
    let Some(pod) = updates.borrow().clone() else {
        return;
    };
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let has_init = spec.init_containers.as_ref().is_some_and(|v| !v.is_empty());
    let main_waiting = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    let mut w = Worker {
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| Slot::new(c, "PodInitializing"))
            .collect(),
        main: spec
            .containers
            .iter()
            .map(|c| Slot::new(c, main_waiting))
            .collect(),
        policy: spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into()),
        ctx,
        updates,
        pod,
        gone: false,
        ns,
        name,
        uid,
        start_time: Timestamp::now(),
        terminal: false,
        finished: false,
        exits: FuturesUnordered::new(),
        dirty: true,
        deadline: spec
            .active_deadline_seconds
            .map(|secs| Instant::now() + Duration::from_secs(secs.max(0) as u64)),
        reason: None,
        pod_ip: None,
        host_network: spec.host_network == Some(true),
        volumes: None,
    };
    let span = tracing::info_span!("pod", pod = %format!("{}/{}", w.ns, w.name));
    w.lifecycle().instrument(span).await;
}

impl Worker {
    async fn lifecycle(&mut self) {
        let phase = self
            .pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            // Finished before this kubelet saw it (or rejected): only removal is left.
            return self.await_removal().await;
        }
        if self.deleting() {
            return self.finalize().await;
        }
        let labels = self.ctx.current_labels().await;
        if let Err(rejection) = self.ctx.try_admit(&self.uid, &self.pod, &labels) {
            self.reject(rejection).await;
            return self.await_removal().await;
        }
        // The sandbox's address, as the CNI plugin gives it: held until the pod is gone.
        if !self.host_network {
            self.pod_ip = Some(crate::net::PodIps::global().allocate());
        }
        let names = self
            .init
            .iter()
            .chain(&self.main)
            .map(|s| s.spec.name.clone())
            .collect();
        self.ctx
            .logs
            .register_pod(&self.ns, &self.name, &self.uid, names);
        loop {
            if self.deleting() {
                break;
            }
            if !self.finished && self.deadline.is_some_and(|d| d <= Instant::now()) {
                self.exceed_deadline().await;
                continue;
            }
            if !self.finished {
                self.run_probes().await;
                self.start_due().await;
                if matches!(self.phase(), "Succeeded" | "Failed") {
                    self.finished = true;
                    self.ctx.release(&self.uid);
                }
            }
            if self.dirty {
                self.publish().await;
            }
            let wake = self.next_wake();
            tokio::select! {
                changed = self.updates.changed() => {
                    if changed.is_err() {
                        return; // the kubelet is shutting down; it kills what is left
                    }
                    self.take_update();
                }
                Some((kind, idx, code)) = self.exits.next(), if !self.exits.is_empty() => {
                    self.on_exit(kind, idx, code);
                }
                () = sleep_until(wake), if wake.is_some() => {}
            }
        }
        self.teardown().await;
    }

    fn take_update(&mut self) {
        match self.updates.borrow_and_update().clone() {
            Some(pod) => self.pod = pod,
            None => self.gone = true,
        }
    }

    fn deleting(&self) -> bool {
        self.gone || self.pod.metadata.deletion_timestamp.is_some()
    }

    fn runtime(&self) -> PodRuntime {
        PodRuntime {
            init: self.init.iter().map(|s| s.record.clone()).collect(),
            containers: self.main.iter().map(|s| s.record.clone()).collect(),
            start_time: self.start_time,
            host_ip: HOST_IP.into(),
            pod_ip: self.pod_ip_string(),
            terminal: self.terminal,
            reason: self.reason.clone(),
        }
    }

    fn pod_ip_string(&self) -> String {
        self.pod_ip
            .map_or_else(|| HOST_IP.to_owned(), |ip| ip.to_string())
    }

    fn phase(&self) -> &'static str {
        status::phase(&self.policy, &self.runtime())
    }

    fn next_wake(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        let slots = || self.init.iter().chain(&self.main);
        let retries = slots()
            .filter(|s| s.pid.is_none() && !s.settled)
            .filter_map(|s| s.retry_at);
        let probes = slots()
            .filter(|s| s.pid.is_some())
            .filter_map(|s| s.readiness.as_ref().map(|r| r.next));
        retries.chain(probes).chain(self.deadline).min()
    }

    /// Runs the readiness probes that are due and records any change of verdict.
    async fn run_probes(&mut self) {
        let now = Instant::now();
        for slot in self.init.iter_mut().chain(self.main.iter_mut()) {
            let ready = slot.record.ready;
            let Some(probe) = slot.readiness.as_mut().filter(|r| r.next <= now) else {
                continue;
            };
            if let Some(change) = probe.run(ready).await {
                slot.record.ready = change;
                self.dirty = true;
            }
        }
    }

    // === starting containers ===

    async fn start_due(&mut self) {
        let now = Instant::now();
        if let Some(i) = self.init.iter().position(|s| !s.record.succeeded()) {
            if self.init[i].due(now) {
                self.start(Kind::Init, i).await;
            }
            return;
        }
        for i in 0..self.main.len() {
            if self.main[i].due(now) {
                self.start(Kind::Main, i).await;
            }
        }
    }

    fn slot(&mut self, kind: Kind, idx: usize) -> &mut Slot {
        match kind {
            Kind::Init => &mut self.init[idx],
            Kind::Main => &mut self.main[idx],
        }
    }

    fn wait(&mut self, kind: Kind, idx: usize, reason: &str, message: String) {
        let backoff = self.ctx.backoff;
        let slot = self.slot(kind, idx);
        slot.record.state = State::Waiting {
            reason: reason.into(),
            message: Some(message),
        };
        slot.retry_at = Some(Instant::now() + backoff.delay(slot.failures));
        slot.failures += 1;
        self.dirty = true;
    }

    async fn start(&mut self, kind: Kind, idx: usize) {
        let container = self.slot(kind, idx).spec.clone();
        // Checked on the spec as written first: the image is "pulled" before the
        // environment exists, so a missing image wins over a bad env reference.
        match self.ctx.images.launch(&container) {
            // Whether the command exists is known only once `$(VAR)`s are expanded.
            Ok(_) | Err(LaunchError::NotFound(_)) => {}
            Err(LaunchError::UnknownImage(image)) => {
                let pulled_before = matches!(&self.slot(kind, idx).record.state,
                    State::Waiting { reason, .. } if reason == "ErrImagePull" || reason == "ImagePullBackOff");
                let (reason, message) = if pulled_before {
                    (
                        "ImagePullBackOff",
                        format!("Back-off pulling image \"{image}\""),
                    )
                } else {
                    (
                        "ErrImagePull",
                        format!(
                            "failed to pull image \"{image}\": the process kubelet's image table has no entry for it"
                        ),
                    )
                };
                let (type_, event) = if pulled_before {
                    ("Normal", "BackOff")
                } else {
                    ("Warning", "Failed")
                };
                self.emit(type_, event, &message, Some(&container.name));
                return self.wait(kind, idx, reason, message);
            }
            Err(LaunchError::NoCommand) => {
                let msg = "failed to generate container spec: no command specified".to_owned();
                return self.wait(kind, idx, "CreateContainerError", msg);
            }
            Err(LaunchError::PathLinks(e)) => {
                let msg = format!("failed to create the image's PATH links: {e}");
                return self.wait(kind, idx, "CreateContainerError", msg);
            }
        }
        let env = match self.resolve_env(&container).await {
            Ok(env) => env,
            Err(message) => {
                self.emit(
                    "Warning",
                    "Failed",
                    &format!("Error: {message}"),
                    Some(&container.name),
                );
                return self.wait(kind, idx, "CreateContainerConfigError", message);
            }
        };
        // `$(VAR)` in command and args, against the container's final environment, as
        // the kubelet expands them; the program is then found for the expanded command.
        let expanded = env::expand_command(&container, &env);
        let launch = match self.ctx.images.launch(&expanded) {
            Ok(l) => l,
            Err(LaunchError::NotFound(cmd)) => {
                let msg = format!("exec: \"{cmd}\": executable file not found in $PATH");
                return self.start_failed(kind, idx, msg);
            }
            Err(e) => {
                let msg = format!("failed to generate container spec: {e:?}");
                return self.wait(kind, idx, "CreateContainerError", msg);
            }
        };
        let sandbox = self.ctx.sandboxes.join(&self.uid);
        if self.volumes.is_none() {
            let roots = super::volume::Roots {
                sandbox: &sandbox,
                persistent: &self.ctx.persistent,
            };
            match super::volume::prepare(&self.ctx.client, &self.ns, &self.pod, roots).await {
                Ok(v) => self.volumes = Some(v),
                Err(message) => {
                    self.emit("Warning", "FailedMount", &message, None);
                    return self.wait(kind, idx, "ContainerCreating", message);
                }
            }
        }
        let mounts = match self.volumes.as_mut().map(|v| {
            let mounts = v.mounts(&container)?;
            if !mounts.is_empty() && !super::volume::can_mount() {
                return Err("volume mounts need a mount namespace, which needs root: run the process kubelet as root".to_owned());
            }
            v.hold(&mounts, &self.ctx.mounts)
                .map_err(|e| format!("creating a mount point: {e}"))?;
            Ok(mounts)
        }) {
            Some(Ok(m)) => m,
            Some(Err(message)) => return self.start_failed(kind, idx, message),
            None => Vec::new(),
        };
        let launch = super::volume::wrap(&launch, &mounts);
        let mut cwd = sandbox;
        if let Some(dir) = container.working_dir.as_deref() {
            cwd.push(dir.trim_start_matches('/'));
        }
        let target = Target {
            namespace: &self.ns,
            pod: &self.name,
            container: &container.name,
            cwd: &cwd,
        };
        let probe_ip = self.pod_ip.unwrap_or(crate::net::HOST_IP);
        // The marks come last, so a pod's own `env` cannot pass for another node or pod.
        let mut run_env = env.clone();
        if let Some(harness) = &self.ctx.harness {
            let mark = crate::invariant::ContainerMark::new(
                harness,
                &self.ctx.node,
                &self.ns,
                &self.name,
                &container.name,
                self.pod.metadata.labels.as_ref(),
            );
            run_env.extend(mark.env());
        }
        match process::start(&launch, &run_env, target, &self.ctx.logs, &self.ctx.groups).await {
            Ok(started) => {
                let slot = self.slot(kind, idx);
                if slot.ran {
                    slot.record.restarts += 1;
                }
                slot.ran = true;
                slot.pid = Some(started.pid);
                slot.retry_at = None;
                slot.started = Some((Instant::now(), started.started_at));
                slot.record.container_id = Some(format!("process://{}", started.pid));
                slot.record.state = State::Running {
                    started_at: started.started_at,
                };
                slot.readiness =
                    Readiness::for_container(&container, &run_env, cwd.clone(), probe_ip);
                slot.record.ready = slot.readiness.is_none();
                let exit = started.exit;
                self.exits.push(Box::pin(async move {
                    (kind, idx, exit.await.unwrap_or(128 + 9))
                }));
                self.dirty = true;
                tracing::debug!(container = %container.name, pid = started.pid, "container started");
                let (name, image) = (
                    container.name.as_str(),
                    container.image.as_deref().unwrap_or_default(),
                );
                let present = format!("Container image \"{image}\" already present on machine");
                self.emit("Normal", "Pulled", &present, Some(name));
                self.emit(
                    "Normal",
                    "Created",
                    &format!("Created container: {name}"),
                    Some(name),
                );
                self.emit(
                    "Normal",
                    "Started",
                    &format!("Started container {name}"),
                    Some(name),
                );
            }
            Err(e) => self.start_failed(
                kind,
                idx,
                format!("failed to start {}: {e}", launch.program.display()),
            ),
        }
    }

    /// The runtime could not exec the command: a terminated instance with exit code 128,
    /// then the restart policy decides, as for any exit.
    fn start_failed(&mut self, kind: Kind, idx: usize, message: String) {
        let now = Timestamp::now();
        let slot = self.slot(kind, idx);
        if slot.ran {
            slot.record.restarts += 1;
        }
        slot.ran = true;
        let term = Termination {
            exit_code: 128,
            reason: "StartError".into(),
            message: Some(message),
            started_at: Some(now),
            finished_at: now,
            container_id: slot.record.container_id.clone(),
        };
        self.settle_exit(kind, idx, term);
    }

    async fn resolve_env(&self, container: &Container) -> Result<Vec<(String, String)>, String> {
        let (map_names, secret_names) = env::referenced_objects(container);
        let mut maps = ObjectData::new();
        let cms: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        for name in map_names {
            match cms.get_opt(&name).await {
                Ok(Some(cm)) => {
                    maps.insert(name, cm.data.unwrap_or_default());
                }
                Ok(None) => {}
                Err(e) => return Err(format!("reading configmap \"{name}\": {e}")),
            }
        }
        let mut secrets = ObjectData::new();
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        for name in secret_names {
            match api.get_opt(&name).await {
                Ok(Some(s)) => {
                    let mut data: BTreeMap<String, String> = s
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
                    data.extend(s.string_data.unwrap_or_default());
                    secrets.insert(name, data);
                }
                Ok(None) => {}
                Err(e) => return Err(format!("reading secret \"{name}\": {e}")),
            }
        }
        let enable_links =
            self.pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false);
        let service_env = if enable_links {
            let services: Api<Service> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            match services.list(&ListParams::default()).await {
                Ok(list) => env::service_env(&list.items),
                Err(e) => return Err(format!("listing services for the service environment: {e}")),
            }
        } else {
            Vec::new()
        };
        let pod_ip = self.pod_ip_string();
        let ctx = EnvContext {
            service_env: &service_env,
            pod: &self.pod,
            node_allocatable: &self.ctx.allocatable.resources,
            pod_ip: &pod_ip,
            host_ip: HOST_IP,
            config_maps: &maps,
            secrets: &secrets,
        };
        env::container_env(&ctx, container).map_err(|e| e.0)
    }

    // === exits and restarts ===

    fn on_exit(&mut self, kind: Kind, idx: usize, code: i32) {
        let now = Timestamp::now();
        let reset_after = self.ctx.backoff.max;
        let slot = self.slot(kind, idx);
        slot.pid = None;
        slot.readiness = None;
        let (ran_for, started_at) = slot
            .started
            .take()
            .map_or((Duration::ZERO, now), |(i, t)| (i.elapsed(), t));
        if ran_for >= reset_after {
            slot.failures = 0;
        }
        let id = slot.record.container_id.clone().unwrap_or_default();
        tracing::debug!(container = %slot.spec.name, code, "container exited");
        self.settle_exit(kind, idx, Termination::exited(code, started_at, now, id));
    }

    /// Records an ended instance and applies the restart policy.
    fn settle_exit(&mut self, kind: Kind, idx: usize, term: Termination) {
        let restart = !self.terminal
            && match kind {
                Kind::Init => term.exit_code != 0 && self.policy != "Never",
                Kind::Main => {
                    self.policy == "Always" || (self.policy == "OnFailure" && term.exit_code != 0)
                }
            };
        let (backoff, pod_ref) = (
            self.ctx.backoff,
            format!("{}_{}({})", self.name, self.ns, self.uid),
        );
        let slot = self.slot(kind, idx);
        if restart {
            let delay = backoff.delay(slot.failures);
            slot.failures += 1;
            slot.retry_at = Some(Instant::now() + delay);
            slot.record.state = State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: Some(format!(
                    "back-off {delay:?} restarting failed container={} pod={pod_ref}",
                    slot.spec.name
                )),
            };
            slot.record.last = Some(term);
            let name = slot.spec.name.clone();
            let message = format!("Back-off restarting failed container {name} in pod {pod_ref}");
            self.emit("Warning", "BackOff", &message, Some(&name));
        } else {
            slot.settled = true;
            slot.record.state = State::Terminated(term);
        }
        self.dirty = true;
    }

    // === deletion ===

    fn grace(&self) -> Duration {
        let secs = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(secs.max(0) as u64)
    }

    /// SIGTERM every running container's group, wait for them up to the grace period
    /// (shortened if a later delete asks for less), then SIGKILL what is left.
    async fn kill_all(&mut self) {
        let running: Vec<i32> = self
            .init
            .iter()
            .chain(&self.main)
            .filter_map(|s| s.pid)
            .collect();
        if running.is_empty() {
            return;
        }
        tracing::debug!(grace = ?self.grace(), "killing containers");
        for slot in self
            .init
            .iter()
            .chain(&self.main)
            .filter(|s| s.pid.is_some())
        {
            let name = &slot.spec.name;
            self.emit(
                "Normal",
                "Killing",
                &format!("Stopping container {name}"),
                Some(name),
            );
        }
        for pid in &running {
            signal_group(*pid, Signal::SIGTERM);
        }
        let began = Instant::now();
        let mut killed = false;
        while !self.exits.is_empty() {
            let deadline = began + self.grace();
            tokio::select! {
                Some((kind, idx, code)) = self.exits.next() => self.on_exit(kind, idx, code),
                () = tokio::time::sleep_until(deadline), if !killed => {
                    killed = true;
                    for pid in self.init.iter().chain(&self.main).filter_map(|s| s.pid) {
                        signal_group(pid, Signal::SIGKILL);
                    }
                }
                changed = self.updates.changed(), if !self.gone => {
                    if changed.is_ok() { self.take_update() } else { self.gone = true }
                }
            }
        }
    }

    async fn teardown(&mut self) {
        self.stop_all().await;
        self.ctx.release(&self.uid);
        if !self.gone {
            self.dirty = true;
            self.publish().await;
        }
        self.finalize().await;
    }

    /// Ends the pod's containers for good: running ones by signal, waiting ones (never ran,
    /// or waiting for a restart) by the pod's end.
    async fn stop_all(&mut self) {
        self.terminal = true;
        self.kill_all().await;
        let now = Timestamp::now();
        for slot in self.init.iter_mut().chain(self.main.iter_mut()) {
            if let State::Waiting { .. } = slot.record.state {
                slot.record.state =
                    State::Terminated(slot.record.last.take().unwrap_or(Termination {
                        exit_code: 137,
                        reason: "ContainerStatusUnknown".into(),
                        message: Some(
                            "The container could not be located when the pod was terminated".into(),
                        ),
                        started_at: None,
                        finished_at: now,
                        container_id: None,
                    }));
            }
        }
    }

    /// `activeDeadlineSeconds` ran out: stop everything and fail the pod, as a kubelet does.
    async fn exceed_deadline(&mut self) {
        tracing::info!("active deadline exceeded");
        self.reason = Some((
            "DeadlineExceeded".into(),
            "Pod was active on the node longer than the specified deadline".into(),
        ));
        self.stop_all().await;
        self.finished = true;
        self.ctx.release(&self.uid);
        self.dirty = true;
    }

    /// Removes the pod from the API (if still there) and forgets it.
    async fn finalize(&mut self) {
        if !self.gone {
            let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(self.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match pods.delete(&self.name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => tracing::warn!(error = %e, "removing the pod failed"),
            }
        }
        self.ctx.release(&self.uid);
        if let Some(v) = self.volumes.as_mut() {
            v.release(&self.ctx.mounts);
        }
        if let Some(ip) = self.pod_ip.take() {
            crate::net::PodIps::global().release(ip);
        }
        self.ctx.logs.remove_pod(&self.ns, &self.name, &self.uid);
    }

    /// For a pod that will not run here (rejected, or already finished): wait until it is
    /// deleted, then remove it.
    async fn await_removal(&mut self) {
        while !self.deleting() {
            if self.updates.changed().await.is_err() {
                return;
            }
            self.take_update();
        }
        self.finalize().await;
    }

    // === API writes ===

    async fn publish(&mut self) {
        let status = status::build(&self.pod, &self.runtime(), Timestamp::now());
        self.write_status(json!({ "status": status })).await;
        self.dirty = false;
    }

    async fn write_status(&mut self, patch: serde_json::Value) {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        match pods
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(pod) => {
                if pod.metadata.uid.as_deref() == Some(self.uid.as_str()) {
                    self.pod = pod;
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => self.gone = true,
            Err(e) => tracing::warn!(error = %e, "writing pod status failed"),
        }
    }

    /// Fails a pod admission refused: the event first, then the status, as the kubelet's
    /// `rejectPod` does (so whoever sees the Failed pod finds the event too).
    async fn reject(&mut self, r: Rejection) {
        tracing::info!(reason = %r.reason, message = %r.message, "pod rejected");
        if let Some(event) = self.event_object("Warning", &r.reason, &r.message, None) {
            let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ns);
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                tracing::warn!(error = %e, "recording the rejection event failed");
            }
        }
        let qos = status::qos_class(&self.pod);
        let patch = json!({"status": {"phase": "Failed", "reason": r.reason, "message": r.message, "qosClass": qos}});
        self.write_status(patch).await;
    }

    /// Records an Event about the pod (or one of its containers), as the kubelet's event
    /// recorder does. The worker does not wait for it: events are best effort.
    fn emit(&self, type_: &str, reason: &str, message: &str, container: Option<&str>) {
        let event = self.event_object(type_, reason, message, container);
        let events: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let reason = reason.to_owned();
        tokio::spawn(async move {
            let Some(event) = event else { return };
            if let Err(e) = events.create(&PostParams::default(), &event).await {
                tracing::debug!(error = %e, %reason, "recording an event failed");
            }
        });
    }

    fn event_object(
        &self,
        type_: &str,
        reason: &str,
        message: &str,
        container: Option<&str>,
    ) -> Option<Event> {
        let now = Timestamp::now();
        let mut involved = json!({"apiVersion": "v1", "kind": "Pod", "name": self.name,
                                  "namespace": self.ns, "uid": self.uid});
        if let Some(c) = container {
            involved["fieldPath"] = json!(format!("spec.containers{{{c}}}"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": format!("{}.{:x}", self.name, now.as_nanosecond()), "namespace": self.ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": self.ctx.node},
            "reportingComponent": "kubelet",
            "reportingInstance": self.ctx.node,
            "firstTimestamp": now.to_string(),
            "lastTimestamp": now.to_string(),
            "count": 1,
        }))
        .ok()
    }
}

async fn sleep_until(when: Option<Instant>) {
    match when {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        };
        let got: Vec<u128> = (0..5).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 500, 500]);
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(500));
    }
}
