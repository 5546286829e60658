//! The gRPC services. Each is a thin shell: authenticate (the interceptor already verified
//! the token; handlers read the [`Identity`](tandem_net::auth::Identity)), convert and
//! validate ([`convert`]), ask the state actor, convert back. Authorization rules are pure
//! ([`authz`]). The exception is [`scaler`], KEDA's external scaler on its own listener:
//! read-only demand, no credential.

pub mod accounting;
pub mod authz;
pub mod bridge;
pub mod budget;
pub mod convert;
pub mod jobs;
pub mod nodes;
pub mod reads;
pub mod scaler;
pub mod workers;
