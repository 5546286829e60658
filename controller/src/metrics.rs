//! One prometheus-client registry for the controller (prefix `tandem`), served at
//! `/metrics` by axum on `--metrics-listen`, and the demand snapshots the KEDA scaler reads.
//!
//! Names follow Slurm's openmetrics plugin (`slurm_partition_jobs_pending{partition}` is
//! `tandem_partition_jobs_pending{partition}`, `slurm_nodes_idle` is `tandem_nodes_idle`);
//! those Slurm has no equivalent for say what they count in their help text.
//!
//! The state actor calls [`Metrics::pass_done`] after each scheduling pass (at most every
//! [`PUBLISH_EVERY`]; its tick catches up on the last pass of a burst): one
//! [`Snapshot::capture`] (a walk of the pending and running sets and the node table, which
//! the pass walks anyway) sets every gauge and goes to the scaler through a `watch`
//! channel. Fair share (one `AssocTree::compute`, O(associations)) is refreshed every
//! [`FAIRSHARE_EVERY`], and at once when an association appears or goes. Nothing is computed per scrape or per scaler request beyond reading.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tandem_sched::State;
use tandem_sched::demand::{NodeStates, PartitionStats, Snapshot};
use tokio::sync::watch;

/// Most often a snapshot is taken. A flood of events can run passes back to back; one
/// capture per pass would add a fifth to each (`cargo bench -p tandem-sched --bench
/// demand`), while KEDA polls every 30 s and Prometheus scrapes every 15 s or so.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// How often fair-share gauges are recomputed (usage decays slowly; a pass may run many
/// times a second under load).
pub const FAIRSHARE_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, Ord, PartialOrd, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, Ord, PartialOrd, EncodeLabelSet)]
pub struct AccountLabel {
    pub account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, Ord, PartialOrd, EncodeLabelSet)]
pub struct UserLabel {
    pub account: String,
    pub user: String,
}

type Fam<L> = Family<L, Gauge>;
type FamF<L> = Family<L, Gauge<f64, AtomicU64>>;

/// Per-partition gauges, in [`PartitionStats`] order.
struct PartitionGauges {
    jobs_pending: Fam<PartitionLabel>,
    jobs_running: Fam<PartitionLabel>,
    jobs_hold: Fam<PartitionLabel>,
    cpus_pending: Fam<PartitionLabel>,
    gpus_pending: Fam<PartitionLabel>,
    nodes_pending: Fam<PartitionLabel>,
    nodes: Fam<PartitionLabel>,
    /// `partition_nodes_idle`, `_mixed`, ... in [`NodeStates::named`] order.
    nodes_by_state: Vec<Fam<PartitionLabel>>,
}

/// What was last exported with a label, to drop series whose label went away.
#[derive(Default)]
struct Seen {
    partitions: BTreeSet<PartitionLabel>,
    accounts: BTreeSet<AccountLabel>,
    users: BTreeSet<UserLabel>,
    fairshare_at: Option<Instant>,
    /// When the last snapshot was taken, and whether a pass ran since.
    published_at: Option<Instant>,
    stale: bool,
    /// Associations when fair share was last computed: a new user or account refreshes it
    /// at once.
    assoc_len: usize,
}

pub struct Metrics {
    registry: Registry,
    part: PartitionGauges,
    jobs_pending: Gauge,
    jobs_running: Gauge,
    nodes: Gauge,
    nodes_by_state: Vec<Gauge>,
    nodes_batch: Gauge,
    nodes_kube: Gauge,
    account_norm_shares: FamF<AccountLabel>,
    account_usage_effective: FamF<AccountLabel>,
    user_fairshare: FamF<UserLabel>,
    cycle_seconds: Histogram,
    cycle_last_us: Gauge,
    jobs_started: Counter,
    jobs_submitted: Counter,
    store_commits: Counter,
    seen: Mutex<Seen>,
    snapshots: watch::Sender<Arc<Snapshot>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn gauge(reg: &mut Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    reg.register(name, help, g.clone());
    g
}

fn family<L, M>(reg: &mut Registry, name: &str, help: &str) -> Family<L, M>
where
    Family<L, M>: prometheus_client::registry::Metric + Clone + Default,
{
    let f = Family::<L, M>::default();
    reg.register(name, help, f.clone());
    f
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("tandem");
        let reg = &mut r;
        let part = PartitionGauges {
            jobs_pending: family(
                reg,
                "partition_jobs_pending",
                "Pending jobs per partition, array tasks counted one by one",
            ),
            jobs_running: family(reg, "partition_jobs_running", "Running jobs per partition"),
            jobs_hold: family(
                reg,
                "partition_jobs_hold",
                "Held pending jobs per partition",
            ),
            cpus_pending: family(
                reg,
                "partition_jobs_cpus_pending",
                "CPUs the pending jobs of the partition ask for",
            ),
            gpus_pending: family(
                reg,
                "partition_jobs_gpus_pending",
                "GPUs the pending jobs of the partition ask for",
            ),
            nodes_pending: family(
                reg,
                "partition_jobs_nodes_pending",
                "Nodes the pending jobs of the partition ask for",
            ),
            nodes: family(reg, "partition_nodes", "Nodes in the partition"),
            nodes_by_state: NodeStates::default()
                .named()
                .iter()
                .map(|(s, _)| {
                    family(
                        reg,
                        &format!("partition_nodes_{s}"),
                        &format!("Nodes of the partition in state {s}"),
                    )
                })
                .collect(),
        };
        let nodes_by_state = NodeStates::default()
            .named()
            .iter()
            .map(|(s, _)| gauge(reg, &format!("nodes_{s}"), &format!("Nodes in state {s}")))
            .collect();
        let cycle_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        reg.register(
            "schedule_cycle_seconds",
            "Duration of scheduling passes (schedule, dispatch, persist)",
            cycle_seconds.clone(),
        );
        let jobs_started = Counter::default();
        reg.register("jobs_started", "Jobs started", jobs_started.clone());
        let jobs_submitted = Counter::default();
        reg.register("jobs_submitted", "Jobs accepted", jobs_submitted.clone());
        let store_commits = Counter::default();
        reg.register(
            "store_commits",
            "Transactions committed to the state store (each one fsync with --durability full)",
            store_commits.clone(),
        );
        let (snapshots, _) = watch::channel(Arc::new(Snapshot::default()));
        Self {
            part,
            jobs_pending: gauge(reg, "jobs_pending", "Pending jobs, array tasks counted"),
            jobs_running: gauge(reg, "jobs_running", "Running jobs"),
            nodes: gauge(reg, "nodes", "Nodes known to the controller"),
            nodes_by_state,
            nodes_batch: gauge(reg, "nodes_batch", "Nodes in batch mode"),
            nodes_kube: gauge(
                reg,
                "nodes_kube",
                "Nodes in kube mode (serving bridged pods)",
            ),
            account_norm_shares: family(
                reg,
                "account_norm_shares",
                "Fair Tree NormShares of the account among its siblings",
            ),
            account_usage_effective: family(
                reg,
                "account_usage_effective",
                "Fair Tree EffectvUsage of the account among its siblings",
            ),
            user_fairshare: family(
                reg,
                "user_fairshare",
                "Fair-share factor (0..1] of a user association",
            ),
            cycle_last_us: gauge(
                reg,
                "schedule_cycle_last",
                "Duration of the last scheduling pass in microseconds",
            ),
            cycle_seconds,
            jobs_started,
            jobs_submitted,
            store_commits,
            seen: Mutex::new(Seen::default()),
            snapshots,
            registry: r,
        }
    }

    /// After a pass: its duration and how many jobs it started.
    pub fn pass(&self, started: usize, micros: u64) {
        self.jobs_started.inc_by(started as u64);
        self.cycle_last_us.set(i(micros));
        self.cycle_seconds.observe(micros as f64 / 1e6);
    }

    pub fn submitted(&self, n: u64) {
        self.jobs_submitted.inc_by(n);
    }

    /// The counter the committer counts its transactions on.
    pub fn store_commits(&self) -> Counter {
        self.store_commits.clone()
    }

    /// Receives every snapshot published from now on (the current one at once).
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshots.subscribe()
    }

    /// After a pass: publishes unless the last snapshot is younger than [`PUBLISH_EVERY`]
    /// (then [`Metrics::publish_if_stale`], called on the actor's tick, does it later).
    pub fn pass_done(&self, st: &State, now: i64) {
        let due = match self.seen.lock() {
            Ok(mut seen) => {
                seen.stale = true;
                seen.published_at
                    .is_none_or(|t| t.elapsed() >= PUBLISH_EVERY)
            }
            Err(_) => return,
        };
        if due {
            self.publish(st, now);
        }
    }

    /// Publishes if a pass ran since the last snapshot.
    pub fn publish_if_stale(&self, st: &State, now: i64) {
        if self.seen.lock().is_ok_and(|s| s.stale) {
            self.publish(st, now);
        }
    }

    /// Sets every gauge from `st` after a pass at `now` and hands the scaler the snapshot.
    pub fn publish(&self, st: &State, now: i64) {
        let snap = Snapshot::capture(st, now);
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        seen.published_at = Some(Instant::now());
        seen.stale = false;
        let labels: BTreeSet<PartitionLabel> = snap
            .partitions
            .keys()
            .map(|p| PartitionLabel {
                partition: p.clone(),
            })
            .collect();
        for gone in seen.partitions.difference(&labels) {
            self.part_families(|f| {
                f.remove(gone);
            });
        }
        let (mut pending, mut running) = (0u64, 0u64);
        for (name, p) in &snap.partitions {
            let l = PartitionLabel {
                partition: name.clone(),
            };
            pending = pending.saturating_add(p.jobs_pending);
            running = running.saturating_add(p.jobs_running);
            self.set_partition(&l, p);
        }
        seen.partitions = labels;
        self.jobs_pending.set(i(pending));
        self.jobs_running.set(i(running));
        self.nodes.set(i(snap.node_states.total()));
        for (g, (_, n)) in self.nodes_by_state.iter().zip(snap.node_states.named()) {
            g.set(i(n));
        }
        self.nodes_batch.set(i(snap.nodes_batch));
        self.nodes_kube.set(i(snap.nodes_kube));
        if seen.assoc_len != st.assoc().len()
            || seen
                .fairshare_at
                .is_none_or(|t| t.elapsed() >= FAIRSHARE_EVERY)
        {
            self.set_fairshare(st, &mut seen);
            seen.fairshare_at = Some(Instant::now());
            seen.assoc_len = st.assoc().len();
        }
        drop(seen);
        self.snapshots.send_replace(Arc::new(snap));
    }

    fn part_families(&self, mut f: impl FnMut(&Fam<PartitionLabel>)) {
        let p = &self.part;
        for fam in [
            &p.jobs_pending,
            &p.jobs_running,
            &p.jobs_hold,
            &p.cpus_pending,
            &p.gpus_pending,
            &p.nodes_pending,
            &p.nodes,
        ]
        .into_iter()
        .chain(p.nodes_by_state.iter())
        {
            f(fam);
        }
    }

    fn set_partition(&self, l: &PartitionLabel, p: &PartitionStats) {
        let g = &self.part;
        g.jobs_pending.get_or_create(l).set(i(p.jobs_pending));
        g.jobs_running.get_or_create(l).set(i(p.jobs_running));
        g.jobs_hold.get_or_create(l).set(i(p.jobs_hold));
        g.cpus_pending.get_or_create(l).set(i(p.cpus_pending));
        g.gpus_pending.get_or_create(l).set(i(p.gpus_pending));
        g.nodes_pending.get_or_create(l).set(i(p.nodes_pending));
        g.nodes.get_or_create(l).set(i(p.nodes.total()));
        for (fam, (_, n)) in g.nodes_by_state.iter().zip(p.nodes.named()) {
            fam.get_or_create(l).set(i(n));
        }
    }

    fn set_fairshare(&self, st: &State, seen: &mut Seen) {
        let table = st.assoc().compute();
        let rows = tandem_sched::fairshare::sshare_rows(st.assoc(), &table);
        let mut accounts = BTreeSet::new();
        let mut users = BTreeSet::new();
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        for r in rows {
            match r.user {
                None => {
                    let l = AccountLabel { account: r.account };
                    self.account_norm_shares
                        .get_or_create(&l)
                        .set(finite(r.share.norm_shares));
                    self.account_usage_effective
                        .get_or_create(&l)
                        .set(finite(r.share.effective_usage));
                    accounts.insert(l);
                }
                Some(user) => {
                    let l = UserLabel {
                        account: r.account,
                        user,
                    };
                    self.user_fairshare
                        .get_or_create(&l)
                        .set(finite(r.share.fairshare.unwrap_or(0.0)));
                    users.insert(l);
                }
            }
        }
        for gone in seen.accounts.difference(&accounts) {
            self.account_norm_shares.remove(gone);
            self.account_usage_effective.remove(gone);
        }
        for gone in seen.users.difference(&users) {
            self.user_fairshare.remove(gone);
        }
        seen.accounts = accounts;
        seen.users = users;
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The OpenMetrics content type prometheus-client's text encoder writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The HTTP app: `GET /metrics` (and `/` for humans poking at it) over axum, HTTP/1.1.
pub fn router(metrics: Arc<Metrics>) -> axum::Router {
    use axum::http::header;
    use axum::routing::get;
    let handler = move || {
        let m = metrics.clone();
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], m.encode()) }
    };
    axum::Router::new()
        .route("/metrics", get(handler.clone()))
        .route("/", get(handler))
}

/// Serves [`router`] on `listener` until the task is dropped.
pub async fn serve(listener: tandem_net::net::Listener, metrics: Arc<Metrics>) {
    use axum::serve::ListenerExt;
    // Every accepted socket gets TCP_NODELAY, as everywhere else (tandem_net::net).
    let listener = listener.into_tokio().tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a metrics connection");
        }
    });
    if let Err(e) = axum::serve(listener, router(metrics)).await {
        tracing::warn!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_sched::config::ClusterConfig;
    use tandem_sched::state::NodeRegistration;

    fn line(text: &str, name_and_labels: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn publish_sets_gauges_and_drops_removed_partitions() {
        let m = Metrics::new();
        let mut st = State::new(ClusterConfig::default()).unwrap();
        st.register_node(NodeRegistration::test("n1", 8, 1000, 2), 0)
            .unwrap();
        for _ in 0..3 {
            st.submit(tandem_sched::JobSpec::test().gpus_per_node(1), 0)
                .map(|_| ())
                .unwrap_or(());
        }
        let rx = m.snapshots();
        m.publish(&st, 1);
        let text = m.encode();
        assert_eq!(
            line(&text, "tandem_partition_nodes{partition=\"batch\"}"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(line(&text, "tandem_nodes"), Some(1.0), "{text}");
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow().has_partition("batch"));
        m.pass(2, 1500);
        let text = m.encode();
        assert_eq!(line(&text, "tandem_jobs_started_total"), Some(2.0));
        assert_eq!(
            line(&text, "tandem_schedule_cycle_seconds_count"),
            Some(1.0)
        );
        assert_eq!(line(&text, "tandem_schedule_cycle_last"), Some(1500.0));
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A partition gone from the config loses its series.
        let mut cfg = ClusterConfig::default();
        cfg.partitions[0].name = "other".into();
        m.publish(&State::new(cfg).unwrap(), 2);
        let text = m.encode();
        assert!(!text.contains("partition=\"batch\""), "{text}");
        assert_eq!(
            line(&text, "tandem_partition_nodes{partition=\"other\"}"),
            Some(0.0),
            "{text}"
        );
    }

    #[tokio::test]
    async fn http_endpoint_serves_the_registry() {
        let m = Arc::new(Metrics::new());
        m.submitted(3);
        let l = tandem_net::net::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, m));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("application/openmetrics-text"), "{out}");
        assert!(out.contains("tandem_jobs_submitted_total 3"), "{out}");
    }
}
