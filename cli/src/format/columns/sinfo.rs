//! sinfo's field table: a row (a partition and a group of its nodes), the `-o` letters,
//! their headers and how each renders; with sinfo's default layouts.

use super::spec::{Field, Format, FormatError, Piece, RenderCtx, parse_percent};
use crate::format::view::{NodeView, PartitionView, timestamp};

/// One line of sinfo: a partition and a group of its nodes (all nodes of one state, or one
/// node with `-N`).
#[derive(Debug, Clone)]
pub struct SinfoRow {
    pub partition: PartitionView,
    pub nodes: Vec<NodeView>,
}

impl SinfoRow {
    fn first(&self) -> Option<&NodeView> {
        self.nodes.first()
    }

    pub fn hostlist(&self) -> String {
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        tandem_sched::hostlist::compress(&names)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinfoField {
    Partition,
    PartitionName,
    Avail,
    TimeLimit,
    Nodes,
    StateCompact,
    State,
    NodeList,
    Cpus,
    CpusState,
    NodesState,
    Memory,
    Gres,
    Features,
    Reason,
    /// Who gave the reason (`%u`).
    ReasonUser,
    /// When the reason was given (`%H`).
    ReasonTime,
    /// Tandem's time partition: `batch` or `kube` (`%k`; a letter Slurm's sinfo leaves
    /// unused).
    Mode,
    /// Nodes a job may have (`%s`, `1-infinite`).
    JobSize,
    /// Root-only partition (`%r`): never in Tandem.
    Root,
    /// CPU oversubscription (`%h`): never in Tandem.
    Oversubscribe,
    /// Groups allowed (`%g`): Tandem limits partitions by account, not group.
    Groups,
}

pub const SINFO_DEFAULT: &str = "%#P %.5a %.10l %.6D %.6t %N";
pub const SINFO_LONG: &str = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N";
/// Slurm 22.05 right-aligns the partition here (`      n1  1    batch* idle`).
pub const SINFO_NODES: &str = "%#N %.6D %.#P %6t";
pub const SINFO_SUMMARY: &str = "%#P %.5a %.10l %.16F %N";
pub const SINFO_NODES_LONG: &str = "%#N %.6D %#P %.11T %.5k %.4c %.6m %.10G %.8f %E";
/// `sinfo -R`: why nodes are down or drained, by whom, since when.
pub const SINFO_REASONS: &str = "%20E %9u %19H %N";

impl SinfoField {
    pub fn from_letter(c: char) -> Option<SinfoField> {
        use SinfoField::*;
        Some(match c {
            'P' => Partition,
            'R' => PartitionName,
            'a' => Avail,
            'l' => TimeLimit,
            'D' => Nodes,
            't' => StateCompact,
            'T' => State,
            'N' => NodeList,
            'c' => Cpus,
            'C' => CpusState,
            'F' => NodesState,
            'm' => Memory,
            'G' => Gres,
            'f' => Features,
            'E' => Reason,
            'u' => ReasonUser,
            'H' => ReasonTime,
            'k' => Mode,
            's' => JobSize,
            'r' => Root,
            'h' => Oversubscribe,
            'g' => Groups,
            _ => return None,
        })
    }
}

impl Field<SinfoRow> for SinfoField {
    fn header(self) -> &'static str {
        use SinfoField::*;
        match self {
            Partition | PartitionName => "PARTITION",
            Avail => "AVAIL",
            TimeLimit => "TIMELIMIT",
            Nodes => "NODES",
            StateCompact | State => "STATE",
            NodeList => "NODELIST",
            Cpus => "CPUS",
            CpusState => "CPUS(A/I/O/T)",
            NodesState => "NODES(A/I/O/T)",
            Memory => "MEMORY",
            Gres => "GRES",
            Features => "AVAIL_FEATURES",
            Reason => "REASON",
            ReasonUser => "USER",
            ReasonTime => "TIMESTAMP",
            Mode => "MODE",
            JobSize => "JOB_SIZE",
            Root => "ROOT",
            Oversubscribe => "OVERSUBS",
            Groups => "GROUPS",
        }
    }

    fn render(self, r: &SinfoRow, ctx: &RenderCtx) -> String {
        use SinfoField::*;
        let down = |n: &NodeView| {
            let s = n.state.as_str();
            s.starts_with("DOWN") || s.starts_with("DRAIN")
        };
        match self {
            Partition => r.partition.display_name(),
            PartitionName => r.partition.name.clone(),
            Avail => r.partition.state.to_ascii_lowercase(),
            TimeLimit => r.partition.time_limit(),
            Nodes => r.nodes.len().to_string(),
            StateCompact => r.first().map_or("n/a".to_string(), NodeView::state_compact),
            State => r
                .first()
                .map_or("n/a".to_string(), |n| n.state.to_ascii_lowercase()),
            NodeList => r.hostlist(),
            Cpus => r.first().map_or(0, |n| n.cpus).to_string(),
            CpusState => {
                let (mut a, mut i, mut o, mut t) = (0, 0, 0, 0);
                for n in &r.nodes {
                    t += n.cpus;
                    if down(n) {
                        o += n.cpus;
                    } else {
                        a += n.cpus_alloc;
                        i += n.cpus.saturating_sub(n.cpus_alloc);
                    }
                }
                format!("{a}/{i}/{o}/{t}")
            }
            NodesState => {
                let (mut a, mut i, mut o) = (0, 0, 0);
                for n in &r.nodes {
                    if down(n) {
                        o += 1;
                    } else if n.cpus_alloc > 0 || n.gpus_alloc > 0 {
                        a += 1;
                    } else {
                        i += 1;
                    }
                }
                format!("{a}/{i}/{o}/{}", r.nodes.len())
            }
            Memory => r.first().map_or(0, |n| n.mem_mb).to_string(),
            Gres => r.first().map_or("(null)".to_string(), NodeView::gres),
            Features => r.first().map_or("(null)".to_string(), |n| {
                if n.features.is_empty() {
                    "(null)".to_string()
                } else {
                    n.features.join(",")
                }
            }),
            Reason => r.first().map_or("none".to_string(), |n| {
                if n.reason.is_empty() {
                    "none".to_string()
                } else {
                    n.reason.clone()
                }
            }),
            // Slurm's words for a node nobody gave a reason: `Unknown`.
            ReasonUser => r
                .first()
                .and_then(|n| n.reason_by.as_ref())
                .map_or("Unknown".to_string(), |(u, _)| u.clone()),
            ReasonTime => r
                .first()
                .and_then(|n| n.reason_by.as_ref())
                .map_or("Unknown".to_string(), |(_, t)| {
                    timestamp(Some(*t), ctx.utc_offset_s)
                }),
            Mode => r.first().map_or("n/a", |n| n.mode).to_string(),
            JobSize => match r.partition.max_nodes {
                None => "1-infinite".to_string(),
                Some(n) => format!("1-{n}"),
            },
            Root => "no".to_string(),
            Oversubscribe => "NO".to_string(),
            Groups => "all".to_string(),
        }
    }
}

pub fn sinfo_format(spec: &str) -> Result<Format<SinfoField>, FormatError> {
    parse_percent(spec, SinfoField::from_letter)
}

impl Format<SinfoField> {
    /// Whether the format prints the mode: then rows group by state and mode, as Slurm
    /// splits rows by every field it prints.
    pub fn shows_mode(&self) -> bool {
        self.pieces.iter().any(|p| {
            matches!(
                p,
                Piece::Field {
                    field: SinfoField::Mode,
                    ..
                }
            )
        })
    }
}
