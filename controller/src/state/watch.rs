//! `WatchJob` streams, bounded: each holds at most [`WATCH_BUFFER`] undelivered updates. A
//! consumer that falls further behind is cut off (its stream ends with RESOURCE_EXHAUSTED
//! after what it was sent) instead of queueing updates in the controller's memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use tandem_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// Undelivered updates one watch stream may hold.
pub const WATCH_BUFFER: usize = 64;

/// The actor's side of one watch stream.
#[derive(Clone)]
pub struct WatchTx {
    tx: mpsc::Sender<Result<v1::JobInfo, Status>>,
    lagged: Arc<AtomicBool>,
}

impl WatchTx {
    /// A watch stream: the sender for the actor, the stream for the client.
    pub fn channel() -> (
        WatchTx,
        impl Stream<Item = Result<v1::JobInfo, Status>> + Send + 'static,
    ) {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let lagged = Arc::new(AtomicBool::new(false));
        let flag = lagged.clone();
        let tail = futures::stream::once(async move {
            flag.load(Ordering::Acquire).then(|| {
                Err(Status::resource_exhausted(format!(
                    "watch stream cut off: this client fell more than {WATCH_BUFFER} updates behind; watch again"
                )))
            })
        })
        .filter_map(futures::future::ready);
        (WatchTx { tx, lagged }, ReceiverStream::new(rx).chain(tail))
    }

    /// Queues an update without waiting; a full buffer marks the stream lagged.
    pub fn push(&self, info: v1::JobInfo) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.tx.try_send(Ok(info)) {
            self.lagged.store(true, Ordering::Release);
        }
    }

    /// Whether this stream's consumer fell behind (the actor then drops it, which ends it).
    pub fn lagged(&self) -> bool {
        self.lagged.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_consumer_is_cut_off_with_resource_exhausted() {
        let (tx, stream) = WatchTx::channel();
        for i in 0..(WATCH_BUFFER as u64 + 10) {
            tx.push(v1::JobInfo {
                job_id: i,
                ..Default::default()
            });
        }
        assert!(tx.lagged());
        drop(tx);
        let items: Vec<_> = stream.collect().await;
        assert_eq!(items.len(), WATCH_BUFFER + 1);
        assert!(items[..WATCH_BUFFER].iter().all(Result::is_ok));
        let last = items
            .last()
            .and_then(|r| r.as_ref().err())
            .expect("error last");
        assert_eq!(last.code(), tonic::Code::ResourceExhausted);
    }

    #[tokio::test]
    async fn a_keeping_up_consumer_sees_every_update_and_no_error() {
        let (tx, stream) = WatchTx::channel();
        let mut stream = std::pin::pin!(stream);
        for i in 0..(WATCH_BUFFER as u64 * 3) {
            tx.push(v1::JobInfo {
                job_id: i,
                ..Default::default()
            });
            let got = stream.next().await.expect("item").expect("ok");
            assert_eq!(got.job_id, i);
        }
        drop(tx);
        assert!(stream.next().await.is_none());
    }
}
