//! Inbound conversions: what a client sends, checked and turned into the scheduling core's
//! types. Separate from the outbound records because it is the controller's trust boundary:
//! every limit on a request's size lives here, next to the one function each request
//! passes through.

use tandem_net::auth::Identity;
use tandem_proto::v1;
use tandem_sched::JobId;
use tandem_sched::array::ArraySpec;
use tandem_sched::constraint::Constraint;
use tandem_sched::dependency::Dependency;
use tandem_sched::job::JobSpec;
use tandem_sched::node::NodeMode;
use tandem_sched::state::{JobSelector, JobUpdate};
use tonic::Status;

use super::bad;
use crate::launch::Payload;

/// Slurm's default `max_script_size` is 4 MB.
pub const MAX_SCRIPT_BYTES: usize = 4 << 20;
/// Environment of one job, all entries together.
pub const MAX_ENV_BYTES: usize = 1 << 20;
pub const MAX_ENV_ENTRIES: usize = 10_000;
pub const MAX_ARGV_BYTES: usize = 1 << 20;
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_TEXT_BYTES: usize = 1024;
pub const MAX_IDEMPOTENCY_KEY: usize = 128;

fn no_nul(field: &str, s: &str) -> Result<(), Status> {
    if s.contains('\0') {
        return Err(bad(field, "contains a NUL byte"));
    }
    Ok(())
}

fn text(field: &str, s: &str, max: usize) -> Result<(), Status> {
    if s.len() > max {
        return Err(bad(field, format!("longer than {max} bytes")));
    }
    no_nul(field, s)
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn hosts(field: &str, expr: &str) -> Result<Vec<String>, Status> {
    if expr.trim().is_empty() {
        return Ok(Vec::new());
    }
    text(field, expr, MAX_TEXT_BYTES * 16)?;
    tandem_sched::hostlist::expand(expr).map_err(|e| bad(field, e))
}

/// Validates a submission and splits it into the scheduling spec and the stored payload.
/// The job's user is the caller's verified identity, whatever the request says.
pub fn submit_from_proto(
    spec: v1::JobSpec,
    who: &Identity,
    max_array_size: u32,
) -> Result<(JobSpec, Payload), Status> {
    if spec.script.len() > MAX_SCRIPT_BYTES {
        return Err(bad(
            "script",
            format!("larger than {} MB", MAX_SCRIPT_BYTES >> 20),
        ));
    }
    no_nul("script", &spec.script)?;
    let argv_bytes: usize = spec.argv.iter().map(String::len).sum();
    if argv_bytes > MAX_ARGV_BYTES {
        return Err(bad("argv", "larger than 1 MB"));
    }
    for a in &spec.argv {
        no_nul("argv", a)?;
    }
    if spec.environment.len() > MAX_ENV_ENTRIES {
        return Err(bad(
            "environment",
            format!("more than {MAX_ENV_ENTRIES} variables"),
        ));
    }
    let env_bytes: usize = spec
        .environment
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(bad("environment", "larger than 1 MB"));
    }
    for (k, v) in &spec.environment {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(bad(
                "environment",
                format!(
                    "bad variable name {:?}",
                    k.chars().take(64).collect::<String>()
                ),
            ));
        }
        no_nul("environment", v)?;
    }
    if spec.workdir.is_empty() {
        return Err(bad(
            "workdir",
            "missing (sbatch sends its working directory)",
        ));
    }
    if !spec.workdir.starts_with('/') {
        return Err(bad(
            "workdir",
            format!("{:?} is not an absolute path", spec.workdir),
        ));
    }
    text("workdir", &spec.workdir, MAX_PATH_BYTES)?;
    text("output", &spec.stdout, MAX_PATH_BYTES)?;
    text("error", &spec.stderr, MAX_PATH_BYTES)?;
    text("input", &spec.stdin, MAX_PATH_BYTES)?;
    text("script path", &spec.script_path, MAX_PATH_BYTES)?;
    no_nul("script path", &spec.script_path)?;
    let warn_signal = crate::launch::WarnSignal::from_proto(
        spec.signal_number,
        spec.signal_before_s,
        spec.signal_batch_only,
    )
    .map_err(|e| bad("signal", e))?;
    if let Some(m) = spec.umask.filter(|m| *m > 0o777) {
        return Err(bad(
            "umask",
            format!("{m:o} is not a file-creation mask (at most 777)"),
        ));
    }
    text("comment", &spec.comment, MAX_TEXT_BYTES)?;
    text("submit host", &spec.submit_host, 256)?;
    text(
        "idempotency key",
        &spec.idempotency_key,
        MAX_IDEMPOTENCY_KEY,
    )?;
    if spec.requeue && spec.no_requeue {
        return Err(bad(
            "requeue",
            "--requeue and --no-requeue are mutually exclusive",
        ));
    }
    if spec.script.is_empty() && spec.argv.is_empty() {
        return Err(bad("script", "empty (give a batch script or --wrap)"));
    }

    let array = if spec.array.trim().is_empty() {
        None
    } else {
        text("array", &spec.array, MAX_TEXT_BYTES)?;
        Some(Box::new(
            ArraySpec::parse_with_max(&spec.array, max_array_size).map_err(|e| bad("array", e))?,
        ))
    };
    let dependency = if spec.dependency.trim().is_empty() {
        None
    } else {
        text("dependency", &spec.dependency, MAX_TEXT_BYTES)?;
        Some(Box::new(
            Dependency::parse(&spec.dependency).map_err(|e| bad("dependency", e))?,
        ))
    };
    let constraint = if spec.constraint.trim().is_empty() {
        None
    } else {
        text("constraint", &spec.constraint, MAX_TEXT_BYTES)?;
        Some(Box::new(
            Constraint::parse(&spec.constraint).map_err(|e| bad("constraint", e))?,
        ))
    };
    let mode = match v1::NodeMode::try_from(spec.mode) {
        Ok(v1::NodeMode::Kube) => NodeMode::Kube,
        Ok(_) => NodeMode::Batch,
        Err(_) => return Err(bad("mode", format!("unknown node mode {}", spec.mode))),
    };
    let nice = i32::try_from(spec.priority_nice).map_err(|_| bad("nice", "too large"))?;
    if spec.begin_time < 0 {
        return Err(bad("begin", "negative time"));
    }
    let sched = JobSpec {
        name: spec.name,
        user: who.user.clone(),
        uid: who.uid,
        gid: who.gid,
        account: spec.account,
        partition: spec.partition,
        qos: spec.qos,
        time_limit: (spec.time_limit_s > 0).then_some(spec.time_limit_s),
        nodes_min: spec.nodes_min,
        nodes_max: spec.nodes_max,
        ntasks: spec.ntasks,
        ntasks_per_node: spec.ntasks_per_node,
        cpus_per_task: spec.cpus_per_task,
        mem_per_node_mb: (spec.mem_per_node_mb > 0).then_some(spec.mem_per_node_mb),
        mem_per_cpu_mb: (spec.mem_per_cpu_mb > 0).then_some(spec.mem_per_cpu_mb),
        gpus: spec.gpus,
        gpus_per_node: spec.gpus_per_node,
        gpus_per_task: spec.gpus_per_task,
        gpu_type: opt(&spec.gpu_type),
        exclusive: spec.exclusive,
        constraint,
        nodelist: hosts("nodelist", &spec.nodelist)?,
        exclude: hosts("exclude", &spec.exclude)?,
        dependency,
        array,
        hold: spec.hold,
        begin: (spec.begin_time > 0).then_some(spec.begin_time),
        requeue: if spec.requeue {
            Some(true)
        } else if spec.no_requeue {
            Some(false)
        } else {
            None
        },
        mode,
        // Only the bridge's placeholders belong to a pod group (`api/bridge.rs`).
        group_uid: None,
        nice,
        priority: None,
    };
    sched
        .validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    // The spec is ours now: move its payload instead of copying it.
    let payload = Payload {
        script: spec.script,
        script_path: spec.script_path,
        argv: spec.argv,
        workdir: spec.workdir,
        environment: spec.environment.into_iter().collect(),
        stdout: spec.stdout,
        stderr: spec.stderr,
        submit_host: spec.submit_host,
        comment: spec.comment,
        stdin: spec.stdin,
        alloc_sid: spec.alloc_sid,
        open_append: spec.open_mode_append,
        signal: warn_signal,
        umask: spec.umask,
    };
    Ok((sched, payload))
}

/// `12`, `12_3`, `12_[3-5]` from the wire form.
pub fn selector(r: &v1::JobRef) -> Result<JobSelector, Status> {
    if r.job_id == 0 {
        return Err(bad("job id", "0 is not a job id"));
    }
    let tasks = r
        .array_tasks
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if tasks.is_empty() {
        return Ok(JobSelector::job(JobId(r.job_id)));
    }
    text("array tasks", tasks, MAX_TEXT_BYTES)?;
    JobSelector::parse(&format!("{}_{}", r.job_id, tasks))
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

pub fn job_update(u: &v1::JobUpdate) -> Result<JobUpdate, Status> {
    let mut out = JobUpdate {
        time_limit: u.time_limit_s.map(|t| (t > 0).then_some(t)),
        partition: u.partition.clone(),
        name: u.name.clone(),
        account: u.account.clone(),
        qos: u.qos.clone(),
        nice: u
            .nice
            .map(|n| i32::try_from(n).map_err(|_| bad("nice", "too large")))
            .transpose()?,
        dependency: None,
        priority: u.priority.map(|p| (p > 0).then_some(p)),
    };
    for (field, v) in [
        ("partition", &out.partition),
        ("name", &out.name),
        ("account", &out.account),
        ("qos", &out.qos),
    ] {
        if let Some(v) = v {
            text(field, v, 256)?;
        }
    }
    if let Some(d) = &u.dependency {
        out.dependency = Some(if d.trim().is_empty() {
            None
        } else {
            text("dependency", d, MAX_TEXT_BYTES)?;
            Some(Dependency::parse(d).map_err(|e| bad("dependency", e))?)
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use tandem_sched::job::JobState;

    use super::super::{state_from_proto, state_to_proto};
    use super::*;

    fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }

    fn spec() -> v1::JobSpec {
        v1::JobSpec {
            name: "j".into(),
            script: "#!/bin/sh\necho hi\n".into(),
            workdir: "/tmp".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_script_path_with_a_nul_or_past_path_max_is_refused() {
        for bad_path in ["/w/a\0b".to_owned(), format!("/{}", "x".repeat(5000))] {
            let s = v1::JobSpec {
                script_path: bad_path,
                ..spec()
            };
            let err = submit_from_proto(s, &alice(), 1000).unwrap_err();
            assert!(
                err.message().starts_with("script path: "),
                "{}",
                err.message()
            );
        }
    }

    #[test]
    fn identity_wins_over_the_request_and_payload_is_split_off() {
        let mut s = spec();
        s.environment.insert("A".into(), "1".into());
        s.time_limit_s = 60;
        s.gpus_per_node = 2;
        s.array = "0-9%2".into();
        s.dependency = "afterok:1".into();
        s.nodelist = "n[1-2]".into();
        let (j, p) = submit_from_proto(s.clone(), &alice(), 1001).unwrap();
        assert_eq!((j.user.as_str(), j.uid), ("alice", 1000));
        assert_eq!(j.time_limit, Some(60));
        assert_eq!(j.gpus_per_node, 2);
        assert_eq!(j.array.unwrap().throttle, Some(2));
        assert_eq!(j.nodelist, vec!["n1", "n2"]);
        assert!(j.dependency.is_some());
        assert_eq!(p.environment["A"], "1");
        assert_eq!(p.script, s.script);
    }

    #[test]
    fn hostile_input_names_the_field() {
        type Mutate = Box<dyn Fn(&mut v1::JobSpec)>;
        let cases: Vec<(Mutate, &str)> = vec![
            (Box::new(|s| s.workdir = "rel".into()), "workdir"),
            (Box::new(|s| s.workdir.clear()), "workdir"),
            (
                Box::new(|s| s.script = "x".repeat(MAX_SCRIPT_BYTES + 1)),
                "script",
            ),
            (
                Box::new(|s| {
                    s.script.clear();
                }),
                "script",
            ),
            (Box::new(|s| s.script = "a\0b".into()), "NUL"),
            (
                Box::new(|s| {
                    s.environment.insert("A=B".into(), "x".into());
                }),
                "environment",
            ),
            (Box::new(|s| s.array = "5-1".into()), "array"),
            (Box::new(|s| s.array = "0-10".into()), "array"),
            (
                Box::new(|s| s.dependency = "afterwards:1".into()),
                "dependency",
            ),
            (Box::new(|s| s.nodelist = "n[1-".into()), "nodelist"),
            (Box::new(|s| s.mode = 99), "mode"),
            (
                Box::new(|s| {
                    s.requeue = true;
                    s.no_requeue = true;
                }),
                "requeue",
            ),
            (
                Box::new(|s| {
                    s.gpus = 1;
                    s.gpus_per_node = 1;
                }),
                "gpus",
            ),
            (Box::new(|s| s.name = "x".repeat(300)), "name"),
            (Box::new(|s| s.begin_time = -5), "begin"),
            (Box::new(|s| s.umask = Some(0o1777)), "umask"),
        ];
        for (mutate, want) in cases {
            let mut s = spec();
            mutate(&mut s);
            let err = submit_from_proto(s, &alice(), 10).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(want), "{want}: {}", err.message());
            assert!(!err.message().contains('\n'), "one line: {}", err.message());
        }
    }

    #[test]
    fn selectors_and_states_round_trip() {
        let s = selector(&v1::JobRef {
            job_id: 12,
            array_tasks: "[3-5]".into(),
        })
        .unwrap();
        assert_eq!(s.to_string(), "12_[3-5]");
        assert!(
            selector(&v1::JobRef {
                job_id: 0,
                array_tasks: String::new()
            })
            .is_err()
        );
        for st in JobState::ALL {
            assert_eq!(state_from_proto(state_to_proto(st) as i32).unwrap(), st);
        }
        assert!(state_from_proto(0).is_err());
        assert!(state_from_proto(999).is_err());
    }

    #[test]
    fn updates_convert_zero_to_unlimited() {
        let u = job_update(&v1::JobUpdate {
            time_limit_s: Some(0),
            dependency: Some(String::new()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(u.time_limit, Some(None));
        assert_eq!(u.dependency, Some(None));
        assert!(
            job_update(&v1::JobUpdate {
                dependency: Some("bogus".into()),
                ..Default::default()
            })
            .is_err()
        );
    }
}
