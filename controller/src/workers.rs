//! Connected workers: the outbound half of each WorkerLink stream, and when each node was
//! last heard from.
//!
//! Owned by the state actor, so it needs no lock. Liveness uses the monotonic clock (an
//! `Instant` per node), not the core's second-granular `last_seen`, so a sub-second
//! `--node-timeout` in tests means what it says.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tandem_proto::v1::{ControllerMessage, controller_message};
use tokio::sync::mpsc;
use tonic::Status;

/// Where the controller's messages to one worker go (the stream's response half).
pub type WorkerTx = mpsc::UnboundedSender<Result<ControllerMessage, Status>>;

/// Distinguishes successive connections of the same node, so a late "disconnected" from an
/// old stream does not unregister the new one.
pub type ConnId = u64;

#[derive(Debug)]
struct Conn {
    id: ConnId,
    tx: WorkerTx,
}

#[derive(Debug)]
struct Entry {
    conn: Option<Conn>,
    last_heard: Instant,
    about: Reported,
}

/// What a worker said of itself when it registered: kept for the node listing, not stored
/// (a restarted controller learns it again when the worker reconnects).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reported {
    /// host:port of its step service.
    pub step_address: String,
    pub version: String,
    /// `uname -m`, and system, release and version of `uname`.
    pub arch: String,
    pub os: String,
    pub hostname: String,
    /// Unix seconds: when the machine booted, when the worker started; 0 = unknown.
    pub machine_boot_time: i64,
    pub started: i64,
}

/// The worker table.
#[derive(Debug)]
pub struct Workers {
    nodes: HashMap<String, Entry>,
    /// Nodes known from the store but not heard from since this controller started count
    /// their silence from here.
    started: Instant,
}

impl Workers {
    pub fn new(started: Instant) -> Self {
        Self {
            nodes: HashMap::new(),
            started,
        }
    }

    /// A worker registered on a new stream; replaces any older stream of the node.
    pub fn connected(
        &mut self,
        node: &str,
        id: ConnId,
        tx: WorkerTx,
        about: Reported,
        now: Instant,
    ) {
        self.nodes.insert(
            node.to_owned(),
            Entry {
                conn: Some(Conn { id, tx }),
                last_heard: now,
                about,
            },
        );
    }

    /// The stream `id` of `node` ended. Silence counts from its last message.
    pub fn disconnected(&mut self, node: &str, id: ConnId) {
        if let Some(e) = self.nodes.get_mut(node)
            && e.conn.as_ref().is_some_and(|c| c.id == id)
        {
            e.conn = None;
        }
    }

    /// Any message on the current stream proves the worker alive.
    pub fn heard(&mut self, node: &str, id: ConnId, now: Instant) -> bool {
        match self.nodes.get_mut(node) {
            Some(e) if e.conn.as_ref().is_some_and(|c| c.id == id) => {
                e.last_heard = now;
                true
            }
            _ => false,
        }
    }

    pub fn sender(&self, node: &str) -> Option<WorkerTx> {
        self.nodes
            .get(node)
            .and_then(|e| e.conn.as_ref())
            .map(|c| c.tx.clone())
    }

    pub fn step_address(&self, node: &str) -> &str {
        self.nodes
            .get(node)
            .map_or("", |e| e.about.step_address.as_str())
    }

    /// What the node's worker reported; `None` for a node not heard from since this
    /// controller started.
    pub fn reported(&self, node: &str) -> Option<&Reported> {
        self.nodes.get(node).map(|e| &e.about)
    }

    /// Sends one message; false if the worker is not connected.
    pub fn send(&self, node: &str, msg: controller_message::Msg) -> bool {
        self.sender(node)
            .is_some_and(|tx| tx.send(Ok(ControllerMessage { msg: Some(msg) })).is_ok())
    }

    /// How long `node` has been silent at `now`.
    pub fn silence(&self, node: &str, now: Instant) -> Duration {
        let since = self.nodes.get(node).map_or(self.started, |e| e.last_heard);
        now.saturating_duration_since(since)
    }

    /// Forgets a node's stream (it timed out); dropping the sender ends the stream, so a
    /// worker that is alive but wedged reconnects and re-registers.
    pub fn lost(&mut self, node: &str) {
        if let Some(e) = self.nodes.get_mut(node) {
            e.conn = None;
        }
    }

    /// Closes every stream (shutdown).
    pub fn close_all(&mut self) {
        for e in self.nodes.values_mut() {
            e.conn = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step_address: &str) -> Reported {
        Reported {
            step_address: step_address.into(),
            version: "v".into(),
            ..Reported::default()
        }
    }

    #[test]
    fn stale_disconnect_does_not_drop_the_new_stream() {
        let t0 = Instant::now();
        let mut w = Workers::new(t0);
        let (tx1, _rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        w.connected("n1", 1, tx1, at("a:1"), t0);
        w.connected("n1", 2, tx2, at("a:2"), t0);
        w.disconnected("n1", 1);
        assert!(w.heard("n1", 2, t0));
        assert!(w.send(
            "n1",
            controller_message::Msg::AbandonJob(tandem_proto::v1::AbandonJob { job_id: 1 })
        ));
        assert!(rx2.try_recv().is_ok());
        assert_eq!(w.step_address("n1"), "a:2");
        w.disconnected("n1", 2);
        assert!(w.sender("n1").is_none());
    }

    #[test]
    fn silence_counts_from_start_for_unknown_nodes() {
        let t0 = Instant::now();
        let w = Workers::new(t0);
        let later = t0 + Duration::from_secs(3);
        assert_eq!(w.silence("ghost", later), Duration::from_secs(3));
    }

    #[test]
    fn heard_only_on_current_stream() {
        let t0 = Instant::now();
        let mut w = Workers::new(t0);
        let (tx, _rx) = mpsc::unbounded_channel();
        w.connected("n1", 7, tx, Reported::default(), t0);
        let t1 = t0 + Duration::from_secs(5);
        assert!(!w.heard("n1", 6, t1));
        assert_eq!(w.silence("n1", t1), Duration::from_secs(5));
        assert!(w.heard("n1", 7, t1));
        assert_eq!(w.silence("n1", t1), Duration::ZERO);
    }
}
