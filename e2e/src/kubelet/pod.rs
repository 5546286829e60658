//! One pod's life on a node: admit, start containers, restart them by policy, publish
//! status after every change, and on deletion SIGTERM, wait the grace period, SIGKILL,
//! publish the final status and remove the pod (`gracePeriodSeconds=0`, uid precondition).
//!
//! Each pod has its own task ([`run`]) fed the latest Pod object through a `watch`
//! channel (`None`: gone from the API). A task never blocks another: the only shared state
//! is the node's admission ledger.
//!
//! # Layout
//! - this file: the node's shared context ([`NodeCtx`], admission), a container's slot,
//!   the pod task ([`run`]) and its loop.
//! - `start.rs`: starting containers (image, environment, volumes, process, probes).
//! - `stop.rs`: exits, restarts by policy, the active deadline, deletion and removal.
//! - `publish.rs`: what the task writes to the API: status, rejection, Events.

mod publish;
mod start;
mod stop;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::admit::{self, NodeAllocatable, Rejection, Resources};
use super::image::ImageTable;
use super::logs::LogStore;
use super::probe::Readiness;
use super::process::ProcessGroups;
use super::status::{self, ContainerRecord, PodRuntime, State};

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

    fn slot(&mut self, kind: Kind, idx: usize) -> &mut Slot {
        match kind {
            Kind::Init => &mut self.init[idx],
            Kind::Main => &mut self.main[idx],
        }
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
