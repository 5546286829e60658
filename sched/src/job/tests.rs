use crate::Tres;

use super::*;

#[test]
fn states_print_slurm_names_and_codes() {
    assert_eq!(JobState::NodeFail.to_string(), "NODE_FAIL");
    assert_eq!(JobState::Pending.code(), "PD");
    assert_eq!(JobState::parse("cd"), Some(JobState::Completed));
    assert_eq!(JobState::parse("timeout"), Some(JobState::Timeout));
    assert!(JobState::Cancelled.is_terminal() && !JobState::Running.is_terminal());
    for st in JobState::ALL {
        assert_eq!(JobState::parse(st.name()), Some(st));
        assert_eq!(JobState::parse(st.code()), Some(st));
    }
    assert_eq!(
        Reason::QOSMaxJobsPerUserLimit.to_string(),
        "QOSMaxJobsPerUserLimit"
    );
}

#[test]
fn validate_names_the_problem() {
    let ok = JobSpec::test();
    assert_eq!(ok.validate(), Ok(()));
    let cases: Vec<(JobSpec, &str)> = vec![
        (
            JobSpec {
                user: String::new(),
                ..JobSpec::test()
            },
            "user",
        ),
        (
            JobSpec {
                mem_per_node_mb: Some(1),
                mem_per_cpu_mb: Some(1),
                ..JobSpec::test()
            },
            "mutually exclusive",
        ),
        (
            JobSpec {
                gpus: 1,
                gpus_per_node: 1,
                ..JobSpec::test()
            },
            "only one of",
        ),
        (
            JobSpec {
                gpu_type: Some("a100".into()),
                ..JobSpec::test()
            },
            "without a GPU count",
        ),
        (
            JobSpec::test().nodes(4).with(|s| s.nodes_max = 2),
            "below minimum",
        ),
        (
            JobSpec::test()
                .nodes(2)
                .ntasks(10)
                .with(|s| s.ntasks_per_node = 2),
            "do not fit",
        ),
        (
            JobSpec {
                time_limit: Some(u64::MAX),
                ..JobSpec::test()
            },
            "100 years",
        ),
        (
            JobSpec {
                name: "x".repeat(300),
                ..JobSpec::test()
            },
            "longer than",
        ),
        (
            JobSpec {
                nice: 1_000_000,
                ..JobSpec::test()
            },
            "nice",
        ),
        (
            JobSpec {
                nodelist: vec!["a".into()],
                exclude: vec!["a".into()],
                ..JobSpec::test()
            },
            "both required",
        ),
    ];
    for (spec, want) in cases {
        let e = spec.validate().unwrap_err();
        assert!(e.to_string().contains(want), "{want}: {e}");
    }
}

#[test]
fn shapes_follow_slurm_defaults() {
    let caps = NodeCaps { cpus: 32, gpus: 8 };
    // (spec, nodes, tasks/node, per-node tres)
    let cases: Vec<(JobSpec, u32, u32, Tres)> = vec![
        (JobSpec::test(), 1, 1, Tres::new(1, 0, 0)),
        (
            JobSpec::test().nodes(2).gpus_per_node(8),
            2,
            1,
            Tres::new(1, 0, 8),
        ),
        (JobSpec::test().ntasks(64), 2, 32, Tres::new(32, 0, 0)),
        (
            JobSpec::test().ntasks(8).cpus_per_task(4).mem_per_cpu(1000),
            1,
            8,
            Tres::new(32, 32_000, 0),
        ),
        (JobSpec::test().gpus(16), 2, 1, Tres::new(1, 0, 8)),
        (
            JobSpec::test()
                .nodes(2)
                .ntasks(4)
                .with(|s| s.gpus_per_task = 2),
            2,
            2,
            Tres::new(2, 0, 4),
        ),
        (JobSpec::test().mem_mb(4096), 1, 1, Tres::new(1, 4096, 0)),
        // Without -N, tasks spread until their GPUs fit (8 a node here).
        (
            JobSpec::test().ntasks(4).with(|s| s.gpus_per_task = 4),
            2,
            2,
            Tres::new(2, 0, 8),
        ),
    ];
    for (spec, nodes, tpn, per_node) in cases {
        let s = spec.shape(caps, 0);
        assert_eq!(
            (s.nodes, s.tasks_per_node, s.per_node),
            (nodes, tpn, per_node),
            "{spec:?}"
        );
    }
    assert_eq!(
        JobSpec::test()
            .cpus_per_task(2)
            .shape(caps, 100)
            .per_node
            .mem_mb,
        200
    );
}

#[test]
fn array_ids_fold() {
    let mut job = Job::test(JobId(12), JobSpec::test().array("6-99%4"));
    job.array = Some(Box::new(ArrayState::new(
        job.spec.array.as_deref().unwrap(),
    )));
    assert_eq!(job.display_id(), "12_[6-99%4]");
    let task = Job {
        array: None,
        array_job_id: Some(JobId(12)),
        array_task_id: Some(3),
        ..job
    };
    assert_eq!(task.display_id(), "12_3");
}
