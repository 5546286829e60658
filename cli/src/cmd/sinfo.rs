//! `sinfo`: partitions and their nodes, grouped by state as Slurm groups them.

use clap::Parser;
use tandem_proto::v1::{ListNodesRequest, ListPartitionsRequest};

use crate::Exit;
use crate::client::{Client, RpcResult as _};
use crate::format::columns::{
    SINFO_LONG, SINFO_NODES, SINFO_NODES_LONG, SINFO_REASONS, SINFO_SUMMARY, SinfoRow, sinfo_format,
};
use crate::format::view::{NodeView, PartitionView};
use crate::format::{Columns, Human, Json, Output};

/// Show partitions and node states.
#[derive(Debug, Parser)]
#[command(
    name = "sinfo",
    version,
    infer_long_args = true,
    disable_help_flag = true
)]
pub struct Args {
    /// Print help (-h is --noheader, as in Slurm).
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// One line per node instead of per partition and state.
    #[arg(short = 'N', long = "Node")]
    pub node_oriented: bool,
    /// Long format.
    #[arg(short = 'l', long)]
    pub long: bool,
    /// One line per partition: node counts by state (allocated/idle/other/total).
    #[arg(short = 's', long = "summarize")]
    pub summarize: bool,
    /// Why nodes are down or drained, who said so and when.
    #[arg(short = 'R', long = "list-reasons")]
    pub list_reasons: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_name = "PARTITIONS", action = clap::ArgAction::Set)]
    pub partitions: Vec<String>,
    /// Only these nodes (host list).
    #[arg(short = 'n', long = "nodes", value_name = "HOSTS")]
    pub nodes: Option<String>,
    /// Only nodes in these states (idle, mix, alloc, down, drain, ...).
    #[arg(short = 't', long = "states", value_name = "STATES", action = clap::ArgAction::Set)]
    pub states: Vec<String>,
    /// Columns as %-fields, e.g. "%P %a %l %D %t %N"; "%k" is the node's mode (batch or kube).
    #[arg(short = 'o', long = "format", value_name = "FORMAT")]
    pub format: Option<String>,
    /// Do not print the header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(args: Args) -> Exit {
    if args.long && args.format.is_some() {
        // Slurm's words (it exits there too).
        anyhow::bail!(
            "Options -o(--format) and -l(--long) are mutually exclusive. Please remove one \
             and retry."
        );
    }
    let spec = match (&args.format, args.summarize, args.node_oriented, args.long) {
        (Some(f), ..) => f.clone(),
        (None, ..) if args.list_reasons => SINFO_REASONS.to_string(),
        (None, true, ..) => SINFO_SUMMARY.to_string(),
        (None, false, true, true) => SINFO_NODES_LONG.to_string(),
        (None, false, true, false) => SINFO_NODES.to_string(),
        (None, false, false, true) => SINFO_LONG.to_string(),
        (None, false, false, false) => crate::format::columns::SINFO_DEFAULT.to_string(),
    };
    let by_mode = sinfo_format(&spec)?.shows_mode();
    let output: Box<dyn Output> = if args.json {
        Box::new(Json)
    } else {
        Box::new(Human::new(Some(Columns::Percent(spec)), !args.noheader))
    };
    if let Some(n) = &args.nodes {
        tandem_sched::hostlist::expand(n)?;
    }
    let mut client = Client::connect().await?;
    let parts = client
        .nodes
        .list_partitions(ListPartitionsRequest {})
        .await
        .rpc()?;
    let nodes = client
        .nodes
        .list_nodes(ListNodesRequest {
            nodes: args.nodes.clone().unwrap_or_default(),
            partition: String::new(),
        })
        .await
        .rpc()?;
    let parts: Vec<PartitionView> = parts
        .partitions
        .iter()
        .map(PartitionView::from_partition)
        .collect();
    let nodes: Vec<NodeView> = nodes.nodes.iter().map(NodeView::from_node).collect();
    let wanted_parts = super::split_commas(&args.partitions);
    let wanted_states: Vec<String> = super::split_commas(&args.states)
        .into_iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let grouping = match (args.node_oriented, args.summarize) {
        _ if args.list_reasons => Grouping::Reason,
        (true, _) => Grouping::Node,
        (false, true) => Grouping::Partition,
        (false, false) if by_mode => Grouping::StateAndMode,
        (false, false) => Grouping::State,
    };
    let rows = group(&parts, &nodes, &wanted_parts, &wanted_states, grouping);
    let mut text = output.sinfo(&rows)?;
    if args.long && !args.noheader && !args.json {
        text.insert_str(
            0,
            &format!("{}\n", crate::clock::long_listing_time(crate::clock::now())),
        );
    }
    crate::emit(&text)?;
    Ok(0)
}

/// What one row of `sinfo` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// The nodes of a partition in one state (Slurm's default).
    State,
    /// The same, split by mode too (a format that prints `%k`).
    StateAndMode,
    /// A whole partition (`-s`).
    Partition,
    /// One node (`-N`).
    Node,
    /// The down and drained nodes that share a reason, its author and its time (`-R`).
    Reason,
}

/// Rows in partition order; within a partition, one row per node state (and mode) in
/// first-seen order, one for the whole partition, or one per node.
pub fn group(
    parts: &[PartitionView],
    nodes: &[NodeView],
    wanted_parts: &[String],
    wanted_states: &[String],
    grouping: Grouping,
) -> Vec<SinfoRow> {
    let node_oriented = grouping == Grouping::Node;
    let by_mode = grouping == Grouping::StateAndMode;
    let state_ok = |n: &NodeView| wanted_states.is_empty() || in_states(n, wanted_states);
    if grouping == Grouping::Reason {
        return reason_rows(parts, nodes, wanted_parts, &state_ok);
    }
    let mut rows = Vec::new();
    for p in parts {
        if !wanted_parts.is_empty() && !wanted_parts.contains(&p.name) {
            continue;
        }
        let members: Vec<&NodeView> = nodes
            .iter()
            .filter(|n| p.nodes.contains(&n.name) || n.partitions.contains(&p.name))
            .filter(|n| state_ok(n))
            .collect();
        if node_oriented {
            rows.extend(members.into_iter().map(|n| SinfoRow {
                partition: p.clone(),
                nodes: vec![n.clone()],
            }));
            continue;
        }
        let mut groups: Vec<((String, &str), Vec<NodeView>)> = Vec::new();
        for n in members {
            let key = match grouping {
                Grouping::Partition => (String::new(), ""),
                _ => (n.state_compact(), if by_mode { n.mode } else { "" }),
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, g)) => g.push(n.clone()),
                None => groups.push((key, vec![n.clone()])),
            }
        }
        if groups.is_empty() && wanted_states.is_empty() {
            // Slurm still lists a partition without nodes.
            rows.push(SinfoRow {
                partition: p.clone(),
                nodes: Vec::new(),
            });
        }
        if grouping != Grouping::Partition {
            // Slurm's order (`#P,-t`): within a partition, states by decreasing value,
            // drain (a flag above every base state) first. The sort is stable.
            groups.sort_by_key(|(_, g)| std::cmp::Reverse(g.first().map_or(0, state_rank)));
        }
        rows.extend(groups.into_iter().map(|(_, nodes)| SinfoRow {
            partition: p.clone(),
            nodes,
        }));
    }
    if node_oriented {
        // Slurm 22.05's `sinfo -N` lists nodes by name across partitions (n1 batch, ...,
        // n5 batch, n5 debug), numbers in numeric order; the controller's order is not
        // that. The sort is stable: a node's partitions stay in partition order.
        fn first_name(r: &SinfoRow) -> Option<(&str, u64, &str)> {
            r.nodes.first().map(|n| name_key(&n.name))
        }
        rows.sort_by(|a, b| first_name(a).cmp(&first_name(b)));
    }
    rows
}

/// Whether `-t` asks for `n`: by its own state (`drain`, `drng`, `idle`, `idle+drain`'s
/// long name), by the state its use gives it under the drain flag (a drained idle node is
/// `idle` too, as in Slurm), or by the flag (`drain` takes draining nodes as well).
fn in_states(n: &NodeView, wanted: &[String]) -> bool {
    let (base, drain) = n.base_state();
    let base_names: &[&str] = match base {
        "IDLE" => &["idle"],
        "MIXED" => &["mix", "mixed"],
        "ALLOCATED" => &["alloc", "allocated"],
        "DOWN" => &["down"],
        "COMPLETING" => &["comp", "completing"],
        "FUTURE" => &["futr", "future"],
        _ => &[],
    };
    wanted.iter().any(|s| {
        *s == n.state_compact()
            || *s == n.state.to_ascii_lowercase()
            || base_names.contains(&s.as_str())
            || (drain && s == "drain")
    })
}

/// Slurm's numeric node state (its enum, `NODE_STATE_DRAIN` and `NODE_STATE_COMPLETING`
/// as the flags they are there), which sinfo's default order sorts by.
fn state_rank(n: &NodeView) -> u32 {
    let (base, drain) = n.base_state();
    let value = match base {
        "DOWN" => 1,
        "IDLE" => 2,
        "ALLOCATED" => 3,
        "MIXED" => 5,
        "FUTURE" => 6,
        "COMPLETING" => 0x400 + 3,
        _ => 0,
    };
    value + if drain { 0x200 } else { 0 }
}

/// `sinfo -R`: each down or drained node with a reason once, whatever its partitions,
/// grouped by reason, author and time, in node order.
fn reason_rows(
    parts: &[PartitionView],
    nodes: &[NodeView],
    wanted_parts: &[String],
    state_ok: &dyn Fn(&NodeView) -> bool,
) -> Vec<SinfoRow> {
    let in_wanted = |n: &NodeView| {
        wanted_parts.is_empty() || n.partitions.iter().any(|p| wanted_parts.contains(p))
    };
    let mut listed: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| !n.reason.is_empty())
        .filter(|n| {
            let s = n.state.as_str();
            s.starts_with("DOWN") || s.starts_with("DRAIN") || s.contains("+DRAIN")
        })
        .filter(|n| in_wanted(n) && state_ok(n))
        .collect();
    listed.sort_by(|a, b| name_key(&a.name).cmp(&name_key(&b.name)));
    let mut groups: Vec<(&NodeView, Vec<NodeView>)> = Vec::new();
    for n in listed {
        match groups
            .iter_mut()
            .find(|(k, _)| k.reason == n.reason && k.reason_by == n.reason_by)
        {
            Some((_, g)) => g.push(n.clone()),
            None => groups.push((n, vec![n.clone()])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(first, nodes)| {
            // A row names a partition only for `%P`; the node's own, else the first.
            let partition = parts
                .iter()
                .find(|p| first.partitions.contains(&p.name))
                .or_else(|| parts.first())?
                .clone();
            Some(SinfoRow { partition, nodes })
        })
        .collect()
}

/// `node-10` after `node-9`: the name without its trailing digits, then their value.
pub(crate) fn name_key(name: &str) -> (&str, u64, &str) {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let number = name[stem.len()..].parse().unwrap_or(0);
    (stem, number, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::columns::RenderCtx;
    use crate::format::columns::{SINFO_DEFAULT, SINFO_LONG, SINFO_NODES, SINFO_SUMMARY};
    use tandem_proto::v1::{NodeInfo, PartitionInfo, Tres};

    fn node(name: &str, state: &str) -> NodeView {
        NodeView::from_node(&NodeInfo {
            name: name.into(),
            state: state.into(),
            total: Some(Tres {
                cpus: 8,
                mem_mb: 1024,
                gpus: 8,
                gpu_type: String::new(),
            }),
            partitions: vec!["batch".into()],
            ..NodeInfo::default()
        })
    }

    /// Slurm 22.05, one partition `batch` (default, up, no limits) of idle nodes n1-n2,
    /// `sinfo -s`, `sinfo -s -N`, `sinfo -N` and `sinfo -l` (after its date line;
    /// `sinfo -N` pads its last column, as Tandem does):
    ///
    /// ```text
    /// PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST
    /// batch*       up   infinite          0/2/0/2 n[1-2]
    /// batch*       up   infinite          0/1/0/1 n1
    /// NODELIST   NODES PARTITION STATE
    /// n1             1    batch* idle
    /// PARTITION AVAIL  TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       STATE NODELIST
    /// batch*       up   infinite 1-infinite   no       NO        all      2        idle n[1-2]
    /// ```
    #[test]
    fn summary_node_and_long_views_read_as_slurms() {
        let p = PartitionView::from_partition(&PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            nodes: vec!["n1".into(), "n2".into()],
            ..PartitionInfo::default()
        });
        let nodes = vec![node("n1", "IDLE"), node("n2", "IDLE")];
        let ctx = RenderCtx::default();
        let render = |spec: &str, grouping: Grouping| {
            let f = sinfo_format(spec).unwrap();
            let rows = group(std::slice::from_ref(&p), &nodes, &[], &[], grouping);
            std::iter::once(f.header())
                .chain(rows.iter().map(|r| f.row(r, &ctx)))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            render(SINFO_SUMMARY, Grouping::Partition),
            [
                "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST",
                "batch*       up   infinite          0/2/0/2 n[1-2]",
            ]
        );
        assert_eq!(
            render(SINFO_SUMMARY, Grouping::Node)[1],
            "batch*       up   infinite          0/1/0/1 n1"
        );
        assert_eq!(
            render(SINFO_NODES, Grouping::Node)[..2],
            [
                // The last column keeps its width, as Slurm prints it.
                "NODELIST   NODES PARTITION STATE ",
                "n1             1    batch* idle  "
            ]
        );
        assert_eq!(
            render(SINFO_LONG, Grouping::State),
            [
                "PARTITION AVAIL  TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       \
                 STATE NODELIST",
                "batch*       up   infinite 1-infinite   no       NO        all      2        \
                 idle n[1-2]",
            ]
        );
    }

    #[test]
    fn default_view_groups_nodes_by_state() {
        let p = PartitionView::from_partition(&PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            nodes: (1..=4).map(|i| format!("node-{i}")).collect(),
            ..PartitionInfo::default()
        });
        let nodes = vec![
            node("node-1", "ALLOCATED"),
            node("node-2", "IDLE"),
            node("node-3", "ALLOCATED"),
            node("node-4", "IDLE"),
        ];
        let rows = group(&[p], &nodes, &[], &[], Grouping::State);
        let f = sinfo_format(SINFO_DEFAULT).unwrap();
        let ctx = RenderCtx::default();
        assert_eq!(
            f.header(),
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST"
        );
        let lines: Vec<String> = rows.iter().map(|r| f.row(r, &ctx)).collect();
        assert_eq!(
            lines,
            [
                "batch*       up   infinite      2  alloc node-[1,3]",
                "batch*       up   infinite      2   idle node-[2,4]",
            ]
        );
        let idle_only = group(
            &[rows[0].partition.clone()],
            &nodes,
            &[],
            &["idle".into()],
            Grouping::Node,
        );
        assert_eq!(idle_only.len(), 2);
    }

    /// Slurm 22.05 with n1 running a job, n8 drained and the rest idle: `sinfo` lists
    /// `drain n8`, `mix n1`, `idle n[2-7]` (states by decreasing value, drain first), and
    /// `sinfo -t idle` keeps the drained idle node: `drain n8`, `idle n[2-7]`; `-t drain`
    /// takes draining nodes too.
    #[test]
    fn rows_go_drain_first_and_a_drained_idle_node_is_idle() {
        let p = PartitionView::from_partition(&PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            nodes: (1..=8).map(|i| format!("node-{i}")).collect(),
            ..PartitionInfo::default()
        });
        let nodes: Vec<NodeView> = (1..=8)
            .map(|i| {
                let state = match i {
                    1 => "MIXED",
                    8 => "DRAINED",
                    _ => "IDLE",
                };
                node(&format!("node-{i}"), state)
            })
            .collect();
        let f = sinfo_format(SINFO_DEFAULT).unwrap();
        let ctx = RenderCtx::default();
        let lines = |states: &[&str]| {
            let states: Vec<String> = states.iter().map(|s| s.to_string()).collect();
            group(
                std::slice::from_ref(&p),
                &nodes,
                &[],
                &states,
                Grouping::State,
            )
            .iter()
            .map(|r| f.row(r, &ctx))
            .collect::<Vec<_>>()
        };
        assert_eq!(
            lines(&[]),
            [
                "batch*       up   infinite      1  drain node-8",
                "batch*       up   infinite      1    mix node-1",
                "batch*       up   infinite      6   idle node-[2-7]",
            ]
        );
        assert_eq!(
            lines(&["idle"]),
            [
                "batch*       up   infinite      1  drain node-8",
                "batch*       up   infinite      6   idle node-[2-7]",
            ]
        );
        assert_eq!(
            lines(&["drain"]),
            ["batch*       up   infinite      1  drain node-8"]
        );
        assert_eq!(
            lines(&["mix"]),
            ["batch*       up   infinite      1    mix node-1"]
        );
    }

    #[test]
    fn node_oriented_rows_go_by_node_name_across_partitions() {
        let part = |name: &str, nodes: &[&str]| {
            PartitionView::from_partition(&PartitionInfo {
                name: name.into(),
                state: "UP".into(),
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                ..PartitionInfo::default()
            })
        };
        let parts = [
            part("batch", &["node-10", "node-9", "node-2"]),
            part("debug", &["node-9"]),
        ];
        let nodes = vec![
            node("node-10", "IDLE"),
            node("node-9", "IDLE"),
            node("node-2", "IDLE"),
        ];
        let rows = group(&parts, &nodes, &[], &[], Grouping::Node);
        let got: Vec<(String, String)> = rows
            .iter()
            .map(|r| (r.nodes[0].name.clone(), r.partition.name.clone()))
            .collect();
        let want = [
            ("node-2", "batch"),
            ("node-9", "batch"),
            ("node-9", "debug"),
            ("node-10", "batch"),
        ];
        assert_eq!(got, want.map(|(n, p)| (n.to_string(), p.to_string())));
    }

    #[test]
    fn mode_column_splits_rows_by_mode() {
        use tandem_proto::v1::NodeMode;
        let moded = |name: &str, mode: NodeMode| {
            NodeView::from_node(&NodeInfo {
                name: name.into(),
                state: "IDLE".into(),
                mode: mode as i32,
                partitions: vec!["batch".into()],
                ..NodeInfo::default()
            })
        };
        let p = PartitionView::from_partition(&PartitionInfo {
            name: "batch".into(),
            is_default: true,
            state: "UP".into(),
            nodes: (1..=3).map(|i| format!("node-{i}")).collect(),
            ..PartitionInfo::default()
        });
        let nodes = vec![
            moded("node-1", NodeMode::Kube),
            moded("node-2", NodeMode::Batch),
            moded("node-3", NodeMode::Kube),
        ];
        let f = sinfo_format("%P %t %.5k %N").unwrap();
        assert!(f.shows_mode());
        assert!(!sinfo_format(SINFO_DEFAULT).unwrap().shows_mode());
        assert_eq!(f.header(), "PARTITION STATE  MODE NODELIST");
        let ctx = RenderCtx::default();
        let rows = group(
            std::slice::from_ref(&p),
            &nodes,
            &[],
            &[],
            Grouping::StateAndMode,
        );
        let lines: Vec<String> = rows.iter().map(|r| f.row(r, &ctx)).collect();
        assert_eq!(
            lines,
            ["batch* idle  kube node-[1,3]", "batch* idle batch node-2"]
        );
        // Without the column, one idle row, as before.
        assert_eq!(
            group(std::slice::from_ref(&p), &nodes, &[], &[], Grouping::State).len(),
            1
        );
        // `sinfo -N -l` shows each node's mode.
        let long = sinfo_format(crate::format::columns::SINFO_NODES_LONG).unwrap();
        assert!(long.header().contains("MODE"), "{}", long.header());
        let rows = group(&[p], &nodes, &[], &[], Grouping::Node);
        assert!(long.row(&rows[0], &ctx).contains(" kube "));
        assert!(long.row(&rows[1], &ctx).contains("batch "));
    }
}
