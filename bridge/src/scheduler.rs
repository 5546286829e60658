//! The scheduler loop: watches pods that name the `tandem` scheduler, the nodes, the
//! cluster's namespace map and the controller's placeholder stream, and turns every change
//! of a group into one [`decide`](crate::decide) call and its [`apply`](crate::apply) calls.
//!
//! Event driven end to end: a pod event, a placeholder event or a node event marks the
//! groups it touches dirty, and only those are decided again; nothing polls the controller
//! for placeholders and nothing lists every job per pod (slurm-bridge's #45). Failed API
//! calls put the group on a retry list looked at once a second.
//!
//! Deciding is synchronous; what a decision writes (a submit, the bindings, ...) runs as
//! an operation off the loop ([`work`]), up to [`MAX_IN_FLIGHT`] groups' at once: a burst
//! of pods is many submits in flight, which the controller's group commit makes one fsync,
//! rather than one round trip after another. One group has at most one operation in
//! flight; a group that changes meanwhile is decided again when it is done, from the
//! state then.
//!
//! Node modes ([`crate::nodes`]) are the one read that is not a stream: the controller's
//! node list is read at most once a tick after a placeholder event or a Node out of step,
//! and every `MODE_RESYNC` (5 s; a batch job taking a free `kube` node announces nothing to
//! the bridge); a Node is patched only when its label or taint differs. The read and the
//! patches run off the loop too ([`modes`]), one sync at a time.
//!
//! ```text
//!   scheduler  the loop: its state, the watches, dirty targets -> operations  I/O glue
//!   watch      pod, Node, TandemCluster, placeholder events, tick -> dirty    state only
//!   start      a dirty target -> decide::decide_gang -> one Work              state only
//!   refusals   PodDisruptionBudget refusals: evict now, delete, or back off   pure
//!   book       placeholders and the groups they are                           pure
//!   index      pods, their groups, ghosts of vanished pods                    pure
//!   work       what a Work writes or reads (API server, controller)           I/O
//!   modes      Node modes and GPU holders kept in step with the controller    I/O
//! ```
//!
//! Decisions stay pure ([`crate::decide`]); `watch` and `start` only read and change the
//! loop's state, and every call out is an operation of [`work`] or [`modes`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::Retryable as _;
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use tandem_net::auth::unix_now;
use tandem_proto::v1;
use tracing::{debug, info, warn};

use crate::batch::{BatchAlloc, BatchError, reconnect_backoff};
use crate::cluster;
use crate::group::GroupKey;
use crate::labels::SCHEDULER_NAME;
use crate::nodes::{self, Mode};
use crate::policy::NamespacePolicy;
use crate::resources;

mod book;
mod index;
mod modes;
mod refusals;
mod start;
mod watch;
mod work;
use book::{Book, PlaceholderId};
use index::{Ghost, GroupIndex, PodKey, pod_key};
use refusals::Refusals;
use work::{Ctx, Outcome, Work};

/// What the loop needs besides its clients.
#[derive(Debug, Clone)]
pub struct Config {
    /// The `TandemCluster` whose namespace map applies.
    pub cluster_namespace: String,
    pub cluster_name: String,
    /// How long a pod whose node vanished keeps its slot (slurm-bridge #49).
    pub node_grace_s: i64,
    /// Seconds past its grace period that a bound pod which vanished from the API with its
    /// containers perhaps running still holds its slot ([`crate::decide::vanish_deadline`]).
    pub vanish_margin_s: i64,
    /// Seconds a pod whose eviction PodDisruptionBudgets keep refusing may hold a job's
    /// end (scancel, preemption, time limit, node loss) before it is deleted.
    pub eviction_timeout_s: i64,
    /// The GPU holders' image ([`crate::holder`]); `None`: no holders.
    pub gpu_holder_image: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("watching {what}")]
    Watch {
        what: &'static str,
        #[source]
        source: watcher::Error,
    },
    #[error(transparent)]
    Batch(#[from] BatchError),
}

/// How often node modes are read from the controller when nothing asked sooner: a node
/// leaves `kube` mode when a batch job takes it, which no bridge event announces.
const MODE_RESYNC: Duration = Duration::from_secs(5);

/// How many groups may have an operation in flight at once. Each is a few calls to the
/// API server or the controller; a bound keeps a burst of 10,000 pods from being 10,000
/// open requests.
const MAX_IN_FLIGHT: usize = 256;

/// A group, or a placeholder whose group has no pods left that the bridge knows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Target {
    Group(GroupKey),
    Orphan(PlaceholderId),
}

struct Loop<B> {
    client: Client,
    batch: Arc<B>,
    recorder: Recorder,
    cfg: Config,
    /// The pods, their groups and the ghosts of vanished ones.
    ix: GroupIndex,
    /// The placeholders and the groups they are.
    book: Book,
    /// Owner-derived group sizes; `None` entries are looked up again.
    expected: HashMap<GroupKey, u32>,
    /// Groups whose owner starts them in stages, with every member's requests (from the
    /// owner's templates): submitted whole as soon as the first members exist.
    staged: HashMap<GroupKey, Vec<resources::PodResources>>,
    /// Groups whose owner was read (for those read once, whatever it said).
    owner_read: HashSet<GroupKey>,
    nodes: HashSet<String>,
    /// Kubernetes Nodes as last observed, for their mode label and pool taint.
    node_objs: HashMap<String, Node>,
    /// The controller's nodes and their modes; `None` until read, or when the last read
    /// failed (then no node is changed).
    modes: Option<HashMap<String, Option<Mode>>>,
    /// Read the modes again at the next tick.
    modes_dirty: bool,
    modes_at: Option<Instant>,
    /// A mode sync runs (one at a time).
    modes_syncing: bool,
    /// The GPU holders, kept by the mode sync.
    holders: modes::Holders,
    gone: HashMap<String, i64>,
    policies: Vec<NamespacePolicy>,
    /// Evictions refused by PodDisruptionBudgets, per pod.
    refusals: Refusals,
    /// The last `Unschedulable` message written per pod, so each is written once.
    told: HashMap<PodKey, String>,
    dirty: BTreeSet<Target>,
    retry: BTreeSet<Target>,
    /// Targets with an operation in flight.
    busy: HashSet<Target>,
    /// Owners read for groups, each used by the group's next decision only.
    owners: HashMap<GroupKey, Option<serde_json::Value>>,
    pods_synced: bool,
    jobs_synced: bool,
    /// The `TandemCluster` was read (or found absent): until then no namespace is known to
    /// be unmapped, and no pod is told so.
    cluster_synced: bool,
}

/// Runs until `shutdown` resolves. `evict_client` makes the evictions: it must return a
/// 429 at once rather than retry it ([`tandem_kubeclient::client::infer_without_retries`]).
pub async fn run<B: BatchAlloc + 'static>(
    client: Client,
    evict_client: Client,
    batch: B,
    cfg: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let reporter = Reporter {
        controller: SCHEDULER_NAME.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut l = Loop {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        batch: Arc::new(batch),
        cfg: cfg.clone(),
        ix: GroupIndex::default(),
        book: Book::default(),
        expected: HashMap::new(),
        staged: HashMap::new(),
        owner_read: HashSet::new(),
        nodes: HashSet::new(),
        node_objs: HashMap::new(),
        modes: None,
        modes_dirty: true,
        modes_at: None,
        modes_syncing: false,
        holders: modes::Holders::new(modes::HolderConfig {
            image: cfg.gpu_holder_image.clone(),
            namespace: cfg.cluster_namespace.clone(),
            cluster: cfg.cluster_name.clone(),
            margin_s: cfg.vanish_margin_s,
        }),
        gone: HashMap::new(),
        policies: Vec::new(),
        told: HashMap::new(),
        refusals: Refusals::default(),
        dirty: BTreeSet::new(),
        retry: BTreeSet::new(),
        busy: HashSet::new(),
        owners: HashMap::new(),
        pods_synced: false,
        jobs_synced: false,
        cluster_synced: false,
    };
    let pod_api: Api<Pod> = Api::all(client.clone());
    // Every watch backs off on errors (kube-runtime's default: exponential to 5 min, reset
    // after a healthy stretch) rather than hammering an API server that refuses.
    let mut pods = watcher::watcher(
        pod_api,
        watcher::Config::default().fields(&format!("spec.schedulerName={SCHEDULER_NAME}")),
    )
    .default_backoff()
    .boxed();
    let mut nodes = watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    let ar = cluster::api_resource();
    let tc_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &cfg.cluster_namespace, &ar);
    let mut clusters = watcher::watcher(
        tc_api,
        watcher::Config::default().fields(&format!("metadata.name={}", cfg.cluster_name)),
    )
    .default_backoff()
    .boxed();
    // Subscribes (again) with a backoff inside the stream, so a controller away never
    // stalls the loop: pods, nodes and the namespace map are still followed meanwhile.
    let mut placeholders = placeholder_feed(l.batch.clone());
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let ctx = Ctx {
        client: l.client.clone(),
        evict_client,
        batch: l.batch.clone(),
        recorder: l.recorder.clone(),
    };
    let mut inflight = FuturesUnordered::new();
    let mut mode_sync: FuturesUnordered<LocalBoxFuture<'static, modes::Step>> =
        FuturesUnordered::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            ev = pods.next() => match ev {
                Some(Ok(ev)) => l.on_pod(ev),
                Some(Err(e)) => warn!(error = %e, "pod watch"),
                None => return Err(Error::Watch { what: "pods", source: watcher::Error::NoResourceVersion }),
            },
            ev = nodes.next() => match ev {
                Some(Ok(ev)) => l.on_node(ev),
                Some(Err(e)) => warn!(error = %e, "node watch"),
                None => {}
            },
            ev = clusters.next() => match ev {
                Some(Ok(Event::Apply(tc) | Event::InitApply(tc))) => l.on_cluster(&tc),
                Some(Ok(Event::Delete(_))) => l.holders.set_owner(None),
                Some(Ok(Event::InitDone)) => l.cluster_synced = true,
                Some(Ok(_)) => {}
                Some(Err(e)) => warn!(error = %e, "TandemCluster watch"),
                None => {}
            },
            Some(feed) = placeholders.next() => match feed {
                Feed::Event(ev) => l.on_placeholder(ev),
                // Not synced until the next subscription's snapshot is in.
                Feed::Lost => l.jobs_synced = false,
            },
            Some(out) = inflight.next(), if !inflight.is_empty() => l.finish(out),
            Some(step) = mode_sync.next(), if !mode_sync.is_empty() => {
                mode_sync.extend(l.on_mode_step(step));
            }
            _ = tick.tick() => {
                l.on_tick();
                mode_sync.extend(l.start_mode_sync());
            }
        }
        for (t, w) in l.process() {
            inflight.push(work::perform(ctx.clone(), t, w));
        }
    }
}

/// What the placeholder subscription brings the loop.
enum Feed {
    Event(v1::PlaceholderEvent),
    /// The subscription broke; the next one starts with a fresh snapshot.
    Lost,
}

/// The controller's placeholder events, subscribed to again (with [`reconnect_backoff`])
/// whenever the stream fails or ends; never ends itself.
fn placeholder_feed<B: BatchAlloc + 'static>(
    batch: Arc<B>,
) -> futures::stream::LocalBoxStream<'static, Feed> {
    type Sub = futures::stream::BoxStream<'static, Result<v1::PlaceholderEvent, BatchError>>;
    futures::stream::unfold((batch, None::<Sub>), |(batch, current)| async move {
        let mut sub = match current {
            Some(s) => s,
            None => {
                let subscribed = (|| batch.watch())
                    .retry(reconnect_backoff())
                    .notify(|e, wait| {
                        warn!(error = %e, retry_in = ?wait, "subscribing to placeholders")
                    })
                    .await;
                match subscribed {
                    Ok(s) => s,
                    // Only when the backoff gives up, which it does not; start over.
                    Err(_) => return Some((Feed::Lost, (batch, None))),
                }
            }
        };
        match sub.next().await {
            Some(Ok(ev)) => Some((Feed::Event(ev), (batch, Some(sub)))),
            Some(Err(e)) => {
                warn!(error = %e, "placeholder stream failed; subscribing again");
                Some((Feed::Lost, (batch, None)))
            }
            None => {
                info!("placeholder stream ended; subscribing again");
                Some((Feed::Lost, (batch, None)))
            }
        }
    })
    .boxed_local()
}

impl<B: BatchAlloc> Loop<B> {
    /// What the controller last said about Kubernetes node `name`.
    fn controller_view(&self, name: &str) -> nodes::Controller {
        match &self.modes {
            None => nodes::Controller::Unknown,
            Some(m) => match m.get(name) {
                None => nodes::Controller::NotPool,
                Some(None) => nodes::Controller::Unknown,
                Some(Some(mode)) => nodes::Controller::Pool(*mode),
            },
        }
    }

    /// Starts a mode sync when one is asked for (or every [`MODE_RESYNC`]) and none runs.
    fn start_mode_sync(&mut self) -> Option<LocalBoxFuture<'static, modes::Step>>
    where
        B: 'static,
    {
        let due = self.modes_dirty || self.modes_at.is_none_or(|t| t.elapsed() >= MODE_RESYNC);
        if !due || self.modes_syncing {
            return None;
        }
        self.modes_dirty = false;
        self.modes_at = Some(Instant::now());
        self.modes_syncing = true;
        Some(self.holders.read(self.batch.clone(), self.client.clone()))
    }

    /// Folds a step of the mode sync in; the patches that bring Nodes in step, if any
    /// (nothing is written for a node in step).
    fn on_mode_step(&mut self, step: modes::Step) -> Option<LocalBoxFuture<'static, modes::Step>>
    where
        B: 'static,
    {
        match step {
            modes::Step::Read(Err(e), _) => {
                warn!(error = %e, "reading node modes; changing no node");
                self.modes = None;
                self.modes_syncing = false;
                None
            }
            modes::Step::Read(Ok(m), listed) => {
                self.modes = Some(m);
                let views = (self.node_objs.keys())
                    .map(|n| (n.clone(), self.controller_view(n)))
                    .collect();
                let sync = self
                    .holders
                    .sync(&self.node_objs, &views, listed, unix_now());
                // A GPU holder is going: look again at the next tick.
                self.modes_dirty |= sync.waiting;
                if sync.ops.is_empty() {
                    self.modes_syncing = false;
                    return None;
                }
                let (client, recorder) = (self.client.clone(), self.recorder.clone());
                let batch = self.batch.clone();
                Some(modes::write(
                    client,
                    recorder,
                    batch,
                    &self.holders,
                    sync.ops,
                ))
            }
            modes::Step::Patched(done) => {
                // Binds that waited for a Node's kube write are tried again now.
                if !done.is_empty() {
                    let retry = std::mem::take(&mut self.retry);
                    self.dirty.extend(retry);
                }
                // Plan from what was written until the watch brings it.
                for (name, node) in done {
                    if self.node_objs.contains_key(&name) {
                        self.node_objs.insert(name, node);
                    }
                }
                self.modes_syncing = false;
                None
            }
        }
    }

    /// Starts an operation on each dirty target that has none in flight, up to
    /// [`MAX_IN_FLIGHT`]; targets with one in flight stay dirty and are decided again once
    /// it is done.
    fn process(&mut self) -> Vec<(Target, Work)> {
        let mut started = Vec::new();
        if !self.pods_synced || !self.jobs_synced || !self.cluster_synced {
            return started;
        }
        let now = unix_now();
        let mut held = Vec::new();
        while self.busy.len() < MAX_IN_FLIGHT {
            let Some(t) = self.dirty.pop_first() else {
                break;
            };
            let t = self.resolve(t);
            if self.in_flight(&t) {
                held.push(t);
                continue;
            }
            match self.start(&t, now) {
                Ok(Some(w)) => {
                    self.busy.insert(t.clone());
                    started.push((t, w));
                }
                Ok(None) => {}
                Err(why) => {
                    debug!(target = ?t, why, "retrying");
                    self.retry.insert(t);
                }
            }
        }
        self.dirty.extend(held);
        started
    }

    /// An orphan whose group is known now is that group.
    fn resolve(&self, t: Target) -> Target {
        match t {
            Target::Orphan(id) => match self.book.group(&id) {
                Some(k) => Target::Group(k.clone()),
                None => Target::Orphan(id),
            },
            t => t,
        }
    }

    /// Whether an operation on `t`'s group (or on its placeholder, as an orphan) runs.
    fn in_flight(&self, t: &Target) -> bool {
        self.busy.contains(t)
            || matches!(t, Target::Group(k) if self
                .book
                .id(k)
                .is_some_and(|id| self.busy.contains(&Target::Orphan(id))))
    }

    /// Folds a finished operation into the state; its target may be decided again.
    fn finish(&mut self, out: Outcome) {
        self.busy.remove(&out.target);
        if let Some((k, owner)) = out.owner {
            // Decide with what was read (once): the target is decided again now.
            self.owners.insert(k, owner);
            self.dirty.insert(out.target.clone());
        }
        if let Some((id, job_id)) = out.submitted {
            self.book.submitted(id, job_id);
        }
        for (key, message) in out.told {
            if self.ix.pod(&key).is_some() {
                self.told.insert(key, message);
            }
        }
        if let Some(job_id) = out.ended {
            self.ended_here(&out.target, job_id);
        }
        if let Some((job_id, nodes)) = out.released {
            if let Some(id) = self.placeholder_of(&out.target) {
                self.book.released_here(&id, job_id, &nodes);
            }
            // Decided again with the smaller allocation (a replacement may wait to bind).
            self.dirty.insert(out.target.clone());
        }
        let now = unix_now();
        for key in out.refused {
            self.refusals.refused(key, now);
        }
        for (key, node) in out.bound {
            if let Some(p) = self.ix.pod_mut(&key) {
                // Plan from what was written until the watch brings it: another event of
                // the group before then must not bind it again (a 409).
                if let Some(spec) = p.spec.as_mut()
                    && spec.node_name.is_none()
                {
                    spec.node_name = Some(node);
                }
            }
            self.told.remove(&key);
        }
        if let Some(why) = out.retry {
            debug!(target = ?out.target, why, "retrying");
            self.retry.insert(out.target);
        }
    }

    /// This bridge's end report for `job_id` was taken ([`Book::ended_here`]).
    fn ended_here(&mut self, t: &Target, job_id: u64) {
        if let Some(id) = self.placeholder_of(t) {
            self.book.ended_here(&id, job_id);
        }
    }

    /// The placeholder a target is about, once known.
    fn placeholder_of(&self, t: &Target) -> Option<PlaceholderId> {
        match t {
            Target::Group(k) => self.book.id(k),
            Target::Orphan(id) => Some(id.clone()),
        }
    }
}
