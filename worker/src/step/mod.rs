//! The `StepLauncher` service: `srun` launches a step's tasks on this node through it.
//!
//! # Layout
//!
//! - `auth`: who may launch and signal (pure, unit-tested).
//! - `tasks`: processes, output pumps, the per-step supervisor.
//! - `registry`: process groups of running tasks, shared with the batch supervisors so a
//!   job that ends takes its steps on this node with it.

pub mod auth;
pub mod registry;
pub mod tasks;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tandem_net::auth::ClusterKey;
use tandem_proto::v1::step_launcher_server::StepLauncher;
use tandem_proto::v1::{LaunchTasksRequest, SignalTasksRequest, SignalTasksResponse, TaskOutput};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::info;

use crate::launch::env::{NodeLocal, TaskPlace, task_env};
use crate::launch::process::RunAs;
use registry::StepRegistry;
use tasks::TaskSpec;

/// Output chunks buffered per step before a slow `srun` slows the tasks down.
const STREAM_BUFFER: usize = 64;

/// Serves `StepLauncher` for this node.
#[derive(Debug, Clone)]
pub struct StepService {
    pub node_name: String,
    pub cpus: u32,
    pub worker_uid: u32,
    /// Grace between SIGTERM and SIGKILL for `SignalTasks` with signal 0.
    pub kill_wait: Duration,
    pub key: Arc<ClusterKey>,
    pub registry: Arc<StepRegistry>,
    /// Cgroups and launcher for the tasks.
    pub placement: Arc<tasks::Placement>,
}

fn denied(e: auth::Denied) -> Status {
    Status::permission_denied(e.to_string())
}

#[tonic::async_trait]
impl StepLauncher for StepService {
    type LaunchTasksStream = ReceiverStream<Result<TaskOutput, Status>>;

    #[tracing::instrument(skip_all, fields(job_id, step_id))]
    async fn launch_tasks(
        &self,
        request: Request<LaunchTasksRequest>,
    ) -> Result<Response<Self::LaunchTasksStream>, Status> {
        let caller = tandem_net::auth::identity(&request)?.clone();
        let r = request.into_inner();
        tracing::Span::current()
            .record("job_id", r.job_id)
            .record("step_id", r.step_id);
        auth::authorize_launch(
            &caller,
            &self.key,
            &auth::LaunchAsk {
                node: &self.node_name,
                job_id: r.job_id,
                step_id: r.step_id,
                uid: r.uid,
                gid: r.gid,
                launch_token: &r.launch_token,
            },
            tandem_net::auth::unix_now(),
        )
        .map_err(denied)?;
        if r.argv.is_empty() || r.argv[0].is_empty() {
            return Err(Status::invalid_argument(
                "no command to run (argv is empty)",
            ));
        }
        if r.task_ids.is_empty() {
            return Err(Status::invalid_argument("no task ids for this node"));
        }
        let mut ids = r.task_ids.clone();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != r.task_ids.len() {
            return Err(Status::invalid_argument("task ids repeat"));
        }
        if let Some(m) = r.umask.filter(|m| *m > 0o777) {
            return Err(Status::invalid_argument(format!(
                "umask {m:o} is not a file-creation mask (at most 777)"
            )));
        }
        let workdir = Path::new(&r.workdir);
        if !workdir.is_absolute() || !workdir.is_dir() {
            return Err(Status::failed_precondition(format!(
                "working directory {:?} does not exist on node {}",
                r.workdir, self.node_name
            )));
        }
        let run_as = RunAs::decide(self.worker_uid, r.uid, r.gid)
            .map_err(|e| Status::permission_denied(e.to_string()))?;

        let node = NodeLocal {
            node_name: &self.node_name,
            cpus: self.cpus,
        };
        let specs: Vec<TaskSpec<'_>> = r
            .task_ids
            .iter()
            .enumerate()
            .map(|(local, &task_id)| TaskSpec {
                task_id,
                argv: &r.argv,
                workdir,
                umask: r.umask,
                env: task_env(
                    &r.environment,
                    &node,
                    &r.gpus,
                    TaskPlace {
                        job_id: r.job_id,
                        step_id: r.step_id,
                        proc_id: task_id,
                        local_id: u32::try_from(local).unwrap_or(u32::MAX),
                        node_id: r.node_index,
                        ntasks: r.ntasks_total,
                    },
                    &r.task_ids,
                ),
            })
            .collect();
        info!(
            tasks = specs.len(),
            uid = r.uid,
            command = %r.argv[0],
            "launching step tasks"
        );
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tasks::start_step(
            (r.job_id, r.step_id),
            run_as,
            r.uid,
            specs,
            Arc::clone(&self.registry),
            &self.placement,
            tx,
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn signal_tasks(
        &self,
        request: Request<SignalTasksRequest>,
    ) -> Result<Response<SignalTasksResponse>, Status> {
        let caller = tandem_net::auth::identity(&request)?.clone();
        let r = request.into_inner();
        let key = (r.job_id, r.step_id);
        // Tasks that already ended here are not an error: srun signals every node.
        let Some(owner) = self.registry.owner(key) else {
            return Ok(Response::new(SignalTasksResponse {}));
        };
        auth::authorize_signal(&caller, r.job_id, r.step_id, owner).map_err(denied)?;
        if r.signal == 0 {
            self.registry.signal_step(key, Signal::SIGTERM);
            let registry = Arc::clone(&self.registry);
            let wait = self.kill_wait;
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                registry.signal_step(key, Signal::SIGKILL);
            });
        } else {
            let signal = Signal::try_from(r.signal)
                .map_err(|_| Status::invalid_argument(format!("unknown signal {}", r.signal)))?;
            self.registry.signal_step(key, signal);
        }
        Ok(Response::new(SignalTasksResponse {}))
    }
}
