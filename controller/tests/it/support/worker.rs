//! `FakeWorker`: a worker stand-in that speaks the WorkerLink stream. It runs nothing; it
//! reports what a test tells it to, and shows what the controller sent it.

use tandem_net::auth::Identity;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;
use tandem_proto::v1::{self, controller_message, worker_message};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Controller, WAIT};

pub struct FakeWorker {
    pub tx: mpsc::Sender<v1::WorkerMessage>,
    pub rx: tonic::Streaming<v1::ControllerMessage>,
}

/// A registration of `name` with these resources in the default partition.
pub fn register(name: &str, cpus: u32, mem_mb: u64, gpus: u32) -> v1::Register {
    v1::Register {
        node_name: name.into(),
        resources: Some(v1::Tres {
            cpus,
            mem_mb,
            gpus,
            gpu_type: String::new(),
        }),
        step_address: "127.0.0.1:1".into(),
        version: "test".into(),
        ..Default::default()
    }
}

impl FakeWorker {
    /// Registers with `reg` and waits for the controller's `Registered`.
    pub async fn attach(c: &Controller, reg: v1::Register) -> FakeWorker {
        let ch = c.channel(&Identity::worker(&reg.node_name, 0, 0)).await;
        let (tx, rx) = mpsc::channel(64);
        tx.send(v1::WorkerMessage {
            msg: Some(worker_message::Msg::Register(reg)),
        })
        .await
        .unwrap();
        let rx = WorkerLinkClient::new(ch)
            .attach(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let mut w = FakeWorker { tx, rx };
        match w.next().await {
            controller_message::Msg::Registered(_) => w,
            other => panic!("expected Registered, got {other:?}"),
        }
    }

    pub async fn send(&self, msg: worker_message::Msg) {
        self.tx
            .send(v1::WorkerMessage { msg: Some(msg) })
            .await
            .unwrap();
    }

    pub async fn next(&mut self) -> controller_message::Msg {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("no message from the controller in time")
            .unwrap()
            .expect("stream ended")
            .msg
            .unwrap()
    }

    /// The next launch, skipping other messages.
    pub async fn expect_launch(&mut self) -> v1::LaunchJob {
        loop {
            if let controller_message::Msg::LaunchJob(l) = self.next().await {
                return l;
            }
        }
    }

    /// The job ended on this (its batch) node; a stand-in runs nothing, so nothing of it is
    /// left here.
    pub async fn end(&self, job: u64, exit_code: i32) {
        self.send(worker_message::Msg::JobEnded(v1::JobEnded {
            job_id: job,
            exit_code,
            processes_gone: true,
            ..Default::default()
        }))
        .await;
    }

    /// Answers the controller's `EndJob` for `job` (on a node of a multi-node job other than
    /// its batch host) with `JobGone`, skipping other messages.
    pub async fn confirm_gone(&mut self, job: u64) {
        loop {
            if let controller_message::Msg::EndJob(e) = self.next().await
                && e.job_id == job
            {
                self.send(worker_message::Msg::JobGone(v1::JobGone { job_id: job }))
                    .await;
                return;
            }
        }
    }
}
