//! What Tandem's two Kubernetes components, the operator and the bridge, share on the
//! Kubernetes side, and nothing else: the API clients they build ([`client`], with
//! `TCP_NODELAY`) and the names one writes and the other reads ([`labels`]: the operator
//! labels its pods, the bridge's admission guard and GPU holders read and reuse them).
//!
//! Its own crate so that the bridge depends on neither the operator nor its CRDs: the two
//! share this contract, not code paths. It has no Tandem dependency at all.

pub mod client;
pub mod labels;
