//! Request counting: every request a client sends, recorded by a tower layer in a
//! [`RequestLog`], so tests can bound a component's traffic (a busy loop shows up here).
//! Apart from [`super::TestCluster`] because it is a client layer, not the cluster.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::TestkitError;

/// Every request a client sent: when, the method and the path with its query. Shared by
/// clones; the client's tower layer appends to it.
#[derive(Debug, Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<RequestRecord>>>);

/// The most of `reqs` (in the order sent) in any one-second window starting at one of them.
pub fn max_in_one_second(reqs: &[RequestRecord]) -> usize {
    let times: Vec<Instant> = reqs.iter().map(|r| r.at).collect();
    let mut best = 0;
    let mut end = 0;
    for start in 0..times.len() {
        while end < times.len() && times[end] < times[start] + Duration::from_secs(1) {
            end += 1;
        }
        best = best.max(end - start);
    }
    best
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub at: Instant,
    pub method: String,
    pub path: String,
}

impl RequestLog {
    pub fn all(&self) -> Vec<RequestRecord> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests sent at or after `since`.
    pub fn since(&self, since: Instant) -> Vec<RequestRecord> {
        self.all().into_iter().filter(|r| r.at >= since).collect()
    }

    /// The most requests in any one-second window starting at a request (a busy loop
    /// shows up here however short it was).
    pub fn max_per_second(&self) -> usize {
        max_in_one_second(&self.all())
    }

    fn record(&self, method: &str, path: String) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(RequestRecord {
                at: Instant::now(),
                method: method.to_owned(),
                path,
            });
    }
}

/// A tower layer that records each request in a [`RequestLog`].
#[derive(Debug, Clone)]
pub struct CountLayer(pub RequestLog);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            log: self.0.clone(),
        }
    }
}

/// The service [`CountLayer`] wraps around a client's stack.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    log: RequestLog,
}

impl<S, B> tower::Service<axum::http::Request<B>> for Counted<S>
where
    S: tower::Service<axum::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let path = req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().to_string(), |p| p.to_string());
        self.log.record(req.method().as_str(), path);
        self.inner.call(req)
    }
}

pub(super) fn counted_client(
    config: kube::Config,
    log: &RequestLog,
) -> Result<kube::Client, TestkitError> {
    let builder = kube::client::ClientBuilder::try_from(config).map_err(TestkitError::Client)?;
    Ok(builder.with_layer(&CountLayer(log.clone())).build())
}
