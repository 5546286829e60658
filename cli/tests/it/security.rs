//! Many users on one cluster, with real separate uids: the real CLI runs as other users
//! through `setpriv`, credentials come from the real identity agent, and forged, expired and
//! replayed credentials and foreign worker and step credentials meet the real controller and
//! workers. Needs root (to switch uids); otherwise each test prints `SKIP <name>: <why>`.

use crate::support;

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::{Cluster, TANDEM};
use tandem_net::auth::{ClusterKey, Identity, StepGrant, unix_now};
use tandem_net::endpoint::{self, ClusterFile};
use tandem_proto::v1;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::worker_link_client::WorkerLinkClient;

/// Two researchers without passwd entries: the code needs only numeric uids.
const ALICE: u32 = 42_001;
const BOB: u32 = 42_002;

fn can_switch_users(name: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {name}: needs root to run the CLI as other uids");
        return false;
    }
    let ok = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIP {name}: setpriv (util-linux) is not installed");
    }
    ok
}

/// A cluster other users can reach (the temp dir is made traversable; the key stays 0600),
/// and a private home directory per user.
fn shared_cluster(extra: &[&str]) -> Cluster {
    let c = Cluster::start_with(2, extra);
    for d in [c.dir.path().to_path_buf(), c.state_dir()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for uid in [ALICE, BOB] {
        let home = home(&c, uid);
        std::fs::create_dir_all(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    c
}

fn home(c: &Cluster, uid: u32) -> PathBuf {
    c.dir.path().join(format!("home-{uid}"))
}

/// The real CLI as `uid`, from its home directory.
fn as_user(c: &Cluster, uid: u32, args: &[&str]) -> Output {
    as_user_env(c, uid, &[], args)
}

/// As [`as_user`], with these environment variables set too.
fn as_user_env(c: &Cluster, uid: u32, env: &[(&str, &str)], args: &[&str]) -> Output {
    let home = home(c, uid);
    Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".to_owned(),
            "--".to_owned(),
            TANDEM.to_owned(),
        ])
        .args(args)
        .env("TANDEM_CONFIG", c.cluster_file())
        .env("HOME", &home)
        .envs(env.iter().copied())
        .env_remove("SLURM_JOB_ID")
        .current_dir(&home)
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn wait_state(c: &Cluster, id: u64, want: &str) -> serde_json::Value {
    c.wait_state(id, want, Duration::from_secs(60))
}

fn job_state(c: &Cluster, id: u64) -> String {
    c.job(id)
        .and_then(|j| j["state"]["current"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[test]
fn users_cannot_touch_each_others_jobs() {
    if !can_switch_users("users_cannot_touch_each_others_jobs") {
        return;
    }
    let c = shared_cluster(&[]);
    // Bob's job, from Bob's private home.
    let out = as_user(
        &c,
        BOB,
        &[
            "sbatch",
            "--parsable",
            "-o",
            "bob-%j.out",
            "--wrap",
            "echo secret-of-bob; sleep 300",
        ],
    );
    assert!(
        out.status.success(),
        "bob's sbatch: {}{}",
        text(&out),
        c.controller_log()
    );
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let rec = wait_state(&c, id, "RUNNING");
    assert_eq!(rec["user"], BOB.to_string(), "{rec}");
    let ids = id.to_string();

    // Alice can neither cancel, hold, requeue nor signal it.
    for args in [
        vec!["scancel", ids.as_str()],
        vec!["scancel", "--signal", "USR1", ids.as_str()],
        vec!["scontrol", "hold", ids.as_str()],
        vec!["scontrol", "requeue", ids.as_str()],
        vec!["scontrol", "update", &format!("JobId={id}"), "TimeLimit=1"],
    ] {
        let out = as_user(&c, ALICE, &args);
        let t = text(&out);
        assert!(
            !out.status.success() && t.to_lowercase().contains("denied"),
            "alice {args:?} was not refused: {t}"
        );
    }
    assert_eq!(job_state(&c, id), "RUNNING");

    // She sees that it exists, but not what it runs or where its output goes.
    let alice_view = text(&as_user(&c, ALICE, &["scontrol", "show", "job", &ids]));
    let bob_view = text(&as_user(&c, BOB, &["scontrol", "show", "job", &ids]));
    let bob_home = home(&c, BOB).to_string_lossy().into_owned();
    assert!(
        bob_view.contains(&bob_home),
        "bob sees his own job: {bob_view}"
    );
    assert!(
        alice_view.contains(&ids) && !alice_view.contains(&bob_home),
        "alice sees bob's paths: {alice_view}"
    );
    // And the output file itself is Bob's, in his private home.
    let out_file = home(&c, BOB).join(format!("bob-{id}.out"));
    c.wait_file(&out_file, "secret-of-bob", Duration::from_secs(30));
    let cat = Command::new("setpriv")
        .args([
            format!("--reuid={ALICE}"),
            format!("--regid={ALICE}"),
            "--clear-groups".to_owned(),
            "cat".to_owned(),
        ])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(!cat.status.success() && !text(&cat).contains("secret-of-bob"));

    // Bob controls his own job.
    let out = as_user(&c, BOB, &["scancel", &ids]);
    assert!(out.status.success(), "{}", text(&out));
    wait_state(&c, id, "CANCELLED");
}

#[test]
fn configured_admins_need_not_be_root() {
    if !can_switch_users("configured_admins_need_not_be_root") {
        return;
    }
    let admins = ALICE.to_string();
    let c = shared_cluster(&["--admins", &admins]);
    let out = as_user(&c, BOB, &["sbatch", "--parsable", "--wrap", "sleep 300"]);
    assert!(out.status.success(), "{}", text(&out));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    wait_state(&c, id, "RUNNING");
    // Bob may not drain a node; Alice, an administrator, may, and may cancel Bob's job.
    let drain = [
        "scontrol",
        "update",
        "NodeName=node-1",
        "State=DRAIN",
        "Reason=test",
    ];
    assert!(!as_user(&c, BOB, &drain).status.success());
    let out = as_user(&c, ALICE, &drain);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_user(&c, ALICE, &["scancel", &id.to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    wait_state(&c, id, "CANCELLED");
}

#[test]
fn the_agent_vouches_only_for_the_callers_own_uid() {
    if !can_switch_users("the_agent_vouches_only_for_the_callers_own_uid") {
        return;
    }
    let c = shared_cluster(&[]);
    // Users cannot read the key, so the agent is their only way in.
    let key = c.state_dir().join("cluster.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = as_user(&c, ALICE, &["authd", "--check"]);
    assert!(out.status.success(), "{}", text(&out));
    let who: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(who["uid"].as_u64(), Some(u64::from(ALICE)), "{who}");
    assert_eq!(who["role"], "user", "{who}");
    // Whatever Alice's environment claims, her job is hers and runs as her.
    let out = Command::new("setpriv")
        .args([
            format!("--reuid={ALICE}"),
            format!("--regid={ALICE}"),
            "--clear-groups".to_owned(),
            TANDEM.to_owned(),
        ])
        .args(["sbatch", "--parsable", "-o", "id.out", "--wrap", "id -u"])
        .env("TANDEM_CONFIG", c.cluster_file())
        .env("USER", "root")
        .env("SUDO_UID", "0")
        .current_dir(home(&c, ALICE))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    wait_state(&c, id, "COMPLETED");
    let printed = std::fs::read_to_string(home(&c, ALICE).join("id.out")).unwrap();
    assert_eq!(printed.trim(), ALICE.to_string());
    // She cannot use root's powers.
    let drain = [
        "scontrol",
        "update",
        "NodeName=node-1",
        "State=DRAIN",
        "Reason=x",
    ];
    assert!(!as_user(&c, ALICE, &drain).status.success());
    // Without the agent and without the key she gets no credential at all (over TCP: on
    // the controller's local socket the kernel names her; see the next test).
    let mut file = ClusterFile::read(&c.cluster_file()).unwrap();
    file.auth_socket = Some(c.dir.path().join("no-agent.sock"));
    file.local_socket = None;
    let alt = c.dir.path().join("no-agent.json");
    file.write(&alt).unwrap();
    let out = Command::new("setpriv")
        .args([
            format!("--reuid={ALICE}"),
            format!("--regid={ALICE}"),
            "--clear-groups".to_owned(),
            TANDEM.to_owned(),
            "squeue".to_owned(),
        ])
        .env("TANDEM_CONFIG", &alt)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(!out.status.success() && t.contains("tandem authd"), "{t}");
}

#[test]
fn the_local_socket_knows_callers_by_their_kernel_uid() {
    if !can_switch_users("the_local_socket_knows_callers_by_their_kernel_uid") {
        return;
    }
    let c = shared_cluster(&[]);
    let file = ClusterFile::read(&c.cluster_file()).unwrap();
    let socket = file.local_socket.expect("tandem up names the local socket");
    assert!(socket.starts_with(c.state_dir()), "{}", socket.display());
    // Stop the identity agent: no one can get a credential, so every command below that
    // works went through the local socket.
    let pid: i32 = std::fs::read_to_string(c.state_dir().join("authd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nix::sys::signal::kill(pid, None).is_ok() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }

    // Whatever Alice's environment claims, the kernel says who she is.
    let env = [("USER", "root"), ("SUDO_UID", "0"), ("LOGNAME", "root")];
    let out = as_user_env(
        &c,
        ALICE,
        &env,
        &["sbatch", "--parsable", "-o", "id.out", "--wrap", "id -u"],
    );
    assert!(out.status.success(), "{}{}", text(&out), c.controller_log());
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let rec = wait_state(&c, id, "COMPLETED");
    assert_eq!(rec["user"], ALICE.to_string(), "{rec}");
    let printed = std::fs::read_to_string(home(&c, ALICE).join("id.out")).unwrap();
    assert_eq!(printed.trim(), ALICE.to_string());

    // Bob's job is out of her reach, and so are root's powers.
    let out = as_user(
        &c,
        BOB,
        &["sbatch", "--parsable", "--hold", "--wrap", "true"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let bobs = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let out = as_user(&c, ALICE, &["scancel", &bobs]);
    assert!(
        !out.status.success() && text(&out).to_lowercase().contains("denied"),
        "{}",
        text(&out)
    );
    let drain = [
        "scontrol",
        "update",
        "NodeName=node-1",
        "State=DRAIN",
        "Reason=x",
    ];
    assert!(!as_user(&c, ALICE, &drain).status.success());
    let out = as_user(&c, BOB, &["scancel", &bobs]);
    assert!(out.status.success(), "{}", text(&out));

    // The same commands over TCP need the agent (users cannot read the key): refused.
    let out = as_user_env(&c, ALICE, &[("TANDEM_LOCAL_SOCKET", "")], &["squeue"]);
    let t = text(&out);
    assert!(!out.status.success() && t.contains("tandem authd"), "{t}");
    // srun's connections to the workers need a credential too, and say so.
    let out = as_user(&c, ALICE, &["srun", "-N1", "true"]);
    let t = text(&out);
    assert!(!out.status.success() && t.contains("tandem authd"), "{t}");
}

// === Direct gRPC with hand-made credentials ===

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The controller's address and how to reach the cluster's servers (TLS against its CA).
struct Target {
    addr: String,
    security: tandem_net::net::ClientSecurity,
}

fn key_and_addr(c: &Cluster) -> (ClusterKey, Target) {
    let file = ClusterFile::read(&c.cluster_file()).unwrap();
    let security = endpoint::security_for(&file.controller, file.ca_file.as_deref()).unwrap();
    assert!(security.is_tls(), "tandem up made no CA");
    (
        ClusterKey::load(&file.key_file).unwrap(),
        Target {
            addr: file.controller,
            security,
        },
    )
}

/// A fresh connection whose every request carries exactly `token`.
async fn with_token(
    target: &Target,
    token: &str,
) -> tonic::service::interceptor::InterceptedService<
    tonic::transport::Channel,
    impl tonic::service::Interceptor + Clone,
> {
    let endpoint = tonic::transport::Endpoint::from_shared(target.addr.clone()).unwrap();
    let ch = tandem_net::net::connect(&endpoint, &target.security)
        .await
        .unwrap();
    let header: tonic::metadata::AsciiMetadataValue = format!("Bearer {token}").parse().unwrap();
    tonic::service::interceptor::InterceptedService::new(ch, move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", header.clone());
        Ok(r)
    })
}

/// `token` with the uid in its claims replaced and the signature kept: what a user who cannot
/// read the key would try.
fn with_uid(token: &str, uid: u32) -> String {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "VERSION.PAYLOAD.SIGNATURE");
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    assert!(claims.get("uid").is_some(), "{claims}");
    claims["uid"] = uid.into();
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

async fn list_err(addr: &Target, token: &str) -> Option<tonic::Status> {
    JobsClient::new(with_token(addr, token).await)
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .err()
}

#[test]
fn forged_expired_and_replayed_credentials_are_refused() {
    let c = Cluster::start(1);
    let (key, addr) = key_and_addr(&c);
    rt().block_on(async {
        let alice = Identity::user("alice", ALICE, ALICE);
        let now = unix_now();
        let good = key.issue(&alice, "h", now, 300).0;
        assert!(list_err(&addr, &good).await.is_none());
        // The same connection may keep using it; a second connection may not (replay).
        let replay = list_err(&addr, &good).await.expect("replay accepted");
        assert_eq!(replay.code(), tonic::Code::Unauthenticated);
        assert!(replay.message().contains("replayed"), "{replay:?}");

        let forged = ClusterKey::generate()
            .unwrap()
            .issue(&alice, "h", now, 300)
            .0;
        let e = list_err(&addr, &forged).await.expect("forged accepted");
        assert!(e.message().contains("signature"), "{e:?}");

        let expired = key.issue(&alice, "h", now - 1_000, 300).0;
        let e = list_err(&addr, &expired).await.expect("expired accepted");
        assert!(e.message().contains("expired"), "{e:?}");

        // Alice's own credential with its uid edited to root's: the signature no longer matches.
        let fresh = key.issue(&alice, "h", now, 300).0;
        let tampered = with_uid(&fresh, 0);
        assert_ne!(tampered, fresh);
        let e = list_err(&addr, &tampered)
            .await
            .expect("tampered credential accepted");
        assert!(e.message().contains("signature"), "{e:?}");

        // A step launch credential is not an identity.
        let grant = key.issue_step(
            &StepGrant {
                job_id: 1,
                step_id: 0,
                nodes: vec!["node-1".into()],
                uid: ALICE,
                gid: ALICE,
                exp: 0,
            },
            now,
            60,
        );
        let e = list_err(&addr, &grant)
            .await
            .expect("step grant accepted as identity");
        assert!(e.message().contains("wrong kind"), "{e:?}");
        assert!(list_err(&addr, "garbage").await.is_some());
    });
}

#[test]
fn a_worker_credential_speaks_only_for_its_node() {
    let c = Cluster::start(2);
    let (key, addr) = key_and_addr(&c);
    let id = c.sbatch(&["-w", "node-1", "--wrap", "sleep 300"]);
    let before = c.wait_state(id, "RUNNING", Duration::from_secs(60));
    rt().block_on(async {
        let mallory = Identity::worker("node-9", 0, 0);
        let ch = endpoint::connect_as(&addr.addr, &addr.security, &key, &mallory)
            .await
            .unwrap();
        // Registering as another node is refused.
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.send(register("node-1")).await.unwrap();
        let err = WorkerLinkClient::new(ch.clone())
            .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
        assert!(
            err.message().contains("may not register as node"),
            "{err:?}"
        );

        // As itself it may register, but its reports about node-1's job change nothing.
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.send(register("node-9")).await.unwrap();
        let mut inbound = WorkerLinkClient::new(ch.clone())
            .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let first = inbound.message().await.unwrap().unwrap();
        assert!(matches!(
            first.msg,
            Some(v1::controller_message::Msg::Registered(_))
        ));
        let msg = |m| v1::WorkerMessage { msg: Some(m) };
        tx.send(msg(v1::worker_message::Msg::JobStarted(v1::JobStarted {
            job_id: id,
            pid: 1,
            start_time: 1,
        })))
        .await
        .unwrap();
        tx.send(msg(v1::worker_message::Msg::JobEnded(v1::JobEnded {
            job_id: id,
            exit_code: 0,
            end_time: unix_now(),
            ..Default::default()
        })))
        .await
        .unwrap();
        // A worker credential is not a user: it cannot submit or cancel.
        let e = JobsClient::new(ch.clone())
            .cancel(v1::CancelRequest {
                jobs: vec![v1::JobRef {
                    job_id: id,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        // Give the controller time to (not) act on the reports.
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(tx);
    });
    let after = c.job(id).unwrap();
    assert_eq!(job_state(&c, id), "RUNNING", "{after}");
    // node-1's own start report may land after `before` was read, a second later where the
    // controller's launch and the worker's start fall in different seconds; node-9's (start
    // time 1) must change nothing.
    let start = |j: &serde_json::Value| j["time"]["start"].as_i64().unwrap_or_default();
    assert!(
        (0..=2).contains(&(start(&after) - start(&before))),
        "start time rewritten: {before} -> {after}"
    );
}

fn register(node: &str) -> v1::WorkerMessage {
    v1::WorkerMessage {
        msg: Some(v1::worker_message::Msg::Register(v1::Register {
            node_name: node.into(),
            resources: Some(v1::Tres {
                cpus: 1,
                mem_mb: 1024,
                gpus: 0,
                gpu_type: String::new(),
            }),
            step_address: "127.0.0.1:1".into(),
            version: "test".into(),
            ..Default::default()
        })),
    }
}

#[test]
fn workers_refuse_steps_without_a_valid_launch_credential() {
    let c = Cluster::start(2);
    let (key, addr) = key_and_addr(&c);
    let id = c.sbatch(&["-w", "node-1", "--wrap", "sleep 300"]);
    c.wait_state(id, "RUNNING", Duration::from_secs(60));
    let me = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    rt().block_on(async {
        let user = Identity::user("tester", me.0, me.1);
        let ch = endpoint::connect_as(&addr.addr, &addr.security, &key, &user)
            .await
            .unwrap();
        let nodes = NodesClient::new(ch)
            .list_nodes(v1::ListNodesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .nodes;
        let node1 = nodes.iter().find(|n| n.name == "node-1").unwrap();
        let step_addr = format!("http://{}", node1.address);
        let now = unix_now();
        let grant = |job: u64, node: &str, issued: i64| {
            key.issue_step(
                &StepGrant {
                    job_id: job,
                    step_id: 0,
                    nodes: vec![node.to_owned()],
                    uid: me.0,
                    gid: me.1,
                    exp: 0,
                },
                issued,
                60,
            )
        };
        let cases = [
            (String::new(), "no launch credential"),
            (grant(id, "node-2", now), "another step, user or node"),
            (grant(id + 1, "node-1", now), "another step, user or node"),
            (grant(id, "node-1", now - 600), "expired"),
            (
                ClusterKey::generate().unwrap().issue_step(
                    &StepGrant {
                        job_id: id,
                        step_id: 0,
                        nodes: vec!["node-1".into()],
                        uid: me.0,
                        gid: me.1,
                        exp: 0,
                    },
                    now,
                    60,
                ),
                "signature",
            ),
        ];
        let ch = endpoint::connect_as(&step_addr, &addr.security, &key, &user)
            .await
            .unwrap();
        let mut launcher = StepLauncherClient::new(ch);
        for (token, want) in cases {
            let err = launcher
                .launch_tasks(v1::LaunchTasksRequest {
                    job_id: id,
                    step_id: 0,
                    argv: vec!["true".into()],
                    workdir: "/".into(),
                    task_ids: vec![0],
                    uid: me.0,
                    gid: me.1,
                    launch_token: token,
                    ntasks_total: 1,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied, "{want}: {err:?}");
            assert!(err.message().contains(want), "{want}: {}", err.message());
        }
    });
    // A real srun inside the allocation gets its credential from the controller and runs.
    let out = c
        .cmd(&["srun", "echo", "step-ran"])
        .env("SLURM_JOB_ID", id.to_string())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("step-ran"),
        "{}{}",
        text(&out),
        c.controller_log()
    );
}

/// What a client without the cluster's CA gets from `addr`: an error, never an answer.
async fn refused(
    addr: &str,
    security: &tandem_net::net::ClientSecurity,
    key: &ClusterKey,
    who: &Identity,
) -> String {
    let ch = match endpoint::connect_as(addr, security, key, who).await {
        Ok(ch) => ch,
        Err(e) => return format!("{:?}", anyhow::Error::from(e)),
    };
    match NodesClient::new(ch)
        .list_nodes(v1::ListNodesRequest::default())
        .await
    {
        Ok(_) => panic!("{addr} answered a client it should have refused"),
        Err(s) => format!("{s:?}"),
    }
}

#[test]
fn tls_refuses_plain_text_and_servers_outside_the_cluster_ca() {
    let c = Cluster::start(1);
    let (key, target) = key_and_addr(&c);
    let me = Identity::user(
        "tester",
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let other_ca = tempfile::tempdir().unwrap();
    let foreign = tandem_net::tls::ca::ClusterCa::load_or_create(other_ca.path()).unwrap();
    let foreign_security = tandem_net::net::ClientSecurity::Tls(
        tandem_net::tls::client_config(&tandem_net::tls::ca::ClusterCa::cert_path(other_ca.path()))
            .unwrap(),
    );
    drop(foreign);
    rt().block_on(async {
        // The right CA works (and lists the node whose step service we try next).
        let ch = endpoint::connect_as(&target.addr, &target.security, &key, &me)
            .await
            .unwrap();
        let nodes = NodesClient::new(ch)
            .list_nodes(v1::ListNodesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .nodes;
        let step = format!("http://{}", nodes[0].address);
        let plain = tandem_net::net::ClientSecurity::Plaintext;
        for addr in [target.addr.as_str(), step.as_str()] {
            // A plain-text client with a valid credential is refused.
            refused(addr, &plain, &key, &me).await;
            // A client that trusts another CA refuses the server, before sending anything.
            let e = refused(addr, &foreign_security, &key, &me).await;
            assert!(
                e.contains("certificate") || e.contains("UnknownIssuer"),
                "{addr}: {e}"
            );
        }
    });
    // The CLI itself finds the CA through the cluster file.
    assert_eq!(c.ok(&["sinfo", "-h", "-o", "%N"]).trim(), "node-1");
}
