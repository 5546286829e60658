//! Authentication: the cluster key, signed short-lived credentials, the replay cache, the
//! local identity agent's protocol and the tonic interceptors that attach (client) and
//! verify (server) credentials.
//!
//! # Model
//!
//! Every daemon of one cluster (controller, workers, identity agents) shares a 32-byte key,
//! stored hex-encoded in a file only its owner may read (like munge's key).
//! [`ClusterKey::load`] refuses a key readable by group or others. Users never read the key:
//! they ask the local identity agent ([`agent`], `tandem authd`), which learns their uid from
//! the kernel and signs a credential for them. Whoever can read the key (the all-in-one owner,
//! the daemons) may sign directly.
//!
//! A request carries `authorization: Bearer <credential>` (format in [`credential`]: versioned,
//! HMAC-SHA256, issued-at, expiry, nonce). The server interceptor ([`ServerAuth`]) verifies the
//! MAC in constant time, the expiry, and the nonce against its [`ReplayCache`], maps
//! configured administrators to [`Role::Admin`], and puts the [`Identity`] into the request
//! extensions, where handlers read it with [`identity()`].
//!
//! # Files
//!
//! - this file: the vocabulary every part shares ([`AUTH_HEADER`], [`TokenError`]) and the
//!   re-exports, so callers name everything as `tandem_net::auth::X`;
//! - [`key`]: the cluster key, its file, signing and verifying;
//! - [`credential`]: the signed format and its strict parser;
//! - [`identity`](mod@identity): [`Identity`], [`Role`], [`Admins`];
//! - [`replay`]: the replay cache;
//! - [`server`] and [`client`]: the tonic interceptors;
//! - [`agent`]: the identity agent's protocol.

pub mod agent;
pub mod client;
pub mod credential;
pub mod identity;
pub mod key;
pub mod replay;
pub mod server;

pub use client::{AgentSource, ClientAuth, CredentialSource, KeySigner, error_chain};
pub use credential::{
    CLOCK_SKEW, Credential, DEFAULT_LIFETIME, MAX_LIFETIME, MAX_TOKEN_LEN, StepGrant,
};
pub use identity::{Admins, Identity, Role, identity};
pub use key::{ClusterKey, KEY_LEN, KeyError};
pub use replay::ReplayCache;
pub use server::ServerAuth;

/// The credentials' clock; it lives in [`crate::clock`], below the CA that dates by it too.
pub use crate::clock::unix_now;

/// Metadata key that carries the token.
pub const AUTH_HEADER: &str = "authorization";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing authorization header (no cluster credentials were sent)")]
    Missing,
    #[error("authorization header is not a Bearer token")]
    NotBearer,
    #[error("malformed credential: {0}")]
    Malformed(&'static str),
    #[error("credential version {0:?} is not supported (this cluster speaks v1)")]
    UnsupportedVersion(String),
    #[error("credential signature does not match this cluster's key")]
    BadSignature,
    #[error("credential expired at {exp} (now {now}); get a fresh one")]
    Expired { exp: i64, now: i64 },
    #[error("credential issued at {iat}, in the future (now {now}): check the clocks")]
    NotYetValid { iat: i64, now: i64 },
    #[error("credential was already used on another connection (replayed)")]
    Replayed,
    #[error("too many live credentials; try again shortly")]
    CacheFull,
    #[error("credential is of the wrong kind for this use")]
    WrongKind,
}

/// What the tests of the submodules share.
#[cfg(test)]
mod test_util {
    use super::{ClusterKey, Identity, KEY_LEN};

    pub(super) fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }

    pub(super) fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_LEN])
    }
}
