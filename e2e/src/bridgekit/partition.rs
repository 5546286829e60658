//! The time partition in bridge tests: the [`PartitionWatch`] samples, on its own thread,
//! which nodes run batch jobs (`squeue`) and which host bridged pods, and reports any
//! moment a node held both. Apart from the environment because it is an independent
//! observer with its own runtime and client.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::{BridgeEnv, list_bounded};
use crate::bounded::{CALL_LIMIT, output_within};

/// Expands a Slurm host list (`k[1-3,5],gpu-07`) into names.
pub fn hostnames(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let Some((prefix, rest)) = part.split_once('[') else {
            out.push(part.to_owned());
            continue;
        };
        let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
        for r in ranges.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let width = a.len();
            match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) => {
                    for n in a..=b {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
                _ => out.push(format!("{prefix}{r}{suffix}")),
            }
        }
    }
    out
}

/// What one node held at one observation: batch jobs and bridged pods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHolds {
    pub batch: BTreeSet<String>,
    pub pods: BTreeSet<String>,
}

/// What the partition watcher saw over a test.
#[derive(Debug, Default)]
pub struct PartitionReport {
    /// Observations made (each: pods, squeue, pods again).
    pub samples: usize,
    /// Every change of what a node held, in order: (ms since start, node, holds).
    pub changes: Vec<(u128, String, NodeHolds)>,
    /// Observations where a node surely held a batch job and a bridged pod at once.
    pub overlaps: Vec<String>,
    /// Nodes seen running batch work, and nodes seen hosting bridged pods (at any time).
    pub batch_nodes: BTreeSet<String>,
    pub pod_nodes: BTreeSet<String>,
}

impl PartitionReport {
    /// The change log, for failure messages.
    pub fn timeline(&self) -> String {
        self.changes
            .iter()
            .map(|(t, n, h)| format!("{t:>6} ms {n}: batch {:?} pods {:?}", h.batch, h.pods))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Asserts that no node ran batch work and a bridged pod at once, and that the watcher
    /// observed something.
    pub fn assert_no_overlap(&self) {
        assert!(
            self.overlaps.is_empty(),
            "batch work and bridged pods shared a node:\n{}\ntimeline:\n{}",
            self.overlaps.join("\n"),
            self.timeline()
        );
        assert!(self.samples > 0, "the watcher observed nothing");
    }
}

/// Watches one pool for a batch job and a bridged pod on one node at the same moment, in
/// its own thread (own runtime, own client), so a test's blocking CLI calls never pause it.
///
/// Each observation lists the bridged pods (bound, not finished), then reads the running
/// batch jobs from `squeue`, then lists the pods again: a pod present in both lists was on
/// its node for the whole `squeue` call, so a batch job `squeue` shows on that node ran at
/// the same moment as the pod. This never reports a false overlap however late a watch or
/// a process is, and it observes every change that lasts longer than one observation.
/// Placeholder jobs (named `namespace/owner`) are the pods' own and are not batch work.
pub struct PartitionWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<PartitionReport>>,
}

impl PartitionWatch {
    /// Stops watching; what was seen.
    pub fn finish(mut self) -> PartitionReport {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => panic!("the partition watcher panicked"),
        }
    }
}

impl Drop for PartitionWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl BridgeEnv {
    /// Starts the [`PartitionWatch`] of this pool.
    pub fn watch_partition(&self, server_url: &str) -> PartitionWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tandem, env) = (self.tandem.clone(), self.cli_env());
        let url = server_url.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("a runtime: {e}"));
            rt.block_on(partition_loop(url, tandem, env, stop2))
        });
        PartitionWatch {
            stop,
            thread: Some(thread),
        }
    }
}

/// Bridged pods on their nodes now: node -> `namespace/name`.
async fn pods_on_nodes(api: &Api<Pod>) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let pods = list_bounded(api, &ListParams::default()).await?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in pods {
        let Some(spec) = p.spec.as_ref() else {
            continue;
        };
        if spec.scheduler_name.as_deref() != Some("tandem") {
            continue;
        }
        let Some(node) = spec.node_name.clone() else {
            continue;
        };
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let name = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(""),
            p.metadata.name.as_deref().unwrap_or("")
        );
        out.entry(node).or_default().insert(name);
    }
    Some(out)
}

/// Batch jobs running (or completing) now: node -> job ids; `None` if squeue failed.
fn batch_on_nodes(
    tandem: &Path,
    env: &[(&'static str, String)],
) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let mut c = Command::new(tandem);
    c.args(["squeue", "-h", "-t", "R,CG", "-o", "%i|%j|%N"])
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = output_within(&mut c, CALL_LIMIT).ok()?;
    if !out.status.success() {
        return None;
    }
    let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut f = line.splitn(3, '|');
        let (Some(id), Some(name), Some(nodes)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if name.contains('/') {
            continue; // a placeholder: the pods' own job
        }
        for n in hostnames(nodes) {
            map.entry(n).or_default().insert(id.trim().to_owned());
        }
    }
    Some(map)
}

async fn partition_loop(
    url: String,
    tandem: PathBuf,
    env: Vec<(&'static str, String)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> PartitionReport {
    let mut report = PartitionReport::default();
    let Ok(uri) = url.parse() else {
        panic!("bad server url {url}");
    };
    let client = kube::Client::try_from(kube::Config::new(uri))
        .unwrap_or_else(|e| panic!("a client for the partition watcher: {e}"));
    let api: Api<Pod> = Api::all(client);
    let started = std::time::Instant::now();
    let mut last: BTreeMap<String, NodeHolds> = BTreeMap::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let before = pods_on_nodes(&api).await;
        let tandem2 = tandem.clone();
        let env2 = env.clone();
        let batch = tokio::task::spawn_blocking(move || batch_on_nodes(&tandem2, &env2))
            .await
            .ok()
            .flatten();
        let after = pods_on_nodes(&api).await;
        let (Some(before), Some(batch), Some(after)) = (before, batch, after) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        report.samples += 1;
        let mut now: BTreeMap<String, NodeHolds> = BTreeMap::new();
        for (node, jobs) in &batch {
            now.entry(node.clone()).or_default().batch = jobs.clone();
            report.batch_nodes.insert(node.clone());
            let held: BTreeSet<&String> = before
                .get(node)
                .into_iter()
                .flatten()
                .filter(|p| after.get(node).is_some_and(|a| a.contains(*p)))
                .collect();
            if !held.is_empty() {
                report.overlaps.push(format!(
                    "{} ms: {node} ran batch jobs {jobs:?} while pods {held:?} were on it",
                    started.elapsed().as_millis()
                ));
            }
        }
        for (node, pods) in &after {
            now.entry(node.clone()).or_default().pods = pods.clone();
            report.pod_nodes.insert(node.clone());
        }
        let nodes: BTreeSet<String> = now.keys().chain(last.keys()).cloned().collect();
        for n in nodes {
            let h = now.get(&n).cloned().unwrap_or_default();
            if last.get(&n).cloned().unwrap_or_default() != h {
                report
                    .changes
                    .push((started.elapsed().as_millis(), n.clone(), h));
            }
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::hostnames;

    #[test]
    fn host_lists_expand_as_slurm_writes_them() {
        assert_eq!(hostnames("k1"), vec!["k1"]);
        assert_eq!(hostnames("k[1-3]"), vec!["k1", "k2", "k3"]);
        assert_eq!(
            hostnames("gpu-[07,09-10],cpu1"),
            vec!["gpu-07", "gpu-09", "gpu-10", "cpu1"]
        );
        assert!(hostnames("").is_empty());
    }
}
