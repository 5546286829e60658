//! Column specifications: `squeue -o "%.18i %.9P %j"`, `squeue -O jobid:10,name`,
//! `sinfo -o "%P %a %D"` and `sacct --format JobID,JobName%30`, parsed into lists of fields
//! with width and alignment. Each field renders from a view ([`super::view`]), the same view
//! the JSON output reads.

use std::borrow::Cow;

use thiserror::Error;

use super::table::{Align, fit_into};
use super::view::{JobView, NodeView, PartitionView, timestamp};

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    #[error("invalid format specification {spec:?}: unknown field {field:?}")]
    UnknownField { spec: String, field: String },
    #[error("invalid format specification {spec:?}: {problem}")]
    Malformed { spec: String, problem: &'static str },
}

/// Widest column a format may ask for: a width is padding, and padding of gigabytes per
/// cell is a mistake, not a layout.
pub const MAX_WIDTH: usize = 1024;

/// A `%20` / `:20` width: a number up to [`MAX_WIDTH`].
fn parse_width(spec: &str, digits: &str) -> Result<usize, FormatError> {
    match digits.parse::<usize>() {
        Ok(w) if w <= MAX_WIDTH => Ok(w),
        Ok(_) => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be at most 1024",
        }),
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be at most 1024",
        }),
        Err(_) => Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "a width must be a number",
        }),
    }
}

/// One piece of a format: literal text, or a field with its width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<F> {
    Text(String),
    Field {
        field: F,
        width: Option<usize>,
        align: Align,
    },
}

/// A parsed format: pieces printed in order, per row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format<F> {
    pub pieces: Vec<Piece<F>>,
    /// sacct marks cut values with `+`; squeue and sinfo cut silently.
    pub trunc_mark: bool,
}

/// Something a column can show about a row of type `R`.
pub trait Field<R>: Copy {
    fn header(self) -> &'static str;
    fn render(self, row: &R, ctx: &RenderCtx) -> String;
    /// [`Field::render`], borrowing text the row already holds: squeue over 100,000 jobs
    /// renders close to a million cells, and a string allocated for each one shows.
    fn cell<'r>(self, row: &'r R, ctx: &RenderCtx) -> Cow<'r, str> {
        Cow::Owned(self.render(row, ctx))
    }
}

/// What rendering needs besides the row.
#[derive(Debug, Clone, Default)]
pub struct RenderCtx {
    pub utc_offset_s: i32,
    /// `sacct --units`: memory sizes in this unit (`K`, `M`, `G`, `T`, `P`).
    pub mem_unit: Option<char>,
    /// sacct's `Cluster`.
    pub cluster: String,
    /// Group names by gid (sacct's `Group`), looked up once per gid before rendering; a
    /// gid missing here prints as its number.
    pub groups: std::collections::HashMap<u32, String>,
}

impl<F: Copy> Format<F> {
    pub fn header<R>(&self) -> String
    where
        F: Field<R>,
    {
        let mut out = String::new();
        // A header too long for its column is cut without the mark values get (sacct's
        // `TimelimitR`).
        self.line_into(&mut out, false, |f| Cow::Borrowed(f.header()));
        out
    }

    pub fn row<R>(&self, row: &R, ctx: &RenderCtx) -> String
    where
        F: Field<R>,
    {
        let mut out = String::with_capacity(128);
        self.row_into(&mut out, row, ctx);
        out
    }

    /// [`Format::row`] appended to `out`, without a string per row or per cell.
    pub fn row_into<R>(&self, out: &mut String, row: &R, ctx: &RenderCtx)
    where
        F: Field<R>,
    {
        self.line_into(out, self.trunc_mark, |f| f.cell(row, ctx));
    }

    /// The fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = F> + '_ {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Field { field, .. } => Some(*field),
            Piece::Text(_) => None,
        })
    }

    /// sacct's dashed line under the header.
    pub fn rule<R>(&self) -> String
    where
        F: Field<R>,
    {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field { width, field, .. } => {
                    let w = width.unwrap_or_else(|| Field::<R>::header(*field).len());
                    out.push_str(&"-".repeat(w));
                }
            }
        }
        out
    }

    /// Fields joined by `sep` without padding (`sacct -P`, `squeue` JSON-less machine use).
    pub fn delimited<R>(&self, row: Option<&R>, ctx: &RenderCtx, sep: &str) -> String
    where
        F: Field<R>,
    {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Field { field, .. } => Some(match row {
                    Some(r) => field.render(r, ctx),
                    None => Field::<R>::header(*field).to_string(),
                }),
                Piece::Text(_) => None,
            })
            .collect::<Vec<_>>()
            .join(sep)
    }

    fn line_into<'r>(&self, out: &mut String, mark: bool, mut text: impl FnMut(F) -> Cow<'r, str>) {
        // A last field with a width stays padded to it, as Slurm prints it.
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field {
                    field,
                    width,
                    align,
                } => fit_into(out, &text(*field), *width, *align, mark),
            }
        }
    }
}

/// Parses a `%[.][#][width]X` format; `field_of` maps the letter.
pub fn parse_percent<F>(
    spec: &str,
    field_of: impl Fn(char) -> Option<F>,
) -> Result<Format<F>, FormatError> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = spec.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.next_if_eq(&'%').is_some() {
            text.push('%');
            continue;
        }
        let align = if chars.next_if_eq(&'.').is_some() {
            Align::Right
        } else {
            Align::Left
        };
        // sinfo's "%#P" (width of the widest value) is treated as its usual width of 9.
        let auto = chars.next_if_eq(&'#').is_some();
        let mut digits = String::new();
        while let Some(d) = chars.next_if(char::is_ascii_digit) {
            digits.push(d);
        }
        let letter = chars.next().ok_or_else(|| FormatError::Malformed {
            spec: spec.to_string(),
            problem: "ends inside a % field",
        })?;
        let field = field_of(letter).ok_or_else(|| FormatError::UnknownField {
            spec: spec.to_string(),
            field: format!("%{letter}"),
        })?;
        let width = if auto {
            Some(9)
        } else if digits.is_empty() {
            None
        } else {
            Some(parse_width(spec, &digits)?)
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field {
            field,
            width,
            align,
        });
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(Format {
        pieces,
        trunc_mark: false,
    })
}

/// Parses a comma list of field names with optional widths. `sep_width` is `:` for
/// `squeue -O name:20` and `%` for `sacct --format JobName%20`; `default_width` and
/// `align_of` give each field's default.
pub fn parse_named<F>(
    spec: &str,
    sep_width: char,
    after_each: &str,
    field_of: impl Fn(&str) -> Option<F>,
    default_width: impl Fn(F) -> usize,
    align_of: impl Fn(F) -> Align,
    trunc_mark: bool,
) -> Result<Format<F>, FormatError>
where
    F: Copy,
{
    let mut pieces = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, width) = match item.split_once(sep_width) {
            Some((n, w)) => (n, Some(w)),
            None => (item, None),
        };
        let field = field_of(name).ok_or_else(|| FormatError::UnknownField {
            spec: spec.to_string(),
            field: name.to_string(),
        })?;
        let (align, width) = match width {
            None => (align_of(field), default_width(field)),
            Some(w) => {
                let (align, w) = match w.strip_prefix('.') {
                    Some(w) => (Align::Right, w),
                    None => (align_of(field), w),
                };
                let w = parse_width(spec, w)?;
                (align, w)
            }
        };
        pieces.push(Piece::Field {
            field,
            width: Some(width),
            align,
        });
        if !after_each.is_empty() {
            pieces.push(Piece::Text(after_each.to_string()));
        }
    }
    if pieces.is_empty() {
        return Err(FormatError::Malformed {
            spec: spec.to_string(),
            problem: "no fields",
        });
    }
    Ok(Format { pieces, trunc_mark })
}

// === squeue ===

/// squeue's fields (`-o` letters, `-O` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobField {
    JobId,
    JobIdRaw,
    ArrayJobId,
    ArrayTaskId,
    Partition,
    Name,
    User,
    Uid,
    StateCompact,
    State,
    TimeUsed,
    TimeLimit,
    TimeLeft,
    Nodes,
    ReasonOrNodes,
    NodeList,
    Reason,
    Cpus,
    TresPerNode,
    Priority,
    /// `%p`: the priority as a fraction of 2^32, as Slurm prints it.
    PriorityNorm,
    StartTime,
    SubmitTime,
    EndTime,
    Account,
    Qos,
    WorkDir,
    Command,
    Dependency,
    MinMemory,
    Comment,
    Features,
    /// `%n`: the nodes asked for with `-w`.
    ReqNodes,
    /// `%x`: the nodes excluded with `-x`.
    ExcNodes,
    /// `%Y`: the nodes the scheduler's plan holds for a pending job.
    SchedNodes,
}

pub const SQUEUE_DEFAULT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
pub const SQUEUE_LONG: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";
pub const SQUEUE_START: &str = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R";

impl JobField {
    pub fn from_letter(c: char) -> Option<JobField> {
        use JobField::*;
        Some(match c {
            'i' => JobId,
            'A' => JobIdRaw,
            'F' => ArrayJobId,
            'K' => ArrayTaskId,
            'P' => Partition,
            'j' => Name,
            'u' => User,
            'U' => Uid,
            't' => StateCompact,
            'T' => State,
            'M' => TimeUsed,
            'l' => TimeLimit,
            'L' => TimeLeft,
            'D' => Nodes,
            'R' => ReasonOrNodes,
            'N' => NodeList,
            'r' => Reason,
            'C' => Cpus,
            'b' => TresPerNode,
            'Q' => Priority,
            'p' => PriorityNorm,
            'S' => StartTime,
            'V' => SubmitTime,
            'e' => EndTime,
            'a' => Account,
            'q' => Qos,
            'Z' => WorkDir,
            'o' => Command,
            'E' => Dependency,
            'm' => MinMemory,
            'k' => Comment,
            'f' => Features,
            'n' => ReqNodes,
            'x' => ExcNodes,
            'Y' => SchedNodes,
            _ => return None,
        })
    }

    /// The `JobInfo` fields (proto names) this column reads: squeue asks the controller for
    /// these only. Ids and the state always come.
    pub fn wire_fields(self) -> &'static [&'static str] {
        use JobField::*;
        match self {
            JobId | JobIdRaw | ArrayJobId | ArrayTaskId | StateCompact | State => &[],
            Partition => &["partition"],
            Name => &["name"],
            User => &["user"],
            Uid => &["uid"],
            TimeUsed => &["start_time", "end_time"],
            TimeLimit => &["time_limit_s"],
            TimeLeft => &["time_limit_s", "start_time", "end_time"],
            StartTime => &["start_time", "expected_start"],
            SchedNodes => &["sched_nodes"],
            EndTime => &["end_time", "start_time", "expected_start", "time_limit_s"],
            Nodes => &["num_nodes"],
            ReasonOrNodes => &["reason", "nodelist"],
            NodeList => &["nodelist"],
            Reason => &["reason"],
            Cpus => &["num_cpus"],
            TresPerNode => &["tres", "num_nodes"],
            Priority | PriorityNorm => &["priority"],
            SubmitTime => &["submit_time"],
            Account => &["account"],
            Qos => &["qos"],
            WorkDir => &["workdir"],
            Command => &["command"],
            Dependency => &["dependency"],
            MinMemory => &["tres"],
            Comment => &["comment"],
            Features => &["constraint"],
            ReqNodes => &["req_nodelist"],
            ExcNodes => &["exc_nodelist"],
        }
    }

    /// `squeue -O` names, case-insensitive.
    pub fn from_name(name: &str) -> Option<JobField> {
        use JobField::*;
        Some(match name.to_ascii_lowercase().as_str() {
            "jobid" => JobId,
            "jobidraw" => JobIdRaw,
            "arrayjobid" => ArrayJobId,
            "arraytaskid" => ArrayTaskId,
            "partition" => Partition,
            "name" => Name,
            "username" | "user" => User,
            "userid" | "uid" => Uid,
            "statecompact" => StateCompact,
            "state" => State,
            "timeused" => TimeUsed,
            "timelimit" => TimeLimit,
            "timeleft" => TimeLeft,
            "numnodes" | "nodes" => Nodes,
            "reasonlist" => ReasonOrNodes,
            "nodelist" => NodeList,
            "reason" => Reason,
            "numcpus" | "cpus" => Cpus,
            "tres-per-node" | "tres_per_node" => TresPerNode,
            "priority" => PriorityNorm,
            "prioritylong" => Priority,
            "starttime" => StartTime,
            "submittime" => SubmitTime,
            "endtime" => EndTime,
            "account" => Account,
            "qos" => Qos,
            "workdir" => WorkDir,
            "command" => Command,
            "dependency" => Dependency,
            "minmemory" => MinMemory,
            "comment" => Comment,
            "feature" | "features" => Features,
            "reqnodes" => ReqNodes,
            "schednodes" => SchedNodes,
            _ => return None,
        })
    }
}

impl Field<JobView<'_>> for JobField {
    fn header(self) -> &'static str {
        use JobField::*;
        match self {
            JobId => "JOBID",
            JobIdRaw => "JOBID",
            ArrayJobId => "ARRAY_JOB_ID",
            ArrayTaskId => "ARRAY_TASK_ID",
            Partition => "PARTITION",
            Name => "NAME",
            User => "USER",
            Uid => "UID",
            StateCompact => "ST",
            State => "STATE",
            TimeUsed => "TIME",
            TimeLimit => "TIME_LIMIT",
            TimeLeft => "TIME_LEFT",
            Nodes => "NODES",
            ReasonOrNodes => "NODELIST(REASON)",
            NodeList => "NODELIST",
            Reason => "REASON",
            Cpus => "CPUS",
            TresPerNode => "TRES_PER_NODE",
            Priority | PriorityNorm => "PRIORITY",
            StartTime => "START_TIME",
            SubmitTime => "SUBMIT_TIME",
            EndTime => "END_TIME",
            Account => "ACCOUNT",
            Qos => "QOS",
            WorkDir => "WORK_DIR",
            Command => "COMMAND",
            Dependency => "DEPENDENCY",
            MinMemory => "MIN_MEMORY",
            Comment => "COMMENT",
            Features => "FEATURES",
            ReqNodes => "REQ_NODES",
            ExcNodes => "EXC_NODES",
            SchedNodes => "SCHEDNODES",
        }
    }

    fn render(self, j: &JobView, ctx: &RenderCtx) -> String {
        self.cell(j, ctx).into_owned()
    }

    fn cell<'r>(self, j: &'r JobView, ctx: &RenderCtx) -> Cow<'r, str> {
        use JobField::*;
        let or_na = |s: &'r str| Cow::Borrowed(if s.is_empty() { "(null)" } else { s });
        let owned = |s: String| Cow::Owned(s);
        match self {
            JobId => Cow::Borrowed(j.job_id.as_str()),
            JobIdRaw => owned(j.job_id_raw.to_string()),
            ArrayJobId => owned(j.array_job_id.unwrap_or(j.job_id_raw).to_string()),
            ArrayTaskId => Cow::Borrowed(j.array_task_id.as_deref().unwrap_or("N/A")),
            Partition => Cow::Borrowed(j.partition),
            Name => Cow::Borrowed(j.name),
            User => Cow::Borrowed(j.user),
            Uid => owned(j.uid.to_string()),
            StateCompact => Cow::Borrowed(j.state_compact),
            State => Cow::Borrowed(j.state),
            TimeUsed => owned(j.time_used()),
            TimeLimit => owned(j.time_limit()),
            TimeLeft => owned(j.time_left()),
            Nodes => owned(j.nodes.to_string()),
            ReasonOrNodes => owned(j.reason_or_nodes()),
            NodeList => Cow::Borrowed(j.nodelist),
            Reason => Cow::Borrowed(j.reason),
            Cpus => owned(j.cpus.to_string()),
            TresPerNode => owned(j.tres_per_node().unwrap_or_else(|| "N/A".to_string())),
            Priority => owned(j.priority.to_string()),
            PriorityNorm => owned(format!("{:.14}", j.priority as f64 / 4_294_967_296.0)),
            // A pending job's is the plan's expected start, N/A without one.
            StartTime => owned(match (j.start_time, j.is_pending()) {
                (_, true) => j.expected_start.map_or_else(
                    || "N/A".to_string(),
                    |t| timestamp(Some(t), ctx.utc_offset_s),
                ),
                (t, false) => timestamp(t, ctx.utc_offset_s),
            }),
            SubmitTime => owned(timestamp(j.submit_time, ctx.utc_offset_s)),
            EndTime => owned(match j.shown_end() {
                None => "N/A".to_string(),
                t => timestamp(t, ctx.utc_offset_s),
            }),
            Account => or_na(j.account),
            Qos => or_na(j.qos),
            WorkDir => Cow::Borrowed(j.workdir),
            // `(null)` for --wrap and a script from stdin, as Slurm has no file to name.
            Command => or_na(j.command),
            Dependency => or_na(j.dependency),
            MinMemory => owned(tandem_sched::tres::format_mem_mb(j.mem_mb)),
            Comment => or_na(j.comment),
            Features => or_na(j.constraint),
            // Slurm 22.05 printed nothing, not `N/A`, for a job without `-w` or `-x`.
            ReqNodes => Cow::Borrowed(j.req_nodelist),
            ExcNodes => Cow::Borrowed(j.exc_nodelist),
            SchedNodes => or_na(j.sched_nodes),
        }
    }
}

pub fn squeue_format(spec: &str) -> Result<Format<JobField>, FormatError> {
    parse_percent(spec, JobField::from_letter)
}

pub fn squeue_named(spec: &str) -> Result<Format<JobField>, FormatError> {
    // Slurm's `-O` pads each field to its width and adds nothing between fields.
    parse_named(
        spec,
        ':',
        "",
        JobField::from_name,
        |_| 20,
        |_| Align::Left,
        false,
    )
}

// === sinfo ===

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

// === sacct ===

/// Declares the sacct fields once: the enum and [`AcctField::ALL`] come from one list, so
/// no field can be printable but missing from `-o` and `-e`.
macro_rules! acct_fields {
    ($($(#[$attr:meta])* $field:ident,)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum AcctField {
            $($(#[$attr])* $field,)*
        }

        impl AcctField {
            /// Every field Tandem's sacct prints.
            pub const ALL: &'static [AcctField] = &[$(AcctField::$field,)*];
        }
    };
}

acct_fields! {
    JobId,
    JobIdRaw,
    JobName,
    Partition,
    Account,
    AllocCpus,
    AllocNodes,
    AllocTres,
    State,
    ExitCode,
    DerivedExitCode,
    Elapsed,
    ElapsedRaw,
    Start,
    End,
    Submit,
    Eligible,
    NodeList,
    User,
    Uid,
    Timelimit,
    Qos,
    WorkDir,
    Comment,
    NTasks,
    ReqMem,
    Reason,
    Priority,
    Constraints,
    Restarts,
    /// `NCPUS` and `NNodes`: AllocCPUS and AllocNodes under Slurm's other names.
    NCpus,
    NNodes,
    /// Elapsed times allocated CPUs, and the same in seconds.
    CpuTime,
    CpuTimeRaw,
    /// The CPUs and nodes asked for: the job's (what it holds once it runs) or a step's.
    ReqCpus,
    ReqNodes,
    /// CPU the processes used (user + system), and each part.
    TotalCpu,
    UserCpu,
    SystemCpu,
    /// Peak memory of a step (blank on the allocation line, as Slurm leaves it).
    MaxRss,
    Cluster,
    Group,
    Gid,
    /// The time limit in minutes; `Partition_Limit` while a job without one waits.
    TimelimitRaw,
    /// What the job asked for (AllocTRES is what it holds, blank until it starts).
    ReqTres,
    /// Tandem has neither reservations nor workload keys: blank, as Slurm prints a job
    /// without them.
    Reservation,
    WcKey,
}

pub const SACCT_DEFAULT: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";

/// `sacct -e`: the field names, as Slurm 22.05 lists its own, in case-blind alphabetical
/// order, four to a line, each padded to 19 characters.
pub fn sacct_helpformat() -> String {
    let mut names: Vec<&str> = AcctField::ALL.iter().map(|f| f.header()).collect();
    names.sort_by_key(|n| n.to_ascii_lowercase());
    let mut out = String::new();
    for (i, name) in names.iter().enumerate() {
        if i % 4 != 0 {
            out.push(' ');
        } else if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{name:<19}"));
    }
    out.push('\n');
    out
}

impl AcctField {
    /// The field of a name, in any case (`jobid`, `JobID`).
    pub fn from_name(name: &str) -> Option<AcctField> {
        Self::ALL
            .iter()
            .copied()
            .find(|f| f.header().eq_ignore_ascii_case(name))
    }

    fn width(self) -> usize {
        use AcctField::*;
        match self {
            JobId | JobIdRaw => 12,
            ExitCode => 8,
            DerivedExitCode => 15,
            Start | End | Submit | Eligible => 19,
            NodeList => 15,
            User => 9,
            // Slurm 22.05's defaults (`sacct -o uid` and so on, read off its header).
            Uid | Gid => 6,
            Group => 9,
            WorkDir => 20,
            Comment => 14,
            Reservation => 20,
            NNodes | NTasks | ReqCpus | ReqNodes => 8,
            Reason => 22,
            Constraints => 19,
            _ => 10,
        }
    }

    fn align(self) -> Align {
        match self {
            AcctField::JobId | AcctField::JobIdRaw => Align::Left,
            _ => Align::Right,
        }
    }
}

impl Field<JobView<'_>> for AcctField {
    fn header(self) -> &'static str {
        use AcctField::*;
        match self {
            JobId => "JobID",
            JobIdRaw => "JobIDRaw",
            JobName => "JobName",
            Partition => "Partition",
            Account => "Account",
            AllocCpus => "AllocCPUS",
            AllocNodes => "AllocNodes",
            AllocTres => "AllocTRES",
            State => "State",
            ExitCode => "ExitCode",
            DerivedExitCode => "DerivedExitCode",
            Elapsed => "Elapsed",
            ElapsedRaw => "ElapsedRaw",
            Start => "Start",
            End => "End",
            Submit => "Submit",
            Eligible => "Eligible",
            NodeList => "NodeList",
            User => "User",
            Uid => "UID",
            Timelimit => "Timelimit",
            Qos => "QOS",
            WorkDir => "WorkDir",
            Comment => "Comment",
            NTasks => "NTasks",
            ReqMem => "ReqMem",
            Reason => "Reason",
            Priority => "Priority",
            Constraints => "Constraints",
            Restarts => "Restarts",
            NCpus => "NCPUS",
            NNodes => "NNodes",
            CpuTime => "CPUTime",
            CpuTimeRaw => "CPUTimeRAW",
            ReqCpus => "ReqCPUS",
            ReqNodes => "ReqNodes",
            Cluster => "Cluster",
            Group => "Group",
            Gid => "GID",
            TimelimitRaw => "TimelimitRaw",
            ReqTres => "ReqTRES",
            Reservation => "Reservation",
            WcKey => "WCKey",
            TotalCpu => "TotalCPU",
            UserCpu => "UserCPU",
            SystemCpu => "SystemCPU",
            MaxRss => "MaxRSS",
        }
    }

    fn render(self, j: &JobView, ctx: &RenderCtx) -> String {
        use AcctField::*;
        let step = j.step_id.is_some();
        // Slurm leaves job-level fields blank on step rows.
        let job_only = |s: &dyn Fn() -> String| if step { String::new() } else { s() };
        match self {
            JobId => j.job_id.clone(),
            JobIdRaw => match j.step_id {
                Some(s) => format!("{}.{s}", j.job_id_raw),
                None => j.job_id_raw.to_string(),
            },
            JobName => j.name.to_string(),
            Partition => job_only(&|| j.partition.to_string()),
            Account => j.account.to_string(),
            AllocCpus | NCpus | ReqCpus => j.cpus.to_string(),
            AllocNodes | NNodes | ReqNodes => j.nodes.to_string(),
            CpuTime => {
                tandem_sched::time::format_elapsed(j.elapsed_s.saturating_mul(u64::from(j.cpus)))
            }
            CpuTimeRaw => j.elapsed_s.saturating_mul(u64::from(j.cpus)).to_string(),
            TotalCpu => cpu_time(
                j.usage
                    .map_or(0, |u| u.user_cpu_usec.saturating_add(u.system_cpu_usec)),
            ),
            UserCpu => cpu_time(j.usage.map_or(0, |u| u.user_cpu_usec)),
            SystemCpu => cpu_time(j.usage.map_or(0, |u| u.system_cpu_usec)),
            MaxRss => match j.usage {
                Some(u) if step && u.max_rss_bytes > 0 => match ctx.mem_unit {
                    Some(unit) => kib_in_unit(u.max_rss_bytes / 1024, unit),
                    None => kib_with_unit(u.max_rss_bytes / 1024),
                },
                _ => String::new(),
            },
            // Nothing is allocated before a job starts (a job cancelled while pending never
            // held anything).
            AllocTres if j.start_time.is_none() && !step => String::new(),
            AllocTres => j.tres.sorted(),
            ReqTres => job_only(&|| j.tres.sorted()),
            Reservation | WcKey => String::new(),
            State => match j.cancelled_by {
                // Slurm 22.05's allocation line of a cancelled job: `CANCELLED by 1000`
                // (`CANCELLED+` in a 10-wide column); steps say `CANCELLED`.
                Some(uid) if j.state == "CANCELLED" && !step => format!("CANCELLED by {uid}"),
                _ => j.state.to_string(),
            },
            ExitCode => j.exit_code.to_string(),
            DerivedExitCode => j
                .derived_exit_code
                .map(|e| e.to_string())
                .unwrap_or_default(),
            Elapsed => tandem_sched::time::format_elapsed(j.elapsed_s),
            ElapsedRaw => j.elapsed_s.to_string(),
            Start => timestamp(j.start_time, ctx.utc_offset_s),
            End => timestamp(j.end_time, ctx.utc_offset_s),
            Submit => timestamp(j.submit_time, ctx.utc_offset_s),
            Eligible => timestamp(j.eligible_time, ctx.utc_offset_s),
            NodeList => {
                if j.nodelist.is_empty() {
                    "None assigned".to_string()
                } else {
                    j.nodelist.to_string()
                }
            }
            User => job_only(&|| j.user.to_string()),
            Uid => job_only(&|| j.uid.to_string()),
            Gid => job_only(&|| j.gid.to_string()),
            Group => job_only(&|| {
                ctx.groups
                    .get(&j.gid)
                    .cloned()
                    .unwrap_or_else(|| j.gid.to_string())
            }),
            Cluster => ctx.cluster.clone(),
            Timelimit => job_only(&|| Limit::of(j).render(false)),
            TimelimitRaw => job_only(&|| Limit::of(j).render(true)),
            Qos => job_only(&|| j.qos.to_string()),
            WorkDir => job_only(&|| j.workdir.to_string()),
            Comment => job_only(&|| j.comment.to_string()),
            NTasks => {
                if step {
                    j.tasks.to_string()
                } else {
                    String::new()
                }
            }
            ReqMem => job_only(&|| match ctx.mem_unit {
                Some(unit) => kib_in_unit(j.mem_mb.saturating_mul(1024), unit),
                None => tandem_sched::tres::format_mem_mb(j.mem_mb),
            }),
            Reason => job_only(&|| j.reason.to_string()),
            Priority => job_only(&|| j.priority.to_string()),
            Constraints => job_only(&|| j.constraint.to_string()),
            Restarts => job_only(&|| j.restarts.to_string()),
        }
    }
}

/// A job's time limit as sacct has it: whole minutes (Slurm stores minutes, rounding a
/// limit in seconds up), none, or none yet.
enum Limit {
    Minutes(u64),
    Unlimited,
    /// A job that asked for no limit and has not started: the partition's applies once it
    /// does.
    Partition,
}

impl Limit {
    fn of(j: &JobView) -> Limit {
        match j.time_limit_s {
            Some(s) => Limit::Minutes(s.div_ceil(60)),
            None if j.state == "PENDING" => Limit::Partition,
            None => Limit::Unlimited,
        }
    }

    /// sacct's Timelimit, or with `raw` its TimelimitRaw (minutes).
    fn render(&self, raw: bool) -> String {
        match *self {
            Limit::Minutes(m) if raw => m.to_string(),
            Limit::Minutes(m) => minutes_as_time(m),
            Limit::Unlimited => "UNLIMITED".to_owned(),
            Limit::Partition => "Partition_Limit".to_owned(),
        }
    }
}

/// sacct's Timelimit (Slurm's `mins2time_str`): `D-HH:MM:SS` past a day, else `HH:MM:SS`
/// (squeue writes `5:00` where sacct writes `00:05:00`).
fn minutes_as_time(m: u64) -> String {
    tandem_sched::time::format_elapsed(m.saturating_mul(60))
}

/// sacct's CPU times (Slurm's `_elapsed_time`): `D-HH:MM:SS` past a day, `HH:MM:SS` past
/// an hour, else `MM:SS.mmm`, or `00:MM:SS` without milliseconds.
fn cpu_time(usec: u64) -> String {
    let secs = usec / 1_000_000;
    let ms = usec % 1_000_000 / 1000;
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h:02}:{m:02}:{s:02}")
    } else if ms > 0 {
        format!("{m:02}:{s:02}.{ms:03}")
    } else {
        format!("00:{m:02}:{s:02}")
    }
}

/// A size in KiB as sacct prints it: a larger unit only where it divides exactly
/// (`2236K`, `2048K` -> `2M`).
/// `kib` in `unit` as `sacct --units` prints it: whole when it divides, else two decimals
/// (Slurm 22.05, a 1 MiB ReqMem: `1024K`, `1M`, `0.00G`).
pub fn kib_in_unit(kib: u64, unit: char) -> String {
    let shift = match unit {
        'K' => 0,
        'M' => 1,
        'G' => 2,
        'T' => 3,
        _ => 4,
    };
    let div = 1u64 << (10 * shift);
    if kib.is_multiple_of(div) {
        format!("{}{unit}", kib / div)
    } else {
        format!("{:.2}{unit}", kib as f64 / div as f64)
    }
}

fn kib_with_unit(kib: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    let (mut n, mut i) = (kib, 0);
    while n > 0 && n % 1024 == 0 && i + 1 < UNITS.len() {
        n /= 1024;
        i += 1;
    }
    format!("{n}{}", UNITS[i])
}

pub fn sacct_format(spec: &str) -> Result<Format<AcctField>, FormatError> {
    // sacct prints a space after every field, the last one too.
    parse_named(
        spec,
        '%',
        " ",
        AcctField::from_name,
        AcctField::width,
        AcctField::align,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::view::JobView;
    use tandem_proto::v1::{JobInfo, JobState};

    /// Views borrow their record; tests leak it to get one that lives long enough.
    fn view(id: u64, state: JobState, reason: &str) -> JobView<'static> {
        JobView::from_job(
            Box::leak(Box::new(JobInfo {
                job_id: id,
                array_task_id: -1,
                name: "a-very-long-job-name".into(),
                user: "alice".into(),
                partition: "batch".into(),
                state: state as i32,
                reason: reason.into(),
                num_nodes: 2,
                nodelist: "node-[1-2]".into(),
                start_time: 100,
                ..JobInfo::default()
            })),
            161,
        )
    }

    /// `info` with only the fields named in `keep` and those always sent, cut at the wire
    /// level as a controller honouring `ListJobsRequest.fields` would leave it.
    fn as_sent(info: &JobInfo, keep: &[&str]) -> JobInfo {
        use prost::Message as _;
        use tandem_controller::api::convert::JOB_INFO_FIELDS;
        let number = |name: &str| {
            let found = JOB_INFO_FIELDS.iter().find(|(n, _)| *n == name);
            found
                .unwrap_or_else(|| panic!("JobInfo has no field {name:?}"))
                .1
        };
        let always = [
            "job_id",
            "array_job_id",
            "array_task_id",
            "array_pending",
            "state",
        ];
        let keep: Vec<u32> = keep.iter().chain(&always).map(|n| number(n)).collect();
        let varint = |buf: &mut &[u8]| {
            let mut v = 0u64;
            for shift in (0..64).step_by(7) {
                let b = buf[0];
                *buf = &buf[1..];
                v |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    break;
                }
            }
            v
        };
        let bytes = info.encode_to_vec();
        let (mut rest, mut kept) = (bytes.as_slice(), Vec::new());
        while !rest.is_empty() {
            let field = rest;
            let key = varint(&mut rest);
            if key & 7 == 2 {
                let len = varint(&mut rest) as usize;
                rest = &rest[len..];
            } else {
                varint(&mut rest);
            }
            if keep.contains(&((key >> 3) as u32)) {
                kept.extend_from_slice(&field[..field.len() - rest.len()]);
            }
        }
        JobInfo::decode(kept.as_slice()).unwrap()
    }

    /// Slurm 22.05's sacct: `00:00:00` for no CPU, `00:01.234`, `01:02:03`; MaxRSS `2236K`,
    /// `2M` for 2048K.
    #[test]
    fn cpu_times_and_sizes_read_as_sacct_prints_them() {
        assert_eq!(cpu_time(0), "00:00:00");
        assert_eq!(cpu_time(1_234_000), "00:01.234");
        assert_eq!(cpu_time(61_000_000), "00:01:01");
        assert_eq!(cpu_time(3_723_000_000), "01:02:03");
        assert_eq!(cpu_time(90_000_000_000), "1-01:00:00");
        assert_eq!(kib_with_unit(2236), "2236K");
        assert_eq!(kib_with_unit(2048), "2M");
        assert_eq!(kib_with_unit(3 * 1024 * 1024), "3G");
        assert_eq!(kib_with_unit(0), "0K");
    }
    #[test]
    fn every_squeue_column_renders_from_the_fields_it_asks_for() {
        let full = JobInfo {
            job_id: 7,
            array_job_id: 5,
            array_task_id: 2,
            name: "train".into(),
            user: "alice".into(),
            uid: 1000,
            account: "ml".into(),
            partition: "gpu".into(),
            qos: "high".into(),
            state: JobState::Running as i32,
            reason: "None".into(),
            priority: 42,
            submit_time: 1_000,
            start_time: 1_100,
            time_limit_s: 3_600,
            nodelist: "n[1-2]".into(),
            num_nodes: 2,
            num_cpus: 16,
            tres: Some(tandem_proto::v1::Tres {
                cpus: 16,
                mem_mb: 4096,
                gpus: 4,
                gpu_type: "a100".into(),
            }),
            workdir: "/w".into(),
            command: "/bin/sh".into(),
            dependency: "afterok:3".into(),
            comment: "c".into(),
            constraint: "fast".into(),
            req_nodelist: "n[1-2]".into(),
            exc_nodelist: "n3".into(),
            ..JobInfo::default()
        };
        let ctx = RenderCtx::default();
        let letters = "iAFKPjuUtTMlLDRNrCbQSVeaqZoEmkfnx";
        for letter in letters.chars() {
            let field = JobField::from_letter(letter).unwrap();
            let sent = as_sent(&full, field.wire_fields());
            assert_eq!(
                field.render(&JobView::from_job(&sent, 2_000), &ctx),
                field.render(&JobView::from_job(&full, 2_000), &ctx),
                "%{letter} reads a field it does not ask for"
            );
        }
        // The check has teeth: a column asking for nothing loses its value.
        let bare = as_sent(&full, &[]);
        assert_ne!(
            JobField::User.render(&JobView::from_job(&bare, 2_000), &ctx),
            "alice"
        );
    }

    #[test]
    fn squeue_default_layout_matches_slurm() {
        let f = squeue_format(SQUEUE_DEFAULT).unwrap();
        assert_eq!(
            f.header(),
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
        );
        let ctx = RenderCtx::default();
        assert_eq!(
            f.row(&view(42, JobState::Running, ""), &ctx),
            "                42     batch a-very-l    alice  R       1:01      2 node-[1-2]"
        );
        let pending = view(43, JobState::Pending, "Resources");
        assert!(
            f.row(&pending, &ctx)
                .ends_with(" PD       1:01      2 (Resources)")
        );
    }

    #[test]
    fn percent_specs() {
        let f = squeue_format("%i|%.5j|%10u|%%").unwrap();
        let row = f.row(&view(1, JobState::Running, ""), &RenderCtx::default());
        assert_eq!(row, "1|a-ver|alice     |%");
        assert_eq!(
            squeue_format("%i %W").unwrap_err(),
            FormatError::UnknownField {
                spec: "%i %W".into(),
                field: "%W".into()
            }
        );
        assert!(matches!(
            squeue_format("%.1"),
            Err(FormatError::Malformed { .. })
        ));
    }

    /// Slurm 22.05, `sacct --units=K|M|G -o ReqMem` of a job with 1 MiB: `1024K`, `1M`,
    /// `0.00G`.
    #[test]
    fn sizes_in_a_unit_as_sacct_units_prints_them() {
        assert_eq!(kib_in_unit(1024, 'K'), "1024K");
        assert_eq!(kib_in_unit(1024, 'M'), "1M");
        assert_eq!(kib_in_unit(1024, 'G'), "0.00G");
        assert_eq!(kib_in_unit(1536, 'M'), "1.50M");
        assert_eq!(kib_in_unit(3 << 30, 'T'), "3T");
        assert_eq!(kib_in_unit(0, 'P'), "0P");
    }

    #[test]
    fn named_specs() {
        // Slurm 22.05 `-O jobid:5,name:6`: `JOBIDNAME  `: each field padded to its width
        // (20 when not given), nothing between them.
        let f = squeue_named("JobID:6,name:.8,state").unwrap();
        let row = f.row(&view(1, JobState::Running, ""), &RenderCtx::default());
        assert_eq!(row, "1     a-very-lRUNNING             ");
        assert!(squeue_named("jobid,bogus").is_err());
    }

    #[test]
    fn sacct_default_layout_and_truncation_mark() {
        let f = sacct_format(SACCT_DEFAULT).unwrap();
        assert_eq!(
            f.header(),
            "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode "
        );
        // Slurm's sacct ends every line with the space after its last field.
        assert_eq!(
            f.rule(),
            "------------ ---------- ---------- ---------- ---------- ---------- -------- "
        );
        let row = f.row(&view(9, JobState::Completed, ""), &RenderCtx::default());
        assert_eq!(
            row,
            "9            a-very-lo+      batch                     0  COMPLETED      0:0 "
        );
        let f = sacct_format("JobID,JobName%30,State").unwrap();
        assert!(
            f.row(&view(9, JobState::Failed, ""), &RenderCtx::default())
                .contains("a-very-long-job-name")
        );
        assert_eq!(
            f.delimited(None, &RenderCtx::default(), "|"),
            "JobID|JobName|State"
        );
        assert!(sacct_format("JobID,Nope").is_err());
        assert!(sacct_format("JobName%x").is_err());
    }

    /// A completed job of `(cpus, nodes)` that ran over `(start, end)`, its batch step on
    /// `n1` holding `batch_cpus`.
    fn completed_with_batch(
        job_id: u64,
        (cpus, nodes): (u32, u32),
        batch_cpus: u32,
        (start, end): (i64, i64),
    ) -> JobInfo {
        JobInfo {
            job_id,
            array_task_id: -1,
            state: JobState::Completed as i32,
            num_cpus: cpus,
            num_nodes: nodes,
            start_time: start,
            end_time: end,
            steps: vec![tandem_proto::v1::StepInfo {
                step_id: "batch".into(),
                state: JobState::Completed as i32,
                nodelist: "n1".into(),
                start_time: start,
                end_time: end,
                tres: Some(tandem_proto::v1::Tres {
                    cpus: batch_cpus,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..JobInfo::default()
        }
    }

    /// `sacct -P -o SPEC` of a job and of its first step, at time 200.
    fn job_and_step_lines(info: &JobInfo, spec: &str) -> [String; 2] {
        let job = JobView::from_job(info, 200);
        let step = JobView::from_step(&job, &info.steps[0], 200);
        let ctx = RenderCtx::default();
        let f = sacct_format(spec).unwrap();
        [
            f.delimited(Some(&job), &ctx, "|"),
            f.delimited(Some(&step), &ctx, "|"),
        ]
    }

    /// Slurm 22.05, `scancel` by root of a running job: `sacct -P` said `CANCELLED by 0` on
    /// the allocation line and `CANCELLED` on `.batch`; the table, `CANCELLED+`.
    #[test]
    fn a_cancelled_job_names_who_cancelled_it_on_its_allocation_line() {
        let info = JobInfo {
            job_id: 7,
            array_task_id: -1,
            state: JobState::Cancelled as i32,
            start_time: 100,
            end_time: 110,
            cancelled_by: Some(0),
            steps: vec![tandem_proto::v1::StepInfo {
                step_id: "batch".into(),
                state: JobState::Cancelled as i32,
                ..Default::default()
            }],
            ..JobInfo::default()
        };
        assert_eq!(
            job_and_step_lines(&info, "JobID,State"),
            ["7|CANCELLED by 0", "7.batch|CANCELLED"]
        );
        let job = JobView::from_job(&info, 200);
        let ctx = RenderCtx::default();
        let f = sacct_format("JobID,State").unwrap();
        assert_eq!(f.row(&job, &ctx), "7            CANCELLED+ ");
        // Ended any other way, or cancelled by the controller itself: the plain state.
        let by_controller = JobInfo {
            cancelled_by: None,
            ..info.clone()
        };
        let by_controller = JobView::from_job(&by_controller, 200);
        assert_eq!(f.delimited(Some(&by_controller), &ctx, "|"), "7|CANCELLED");
        let completed = JobInfo {
            state: JobState::Completed as i32,
            ..info.clone()
        };
        let completed = JobView::from_job(&completed, 200);
        assert_eq!(f.delimited(Some(&completed), &ctx, "|"), "7|COMPLETED");
    }

    /// Slurm 22.05, `sbatch -N2 -n4 --wrap='srun true'`, three seconds long, the batch
    /// script on a node holding three of the four CPUs: `sacct -P -o
    /// JobID,ReqCPUS,ReqNodes,CPUTimeRAW` printed `4|4|2|12` and `4.batch|3|1|9`; the
    /// table's header `JobID         ReqCPUS ReqNodes CPUTimeRAW`.
    #[test]
    fn requested_cpus_and_nodes_and_raw_cpu_time_as_sacct_prints_them() {
        let mut info = completed_with_batch(4, (4, 2), 3, (100, 103));
        info.nodelist = "n[1-2]".into();
        let spec = "JobID,ReqCPUS,ReqNodes,CPUTimeRAW";
        assert_eq!(
            job_and_step_lines(&info, spec),
            ["4|4|2|12", "4.batch|3|1|9"]
        );
        assert_eq!(
            sacct_format(spec).unwrap().header(),
            "JobID         ReqCPUS ReqNodes CPUTimeRAW "
        );
        assert!(sacct_format("reqcpus,reqnodes,cputimeraw").is_ok());
    }

    /// Slurm 22.05's `sacct -e` lists its fields four to a line, each padded to 19
    /// characters, in case-blind alphabetical order (`... Constraints ... CPUTime ...`):
    ///
    /// ```text
    /// Account             AdminComment        AllocCPUS           AllocNodes
    /// AllocTRES           AssocID             AveCPU              AveCPUFreq
    /// ...
    /// User                UserCPU             WCKey               WCKeyID
    /// WorkDir
    /// ```
    ///
    /// (every line padded to its last column, `WorkDir` to 19). Tandem lists the ones it
    /// prints, each of which `-o` takes back in any case.
    #[test]
    fn helpformat_lists_every_field_as_slurm_lays_its_list_out() {
        let text = sacct_helpformat();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "Account             AllocCPUS           AllocNodes          AllocTRES          "
        );
        assert_eq!(
            lines[1],
            "Cluster             Comment             Constraints         CPUTime            "
        );
        assert_eq!(lines.len(), AcctField::ALL.len().div_ceil(4));
        assert!(lines.iter().all(|l| l.len() <= 79), "{text}");
        let names: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(names.len(), AcctField::ALL.len());
        let mut sorted = names.clone();
        sorted.sort_by_key(|n| n.to_ascii_lowercase());
        assert_eq!(names, sorted);
        for n in names {
            let f = AcctField::from_name(n).unwrap_or_else(|| panic!("{n} not taken back"));
            assert_eq!(AcctField::from_name(&n.to_ascii_lowercase()), Some(f));
        }
        assert!(text.ends_with("WorkDir            \n"), "{text}");
    }

    /// Slurm 22.05, `sacct -P -o JobID,Timelimit,TimelimitRaw,ReqTRES,AllocTRES`: `sbatch
    /// -t 5` done, `11207|00:05:00|5|billing=1,cpu=1,node=1|billing=1,cpu=1,node=1` (less
    /// the reference's `mem=1M`) and `11207.batch|||` with the step's own AllocTRES; held
    /// with `-t 90`, `-t 2-0`, `-t 0:30` and `-t 3-04:05:00`: `01:30:00|90`,
    /// `2-00:00:00|2880`, `00:01:00|1`, `3-04:05:00|4565`, and a blank AllocTRES; held
    /// without `-t`, `Partition_Limit|Partition_Limit`. The table's header:
    /// `JobID         Timelimit TimelimitR`; Reservation and WCKey blank.
    #[test]
    fn time_limits_and_requested_tres_as_sacct_prints_them() {
        let mut info = completed_with_batch(11207, (1, 1), 1, (100, 101));
        info.time_limit_s = 300;
        let spec = "JobID,Timelimit,TimelimitRaw,ReqTRES,AllocTRES,Reservation,WCKey";
        assert_eq!(
            job_and_step_lines(&info, spec),
            [
                "11207|00:05:00|5|billing=1,cpu=1,node=1|billing=1,cpu=1,node=1||",
                "11207.batch||||cpu=1,mem=0,node=1||"
            ]
        );
        info.state = JobState::Pending as i32;
        info.start_time = 0;
        info.end_time = 0;
        for (secs, limit, raw) in [
            (90 * 60, "01:30:00", "90"),
            (2 * 86_400, "2-00:00:00", "2880"),
            (30, "00:01:00", "1"),
            (3 * 86_400 + 4 * 3600 + 5 * 60, "3-04:05:00", "4565"),
            (0, "Partition_Limit", "Partition_Limit"),
        ] {
            info.time_limit_s = secs;
            let [job, _] = job_and_step_lines(&info, "JobID,Timelimit,TimelimitRaw,AllocTRES");
            assert_eq!(job, format!("11207|{limit}|{raw}|"));
        }
        // Started without a limit: the partition's, here none.
        info.state = JobState::Running as i32;
        info.start_time = 100;
        let [job, _] = job_and_step_lines(&info, "JobID,Timelimit,TimelimitRaw");
        assert_eq!(job, "11207|UNLIMITED|UNLIMITED");
        assert_eq!(
            sacct_format("JobID,Timelimit,TimelimitRaw")
                .unwrap()
                .header(),
            "JobID         Timelimit TimelimitR "
        );
    }

    /// Slurm 22.05, the same job as root on a cluster named `bench`: `sacct -P -o
    /// JobID,Cluster,Group,GID` printed `4|bench|root|0` and `4.batch|bench||`.
    #[test]
    fn cluster_on_every_line_group_and_gid_on_the_jobs() {
        let info = JobInfo {
            job_id: 4,
            array_task_id: -1,
            gid: 0,
            steps: vec![tandem_proto::v1::StepInfo {
                step_id: "batch".into(),
                ..Default::default()
            }],
            ..JobInfo::default()
        };
        let job = JobView::from_job(&info, 200);
        let step = JobView::from_step(&job, &info.steps[0], 200);
        let mut ctx = RenderCtx {
            cluster: "bench".into(),
            groups: [(0, "root".to_string())].into(),
            ..RenderCtx::default()
        };
        let f = sacct_format("JobID,Cluster,Group,GID").unwrap();
        assert_eq!(f.delimited(Some(&job), &ctx, "|"), "4|bench|root|0");
        assert_eq!(f.delimited(Some(&step), &ctx, "|"), "4.batch|bench||");
        assert_eq!(f.header(), "JobID           Cluster     Group    GID ");
        // A gid the group database does not know: its number.
        ctx.groups.clear();
        assert_eq!(f.delimited(Some(&job), &ctx, "|"), "4|bench|0|0");
    }

    /// Slurm 22.05, `sbatch -H -w n[1-2] -x n3`: `squeue -o "%n|%x|%.10n"` printed
    /// `REQ_NODES|EXC_NODES| REQ_NODES` and `n[1-2]|n3|    n[1-2]`; a job without them,
    /// `||`; `-O reqnodes` the `REQ_NODES` column.
    #[test]
    fn requested_and_excluded_nodes_are_columns_as_in_slurm() {
        let ctx = RenderCtx::default();
        let info = JobInfo {
            job_id: 5,
            array_task_id: -1,
            req_nodelist: "n[1-2]".into(),
            exc_nodelist: "n3".into(),
            ..JobInfo::default()
        };
        let f = squeue_format("%n|%x|%.10n").unwrap();
        assert_eq!(f.header(), "REQ_NODES|EXC_NODES| REQ_NODES");
        assert_eq!(
            f.row(&JobView::from_job(&info, 0), &ctx),
            "n[1-2]|n3|    n[1-2]"
        );
        let plain = JobInfo {
            req_nodelist: String::new(),
            exc_nodelist: String::new(),
            ..info.clone()
        };
        let f = squeue_format("%n|%x").unwrap();
        assert_eq!(f.row(&JobView::from_job(&plain, 0), &ctx), "|");
        assert!(squeue_named("reqnodes").is_ok());
    }

    #[test]
    fn widths_are_capped() {
        assert!(squeue_format("%.1024i %1024j").is_ok());
        assert!(squeue_named("jobid:1024,name:.1024").is_ok());
        for spec in [
            "%.1025i",
            "%99999999999999i",
            "%999999999999999999999999999i",
        ] {
            let err = squeue_format(spec).unwrap_err().to_string();
            assert!(
                err.contains("a width must be at most 1024"),
                "{spec}: {err}"
            );
        }
        for spec in ["jobid:1025", "name:.99999999999999999999999999"] {
            let err = squeue_named(spec).unwrap_err().to_string();
            assert!(
                err.contains("a width must be at most 1024"),
                "{spec}: {err}"
            );
        }
        let err = squeue_named("jobid:x").unwrap_err().to_string();
        assert!(err.contains("a width must be a number"), "{err}");
    }
}
