//! `tandem.v1.Bridge`: the Kubernetes scheduler bridge's placeholder jobs.
//!
//! A placeholder is a `kube`-mode job with no script: the controller schedules it like any
//! job (same queue, priority and Fair Tree), never launches it on a worker, and keeps its
//! nodes until the bridge reports the group's pods gone. Only the `bridge` role and
//! administrators may call this service; users cannot submit `kube`-mode jobs at all.

use tandem_proto::v1::{self, bridge_server::Bridge};
use tandem_sched::JobId;
use tandem_sched::job::JobSpec;
use tandem_sched::node::NodeMode;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::authz;
use crate::state::{Command, Handle, PLACEHOLDER_STREAM_DEPTH};

/// Longest group UID accepted (Kubernetes UIDs are 36 characters; LWS group keys 40).
const MAX_GROUP_UID: usize = 128;
/// Most excluded nodes a placeholder may name, and the longest name (a DNS subdomain).
const MAX_EXCLUDED: usize = 10_000;
const MAX_NODE_NAME: usize = 253;

pub struct BridgeService {
    handle: Handle,
}

impl BridgeService {
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }
}

#[tonic::async_trait]
impl Bridge for BridgeService {
    #[instrument(skip_all, fields(group = %request.get_ref().group_uid))]
    async fn submit_placeholder(
        &self,
        request: Request<v1::SubmitPlaceholderRequest>,
    ) -> Result<Response<v1::SubmitPlaceholderResponse>, Status> {
        let who = authz::require(&request, authz::Rpc::Placeholders)?;
        let spec = placeholder_spec(request.into_inner(), who.uid, who.gid)?;
        let resp = self
            .handle
            .call(|reply| Command::SubmitPlaceholder { spec, reply })
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(job_id = request.get_ref().job_id))]
    async fn end_placeholder(
        &self,
        request: Request<v1::EndPlaceholderRequest>,
    ) -> Result<Response<v1::EndPlaceholderResponse>, Status> {
        authz::require(&request, authz::Rpc::Placeholders)?;
        let req = request.into_inner();
        check_report(req.job_id, req.end_time, &req.namespace, "ended")?;
        let resp = self
            .handle
            .call(|reply| Command::EndPlaceholder {
                job: JobId(req.job_id),
                end_time: req.end_time,
                namespace: req.namespace,
                reply,
            })
            .await?;
        Ok(Response::new(resp))
    }

    #[instrument(skip_all, fields(job_id = request.get_ref().job_id))]
    async fn release_placeholder_nodes(
        &self,
        request: Request<v1::ReleasePlaceholderNodesRequest>,
    ) -> Result<Response<v1::ReleasePlaceholderNodesResponse>, Status> {
        authz::require(&request, authz::Rpc::Placeholders)?;
        let req = request.into_inner();
        check_report(req.job_id, req.end_time, &req.namespace, "released")?;
        if req.nodes.is_empty() || req.nodes.len() > MAX_EXCLUDED {
            return Err(Status::invalid_argument(format!(
                "nodes: between 1 and {MAX_EXCLUDED} node names"
            )));
        }
        if let Some(n) = req
            .nodes
            .iter()
            .find(|n| n.is_empty() || n.len() > MAX_NODE_NAME)
        {
            return Err(Status::invalid_argument(format!(
                "nodes: {n:?} is not a node name"
            )));
        }
        let resp = self
            .handle
            .call(|reply| Command::ReleasePlaceholderNodes {
                job: JobId(req.job_id),
                nodes: req.nodes,
                end_time: req.end_time,
                namespace: req.namespace,
                reply,
            })
            .await?;
        Ok(Response::new(resp))
    }

    type WatchPlaceholdersStream = ReceiverStream<Result<v1::PlaceholderEvent, Status>>;

    async fn watch_placeholders(
        &self,
        request: Request<v1::WatchPlaceholdersRequest>,
    ) -> Result<Response<Self::WatchPlaceholdersStream>, Status> {
        authz::require(&request, authz::Rpc::Placeholders)?;
        let (tx, rx) = tokio::sync::mpsc::channel(PLACEHOLDER_STREAM_DEPTH);
        self.handle
            .call(|reply| Command::WatchPlaceholders { tx, reply })
            .await?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The fields every report about a placeholder carries: a job id, an end time not before
/// the epoch, and the namespace that speaks for the group (`what` is done only for it).
#[allow(clippy::result_large_err)]
fn check_report(job_id: u64, end_time: i64, namespace: &str, what: &str) -> Result<(), Status> {
    if job_id == 0 {
        return Err(Status::invalid_argument("job id: 0 is not a job id"));
    }
    if end_time < 0 {
        return Err(Status::invalid_argument("end_time: negative"));
    }
    if namespace.is_empty() {
        return Err(Status::invalid_argument(format!(
            "namespace: missing (a placeholder is {what} only for the namespace it belongs to)"
        )));
    }
    Ok(())
}

/// The job spec of a placeholder, checked. The namespace is the job's user in accounting,
/// so `sshare` shows each namespace under the account it charges.
#[allow(clippy::result_large_err)]
pub fn placeholder_spec(
    r: v1::SubmitPlaceholderRequest,
    uid: u32,
    gid: u32,
) -> Result<JobSpec, Status> {
    let bad = |field: &str, problem: &str| Status::invalid_argument(format!("{field}: {problem}"));
    if r.group_uid.is_empty() || r.group_uid.len() > MAX_GROUP_UID {
        return Err(bad("group_uid", "empty or longer than 128 characters"));
    }
    if r.namespace.is_empty() {
        return Err(bad("namespace", "missing"));
    }
    if r.account.is_empty() {
        return Err(bad(
            "account",
            "missing: the bridge names the account a namespace charges",
        ));
    }
    if r.nodes == 0 || r.pods_per_node == 0 {
        return Err(bad(
            "nodes",
            "a placeholder holds at least one pod on one node",
        ));
    }
    if r.exclude.len() > MAX_EXCLUDED
        || r.exclude
            .iter()
            .any(|n| n.is_empty() || n.len() > MAX_NODE_NAME || n.contains(','))
    {
        return Err(bad(
            "exclude",
            "node names must be 1 to 253 characters without commas, at most 10000 of them",
        ));
    }
    let cpus_per_task = r.cpus_per_pod.max(1);
    let mem_per_node_mb = r
        .mem_mb_per_pod
        .checked_mul(u64::from(r.pods_per_node))
        .ok_or_else(|| bad("mem_mb_per_pod", "too large"))?;
    let spec = JobSpec {
        name: if r.name.is_empty() {
            r.group_uid.clone()
        } else {
            r.name
        },
        user: r.namespace,
        uid,
        gid,
        account: r.account,
        partition: r.partition,
        qos: r.qos,
        time_limit: (r.time_limit_s > 0).then_some(r.time_limit_s),
        nodes_min: r.nodes,
        ntasks: r.nodes.saturating_mul(r.pods_per_node),
        ntasks_per_node: r.pods_per_node,
        cpus_per_task,
        mem_per_node_mb: (mem_per_node_mb > 0).then_some(mem_per_node_mb),
        gpus_per_task: r.gpus_per_pod,
        gpu_type: (!r.gpu_type.is_empty()).then_some(r.gpu_type),
        // Pods are not requeued: their controllers (ReplicaSet, JobSet) make new ones.
        requeue: Some(false),
        mode: NodeMode::Kube,
        group_uid: Some(r.group_uid),
        exclude: r.exclude,
        ..JobSpec::default()
    };
    spec.validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> v1::SubmitPlaceholderRequest {
        v1::SubmitPlaceholderRequest {
            group_uid: "5b1c0d4e-uid".into(),
            name: "serving/web-7d4f".into(),
            namespace: "serving".into(),
            account: "inference".into(),
            nodes: 2,
            pods_per_node: 3,
            cpus_per_pod: 4,
            mem_mb_per_pod: 1000,
            gpus_per_pod: 2,
            ..Default::default()
        }
    }

    #[test]
    fn a_group_becomes_a_kube_mode_job_of_its_pods() {
        let s = placeholder_spec(req(), 7, 7).unwrap();
        assert_eq!(s.mode, NodeMode::Kube);
        assert_eq!(
            (s.user.as_str(), s.account.as_str()),
            ("serving", "inference")
        );
        assert_eq!((s.nodes_min, s.ntasks, s.ntasks_per_node), (2, 6, 3));
        assert_eq!((s.cpus_per_task, s.gpus_per_task), (4, 2));
        assert_eq!(s.mem_per_node_mb, Some(3000));
        assert_eq!(s.group_uid.as_deref(), Some("5b1c0d4e-uid"));
        assert_eq!(s.requeue, Some(false));
        let shape = s.shape(tandem_sched::job::NodeCaps { cpus: 64, gpus: 8 }, 0);
        assert_eq!(
            (shape.nodes, shape.per_node.cpus, shape.per_node.gpus),
            (2, 12, 6)
        );
    }

    #[test]
    fn a_broken_request_names_its_field() {
        for (edit, field) in [
            (
                Box::new(|r: &mut v1::SubmitPlaceholderRequest| r.group_uid.clear())
                    as Box<dyn Fn(&mut v1::SubmitPlaceholderRequest)>,
                "group_uid",
            ),
            (Box::new(|r| r.namespace.clear()), "namespace"),
            (Box::new(|r| r.account.clear()), "account"),
            (Box::new(|r| r.pods_per_node = 0), "nodes"),
            (Box::new(|r| r.mem_mb_per_pod = u64::MAX), "mem_mb_per_pod"),
        ] {
            let mut r = req();
            edit(&mut r);
            let e = placeholder_spec(r, 0, 0).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{field}: {e:?}");
        }
    }
}
