//! The worker's side of `WorkerLink.Attach`: register, heartbeat, obey, report, reconnect.
//!
//! ```text
//!   controller ──LaunchJob/SignalJob/AbandonJob──▶ Session ──▶ Jobs (supervisors)
//!       ▲                                            │              │
//!       └──Register/Heartbeat/JobStarted/JobEnded────┘◀──JobEvent───┘
//!                                                 Outbox (ends until delivered)
//! ```
//!
//! One stream at a time. When it breaks (controller restart, network), the session waits with
//! capped exponential backoff and attaches again; jobs keep running meanwhile, and the new
//! `Register` lists them (`running_jobs`) together with every end not known to be delivered
//! (`ended_while_disconnected`). The backoff restarts after a stream that got as far as
//! `Registered`, so a controller restart costs a fast reconnect, not the last long delay.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tandem_net::auth::{ClusterKey, Identity, unix_now};
use tandem_net::endpoint;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;
use tandem_proto::v1::{
    ControllerMessage, Heartbeat, JobEnded, Register, WorkerMessage, controller_message,
    worker_message,
};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use crate::jobs::{JobEvent, Jobs};
use crate::journal::Journal;
use crate::outbox::Outbox;

/// First retry delay after a broken stream.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest base wait between attempts; jitter adds up to as much again, so a restarted
/// controller is found within about twice this.
const BACKOFF_MAX: Duration = Duration::from_secs(3);
/// Used until the controller says otherwise in `Registered`.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Heartbeats faster than this would only load the controller.
const MIN_HEARTBEAT: Duration = Duration::from_millis(50);
/// How long a stopping worker waits for the controller to read its last reports.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(1);
/// Messages waiting to be written to the stream; the session awaits when full.
const OUTBOUND_BUFFER: usize = 256;

/// What the session needs besides the job table.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// `http://HOST:PORT` of the controller.
    pub controller: String,
    /// TLS to the controller, or plain text on loopback.
    pub security: tandem_net::net::ClientSecurity,
    pub key: ClusterKey,
    pub identity: Identity,
    /// The node's registration; `running_jobs` and `ended_while_disconnected` are filled
    /// per attach.
    pub register: Register,
}

/// How one attach ended.
#[derive(Debug)]
enum LinkEnd {
    Shutdown,
    Broken { registered: bool, reason: String },
}

pub struct Session {
    cfg: LinkConfig,
    /// Commands from the controller go here; its snapshot feeds `Register` and heartbeats.
    jobs: Jobs,
    /// Starts and ends from the supervisors. Read only by the session, and drained into the
    /// outbox while no stream is up, so nothing waits on the link.
    events: mpsc::UnboundedReceiver<JobEvent>,
    /// Ends not yet known to be delivered; survives reconnects (the session outlives streams).
    outbox: Outbox,
    /// Delivered ends are removed from the journal.
    journal: Journal,
}

impl Session {
    /// `recovered`: ends from the journal of a previous worker life, reported first.
    pub fn new(
        cfg: LinkConfig,
        jobs: Jobs,
        events: mpsc::UnboundedReceiver<JobEvent>,
        journal: Journal,
        recovered: Vec<JobEnded>,
    ) -> Self {
        let mut outbox = Outbox::default();
        for e in recovered {
            outbox.push(e);
        }
        Self {
            cfg,
            jobs,
            events,
            outbox,
            journal,
        }
    }

    /// Runs until `shutdown` turns true. Ends still pending then are logged: the worker is
    /// going away and has no durable store of its own.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let builder = ExponentialBuilder::default()
            .with_min_delay(BACKOFF_MIN)
            .with_max_delay(BACKOFF_MAX)
            .with_jitter()
            .without_max_times();
        let mut backoff = builder.build();
        loop {
            if *shutdown.borrow() {
                break;
            }
            match self.attach_once(&mut shutdown).await {
                LinkEnd::Shutdown => break,
                LinkEnd::Broken { registered, reason } => {
                    self.outbox.link_lost();
                    if registered {
                        backoff = builder.build();
                    }
                    let delay = backoff.next().unwrap_or(BACKOFF_MAX);
                    warn!(
                        controller = %self.cfg.controller,
                        %reason,
                        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        pending_ends = self.outbox.pending(),
                        "controller link down"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
        self.drain_events();
        if self.outbox.pending() > 0 {
            warn!(
                pending_ends = self.outbox.pending(),
                "worker stopping with job ends the controller may not have"
            );
        }
    }

    /// Moves job events that arrived while no stream was up into the outbox. Starts are
    /// dropped: the next `Register` lists the job as running.
    /// "Gone" reports are dropped too: the controller asks again (`EndJob`) when the
    /// worker registers, for every job still held on this node.
    fn drain_events(&mut self) {
        while let Ok(ev) = self.events.try_recv() {
            if let JobEvent::Ended(e) = ev {
                self.outbox.push(e);
            }
        }
    }

    fn register_message(&mut self) -> Register {
        // Snapshot first, drain second: see the invariant in `jobs`.
        let running = self.jobs.running();
        self.drain_events();
        let mut reg = self.cfg.register.clone();
        reg.running_jobs = running;
        reg.ended_while_disconnected = self.outbox.take_unsent(Instant::now());
        reg
    }

    async fn attach_once(&mut self, shutdown: &mut watch::Receiver<bool>) -> LinkEnd {
        let broken = |registered: bool, reason: String| LinkEnd::Broken { registered, reason };
        let channel = tokio::select! {
            c = endpoint::connect_as(
                &self.cfg.controller,
                &self.cfg.security,
                &self.cfg.key,
                &self.cfg.identity,
            ) => c,
            _ = shutdown.changed() => return LinkEnd::Shutdown,
        };
        let channel = match channel {
            Ok(c) => c,
            Err(e) => return broken(false, error_chain(&e)),
        };
        let mut client = WorkerLinkClient::new(channel);
        let (tx, rx) = mpsc::channel::<WorkerMessage>(OUTBOUND_BUFFER);
        let register = self.register_message();
        let reported = register.ended_while_disconnected.len();
        let running = register.running_jobs.len();
        if tx
            .send(msg(worker_message::Msg::Register(register)))
            .await
            .is_err()
        {
            return broken(false, "outbound stream closed".into());
        }
        let response = tokio::select! {
            r = client.attach(ReceiverStream::new(rx)) => r,
            _ = shutdown.changed() => return LinkEnd::Shutdown,
        };
        let mut inbound = match response {
            Ok(r) => r.into_inner(),
            Err(status) => {
                return broken(
                    false,
                    format!("attach refused: {}: {}", status.code(), status.message()),
                );
            }
        };

        let mut registered = false;
        let mut heartbeat = tokio::time::interval(DEFAULT_HEARTBEAT);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => {
                    // Report what ended during the stop (the jobs were killed first).
                    self.drain_events();
                    for e in self.outbox.take_unsent(Instant::now()) {
                        let _ = tx.try_send(msg(worker_message::Msg::JobEnded(e)));
                    }
                    // Half-close and give the controller a moment to read what was queued.
                    drop(tx);
                    let _ = tokio::time::timeout(SHUTDOWN_FLUSH, async {
                        while let Ok(Some(_)) = inbound.message().await {}
                    })
                    .await;
                    return LinkEnd::Shutdown;
                }
                m = inbound.message() => match m {
                    Ok(Some(m)) => {
                        if let Some(interval) = self.handle(m, &mut registered, reported, running) {
                            heartbeat = tokio::time::interval(interval);
                            heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
                        }
                    }
                    Ok(None) => return broken(registered, "controller closed the stream".into()),
                    Err(status) => return broken(
                        registered,
                        format!("{}: {}", status.code(), status.message()),
                    ),
                },
                Some(ev) = self.events.recv() => {
                    let out = match ev {
                        JobEvent::Started(s) => Some(msg(worker_message::Msg::JobStarted(s))),
                        JobEvent::Ended(e) => {
                            self.outbox.push(e);
                            None
                        }
                        JobEvent::Gone(job_id) => Some(msg(worker_message::Msg::JobGone(
                            tandem_proto::v1::JobGone { job_id },
                        ))),
                    };
                    let ends: Vec<JobEnded> = self.outbox.take_unsent(Instant::now());
                    let msgs = out.into_iter().chain(
                        ends.into_iter().map(|e| msg(worker_message::Msg::JobEnded(e))),
                    );
                    for m in msgs {
                        if tx.send(m).await.is_err() {
                            return broken(registered, "outbound stream closed".into());
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    let now = Instant::now();
                    for job_id in self.outbox.confirm(now) {
                        self.journal.forget_ended(job_id);
                    }
                    let hb = Heartbeat { time: unix_now(), running_jobs: self.jobs.running() };
                    if tx.send(msg(worker_message::Msg::Heartbeat(hb))).await.is_err() {
                        return broken(registered, "outbound stream closed".into());
                    }
                }
            }
        }
    }

    /// Applies one controller message; returns a new heartbeat period when one was set.
    fn handle(
        &mut self,
        m: ControllerMessage,
        registered: &mut bool,
        reported: usize,
        running: usize,
    ) -> Option<Duration> {
        match m.msg? {
            controller_message::Msg::Registered(r) => {
                *registered = true;
                let interval = match r.heartbeat_interval_ms {
                    0 => DEFAULT_HEARTBEAT,
                    ms => Duration::from_millis(ms).max(MIN_HEARTBEAT),
                };
                info!(
                    cluster = %r.cluster_name,
                    heartbeat_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
                    running_jobs = running,
                    ended_reported = reported,
                    "registered with the controller"
                );
                return Some(interval);
            }
            controller_message::Msg::LaunchJob(job) => {
                info!(job_id = job.job_id, name = %job.name, user = %job.user, "launch");
                self.jobs.launch(job);
            }
            controller_message::Msg::SignalJob(s) => {
                info!(job_id = s.job_id, signal = s.signal, reason = %s.reason, "signal");
                if !self.jobs.signal(&s) {
                    debug!(job_id = s.job_id, "signal for a job not running here");
                }
            }
            controller_message::Msg::EndJob(e) => {
                debug!(
                    job_id = e.job_id,
                    "job ended: cleaning up its processes here"
                );
                self.jobs.end_job(e.job_id);
            }
            controller_message::Msg::AbandonJob(a) => {
                info!(
                    job_id = a.job_id,
                    "abandon: killing a job the controller does not know"
                );
                self.jobs.abandon(a.job_id);
            }
        }
        None
    }
}

fn msg(m: worker_message::Msg) -> WorkerMessage {
    WorkerMessage { msg: Some(m) }
}

/// `error: cause: cause` on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
