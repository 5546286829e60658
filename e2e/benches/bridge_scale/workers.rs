//! Fake workers: one task per node, each speaking the real `WorkerLink` stream with the
//! node's own worker credential (register, heartbeats, `JobStarted` on a launch, `JobEnded`
//! when the bench says) and running nothing. Apart from `main.rs` because they stand in for
//! `tandem worker` processes, with the protocol that implies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_net::auth::{ClusterKey, Identity, unix_now};
use tandem_net::endpoint;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;
use tandem_proto::v1::{self, controller_message, worker_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::{NODE_GPUS, progress};

/// What the bench tells a fake worker.
pub enum Cmd {
    /// Report this batch job's end (exit 0), now.
    End(u64),
}

/// Shared by the fake workers: the batch jobs each node runs.
#[derive(Default)]
pub struct Pool {
    running: Mutex<HashMap<String, Vec<u64>>>,
}

impl Pool {
    pub fn jobs_on(&self, node: &str) -> Vec<u64> {
        self.running
            .lock()
            .map(|m| m.get(node).cloned().unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn launched(&self) -> usize {
        self.running
            .lock()
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0)
    }
}

/// Registers `name` over `channel` and serves its link until the bench ends.
pub async fn fake_worker(
    channel: tonic::transport::Channel,
    key: ClusterKey,
    name: String,
    pool: Arc<Pool>,
    mut cmds: mpsc::Receiver<Cmd>,
    registered: mpsc::Sender<()>,
) {
    let ch = endpoint::authenticated(channel, &key, &Identity::worker(&name, 0, 0));
    let (tx, rx) = mpsc::channel::<v1::WorkerMessage>(64);
    let send = |msg| v1::WorkerMessage { msg: Some(msg) };
    let reg = v1::Register {
        node_name: name.clone(),
        resources: Some(v1::Tres {
            cpus: 64,
            mem_mb: 512 * 1024,
            gpus: NODE_GPUS,
            gpu_type: String::new(),
        }),
        step_address: "127.0.0.1:1".into(),
        version: "bench".into(),
        boot_time: unix_now(),
        ..Default::default()
    };
    if tx
        .send(send(worker_message::Msg::Register(reg)))
        .await
        .is_err()
    {
        return;
    }
    let mut incoming = match WorkerLinkClient::new(ch)
        .attach(ReceiverStream::new(rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => {
            progress(format!("worker {name}: attach failed: {e}"));
            return;
        }
    };
    let mut beat = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            m = incoming.message() => {
                let Ok(Some(m)) = m else {
                    progress(format!("worker {name}: link ended"));
                    return;
                };
                match m.msg {
                    Some(controller_message::Msg::Registered(r)) => {
                        beat = tokio::time::interval(Duration::from_millis(
                            r.heartbeat_interval_ms.max(100),
                        ));
                        let _ = registered.send(()).await;
                    }
                    Some(controller_message::Msg::LaunchJob(l)) => {
                        if let Ok(mut m) = pool.running.lock() {
                            m.entry(name.clone()).or_default().push(l.job_id);
                        }
                        let started = v1::JobStarted { job_id: l.job_id, pid: 1, start_time: unix_now() };
                        let _ = tx.send(send(worker_message::Msg::JobStarted(started))).await;
                    }
                    Some(controller_message::Msg::SignalJob(s)) => {
                        // Cancelled or preempted: it "exits" at once.
                        let e = v1::JobEnded { job_id: s.job_id, cancelled: true,
                            end_time: unix_now(), processes_gone: true, ..Default::default() };
                        forget(&pool, &name, s.job_id);
                        let _ = tx.send(send(worker_message::Msg::JobEnded(e))).await;
                    }
                    Some(controller_message::Msg::AbandonJob(a)) => forget(&pool, &name, a.job_id),
                    // A simulated node runs nothing: whatever ended here is gone.
                    Some(controller_message::Msg::EndJob(e)) => {
                        forget(&pool, &name, e.job_id);
                        let gone = v1::JobGone { job_id: e.job_id };
                        let _ = tx.send(send(worker_message::Msg::JobGone(gone))).await;
                    }
                    None => {}
                }
            }
            c = cmds.recv() => match c {
                Some(Cmd::End(job)) => {
                    forget(&pool, &name, job);
                    let e = v1::JobEnded { job_id: job, exit_code: 0, end_time: unix_now(),
                        processes_gone: true, ..Default::default() };
                    let _ = tx.send(send(worker_message::Msg::JobEnded(e))).await;
                }
                None => return,
            },
            _ = beat.tick() => {
                let hb = v1::Heartbeat { time: unix_now(), running_jobs: pool.jobs_on(&name) };
                let _ = tx.send(send(worker_message::Msg::Heartbeat(hb))).await;
            }
        }
    }
}

fn forget(pool: &Pool, node: &str, job: u64) {
    if let Ok(mut m) = pool.running.lock()
        && let Some(v) = m.get_mut(node)
    {
        v.retain(|j| *j != job);
    }
}
