//! The reconcilers: thin async shells around the pure parts. Each gathers what it needs
//! (reflector stores, the controller through [`crate::batch::BatchControl`]), asks a pure
//! function what to do, applies it in named steps, records Events, and patches status only
//! when it changed.
//!
//! Each reconciler is a list of named [`Step`]s over its pass's state (like Slinky's sync
//! steps): [`run_steps`] runs them in order and stops at the first that fails, recording a
//! Warning Event on the object that names it (`step <name> failed: <error>`), and the
//! error policy retries the pass. A step may also end the pass early ([`Flow::Done`]).
//!
//! This module holds what the three reconcilers share: the [`Context`], the step runner,
//! the [`Error`] and its retry policy, and the condition and status-patch helpers. Each resource's reconciler
//! is in its own module ([`cluster`], [`workerset`], [`loginset`]); the daemon that runs
//! them is [`crate::daemon`].

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::Recorder;
use kube::runtime::finalizer;
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use serde_json::json;
use tracing::warn;

use crate::connections::{Batch, Connections, GrpcConnect};
use crate::crd::TandemCluster;
use crate::events::{publish, warning};
use crate::render;

pub mod cluster;
pub mod loginset;
pub mod workerset;

#[cfg(test)]
pub(crate) mod requests;

pub(crate) use cluster::reconcile_cluster;
pub(crate) use loginset::reconcile_loginset;
pub(crate) use workerset::reconcile_workerset;
pub use workerset::{eligible_nodes, eligible_worker_nodes};

/// The daemon's entry points, where they have always been.
pub use crate::daemon::{Args, run, run_with_client};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call {step} failed")]
    Kube {
        step: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("rendering {0}")]
    Render(#[from] render::RenderError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<finalizer::Error<Error>>),
    #[error("the cluster key Secret {0} is malformed")]
    BadKey(String),
    #[error("the cluster CA Secret {0} is malformed")]
    BadCa(String),
    #[error("making the cluster CA or a certificate")]
    Tls(#[from] tandem_net::tls::TlsError),
    #[error("generating the cluster key: {0}")]
    Random(String),
    /// Deleting a worker set waits for drains and removals; the finalizer stays until done
    /// (the helper keeps it on any error, and the error policy retries in 5 s).
    #[error("cleanup pending: {0}")]
    CleanupPending(String),
}

pub(crate) fn kube(step: &'static str) -> impl Fn(kube::Error) -> Error {
    move |source| Error::Kube { step, source }
}

impl Error {
    /// Whether the error is a fault worth a Warning Event: a deletion still waiting for its
    /// cleanup is not (the pass is retried, quietly, until it is done).
    pub fn is_fault(&self) -> bool {
        !matches!(self, Error::CleanupPending(_))
    }
}

/// The Event reason of a failed step (and of a worker set's failed action).
pub const STEP_FAILED: &str = "StepFailed";

/// What a step tells the runner.
pub(crate) enum Flow {
    /// Go on with the next step.
    Next,
    /// The pass is over: look again as this says.
    Done(Requeue),
}

pub(crate) type StepResult = Result<Flow, Error>;

/// A named step of a reconciler, over its pass's state `P`.
pub(crate) struct Step<P> {
    pub name: &'static str,
    pub run: for<'a> fn(&'a mut P) -> BoxFuture<'a, StepResult>,
}

/// `step!(Pass, "name", async_fn)`: a [`Step`] running `async_fn(&mut Pass)`.
macro_rules! step {
    ($pass:ty, $name:literal, $f:path) => {{
        fn run(p: &mut $pass) -> futures::future::BoxFuture<'_, $crate::reconcile::StepResult> {
            Box::pin($f(p))
        }
        $crate::reconcile::Step::<$pass> { name: $name, run }
    }};
}
pub(crate) use step;

/// `e` and its sources, joined by ": ".
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Runs `steps` in order over `pass`, until one ends the pass or fails. A failure (a fault,
/// see [`Error::is_fault`]) is recorded as a Warning Event on `obj` naming the step, and
/// returned for the error policy. A list that runs out looks again after the refresh period.
pub(crate) async fn run_steps<P, K>(
    steps: &[Step<P>],
    pass: &mut P,
    ctx: &Context,
    obj: &K,
) -> Result<Requeue, Error>
where
    K: Resource<DynamicType = ()>,
{
    for s in steps {
        match (s.run)(pass).await {
            Ok(Flow::Next) => {}
            Ok(Flow::Done(requeue)) => return Ok(requeue),
            Err(e) => {
                if e.is_fault() {
                    let note = format!("step {} failed: {}", s.name, chain(&e));
                    publish(&ctx.recorder, obj, &warning(STEP_FAILED, note)).await;
                }
                return Err(e);
            }
        }
    }
    Ok(Requeue::requeue(ctx.refresh))
}

/// Shared by the reconcilers.
pub struct Context {
    pub(crate) client: Client,
    pub(crate) recorder: Recorder,
    /// Every pod the operator manages (label `app.kubernetes.io/managed-by`).
    pub(crate) pod_store: Store<Pod>,
    pub(crate) node_store: Store<Node>,
    /// One controller connection per cluster.
    pub(crate) batch: Connections,
    /// The longest a settled object waits for its next pass (`--status-refresh-seconds`).
    pub(crate) refresh: Duration,
}

impl Context {
    /// A context whose controller connections are gRPC ([`GrpcConnect`]).
    pub fn new(
        client: Client,
        recorder: Recorder,
        pod_store: Store<Pod>,
        node_store: Store<Node>,
        refresh: Duration,
    ) -> Self {
        Self::with_connections(
            client,
            recorder,
            pod_store,
            node_store,
            refresh,
            Connections::new(GrpcConnect),
        )
    }

    /// A context with its own way to reach controllers (tests: a fake).
    pub fn with_connections(
        client: Client,
        recorder: Recorder,
        pod_store: Store<Pod>,
        node_store: Store<Node>,
        refresh: Duration,
        batch: Connections,
    ) -> Self {
        Context {
            client,
            recorder,
            pod_store,
            node_store,
            batch,
            refresh,
        }
    }
}

/// The connection to `tc`'s controller ([`Connections::for_cluster`]).
async fn batch_for(ctx: &Context, ns: &str, tc: &TandemCluster) -> Result<Batch, String> {
    ctx.batch.for_cluster(&ctx.client, ns, tc).await
}

pub(crate) fn error_policy<K>(_obj: Arc<K>, err: &Error, _ctx: Arc<Context>) -> Requeue {
    warn!(error = %format!("{err:#}"), "reconcile error; retrying");
    Requeue::requeue(Duration::from_secs(5))
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    old: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" };
    // The transition time moves only when the status does.
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

fn old_ready(c: &[Condition]) -> bool {
    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn create_ok<T>(r: Result<T, kube::Error>, step: &'static str) -> Result<(), Error> {
    match r {
        Ok(_) => Ok(()),
        // Made by an earlier pass whose answer we have not seen yet.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube { step, source }),
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The merge patch from status `old` to `new`. What `new` leaves out (an emptied list, a
/// `None`; the status types skip those when serializing) is sent as `null`: a merge patch
/// that omits a key keeps its old value, so `status.members` would never empty and a set
/// scaled to zero would keep "forgetting" its last node on every pass.
fn status_patch<S: serde::Serialize>(old: &S, new: &S) -> serde_json::Value {
    fn remove_missing(old: &serde_json::Value, new: &mut serde_json::Value) {
        if let (serde_json::Value::Object(o), serde_json::Value::Object(n)) = (old, new) {
            for (k, ov) in o {
                match n.get_mut(k) {
                    None => {
                        n.insert(k.clone(), serde_json::Value::Null);
                    }
                    Some(nv) => remove_missing(ov, nv),
                }
            }
        }
    }
    let mut status = json!(new);
    remove_missing(&json!(old), &mut status);
    json!({ "status": status })
}

/// `old` already says Degraded with this message (its Event was published then).
fn degraded_by(old: &[Condition], msg: &str) -> bool {
    old.iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.message == msg)
}

fn degraded(old: &[Condition], gen_: Option<i64>, reason: &str, msg: String) -> Vec<Condition> {
    let mut d = condition("Degraded", true, reason, msg.clone(), gen_, old);
    d.status = "True".into();
    vec![
        condition("Ready", old_ready(old), reason, msg, gen_, old),
        d,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::WorkerSetStatus;

    #[test]
    fn a_status_patch_clears_what_the_new_status_leaves_out() {
        let old = WorkerSetStatus {
            members: vec!["kn-0".into()],
            selector: Some("s".into()),
            replicas: 1,
            ..Default::default()
        };
        let new = WorkerSetStatus {
            selector: Some("s".into()),
            ..Default::default()
        };
        let p = status_patch(&old, &new);
        assert_eq!(p["status"]["members"], serde_json::Value::Null);
        assert!(p["status"].as_object().unwrap().contains_key("members"));
        assert_eq!(p["status"]["replicas"], json!(0));
        assert_eq!(p["status"]["selector"], json!("s"));
        // Nested objects too (the cluster's managed entities).
        let mut a = json!({"managed": {"accounts": ["x"], "qos": ["q"]}});
        let b = json!({"managed": {"qos": ["q"]}});
        assert_eq!(
            status_patch(&a, &b)["status"]["managed"],
            json!({"accounts": null, "qos": ["q"]})
        );
        a["managed"]["accounts"] = json!(["y"]);
        assert_eq!(status_patch(&a, &a)["status"], a);
    }
}
