//! The checker's rules on a fake `/proc` (exact and fast), and the checker itself on real
//! processes: a fake batch job under a fake worker and a real pod of the process kubelet.

use super::*;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use crate::testkit::{PodFixture, TestCluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

// === a fake /proc ===

struct FakeProc(tempfile::TempDir);

impl FakeProc {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }

    fn root(&self) -> &Path {
        self.0.path()
    }

    /// A process as `/proc` shows it (state `S`, or `Z` for a zombie).
    fn add(&self, pid: u32, ppid: u32, comm: &str, state: &str, start: u64, env: &[(&str, &str)]) {
        let dir = self.root().join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("stat"),
            format!(
                "{pid} ({comm}) {state} {ppid} 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"
            ),
        )
        .unwrap();
        let mut environ = Vec::new();
        for (k, v) in env {
            environ.extend_from_slice(format!("{k}={v}\0").as_bytes());
        }
        std::fs::write(dir.join("environ"), environ).unwrap();
        std::fs::write(dir.join("cmdline"), format!("{comm}\0--flag\0")).unwrap();
    }

    fn remove(&self, pid: u32) {
        std::fs::remove_dir_all(self.root().join(pid.to_string())).unwrap();
    }
}

const NODE: &str = NODE_VAR;
const POD: &str = POD_VAR;
const OWNER: &str = POD_OWNER_VAR;
const JOB: &str = JOB_VAR;

/// One sample of `fake` for harness `h`: what it counted, and the confirmed overlaps.
fn sample(
    t: &mut ProcTable,
    fake: &FakeProc,
    now: Instant,
) -> (Vec<Held>, Vec<(String, Side, Side)>) {
    t.scan(fake.root(), now);
    let held: Vec<Held> = t
        .classify()
        .into_iter()
        .filter(|h| h.harness == "h")
        .collect();
    let refs: Vec<&Held> = held.iter().collect();
    let overlaps = confirmed_overlaps(fake.root(), &refs);
    (held, overlaps)
}

fn nodes(held: &[Held], kind: Kind) -> BTreeMap<u32, String> {
    held.iter()
        .filter(|h| h.kind == kind)
        .map(|h| (h.side.pid, h.node.clone()))
        .collect()
}

#[test]
fn a_job_is_on_its_workers_node_not_on_the_node_its_submitter_exported() {
    let fake = FakeProc::new();
    // A worker pod's container on n1, and a job it started whose environment came from a
    // login pod on n9 (sbatch exports the submitter's environment, marks included).
    fake.add(
        10,
        1,
        "tandem",
        "S",
        100,
        &[
            (NODE, "h/n1"),
            (POD, "ns/w-0/worker"),
            (OWNER, "tandem-operator/worker"),
        ],
    );
    fake.add(
        11,
        10,
        "sh",
        "S",
        101,
        &[
            (JOB, "5"),
            (NODE, "h/n9"),
            (POD, "ns/login-0/login"),
            (OWNER, "tandem-operator/login"),
        ],
    );
    fake.add(12, 11, "sleep", "S", 102, &[(JOB, "5"), (NODE, "h/n9")]);
    // A Tandem login pod on n9 (not counted) and a bridged pod on n1.
    fake.add(
        20,
        1,
        "sshd",
        "S",
        103,
        &[
            (NODE, "h/n9"),
            (POD, "ns/login-0/login"),
            (OWNER, "tandem-operator/login"),
        ],
    );
    fake.add(
        30,
        1,
        "python",
        "S",
        104,
        &[(NODE, "h/n1"), (POD, "ns/web-1/serve"), (OWNER, "/")],
    );
    let mut t = ProcTable::default();
    let (held, overlaps) = sample(&mut t, &fake, Instant::now());
    assert_eq!(
        nodes(&held, Kind::Batch),
        BTreeMap::from([(11, "n1".into()), (12, "n1".into())])
    );
    assert_eq!(nodes(&held, Kind::Pod), BTreeMap::from([(30, "n1".into())]));
    let pairs: BTreeSet<(String, u32, u32)> = overlaps
        .iter()
        .map(|(n, b, p)| (n.clone(), b.pid, p.pid))
        .collect();
    assert_eq!(
        pairs,
        BTreeSet::from([("n1".into(), 11, 30), ("n1".into(), 12, 30)])
    );
    let (_, b, p) = &overlaps[0];
    assert_eq!(b.what, "5");
    assert_eq!(p.what, "ns/web-1/serve");
    assert_eq!(p.cmdline, "python --flag");
}

#[test]
fn tandem_pods_zombies_and_other_harnesses_do_not_count() {
    let fake = FakeProc::new();
    // A bridge-kit worker (node mark only) and its job on n1.
    fake.add(10, 1, "tandem", "S", 100, &[(NODE, "h/n1")]);
    fake.add(11, 10, "sh", "S", 101, &[(JOB, "7")]);
    // On n1 too: Tandem's own controller pod, a dead (zombie) pod process, a pod of
    // another harness whose node has the same name, and a process with no marks.
    fake.add(
        20,
        1,
        "tandem",
        "S",
        102,
        &[
            (NODE, "h/n1"),
            (POD, "ns/ctl/controller"),
            (OWNER, "tandem-operator/controller"),
        ],
    );
    fake.add(21, 1, "sleep", "Z", 103, &[]);
    fake.add(
        22,
        1,
        "sleep",
        "S",
        104,
        &[(NODE, "other/n1"), (POD, "ns/p/c"), (OWNER, "/")],
    );
    fake.add(23, 1, "bash", "S", 105, &[]);
    // A pod of another component of the operator is not a Tandem worker.
    fake.add(
        24,
        1,
        "bridge",
        "S",
        106,
        &[
            (NODE, "h/n2"),
            (POD, "ns/b/bridge"),
            (OWNER, "tandem-operator/bridge"),
        ],
    );
    let mut t = ProcTable::default();
    let (held, overlaps) = sample(&mut t, &fake, Instant::now());
    assert_eq!(
        nodes(&held, Kind::Batch),
        BTreeMap::from([(11, "n1".into())])
    );
    assert_eq!(nodes(&held, Kind::Pod), BTreeMap::from([(24, "n2".into())]));
    assert!(overlaps.is_empty(), "{overlaps:?}");

    // The zombie's environment was unreadable; a live pod process with the marks counts.
    fake.add(
        21,
        1,
        "sleep",
        "S",
        103,
        &[(NODE, "h/n1"), (POD, "ns/p/c"), (OWNER, "/")],
    );
    let (_, overlaps) = sample(&mut t, &fake, Instant::now());
    assert_eq!(overlaps.len(), 1, "{overlaps:?}");
}

#[test]
fn an_orphaned_job_and_its_later_children_stay_on_their_node() {
    let fake = FakeProc::new();
    fake.add(10, 1, "tandem", "S", 100, &[(NODE, "h/n4")]);
    fake.add(11, 10, "sh", "S", 101, &[(JOB, "3")]);
    let mut t = ProcTable::default();
    let t0 = Instant::now();
    sample(&mut t, &fake, t0);
    // The worker is killed: the job is reparented to init, and starts another process.
    fake.remove(10);
    fake.add(11, 1, "sh", "S", 101, &[(JOB, "3")]);
    fake.add(12, 11, "sleep", "S", 110, &[(JOB, "3")]);
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_secs(5));
    assert_eq!(
        nodes(&held, Kind::Batch),
        BTreeMap::from([(11, "n4".into()), (12, "n4".into())])
    );
    // A job process never placed (its worker gone before it was seen) is not guessed.
    fake.add(50, 1, "sh", "S", 120, &[(JOB, "9"), (NODE, "h/n4")]);
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_secs(6));
    assert!(!nodes(&held, Kind::Batch).contains_key(&50));
}

#[test]
fn a_process_is_read_again_after_exec_and_a_reused_pid_is_a_new_process() {
    let fake = FakeProc::new();
    fake.add(10, 1, "tandem", "S", 100, &[(NODE, "h/n1")]);
    // Between fork and exec the child shows the worker's environment.
    fake.add(11, 10, "tandem", "S", 101, &[(NODE, "h/n1")]);
    let mut t = ProcTable::default();
    let t0 = Instant::now();
    let (held, _) = sample(&mut t, &fake, t0);
    assert!(held.is_empty());
    // Still fresh: read again although its command did not change.
    fake.add(11, 10, "tandem", "S", 101, &[(JOB, "1")]);
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_millis(50));
    assert_eq!(
        nodes(&held, Kind::Batch),
        BTreeMap::from([(11, "n1".into())])
    );
    // Long seen, same command: not read again (the cost stays low)...
    fake.add(11, 10, "tandem", "S", 101, &[]);
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_secs(5));
    assert_eq!(held.len(), 1);
    // ...but an exec (a new command) is.
    fake.add(11, 10, "python", "S", 101, &[]);
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_secs(6));
    assert!(held.is_empty(), "{held:?}");
    // A pid reused by another process (another start time) is read as new.
    fake.add(
        11,
        1,
        "sleep",
        "S",
        999,
        &[(NODE, "h/n1"), (POD, "ns/p/c"), (OWNER, "/")],
    );
    let (held, _) = sample(&mut t, &fake, t0 + Duration::from_secs(7));
    assert_eq!(nodes(&held, Kind::Pod), BTreeMap::from([(11, "n1".into())]));
}

#[test]
fn an_overlap_is_confirmed_only_if_both_sides_are_still_alive_after_the_scan() {
    let fake = FakeProc::new();
    fake.add(10, 1, "tandem", "S", 100, &[(NODE, "h/n1")]);
    fake.add(11, 10, "sh", "S", 101, &[(JOB, "2")]);
    fake.add(
        20,
        1,
        "sleep",
        "S",
        102,
        &[(NODE, "h/n1"), (POD, "ns/p/c"), (OWNER, "/")],
    );
    let mut t = ProcTable::default();
    t.scan(fake.root(), Instant::now());
    let held = t.classify();
    let refs: Vec<&Held> = held.iter().filter(|h| h.harness == "h").collect();
    assert_eq!(confirmed_overlaps(fake.root(), &refs).len(), 1);
    // The pod's process ended after it was read: the job may have started after that.
    fake.remove(20);
    assert!(confirmed_overlaps(fake.root(), &refs).is_empty());
    // Or its pid now belongs to another process.
    fake.add(
        20,
        1,
        "sleep",
        "S",
        555,
        &[(NODE, "h/n1"), (POD, "ns/p/c"), (OWNER, "/")],
    );
    assert!(confirmed_overlaps(fake.root(), &refs).is_empty());
    // Or it is a zombie by now.
    fake.add(20, 1, "sleep", "Z", 102, &[]);
    assert!(confirmed_overlaps(fake.root(), &refs).is_empty());
}

#[test]
fn stat_and_environ_parse() {
    let s =
        parse_stat("4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 98765 1 2")
            .unwrap();
    assert_eq!(
        s,
        Stat {
            comm: "a (b) c".into(),
            ppid: 17,
            gone: false,
            start: 98765
        }
    );
    assert!(parse_stat("garbage").is_none());
    assert!(parse_stat("1 (x) S 0").is_none(), "too short");
    // This process, as the kernel writes it.
    let me = read_stat(Path::new("/proc"), std::process::id()).unwrap();
    assert_eq!(me.ppid, nix::unistd::getppid().as_raw() as u32);
    assert!(me.start > 0 && !me.gone);

    let m =
        parse_environ(b"A=1\0SLURM_JOB_ID=12\0TANDEM_E2E_NODE=h/n=1\0bad\0TANDEM_E2E_POD=a/b/c\0");
    assert_eq!(m.job.as_deref(), Some("12"));
    assert_eq!(m.node.as_deref(), Some("h/n=1"));
    assert_eq!(m.pod.as_deref(), Some("a/b/c"));
    assert_eq!(m.owner, None);
    assert_eq!(cmdline_of(b"sh\0-c\0sleep 1\0"), "sh -c sleep 1");
    assert!(tandem_owned("tandem-operator/worker"));
    assert!(!tandem_owned("tandem-operator/bridge"));
    assert!(tandem_owned("tandem-bridge/gpu-holder"));
    assert!(!tandem_owned("tandem-bridge/worker"));
    assert!(!tandem_owned("helm/worker"));
    assert!(!tandem_owned("/"));
}

#[test]
fn repeated_sightings_extend_one_violation_and_the_list_is_bounded() {
    let mut r = Record::new();
    let side = |pid| Side {
        pid,
        what: "x".into(),
        cmdline: "c".into(),
    };
    let now = (Instant::now(), Timestamp::now());
    r.add("n1", &side(1), &side(2), now);
    r.add("n1", &side(1), &side(2), now);
    assert_eq!(r.report.violations.len(), 1);
    assert_eq!(r.report.violations[0].samples, 2);
    for i in 0..(MAX_VIOLATIONS as u32 + 5) {
        r.add("n2", &side(100 + i), &side(2), now);
    }
    assert_eq!(r.report.violations.len(), MAX_VIOLATIONS);
    assert_eq!(r.report.more, 6);
    let msg = r.report.failure().unwrap();
    assert!(
        msg.contains("node n1: batch job x (pid 1: c) and pod container x (pid 2: c)"),
        "{msg}"
    );
    assert!(msg.contains("and 6 more"), "{msg}");
}

// === the checker on real processes ===

/// A fake worker on `node`: a shell with the node's mark whose child, a fake batch job
/// (`SLURM_JOB_ID`), sleeps. Its whole process group is killed on drop.
struct FakeWorker(std::process::Child);

impl FakeWorker {
    fn start(checker: &InvariantChecker, node: &str, job: &str) -> Self {
        let (k, v) = checker.node_env(node);
        let child = Command::new("sh")
            .args(["-c", &format!("SLURM_JOB_ID={job} sleep 60 & wait")])
            .env(k, v)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// A harness with nodes `n1` and `n2`; `None` (after a SKIP line) on a real cluster.
async fn harness(test: &str) -> Option<TestCluster> {
    let cluster = TestCluster::start_with_kubelet(test).await.unwrap()?;
    for n in ["n1", "n2"] {
        cluster.declare_node(n, "4", "8Gi", 0).await.unwrap();
    }
    Some(cluster)
}

/// A running pod `name` on `node` (with `labels`) that sleeps.
async fn pod_on(cluster: &TestCluster, name: &str, node: &str, labels: &[(&str, &str)]) {
    let mut fixture = PodFixture::new(name).node(node).sh("sleep 60").grace(0);
    for (k, v) in labels {
        fixture = fixture.label(k, v);
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    pods.create(&PostParams::default(), &fixture.build())
        .await
        .unwrap();
    crate::testkit::wait_for(&pods, name, "to run", Duration::from_secs(30), |p| {
        crate::testkit::phase(p) == "Running"
    })
    .await
    .unwrap();
}

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_batch_job_and_a_pod_on_one_node_are_a_violation_naming_both() {
    let Some(cluster) = harness("invariant_violation").await else {
        return;
    };
    let checker = cluster.invariant().unwrap();
    let _worker = FakeWorker::start(checker, "n1", "41");
    pod_on(&cluster, "intruder", "n1", &[]).await;
    let r = checker.until(WAIT, |r| !r.violations.is_empty()).await;
    let report = cluster.take_invariant().unwrap();
    assert!(!r.violations.is_empty(), "no violation seen: {r:?}");
    let v = report
        .violations
        .iter()
        .find(|v| v.pod.cmdline.contains("sleep 60") && v.batch.cmdline.contains("sleep 60"))
        .unwrap_or_else(|| panic!("{report:?}"));
    assert_eq!(v.node, "n1");
    assert_eq!(v.batch.what, "41");
    assert_eq!(v.pod.what, "default/intruder/main");
    assert!(v.first <= v.last && v.samples >= 1);
    let msg = report.failure().unwrap();
    assert!(
        msg.contains("node n1: batch job 41 (pid ") && msg.contains("default/intruder/main"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_batch_job_and_a_pod_on_different_nodes_and_a_tandem_pod_beside_a_job_are_fine() {
    let Some(cluster) = harness("invariant_no_violation").await else {
        return;
    };
    let checker = cluster.invariant().unwrap();
    let _worker = FakeWorker::start(checker, "n1", "42");
    pod_on(&cluster, "elsewhere", "n2", &[]).await;
    pod_on(
        &cluster,
        "tandem-worker",
        "n1",
        &[
            ("app.kubernetes.io/managed-by", "tandem-operator"),
            ("app.kubernetes.io/component", "worker"),
        ],
    )
    .await;
    // Both sides seen, then another second of samples.
    let seen = checker
        .until(WAIT, |r| {
            r.batch_nodes.contains("n1") && r.pod_nodes.contains("n2")
        })
        .await;
    assert!(
        seen.batch_nodes.contains("n1") && seen.pod_nodes.contains("n2"),
        "the checker saw the job on n1 and the pod on n2: {seen:?}"
    );
    let later = checker
        .until(WAIT, |r| r.samples >= seen.samples + 20)
        .await;
    assert!(
        later.samples >= seen.samples + 20,
        "sampling went on: {later:?}"
    );
    assert!(
        !later.pod_nodes.contains("n1"),
        "Tandem's own pod is not counted: {later:?}"
    );
    assert!(later.failure().is_none(), "{later:?}");
    cluster.assert_invariant();
}

#[tokio::test]
async fn a_test_that_broke_the_partition_fails_when_its_cluster_drops() {
    let Some(cluster) = harness("invariant_fails_the_test").await else {
        return;
    };
    let checker = cluster.invariant().unwrap();
    let worker = FakeWorker::start(checker, "n2", "43");
    pod_on(&cluster, "intruder", "n2", &[]).await;
    let r = checker.until(WAIT, |r| !r.violations.is_empty()).await;
    assert!(!r.violations.is_empty(), "no violation seen: {r:?}");
    drop(worker);
    // The end of a test: the cluster drops, tears down, and fails the test.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(cluster)));
    let payload = dropped.expect_err("the drop fails the test");
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        msg.contains("the time partition was broken")
            && msg.contains("node n2: batch job 43")
            && msg.contains("default/intruder/main"),
        "{msg}"
    );
}
