//! One prometheus-client registry for the controller (prefix `tandem`): demand gauges that
//! autoscalers (HPA through a Prometheus adapter, KEDA) read, plus pass and commit counters.
//!
//! The state actor sets the gauges after each scheduling pass, from the pending set it walks
//! anyway; nothing here is computed per request.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: String,
}

/// Demand of one partition.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub pending_jobs: u64,
    pub pending_gpus: u64,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pending_jobs: Family<PartitionLabel, Gauge>,
    pending_gpus: Family<PartitionLabel, Gauge>,
    passes: Counter,
    jobs_started: Counter,
    jobs_submitted: Counter,
    /// Last demand published, so the scaler API can answer without the actor.
    last: Mutex<BTreeMap<String, Demand>>,
    pub pass_micros: Gauge<u64, AtomicU64>,
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

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tandem");
        let pending_jobs = Family::<PartitionLabel, Gauge>::default();
        let pending_gpus = Family::<PartitionLabel, Gauge>::default();
        let passes = Counter::default();
        let jobs_started = Counter::default();
        let jobs_submitted = Counter::default();
        let pass_micros = Gauge::<u64, AtomicU64>::default();
        registry.register(
            "pending_jobs",
            "Pending jobs (array tasks counted one by one) per partition",
            pending_jobs.clone(),
        );
        registry.register(
            "pending_gpus",
            "GPUs requested by pending jobs per partition",
            pending_gpus.clone(),
        );
        registry.register("sched_passes", "Scheduling passes run", passes.clone());
        registry.register("jobs_started", "Jobs started", jobs_started.clone());
        registry.register("jobs_submitted", "Jobs accepted", jobs_submitted.clone());
        registry.register(
            "sched_pass_duration_microseconds",
            "Duration of the last scheduling pass",
            pass_micros.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            pending_jobs,
            pending_gpus,
            passes,
            jobs_started,
            jobs_submitted,
            last: Mutex::new(BTreeMap::new()),
            pass_micros,
        }
    }

    pub fn pass(&self, started: usize, micros: u64) {
        self.passes.inc();
        self.jobs_started.inc_by(started as u64);
        self.pass_micros.set(micros);
    }

    pub fn submitted(&self, n: u64) {
        self.jobs_submitted.inc_by(n);
    }

    /// Publishes demand; partitions missing from `demand` drop to zero.
    pub fn set_demand(&self, demand: &BTreeMap<String, Demand>) {
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        for name in last.keys() {
            if !demand.contains_key(name) {
                let l = PartitionLabel {
                    partition: name.clone(),
                };
                self.pending_jobs.get_or_create(&l).set(0);
                self.pending_gpus.get_or_create(&l).set(0);
            }
        }
        for (name, d) in demand {
            let l = PartitionLabel {
                partition: name.clone(),
            };
            self.pending_jobs
                .get_or_create(&l)
                .set(i64::try_from(d.pending_jobs).unwrap_or(i64::MAX));
            self.pending_gpus
                .get_or_create(&l)
                .set(i64::try_from(d.pending_gpus).unwrap_or(i64::MAX));
        }
        *last = demand.clone();
    }

    pub fn demand(&self) -> BTreeMap<String, Demand> {
        self.last.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(reg) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        }
        out
    }
}

/// Serves the registry at any path over plain HTTP/1 (one response per connection), enough
/// for Prometheus and KEDA's metrics-api scaler without another HTTP stack.
pub async fn serve(listener: tandem_proto::net::Listener, metrics: std::sync::Arc<Metrics>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // The request itself does not matter; read what arrived so the peer sees a
            // clean close.
            let mut buf = [0u8; 1024];
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(1), sock.read(&mut buf)).await;
            let body = metrics.encode();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(head.as_bytes()).await;
            let _ = sock.write_all(body.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_gauges_are_exported_and_reset() {
        let m = Metrics::new();
        let mut d = BTreeMap::new();
        d.insert(
            "gpu".to_owned(),
            Demand {
                pending_jobs: 3,
                pending_gpus: 16,
            },
        );
        m.set_demand(&d);
        let text = m.encode();
        assert!(
            text.contains("tandem_pending_gpus{partition=\"gpu\"} 16"),
            "{text}"
        );
        assert!(
            text.contains("tandem_pending_jobs{partition=\"gpu\"} 3"),
            "{text}"
        );
        m.set_demand(&BTreeMap::new());
        assert!(
            m.encode()
                .contains("tandem_pending_gpus{partition=\"gpu\"} 0")
        );
    }

    #[tokio::test]
    async fn http_endpoint_serves_the_registry() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let m = std::sync::Arc::new(Metrics::new());
        m.submitted(3);
        let l = tandem_proto::net::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, m));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(out.contains("tandem_jobs_submitted_total 3"), "{out}");
    }
}
