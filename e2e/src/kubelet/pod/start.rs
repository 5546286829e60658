//! Starting a pod's containers: init containers in order, then the main ones; for each,
//! the image, the environment (ConfigMaps, Secrets, Services, the downward API), the
//! volumes, the process with its invariant marks, and the readiness probe. A failure waits
//! with back-off under the reason a kubelet gives. Apart from the pod task's loop because
//! this is the longest single step of it.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Secret, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use tokio::time::Instant;

use super::{HOST_IP, Kind, Worker};
use crate::kubelet::env::{self, EnvContext, ObjectData};
use crate::kubelet::image::LaunchError;
use crate::kubelet::probe::Readiness;
use crate::kubelet::process::{self, Target};
use crate::kubelet::status::{State, Termination};

impl Worker {
    pub(super) async fn start_due(&mut self) {
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
            let roots = crate::kubelet::volume::Roots {
                sandbox: &sandbox,
                persistent: &self.ctx.persistent,
            };
            match crate::kubelet::volume::prepare(&self.ctx.client, &self.ns, &self.pod, roots)
                .await
            {
                Ok(v) => self.volumes = Some(v),
                Err(message) => {
                    self.emit("Warning", "FailedMount", &message, None);
                    return self.wait(kind, idx, "ContainerCreating", message);
                }
            }
        }
        let mounts = match self.volumes.as_mut().map(|v| {
            let mounts = v.mounts(&container)?;
            if !mounts.is_empty() && !crate::kubelet::volume::can_mount() {
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
        let launch = crate::kubelet::volume::wrap(&launch, &mounts);
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
                    let data: BTreeMap<String, String> = s
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect();
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
}
