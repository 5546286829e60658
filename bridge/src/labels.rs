//! Every name the bridge shares with tools outside the repository. These are a contract:
//! kubectl users, admission policies and autoscalers key on them.

/// `spec.schedulerName` of the pods the bridge schedules.
pub const SCHEDULER_NAME: &str = "tandem";

/// Pod annotations a user may set.
pub const PARTITION: &str = "tandem.dev/partition";
pub const QOS: &str = "tandem.dev/qos";
pub const ACCOUNT: &str = "tandem.dev/account";
pub const TIME_LIMIT: &str = "tandem.dev/time-limit";
/// Written by the bridge on every pod it binds: the placeholder job's id.
pub const JOB_ID: &str = "tandem.dev/job-id";

/// Finalizer the bridge puts on every pod before binding it, and removes once the kubelet
/// reported the pod's containers stopped (or its node has been gone for the grace period).
/// A force delete (`--grace-period=0 --force`) then leaves the object in place, marked for
/// deletion, while the kubelet stops the containers: the pod's slot is judged from what
/// the node reports, never from the object vanishing.
pub const SLOT_FINALIZER: &str = "tandem.dev/slot-protection";

/// The annotations a user may set, in the order error messages list them.
pub const USER_ANNOTATIONS: [&str; 4] = [PARTITION, QOS, ACCOUNT, TIME_LIMIT];
/// The prefix of every Tandem annotation; an unknown key under it is a typo, refused.
pub const PREFIX: &str = "tandem.dev/";

/// Pod label that opts a pod in (`"true"`, in any namespace) or out (`"false"`, in a mapped
/// namespace) of scheduling by Tandem.
pub const MANAGED_LABEL: &str = "tandem.dev/managed";

/// Node label kept in step with the controller: `batch` or `kube`.
pub const MODE_LABEL: &str = "tandem.dev/mode";
/// Node taint key of pool nodes: `tandem.dev/pool=<cluster>:NoSchedule` always, and
/// `tandem.dev/pool=<cluster>:NoExecute` too while the node is in `batch` mode.
pub const POOL_TAINT: &str = "tandem.dev/pool";

/// scheduler-plugins coscheduling: the pod's PodGroup (same namespace).
pub const POD_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// JobSet: every pod of a JobSet carries its name.
pub const JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
/// LeaderWorkerSet: a hash naming one leader-and-workers group.
pub const LWS_GROUP_KEY: &str = "leaderworkerset.sigs.k8s.io/group-key";
/// LeaderWorkerSet: the set's name, for display.
pub const LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";
/// LeaderWorkerSet pod annotation: pods per group (leader included).
pub const LWS_SIZE: &str = "leaderworkerset.sigs.k8s.io/size";
/// Indexed Job pods: their completion index (annotation, and label since 1.28).
pub const JOB_COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Job pods: the Job's name (the legacy `job-name` label is read too).
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
pub const LEGACY_JOB_NAME: &str = "job-name";
