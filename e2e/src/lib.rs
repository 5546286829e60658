//! Test harness for Tandem's Kubernetes parts, not a product.
//!
//! # Layout
//! - [`bounded`]: bounds on the harness's waits for processes and requests.
//! - [`apiserver`]: an in-memory Kubernetes API server speaking the REST API over HTTP/JSON
//!   (also the `kube-sim` binary).
//! - [`bridgekit`]: the bridge's e2e setup: controller, workers, `TandemCluster`, bridges.
//! - [`invariant`]: the time partition judged from `/proc`: no node runs a batch job and a
//!   pod that is not a Tandem worker at once (every [`testkit::TestCluster`] runs it).
//! - [`kubelet`]: a process kubelet that runs the containers of pods bound to declared nodes as
//!   local processes and drives their status.
//! - [`net`]: the loopback address plan (pod IPs, Service cluster IPs).
//! - [`proxy`]: the service proxy (kube-proxy's part): cluster IPs forward to ready pods.
//! - [`scheduler`]: a stand-in for the default scheduler (binds pods that name no scheduler).
//! - [`story`]: the whole story (install, batch and inference sharing one pool), shared by
//!   the `tandem-demo` binary and `tests/story.rs`.
//! - [`testkit`]: what e2e tests use: start the server, declare nodes, get a client, wait for
//!   conditions; or a real cluster when `KUBECONFIG` is set.
//! - [`watchdog`]: a deadline for a whole test, with a report of what hung.

pub mod apiserver;
pub mod bounded;
pub mod bridgekit;
pub mod invariant;
pub mod kubelet;
pub mod net;
pub mod proxy;
pub mod scheduler;
pub mod story;
pub mod testkit;
pub mod watchdog;
