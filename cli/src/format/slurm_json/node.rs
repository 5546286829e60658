//! The v0.0.38 node and partition objects that `sinfo --json` and `scontrol show
//! node|partition --json` print, from the views.

use serde::Serialize;

use super::{minutes, unset_zero};
use crate::format::columns::SinfoRow;
use crate::format::view::{NodeView, PartitionView};

/// A node as sinfo and scontrol show it (v0.0.38 `node`).
#[derive(Debug, Serialize)]
pub struct Node<'a> {
    pub active_features: String,
    pub address: &'a str,
    pub alloc_cpus: u32,
    pub alloc_memory: u64,
    /// `uname -m` as the worker reported it; empty until it registers.
    pub architecture: &'a str,
    pub boards: u32,
    pub boot_time: i64,
    /// Cores per socket: Slurm's inference for a node declared by CPU count (see `sockets`).
    pub cores: u32,
    pub cpus: u32,
    pub features: String,
    /// `gpu:8`, `gpu:h100:8`; empty without GPUs.
    pub gres: String,
    pub gres_used: String,
    pub hostname: &'a str,
    pub idle_cpus: u32,
    /// Tandem's time partition, `batch` or `kube` (not in Slurm's schema).
    pub mode: &'static str,
    pub name: &'a str,
    pub operating_system: &'a str,
    pub partitions: &'a [String],
    /// The worker's step-service port; 0 until it registers.
    pub port: u32,
    pub real_memory: u64,
    pub reason: &'a str,
    /// When the worker started (`0` unknown).
    pub slurmd_start_time: i64,
    /// The worker's version: Tandem's node daemon stands where slurmd would.
    pub slurmd_version: &'a str,
    /// One socket per CPU, one core and one thread each: Tandem keeps no CPU topology.
    pub sockets: u32,
    /// Base state, lower case: `idle`, `mixed`, `allocated`, `down`.
    pub state: &'static str,
    /// `DRAIN` while draining or drained.
    pub state_flags: Vec<&'static str>,
    pub temporary_disk: u32,
    pub threads: u32,
    pub tres: String,
    /// `null` when nothing is allocated.
    pub tres_used: Option<String>,
    pub weight: u32,
}

/// `gpu:N` or `gpu:TYPE:N`.
fn gpu_gres(count: u32, gpu_type: &str) -> String {
    match gpu_type {
        "" => format!("gpu:{count}"),
        t => format!("gpu:{t}:{count}"),
    }
}

/// `cpu=64,mem=250G,gres/gpu=8`, leaving out what is zero.
fn node_tres(cpus: u32, mem_mb: u64, gpus: u32) -> String {
    let mut parts = Vec::new();
    if cpus > 0 {
        parts.push(format!("cpu={cpus}"));
    }
    if mem_mb > 0 {
        parts.push(format!("mem={}", tandem_sched::tres::format_mem_mb(mem_mb)));
    }
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    parts.join(",")
}

impl<'a> Node<'a> {
    pub fn from_view(n: &'a NodeView) -> Node<'a> {
        // Slurm keeps draining as a flag on the state the node's use gives it.
        let (base, drain) = n.base_state();
        let state = match base {
            "IDLE" => "idle",
            "MIXED" => "mixed",
            "ALLOCATED" => "allocated",
            "DOWN" => "down",
            "COMPLETING" => "completing",
            "FUTURE" => "future",
            _ => "unknown",
        };
        let used = node_tres(n.cpus_alloc, n.mem_alloc_mb, n.gpus_alloc);
        let (host, port) = n.host_and_port().unwrap_or((n.address.as_str(), ""));
        Node {
            active_features: n.features.join(","),
            address: host,
            alloc_cpus: n.cpus_alloc,
            alloc_memory: n.mem_alloc_mb,
            architecture: &n.arch,
            boards: 1,
            boot_time: unset_zero(n.boot_time),
            cores: 1,
            cpus: n.cpus,
            features: n.features.join(","),
            gres: if n.gpus > 0 {
                gpu_gres(n.gpus, &n.gpu_type)
            } else {
                String::new()
            },
            gres_used: if n.gpus > 0 {
                gpu_gres(n.gpus_alloc, &n.gpu_type)
            } else {
                String::new()
            },
            hostname: if n.hostname.is_empty() {
                &n.name
            } else {
                &n.hostname
            },
            idle_cpus: n.cpus.saturating_sub(n.cpus_alloc),
            mode: n.mode,
            name: &n.name,
            operating_system: &n.os,
            partitions: &n.partitions,
            port: port.parse().unwrap_or(0),
            real_memory: n.mem_mb,
            reason: &n.reason,
            slurmd_start_time: unset_zero(n.worker_start_time),
            slurmd_version: &n.version,
            sockets: n.cpus,
            state,
            state_flags: if drain { vec!["DRAIN"] } else { Vec::new() },
            temporary_disk: 0,
            threads: 1,
            tres: node_tres(n.cpus, n.mem_mb, n.gpus),
            tres_used: (!used.is_empty()).then_some(used),
            weight: 1,
        }
    }
}

/// sinfo's nodes: each node once.
pub fn sinfo_nodes(rows: &[SinfoRow]) -> Vec<Node<'_>> {
    let mut seen = std::collections::HashSet::new();
    let mut nodes: Vec<&NodeView> = rows
        .iter()
        .flat_map(|r| &r.nodes)
        .filter(|n| seen.insert(n.name.as_str()))
        .collect();
    // By name (node-2 before node-10), as Slurm lists its node table, not in the rows'
    // state order.
    nodes.sort_by(|a, b| {
        crate::cmd::sinfo::name_key(&a.name).cmp(&crate::cmd::sinfo::name_key(&b.name))
    });
    nodes.into_iter().map(Node::from_view).collect()
}

/// A partition as scontrol shows it (v0.0.38 `partition`).
#[derive(Debug, Serialize)]
pub struct Partition<'a> {
    /// `null`: every account may use it.
    pub allowed_accounts: Option<String>,
    /// Minutes, `null` when unset.
    pub default_time_limit: Option<u64>,
    /// `default` on the default partition.
    pub flags: Vec<&'static str>,
    /// Minutes, `null` = UNLIMITED.
    pub max_time_limit: Option<u64>,
    pub maximum_nodes_per_job: Option<u32>,
    pub name: &'a str,
    pub nodes: String,
    pub priority_job_factor: u32,
    pub priority_tier: u32,
    pub state: &'a str,
    pub total_cpus: u32,
    pub total_nodes: u32,
}

impl<'a> Partition<'a> {
    pub fn from_view(p: &'a PartitionView) -> Partition<'a> {
        let names: Vec<&str> = p.nodes.iter().map(String::as_str).collect();
        Partition {
            allowed_accounts: (!p.allowed_accounts.is_empty())
                .then(|| p.allowed_accounts.join(",")),
            default_time_limit: minutes(p.default_time_s),
            flags: if p.is_default {
                vec!["default"]
            } else {
                Vec::new()
            },
            max_time_limit: minutes(p.max_time_s),
            maximum_nodes_per_job: p.max_nodes,
            name: &p.name,
            nodes: tandem_sched::hostlist::compress(&names),
            priority_job_factor: p.priority_job_factor,
            priority_tier: p.priority_tier,
            state: &p.state,
            total_cpus: p.total_cpus,
            total_nodes: p.nodes.len() as u32,
        }
    }
}
