//! Property tests of every network decoder the controller exposes: arbitrary bytes as the
//! request body of each gRPC method (Jobs, Nodes, Accounting, WorkerLink, the KEDA scaler),
//! sent over the real TLS listener with a valid credential. Whatever arrives, the
//! controller answers (no panic, no hang), refuses what it cannot use with a status that
//! says so, and a refused request changes nothing.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use support::{Controller, WAIT, alice};
use tandem_proto::auth::Identity;
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

/// Checks one reply: it came within the deadline, and a refusal says why.
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
                !s.message().is_empty(),
                "{method}: a refusal without a reason"
            );
            false
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
    let user = rt.block_on(ctl.channel(&alice()));
    let worker = rt.block_on(ctl.channel(&Identity::worker("n1", 0, 0)));
    let scaler = rt.block_on(async {
        let ep = tonic::transport::Endpoint::from_shared(format!("https://{scaler_addr}")).unwrap();
        tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(c) = tandem_proto::net::connect(&ep, &ctl.security).await {
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
        let ch = if method.contains("WorkerLink") { worker.clone() } else { user.clone() };
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
        let ch = if method.contains("WorkerLink") { worker.clone() } else { user.clone() };
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
