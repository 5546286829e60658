//! The `StepLauncher` service as `srun` uses it: per-task environment and output, exit codes,
//! signals, authorization, and cleanup when `srun` goes away.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::{Harness, WAIT};
use tandem_net::auth::Identity;
use tandem_net::endpoint;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::{LaunchTasksRequest, SignalTasksRequest, TaskOutput, task_output};
use tonic::Streaming;

fn me() -> (u32, u32) {
    (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    )
}

/// The test's own user: the only one the worker lets launch as itself.
fn tester() -> Identity {
    let (uid, gid) = me();
    Identity::user("tester", uid, gid)
}

async fn client(h: &Harness, who: &Identity) -> StepLauncherClient<endpoint::AuthChannel> {
    let ch = endpoint::connect_as(&h.register.step_address, &h.tls.client, &h.key, who)
        .await
        .unwrap();
    StepLauncherClient::new(ch)
}

fn request(
    h: &Harness,
    job_id: u64,
    step_id: u32,
    argv: &[&str],
    tasks: &[u32],
) -> LaunchTasksRequest {
    let (uid, gid) = me();
    LaunchTasksRequest {
        job_id,
        step_id,
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        workdir: h.dir.path().to_string_lossy().into_owned(),
        environment: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        task_ids: tasks.to_vec(),
        uid,
        gid,
        launch_token: grant(h, job_id, step_id, uid, gid, &h.register.node_name),
        ..Default::default()
    }
}

/// The launch credential the controller would sign in `CreateStep`.
fn grant(h: &Harness, job_id: u64, step_id: u32, uid: u32, gid: u32, node: &str) -> String {
    h.key.issue_step(
        &tandem_net::auth::StepGrant {
            job_id,
            step_id,
            nodes: vec![node.to_owned()],
            uid,
            gid,
            exp: 0,
        },
        tandem_net::auth::unix_now(),
        60,
    )
}

async fn launch(
    c: &mut StepLauncherClient<endpoint::AuthChannel>,
    req: LaunchTasksRequest,
) -> Streaming<TaskOutput> {
    c.launch_tasks(req).await.unwrap().into_inner()
}

/// The step's first output message (the tasks are running once it comes).
async fn first_output(stream: &mut Streaming<TaskOutput>) -> TaskOutput {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("step output stalled")
        .unwrap()
        .expect("the step ended without output")
}

/// Launches one task that sleeps until signalled; returns once it is running (it has
/// printed its first line).
async fn launch_sleeper(
    h: &Harness,
    c: &mut StepLauncherClient<endpoint::AuthChannel>,
    job_id: u64,
    step_id: u32,
) -> Streaming<TaskOutput> {
    let req = request(
        h,
        job_id,
        step_id,
        &["sh", "-c", "echo up; exec sleep 300"],
        &[0],
    );
    let mut stream = launch(c, req).await;
    let first = first_output(&mut stream).await;
    assert!(
        matches!(first.event, Some(task_output::Event::Stdout(_))),
        "{first:?}"
    );
    stream
}

fn signal_step(job_id: u64, step_id: u32, signal: i32) -> SignalTasksRequest {
    SignalTasksRequest {
        job_id,
        step_id,
        signal,
        launch_token: String::new(),
    }
}

#[derive(Debug, Default)]
struct TaskResult {
    stdout: String,
    stderr: String,
    exit: Option<(i32, i32)>,
}

async fn collect(mut stream: Streaming<TaskOutput>) -> BTreeMap<u32, TaskResult> {
    let mut out: BTreeMap<u32, TaskResult> = BTreeMap::new();
    while let Some(m) = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("step output stalled")
        .unwrap()
    {
        let t = out.entry(m.task_id).or_default();
        assert!(
            t.exit.is_none(),
            "output after the exit of task {}",
            m.task_id
        );
        match m.event.unwrap() {
            task_output::Event::Stdout(b) => t.stdout.push_str(&String::from_utf8_lossy(&b)),
            task_output::Event::Stderr(b) => t.stderr.push_str(&String::from_utf8_lossy(&b)),
            task_output::Event::Exit(x) => t.exit = Some((x.exit_code, x.signal)),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_get_their_rank_gpus_and_report_output_and_exit() {
    let h = Harness::start().await;
    let mut c = client(&h, &tester()).await;
    let mut req = request(
        &h,
        30,
        4,
        &[
            "sh",
            "-c",
            "echo rank=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID step=$SLURM_STEP_ID gpus=$CUDA_VISIBLE_DEVICES host=$SLURMD_NODENAME; echo err$SLURM_PROCID >&2; exit $SLURM_PROCID",
        ],
        &[2, 3],
    );
    req.node_index = 1;
    req.gpus = vec![0, 1];
    req.ntasks_total = 4;
    let stream = launch(&mut c, req).await;
    let results = collect(stream).await;
    assert_eq!(results.len(), 2);
    let t2 = &results[&2];
    assert_eq!(t2.stdout, "rank=2 local=0 node=1 step=4 gpus=0,1 host=n1\n");
    assert_eq!(t2.stderr, "err2\n");
    assert_eq!(t2.exit, Some((2, 0)));
    let t3 = &results[&3];
    assert_eq!(t3.stdout, "rank=3 local=1 node=1 step=4 gpus=0,1 host=n1\n");
    assert_eq!(t3.exit, Some((3, 0)));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_is_a_task_failure() {
    let h = Harness::start().await;
    let mut c = client(&h, &tester()).await;
    let req = request(&h, 31, 0, &["/no/such/program"], &[0]);
    let results = collect(launch(&mut c, req).await).await;
    let t = &results[&0];
    assert_eq!(t.exit, Some((2, 0)));
    assert!(t.stderr.contains("/no/such/program"), "{t:?}");
    h.stop().await;
}

/// As on Kubernetes: the step service's certificate names the node (`n1`) and not the
/// address it is dialled at (127.0.0.1, standing for the pod IP). srun's way in
/// (`connect_to_node`) reaches it as `n1`, and refuses it when it expects another node,
/// before any request is sent; verifying the address it dials would refuse it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_service_is_verified_as_its_node_at_its_address() {
    use tandem_net::tls;
    let h = Harness::start_with(|c| {
        // The harness's CA (`TestTls::make` under the temporary directory).
        let root = c.state_dir.parent().unwrap();
        let ca = tls::ca::ClusterCa::load(&root.join("tls").join("ca")).unwrap();
        let dir = root.join("step-tls");
        ca.write_server_dir(&dir, std::slice::from_ref(&c.node_name))
            .unwrap();
        c.transport.server = tandem_net::net::ServerSecurity::Tls(
            tls::server_config(&dir.join(tls::CERT_FILE), &dir.join(tls::KEY_FILE)).unwrap(),
        );
    })
    .await;
    let address = &h.register.step_address;
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let node = h.register.node_name.clone();
    assert_eq!(node, "n1");
    let auth =
        || tandem_net::auth::ClientAuth::new(&h.key, &tester(), tandem_net::auth::unix_now());

    for other in ["n2", "127.0.0.1"] {
        let err = endpoint::connect_to_node(address, other, &h.tls.client, auth())
            .await
            .err()
            .unwrap_or_else(|| panic!("a step service certified for n1 passed as {other}"));
        assert!(
            matches!(err, endpoint::EndpointError::ConnectNode { .. }),
            "{other}: {err:?}"
        );
        let chain = tandem_net::auth::error_chain(&err);
        assert!(chain.contains("certificate"), "{other}: {chain}");
    }
    let by_address = endpoint::connect_as(address, &h.tls.client, &h.key, &tester()).await;
    assert!(
        by_address.is_err(),
        "the certificate does not name the address"
    );

    let ch = endpoint::connect_to_node(address, &node, &h.tls.client, auth())
        .await
        .unwrap();
    let mut c = StepLauncherClient::new(ch);
    let req = request(&h, 34, 0, &["echo", "verified"], &[0]);
    let results = collect(launch(&mut c, req).await).await;
    assert_eq!(results[&0].exit, Some((0, 0)));
    assert_eq!(results[&0].stdout, "verified\n");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_cannot_launch_as_someone_else_or_without_a_token() {
    let h = Harness::start().await;
    let mut c = client(&h, &Identity::user("mallory", 4242, 4242)).await;
    let mut req = request(&h, 32, 0, &["true"], &[0]);
    req.uid = 4243;
    req.gid = 4242;
    req.launch_token = grant(&h, 32, 0, 4243, 4242, &h.register.node_name);
    let err = c.launch_tasks(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("only as itself"),
        "{}",
        err.message()
    );

    // Without a launch credential, with one for another node, job, or an expired one: refused,
    // even for the job's own user.
    let mut me_client = client(&h, &tester()).await;
    let (uid, gid) = me();
    let now = tandem_net::auth::unix_now();
    let node = h.register.node_name.clone();
    let expired = h.key.issue_step(
        &tandem_net::auth::StepGrant {
            job_id: 32,
            step_id: 0,
            nodes: vec![node.clone()],
            uid,
            gid,
            exp: 0,
        },
        now - 120,
        60,
    );
    for (token, want) in [
        (String::new(), "no launch credential"),
        (
            grant(&h, 32, 0, uid, gid, "other-node"),
            "another step, user or node",
        ),
        (
            grant(&h, 99, 0, uid, gid, &node),
            "another step, user or node",
        ),
        (expired, "expired"),
    ] {
        let mut req = request(&h, 32, 0, &["true"], &[0]);
        req.launch_token = token;
        let err = me_client.launch_tasks(req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        assert!(err.message().contains(want), "{want}: {}", err.message());
    }

    let step =
        tonic::transport::Endpoint::from_shared(format!("http://{}", h.register.step_address))
            .unwrap();
    let raw = tandem_net::net::connect(&step, &h.tls.client)
        .await
        .unwrap();
    let err = StepLauncherClient::new(raw)
        .launch_tasks(request(&h, 32, 0, &["true"], &[0]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // Plain text is not served at all: the request never reaches the interceptor.
    if let Ok(plain) =
        tandem_net::net::connect(&step, &tandem_net::net::ClientSecurity::Plaintext).await
    {
        let err = StepLauncherClient::new(plain)
            .launch_tasks(request(&h, 32, 0, &["true"], &[0]))
            .await
            .unwrap_err();
        assert_ne!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_tasks_reaches_the_step() {
    let h = Harness::start().await;
    let mut c = client(&h, &tester()).await;
    let stream = launch_sleeper(&h, &mut c, 33, 1).await;
    let stranger = client(&h, &Identity::user("mallory", 4242, 4242))
        .await
        .signal_tasks(signal_step(33, 1, 9))
        .await
        .unwrap_err();
    assert_eq!(stranger.code(), tonic::Code::PermissionDenied);
    client(&h, &tester())
        .await
        .signal_tasks(signal_step(33, 1, 15))
        .await
        .unwrap();
    let results = collect(stream).await;
    assert_eq!(results[&0].exit, Some((0, 15)));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_die_when_srun_goes_away() {
    let h = Harness::start().await;
    let mut c = client(&h, &tester()).await;
    let req = request(&h, 34, 0, &["sh", "-c", "echo $$; exec sleep 300"], &[0]);
    let mut stream = launch(&mut c, req).await;
    let first = first_output(&mut stream).await;
    let Some(task_output::Event::Stdout(b)) = first.event else {
        panic!("expected the pid first, got {first:?}");
    };
    let pid: i32 = String::from_utf8(b).unwrap().trim().parse().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(stream);
    drop(c);
    let deadline = Instant::now() + WAIT;
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let gone = state
            .as_deref()
            .and_then(|s| s.rsplit(')').next())
            .is_none_or(|r| r.trim().starts_with(['Z', 'X']));
        if gone {
            break;
        }
        assert!(Instant::now() < deadline, "task {pid} outlived its srun");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.stop().await;
}

/// On the non-first nodes of a job only steps run; a cancel from the controller ends them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_job_ends_its_steps_on_this_node() {
    let h = Harness::start().await;
    let mut c = client(&h, &tester()).await;
    let stream = launch_sleeper(&h, &mut c, 35, 0).await;
    h.controller.end_job(35, "cancel", 0).await;
    let results = collect(stream).await;
    assert_eq!(results[&0].exit, Some((0, 15)));
    h.stop().await;
}

/// `--signal` without `B:`: the job's steps get the warning, the batch shell does not (it
/// would die of a signal it does not trap, as Slurm's rule avoids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warning_signal_reaches_the_steps_but_not_the_batch_shell() {
    let mut h = Harness::start().await;
    let out = h.path("warned.txt");
    let mut job = h.job(
        41,
        "#!/bin/sh\ntrap 'echo shell got USR1' USR1\necho ready\nsleep 300 &\nwait\necho shell woke\n",
        &out,
    );
    job.time_limit_s = 30;
    job.signal_number = 10; // SIGUSR1
    job.signal_before_s = 28;
    h.controller.launch(job).await;
    h.controller.started(41).await;
    let mut c = client(&h, &tester()).await;
    let script = "trap 'echo step got USR1; exit 0' USR1; while true; do sleep 0.1; done";
    let req = request(&h, 41, 0, &["sh", "-c", script], &[0]);
    let stream = launch(&mut c, req).await;
    let results = tokio::time::timeout(WAIT, collect(stream)).await.unwrap();
    assert_eq!(results[&0].stdout, "step got USR1\n");
    assert_eq!(results[&0].exit, Some((0, 0)));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text, "ready\n", "the batch shell was spared");
    h.controller.end_job(41, "cancel", 0).await;
    assert!(h.controller.ended(41).await.cancelled);
    h.stop().await;
}

/// With cgroups, a step's task runs in `job_ID/step_N`; a child it daemonized with `setsid`
/// is killed when the step's last task exits, as slurmstepd ends a step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steps_setsid_child_dies_with_the_step() {
    let name = "a_steps_setsid_child_dies_with_the_step";
    if !nix::unistd::getuid().is_root() {
        eprintln!("SKIP {name}: needs root to create cgroups");
        return;
    }
    let h = Harness::start().await;
    let pid_file = h.path("step-child.pid");
    let mut c = client(&h, &tester()).await;
    // The child lets go of the task's pipes, so the task's exit ends the step's output.
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' >/dev/null 2>&1 & sleep 0.5; echo parent done",
        pid_file.display()
    );
    let req = request(&h, 35, 0, &["sh", "-c", &script], &[0]);
    let results = collect(launch(&mut c, req).await).await;
    assert_eq!(results[&0].exit, Some((0, 0)), "{:?}", results[&0]);
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let in_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| t.contains("/job_35/step_0"))
        .unwrap_or(false);
    if !in_cgroup && std::fs::metadata(format!("/proc/{pid}")).is_ok() {
        eprintln!("SKIP {name}: cgroups not in use on this machine (the child is outside one)");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        h.stop().await;
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().and_then(|r| r.trim().chars().next()));
        if matches!(state, None | Some('Z') | Some('X')) {
            break;
        }
        assert!(Instant::now() < deadline, "pid {pid} outlived its step");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.stop().await;
}
