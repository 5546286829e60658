//! Property tests of the network decoders a worker exposes: its `StepLauncher` service
//! (`LaunchTasks`, `SignalTasks`), called over the real TLS listener of a real worker with
//! arbitrary bytes, with well-formed messages of arbitrary content, and with well-formed
//! messages cut or bit-flipped, each under a valid or an invalid launch credential.
//!
//! Whatever arrives, the worker answers in time (no panic, no hang), refuses what it cannot
//! use with a status that names the problem (never UNKNOWN, never without a message), never
//! launches without a valid launch credential, and keeps serving: a valid launch afterwards
//! runs, and a step that was running all along is untouched by refused signals.
//!
//! Commands the properties may run are harmless (`/bin/echo`, `/bin/true`, a missing
//! program): the worker runs as root here and a flaw in its checks must not do damage.

use crate::support;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use support::{Harness, WAIT};
use tandem_net::auth::{ClusterKey, Identity, StepGrant, unix_now};
use tandem_net::endpoint::{self, AuthChannel};
use tandem_proto::raw;
use tandem_proto::v1::step_launcher_client::StepLauncherClient;
use tandem_proto::v1::{LaunchTasksRequest, SignalTasksRequest, TaskOutput, task_output};

const LAUNCH: &str = "/tandem.v1.StepLauncher/LaunchTasks";
const SIGNAL: &str = "/tandem.v1.StepLauncher/SignalTasks";
const METHODS: [&str; 2] = [LAUNCH, SIGNAL];

/// The job of the step that runs through the whole test.
const SLEEPER_JOB: u64 = 7_000;

fn me() -> (u32, u32) {
    (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    )
}

/// Who calls: the test's own user (the one that may launch as itself), another user, and
/// the node agent of another node (workers may act for any user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Tester = 0,
    Mallory = 1,
    Worker = 2,
}

impl Caller {
    const ALL: [Caller; 3] = [Caller::Tester, Caller::Mallory, Caller::Worker];

    fn identity(self) -> Identity {
        let (uid, gid) = me();
        match self {
            Self::Tester => Identity::user("tester", uid, gid),
            Self::Mallory => Identity::user("mallory", 4242, 4242),
            Self::Worker => Identity::worker("n2", 0, 0),
        }
    }

    /// May this caller launch as `uid`/`gid` once the launch credential is right?
    fn may_launch_as(self, uid: u32, gid: u32) -> bool {
        match self.identity() {
            who if who.role == tandem_net::auth::Role::User => who.uid == uid && who.gid == gid,
            _ => true,
        }
    }
}

fn callers() -> impl Strategy<Value = Caller> {
    prop_oneof![
        4 => Just(Caller::Tester),
        1 => Just(Caller::Mallory),
        1 => Just(Caller::Worker),
    ]
}

/// The launch credential a request carries.
#[derive(Debug, Clone)]
enum Token {
    /// Signed by the cluster key for exactly this job, step, user and node.
    Valid,
    Missing,
    Garbage(String),
    /// Signed, but for the next job id.
    OtherJob,
    /// Signed, but naming another node only.
    OtherNode,
    /// Signed, but expired an hour ago.
    Expired,
    /// Well-formed, signed by another cluster's key.
    OtherKey,
}

fn tokens() -> impl Strategy<Value = Token> {
    prop_oneof![
        12 => Just(Token::Valid),
        1 => Just(Token::Missing),
        1 => "\\PC{1,200}".prop_map(Token::Garbage),
        1 => Just(Token::OtherJob),
        1 => Just(Token::OtherNode),
        1 => Just(Token::Expired),
        1 => Just(Token::OtherKey),
    ]
}

/// Harmless commands, and malformed ones (empty, NUL bytes, missing programs).
fn argvs() -> impl Strategy<Value = Vec<String>> {
    let args = proptest::collection::vec(any::<String>(), 0..4);
    prop_oneof![
        6 => args.clone().prop_map(|mut a| {
            a.insert(0, "/bin/echo".into());
            a
        }),
        3 => Just(vec!["/bin/true".to_owned()]),
        1 => Just(vec![]),
        1 => args.clone().prop_map(|mut a| {
            a.insert(0, String::new());
            a
        }),
        1 => "[a-z]{1,12}".prop_map(|p| vec![format!("/nonexistent/tandem-{p}")]),
        1 => Just(vec!["/bin/ec\0ho".to_owned()]),
    ]
}

/// The shape of a `LaunchTasksRequest`; the token and working directory are filled in
/// once the harness exists. Each part is mostly valid, so that a good share of shapes is
/// well-formed throughout and the rest are off in one or two ways.
#[derive(Debug, Clone)]
struct LaunchShape {
    job_id: u64,
    step_id: u32,
    argv: Vec<String>,
    /// `None`: the harness's directory (valid); else as given.
    workdir: Option<String>,
    environment: HashMap<String, String>,
    task_ids: Vec<u32>,
    gpus: Vec<u32>,
    node_index: u32,
    /// `None`: the test's own uid and gid.
    ids: Option<(u32, u32)>,
    ntasks_total: u32,
    /// Valid up to 0o777.
    umask: Option<u32>,
    token: Token,
}

fn launch_shapes() -> impl Strategy<Value = LaunchShape> {
    let env_text = || {
        prop_oneof![
            4 => "[A-Z_]{1,10}",
            1 => any::<String>(),
            1 => Just("BAD=KEY".to_owned()),
            1 => Just("NUL\0".to_owned()),
        ]
    };
    (
        (any::<u64>(), any::<u32>(), argvs()),
        (
            prop_oneof![
                8 => Just(None),
                1 => Just(Some(String::new())),
                1 => Just(Some("relative/dir".to_owned())),
                1 => Just(Some("/nonexistent/tandem".to_owned())),
                1 => any::<String>().prop_map(Some),
            ],
            proptest::collection::hash_map(env_text(), env_text(), 0..4),
            prop_oneof![
                8 => proptest::collection::btree_set(0u32..64, 1..4)
                    .prop_map(|t| t.into_iter().collect::<Vec<_>>()),
                1 => Just(vec![]),
                1 => proptest::collection::vec(0u32..3, 2..5),
            ],
            proptest::collection::vec(any::<u32>(), 0..3),
        ),
        (
            any::<u32>(),
            prop_oneof![8 => Just(None), 1 => any::<(u32, u32)>().prop_map(Some)],
            any::<u32>(),
            tokens(),
            prop_oneof![
                6 => Just(None),
                2 => (0u32..=0o777).prop_map(Some),
                1 => any::<u32>().prop_map(Some),
            ],
        ),
    )
        .prop_map(
            |(
                (job_id, step_id, argv),
                (workdir, environment, task_ids, gpus),
                (node_index, ids, ntasks_total, token, umask),
            )| LaunchShape {
                // Never the sleeper's job: a property launch must not meet its step.
                job_id: if job_id == SLEEPER_JOB { 0 } else { job_id },
                step_id,
                argv,
                workdir,
                environment,
                task_ids,
                gpus,
                node_index,
                ids,
                ntasks_total,
                umask,
                token,
            },
        )
}

/// The launch credential the controller would sign in `CreateStep`.
fn grant(key: &ClusterKey, job_id: u64, step_id: u32, ids: (u32, u32), node: &str) -> String {
    key.issue_step(
        &StepGrant {
            job_id,
            step_id,
            nodes: vec![node.to_owned()],
            uid: ids.0,
            gid: ids.1,
            exp: 0,
        },
        unix_now(),
        60,
    )
}

struct World {
    h: Harness,
    other_key: ClusterKey,
    /// One connection per [`Caller`], in the order of [`Caller::ALL`].
    channels: Vec<AuthChannel>,
    /// Job ids of launches that may run: each unique, so no step meets another.
    next_job: AtomicU64,
}

impl World {
    fn channel(&self, c: Caller) -> AuthChannel {
        self.channels[c as usize].clone()
    }

    /// The request a shape describes, and whether the worker must accept it.
    fn request(&self, s: &LaunchShape, caller: Caller) -> (LaunchTasksRequest, bool) {
        let node = self.h.register.node_name.as_str();
        let ids = s.ids.unwrap_or_else(me);
        let mut job_id = s.job_id;
        let token = match &s.token {
            Token::Valid => {
                // A launch that may run gets a job id of its own.
                job_id = self.next_job.fetch_add(1, Ordering::Relaxed);
                grant(&self.h.key, job_id, s.step_id, ids, node)
            }
            Token::Missing => String::new(),
            Token::Garbage(g) => g.clone(),
            Token::OtherJob => grant(&self.h.key, job_id.wrapping_add(1), s.step_id, ids, node),
            Token::OtherNode => grant(&self.h.key, job_id, s.step_id, ids, "n9"),
            Token::Expired => self.h.key.issue_step(
                &StepGrant {
                    job_id,
                    step_id: s.step_id,
                    nodes: vec![node.to_owned()],
                    uid: ids.0,
                    gid: ids.1,
                    exp: 0,
                },
                unix_now() - 3600,
                60,
            ),
            Token::OtherKey => grant(&self.other_key, job_id, s.step_id, ids, node),
        };
        let workdir = s
            .workdir
            .clone()
            .unwrap_or_else(|| self.h.dir.path().to_string_lossy().into_owned());
        let mut unique = s.task_ids.clone();
        unique.sort_unstable();
        unique.dedup();
        // As the worker checks it: credential, caller, command, tasks, directory, and
        // the user to run as (a worker not running as root runs tasks only as itself).
        let worker_uid = me().0;
        let well_formed = matches!(s.token, Token::Valid)
            && caller.may_launch_as(ids.0, ids.1)
            && s.argv.first().is_some_and(|a| !a.is_empty())
            && !s.task_ids.is_empty()
            && unique.len() == s.task_ids.len()
            && Path::new(&workdir).is_absolute()
            && Path::new(&workdir).is_dir()
            && (worker_uid == 0 || ids.0 == worker_uid)
            && s.umask.is_none_or(|m| m <= 0o777);
        let req = LaunchTasksRequest {
            job_id,
            step_id: s.step_id,
            argv: s.argv.clone(),
            workdir,
            environment: s.environment.clone(),
            task_ids: s.task_ids.clone(),
            gpus: s.gpus.clone(),
            node_index: s.node_index,
            launch_token: token,
            uid: ids.0,
            gid: ids.1,
            ntasks_total: s.ntasks_total,
            umask: s.umask,
        };
        (req, well_formed)
    }
}

type Reply = Result<Result<Vec<u8>, tonic::Status>, tokio::time::error::Elapsed>;

/// The reply came in time; a refusal has a code that is not UNKNOWN and says why.
fn answered(method: &str, reply: Reply) -> Result<Vec<u8>, tonic::Status> {
    let reply = reply.unwrap_or_else(|_| panic!("{method} hung"));
    if let Err(s) = &reply {
        assert_ne!(s.code(), tonic::Code::Unknown, "{method}: {s:?}");
        assert!(
            !s.message().is_empty(),
            "{method}: a refusal without a reason: {s:?}"
        );
    }
    reply
}

/// What a refusal of a `LaunchTasks` body that decoded may say.
fn clear_launch_refusal(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::PermissionDenied
            | tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
    )
}

/// Garbage that is certainly not a valid message: a field tag of wire type 7 (undefined).
fn undecodable() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..256).prop_map(|mut v| {
        v.insert(0, 0x0f);
        v
    })
}

/// The fields of `LaunchTasksRequest` and `SignalTasksRequest`: number and wire type
/// (repeated scalars come packed or one by one).
const LAUNCH_FIELDS: &[(u64, u8)] = &[
    (1, 0),
    (2, 0),
    (3, 2),
    (4, 2),
    (5, 2),
    (6, 2),
    (6, 0),
    (7, 2),
    (7, 0),
    (8, 0),
    (9, 2),
    (10, 0),
    (11, 0),
    (12, 0),
];
const SIGNAL_FIELDS: &[(u64, u8)] = &[(1, 0), (2, 0), (3, 0), (4, 2)];

/// Protobuf-shaped bytes: a run of well-framed fields, mostly the message's own with their
/// wire type and arbitrary content (varints, text, bytes), sometimes any number (unknown
/// fields are skipped) or a wire type the field does not take. Many decode, so the
/// handler's checks see arbitrary values; the rest test the decoder's framing checks.
fn field_soup(fields: &'static [(u64, u8)]) -> impl Strategy<Value = Vec<u8>> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let content = prop_oneof![
        3 => "\\PC{0,40}".prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..40),
    ];
    let field = prop_oneof![
        6 => (proptest::sample::select(fields), any::<u64>(), content.clone())
            .prop_map(|((n, w), v, c)| (n, w, v, c)),
        1 => (1u64..=16, proptest::sample::select(vec![0u8, 1, 2, 5]), any::<u64>(), content),
    ];
    proptest::collection::vec(field, 0..8).prop_map(|fields| {
        let mut out = Vec::new();
        for (number, wire, value, content) in fields {
            varint(number << 3 | u64::from(wire), &mut out);
            match wire {
                0 => varint(value, &mut out),
                1 => out.extend(value.to_le_bytes()),
                2 => {
                    varint(content.len() as u64, &mut out);
                    out.extend(content);
                }
                _ => out.extend((value as u32).to_le_bytes()),
            }
        }
        out
    })
}

/// The sleeper step is still running: its stream has no message and has not ended.
fn sleeper_alive(
    rt: &tokio::runtime::Runtime,
    stream: &mut tonic::Streaming<TaskOutput>,
) -> Result<(), String> {
    rt.block_on(async {
        match tokio::time::timeout(std::time::Duration::from_millis(50), stream.message()).await {
            Err(_) => Ok(()),
            Ok(m) => Err(format!("the sleeper step moved: {m:?}")),
        }
    })
}

#[test]
fn arbitrary_step_requests_are_refused_clearly_and_the_worker_keeps_serving() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = rt.block_on(Harness::start());
    let channels = Caller::ALL
        .into_iter()
        .map(|c| {
            rt.block_on(endpoint::connect_as(
                &h.register.step_address,
                &h.tls.client,
                &h.key,
                &c.identity(),
            ))
            .unwrap()
        })
        .collect();
    let world = World {
        other_key: ClusterKey::generate().unwrap(),
        channels,
        next_job: AtomicU64::new(100_000),
        h,
    };
    let call = |ch: AuthChannel, method: &'static str, body: Vec<u8>| -> Reply {
        rt.block_on(async { tokio::time::timeout(WAIT, raw::call(ch, method, body)).await })
    };

    // A credential of another cluster is refused by the interceptor, before any body is
    // decoded.
    let stranger = rt
        .block_on(endpoint::connect_as(
            &world.h.register.step_address,
            &world.h.tls.client,
            &world.other_key,
            &Caller::Tester.identity(),
        ))
        .unwrap();
    for method in METHODS {
        for body in [vec![], vec![0x0f, 1, 2]] {
            let s = answered(method, call(stranger.clone(), method, body))
                .expect_err("a foreign credential was accepted");
            assert_eq!(s.code(), tonic::Code::Unauthenticated, "{method}: {s:?}");
        }
    }

    // A step of the tester's that runs through the whole test; refused signals must not
    // reach it.
    let mut tester = StepLauncherClient::new(world.channel(Caller::Tester));
    let (uid, gid) = me();
    let sleeper = LaunchTasksRequest {
        job_id: SLEEPER_JOB,
        step_id: 0,
        argv: vec!["sh".into(), "-c".into(), "echo up; exec sleep 300".into()],
        workdir: world.h.dir.path().to_string_lossy().into_owned(),
        environment: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        task_ids: vec![0],
        uid,
        gid,
        ntasks_total: 1,
        launch_token: grant(
            &world.h.key,
            SLEEPER_JOB,
            0,
            (uid, gid),
            &world.h.register.node_name,
        ),
        ..Default::default()
    };
    let sleeper_out = rt.block_on(async {
        let mut s = tester.launch_tasks(sleeper).await.unwrap().into_inner();
        let first = tokio::time::timeout(WAIT, s.message())
            .await
            .expect("the sleeper starts")
            .unwrap()
            .expect("the sleeper prints");
        assert!(
            matches!(first.event, Some(task_output::Event::Stdout(_))),
            "{first:?}"
        );
        s
    });
    let sleeper_out = RefCell::new(sleeper_out);

    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };

    // Undecodable bodies: refused by the decoder (INTERNAL), whoever calls.
    proptest!(config.clone(), |(body in undecodable(), m in 0..METHODS.len(), c in callers())| {
        let method = METHODS[m];
        let s = answered(method, call(world.channel(c), method, body))
            .expect_err("an undecodable body was accepted");
        prop_assert_eq!(s.code(), tonic::Code::Internal, "{}: {:?}", method, s);
        prop_assert!(s.message().contains("decode"), "{}: {:?}", method, s);
    });

    // Arbitrary bytes and protobuf-shaped field soup, often decodable (prost takes unknown
    // fields and partial messages): answered; a launch that decodes carries no valid
    // credential, so it is refused.
    let bodies = (0..METHODS.len()).prop_flat_map(|m| {
        let fields = if METHODS[m] == LAUNCH {
            LAUNCH_FIELDS
        } else {
            SIGNAL_FIELDS
        };
        (
            Just(m),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..256),
                field_soup(fields),
            ],
        )
    });
    proptest!(config.clone(), |((m, body) in bodies, c in callers())| {
        let method = METHODS[m];
        match answered(method, call(world.channel(c), method, body)) {
            Ok(reply) => {
                prop_assert_eq!(method, SIGNAL, "a launch without a credential was accepted");
                prop_assert!(reply.is_empty(), "SignalTasksResponse is empty: {:?}", reply);
            }
            Err(s) if method == LAUNCH => prop_assert!(
                s.code() == tonic::Code::Internal || clear_launch_refusal(&s),
                "{}: {:?}", method, s
            ),
            Err(s) => prop_assert!(
                matches!(s.code(), tonic::Code::Internal | tonic::Code::InvalidArgument | tonic::Code::PermissionDenied),
                "{}: {:?}", method, s
            ),
        }
    });

    // Well-formed launches of arbitrary content, under valid and invalid credentials, sent
    // whole, cut short, or with one byte changed.
    proptest!(config.clone(), |(shape in launch_shapes(), c in callers(), cut in any::<prop::sample::Index>(), flip in any::<Option<(prop::sample::Index, u8)>>(), whole in prop::bool::weighted(0.7))| {
        let (req, well_formed) = world.request(&shape, c);
        let mut body = prost::Message::encode_to_vec(&req);
        let intact = whole || body.is_empty();
        if !intact {
            match flip {
                Some((at, x)) => {
                    let i = at.index(body.len());
                    body[i] ^= x.max(1);
                }
                None => body.truncate(cut.index(body.len())),
            }
        }
        match answered(LAUNCH, call(world.channel(c), LAUNCH, body)) {
            Ok(first) => {
                // (A changed byte may turn the job id into the one the credential names.)
                prop_assert!(
                    matches!(shape.token, Token::Valid) || (!intact && matches!(shape.token, Token::OtherJob)),
                    "launched without a valid credential: {:?}", shape
                );
                prop_assert!(!intact || well_formed, "accepted a malformed launch: {:?}", shape);
                let out: TaskOutput = prost::Message::decode(first.as_slice())
                    .map_err(|e| TestCaseError::fail(format!("undecodable task output: {e}")))?;
                prop_assert!(out.event.is_some(), "{:?}", out);
            }
            Err(s) => {
                prop_assert!(
                    clear_launch_refusal(&s) || (!intact && s.code() == tonic::Code::Internal),
                    "{:?}: {:?}", shape, s
                );
                prop_assert!(!(intact && well_formed), "refused a valid launch: {:?}: {:?}", shape, s);
                if !matches!(shape.token, Token::Valid) && intact {
                    prop_assert_eq!(s.code(), tonic::Code::PermissionDenied, "{:?}: {:?}", shape, s);
                }
            }
        }
    });

    // Signals: to steps that do not run here (answered, no-op), and to the sleeper: another
    // user is refused whatever the signal, an unknown signal is refused for anyone.
    let signals = prop_oneof![
        Just(None),
        (i32::MIN..0).prop_map(Some),
        (32..i32::MAX).prop_map(Some),
    ];
    proptest!(config, |(job_id in any::<u64>(), step_id in any::<u32>(), to_sleeper in any::<bool>(), signal in signals, c in callers(), token in "\\PC{0,64}")| {
        let (job_id, step_id) = if to_sleeper { (SLEEPER_JOB, 0) } else if job_id == SLEEPER_JOB { (0, step_id) } else { (job_id, step_id) };
        // No number drawn: SIGKILL, which at the sleeper only another user sends (and is
        // refused for).
        let c = if to_sleeper && signal.is_none() { Caller::Mallory } else { c };
        let signal = signal.unwrap_or(sigkill());
        let req = SignalTasksRequest { job_id, step_id, signal, launch_token: token };
        let reply = answered(SIGNAL, call(world.channel(c), SIGNAL, prost::Message::encode_to_vec(&req)));
        if !to_sleeper {
            prop_assert!(reply.is_ok(), "a signal to a step not here: {:?}", reply);
        } else if c == Caller::Mallory {
            let s = reply.expect_err("another user signalled the sleeper");
            prop_assert_eq!(s.code(), tonic::Code::PermissionDenied, "{:?}", s);
        } else {
            let s = reply.expect_err("an unknown signal was accepted");
            prop_assert_eq!(s.code(), tonic::Code::InvalidArgument, "{:?}", s);
            prop_assert!(s.message().contains("signal"), "{:?}", s);
        }
        sleeper_alive(&rt, &mut sleeper_out.borrow_mut()).map_err(TestCaseError::fail)?;
    });

    // Still serving: a valid launch runs to its end, and the sleeper ends on a valid signal.
    let mut sleeper_out = sleeper_out.into_inner();
    let (ok, well_formed) = world.request(
        &LaunchShape {
            job_id: 0,
            step_id: 1,
            argv: vec!["/bin/echo".into(), "still".into(), "here".into()],
            workdir: None,
            environment: HashMap::new(),
            task_ids: vec![0, 1],
            gpus: vec![],
            node_index: 0,
            ids: None,
            ntasks_total: 2,
            umask: Some(0o077),
            token: Token::Valid,
        },
        Caller::Tester,
    );
    assert!(well_formed);
    rt.block_on(async {
        let mut s = tester.launch_tasks(ok).await.unwrap().into_inner();
        let mut out = BTreeMap::<u32, (String, Option<i32>)>::new();
        while let Some(m) = tokio::time::timeout(WAIT, s.message())
            .await
            .expect("step output stalled")
            .unwrap()
        {
            let t = out.entry(m.task_id).or_default();
            match m.event.unwrap() {
                task_output::Event::Stdout(b) => t.0.push_str(&String::from_utf8_lossy(&b)),
                task_output::Event::Stderr(_) => {}
                task_output::Event::Exit(x) => t.1 = Some(x.exit_code),
            }
        }
        for task in [0, 1] {
            assert_eq!(
                out.get(&task),
                Some(&("still here\n".to_owned(), Some(0))),
                "{out:?}"
            );
        }
        tester
            .signal_tasks(SignalTasksRequest {
                job_id: SLEEPER_JOB,
                step_id: 0,
                signal: sigkill(),
                launch_token: String::new(),
            })
            .await
            .unwrap();
        let mut exit = None;
        while let Some(m) = tokio::time::timeout(WAIT, sleeper_out.message())
            .await
            .expect("the sleeper ends")
            .unwrap()
        {
            if let Some(task_output::Event::Exit(x)) = m.event {
                exit = Some(x.signal);
            }
        }
        assert_eq!(exit, Some(sigkill()), "the sleeper was killed by SIGKILL");
    });
    let World { h, .. } = world;
    rt.block_on(h.stop());
}

/// SIGKILL's number, as `SignalTasksRequest` carries it.
fn sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}
