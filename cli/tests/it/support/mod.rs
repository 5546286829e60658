//! A local cluster for one test: `tandem up` in a temp dir, the real CLI against it, and
//! `tandem down` when the guard drops. Every helper polls with a deadline and fails with
//! what it last saw plus the controller's log, never a bare timeout.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const TANDEM: &str = env!("CARGO_BIN_EXE_tandem");

pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// Where jobs are submitted from (their default working directory).
    pub work: PathBuf,
}

impl Cluster {
    /// `nodes` workers with 4 CPUs, 4 GiB and 2 GPUs each, short timings.
    pub fn start(nodes: u32) -> Cluster {
        Cluster::start_with(nodes, &[])
    }

    pub fn start_with(nodes: u32, extra: &[&str]) -> Cluster {
        Cluster::launch(temp_dir(), nodes, extra)
    }

    /// Like [`Cluster::start`], with `toml` as the controller's config file (`tandem up
    /// --config`: partitions, QOS, accounts, users, priority and fair-share settings).
    pub fn start_with_config(nodes: u32, toml: &str) -> Cluster {
        let dir = temp_dir();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, toml).unwrap();
        let path = path.to_str().unwrap().to_owned();
        Cluster::launch(dir, nodes, &["--config", &path])
    }

    fn launch(dir: tempfile::TempDir, nodes: u32, extra: &[&str]) -> Cluster {
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let nodes = nodes.to_string();
        let state = dir.path().join("state");
        let state = state.to_str().unwrap();
        let mut args = vec![
            "up",
            "--state-dir",
            state,
            "--no-default-config",
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            &nodes,
            "--gpus-per-node",
            "2",
            "--cpus-per-node",
            "4",
            "--mem-per-node",
            "4G",
            "--kill-wait",
            "1s",
            "--heartbeat-interval",
            "200ms",
            "--node-timeout",
            "5s",
            "--timeout",
            "60",
        ];
        args.extend_from_slice(extra);
        let out = Command::new(TANDEM)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run tandem up");
        let cluster = Cluster { dir, work };
        assert!(
            out.status.success(),
            "tandem up failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.controller_log()
        );
        cluster
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn cluster_file(&self) -> PathBuf {
        self.state_dir().join("cluster.json")
    }

    pub fn controller_log(&self) -> String {
        let text =
            std::fs::read_to_string(self.state_dir().join("controller.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- controller log (tail) ---\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }

    /// A `tandem` command against this cluster, run from the work dir.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(TANDEM);
        c.args(args)
            .env("TANDEM_CONFIG", self.cluster_file())
            .env("TANDEM_BIN", TANDEM)
            .env_remove("SLURM_JOB_ID")
            .current_dir(&self.work)
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run tandem")
    }

    /// Runs and requires success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tandem {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr),
            self.controller_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes a script into the work dir and returns its path.
    pub fn script(&self, name: &str, text: &str) -> String {
        let p = self.work.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    /// `sbatch --parsable ARGS` -> job id.
    pub fn sbatch(&self, args: &[&str]) -> u64 {
        let mut all = vec!["sbatch", "--parsable"];
        all.extend_from_slice(args);
        let out = self.ok(&all);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch printed {out:?}"))
    }

    /// `sbatch --parsable ARGS` with `script` on its standard input -> job id.
    pub fn sbatch_stdin(&self, args: &[&str], script: &str) -> u64 {
        self.sbatch_with(args, &[], Some(script))
    }

    /// `sbatch --parsable ARGS` with `env` added to the submitter's environment and, if
    /// given, the script on its standard input -> job id. Panics with sbatch's stderr.
    pub fn sbatch_with(&self, args: &[&str], env: &[(&str, &str)], script: Option<&str>) -> u64 {
        use std::io::Write as _;
        let mut all = vec!["sbatch", "--parsable"];
        all.extend_from_slice(args);
        let mut child = self
            .cmd(&all)
            .envs(env.iter().copied())
            .stdin(if script.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tandem sbatch");
        if let (Some(mut stdin), Some(script)) = (child.stdin.take(), script) {
            stdin
                .write_all(script.as_bytes())
                .expect("write the script to sbatch");
        }
        let out = child.wait_with_output().expect("wait for sbatch");
        let printed = String::from_utf8_lossy(&out.stdout);
        printed.trim().parse().unwrap_or_else(|_| {
            panic!(
                "sbatch printed {printed:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// The accounting record of a job (any state), or None.
    pub fn job(&self, id: u64) -> Option<Value> {
        let out = self.ok(&["sacct", "-X", "-j", &id.to_string(), "--json"]);
        let v: Value = serde_json::from_str(&out).expect("sacct --json");
        v["jobs"].as_array().and_then(|a| a.first().cloned())
    }

    /// Every job record of every user.
    pub fn all_jobs(&self) -> Vec<Value> {
        let out = self.ok(&["sacct", "-X", "-a", "-S", "now-1days", "--json"]);
        let v: Value = serde_json::from_str(&out).expect("sacct --json");
        v["jobs"].as_array().cloned().unwrap_or_default()
    }

    /// Every run of every job of every user (`sacct -D`: a requeued job has one record per
    /// run).
    pub fn all_runs(&self) -> Vec<Value> {
        let out = self.ok(&["sacct", "-X", "-a", "-D", "-S", "now-1days", "--json"]);
        let v: Value = serde_json::from_str(&out).expect("sacct --json");
        v["jobs"].as_array().cloned().unwrap_or_default()
    }

    /// The runs of one job, oldest first (`sacct -D -j ID`).
    pub fn runs(&self, id: u64) -> Vec<Value> {
        let out = self.ok(&["sacct", "-X", "-D", "-j", &id.to_string(), "--json"]);
        let v: Value = serde_json::from_str(&out).expect("sacct --json");
        let mut runs = v["jobs"].as_array().cloned().unwrap_or_default();
        // The active run (pending or running: no end yet) is always the newest.
        runs.sort_by_key(|r| {
            (
                r["time"]["end"] == 0,
                r["time"]["start"].as_i64(),
                r["time"]["end"].as_i64(),
            )
        });
        runs
    }

    /// The job's line in `squeue -h -o FORMAT`, trimmed; empty once it left the queue.
    pub fn squeue_job(&self, id: u64, format: &str) -> String {
        self.ok(&["squeue", "-h", "-j", &id.to_string(), "-o", format])
            .trim()
            .to_string()
    }

    /// `sacct -n -P -j ID -o FIELDS`: the job's lines (allocation, then steps), `|`-separated.
    pub fn sacct_job(&self, id: u64, fields: &str) -> String {
        self.ok(&["sacct", "-n", "-P", "-j", &id.to_string(), "-o", fields])
    }

    /// Polls `squeue -o FORMAT` for the job until it prints `want`.
    pub fn wait_squeue(&self, id: u64, format: &str, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            last = self.squeue_job(id, format);
            if last == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "squeue -o {format:?} for job {id} never showed {want:?}; last {last:?}\n{}",
            self.controller_log()
        );
    }

    /// Polls until the job's state is `state`; returns its record. Fails at once if the job
    /// ended in another state.
    pub fn wait_state(&self, id: u64, state: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.job(id);
            if let Some(j) = &last {
                if j["state"]["current"] == state {
                    return j.clone();
                }
                let active = matches!(
                    j["state"]["current"].as_str(),
                    Some("PENDING" | "RUNNING" | "COMPLETING" | "REQUEUED")
                );
                assert!(
                    active,
                    "job {id} ended {} instead of reaching {state}: {j}\n{}",
                    j["state"]["current"],
                    self.controller_log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "job {id} did not reach {state} within {timeout:?}; last seen: {last:?}\n{}",
            self.controller_log()
        );
    }

    /// Polls until the job has ended (any terminal state).
    pub fn wait_end(&self, id: u64, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.job(id);
            if let Some(j) = &last
                && !matches!(
                    j["state"]["current"].as_str(),
                    Some("PENDING" | "RUNNING" | "COMPLETING")
                )
            {
                return j.clone();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "job {id} did not end within {timeout:?}; last seen: {last:?}\n{}",
            self.controller_log()
        );
    }

    /// Kills the controller with SIGKILL (no chance to flush or clean up), restarts it with
    /// the arguments `tandem up` recorded, on the same state dir, and waits until it
    /// answers. The workers keep running and reconnect. Returns the new controller, our
    /// child: after `tandem down`, wait on it so it is reaped.
    pub fn kill_and_restart_controller(&self) -> std::process::Child {
        use std::os::unix::process::CommandExt as _;
        let state = self.state_dir();
        let pid: i32 = std::fs::read_to_string(state.join("controller.pid"))
            .expect("controller.pid")
            .trim()
            .parse()
            .expect("a pid in controller.pid");
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("SIGKILL");
        // Gone before the new one binds the same address and opens the same store (a
        // zombie still answers the probe until its parent, init, reaps it).
        let deadline = Instant::now() + Duration::from_secs(10);
        while nix::sys::signal::kill(pid, None).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let args: Vec<String> = std::fs::read_to_string(state.join("controller.args"))
            .expect("controller.args")
            .lines()
            .map(str::to_string)
            .collect();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(state.join("controller.log"))
            .expect("controller.log");
        let child = Command::new(TANDEM)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("restart the controller");
        std::fs::write(state.join("controller.pid"), format!("{}\n", child.id())).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.run(&["sinfo", "-h"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "the restarted controller does not answer\n{}",
                self.controller_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    }

    /// Waits for a file to exist and contain `needle`; returns its contents.
    pub fn wait_file(&self, path: &Path, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut text = String::new();
        while Instant::now() < deadline {
            text = std::fs::read_to_string(path).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{} never contained {needle:?}; it has {text:?}",
            path.display()
        );
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tandem-test-")
        .tempdir()
        .expect("temp dir")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(TANDEM)
            .args(["down", "--grace", "3", "--state-dir"])
            .arg(self.state_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `tandem links <bin>`: one link per command name, for argv[0] dispatch.
pub fn tandem_links(bin: &Path) -> Output {
    Command::new(TANDEM).arg("links").arg(bin).output().unwrap()
}

/// `tandem links` into `<parent>/bin`, which must succeed; returns that folder.
pub fn make_links(parent: &Path) -> PathBuf {
    let bin = parent.join("bin");
    let out = tandem_links(&bin);
    assert!(
        out.status.success(),
        "tandem links: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// Asserts a failed command printed exactly one `<cmd>: error: ...` line mentioning `needle`.
pub fn assert_one_line_error(out: &Output, cmd: &str, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr {stderr:?}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one error line, got {stderr:?}");
    assert!(
        lines[0].starts_with(&format!("{cmd}: error: ")),
        "want '{cmd}: error: ...', got {:?}",
        lines[0]
    );
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "error {:?} should mention {needle:?}",
        lines[0]
    );
}

/// A sacct record's ExitCode as the tables print it (`3:0`, `0:9`), from Slurm's
/// `exit_code` object.
pub fn exit_code(rec: &Value) -> String {
    let e = &rec["exit_code"];
    format!(
        "{}:{}",
        e["return_code"].as_i64().unwrap_or(0),
        e["signal"]["signal_id"].as_i64().unwrap_or(0)
    )
}

/// The GPUs a sacct record asked for (its `gres/gpu` TRES), 0 without.
pub fn gpus(rec: &Value) -> u64 {
    rec["tres"]["requested"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["type"] == "gres" && t["name"] == "gpu")
        .map_or(0, |t| t["count"].as_u64().unwrap_or(0))
}
