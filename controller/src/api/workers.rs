//! `tandem.v1.WorkerLink`: one long-lived stream per worker. The first message must be
//! `Register`; after it, worker events feed the state actor and the actor's launch/signal
//! messages flow back on the response stream.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use tandem_proto::v1::{self, worker_link_server::WorkerLink, worker_message};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, info_span, instrument};

use super::authz;
use crate::state::{Command, Handle};

pub struct WorkerLinkService {
    handle: Handle,
    /// Turns true at shutdown: readers drop their inbound halves so the server can finish
    /// streams whose workers never close their side.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Numbers successive streams so stale events of a replaced stream are ignored.
    next_conn: AtomicU64,
}

impl WorkerLinkService {
    pub fn new(handle: Handle, stopping: tokio::sync::watch::Receiver<bool>) -> Self {
        Self {
            handle,
            stopping,
            next_conn: AtomicU64::new(1),
        }
    }
}

#[tonic::async_trait]
impl WorkerLink for WorkerLinkService {
    type AttachStream = Pin<Box<dyn Stream<Item = Result<v1::ControllerMessage, Status>> + Send>>;

    #[instrument(skip_all, fields(node))]
    async fn attach(
        &self,
        request: Request<Streaming<v1::WorkerMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let who = authz::require(&request, authz::Rpc::WorkerAttach)?;
        let mut inbound = request.into_inner();
        let reg = match inbound.message().await? {
            Some(v1::WorkerMessage {
                msg: Some(worker_message::Msg::Register(reg)),
            }) => reg,
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message on WorkerLink must be Register",
                ));
            }
            None => {
                return Err(Status::invalid_argument("stream closed before Register"));
            }
        };
        if !authz::may_register_as(&who, &reg.node_name) {
            return Err(Status::permission_denied(format!(
                "worker credential for node {:?} may not register as node {:?}",
                who.user, reg.node_name
            )));
        }
        tracing::Span::current().record("node", reg.node_name.as_str());
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let node = self
            .handle
            .call(|reply| Command::WorkerRegister {
                conn,
                reg,
                tx,
                reply,
            })
            .await?;
        let handle = self.handle.clone();
        let mut stopping = self.stopping.clone();
        let span = info_span!("worker_link", node = %node, conn);
        tokio::spawn(
            async move {
                loop {
                    let msg = tokio::select! {
                        m = inbound.message() => m,
                        _ = stopping.wait_for(|s| *s) => break,
                    };
                    match msg {
                        Ok(Some(m)) => {
                            let Some(msg) = m.msg else { continue };
                            let cmd = Command::WorkerEvent {
                                conn,
                                node: node.clone(),
                                msg,
                            };
                            if handle.send_wait(cmd).await.is_err() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "worker stream error");
                            break;
                        }
                    }
                }
                let _ = handle.send_wait(Command::WorkerGone { conn, node }).await;
            }
            .instrument(span),
        );
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}
