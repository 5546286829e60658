//! `tandem.v1.Nodes`: sinfo, scontrol show node|partition, drain/resume, and the operator's
//! node removal.

use tandem_proto::v1::{self, nodes_server::Nodes};
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{authz, reads};

use crate::state::{Command, Handle};

pub struct NodesService {
    handle: Handle,
}

impl NodesService {
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }
}

#[tonic::async_trait]
impl Nodes for NodesService {
    #[instrument(skip_all)]
    async fn list_nodes(
        &self,
        request: Request<v1::ListNodesRequest>,
    ) -> Result<Response<v1::ListNodesResponse>, Status> {
        authz::require(&request, authz::Rpc::ListNodes)?;
        let req = request.into_inner();
        let r = reads::on_view(&self.handle, move |v| v.list_nodes(&req)).await?;
        Ok(Response::new(r))
    }

    #[instrument(skip_all)]
    async fn list_partitions(
        &self,
        request: Request<v1::ListPartitionsRequest>,
    ) -> Result<Response<v1::ListPartitionsResponse>, Status> {
        authz::require(&request, authz::Rpc::ListPartitions)?;
        let r = self.handle.view().list_partitions();
        Ok(Response::new(r))
    }

    #[instrument(skip_all, fields(user, nodes = %request.get_ref().nodes, state = %request.get_ref().state))]
    async fn update_node(
        &self,
        request: Request<v1::UpdateNodeRequest>,
    ) -> Result<Response<v1::UpdateNodeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::UpdateNode)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = request.into_inner();
        let r = self
            .handle
            .call(|reply| Command::UpdateNode { who, req, reply })
            .await?;
        Ok(Response::new(r))
    }

    #[instrument(skip_all, fields(user, nodes = %request.get_ref().nodes, force = request.get_ref().force))]
    async fn remove_node(
        &self,
        request: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::RemoveNodeResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::RemoveNode)?;
        tracing::Span::current().record("user", who.user.as_str());
        let req = request.into_inner();
        let r = self
            .handle
            .call(|reply| Command::RemoveNode { who, req, reply })
            .await?;
        Ok(Response::new(r))
    }

    #[instrument(skip_all)]
    async fn cluster_info(
        &self,
        request: Request<v1::ClusterInfoRequest>,
    ) -> Result<Response<v1::ClusterInfoResponse>, Status> {
        authz::require(&request, authz::Rpc::ClusterInfo)?;
        let r = self.handle.view().cluster_info();
        Ok(Response::new(r))
    }
}
