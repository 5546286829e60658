//! The processes of a [`BridgeEnv`]: the controller (on a free port, restarted on the same
//! address), one worker per node (killed and restarted as a crash would), and the bridges.
//! Apart from the rest of the environment because this is process lifecycle, not set-up or
//! the CLI.

use std::time::Duration;

use super::BridgeEnv;
use crate::bridgekit::{CLUSTER, Proc, T, free_port, spawn};

impl BridgeEnv {
    /// Starts the controller on the current address (a fresh free port if none yet, or if
    /// the port was taken before it bound it) and waits until it answers.
    pub(super) async fn start_controller_on_a_free_port(&mut self) {
        for attempt in 0..5 {
            if self.addr.is_empty() || attempt > 0 {
                self.addr = format!("127.0.0.1:{}", free_port());
                self.url = format!("http://{}", self.addr);
            }
            if self.spawn_controller().await {
                return;
            }
        }
        panic!("the controller did not start:\n{}", self.logs());
    }

    /// Spawns the controller on `self.addr`; true once it answers, false if it exited.
    async fn spawn_controller(&mut self) -> bool {
        // Each start has its own log, so a restarted controller keeps the first one's.
        self.controller_starts += 1;
        let log = match self.controller_starts {
            1 => self.dir.path().join("controller.log"),
            n => self.dir.path().join(format!("controller-{n}.log")),
        };
        let (state, key) = (self.state.to_string_lossy().into_owned(), self.key_str());
        let mut args: Vec<&str> = vec![
            "controller",
            "--listen",
            &self.addr,
            "--state-dir",
            &state,
            "--key-file",
            &key,
            "--heartbeat-interval",
            "200ms",
            "--kill-wait",
            "1s",
            // Loopback only, as the flag requires; the TLS path has its own tests.
            "--insecure-plaintext",
        ];
        args.extend(self.controller_args.iter().map(String::as_str));
        let mut p = spawn(&self.tandem, &args, &log, &[]);
        let deadline = tokio::time::Instant::now() + T;
        loop {
            if p.exited() {
                return false;
            }
            if self.key.is_file() && self.try_cli(&["sinfo", "-h"]).is_ok() {
                self.controller = Some(p);
                return true;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the controller to answer:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the controller (SIGKILL, as a crash).
    pub fn kill_controller(&mut self) {
        if let Some(mut p) = self.controller.take() {
            p.kill();
        }
    }

    /// Starts the controller again with the same state directory, key and address (workers
    /// and bridges reconnect to it), and waits until it answers.
    pub async fn restart_controller(&mut self) {
        self.kill_controller();
        let deadline = tokio::time::Instant::now() + T;
        while !self.spawn_controller().await {
            // The old socket may linger a moment; the address must stay the same.
            assert!(
                tokio::time::Instant::now() < deadline,
                "the controller to restart on {}:\n{}",
                self.addr,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Starts the worker of node `name` (with the node's shape, spool and invariant mark, as
    /// at the start); its log is `worker-<name>.log`, then `worker-<name>-<n>.log` for the
    /// n-th start.
    pub(super) fn start_worker(&mut self, name: &str) {
        let n = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name} in the setup"))
            .clone();
        let starts = self.workers.get(name).map_or(0, |w| w.1) + 1;
        // Each worker carries its node's mark, so the invariant checker places its jobs'
        // processes (its descendants) on that node.
        let mark = self
            .harness
            .as_ref()
            .map(|h| crate::invariant::node_mark(h, &n.name));
        let spool = self.dir.path().join(format!("spool-{}", n.name));
        let (cpus, mem, gpus) = (
            n.cpus.to_string(),
            format!("{}G", n.mem_gib),
            n.gpus.to_string(),
        );
        let log = match starts {
            1 => self.dir.path().join(format!("worker-{}.log", n.name)),
            k => self.dir.path().join(format!("worker-{}-{k}.log", n.name)),
        };
        let (url, key) = (self.url.clone(), self.key_str());
        let p = spawn(
            &self.tandem,
            &[
                "worker",
                "--controller",
                &url,
                "--key-file",
                &key,
                "--name",
                &n.name,
                "--cpus",
                &cpus,
                "--mem",
                &mem,
                "--gpus",
                &gpus,
                "--state-dir",
                &spool.to_string_lossy(),
                "--insecure-plaintext",
            ],
            &log,
            &mark
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        self.workers.insert(n.name.clone(), (Some(p), starts));
    }

    /// Kills the worker of node `name` (SIGKILL, as a crash of slurmd): its jobs' processes
    /// live on until a worker of that node starts again and ends them.
    pub fn kill_worker(&mut self, name: &str) {
        if let Some(mut p) = self.workers.get_mut(name).and_then(|w| w.0.take()) {
            p.kill();
        }
    }

    /// Starts the worker of node `name` again (killing it first if it runs) with the same
    /// spool; it registers with the controller as the same node.
    pub fn restart_worker(&mut self, name: &str) {
        self.kill_worker(name);
        self.start_worker(name);
    }

    /// Starts a `tandem-bridge run` for the cluster, with `extra` flags; its log is
    /// `bridge-<n>.log` in [`BridgeEnv::dir`].
    pub fn spawn_bridge(&mut self, extra: &[&str]) -> Proc {
        self.bridges += 1;
        let key = self.key_str();
        let mut args = vec![
            "run",
            "--controller",
            &self.url,
            "--key-file",
            &key,
            "--cluster",
            CLUSTER,
            "--cluster-namespace",
            &self.cluster_ns,
        ];
        // The GPU holders run as real processes here: the harness runs `busybox` images
        // (the release image is not in its table, so its holders would never start).
        if !extra.iter().any(|a| a.starts_with("--gpu-holder-image")) {
            args.extend_from_slice(&["--gpu-holder-image", "busybox"]);
        }
        args.extend_from_slice(extra);
        let log = self.dir.path().join(format!("bridge-{}.log", self.bridges));
        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        spawn(&self.bridge, &args, &log, &[("KUBECONFIG", &kubeconfig)])
    }
}
