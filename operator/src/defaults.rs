//! Named defaults, in one place so docs, CRDs and renderers agree.

/// The image every pod runs unless the spec names another; it carries `tandem`,
/// `tandem-operator`, `tandem-bridge` and the CLI names.
pub fn default_image() -> String {
    format!("ghcr.io/tandem-dev/tandem:{}", env!("CARGO_PKG_VERSION"))
}

pub const DEFAULT_STORAGE_SIZE: &str = "10Gi";
/// An hour: long enough for most jobs of a drained worker to end on their own.
pub const DEFAULT_DRAIN_DEADLINE_S: u32 = 3600;
/// The controller's gRPC port (Slurm's slurmctld port).
pub const CONTROLLER_PORT: u16 = 6817;
/// The controller's KEDA external scaler port (gRPC over TLS, read-only).
pub const SCALER_PORT: u16 = 9090;
/// The controller's Prometheus `/metrics` port (plain HTTP: aggregate numbers only).
pub const METRICS_PORT: u16 = 9100;
/// The worker's step-launch port (Slurm's slurmd port).
pub const WORKER_STEP_PORT: u16 = 6818;
/// Where the controller keeps its store (the PVC's mount).
pub const STATE_DIR: &str = "/var/lib/tandem";
/// The cluster key Secret's mount and file.
pub const KEY_DIR: &str = "/etc/tandem/key";
pub const KEY_FILE: &str = "cluster.key";
/// The controller's certificate Secret's mount (`tls.crt`, `tls.key`, `ca.crt`).
pub const TLS_DIR: &str = "/etc/tandem/tls";
/// The cluster CA Secret's mount: `ca.crt` only (no pod mounts `ca.key`).
pub const CA_DIR: &str = "/etc/tandem/ca";
pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
/// The login pods' identity agent socket, in an emptyDir both containers mount.
pub const AUTH_DIR: &str = "/run/tandem";
pub const AUTH_SOCKET_FILE: &str = "authd.sock";
/// The ConfigMap's mount: `controller.toml` and the clients' `cluster.json`.
pub const CONFIG_DIR: &str = "/etc/tandem/config";
pub const CONTROLLER_CONFIG_KEY: &str = "controller.toml";
pub const CLIENT_CONFIG_KEY: &str = "cluster.json";
pub const BRIDGE_CONFIG_KEY: &str = "bridge.json";
/// A worker pod's step-service certificate Secret's mount (`tls.crt`, `tls.key`, `ca.crt`).
pub const STEP_TLS_DIR: &str = "/etc/tandem/step-tls";
/// Workers' spool directory (an emptyDir).
pub const WORKER_SPOOL: &str = "/var/spool/tandem";
/// How long a finished job keeps its partition from being removed (recent jobs: sacct,
/// requeue). The controller keeps finished jobs in memory about this long too.
pub const PARTITION_RETAIN_AFTER_END_S: i64 = 600;
