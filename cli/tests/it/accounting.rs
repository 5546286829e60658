//! sacctmgr, sshare and sprio through the real binary against a real local cluster: the
//! tree changed at run time is what submit checks, what Fair Tree ranks and what sprio
//! shows. Permission, rollback and restart rules are covered in-process in
//! `controller/tests/it/accounting.rs` (these tests run as root, an operator).

use crate::support;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use support::{Cluster, assert_one_line_error};

/// The user the tests run as (the job owner and the association to add).
fn me() -> String {
    tandem_cli::client::user_name()
}

/// `sshare -a -P` as `account/user -> (RawShares, NormShares)`.
fn sshare(c: &Cluster) -> Vec<(String, String, f64)> {
    let out = c.ok(&["sshare", "-a", "-P"]);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare")
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 7, "{l:?}");
            (
                format!("{}/{}", f[0].trim(), f[1]),
                f[2].to_owned(),
                f[3].parse()
                    .unwrap_or_else(|_| panic!("NormShares in {l:?}")),
            )
        })
        .collect()
}

fn norm(rows: &[(String, String, f64)], key: &str) -> f64 {
    rows.iter()
        .find(|(k, _, _)| k == key)
        .unwrap_or_else(|| panic!("no sshare row {key}: {rows:?}"))
        .2
}

#[test]
fn sacctmgr_tree_feeds_submit_and_sshare() {
    let c = Cluster::start_with_config(1, "enforce_associations = true\n");
    let me = me();

    let out = c.run(&["sbatch", "-A", "physics", "--wrap", "true"]);
    assert_one_line_error(&out, "sbatch", "physics");

    c.ok(&[
        "sacctmgr",
        "-i",
        "add",
        "account",
        "physics",
        "Fairshare=60",
    ]);
    c.ok(&[
        "sacctmgr",
        "-i",
        "add",
        "account",
        "chem",
        "Parent=root",
        "Fairshare=40",
        "Description=chemistry",
    ]);
    // An account alone is not enough under enforce_associations.
    let out = c.run(&["sbatch", "-A", "physics", "--wrap", "true"]);
    assert_one_line_error(&out, "sbatch", "association");
    c.ok(&["sacctmgr", "-i", "add", "user", &me, "Account=physics"]);
    let id = c.sbatch(&["-A", "physics", "--wrap", "true"]);
    let done = c.wait_end(id, Duration::from_secs(30));
    assert_eq!(done["state"]["current"], "COMPLETED", "{done}");
    assert_eq!(done["account"], "physics", "{done}");

    let rows = sshare(&c);
    assert_eq!(rows[0].0, "root/");
    assert!((norm(&rows, "physics/") - 0.6).abs() < 1e-6, "{rows:?}");
    assert!((norm(&rows, "chem/") - 0.4).abs() < 1e-6, "{rows:?}");
    assert!((norm(&rows, &format!("physics/{me}")) - 1.0).abs() < 1e-6);

    c.ok(&[
        "sacctmgr",
        "-i",
        "modify",
        "account",
        "where",
        "name=chem",
        "set",
        "fairshare=140",
    ]);
    let rows = sshare(&c);
    assert!((norm(&rows, "physics/") - 0.3).abs() < 1e-6, "{rows:?}");
    assert!((norm(&rows, "chem/") - 0.7).abs() < 1e-6, "{rows:?}");

    let assoc = c.ok(&[
        "sacctmgr",
        "-P",
        "-n",
        "show",
        "assoc",
        "format=Account,User,Share",
    ]);
    assert_eq!(
        assoc,
        format!("root||1\nphysics||60\nphysics|{me}|1\nchem||140\n")
    );
    let accounts = c.ok(&["sacctmgr", "-p", "show", "account", "chem"]);
    assert_eq!(accounts, "Account|Descr|Org|\nchem|chemistry|chem|\n");
    let users = c.ok(&["sacctmgr", "-P", "-n", "show", "user", &me]);
    assert!(users.starts_with(&format!("{me}|physics|")), "{users}");

    // Bad input: one line, non-zero, nothing changed.
    let before = c.ok(&["sacctmgr", "-P", "show", "assoc"]);
    let bad: [(&[&str], &str); 5] = [
        (&["-i", "add", "account", "bio", "Parent=nope"], "nope"),
        (&["-i", "add", "account", "bio", "Fairshare=-1"], "negative"),
        (&["-i", "delete", "account", "physics"], "physics"),
        (&["-i", "add", "qos", "high", "Preempt=ghost"], "ghost"),
        (
            &["-i", "modify", "user", &me, "set", "fairshare=x"],
            "not a number",
        ),
    ];
    for (args, needle) in bad {
        let mut all = vec!["sacctmgr"];
        all.extend_from_slice(args);
        assert_one_line_error(&c.run(&all), "sacctmgr", needle);
    }
    assert_eq!(c.ok(&["sacctmgr", "-P", "show", "assoc"]), before);
    let qos = c.ok(&["sacctmgr", "-P", "-n", "show", "qos", "format=Name"]);
    assert_eq!(qos, "normal\n");
}

#[test]
fn sprio_factors_add_up_to_the_priority() {
    let c = Cluster::start_with_config(
        1,
        "[priority_weights]\nage = 1000\nfairshare = 10000\njob_size = 100\npartition = 0\nqos = 2000\n\
         [[qos]]\nname = \"high\"\npriority = 100\n",
    );
    let me = me();
    c.ok(&["sacctmgr", "-i", "add", "account", "physics"]);
    c.ok(&["sacctmgr", "-i", "add", "user", &me, "Account=physics"]);
    // The blocker takes the only node's CPUs; the others wait behind it.
    let blocker = c.sbatch(&["-c", "4", "--wrap", "sleep 60"]);
    c.wait_state(blocker, "RUNNING", Duration::from_secs(30));
    let low = c.sbatch(&["-c", "4", "-A", "physics", "--wrap", "true"]);
    let high = c.sbatch(&[
        "-c", "2", "-A", "physics", "--qos", "high", "--wrap", "true",
    ]);

    let v: Value = serde_json::from_str(&c.ok(&["sprio", "--json"])).unwrap();
    let jobs = v["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{v}");
    let f = |j: &Value, k: &str| j["weighted"][k].as_f64().unwrap();
    for j in jobs {
        let tres: f64 = ["cpu", "mem", "gres/gpu"]
            .iter()
            .map(|t| j["weighted"]["tres"][*t].as_f64().unwrap())
            .sum();
        let sum = f(j, "age")
            + f(j, "fairshare")
            + f(j, "job_size")
            + f(j, "partition")
            + f(j, "qos")
            + tres
            - j["nice"].as_f64().unwrap();
        assert_eq!(j["priority"].as_u64().unwrap(), sum.max(1.0) as u64, "{j}");
        // One user association in the tree: the best fair share there is.
        assert_eq!(j["normalized"]["fairshare"], 1.0, "{j}");
    }
    let by_id = |id: u64| jobs.iter().find(|j| j["job_id"] == id).unwrap();
    assert_eq!(f(by_id(high), "qos"), 2000.0);
    assert_eq!(f(by_id(low), "qos"), 0.0);
    // Job size: the larger of the node and CPU fractions; one node of one.
    assert_eq!(f(by_id(low), "job_size"), 100.0);
    assert_eq!(f(by_id(high), "job_size"), 100.0);

    // The table: the weighted columns add up to PRIORITY (each rounded for display).
    let table = c.ok(&["sprio", "-j", &format!("{low},{high}")]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "JOBID",
            "PARTITION",
            "USER",
            "PRIORITY",
            "AGE",
            "FAIRSHARE",
            "JOBSIZE",
            "QOS"
        ]
    );
    lines.next(); // rule
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells.len(), header.len(), "{line:?}");
        assert_eq!(cells[2], me);
        let priority: i64 = cells[3].parse().unwrap();
        let parts: i64 = cells[4..].iter().map(|c| c.parse::<i64>().unwrap()).sum();
        assert!((priority - parts).abs() <= 2, "{line:?}");
    }
    let weights = c.ok(&["sprio", "-w", "-h"]);
    assert_eq!(
        weights.split_whitespace().collect::<Vec<_>>(),
        ["Weights", "1000", "10000", "100", "2000"]
    );
    assert!(c.ok(&["sprio", "-u", "nobody-here"]).lines().count() == 2);
    c.ok(&["scancel", &blocker.to_string()]);
}

#[test]
fn accounting_commands_answer_to_their_names() {
    let dir = tempfile::tempdir().unwrap();
    let bin = support::make_links(dir.path());
    for name in ["sacctmgr", "sshare", "sprio"] {
        let help = Command::new(bin.join(name)).arg("--help").output().unwrap();
        assert!(help.status.success(), "{name} --help");
        assert!(
            String::from_utf8_lossy(&help.stdout).contains(name),
            "{name}"
        );
    }
    // Parsed before any connection: no cluster needed to be told what is wrong.
    let out = Command::new(bin.join("sacctmgr"))
        .args(["-i", "frob", "account", "x"])
        .env("TANDEM_CONFIG", dir.path().join("missing.json"))
        .output()
        .unwrap();
    assert_one_line_error(&out, "sacctmgr", "unknown command");
}

/// `sshare -a -P` rows split into their seven columns (the account's depth indent
/// trimmed).
fn sshare_rows(c: &Cluster) -> Vec<Vec<String>> {
    let out = c.ok(&["sshare", "-a", "-P"]);
    out.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<String> = l.split('|').map(|f| f.trim().to_owned()).collect();
            assert_eq!(f.len(), 7, "{l:?}");
            f
        })
        .collect()
}

/// Issue 29: associations created on first use (a user's first job under an account, as a
/// bridged namespace's pods are) are stored with the job that created them, so a
/// controller killed with SIGKILL comes back with them, their usage and so the same fair
/// share. Before, the restart rebuilt the tree from the configured lists alone: the
/// association vanished from `sacctmgr show assoc`, its usage with it, and its pending
/// jobs were ranked as if the account had never run anything.
#[test]
fn auto_created_associations_and_their_usage_survive_sigkill() {
    let me = me();
    // No user associations configured: every one below is created on first use. Only the
    // fair-share weight, so sprio's numbers move with nothing but fair share; CPU-seconds
    // as usage, decaying so slowly that the seconds of a restart change nothing visible.
    let c = Cluster::start_with_config(
        1,
        r#"
        fairshare_half_life = "1-0"
        [priority_weights]
        age = 0
        job_size = 0
        partition = 0
        qos = 0
        fairshare = 10000
        [billing_weights]
        cpu = 1
        mem_gb = 0
        gpu = 0
        [[account]]
        name = "training"
        shares = 50
        [[account]]
        name = "serving"
        shares = 50
        "#,
    );
    // Training uses more than serving: serving stays under its share.
    let train = c.sbatch(&["-A", "training", "-c", "4", "--wrap", "sleep 4"]);
    let serve = c.sbatch(&["-A", "serving", "-c", "1", "--wrap", "sleep 2"]);
    for id in [train, serve] {
        let done = c.wait_end(id, Duration::from_secs(60));
        assert_eq!(done["state"]["current"], "COMPLETED", "{done}");
    }
    // Nothing runs from here on, so usage only decays; pending jobs keep sprio busy.
    c.ok(&[
        "scontrol",
        "update",
        "NodeName=node-1",
        "State=DRAIN",
        "Reason=restart test",
    ]);
    let pending = [
        c.sbatch(&["-A", "serving", "--wrap", "true"]),
        c.sbatch(&["-A", "training", "--wrap", "true"]),
    ];
    let sprio_args = ["sprio", "-j", &format!("{},{}", pending[0], pending[1])];

    let assoc_before = c.ok(&["sacctmgr", "-P", "show", "assoc"]);
    let shares_before = sshare_rows(&c);
    let sprio_before = c.ok(&sprio_args);
    // The associations were created, and charged, before the crash.
    for account in ["serving", "training"] {
        assert!(
            assoc_before
                .lines()
                .any(|l| l.contains(&format!("|{account}|{me}|"))),
            "no {account}/{me} association: {assoc_before}"
        );
        let row = shares_before
            .iter()
            .find(|r| r[0] == account && r[1] == me)
            .unwrap_or_else(|| panic!("no sshare row {account}/{me}: {shares_before:?}"));
        let usage: f64 = row[4].parse().unwrap();
        assert!(usage >= 1.0, "{account}/{me} was not charged: {row:?}");
    }
    assert_eq!(sprio_before.lines().count(), 4, "{sprio_before}");

    let mut controller = c.kill_and_restart_controller();

    assert_eq!(
        c.ok(&["sacctmgr", "-P", "show", "assoc"]),
        assoc_before,
        "sacctmgr show assoc changed across the restart\n{}",
        c.controller_log()
    );
    let shares_after = sshare_rows(&c);
    assert_eq!(
        shares_after.len(),
        shares_before.len(),
        "sshare rows changed across the restart: {shares_before:?} -> {shares_after:?}"
    );
    for (b, a) in shares_before.iter().zip(&shares_after) {
        // Account, user, raw and normalized shares: identical.
        assert_eq!(a[..4], b[..4], "{b:?} -> {a:?}");
        // RawUsage (whole units): only decay over a few seconds of a one-day half-life,
        // so within 1% (and one unit of rounding); lost usage would show as 0.
        let (ub, ua): (f64, f64) = (b[4].parse().unwrap(), a[4].parse().unwrap());
        assert!(
            ua <= ub + 1.0 && ua >= ub * 0.99 - 1.0,
            "RawUsage {b:?} -> {a:?}"
        );
        // EffectvUsage and FairShare are ratios, which a uniform decay leaves alone.
        for col in [5, 6] {
            let num = |s: &str| s.parse::<f64>().unwrap_or(f64::NAN);
            let (fb, fa) = (num(&b[col]), num(&a[col]));
            assert!(
                b[col] == a[col] || (fb - fa).abs() < 1e-4,
                "column {col}: {b:?} -> {a:?}"
            );
        }
    }
    assert_eq!(
        c.ok(&sprio_args),
        sprio_before,
        "the pending jobs' priorities changed across the restart"
    );

    let down = std::process::Command::new(support::TANDEM)
        .args(["down", "--grace", "3", "--state-dir"])
        .arg(c.state_dir())
        .output()
        .unwrap();
    assert!(down.status.success());
    controller.wait().unwrap();
}

/// Issue 29: sacct's AllocTRES and ReqTRES, and scontrol's TRES, carry the job's billing
/// TRES weighted by the billing weights fair share charges, not `billing=<CPUs>`. Slurm
/// 22.05 with `TRESBillingWeights="CPU=1.5,GRES/gpu=4"`: 3 CPUs and 2 GPUs showed
/// `billing=12` (12.5 truncated) in AllocTRES and ReqTRES, a held job asking 3 CPUs and
/// 1 GPU `billing=8` in ReqTRES and in scontrol's `TRES=`.
#[test]
fn sacct_billing_is_weighted_as_fair_share_charges() {
    let me = me();
    let c = Cluster::start_with_config(
        1,
        r#"
        [billing_weights]
        cpu = 1.5
        mem_gb = 0.5
        gpu = 4
        [[account]]
        name = "physics"
        shares = 1
        "#,
    );
    // 3 x 1.5 + 1 GiB x 0.5 + 2 x 4 = 13.5 a second: billing=13.
    let ran = c.sbatch(&[
        "-A", "physics", "-c", "3", "--gpus=2", "--mem=1G", "--wrap", "sleep 2",
    ]);
    // Held, so billed by what it asks: 2 x 1.5 + 2 GiB x 0.5 + 1 x 4 = 8.
    let held = c.sbatch(&[
        "-H", "-A", "physics", "-c", "2", "--gpus=1", "--mem=2G", "--wrap", "true",
    ]);
    let done = c.wait_end(ran, Duration::from_secs(60));
    assert_eq!(done["state"]["current"], "COMPLETED", "{done}");
    let sacct = c.ok(&[
        "sacct",
        "-j",
        &format!("{ran},{held}"),
        "-P",
        "-n",
        "-o",
        "JobID,AllocTRES,ReqTRES,ElapsedRaw",
    ]);
    let rows: Vec<Vec<&str>> = sacct.lines().map(|l| l.split('|').collect()).collect();
    let row = |id: &str| {
        rows.iter()
            .find(|r| r[0] == id)
            .unwrap_or_else(|| panic!("no sacct line {id}: {sacct}"))
    };
    let job = row(&ran.to_string());
    assert_eq!(
        job[1..3],
        [
            "billing=13,cpu=3,gres/gpu=2,mem=1G,node=1",
            "billing=13,cpu=3,gres/gpu=2,mem=1G,node=1"
        ],
        "{sacct}"
    );
    // The batch step is not billed, as in Slurm.
    assert!(
        !row(&format!("{ran}.batch"))[1].contains("billing"),
        "{sacct}"
    );
    let pending = row(&held.to_string());
    assert_eq!(
        pending[1..3],
        ["", "billing=8,cpu=2,gres/gpu=1,mem=2G,node=1"],
        "{sacct}"
    );
    let show = c.ok(&["scontrol", "show", "job", &held.to_string()]);
    assert!(
        show.contains("\n   TRES=cpu=2,mem=2G,node=1,billing=8,gres/gpu=1\n"),
        "{show}"
    );
    // And sshare charged the same weights: 13.5 units for each second the job ran.
    let elapsed: f64 = job[3].parse().unwrap();
    assert!(elapsed >= 1.0, "{sacct}");
    let usage: f64 = sshare_rows(&c)
        .iter()
        .find(|r| r[0] == "physics" && r[1] == me)
        .unwrap_or_else(|| panic!("no sshare row physics/{me}"))[4]
        .parse()
        .unwrap();
    assert!(
        (usage / elapsed - 13.5).abs() < 1.0,
        "RawUsage {usage} over {elapsed} s is not 13.5 a second"
    );
}
