//! `tandem.v1.Nodes`: sinfo, scontrol show node|partition, drain/resume, and the operator's
//! node removal.

use tandem_net::auth::Identity;
use tandem_proto::v1::{self, nodes_server::Nodes};
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::{authz, reads};

use crate::state::{Command, Handle, RemoveNodes};

/// A removal request checked (admins and the operator only) and expanded.
fn remove_request(who: &Identity, req: v1::RemoveNodeRequest) -> Result<RemoveNodes, Status> {
    if !authz::may_update_node(who) {
        return Err(Status::permission_denied(
            "only an operator (root or admin) may remove nodes",
        ));
    }
    let nodes = tandem_sched::hostlist::expand(&req.nodes)
        .map_err(|e| Status::invalid_argument(format!("nodes: {e}")))?;
    if nodes.is_empty() {
        return Err(Status::invalid_argument("nodes: none given"));
    }
    let reason = if req.reason.trim().is_empty() {
        format!("removed by {}", who.user)
    } else {
        req.reason
    };
    Ok(RemoveNodes {
        nodes,
        force: req.force,
        reason,
        by: who.user.clone(),
    })
}

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
        let req = remove_request(&who, request.into_inner())?;
        let done = self
            .handle
            .call(|reply| Command::RemoveNode { req, reply })
            .await?;
        Ok(Response::new(v1::RemoveNodeResponse {
            removed: done.removed,
            unknown: done.unknown,
        }))
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

#[cfg(test)]
mod tests {
    use tandem_net::auth::Role;

    use super::*;

    #[test]
    fn only_operators_remove_nodes_and_a_removal_names_some() {
        let req = |nodes: &str, reason: &str| v1::RemoveNodeRequest {
            nodes: nodes.into(),
            reason: reason.into(),
            force: true,
        };
        let alice = Identity::user("alice", 1000, 1000);
        let err = remove_request(&alice, req("n1", "")).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        let mut op = Identity::user("tandem-operator", 0, 0);
        op.role = Role::Operator;
        let r = remove_request(&op, req("n[1-3]", "")).unwrap();
        assert_eq!(r.nodes, ["n1", "n2", "n3"]);
        assert_eq!(r.reason, "removed by tandem-operator");
        assert_eq!(r.by, "tandem-operator");
        assert!(r.force);
        let r = remove_request(&op, req("n1", "pod gone")).unwrap();
        assert_eq!(r.reason, "pod gone");
        for bad in ["", " ", "n[1-"] {
            let err = remove_request(&op, req(bad, "")).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(err.message().starts_with("nodes: "), "{}", err.message());
        }
    }
}
