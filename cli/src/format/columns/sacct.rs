//! sacct's field table: the `--format` names (declared once, so `-e` lists every one),
//! their default widths and alignment, and how each renders from a job's or a step's
//! [`JobView`], job-only fields blank on steps as Slurm prints them.

use super::spec::{Field, Format, FormatError, RenderCtx, parse_named};
use super::units::{cpu_time, kib_in_unit, kib_with_unit, minutes_as_time};
use crate::format::table::Align;
use crate::format::view::{JobView, timestamp};

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
    use crate::format::columns::testing::view;
    use tandem_proto::v1::{JobInfo, JobState};

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
}
