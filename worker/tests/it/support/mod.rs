//! A fake controller (a real tonic `WorkerLink` server on 127.0.0.1) and a worker started
//! through `tandem_worker::run`, for the integration tests.
//!
//! The fake and the worker each run on their own tokio runtime, so that a test can drop
//! every task and connection of either at once, as SIGKILL would
//! ([`FakeController::crash`], [`Harness::crash_and_restart_worker`]).

// Each test module (batch, step, ...) uses a different part of this module.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tandem_net::auth::{ClusterKey, Role, ServerAuth, identity};
use tandem_proto::v1::worker_link_server::{WorkerLink, WorkerLinkServer};
use tandem_proto::v1::{
    ControllerMessage, JobEnded, LaunchJob, Register, Registered, SignalJob, WorkerMessage,
    controller_message, worker_message,
};
use tandem_worker::Config;
use tandem_worker::launch::exec::Launcher;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub const WAIT: Duration = Duration::from_secs(15);

type ToWorker = Arc<Mutex<Option<mpsc::Sender<Result<ControllerMessage, Status>>>>>;

#[derive(Clone)]
struct FakeLink {
    from_worker: mpsc::UnboundedSender<WorkerMessage>,
    to_worker: ToWorker,
}

#[tonic::async_trait]
impl WorkerLink for FakeLink {
    type AttachStream = ReceiverStream<Result<ControllerMessage, Status>>;

    async fn attach(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        if identity(&request)?.role != Role::Worker {
            return Err(Status::permission_denied("only workers attach"));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let registered = ControllerMessage {
            msg: Some(controller_message::Msg::Registered(Registered {
                cluster_name: "fake".into(),
                heartbeat_interval_ms: 200,
            })),
        };
        let _ = tx.send(Ok(registered)).await;
        *self.to_worker.lock().unwrap() = Some(tx.clone());
        let from = self.from_worker.clone();
        let to_worker = Arc::clone(&self.to_worker);
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                let _ = from.send(m);
            }
            // The worker hung up: close our half too, as the controller does.
            let mut current = to_worker.lock().unwrap();
            if current.as_ref().is_some_and(|c| c.same_channel(&tx)) {
                *current = None;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

pub struct FakeController {
    pub addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
    from_worker: mpsc::UnboundedReceiver<WorkerMessage>,
    to_worker: ToWorker,
}

impl FakeController {
    /// Starts a fake on `addr` (port 0 for a fresh one), serving TLS with `tls`'s
    /// certificate.
    pub async fn start(key: &ClusterKey, addr: SocketAddr, tls: &TestTls) -> Self {
        let security = tls.server.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (from_tx, from_rx) = mpsc::unbounded_channel();
        let to_worker: ToWorker = Arc::default();
        let svc = FakeLink {
            from_worker: from_tx,
            to_worker: Arc::clone(&to_worker),
        };
        let auth = ServerAuth::new(Arc::new(key.clone()));
        let (bound_tx, bound_rx) = oneshot::channel();
        rt.spawn(async move {
            // The previous fake's port may linger briefly after a crash.
            let listener = loop {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => break l,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            let _ = bound_tx.send(listener.local_addr().unwrap());
            let listener = tandem_net::net::Listener::from(listener);
            tonic::transport::Server::builder()
                .add_service(WorkerLinkServer::with_interceptor(svc, auth))
                .serve_with_incoming(listener.incoming(security))
                .await
                .unwrap();
        });
        let addr = tokio::time::timeout(WAIT, bound_rx).await.unwrap().unwrap();
        Self {
            addr,
            rt: Some(rt),
            from_worker: from_rx,
            to_worker,
        }
    }

    /// Kills the fake: its listener, streams and connections vanish at once.
    pub fn crash(mut self) -> SocketAddr {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        self.addr
    }

    /// Next message from the worker.
    pub async fn recv(&mut self) -> WorkerMessage {
        tokio::time::timeout(WAIT, self.from_worker.recv())
            .await
            .expect("timed out waiting for the worker")
            .expect("fake controller channel closed")
    }

    /// Waits for the worker's Register.
    pub async fn register(&mut self) -> Register {
        loop {
            if let Some(worker_message::Msg::Register(r)) = self.recv().await.msg {
                return r;
            }
        }
    }

    /// Waits for the JobEnded of `job_id`, skipping heartbeats and other jobs' events.
    pub async fn ended(&mut self, job_id: u64) -> JobEnded {
        loop {
            if let Some(worker_message::Msg::JobEnded(e)) = self.recv().await.msg
                && e.job_id == job_id
            {
                return e;
            }
        }
    }

    /// Waits for the JobStarted of `job_id`.
    pub async fn started(&mut self, job_id: u64) -> u32 {
        loop {
            match self.recv().await.msg {
                Some(worker_message::Msg::JobStarted(s)) if s.job_id == job_id => return s.pid,
                Some(worker_message::Msg::JobEnded(e)) if e.job_id == job_id => {
                    panic!("job {job_id} ended instead of starting: {e:?}")
                }
                _ => {}
            }
        }
    }

    pub async fn send(&self, msg: controller_message::Msg) {
        let tx = self
            .to_worker
            .lock()
            .unwrap()
            .clone()
            .expect("no worker attached");
        tx.send(Ok(ControllerMessage { msg: Some(msg) }))
            .await
            .unwrap();
    }

    pub async fn launch(&self, job: LaunchJob) {
        self.send(controller_message::Msg::LaunchJob(job)).await;
    }

    /// Tells the worker to end `job_id` the usual way (SIGTERM, KillWait, SIGKILL), after
    /// `grace_s` seconds of notice; `reason` is "cancel", "preempt" or "timeout".
    pub async fn end_job(&self, job_id: u64, reason: &str, grace_s: u32) {
        self.send(controller_message::Msg::SignalJob(SignalJob {
            job_id,
            signal: 0,
            batch_only: false,
            reason: reason.into(),
            grace_s,
        }))
        .await;
    }
}

impl Drop for FakeController {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A worker on its own runtime, so a test can kill it outright.
struct WorkerProc {
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<Result<(), tandem_worker::Error>>>,
}

impl WorkerProc {
    fn spawn(config: Config) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        rt.spawn(async move {
            let r = tandem_worker::run(config, async move {
                let _ = stopped.await;
            })
            .await;
            let _ = done_tx.send(r);
        });
        Self {
            rt: Some(rt),
            stop: Some(stop),
            done: Some(done),
        }
    }

    /// Every task of the worker vanishes at once; processes it started keep running.
    fn crash(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(done) = self.done.take() {
            tokio::time::timeout(WAIT, done)
                .await
                .expect("worker did not stop")
                .expect("worker task vanished")
                .expect("worker failed");
        }
        self.crash();
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.crash();
    }
}

/// A cluster key, a fake controller and a running worker.
/// A cluster CA and a certificate for 127.0.0.1, shared by the fake controller and the
/// worker's step service: every worker test runs over TLS.
#[derive(Clone)]
pub struct TestTls {
    pub server: tandem_net::net::ServerSecurity,
    pub client: tandem_net::net::ClientSecurity,
}

impl TestTls {
    pub fn make(dir: &Path) -> TestTls {
        use tandem_net::tls;
        let ca = tls::ca::ClusterCa::load_or_create(&dir.join("ca")).unwrap();
        let srv = dir.join("server");
        ca.write_server_dir(&srv, &["127.0.0.1".into()]).unwrap();
        TestTls {
            server: tandem_net::net::ServerSecurity::Tls(
                tls::server_config(&srv.join(tls::CERT_FILE), &srv.join(tls::KEY_FILE)).unwrap(),
            ),
            client: tandem_net::net::ClientSecurity::Tls(
                tls::client_config(&tls::ca::ClusterCa::cert_path(&dir.join("ca"))).unwrap(),
            ),
        }
    }
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub tls: TestTls,
    pub key: ClusterKey,
    pub controller: FakeController,
    pub register: Register,
    pub config: Config,
    worker: WorkerProc,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`Harness::start`] with the worker's configuration adjusted first.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Job users other than root must be able to reach their working directory.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let key = ClusterKey::generate().unwrap();
        let key_file = dir.path().join("cluster.key");
        key.write_new(&key_file).unwrap();
        let tls = TestTls::make(&dir.path().join("tls"));
        let mut controller =
            FakeController::start(&key, "127.0.0.1:0".parse().unwrap(), &tls).await;
        let config = Config {
            controller: format!("http://{}", controller.addr),
            key_file,
            node_name: "n1".into(),
            cpus: 4,
            mem_mb: 2048,
            gpus: Some(2),
            gpu_type: Some("a100".into()),
            features: vec!["ib".into()],
            partitions: vec![],
            state_dir: dir.path().join("state"),
            // Apart from the state, as `--spool-dir` puts it (a tmpfs, say).
            spool_dir: dir.path().join("spool"),
            step_listen: "127.0.0.1:0".parse().unwrap(),
            kill_wait: None,
            // Tests run side by side: each worker gets its own cgroup subtree.
            cgroup: tandem_worker::cgroup::Settings {
                subtree: Some(format!(
                    "test-{}",
                    dir.path().file_name().unwrap().to_string_lossy()
                )),
                ..Default::default()
            },
            launcher: Some(Launcher {
                program: env!("CARGO_BIN_EXE_tandem-job-exec").into(),
                args: vec![],
            }),
            transport: tandem_worker::Transport {
                server: tls.server.clone(),
                client: tls.client.clone(),
            },
        };
        let mut config = config;
        adjust(&mut config);
        let worker = WorkerProc::spawn(config.clone());
        let register = controller.register().await;
        Self {
            dir,
            tls,
            key,
            controller,
            register,
            config,
            worker,
        }
    }

    /// Kills the worker without letting it clean up, as SIGKILL would (its jobs, in
    /// their own process groups, keep running), then starts a new one on the same state
    /// directory and returns its Register.
    pub async fn crash_and_restart_worker(&mut self) -> Register {
        self.worker.crash();
        self.worker = WorkerProc::spawn(self.config.clone());
        self.register = self.controller.register().await;
        self.register.clone()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A job running `script` as the current user, writing to `out`.
    pub fn job(&self, job_id: u64, script: &str, out: &Path) -> LaunchJob {
        LaunchJob {
            job_id,
            name: format!("job{job_id}"),
            user: "tester".into(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            script: script.into(),
            workdir: self.dir.path().to_string_lossy().into_owned(),
            environment: [
                ("SLURM_JOB_ID".to_owned(), job_id.to_string()),
                ("PATH".to_owned(), "/usr/bin:/bin".to_owned()),
            ]
            .into(),
            stdout: out.to_string_lossy().into_owned(),
            kill_wait_s: 1,
            ..Default::default()
        }
    }

    pub async fn stop(mut self) {
        self.worker.stop().await;
    }
}
