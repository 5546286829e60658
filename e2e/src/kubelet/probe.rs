//! Readiness probes: `exec`, `tcpSocket` and `httpGet` against the pod's IP (or the probe's
//! `host`), with the kubelet's timing fields and thresholds.
//!
//! Liveness and startup probes are not run (see DIFFERENCES.md).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// A container's readiness probe and its running tally.
#[derive(Debug, Clone)]
pub struct Readiness {
    probe: Probe,
    /// Container ports by name, for a probe that names its port.
    ports: Vec<(String, i32)>,
    /// The container's environment and directory, for `exec` probes.
    env: Vec<(String, String)>,
    cwd: PathBuf,
    /// Where `tcpSocket` and `httpGet` connect when the probe names no `host`.
    pod_ip: std::net::Ipv4Addr,
    successes: i32,
    failures: i32,
    pub next: Instant,
}

/// Kubernetes defaults for the probe's timing fields.
fn secs(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(v.unwrap_or(default).max(0) as u64)
}

impl Readiness {
    /// The readiness probe of a container that just started, if it has one.
    pub fn for_container(
        c: &Container,
        env: &[(String, String)],
        cwd: PathBuf,
        pod_ip: std::net::Ipv4Addr,
    ) -> Option<Self> {
        let probe = c.readiness_probe.clone()?;
        let delay = secs(probe.initial_delay_seconds, 0);
        let ports = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| Some((p.name.clone()?, p.container_port)))
            .collect();
        Some(Self {
            probe,
            ports,
            env: env.to_vec(),
            cwd,
            pod_ip,
            successes: 0,
            failures: 0,
            next: Instant::now() + delay,
        })
    }

    /// Runs the probe once and returns the readiness it implies, if it changed:
    /// `Some(true)` after `successThreshold` successes in a row, `Some(false)` after
    /// `failureThreshold` failures in a row.
    pub async fn run(&mut self, ready: bool) -> Option<bool> {
        let timeout = secs(self.probe.timeout_seconds, 1);
        let ok = tokio::time::timeout(timeout, self.check())
            .await
            .unwrap_or(false);
        self.next = Instant::now() + secs(self.probe.period_seconds, 10);
        if ok {
            self.successes += 1;
            self.failures = 0;
            (!ready && self.successes >= self.probe.success_threshold.unwrap_or(1)).then_some(true)
        } else {
            self.failures += 1;
            self.successes = 0;
            (ready && self.failures >= self.probe.failure_threshold.unwrap_or(3)).then_some(false)
        }
    }

    fn port(&self, port: &IntOrString) -> Option<u16> {
        let n = match port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => self.ports.iter().find(|(n, _)| n == name)?.1,
        };
        u16::try_from(n).ok()
    }

    async fn check(&self) -> bool {
        if let Some(exec) = &self.probe.exec {
            let Some((program, args)) = exec.command.as_deref().unwrap_or_default().split_first()
            else {
                return false;
            };
            let status = tokio::process::Command::new(program)
                .args(args)
                .current_dir(&self.cwd)
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status()
                .await;
            return status.is_ok_and(|s| s.success());
        }
        if let Some(tcp) = &self.probe.tcp_socket {
            let Some(port) = self.port(&tcp.port) else {
                return false;
            };
            let host = tcp.host.clone().unwrap_or_else(|| self.pod_ip.to_string());
            return tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .is_ok();
        }
        if let Some(http) = &self.probe.http_get {
            let Some(port) = self.port(&http.port) else {
                return false;
            };
            let path = http.path.as_deref().unwrap_or("/");
            let host = http.host.clone().unwrap_or_else(|| self.pod_ip.to_string());
            return http_ok(&host, port, path).await;
        }
        false
    }
}

/// `GET path` over HTTP/1.0; success is a 2xx or 3xx status, as for the kubelet.
async fn http_ok(host: &str, port: u16, path: &str) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect((host, port)).await else {
        return false;
    };
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.35\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    if stream.read_exact(&mut head).await.is_err() {
        return false;
    }
    // "HTTP/1.x NNN"
    let code = std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|c| c.parse::<u16>().ok());
    code.is_some_and(|c| (200..400).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Probes go to the pod's IP, not to 127.0.0.1.
    const POD_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 64, 9, 9);

    fn readiness(probe: serde_json::Value) -> Readiness {
        let c: Container = serde_json::from_value(json!({"name": "c",
            "ports": [{"name": "web", "containerPort": 1}], "readinessProbe": probe}))
        .unwrap();
        Readiness::for_container(&c, &[], std::env::temp_dir(), POD_IP).unwrap()
    }

    #[tokio::test]
    async fn thresholds_gate_changes() {
        let mut r = readiness(json!({"exec": {"command": ["true"]}, "successThreshold": 2}));
        assert_eq!(r.run(false).await, None, "one success is not enough");
        assert_eq!(r.run(false).await, Some(true));
        let mut r = readiness(json!({"exec": {"command": ["false"]}, "failureThreshold": 2}));
        assert_eq!(r.run(true).await, None);
        assert_eq!(r.run(true).await, Some(false));
    }

    #[tokio::test]
    async fn tcp_and_http_probes_reach_the_pod_ip() {
        let listener = tokio::net::TcpListener::bind((POD_IP, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 256];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let ok = String::from_utf8_lossy(&buf[..n]).starts_with("GET /healthz ");
                let reply: &[u8] = if ok {
                    b"HTTP/1.0 200 OK\r\n\r\n"
                } else {
                    b"HTTP/1.0 503 No\r\n\r\n"
                };
                let _ = s.write_all(reply).await;
            }
        });
        let mut tcp = readiness(json!({"tcpSocket": {"port": port}}));
        assert_eq!(tcp.run(false).await, Some(true));
        let mut good = readiness(json!({"httpGet": {"port": port, "path": "/healthz"}}));
        assert_eq!(good.run(false).await, Some(true));
        let mut bad =
            readiness(json!({"httpGet": {"port": port, "path": "/other"}, "failureThreshold": 1}));
        assert_eq!(bad.run(true).await, Some(false));
        let mut named = readiness(json!({"tcpSocket": {"port": "web"}, "failureThreshold": 1}));
        assert_eq!(named.run(true).await, Some(false), "port 1 is closed");
        let mut elsewhere = readiness(
            json!({"tcpSocket": {"port": port, "host": "127.0.0.1"}, "failureThreshold": 1}),
        );
        assert_eq!(
            elsewhere.run(true).await,
            Some(false),
            "the probe's host replaces the pod IP"
        );
    }
}
