//! The controller as the bridge sees it: a small trait ([`BatchAlloc`]) so the scheduler
//! loop can be driven by a fake in tests, and its gRPC implementation.
//!
//! The bridge authenticates with the `bridge` role, signed with the cluster key from a
//! mounted Secret file; that role may make placeholder jobs, and drain a node whose GPU
//! holder was refused, and nothing else that changes state.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use tandem_net::auth::{ClusterKey, Identity, Role};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_proto::v1;
use tandem_proto::v1::bridge_client::BridgeClient;
use tandem_proto::v1::nodes_client::NodesClient;
use tokio::sync::Mutex;

use crate::nodes::Mode;
use crate::request::{NodeCaps, Placeholder};

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("connecting to the controller at {address}")]
    Connect {
        address: String,
        #[source]
        source: endpoint::EndpointError,
    },
    #[error("controller call {call} failed: {status}")]
    Call {
        call: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("partition {0:?} has no nodes")]
    NoNodes(String),
}

impl BatchError {
    /// Whether trying again may succeed: the controller unreachable or a call that failed
    /// in transit. A bad address, CA or key is not, and is reported at once.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { source, .. } => {
                matches!(source, endpoint::EndpointError::Connect { .. })
            }
            Self::Call { status, .. } => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Unknown
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
            ),
            Self::NoNodes(_) => false,
        }
    }
}

fn call(call: &'static str) -> impl Fn(tonic::Status) -> BatchError {
    move |status| BatchError::Call {
        call,
        status: Box::new(status),
    }
}

/// How the bridge waits for a controller that is away: 100 ms doubling to 5 s, with
/// jitter, for as long as it takes (the webhook serves meanwhile; pods wait unbound).
pub fn reconnect_backoff() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
}

/// What the scheduler loop asks of the controller.
#[allow(async_fn_in_trait)]
pub trait BatchAlloc {
    /// Submits a group's placeholder, or finds the one already made; returns its job id.
    async fn submit(&self, p: &Placeholder) -> Result<u64, BatchError>;
    /// The group's pods are gone since `end_time`.
    /// Reports the pods of `namespace`'s placeholder `job_id` gone at `end_time`.
    async fn end(&self, job_id: u64, end_time: i64, namespace: &str) -> Result<(), BatchError>;
    /// Reports the group's pods gone at `end_time` from `nodes` of `namespace`'s placeholder
    /// `job_id` (nodes the controller asked back). Returns the nodes it still holds.
    async fn release_nodes(
        &self,
        job_id: u64,
        nodes: &[String],
        end_time: i64,
        namespace: &str,
    ) -> Result<Vec<String>, BatchError>;
    /// The snapshot of every placeholder, then its changes (see the proto).
    async fn watch(
        &self,
    ) -> Result<BoxStream<'static, Result<v1::PlaceholderEvent, BatchError>>, BatchError>;
    /// What the largest node of `partition` (empty: the default) offers.
    async fn caps(&self, partition: &str) -> Result<NodeCaps, BatchError>;
    /// Every node of the controller with its mode (`None`: the controller gave none).
    async fn modes(&self) -> Result<HashMap<String, Option<Mode>>, BatchError>;
    /// Drains `node` with `reason`: something holds its GPUs that should not (a refused
    /// GPU holder, [`crate::holder`]). The `bridge` role may drain, never resume.
    async fn drain(&self, node: &str, reason: &str) -> Result<(), BatchError> {
        let _ = (node, reason);
        Err(BatchError::Call {
            call: "UpdateNode",
            status: Box::new(tonic::Status::unimplemented(
                "this controller client cannot drain",
            )),
        })
    }
}

/// [`BatchAlloc`] over gRPC.
pub struct GrpcBatch {
    channel: AuthChannel,
    /// Partition capacities, refreshed at most every [`CAPS_TTL`]: a listing per group
    /// would be slurm-bridge's #45 again.
    caps: Mutex<Option<(Instant, HashMap<String, NodeCaps>)>>,
}

const CAPS_TTL: Duration = Duration::from_secs(5);

impl GrpcBatch {
    /// Connects over TLS verified against `ca`; without one, plain text, which the
    /// endpoint allows only to a loopback address.
    pub async fn connect(
        address: &str,
        ca: Option<&std::path::Path>,
        key: &ClusterKey,
    ) -> Result<Self, BatchError> {
        let who = Identity::service(Role::Bridge, "tandem-bridge", 0, 0);
        let connect_err = |source| BatchError::Connect {
            address: address.to_owned(),
            source,
        };
        let security = endpoint::security_for(address, ca).map_err(connect_err)?;
        let channel = endpoint::connect_as(address, &security, key, &who)
            .await
            .map_err(connect_err)?;
        Ok(Self {
            channel,
            caps: Mutex::new(None),
        })
    }

    async fn list_nodes(&self) -> Result<v1::ListNodesResponse, BatchError> {
        Ok(NodesClient::new(self.channel.clone())
            .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES)
            .list_nodes(v1::ListNodesRequest::default())
            .await
            .map_err(call("ListNodes"))?
            .into_inner())
    }

    async fn refresh_caps(&self) -> Result<HashMap<String, NodeCaps>, BatchError> {
        let resp = self.list_nodes().await?;
        let mut caps: HashMap<String, NodeCaps> = HashMap::new();
        for n in &resp.nodes {
            let Some(t) = &n.total else { continue };
            let c = NodeCaps {
                cpus: t.cpus,
                mem_mb: t.mem_mb,
                gpus: t.gpus,
            };
            // "" stands for the default partition: every node counts for it, as the
            // controller resolves it.
            for p in n.partitions.iter().map(String::as_str).chain([""]) {
                let e = caps.entry(p.to_owned()).or_insert(c);
                e.cpus = e.cpus.max(c.cpus);
                e.mem_mb = e.mem_mb.max(c.mem_mb);
                e.gpus = e.gpus.max(c.gpus);
            }
        }
        Ok(caps)
    }
}

impl BatchAlloc for GrpcBatch {
    async fn submit(&self, p: &Placeholder) -> Result<u64, BatchError> {
        let req = v1::SubmitPlaceholderRequest {
            group_uid: p.group_uid.clone(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            account: p.settings.account.clone(),
            partition: p.settings.partition.clone().unwrap_or_default(),
            qos: p.settings.qos.clone().unwrap_or_default(),
            time_limit_s: p.settings.time_limit.unwrap_or(0),
            nodes: p.nodes,
            pods_per_node: p.pods_per_node,
            cpus_per_pod: p.per_pod.cpus(),
            mem_mb_per_pod: p.per_pod.mem_mb(),
            gpus_per_pod: p.per_pod.gpus,
            gpu_type: p.per_pod.gpu_type.clone().unwrap_or_default(),
            exclude: p.exclude.clone(),
        };
        let resp = BridgeClient::new(self.channel.clone())
            .submit_placeholder(req)
            .await
            .map_err(call("SubmitPlaceholder"))?;
        Ok(resp.into_inner().job_id)
    }

    async fn end(&self, job_id: u64, end_time: i64, namespace: &str) -> Result<(), BatchError> {
        BridgeClient::new(self.channel.clone())
            .end_placeholder(v1::EndPlaceholderRequest {
                job_id,
                end_time,
                namespace: namespace.to_owned(),
            })
            .await
            .map_err(call("EndPlaceholder"))?;
        Ok(())
    }

    async fn release_nodes(
        &self,
        job_id: u64,
        nodes: &[String],
        end_time: i64,
        namespace: &str,
    ) -> Result<Vec<String>, BatchError> {
        let r = BridgeClient::new(self.channel.clone())
            .release_placeholder_nodes(v1::ReleasePlaceholderNodesRequest {
                job_id,
                nodes: nodes.to_vec(),
                end_time,
                namespace: namespace.to_owned(),
            })
            .await
            .map_err(call("ReleasePlaceholderNodes"))?;
        Ok(r.into_inner().nodes)
    }

    async fn watch(
        &self,
    ) -> Result<BoxStream<'static, Result<v1::PlaceholderEvent, BatchError>>, BatchError> {
        let s = BridgeClient::new(self.channel.clone())
            .watch_placeholders(v1::WatchPlaceholdersRequest {})
            .await
            .map_err(call("WatchPlaceholders"))?
            .into_inner();
        Ok(s.map_err(call("WatchPlaceholders")).boxed())
    }

    async fn caps(&self, partition: &str) -> Result<NodeCaps, BatchError> {
        let mut cached = self.caps.lock().await;
        let fresh = cached.as_ref().is_some_and(|(t, _)| t.elapsed() < CAPS_TTL);
        if !fresh {
            *cached = Some((Instant::now(), self.refresh_caps().await?));
        }
        cached
            .as_ref()
            .and_then(|(_, m)| m.get(partition).copied())
            .ok_or_else(|| BatchError::NoNodes(partition.to_owned()))
    }

    async fn modes(&self) -> Result<HashMap<String, Option<Mode>>, BatchError> {
        let resp = self.list_nodes().await?;
        Ok(resp
            .nodes
            .into_iter()
            .map(|n| {
                let mode = match n.mode() {
                    v1::NodeMode::Batch => Some(Mode::Batch),
                    v1::NodeMode::Kube => Some(Mode::Kube),
                    v1::NodeMode::Unspecified => None,
                };
                (n.name, mode)
            })
            .collect())
    }

    async fn drain(&self, node: &str, reason: &str) -> Result<(), BatchError> {
        NodesClient::new(self.channel.clone())
            .update_node(v1::UpdateNodeRequest {
                nodes: node.to_owned(),
                state: "DRAIN".into(),
                reason: reason.to_owned(),
            })
            .await
            .map_err(call("UpdateNode"))?;
        Ok(())
    }
}
