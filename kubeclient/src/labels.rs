//! Every label, annotation, finalizer, event reason and drain-reason prefix the operator
//! writes (Slinky's `wellknown/`), so none is spelled twice; the bridge reads them (its
//! admission guard knows Tandem's own pods by them, its GPU holders reuse the recommended
//! labels and the drain prefix).

pub const GROUP: &str = "tandem.dev";
/// `app.kubernetes.io/*` recommended labels.
pub const APP_NAME: &str = "app.kubernetes.io/name";
pub const APP_INSTANCE: &str = "app.kubernetes.io/instance";
pub const APP_COMPONENT: &str = "app.kubernetes.io/component";
pub const APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "tandem-operator";

/// The TandemCluster a child belongs to.
pub const CLUSTER: &str = "tandem.dev/cluster";
/// The WorkerSet of a worker pod.
pub const WORKER_SET: &str = "tandem.dev/workerset";
/// The LoginSet of a login pod.
pub const LOGIN_SET: &str = "tandem.dev/loginset";

pub const COMPONENT_CONTROLLER: &str = "controller";
pub const COMPONENT_WORKER: &str = "worker";
pub const COMPONENT_LOGIN: &str = "login";

/// Hash of what a pod was rendered from; a different hash = outdated pod.
pub const TEMPLATE_HASH: &str = "tandem.dev/template-hash";
/// On the controller's certificate Secret: the names it was issued for (comma-separated)
/// and the hash of the CA that issued it; a difference from what is wanted reissues it.
pub const CERT_NAMES: &str = "tandem.dev/cert-names";
pub const CERT_CA: &str = "tandem.dev/cert-ca";
/// The container `kubectl exec` and `kubectl logs` pick when none is named.
pub const DEFAULT_CONTAINER: &str = "kubectl.kubernetes.io/default-container";
/// Set on a worker pod chosen to leave: unix seconds when its drain began.
pub const DRAIN_SINCE: &str = "tandem.dev/drain-since";
/// Why the pod is draining: `scale-in`, `rollout` or `delete`.
pub const DRAIN_FOR: &str = "tandem.dev/drain-for";

/// Node taint key of Tandem pool nodes (the bridge writes it; a contract shared with
/// `tandem_bridge::labels::POOL_TAINT`): `tandem.dev/pool=<cluster>:NoSchedule` always, and
/// `:NoExecute` too while the node is in batch mode. Worker pods tolerate the key with every
/// effect (`tandem_operator::render::pool_toleration`).
pub const POOL_TAINT: &str = "tandem.dev/pool";

/// Removes the set's nodes from the controller before the set goes.
pub const FINALIZER: &str = "tandem.dev/cleanup";

/// Every drain the operator sets starts with this; it clears no other drain (an admin's
/// `scontrol update state=drain` stays).
pub const DRAIN_REASON_PREFIX: &str = "tandem-operator:";

/// The `reportingController` of the operator's Events.
pub const REPORTER: &str = "tandem.dev/operator";
