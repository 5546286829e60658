//! How a pod's containers end: an exit applies the restart policy (with back-off), the
//! active deadline fails the pod, and deletion SIGTERMs, waits the grace period, SIGKILLs,
//! then removes the pod and frees what it held. Apart from starting because ending has its
//! own rules (grace, uid precondition, the node's ledger).
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::{Kind, Worker};
use crate::kubelet::process::signal_group;
use crate::kubelet::status::{State, Termination};

impl Worker {
    pub(super) fn on_exit(&mut self, kind: Kind, idx: usize, code: i32) {
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
    pub(super) fn settle_exit(&mut self, kind: Kind, idx: usize, term: Termination) {
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

    pub(super) async fn teardown(&mut self) {
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
    pub(super) async fn exceed_deadline(&mut self) {
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
    pub(super) async fn finalize(&mut self) {
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
    pub(super) async fn await_removal(&mut self) {
        while !self.deleting() {
            if self.updates.changed().await.is_err() {
                return;
            }
            self.take_update();
        }
        self.finalize().await;
    }
}
