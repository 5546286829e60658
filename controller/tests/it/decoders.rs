//! Property tests of every network decoder the controller exposes: arbitrary bytes as the
//! request body of each gRPC method (Jobs, Nodes, Accounting, WorkerLink, Bridge, the KEDA
//! scaler), sent over the real TLS listener with a valid credential. Whatever arrives, the
//! controller answers (no panic, no hang), refuses what it cannot use with a status that
//! says so, and a refused request changes nothing.
//!
//! The credential interceptor runs before a body is decoded, the role check (`authz`) after
//! it. Each method is therefore called with a role that may call it (a worker for
//! WorkerLink, the bridge for Bridge, a user otherwise), so a body that decodes goes on to
//! the handler's own checks instead of stopping at PERMISSION_DENIED.

use crate::support;

use std::time::Duration;

use proptest::prelude::*;
use support::{Controller, WAIT, alice};
use tandem_net::auth::{Identity, Role};
use tandem_proto::raw;
use tandem_proto::v1;
use tandem_proto::v1::jobs_client::JobsClient;
use tandem_proto::v1::nodes_client::NodesClient;

const METHODS: &[&str] = &[
    "/tandem.v1.Jobs/Submit",
    "/tandem.v1.Jobs/Cancel",
    "/tandem.v1.Jobs/ListJobs",
    "/tandem.v1.Jobs/UpdateJob",
    "/tandem.v1.Jobs/WatchJob",
    "/tandem.v1.Jobs/CreateStep",
    "/tandem.v1.Jobs/CompleteStep",
    "/tandem.v1.Nodes/ListNodes",
    "/tandem.v1.Nodes/ListPartitions",
    "/tandem.v1.Nodes/UpdateNode",
    "/tandem.v1.Nodes/RemoveNode",
    "/tandem.v1.Nodes/ClusterInfo",
    "/tandem.v1.Accounting/ListJobRecords",
    "/tandem.v1.Accounting/AddAccount",
    "/tandem.v1.Accounting/ModifyAccount",
    "/tandem.v1.Accounting/DeleteAccount",
    "/tandem.v1.Accounting/AddUser",
    "/tandem.v1.Accounting/ModifyUser",
    "/tandem.v1.Accounting/DeleteUser",
    "/tandem.v1.Accounting/AddQos",
    "/tandem.v1.Accounting/ModifyQos",
    "/tandem.v1.Accounting/DeleteQos",
    "/tandem.v1.Accounting/ListAssociations",
    "/tandem.v1.Accounting/ListQos",
    "/tandem.v1.Accounting/ListShares",
    "/tandem.v1.Accounting/ListPriorities",
    "/tandem.v1.WorkerLink/Attach",
    "/tandem.v1.Bridge/SubmitPlaceholder",
    "/tandem.v1.Bridge/EndPlaceholder",
    "/tandem.v1.Bridge/WatchPlaceholders",
];

const SCALER_METHODS: &[&str] = &[
    "/externalscaler.ExternalScaler/IsActive",
    "/externalscaler.ExternalScaler/GetMetricSpec",
    "/externalscaler.ExternalScaler/GetMetrics",
];

/// What a test can observe of the controller's state.
async fn snapshot(ctl: &Controller) -> (Vec<String>, Vec<String>, Vec<String>) {
    let who = Identity::user("root", 0, 0);
    let jobs = JobsClient::new(ctl.channel(&who).await)
        .list_jobs(v1::ListJobsRequest {
            include_finished: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .into_iter()
        .map(|j| format!("{}:{}:{}", j.job_id, j.state, j.name))
        .collect();
    let mut nodes = NodesClient::new(ctl.channel(&who).await);
    let n = nodes
        .list_nodes(v1::ListNodesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nodes
        .into_iter()
        .map(|n| format!("{}/{}", n.name, n.state))
        .collect();
    let acct = ctl
        .acct(&who)
        .await
        .list_associations(v1::ListAssociationsRequest::default())
        .await
        .unwrap()
        .into_inner();
    (jobs, n, vec![format!("{acct:?}")])
}

/// Garbage that is certainly not a valid message: a field tag of wire type 7 (undefined).
fn undecodable() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..256).prop_map(|mut v| {
        v.insert(0, 0x0f);
        v
    })
}

/// Checks one reply: it came within the deadline, and a refusal says why. A caller whose
/// role may call the method is never refused for its role: the body reached the decoder
/// and, when it decoded, the handler.
fn check(
    method: &str,
    reply: Result<Result<Vec<u8>, tonic::Status>, tokio::time::error::Elapsed>,
) -> bool {
    let reply = reply.unwrap_or_else(|_| panic!("{method} hung"));
    match reply {
        Ok(_) => true,
        Err(s) => {
            assert_ne!(s.code(), tonic::Code::Unknown, "{method}: {s:?}");
            assert!(
                !matches!(
                    s.code(),
                    tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
                ) || !method.contains("Bridge"),
                "{method}: refused the bridge before decoding: {s:?}"
            );
            assert!(
                !s.message().is_empty(),
                "{method}: a refusal without a reason"
            );
            false
        }
    }
}

/// The bridge's identity, as `tandem-bridge` presents it.
fn bridge() -> Identity {
    Identity::service(Role::Bridge, "tandem-bridge", 0, 0)
}

/// The credential each method is called with: one whose role may call it.
#[derive(Clone)]
struct Callers {
    user: tandem_net::endpoint::AuthChannel,
    worker: tandem_net::endpoint::AuthChannel,
    bridge: tandem_net::endpoint::AuthChannel,
}

impl Callers {
    fn for_method(&self, method: &str) -> tandem_net::endpoint::AuthChannel {
        if method.contains("WorkerLink") {
            self.worker.clone()
        } else if method.contains("/tandem.v1.Bridge/") {
            self.bridge.clone()
        } else {
            self.user.clone()
        }
    }
}

#[test]
fn arbitrary_bytes_to_every_method_are_answered_and_refusals_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let scaler_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let ctl = rt.block_on(Controller::start(dir.path(), |c| {
        c.scaler_listen = Some(scaler_addr);
    }));
    let callers = Callers {
        user: rt.block_on(ctl.channel(&alice())),
        worker: rt.block_on(ctl.channel(&Identity::worker("n1", 0, 0))),
        bridge: rt.block_on(ctl.channel(&bridge())),
    };
    let scaler = rt.block_on(async {
        let ep = tonic::transport::Endpoint::from_shared(format!("https://{scaler_addr}")).unwrap();
        tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(c) = tandem_net::net::connect(&ep, &ctl.security).await {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap()
    });
    let before = rt.block_on(snapshot(&ctl));

    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // Undecodable bodies: every method refuses them, and nothing changes.
    proptest!(config.clone(), |(body in undecodable(), m in 0..METHODS.len())| {
        let method = METHODS[m];
        let ch = callers.for_method(method);
        let reply = rt.block_on(async { tokio::time::timeout(WAIT, raw::call(ch, method, body)).await });
        prop_assert!(!check(method, reply), "{} accepted an undecodable body", method);
    });
    for &method in SCALER_METHODS {
        let reply = rt.block_on(async {
            tokio::time::timeout(WAIT, raw::call(scaler.clone(), method, vec![0x0f, 1, 2])).await
        });
        assert!(
            !check(method, reply),
            "{method} accepted an undecodable body"
        );
    }
    assert_eq!(
        rt.block_on(snapshot(&ctl)),
        before,
        "a refused request changed state"
    );

    // Arbitrary bytes, often decodable (prost accepts unknown fields and partial messages):
    // every one is answered, and a refusal leaves the state as it was.
    proptest!(config, |(body in proptest::collection::vec(any::<u8>(), 0..256), m in 0..METHODS.len())| {
        let method = METHODS[m];
        let ch = callers.for_method(method);
        let prior = rt.block_on(snapshot(&ctl));
        let reply = rt.block_on(async { tokio::time::timeout(WAIT, raw::call(ch, method, body)).await });
        if !check(method, reply) && !method.contains("WorkerLink") {
            prop_assert_eq!(rt.block_on(snapshot(&ctl)), prior, "{} refused but changed state", method);
        }
    });
    // Still serving.
    rt.block_on(snapshot(&ctl));
    rt.block_on(ctl.stop());
}

/// A `SubmitPlaceholderRequest` with arbitrary fields, encoded: what a confused or hostile
/// bridge could send that decodes.
fn placeholder_request() -> impl Strategy<Value = Vec<u8>> {
    let text = || proptest::option::of("[a-z0-9/-]{0,12}|\\PC{0,140}");
    (
        (text(), text(), text(), text(), text(), text(), text()),
        (
            any::<u64>(),
            0u32..4,
            0u32..4,
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (group_uid, name, namespace, account, partition, qos, gpu_type),
                (time_limit_s, nodes, pods_per_node, cpus_per_pod, mem_mb_per_pod, gpus_per_pod),
            )| {
                prost::Message::encode_to_vec(&v1::SubmitPlaceholderRequest {
                    group_uid: group_uid.unwrap_or_default(),
                    // The hostile name doubles as an excluded node (empty, huge, commas).
                    exclude: name.iter().cloned().collect(),
                    name: name.unwrap_or_default(),
                    namespace: namespace.unwrap_or_default(),
                    account: account.unwrap_or_default(),
                    partition: partition.unwrap_or_default(),
                    qos: qos.unwrap_or_default(),
                    time_limit_s,
                    nodes,
                    pods_per_node,
                    cpus_per_pod,
                    mem_mb_per_pod,
                    gpus_per_pod,
                    gpu_type: gpu_type.unwrap_or_default(),
                })
            },
        )
}

/// The Bridge service on its own, so each of its decoders gets many cases: undecodable bodies
/// fail in the decoder (INTERNAL, before any role check), decodable ones reach the handler
/// with the bridge's credential (never PERMISSION_DENIED), and a user's credential is refused
/// for its role only after its body decoded.
#[test]
fn the_bridge_service_decodes_before_it_authorizes_and_refusals_change_nothing() {
    const BRIDGE: [&str; 3] = [
        "/tandem.v1.Bridge/SubmitPlaceholder",
        "/tandem.v1.Bridge/EndPlaceholder",
        "/tandem.v1.Bridge/WatchPlaceholders",
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ctl = rt.block_on(Controller::start(dir.path(), |_| {}));
    let bridge_ch = rt.block_on(ctl.channel(&bridge()));
    let user_ch = rt.block_on(ctl.channel(&alice()));
    let call = |ch: &tandem_net::endpoint::AuthChannel, method: &'static str, body: Vec<u8>| {
        let ch = ch.clone();
        rt.block_on(async { tokio::time::timeout(WAIT, raw::call(ch, method, body)).await })
            .unwrap_or_else(|_| panic!("{method} hung"))
    };

    // The empty body is a valid message of every Bridge request (all fields default): the
    // handler answers it with its own checks.
    let s = call(&bridge_ch, BRIDGE[0], vec![]).unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("group_uid"), "{s:?}");
    let s = call(&bridge_ch, BRIDGE[1], vec![]).unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains("job id"), "{s:?}");
    let first = call(&bridge_ch, BRIDGE[2], vec![]).expect("the watch answers the bridge");
    let event: v1::PlaceholderEvent = prost::Message::decode(first.as_slice()).unwrap();
    assert!(event.snapshot_done, "an empty snapshot: {event:?}");
    // A user's decodable request gets past the decoder and is refused for its role.
    for method in BRIDGE {
        let s = call(&user_ch, method, vec![]).unwrap_err();
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{method}: {s:?}");
    }
    let before = rt.block_on(snapshot(&ctl));

    let config = ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    // Undecodable: refused by the decoder, whoever calls.
    proptest!(config.clone(), |(body in undecodable(), m in 0..BRIDGE.len(), as_user in any::<bool>())| {
        let method = BRIDGE[m];
        let ch = if as_user { &user_ch } else { &bridge_ch };
        let s = call(ch, method, body).expect_err("an undecodable body was accepted");
        prop_assert_eq!(s.code(), tonic::Code::Internal, "{}: {:?}", method, s);
        prop_assert!(s.message().contains("decode"), "{}: {:?}", method, s);
    });
    assert_eq!(
        rt.block_on(snapshot(&ctl)),
        before,
        "a refused request changed state"
    );

    // Arbitrary bytes and arbitrary placeholder requests from the bridge: answered, never
    // refused for the role, and a refusal changes nothing.
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256).prop_map(|b| (b, None)),
        placeholder_request().prop_map(|b| (b, Some(0))),
    ];
    proptest!(config, |((body, fixed) in body, m in 0..BRIDGE.len())| {
        let method = BRIDGE[fixed.unwrap_or(m)];
        let prior = rt.block_on(snapshot(&ctl));
        let reply = rt.block_on(async {
            tokio::time::timeout(WAIT, raw::call(bridge_ch.clone(), method, body)).await
        });
        if !check(method, reply) {
            prop_assert_eq!(rt.block_on(snapshot(&ctl)), prior, "{} refused but changed state", method);
        }
    });
    // Still serving the bridge.
    let first = call(&bridge_ch, BRIDGE[2], vec![]).expect("the watch still answers");
    let _: v1::PlaceholderEvent = prost::Message::decode(first.as_slice()).unwrap();
    rt.block_on(ctl.stop());
}
