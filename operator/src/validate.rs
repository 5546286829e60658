//! Static checks of a spec: the CEL rules' Rust twin (see [`crate::crd::cel`]), plus what
//! needs the other objects (a worker set's partitions exist in its cluster). A problem names
//! the field, so the `Degraded` condition and the Event say exactly what to fix.

use std::collections::BTreeSet;
use std::fmt;

use crate::crd::{TandemClusterSpec, WorkerSetSpec};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// JSON path below the object, `spec.accounts[2].parent`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem {
        field: field.into(),
        message: message.into(),
    }
}

fn slurm_time(field: String, v: &Option<String>, out: &mut Vec<Problem>) {
    if let Some(s) = v
        && let Err(e) = tandem_sched::time::parse_duration(s)
    {
        out.push(problem(field, format!("{s:?} is not a Slurm time ({e})")));
    }
}

fn unique<'a>(
    what: &str,
    field: &str,
    names: impl Iterator<Item = &'a str>,
    out: &mut Vec<Problem>,
) {
    let mut seen = BTreeSet::new();
    for (i, n) in names.enumerate() {
        if !seen.insert(n) {
            out.push(problem(
                format!("{field}[{i}].name"),
                format!("{what} {n:?} is declared twice"),
            ));
        }
    }
}

pub fn cluster(spec: &TandemClusterSpec) -> Vec<Problem> {
    let mut out = Vec::new();
    if spec.partitions.is_empty() {
        out.push(problem("spec.partitions", "declare at least one partition"));
    }
    unique(
        "partition",
        "spec.partitions",
        spec.partitions.iter().map(|p| p.name.as_str()),
        &mut out,
    );
    if spec.partitions.iter().filter(|p| p.default).count() > 1 {
        out.push(problem(
            "spec.partitions",
            "at most one partition may be the default",
        ));
    }
    for (i, p) in spec.partitions.iter().enumerate() {
        slurm_time(
            format!("spec.partitions[{i}].maxTime"),
            &p.max_time,
            &mut out,
        );
        slurm_time(
            format!("spec.partitions[{i}].defaultTime"),
            &p.default_time,
            &mut out,
        );
    }
    unique(
        "QOS",
        "spec.qos",
        spec.qos.iter().map(|q| q.name.as_str()),
        &mut out,
    );
    let qos: BTreeSet<&str> = spec
        .qos
        .iter()
        .map(|q| q.name.as_str())
        .chain([tandem_sched::qos::DEFAULT_QOS])
        .collect();
    for (i, q) in spec.qos.iter().enumerate() {
        for (j, x) in q.preempt.iter().enumerate() {
            if !qos.contains(x.as_str()) {
                out.push(problem(
                    format!("spec.qos[{i}].preempt[{j}]"),
                    format!("unknown QOS {x:?}"),
                ));
            }
        }
        slurm_time(format!("spec.qos[{i}].maxWall"), &q.max_wall, &mut out);
    }
    unique(
        "account",
        "spec.accounts",
        spec.accounts.iter().map(|a| a.name.as_str()),
        &mut out,
    );
    let accounts: BTreeSet<&str> = spec.accounts.iter().map(|a| a.name.as_str()).collect();
    for (i, a) in spec.accounts.iter().enumerate() {
        match a.parent.as_deref() {
            None | Some("") | Some("root") => {}
            Some(p) if p == a.name => {
                out.push(problem(
                    format!("spec.accounts[{i}].parent"),
                    "an account cannot be its own parent",
                ));
            }
            Some(p) if !accounts.contains(p) => out.push(problem(
                format!("spec.accounts[{i}].parent"),
                format!("parent account {p:?} is not declared in spec.accounts"),
            )),
            Some(_) => {}
        }
        if a.shares == 0 {
            out.push(problem(
                format!("spec.accounts[{i}].shares"),
                "shares must be at least 1",
            ));
        }
    }
    // Cycles (a -> b -> a) through declared parents.
    for (i, a) in spec.accounts.iter().enumerate() {
        let mut cur = a.parent.as_deref();
        let mut steps = 0;
        while let Some(p) = cur.filter(|p| !p.is_empty() && *p != "root") {
            steps += 1;
            if p == a.name || steps > spec.accounts.len() {
                out.push(problem(
                    format!("spec.accounts[{i}].parent"),
                    "the account tree has a cycle",
                ));
                break;
            }
            cur = spec
                .accounts
                .iter()
                .find(|x| x.name == p)
                .and_then(|x| x.parent.as_deref());
        }
    }
    for (i, m) in spec.bridge.namespaces.iter().enumerate() {
        if !accounts.contains(m.account.as_str()) {
            out.push(problem(
                format!("spec.bridge.namespaces[{i}].account"),
                format!("account {:?} is not declared in spec.accounts", m.account),
            ));
        }
        if let Some(p) = &m.partition
            && !spec.partitions.iter().any(|x| &x.name == p)
        {
            out.push(problem(
                format!("spec.bridge.namespaces[{i}].partition"),
                format!("unknown partition {p:?}"),
            ));
        }
        slurm_time(
            format!("spec.bridge.namespaces[{i}].timeLimit"),
            &m.time_limit,
            &mut out,
        );
    }
    slurm_time(
        "spec.priority.maxAge".into(),
        &spec.priority.max_age,
        &mut out,
    );
    slurm_time(
        "spec.priority.fairshareHalfLife".into(),
        &spec.priority.fairshare_half_life,
        &mut out,
    );
    out
}

/// A worker set against its cluster: every partition must be one the cluster declares.
pub fn worker_set(spec: &WorkerSetSpec, cluster: &TandemClusterSpec) -> Vec<Problem> {
    let mut out = Vec::new();
    if spec.replicas < 0 {
        out.push(problem("spec.replicas", "must be 0 or more"));
    }
    if spec.partitions.is_empty() {
        out.push(problem("spec.partitions", "name at least one partition"));
    }
    for (i, p) in spec.partitions.iter().enumerate() {
        if !cluster.partitions.iter().any(|x| &x.name == p) {
            out.push(problem(
                format!("spec.partitions[{i}]"),
                format!(
                    "partition {p:?} is not declared in TandemCluster {}",
                    spec.cluster_name
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::cluster::{AccountSpec, NamespaceMapping, PartitionSpec};

    fn part(name: &str) -> PartitionSpec {
        PartitionSpec {
            name: name.into(),
            ..Default::default()
        }
    }
    fn acct(name: &str, parent: Option<&str>) -> AccountSpec {
        AccountSpec {
            name: name.into(),
            parent: parent.map(Into::into),
            shares: 1,
            ..Default::default()
        }
    }
    fn fields(p: &[Problem]) -> Vec<&str> {
        p.iter().map(|x| x.field.as_str()).collect()
    }

    #[test]
    fn a_good_cluster_has_no_problem() {
        let spec = TandemClusterSpec {
            partitions: vec![part("gpu"), part("cpu")],
            accounts: vec![
                acct("physics", None),
                acct("hep", Some("physics")),
                acct("bio", Some("root")),
            ],
            ..Default::default()
        };
        assert_eq!(cluster(&spec), vec![]);
    }

    #[test]
    fn an_account_whose_parent_is_missing_is_named() {
        let spec = TandemClusterSpec {
            partitions: vec![part("gpu")],
            accounts: vec![acct("hep", Some("physics"))],
            ..Default::default()
        };
        let p = cluster(&spec);
        assert_eq!(fields(&p), vec!["spec.accounts[0].parent"]);
        assert!(p[0].message.contains("\"physics\""));
    }

    #[test]
    fn duplicates_cycles_bad_times_and_bridge_accounts_are_named() {
        let mut spec = TandemClusterSpec {
            partitions: vec![part("gpu"), part("gpu")],
            accounts: vec![acct("a", Some("b")), acct("b", Some("a"))],
            ..Default::default()
        };
        spec.partitions[0].max_time = Some("forever".into());
        spec.bridge.namespaces.push(NamespaceMapping {
            namespace: "ml".into(),
            account: "nobody".into(),
            ..Default::default()
        });
        let p = cluster(&spec);
        let f = fields(&p);
        assert!(f.contains(&"spec.partitions[1].name"), "{p:?}");
        assert!(f.contains(&"spec.partitions[0].maxTime"), "{p:?}");
        assert!(f.contains(&"spec.accounts[0].parent"), "{p:?}");
        assert!(f.contains(&"spec.bridge.namespaces[0].account"), "{p:?}");
        assert!(
            cluster(&TandemClusterSpec::default())
                .iter()
                .any(|x| x.field == "spec.partitions")
        );
    }

    #[test]
    fn a_worker_set_naming_an_unknown_partition_is_named() {
        let c = TandemClusterSpec {
            partitions: vec![part("gpu")],
            ..Default::default()
        };
        let ws = WorkerSetSpec {
            cluster_name: "c".into(),
            replicas: 1,
            partitions: vec!["gpu".into(), "tpu".into()],
            ..Default::default()
        };
        let p = worker_set(&ws, &c);
        assert_eq!(fields(&p), vec!["spec.partitions[1]"]);
        assert!(p[0].message.contains("\"tpu\""));
    }
}
