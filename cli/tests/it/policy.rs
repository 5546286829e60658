//! Scheduling policy on a live cluster: fair share between accounts, QOS preemption and QOS
//! limits, each test on its own `tandem up` cluster with a config file, driven through the
//! real sbatch/squeue/scancel/sacct.
//!
//! What belongs here: policy a user can only see with real processes and real time (jobs
//! starting, ending, being requeued). The decisions themselves are unit-tested in
//! `sched/src/tests`; these tests check that the controller applies them end to end.
//!
//! Jobs that must stay running until the test says so wait for a release file in the work
//! dir (see [`held`]), so no assertion depends on how fast a loaded CI machine runs a
//! `sleep`.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Cluster, assert_one_line_error};
use tandem_net::auth::unix_now;

const T: Duration = Duration::from_secs(30);

/// The user the CLI submits as: its name must be in the config's `[[user]]` associations.
/// Resolved as the CLI resolves it: password database, then `$USER`, then the uid.
fn me() -> String {
    let id = |flag: &str| {
        let out = std::process::Command::new("id")
            .arg(flag)
            .output()
            .expect("run id");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    id("-un")
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| id("-u"))
        .expect("cannot tell the current user")
}

/// A `--wrap` command that runs until `release-NAME` appears in the work dir, so the test
/// decides when the job ends.
fn held(name: &str) -> String {
    format!("while [ ! -e release-{name} ]; do sleep 0.1; done")
}

fn release(c: &Cluster, name: &str) {
    std::fs::write(c.work.join(format!("release-{name}")), "").unwrap();
}

// === fair share ===

/// Two accounts with 70/30 shares, each with far more GPU jobs queued than the pool runs,
/// share the pool's GPU-time 70/30 once the start-up transient has passed.
///
/// Choices, to keep this under a minute on two loaded cores and still a real measurement:
/// - 3 nodes x 2 GPUs, one GPU per job: six slots give the scheduler a decision every
///   fraction of a second without many processes.
/// - Jobs sleep 1.0-1.9 s (spread by array index so ends do not come in lockstep) and each
///   account queues a 300-task array, several times what it can run in the test.
/// - Fair share is the only priority factor that differs between the accounts (age and job
///   size weights 0), and only GPUs are billed, so usage is exactly GPU-seconds.
/// - A 10 s half-life, so the start (where both accounts tie and the first one takes every
///   slot) is settled within the 8 s warm-up. Much shorter half-lives skew the split:
///   Fair Tree gives every free slot to the account furthest below its share, and slots
///   stay taken for about a job length after the balance tips, so usage overshoots upwards
///   by about 0.3 and downwards by about 0.7 of (lag / (half-life / ln 2)), favouring the
///   smaller account. Measured here: big gets 67-71% at 10-30 s half-lives (about 69 on
///   average), 65% at 3 s.
/// - The measurement is sacct's: each run's allocated GPUs times the part of its
///   [start, end] inside a 40 s window that begins 8 s after the first start (~165 runs).
///   sacct's whole seconds are the scheduler's too: it charges usage from the same times.
#[test]
fn fair_share_converges_to_account_shares() {
    const WARMUP_S: i64 = 8;
    const WINDOW_S: i64 = 40;
    const SLOTS: f64 = 6.0;
    let user = me();
    let c = Cluster::start_with_config(
        3,
        &format!(
            r#"
            fairshare_half_life = "0:10"
            [priority_weights]
            age = 0
            job_size = 0
            fairshare = 10000
            [billing_weights]
            cpu = 0
            mem_gb = 0
            gpu = 1
            [[account]]
            name = "big"
            shares = 70
            [[account]]
            name = "small"
            shares = 30
            [[user]]
            user = "{user}"
            account = "big"
            [[user]]
            user = "{user}"
            account = "small"
            "#
        ),
    );
    let backlog = |account: &str| {
        let wrap = "sleep 1.$((SLURM_ARRAY_TASK_ID % 10))";
        c.sbatch(&["-A", account, "--array=0-299", "--gpus=1", "--wrap", wrap])
    };
    let (big, small) = (backlog("big"), backlog("small"));

    // The clock starts at the first start the controller recorded.
    let deadline = Instant::now() + T;
    let first_start = loop {
        let started = c
            .all_runs()
            .iter()
            .filter_map(|r| r["time"]["start"].as_i64().filter(|t| *t > 0))
            .min();
        if let Some(t) = started {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "no job started\n{}",
            c.controller_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (from, to) = (first_start + WARMUP_S, first_start + WARMUP_S + WINDOW_S);
    // One second past the window, so every run overlapping it has reported its start.
    let wait = (to + 1 - unix_now()).max(0) as u64;
    std::thread::sleep(Duration::from_secs(wait));

    // Both accounts still had a backlog when the window closed (so neither ever lacked
    // jobs to run in it).
    for (account, array) in [("big", big), ("small", small)] {
        let pending = c.ok(&["squeue", "-h", "-t", "PD", "-A", account, "-o", "%i"]);
        assert!(
            pending.trim().starts_with(&format!("{array}_[")),
            "account {account} ran out of queued jobs: {pending:?}"
        );
    }
    let mut gpu_s: BTreeMap<String, i64> = BTreeMap::new();
    let mut runs_in_window = 0;
    for r in c.all_runs() {
        // Slurm's times are 0 until they happen.
        let Some(start) = r["time"]["start"].as_i64().filter(|t| *t > 0) else {
            continue;
        };
        let end = r["time"]["end"].as_i64().filter(|t| *t > 0).unwrap_or(to);
        let overlap = end.min(to) - start.max(from);
        if overlap > 0 {
            runs_in_window += 1;
        }
        let gpus = support::gpus(&r) as i64;
        assert_eq!(gpus, 1, "{r}");
        *gpu_s
            .entry(r["account"].as_str().unwrap().to_string())
            .or_default() += overlap.max(0) * gpus;
    }
    c.ok(&["scancel", &big.to_string(), &small.to_string()]);

    let used = |a: &str| gpu_s.get(a).copied().unwrap_or(0) as f64;
    let total = used("big") + used("small");
    let share = used("big") / total;
    let utilisation = total / (SLOTS * WINDOW_S as f64);
    println!(
        "fair share: big {:.1}% small {:.1}% of {total} GPU-s in a {WINDOW_S} s window \
         ({runs_in_window} runs, pool {:.0}% busy)",
        100.0 * share,
        100.0 * (1.0 - share),
        100.0 * utilisation
    );
    // Demand exceeded the pool the whole time: otherwise the split says nothing about
    // fair share. (Below 100% only by launch gaps and whole-second rounding.)
    assert!(
        utilisation > 0.85,
        "pool only {:.0}% busy: {gpu_s:?}\n{}",
        100.0 * utilisation,
        c.controller_log()
    );
    assert!(
        (share - 0.70).abs() <= 0.05,
        "big got {:.1}% of the GPU time, want 70 +- 5: {gpu_s:?}",
        100.0 * share
    );
}

// === preemption ===

/// Preemption config: `high` preempts `low` (requeued, 1 s grace), `scavenger` (cancelled)
/// and `patient` (cancelled after a 3 s grace; the clusters' KillWait is 1 s).
const PREEMPT_CONFIG: &str = r#"
    [[qos]]
    name = "low"
    preempt_mode = "requeue"
    grace_time = 1
    [[qos]]
    name = "scavenger"
    preempt_mode = "cancel"
    grace_time = 1
    [[qos]]
    name = "patient"
    preempt_mode = "cancel"
    grace_time = 3
    [[qos]]
    name = "high"
    priority = 100
    preempt = ["low", "scavenger", "patient"]
"#;

#[test]
fn preempted_low_qos_job_is_requeued_and_completes_after_the_high_one() {
    let c = Cluster::start_with_config(2, PREEMPT_CONFIG);
    // First run: holds every GPU until preempted. Second run: finishes at once. The
    // marker file proves the script really ran twice, and that the second run was told it
    // is a restart (SLURM_RESTART_COUNT, unset on a first run).
    let victim = c.sbatch(&[
        "--qos",
        "low",
        "-J",
        "victim",
        "-N",
        "2",
        "--gpus-per-node=2",
        "--wrap",
        "echo run ${SLURM_RESTART_COUNT:-unset} >> runs.txt; \
         if [ $(wc -l < runs.txt) -eq 1 ]; then sleep 300; fi",
    ]);
    c.wait_state(victim, "RUNNING", T);
    // RUNNING is reported when the worker accepts the launch; wait for the script itself.
    c.wait_file(&c.work.join("runs.txt"), "run", T);
    let high = c.sbatch(&[
        "--qos",
        "high",
        "-J",
        "urgent",
        "--gpus=2",
        "--wrap",
        &held("high"),
    ]);

    // The victim goes back to the queue, pending, while the high job runs.
    c.wait_squeue(high, "%T", "RUNNING", T);
    c.wait_squeue(victim, "%T %q", "PENDING low", T);
    let runs = c.runs(victim);
    assert_eq!(runs.len(), 2, "a preempted run and a pending one: {runs:?}");
    let preempted = &runs[0];
    assert_eq!(preempted["state"]["current"], "PREEMPTED", "{preempted}");
    let high_start = c.job(high).unwrap()["time"]["start"].as_i64().unwrap();
    assert!(
        preempted["time"]["end"].as_i64().unwrap() <= high_start,
        "the high job started before its victim ended: {preempted} at {high_start}"
    );
    let detail = c.ok(&["scontrol", "show", "job", &victim.to_string()]);
    assert!(detail.contains("Restarts=1"), "{detail}");
    // Without -D, sacct shows the most recent record: the job pending again, not its
    // preempted run (a script polling sacct for an end state must not stop here).
    let latest = c.job(victim).unwrap();
    assert_eq!(latest["state"]["current"], "PENDING", "{latest}");

    // Still waiting while the high job holds its GPUs (the pool has 4, the victim needs 4).
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.squeue_job(victim, "%T"), "PENDING");
    release(&c, "high");
    let high_rec = c.wait_state(high, "COMPLETED", T);
    let done = c.wait_state(victim, "COMPLETED", T);
    assert!(
        done["time"]["start"].as_i64() >= high_rec["time"]["end"].as_i64(),
        "victim restarted before the high job ended: {done} {high_rec}"
    );
    let states: Vec<Value> = c
        .runs(victim)
        .iter()
        .map(|r| r["state"]["current"].clone())
        .collect();
    assert_eq!(states, ["PREEMPTED", "COMPLETED"]);
    let ran = std::fs::read_to_string(c.work.join("runs.txt")).unwrap();
    assert_eq!(ran, "run unset\nrun 1\n");
}

#[test]
fn preempted_cancel_mode_job_ends_preempted_for_good() {
    let c = Cluster::start_with_config(2, PREEMPT_CONFIG);
    let victim = c.sbatch(&[
        "--qos",
        "scavenger",
        "-N",
        "2",
        "--gpus-per-node=2",
        "--wrap",
        "echo run >> runs.txt; sleep 300",
    ]);
    c.wait_state(victim, "RUNNING", T);
    c.wait_file(&c.work.join("runs.txt"), "run", T);
    let high = c.sbatch(&[
        "--qos",
        "high",
        "-N",
        "2",
        "--gpus-per-node=2",
        "--wrap",
        "true",
    ]);
    let rec = c.wait_end(victim, T);
    assert_eq!(rec["state"]["current"], "PREEMPTED", "{rec}");
    c.wait_state(high, "COMPLETED", T);
    // Not requeued: one run, gone from the queue, the script ran once.
    assert_eq!(c.runs(victim).len(), 1, "{:?}", c.runs(victim));
    assert_eq!(c.squeue_job(victim, "%T"), "");
    assert_eq!(
        std::fs::read_to_string(c.work.join("runs.txt")).unwrap(),
        "run\n"
    );
}

/// Slurm's GraceTime: a job selected for preemption gets SIGTERM at once, as notice, and
/// is killed only when its QOS's grace time has passed (then SIGTERM, KillWait, SIGKILL),
/// time for a training job to write a checkpoint.
#[test]
fn preempted_job_keeps_running_for_its_qos_grace_time() {
    let c = Cluster::start_with_config(2, PREEMPT_CONFIG);
    // Ignores SIGTERM (its children inherit that), so only the final SIGKILL ends it.
    let victim = c.sbatch(&[
        "--qos",
        "patient",
        "-N",
        "2",
        "--gpus-per-node=2",
        "--wrap",
        "trap '' TERM; echo trapped > trapped.txt; sleep 300",
    ]);
    c.wait_state(victim, "RUNNING", T);
    // The notice SIGTERM comes at once: a shell that has not yet run its `trap` dies of it,
    // as it would under Slurm. Preempt only once the script ignores the signal.
    c.wait_file(&c.work.join("trapped.txt"), "trapped", T);
    let high = c.sbatch(&["--qos", "high", "--gpus=2", "--wrap", "true"]);
    let submitted = c.job(high).unwrap()["time"]["submission"].as_i64().unwrap();
    c.wait_state(high, "COMPLETED", T);
    let rec = c.wait_end(victim, T);
    assert_eq!(rec["state"]["current"], "PREEMPTED", "{rec}");
    // Whole seconds on both sides: a real gap of 3 s or more never reads below 3.
    let held_on = rec["time"]["end"].as_i64().unwrap() - submitted;
    assert!(
        held_on >= 3,
        "the victim was killed {held_on} s after the preemptor arrived; its QOS grants 3 s: {rec}"
    );
}

// === QOS limits ===

const LIMITS_CONFIG: &str = r#"
    [[qos]]
    name = "twojobs"
    max_jobs_per_user = 2
    [[qos]]
    name = "threegpus"
    max_gpus_per_user = 3
    [[qos]]
    name = "twosubmits"
    max_submit_per_user = 2
"#;

#[test]
fn job_over_max_jobs_per_user_waits_until_one_ends() {
    let c = Cluster::start_with_config(2, LIMITS_CONFIG);
    let one = c.sbatch(&["--qos", "twojobs", "--gpus=1", "--wrap", &held("1")]);
    let two = c.sbatch(&["--qos", "twojobs", "--gpus=1", "--wrap", &held("2")]);
    c.wait_state(one, "RUNNING", T);
    c.wait_state(two, "RUNNING", T);
    let third = c.sbatch(&["--qos", "twojobs", "--gpus=1", "--wrap", "true"]);
    c.wait_squeue(third, "%T %r", "PENDING QOSMaxJobsPerUserLimit", T);
    // Resources are not what holds it: a job of another QOS starts on the free GPUs.
    let other = c.sbatch(&["--gpus=1", "--wrap", "true"]);
    c.wait_state(other, "COMPLETED", T);
    assert_eq!(
        c.squeue_job(third, "%T %r"),
        "PENDING QOSMaxJobsPerUserLimit"
    );

    release(&c, "1");
    let one_rec = c.wait_state(one, "COMPLETED", T);
    let rec = c.wait_state(third, "COMPLETED", T);
    assert!(
        rec["time"]["start"].as_i64() >= one_rec["time"]["end"].as_i64(),
        "{rec} {one_rec}"
    );
    assert_eq!(c.squeue_job(two, "%T"), "RUNNING");
    release(&c, "2");
    c.wait_state(two, "COMPLETED", T);
}

#[test]
fn job_over_max_gpus_per_user_waits_until_gpus_free() {
    let c = Cluster::start_with_config(2, LIMITS_CONFIG);
    let pair = c.sbatch(&["--qos", "threegpus", "--gpus=2", "--wrap", &held("pair")]);
    let single = c.sbatch(&["--qos", "threegpus", "--gpus=1", "--wrap", &held("one")]);
    c.wait_state(pair, "RUNNING", T);
    c.wait_state(single, "RUNNING", T);
    // 3 GPUs in use; one more would make 4 > 3, although a GPU is free.
    let third = c.sbatch(&["--qos", "threegpus", "--gpus=1", "--wrap", "true"]);
    c.wait_squeue(third, "%T %r", "PENDING QOSMaxGRESPerUser", T);
    // sinfo --json lists the nodes with their GPUs as Slurm's gres strings
    // (`gpu:2`, in use `gpu:1`).
    let sinfo: Value = serde_json::from_str(&c.ok(&["sinfo", "--json"])).unwrap();
    let count = |gres: &Value| -> u64 {
        let s = gres.as_str().unwrap();
        s.rsplit(':').next().unwrap().parse().unwrap()
    };
    let free: u64 = sinfo["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| count(&n["gres"]) - count(&n["gres_used"]))
        .sum();
    assert_eq!(free, 1, "the pool should have one idle GPU");

    release(&c, "pair");
    let pair_rec = c.wait_state(pair, "COMPLETED", T);
    let rec = c.wait_state(third, "COMPLETED", T);
    assert!(
        rec["time"]["start"].as_i64() >= pair_rec["time"]["end"].as_i64(),
        "{rec} {pair_rec}"
    );
    release(&c, "one");
    c.wait_state(single, "COMPLETED", T);
}

#[test]
fn submit_over_max_submit_per_user_is_rejected_with_one_line() {
    let c = Cluster::start_with_config(2, LIMITS_CONFIG);
    let one = c.sbatch(&["--qos", "twosubmits", "--wrap", &held("1")]);
    c.sbatch(&["--qos", "twosubmits", "--hold", "--wrap", "true"]);
    let out = c.run(&["sbatch", "--qos", "twosubmits", "--wrap", "true"]);
    assert_one_line_error(&out, "sbatch", "QOSMaxSubmitJobPerUserLimit");
    assert_eq!(c.all_jobs().len(), 2, "the rejected job was stored");

    // Pending and running jobs both count; a finished one frees its place, and an array
    // counts each task.
    c.wait_state(one, "RUNNING", T);
    release(&c, "1");
    c.wait_state(one, "COMPLETED", T);
    let pair = [
        "sbatch",
        "--qos",
        "twosubmits",
        "--array=0-1",
        "--wrap",
        "true",
    ];
    let out = c.run(&pair);
    assert_one_line_error(&out, "sbatch", "QOSMaxSubmitJobPerUserLimit");
    // Held, so it is not ending while sacct lists the jobs: a job that ends during a
    // listing can be missing from it (see the issue #3 report on list_job_records).
    c.sbatch(&["--qos", "twosubmits", "--hold", "--wrap", "true"]);
    assert_eq!(c.all_jobs().len(), 3);
}
