use super::*;
use crate::directives;
use tandem_proto::v1::JobSpec;

/// The command line as `sbatch` parses it, for these tests.
#[derive(Debug, Parser)]
#[command(no_binary_name = true, infer_long_args = true)]
struct Cmd {
    #[command(flatten)]
    opts: JobOpts,
}

fn cli(args: &[&str]) -> JobOpts {
    Cmd::try_parse_from(args).unwrap().opts
}

fn cli_err(args: &[&str]) -> String {
    clap_one_line(&Cmd::try_parse_from(args).unwrap_err())
}

fn ctx() -> SubmitContext {
    SubmitContext {
        env: vec![
            ("HOME".into(), "/home/alice".into()),
            ("USER".into(), "alice".into()),
            ("PATH".into(), "/opt/bin:/usr/bin".into()),
            ("FOO".into(), "foo".into()),
            ("SLURM_CONF".into(), "/etc/slurm.conf".into()),
        ],
        cwd: PathBuf::from("/work/alice"),
        hostname: "login-1".into(),
        sid: 4321,
        umask: 0o027,
        now: 1_700_000_000,
        utc_offset_s: Some(0),
    }
}

fn spec_of(script: &str, args: &[&str]) -> JobSpec {
    let from_script = JobOpts::from_directives(&directives::parse(script).unwrap()).unwrap();
    let opts = from_script.merge(cli(args));
    opts.to_spec(script.to_string(), vec![], "job.sh", &ctx())
        .unwrap()
}

#[test]
fn short_and_long_forms_reach_the_spec() {
    let s = spec_of(
        "#!/bin/sh\n",
        &[
            "-J",
            "train",
            "-o",
            "out-%j.txt",
            "-e",
            "/abs/err",
            "-p",
            "gpu",
            "-A",
            "ml",
            "-t",
            "1-02:03:04",
            "-N2",
            "-n",
            "8",
            "-c",
            "4",
            "--mem=4G",
            "--gpus-per-node=a100:2",
            "--chdir=sub",
            "--exclusive",
            "-C",
            "ib",
            "--hold",
            "--comment",
            "x",
            "--nice",
        ],
    );
    assert_eq!(s.name, "train");
    assert_eq!(s.workdir, "/work/alice/sub");
    assert_eq!(s.stdout, "/work/alice/sub/out-%j.txt");
    assert_eq!(s.stderr, "/abs/err");
    assert_eq!((s.partition.as_str(), s.account.as_str()), ("gpu", "ml"));
    assert_eq!(s.time_limit_s, 86_400 + 2 * 3600 + 3 * 60 + 4);
    assert_eq!(
        (s.nodes_min, s.nodes_max, s.ntasks, s.cpus_per_task),
        (2, 2, 8, 4)
    );
    assert_eq!(s.mem_per_node_mb, 4096);
    assert_eq!((s.gpus_per_node, s.gpu_type.as_str()), (2, "a100"));
    assert!(s.exclusive && s.hold);
    assert_eq!((s.constraint.as_str(), s.comment.as_str()), ("ib", "x"));
    assert_eq!(s.priority_nice, 100);
    let s = spec_of(
        "#!/bin/sh\n",
        &["--array=0-99:2%4", "-d", "afterok:3:4,singleton"],
    );
    assert_eq!(
        (s.array.as_str(), s.dependency.as_str()),
        ("0-99:2%4", "afterok:3:4,singleton")
    );
    assert_eq!(s.submit_host, "login-1");
    assert_eq!(s.alloc_sid, 4321);
}

#[test]
fn command_line_wins_over_script_and_later_lines_win() {
    let script = "#!/bin/sh\n#SBATCH -J first\n#SBATCH -J second\n#SBATCH -p debug\n#SBATCH -t 5\n#SBATCH --requeue\n";
    let s = spec_of(script, &[]);
    assert_eq!(
        (s.name.as_str(), s.partition.as_str(), s.time_limit_s),
        ("second", "debug", 300)
    );
    assert!(s.requeue);
    let s = spec_of(script, &["-p", "gpu", "--no-requeue"]);
    assert_eq!((s.name.as_str(), s.partition.as_str()), ("second", "gpu"));
    assert!(!s.requeue && s.no_requeue);
    // --mem on the command line replaces --mem-per-cpu from the script.
    let s = spec_of("#!/bin/sh\n#SBATCH --mem-per-cpu=100\n", &["--mem", "2G"]);
    assert_eq!((s.mem_per_node_mb, s.mem_per_cpu_mb), (2048, 0));
}

#[test]
fn defaults_without_options() {
    let s = spec_of("#!/bin/sh\necho\n", &[]);
    assert_eq!(s.name, "job.sh");
    assert_eq!(s.workdir, "/work/alice");
    assert_eq!(s.stdout, "");
    assert_eq!((s.time_limit_s, s.nodes_min, s.gpus), (0, 0, 0));
    // --export=ALL is the default: the whole environment travels.
    assert_eq!(s.environment.get("FOO").map(String::as_str), Some("foo"));
}

#[test]
fn gpu_forms() {
    let cases: &[(&[&str], u32, u32, u32, &str)] = &[
        (&["-G", "4"], 4, 0, 0, ""),
        (&["--gpus=h100:8"], 8, 0, 0, "h100"),
        (&["--gres=gpu:2"], 0, 2, 0, ""),
        (&["--gres=gpu:a100:3"], 0, 3, 0, "a100"),
        (&["--gres=gpu"], 0, 1, 0, ""),
        (&["--gres=gpu:a100"], 0, 1, 0, "a100"),
        (&["--gpus-per-task=1", "-n", "2"], 0, 0, 1, ""),
    ];
    for (args, gpus, per_node, per_task, ty) in cases {
        let s = spec_of("#!/bin/sh\n", args);
        assert_eq!(
            (
                s.gpus,
                s.gpus_per_node,
                s.gpus_per_task,
                s.gpu_type.as_str()
            ),
            (*gpus, *per_node, *per_task, *ty),
            "args {args:?}"
        );
    }
}

#[test]
fn bad_options_fail_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "--bogus"),
        (&["-t", "-5"], "negative"),
        (&["-t", "abc"], "abc"),
        (&["-t", "1:2:3:4"], "1:2:3:4"),
        (&["-N", "0"], "positive"),
        (&["-N", "4-2"], "minimum above"),
        (&["-n", "x"], "\"x\""),
        (&["--mem", "4Q"], "unit"),
        (&["--mem", "-1"], "negative"),
        (&["-G", "a:b:c"], "[TYPE:]N"),
        (&["--gres=nvme:1"], "only gpu"),
        (&["--gres=gpu:a:b:c"], "gpu[:TYPE][:N]"),
        (&["--export=NONE,FOO"], "NONE"),
        (&["--export=1BAD=x"], "variable name"),
        (&["--nice=-5"], "non-negative"),
        (&["-w", "node-[1-"], "node-[1-"),
        (&["--array=5-1"], "5-1"),
        (&["--array=x"], "\"x\""),
        (&["--dependency=afterok:abc"], "abc"),
        (&["-d", "sometime"], "sometime"),
        (&["--signal=NOPE"], "Unknown job signal"),
        (&["--signal=USR1@-5"], "0 to 65535"),
        (&["--signal=USR1@70000"], "0 to 65535"),
        (&["--signal=X:USR1"], "R: or B:"),
        (&["--signal=BB:USR1"], "R: or B:"),
        (&["--signal=:USR1"], "R: or B:"),
        (&["--open-mode=sideways"], "append or truncate"),
    ];
    for (args, want) in cases {
        let msg = cli_err(args);
        assert!(!msg.contains('\n'), "one line for {args:?}: {msg}");
        assert!(
            msg.contains(want),
            "{args:?}: {msg:?} should mention {want:?}"
        );
    }
}

#[test]
fn semantic_conflicts_are_errors() {
    let c = ctx();
    let run = |args: &[&str]| cli(args).to_spec("#!/bin/sh\n".into(), vec![], "x", &c);
    assert_eq!(
        run(&["--mem=1", "--mem-per-cpu=1"]),
        Err(OptsError::MemConflict)
    );
    assert_eq!(
        run(&["--requeue", "--no-requeue"]),
        Err(OptsError::RequeueConflict)
    );
    assert_eq!(
        run(&["-N", "4", "-n", "2"]),
        Err(OptsError::NodesOverTasks { min: 4, ntasks: 2 })
    );
    assert!(matches!(
        run(&["--gpus=a100:1", "--gres=gpu:h100:1"]),
        Err(OptsError::GpuTypeConflict { .. })
    ));
    assert!(matches!(
        run(&["--begin=yesterday-ish"]),
        Err(OptsError::Begin(_))
    ));
}

#[test]
fn malformed_directive_names_its_line() {
    let script = "#!/bin/sh\n#SBATCH -J ok\n\n#SBATCH --time=garbage\n";
    let err = JobOpts::from_directives(&directives::parse(script).unwrap()).unwrap_err();
    match &err {
        OptsError::Directive { line, message } => {
            assert_eq!(*line, 4);
            assert!(message.contains("garbage"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let script = "#!/bin/sh\n#SBATCH stray-word\n";
    let err = JobOpts::from_directives(&directives::parse(script).unwrap()).unwrap_err();
    assert!(err.to_string().starts_with("line 2: "), "{err}");
}

#[test]
fn export_modes() {
    let env = ctx().env;
    let all = build_environment(&parse_export("ALL,FOO=bar,NEW=1").unwrap(), &env);
    assert_eq!(all.get("FOO").map(String::as_str), Some("bar"));
    assert_eq!(all.get("NEW").map(String::as_str), Some("1"));
    assert_eq!(all.get("HOME").map(String::as_str), Some("/home/alice"));

    let only = build_environment(&parse_export("FOO,X=y").unwrap(), &env);
    let keys: Vec<&str> = only.keys().map(String::as_str).collect();
    assert_eq!(keys, ["FOO", "SLURM_CONF", "X"]);

    let none = build_environment(&parse_export("NONE").unwrap(), &env);
    assert!(!none.contains_key("FOO"));
    assert_eq!(
        none.get("PATH").map(String::as_str),
        Some("/usr/local/bin:/usr/bin:/bin")
    );
    assert_eq!(none.get("HOME").map(String::as_str), Some("/home/alice"));
    assert!(none.contains_key("SLURM_CONF"));
}

#[test]
fn long_options_may_be_abbreviated_like_getopt() {
    assert_eq!(cli(&["--job=x"]).job_name.as_deref(), Some("x"));
    assert_eq!(cli(&["--part", "gpu"]).partition.as_deref(), Some("gpu"));
}

#[test]
fn wrap_builds_a_sh_script() {
    let s = wrap_script("echo hi");
    assert!(s.starts_with("#!/bin/sh\n"));
    assert!(s.ends_with("echo hi\n"));
    assert!(directives::parse(&s).unwrap().is_empty());
}

#[test]
fn sbatch_environment_variables_sit_between_script_and_command_line() {
    let env = vec![
        ("SBATCH_PARTITION".to_string(), "gpu".to_string()),
        ("SBATCH_TIMELIMIT".to_string(), "10".to_string()),
        ("SBATCH_REQUEUE".to_string(), "1".to_string()),
        ("UNRELATED".to_string(), "x".to_string()),
    ];
    let script = JobOpts::from_directives(
        &directives::parse("#!/bin/sh\n#SBATCH -p debug -t 5 -J s\n").unwrap(),
    )
    .unwrap();
    let merged = script
        .merge(JobOpts::from_env(&env).unwrap())
        .merge(cli(&["-t", "20"]));
    assert_eq!(merged.partition.as_deref(), Some("gpu"));
    assert_eq!(merged.time, Some(TimeLimit(Some(1200))));
    assert_eq!(merged.job_name.as_deref(), Some("s"));
    assert!(merged.requeue);
    let bad = vec![("SBATCH_TIMELIMIT".to_string(), "soon".to_string())];
    let err = JobOpts::from_env(&bad).unwrap_err().to_string();
    assert!(err.starts_with("SBATCH_TIMELIMIT: "), "{err}");
}

#[test]
fn signal_open_mode_and_input_reach_the_spec() {
    struct Case {
        args: &'static [&'static str],
        want_signal: (i32, u32, bool),
    }
    let cases = [
        Case {
            args: &["--signal=USR1"],
            want_signal: (10, 60, false),
        },
        Case {
            args: &["--signal=B:SIGUSR2@120"],
            want_signal: (12, 120, true),
        },
        Case {
            args: &["--signal=R:10@0"],
            want_signal: (10, 0, false),
        },
        Case {
            args: &["--signal=RB:term@5"],
            want_signal: (15, 5, true),
        },
        Case {
            args: &[],
            want_signal: (0, 0, false),
        },
    ];
    for case in cases {
        let s = spec_of("#!/bin/sh\n", case.args);
        assert_eq!(
            (s.signal_number, s.signal_before_s, s.signal_batch_only),
            case.want_signal,
            "args {:?}",
            case.args
        );
    }
    let s = spec_of(
        "#!/bin/sh\n#SBATCH --open-mode=append\n#SBATCH -i in-%j.txt\n",
        &[],
    );
    assert!(s.open_mode_append);
    assert_eq!(s.stdin, "/work/alice/in-%j.txt", "relative to the workdir");
    let s = spec_of(
        "#!/bin/sh\n#SBATCH --open-mode=append\n",
        &["--open-mode=t", "--input=/dev/null"],
    );
    assert!(!s.open_mode_append, "the command line wins");
    assert_eq!(s.stdin, "/dev/null");
    let s = spec_of("#!/bin/sh\n", &[]);
    assert_eq!((s.open_mode_append, s.stdin.as_str()), (false, ""));
    let env = vec![
        ("SBATCH_SIGNAL".to_string(), "B:USR1@30".to_string()),
        ("SBATCH_OPEN_MODE".to_string(), "append".to_string()),
    ];
    let from_env = JobOpts::from_env(&env).unwrap();
    assert_eq!(
        from_env.signal,
        Some(WarnSignal {
            number: 10,
            before_s: 30,
            batch_only: true
        })
    );
    assert_eq!(from_env.open_mode, Some(OpenMode::Append));
}

/// `-N`, `-n` and `-w` settled as the reference Slurm 22.05 did (8 nodes n[1-8]); each case
/// quotes what its sbatch or srun printed and where the job ran (`scontrol show job`'s
/// `ReqNodeList` and `NumNodes`, or `SLURM_JOB_NODELIST` in the step).
#[test]
fn node_counts_settle_against_tasks_and_nodelists_as_slurm_does() {
    use NodelistOverflow::{Eliminate, Refuse};
    let settle = |args: &[&str], overflow| {
        let mut o = cli(args);
        let r = o.settle_node_count(overflow);
        (r, o.nodes.map(|r| (r.min, r.max)), o.nodelist)
    };
    let warn = |n: u32, nodes: u32| {
        format!("Warning: can't run {n} processes on {nodes} nodes, setting nnodes to {n}")
    };
    // sbatch -n1 -w n2,n1: the warning, ReqNodeList=n1 NumNodes=1-1.
    for o in [Refuse, Eliminate] {
        assert_eq!(
            settle(&["-n1", "-w", "n2,n1"], o),
            (Ok(vec![warn(1, 2)]), Some((1, 1)), Some("n1".into()))
        );
    }
    // sbatch -n2 -w n[1-3]: "on 3 nodes", n[1-2]; -n1 -N2 -w n1,n2: "on 2 nodes", n1.
    assert_eq!(
        settle(&["-n2", "-w", "n[1-3]"], Refuse),
        (Ok(vec![warn(2, 3)]), Some((2, 2)), Some("n[1-2]".into()))
    );
    assert_eq!(
        settle(&["-n1", "-N2", "-w", "n1,n2"], Refuse),
        (Ok(vec![warn(1, 2)]), Some((1, 1)), Some("n1".into()))
    );
    // sbatch -H -n2 -N3-4: the warning, then submitted with 2 nodes.
    assert_eq!(
        settle(&["-n2", "-N3-4"], Refuse),
        (Ok(vec![warn(2, 3)]), Some((2, 2)), None)
    );
    // sbatch -N1 -w n1,n2: `invalid number of nodes (-N 2-1)`; -N1-2 -w n[1-3]: `(-N 3-2)`.
    let refused = |args: &[&str]| {
        settle(args, Refuse)
            .0
            .map_err(|e| e.to_string())
            .expect_err("refused")
    };
    assert_eq!(
        refused(&["-N1", "-w", "n1,n2"]),
        "invalid number of nodes (-N 2-1)"
    );
    assert_eq!(
        refused(&["-N1-2", "-w", "n[1-3]"]),
        "invalid number of nodes (-N 3-2)"
    );
    // sbatch -N1 -n1 -w n1,n1: one node, accepted silently; -N3 -w n1,n2 likewise.
    assert_eq!(
        settle(&["-N1", "-n1", "-w", "n1,n1"], Refuse),
        (Ok(vec![]), Some((1, 1)), Some("n1,n1".into()))
    );
    assert_eq!(
        settle(&["-N3", "-w", "n1,n2"], Refuse),
        (Ok(vec![]), Some((3, 3)), Some("n1,n2".into()))
    );
    // srun -N1 -w n3,n1 ran on n3; -N2 -w n3,n1,n2 on n[1,3]; -N1 -n1 -w n1,n1 said (2 > 1).
    let eliminated = |listed: usize, max: u32| {
        format!(
            "error: Required nodelist includes more nodes than permitted by max-node count \
             ({listed} > {max}). Eliminating nodes from the nodelist."
        )
    };
    assert_eq!(
        settle(&["-N1", "-w", "n3,n1"], Eliminate),
        (Ok(vec![eliminated(2, 1)]), Some((1, 1)), Some("n3".into()))
    );
    assert_eq!(
        settle(&["-N2", "-w", "n3,n1,n2"], Eliminate),
        (
            Ok(vec![eliminated(3, 2)]),
            Some((2, 2)),
            Some("n[1,3]".into())
        )
    );
    assert_eq!(
        settle(&["-N1", "-n1", "-w", "n1,n1"], Eliminate),
        (Ok(vec![eliminated(2, 1)]), Some((1, 1)), Some("n1".into()))
    );
    // Nothing to settle: no -w, or no -N and no -n.
    assert_eq!(settle(&["-N2"], Refuse), (Ok(vec![]), Some((2, 2)), None));
    assert_eq!(
        settle(&["-w", "n[1-3]"], Refuse),
        (Ok(vec![]), None, Some("n[1-3]".into()))
    );
}
