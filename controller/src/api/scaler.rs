//! KEDA's external scaler (`externalscaler.ExternalScaler`), shape-aware.
//!
//! A `ScaledObject` names a worker set's shape in its trigger metadata (see [`Target::parse`]
//! for the keys); the answer is how many workers of that shape the cluster needs: those
//! running jobs now plus those the pending jobs that fit the shape need
//! ([`tandem_sched::demand`]). With `targetSize` 1, KEDA's HPA sets the worker set's
//! replicas to that number, and `IsActive` is false (scale to zero) only when nothing waits
//! for and nothing runs on such workers.
//!
//! Read-only and credential-free: every answer comes from the last [`Snapshot`] the state
//! actor published after a pass (a `watch` channel); no request reaches the actor.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tandem_proto::externalscaler::external_scaler_server::ExternalScaler;
use tandem_proto::externalscaler::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};
use tandem_sched::demand::{Snapshot, WorkerShape, demand};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Metric names start with this; the worker set's name (or the partition's) follows.
pub const METRIC_PREFIX: &str = "tandem-workers-";

/// Messages one `StreamIsActive` stream may have queued; the stream sends only changes and
/// always the latest, so a slow reader costs this much at most.
const STREAM_BUFFER: usize = 4;

/// Open `StreamIsActive` streams at most (KEDA opens one per `ScaledObject` trigger); more
/// are refused with RESOURCE_EXHAUSTED rather than growing without bound.
pub const MAX_STREAMS: usize = 1024;

/// What one `ScaledObject` asks about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub shape: WorkerShape,
    pub metric_name: String,
}

fn bad(msg: String) -> Status {
    Status::invalid_argument(msg)
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl Target {
    /// Reads the trigger metadata. Keys (all strings): `partition` (required), `gpusPerNode`,
    /// `cpusPerNode`, `memoryPerNode` (Slurm `--mem` spelling: `256G`), `gpuType`,
    /// `features` (comma-separated), `workerSet` (the metric name's suffix). Other keys are
    /// ignored (KEDA may add its own).
    pub fn parse(meta: &HashMap<String, String>) -> Result<Target, Status> {
        let get = |k: &str| meta.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
        let partition = get("partition").ok_or_else(|| {
            bad("scalerMetadata.partition is required (the partition the worker set serves)".into())
        })?;
        if !name_ok(partition) {
            return Err(bad(format!(
                "scalerMetadata.partition {partition:?}: use letters, digits, '_', '-' or '.'"
            )));
        }
        let count = |k: &str, max: u32| -> Result<Option<u32>, Status> {
            let Some(v) = get(k) else { return Ok(None) };
            match v.parse::<u32>() {
                Ok(n) if n <= max => Ok(Some(n)),
                Ok(n) => Err(bad(format!("scalerMetadata.{k}: {n} is more than {max}"))),
                Err(_) => Err(bad(format!(
                    "scalerMetadata.{k}: {v:?} is not a whole number"
                ))),
            }
        };
        let gpus = count("gpusPerNode", tandem_sched::node::MAX_GPUS_PER_NODE)?;
        let cpus = count("cpusPerNode", tandem_sched::job::MAX_CPUS_PER_TASK)?;
        if cpus == Some(0) {
            return Err(bad("scalerMetadata.cpusPerNode must be above 0".into()));
        }
        let mem_mb = match get("memoryPerNode") {
            None => None,
            Some(v) => match tandem_sched::tres::parse_mem_mb(v) {
                Ok(0) => return Err(bad("scalerMetadata.memoryPerNode must be above 0".into())),
                Ok(m) => Some(m),
                Err(e) => return Err(bad(format!("scalerMetadata.memoryPerNode: {e}"))),
            },
        };
        let gpu_type = match get("gpuType") {
            None => None,
            Some(t) if name_ok(t) => Some(t.to_owned()),
            Some(t) => {
                return Err(bad(format!(
                    "scalerMetadata.gpuType {t:?}: use letters, digits, '_', '-' or '.'"
                )));
            }
        };
        let mut features = Vec::new();
        if let Some(list) = get("features") {
            for f in list.split(',').map(str::trim) {
                if f.is_empty()
                    || f.len() > 64
                    || !f.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '=')
                    })
                {
                    return Err(bad(format!(
                        "scalerMetadata.features {list:?}: comma-separated names of letters, \
                         digits and _-.:="
                    )));
                }
                features.push(f.to_owned());
            }
        }
        let suffix = match get("workerSet") {
            None => partition,
            Some(w) if name_ok(w) => w,
            Some(w) => {
                return Err(bad(format!(
                    "scalerMetadata.workerSet {w:?}: use letters, digits, '_', '-' or '.'"
                )));
            }
        };
        Ok(Target {
            metric_name: format!("{METRIC_PREFIX}{suffix}"),
            shape: WorkerShape {
                partition: partition.to_owned(),
                gpus,
                gpu_type,
                cpus,
                mem_mb,
                features,
            },
        })
    }

    /// Checks the target against what the cluster has: its partition must exist.
    fn check(&self, snap: &Snapshot) -> Result<(), Status> {
        if snap.has_partition(&self.shape.partition) {
            return Ok(());
        }
        let known: Vec<&str> = snap.partitions.keys().map(String::as_str).collect();
        Err(bad(format!(
            "scalerMetadata.partition {:?}: no such partition (known: {})",
            self.shape.partition,
            known.join(", ")
        )))
    }

    /// Workers of the shape the cluster needs now.
    pub fn workers(&self, snap: &Snapshot) -> u64 {
        demand(snap, &self.shape).workers()
    }
}

/// The service over the actor's published snapshots.
#[derive(Clone, Debug)]
pub struct ScalerService {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    streams: Arc<tokio::sync::Semaphore>,
}

impl ScalerService {
    pub fn new(snapshots: watch::Receiver<Arc<Snapshot>>) -> Self {
        Self {
            snapshots,
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        }
    }

    fn target(&self, r: &ScaledObjectRef) -> Result<(Target, Arc<Snapshot>), Status> {
        let t = Target::parse(&r.scaler_metadata)?;
        let snap = self.snapshots.borrow().clone();
        t.check(&snap)?;
        Ok((t, snap))
    }
}

type ActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type SpecStream = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for ScalerService {
    async fn is_active(
        &self,
        req: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let (t, snap) = self.target(req.get_ref())?;
        Ok(Response::new(IsActiveResponse {
            result: t.workers(&snap) > 0,
        }))
    }

    type StreamIsActiveStream = ActiveStream;

    /// Sends the current activity at once, then each change, until the client goes away or
    /// the controller stops.
    async fn stream_is_active(
        &self,
        req: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let (t, _) = self.target(req.get_ref())?;
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!("{MAX_STREAMS} activity streams are open"))
        })?;
        let mut rx = self.snapshots.clone();
        let (tx, out) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            let _permit = permit;
            let mut last: Option<bool> = None;
            loop {
                let active = {
                    let snap = rx.borrow_and_update().clone();
                    t.workers(&snap) > 0
                };
                if last != Some(active) {
                    last = Some(active);
                    // Waits while the reader is behind: snapshots meanwhile coalesce in the
                    // watch channel, so the next message is the latest state.
                    if tx
                        .send(Ok(IsActiveResponse { result: active }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn get_metric_spec(
        &self,
        req: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let (t, _) = self.target(req.get_ref())?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: t.metric_name,
                target_size: 1,
                target_size_float: 1.0,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        req: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let req = req.into_inner();
        let r = req
            .scaled_object_ref
            .ok_or_else(|| bad("scaledObjectRef is required".into()))?;
        let (t, snap) = self.target(&r)?;
        // KEDA strips its `sN-` trigger prefix before asking; accept it anyway.
        let asked = req.metric_name.as_str();
        if !asked.is_empty()
            && asked != t.metric_name
            && !asked.ends_with(&format!("-{}", t.metric_name))
        {
            return Err(bad(format!(
                "metricName {asked:?}: this trigger's metric is {:?}",
                t.metric_name
            )));
        }
        let n = t.workers(&snap);
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: t.metric_name,
                metric_value: i64::try_from(n).unwrap_or(i64::MAX),
                metric_value_float: n as f64,
            }],
        }))
    }

    type StreamMetricSpecStream = SpecStream;

    /// The spec never changes (target 1 worker per worker), so KEDA's pull path is enough;
    /// KEDA falls back to it on UNIMPLEMENTED, as its proto documents.
    async fn stream_metric_spec(
        &self,
        _req: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        Err(Status::unimplemented(
            "metric specs are constant; use GetMetricSpec",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn metadata_maps_to_a_shape() {
        let t = Target::parse(&meta(&[
            ("partition", "gpu"),
            ("gpusPerNode", "8"),
            ("cpusPerNode", "64"),
            ("memoryPerNode", "256G"),
            ("gpuType", "h100"),
            ("features", "ib, nvlink"),
            ("workerSet", "h100-pool"),
            ("somethingKedaAdds", "x"),
        ]))
        .unwrap();
        assert_eq!(t.metric_name, "tandem-workers-h100-pool");
        assert_eq!(
            t.shape,
            WorkerShape {
                partition: "gpu".into(),
                gpus: Some(8),
                gpu_type: Some("h100".into()),
                cpus: Some(64),
                mem_mb: Some(256 * 1024),
                features: vec!["ib".into(), "nvlink".into()],
            }
        );
        let t = Target::parse(&meta(&[("partition", "batch")])).unwrap();
        assert_eq!(t.metric_name, "tandem-workers-batch");
        assert_eq!(t.shape.gpus, None);
    }

    #[test]
    fn bad_metadata_names_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "partition is required"),
            (&[("partition", " ")], "partition is required"),
            (&[("partition", "a b")], "partition"),
            (
                &[("partition", "gpu"), ("gpusPerNode", "eight")],
                "gpusPerNode",
            ),
            (
                &[("partition", "gpu"), ("gpusPerNode", "-1")],
                "gpusPerNode",
            ),
            (
                &[("partition", "gpu"), ("gpusPerNode", "1000")],
                "gpusPerNode",
            ),
            (&[("partition", "gpu"), ("cpusPerNode", "0")], "cpusPerNode"),
            (
                &[("partition", "gpu"), ("memoryPerNode", "lots")],
                "memoryPerNode",
            ),
            (&[("partition", "gpu"), ("features", "a,,b")], "features"),
            (&[("partition", "gpu"), ("gpuType", "h 100")], "gpuType"),
            (&[("partition", "gpu"), ("workerSet", "x/y")], "workerSet"),
        ];
        for (kv, want) in cases {
            let e = Target::parse(&meta(kv)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{kv:?}");
            assert!(e.message().contains(want), "{kv:?}: {}", e.message());
        }
    }
}
