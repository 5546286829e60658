//! sacctmgr, sshare and sprio through the real binary against a real local cluster: the
//! tree changed at run time is what submit checks, what Fair Tree ranks and what sprio
//! shows. Permission, rollback and restart rules are covered in-process in
//! `controller/tests/accounting.rs` (these tests run as root, an operator).

mod util;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use util::{Cluster, assert_one_line_error};

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
    let bin = util::make_links(dir.path());
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
