//! The controller as the operator sees it: a small trait ([`BatchControl`]) so reconcile
//! tests can use a fake ([`fake`]), and its gRPC implementation over `tandem-proto` clients.
//!
//! The operator authenticates as an admin identity signed with the cluster key it keeps in
//! the cluster's Secret (read from the API, never from a file or an environment variable).

use std::collections::BTreeSet;

use futures::future::BoxFuture;

use tandem_net::auth::{ClusterKey, Identity, Role};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_net::net::ClientSecurity;
use tandem_proto::v1;
use tandem_proto::v1::accounting_client::AccountingClient;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;

use crate::accounting::{Change, Current};
use crate::plan::{BatchNode, NodeState};

#[cfg(test)]
pub mod fake;

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
}

impl BatchError {
    /// The controller refused the request in the present state (FailedPrecondition): a
    /// "not yet", not a fault.
    pub fn refused(&self) -> bool {
        matches!(self, BatchError::Call { status, .. } if status.code() == tonic::Code::FailedPrecondition)
    }

    /// The controller's own words, without the call's name.
    pub fn detail(&self) -> String {
        match self {
            BatchError::Call { status, .. } => status.message().to_owned(),
            e => e.to_string(),
        }
    }
}

fn call(call: &'static str) -> impl Fn(tonic::Status) -> BatchError {
    move |status| BatchError::Call {
        call,
        status: Box::new(status),
    }
}

/// A controller call's future (boxed, so that [`BatchControl`] can be a trait object).
pub type BatchFuture<'a, T> = BoxFuture<'a, Result<T, BatchError>>;

/// What the reconcilers ask of the controller.
pub trait BatchControl: Send + Sync {
    /// Nodes by name (all when `names` is empty).
    fn nodes<'a>(&'a self, names: &'a [String]) -> BatchFuture<'a, Vec<BatchNode>>;
    /// Drain (`reason` must carry the operator's prefix), resume or set DOWN.
    fn update_node<'a>(
        &'a self,
        node: &'a str,
        state: &'a str,
        reason: &'a str,
    ) -> BatchFuture<'a, ()>;
    fn remove_node<'a>(
        &'a self,
        node: &'a str,
        force: bool,
        reason: &'a str,
    ) -> BatchFuture<'a, ()>;
    /// Partitions named by jobs the controller still holds (pending, running, recent).
    fn referenced_partitions(&self) -> BatchFuture<'_, BTreeSet<String>>;
    fn accounting(&self) -> BatchFuture<'_, Current>;
    fn apply<'a>(&'a self, change: &'a Change) -> BatchFuture<'a, ()>;
}

/// [`BatchControl`] over gRPC.
#[derive(Clone)]
pub struct GrpcBatch {
    channel: AuthChannel,
}

impl GrpcBatch {
    /// `security`: TLS verified against the cluster CA (the controller's certificate names
    /// the Service's clusterIP, which `address` holds).
    pub async fn connect(
        address: &str,
        security: &ClientSecurity,
        key: &ClusterKey,
    ) -> Result<Self, BatchError> {
        let who = Identity::service(Role::Operator, "tandem-operator", 0, 0);
        let channel = endpoint::connect_as(address, security, key, &who)
            .await
            .map_err(|source| BatchError::Connect {
                address: address.to_owned(),
                source,
            })?;
        Ok(Self { channel })
    }

    fn nodes_client(&self) -> NodesClient<AuthChannel> {
        NodesClient::new(self.channel.clone())
            .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES)
    }
}

pub fn batch_node(n: &v1::NodeInfo) -> BatchNode {
    BatchNode {
        name: n.name.clone(),
        state: NodeState::parse(&n.state),
        drain: n.drain,
        reason: n.reason.clone(),
        running_jobs: u32::try_from(n.running_jobs.len()).unwrap_or(u32::MAX),
        busy_until: (n.busy_until >= 0).then_some(n.busy_until),
        kube_mode: n.mode == v1::NodeMode::Kube as i32,
    }
}

impl BatchControl for GrpcBatch {
    fn nodes<'a>(&'a self, names: &'a [String]) -> BatchFuture<'a, Vec<BatchNode>> {
        Box::pin(async move {
            let r = self
                .nodes_client()
                .list_nodes(v1::ListNodesRequest {
                    nodes: if names.is_empty() {
                        String::new()
                    } else {
                        tandem_sched::hostlist::compress(names)
                    },
                    partition: String::new(),
                })
                .await
                .map_err(call("ListNodes"))?;
            Ok(r.into_inner().nodes.iter().map(batch_node).collect())
        })
    }

    fn update_node<'a>(
        &'a self,
        node: &'a str,
        state: &'a str,
        reason: &'a str,
    ) -> BatchFuture<'a, ()> {
        Box::pin(async move {
            self.nodes_client()
                .update_node(v1::UpdateNodeRequest {
                    nodes: node.to_owned(),
                    state: state.to_owned(),
                    reason: reason.to_owned(),
                })
                .await
                .map_err(call("UpdateNode"))?;
            Ok(())
        })
    }

    fn remove_node<'a>(
        &'a self,
        node: &'a str,
        force: bool,
        reason: &'a str,
    ) -> BatchFuture<'a, ()> {
        Box::pin(async move {
            self.nodes_client()
                .remove_node(v1::RemoveNodeRequest {
                    nodes: node.to_owned(),
                    force,
                    reason: reason.to_owned(),
                })
                .await
                .map_err(call("RemoveNode"))?;
            Ok(())
        })
    }

    fn referenced_partitions(&self) -> BatchFuture<'_, BTreeSet<String>> {
        Box::pin(async move {
            let r = JobsClient::new(self.channel.clone())
                .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES)
                .list_jobs(v1::ListJobsRequest {
                    include_finished: true,
                    fold_arrays: true,
                    fields: vec!["partition".into()],
                    ..Default::default()
                })
                .await
                .map_err(call("ListJobs"))?;
            Ok(r.into_inner()
                .jobs
                .into_iter()
                .map(|j| j.partition)
                .collect())
        })
    }

    fn accounting(&self) -> BatchFuture<'_, Current> {
        Box::pin(async move {
            let mut c = AccountingClient::new(self.channel.clone())
                .max_decoding_message_size(endpoint::MAX_RESPONSE_BYTES);
            let a = c
                .list_associations(v1::ListAssociationsRequest {})
                .await
                .map_err(call("ListAssociations"))?
                .into_inner();
            let q = c
                .list_qos(v1::ListQosRequest {})
                .await
                .map_err(call("ListQos"))?
                .into_inner();
            Ok(Current {
                accounts: a.accounts,
                users: a.users,
                qos: q.qos,
            })
        })
    }

    fn apply<'a>(&'a self, change: &'a Change) -> BatchFuture<'a, ()> {
        Box::pin(async move {
            let mut c = AccountingClient::new(self.channel.clone());
            let r = match change.clone() {
                Change::AddQos(r) => c.add_qos(r).await.map_err(call("AddQos")),
                Change::ModifyQos(r) => c.modify_qos(r).await.map_err(call("ModifyQos")),
                Change::AddAccount(r) => c.add_account(r).await.map_err(call("AddAccount")),
                Change::ModifyAccount(r) => {
                    c.modify_account(r).await.map_err(call("ModifyAccount"))
                }
                Change::AddUser(r) => c.add_user(r).await.map_err(call("AddUser")),
                Change::ModifyUser(r) => c.modify_user(r).await.map_err(call("ModifyUser")),
                Change::DeleteUser(r) => c.delete_user(r).await.map_err(call("DeleteUser")),
                Change::DeleteAccount(r) => {
                    c.delete_account(r).await.map_err(call("DeleteAccount"))
                }
                Change::DeleteQos(r) => c.delete_qos(r).await.map_err(call("DeleteQos")),
            };
            r.map(|_| ())
        })
    }
}
