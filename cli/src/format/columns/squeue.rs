//! squeue's field table: the `-o` letters and `-O` names, their headers, the `JobInfo`
//! fields each column needs from the controller, and how each renders from a
//! [`JobView`]; with squeue's default layouts.

use std::borrow::Cow;

use super::spec::{Field, Format, FormatError, RenderCtx, parse_named, parse_percent};
use crate::format::table::Align;
use crate::format::view::{JobView, timestamp};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::columns::testing::view;
    use tandem_proto::v1::{JobInfo, JobState};

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
}
