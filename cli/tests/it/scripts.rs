//! The compatibility suite: every `tests/scripts/*.sbatch` is a realistic batch script,
//! submitted unchanged through `sbatch` on one local multi-node cluster, with assertions
//! written in the script itself as comments (Slurm ignores them):
//!
//! ```text
//! # expect-state: COMPLETED        final state of every record of the job (default COMPLETED)
//! # expect-exit: 3:0               sacct's ExitCode
//! # expect-file: out-%j.txt        the file the following expect-line checks (default slurm-%j.out)
//! # expect-line: text              a substring the file must contain
//! # sbatch-arg: --export=NONE      an extra sbatch argument (before the script)
//! # script-arg: foo                an argument passed to the script
//! # submit-env: NAME=value         set in sbatch's environment
//! # work-file: in-%u.txt=text      a file written in the work directory before submitting
//! # no-script                      submit only the sbatch-args (for --wrap)
//! ```
//!
//! `%j` and `%A` stand for the submitted job id, `%u` for the user. `scontrol` and `srun`
//! are on the jobs' PATH through `tandem links`, as on a login node.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::Cluster;

#[derive(Debug, Default)]
struct Case {
    name: String,
    path: PathBuf,
    state: String,
    exit: Option<String>,
    /// (file pattern, substrings)
    files: Vec<(String, Vec<String>)>,
    sbatch_args: Vec<String>,
    script_args: Vec<String>,
    env: Vec<(String, String)>,
    /// (file name pattern, one line of content)
    work_files: Vec<(String, String)>,
    no_script: bool,
}

fn load(path: &Path) -> Case {
    let text = std::fs::read_to_string(path).unwrap();
    let mut case = Case {
        name: path.file_name().unwrap().to_string_lossy().into_owned(),
        path: path.to_path_buf(),
        state: "COMPLETED".into(),
        ..Case::default()
    };
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# ") else {
            continue;
        };
        let (key, value) = rest
            .split_once(':')
            .map_or((rest, ""), |(k, v)| (k, v.trim()));
        match key {
            "expect-state" => case.state = value.to_string(),
            "expect-exit" => case.exit = Some(value.to_string()),
            "expect-file" => case.files.push((value.to_string(), Vec::new())),
            "expect-line" => {
                if case.files.is_empty() {
                    case.files.push(("slurm-%j.out".into(), Vec::new()));
                }
                case.files.last_mut().unwrap().1.push(value.to_string());
            }
            "sbatch-arg" => case.sbatch_args.push(value.to_string()),
            "script-arg" => case.script_args.push(value.to_string()),
            "submit-env" => {
                let (k, v) = value.split_once('=').unwrap();
                case.env.push((k.into(), v.into()));
            }
            "work-file" => {
                let (k, v) = value.split_once('=').unwrap();
                case.work_files.push((k.into(), v.into()));
            }
            "no-script" => case.no_script = true,
            _ => {}
        }
    }
    case
}

fn subst(s: &str, id: u64, user: &str) -> String {
    s.replace("%j", &id.to_string())
        .replace("%A", &id.to_string())
        .replace("%u", user)
}

#[test]
fn every_compat_script_runs_unchanged() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts");
    let mut cases: Vec<Case> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sbatch"))
        .map(|p| load(&p))
        .collect();
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(cases.len() >= 30, "the suite has {} scripts", cases.len());

    let c = Cluster::start_with(
        4,
        &[
            "--gpus-per-node",
            "4",
            "--cpus-per-node",
            "8",
            "--mem-per-node",
            "8G",
        ],
    );
    let bin = support::make_links(c.dir.path());
    std::fs::create_dir_all(c.work.join("sub")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let user = tandem_cli::client::user_name();

    let mut submitted = Vec::new();
    for case in &cases {
        for (name, text) in &case.work_files {
            std::fs::write(c.work.join(name.replace("%u", &user)), format!("{text}\n")).unwrap();
        }
        let mut args: Vec<String> = vec!["sbatch".into(), "--parsable".into()];
        args.extend(case.sbatch_args.iter().cloned());
        if !case.no_script {
            args.push(case.path.to_string_lossy().into_owned());
            args.extend(case.script_args.iter().cloned());
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = c.cmd(&argv);
        cmd.env("PATH", &path);
        for (k, v) in &case.env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}: sbatch failed: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
        let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        submitted.push((case, id));
    }

    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for (case, id) in &submitted {
        let records = loop {
            let out = c.ok(&["sacct", "-X", "-j", &id.to_string(), "--json"]);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
            let active = jobs.is_empty()
                || jobs.iter().any(|j| {
                    matches!(
                        j["state"]["current"].as_str(),
                        Some("PENDING" | "RUNNING" | "COMPLETING")
                    )
                });
            if !active || Instant::now() > deadline {
                break jobs;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        for r in &records {
            if r["state"]["current"] != case.state.as_str() {
                failures.push(format!(
                    "{} (job {id}): record {} is {}, want {}",
                    case.name, r["job_id"], r["state"]["current"], case.state
                ));
            }
            if let Some(exit) = &case.exit
                && support::exit_code(r) != *exit
            {
                failures.push(format!(
                    "{} (job {id}): exit {}, want {exit}",
                    case.name,
                    support::exit_code(r)
                ));
            }
        }
        for (pattern, needles) in &case.files {
            let file = c.work.join(subst(pattern, *id, &user));
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            for n in needles {
                let n = subst(n, *id, &user);
                if !text.contains(&n) {
                    failures.push(format!(
                        "{} (job {id}): {} lacks {n:?}; it has {text:?}",
                        case.name,
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        c.controller_log()
    );
}
