//! `kubectl exec` for the process kubelet's pods: [`TestCluster::exec`] runs a command in a
//! running container's mount namespace with its environment and working directory. Apart
//! from the rest of [`TestCluster`] because it reaches into `/proc` and `nsenter`, not the
//! API.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::TestCluster;

/// Why [`TestCluster::exec`] could not run a command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("exec runs commands in the process kubelet's pods; this is a real cluster")]
    Real,
    #[error("reading the pod")]
    Read(#[source] kube::Error),
    #[error("pod {0} has no such container")]
    NoContainer(String),
    #[error("the container of pod {0} is not running")]
    NotRunning(String),
    #[error("the command is not in the container's image: {0}")]
    Command(String),
    #[error("reading the container's process")]
    Proc(#[source] std::io::Error),
    #[error("running nsenter")]
    Spawn(#[source] std::io::Error),
}

impl TestCluster {
    /// Runs `argv` in a running container of a pod, as `kubectl exec` does: the command is
    /// found in the container's image, with the container's environment, working directory
    /// and mounts (it joins the container's mount namespace), so it sees the pod's volumes
    /// and reaches what the pod reaches. `container` `None`: the pod's default container
    /// (annotation `kubectl.kubernetes.io/default-container`), else the first.
    pub async fn exec(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
        argv: &[&str],
    ) -> Result<std::process::Output, ExecError> {
        let Some(local) = &self.local else {
            return Err(ExecError::Real);
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let p = pods.get(pod).await.map_err(ExecError::Read)?;
        let spec = p.spec.clone().unwrap_or_default();
        // As kubectl: the named container, else the pod's
        // `kubectl.kubernetes.io/default-container`, else the first.
        let default = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubectl.kubernetes.io/default-container"))
            .map(String::as_str);
        let c = match container.or(default) {
            Some(n) => spec.containers.iter().find(|c| c.name == n),
            None => spec.containers.first(),
        }
        .ok_or_else(|| ExecError::NoContainer(pod.to_owned()))?;
        let pid = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|s| s.name == c.name))
            .filter(|s| s.state.as_ref().is_some_and(|st| st.running.is_some()))
            .and_then(|s| s.container_id.as_deref())
            .and_then(|id| id.strip_prefix("process://"))
            .and_then(|id| id.parse::<u32>().ok())
            .ok_or_else(|| ExecError::NotRunning(pod.to_owned()))?;
        let mut spec = c.clone();
        spec.command = Some(argv.iter().map(|a| (*a).to_owned()).collect());
        spec.args = None;
        let launch = local
            .images
            .launch(&spec)
            .map_err(|e| ExecError::Command(format!("{e:?}")))?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let environ = std::fs::read(proc_dir.join("environ")).map_err(ExecError::Proc)?;
        let cwd = std::fs::read_link(proc_dir.join("cwd")).map_err(ExecError::Proc)?;
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--mount={}", proc_dir.join("ns/mnt").display()))
            .arg(format!("--wd={}", cwd.display()))
            .args([
                "--",
                "bash",
                "-c",
                "a0=$1; shift; exec -a \"$a0\" \"$@\"",
                "bash",
            ])
            .arg(&launch.arg0)
            .arg(&launch.program)
            .args(&launch.args)
            .env_clear()
            .stdin(std::process::Stdio::null());
        for kv in environ.split(|b| *b == 0).filter(|kv| !kv.is_empty()) {
            let kv = String::from_utf8_lossy(kv);
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        cmd.output().await.map_err(ExecError::Spawn)
    }
}
