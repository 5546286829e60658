//! The credential format, version 1: what is signed, how it is encoded, and the strict parser.
//!
//! ```text
//! v1.<base64url(json claims)>.<base64url(HMAC-SHA256(key, "v1." + payload))>
//! ```
//!
//! The version is part of the signed text, so a credential cannot be relabelled to another
//! version. Two kinds of claims exist, told apart by the signed `kind` field, so one kind can
//! never be presented as the other:
//!
//! - `identity`: who the caller is (user, uid, gid, role, host), issued at, expiry, nonce.
//! - `step`: the controller's grant to launch step `job.step` of uid/gid on `nodes`.
//!
//! The parser never panics and refuses anything not exactly of this shape: oversized input,
//! wrong version, bad base64, a signature of the wrong length or value, claims that are not
//! JSON of the right kind, an expiry before issue or a lifetime above [`MAX_LIFETIME`].

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::{Identity, Role, TokenError};

/// The only version this code issues and accepts.
pub const VERSION: &str = "v1";
/// Longest token the parser looks at (a step grant names its nodes, so allow some room).
pub const MAX_TOKEN_LEN: usize = 64 * 1024;
/// Lifetime of the credentials clients and the agent issue (munge's default TTL is 300 s).
pub const DEFAULT_LIFETIME: i64 = 300;
/// Longest lifetime any credential may claim; longer ones are refused as malformed.
pub const MAX_LIFETIME: i64 = 3600;
/// How far in the future `iat` may be (clocks of two hosts differ a little).
pub const CLOCK_SKEW: i64 = 60;
/// Longest user or host name accepted inside a credential.
const MAX_NAME: usize = 256;
/// Most nodes one step grant may name.
const MAX_NODES: usize = 16_384;
/// HMAC-SHA256 output length.
const SIG_LEN: usize = 32;

/// The signed claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum Claims {
    Identity(IdentityClaims),
    Step(StepClaims),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentityClaims {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub role: Role,
    pub host: String,
    pub iat: i64,
    pub exp: i64,
    /// 128 random bits, hex: the replay cache's key.
    pub nonce: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepClaims {
    pub job: u64,
    pub step: u32,
    pub nodes: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub iat: i64,
    pub exp: i64,
    pub nonce: String,
}

/// A verified identity credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub identity: Identity,
    /// Host the credential was issued on (the agent's host name; may be empty).
    pub host: String,
    pub iat: i64,
    pub exp: i64,
    pub nonce: u128,
}

/// The controller's permission to launch one step's tasks (a Slurm job credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepGrant {
    pub job_id: u64,
    pub step_id: u32,
    /// The nodes the step runs on; a worker refuses a grant that does not name it.
    pub nodes: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub exp: i64,
}

/// A fresh 128-bit nonce.
pub(crate) fn new_nonce() -> u128 {
    let mut b = [0u8; 16];
    // getrandom fails only on a system without an entropy source; then a time-derived
    // nonce still avoids collisions between honest clients (it protects nothing secret).
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return t ^ (u128::from(std::process::id()) << 64);
    }
    u128::from_le_bytes(b)
}

pub(crate) fn nonce_hex(n: u128) -> String {
    format!("{n:032x}")
}

fn parse_nonce(s: &str) -> Result<u128, TokenError> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed("nonce is not 32 hex digits"));
    }
    u128::from_str_radix(s, 16).map_err(|_| TokenError::Malformed("nonce is not 32 hex digits"))
}

/// Encodes and signs `claims` with `mac` (a fresh HMAC keyed with the cluster key).
pub(crate) fn encode(claims: &Claims, mut mac: impl hmac::Mac) -> String {
    // Serializing plain strings and integers cannot fail.
    let json = serde_json::to_vec(claims).unwrap_or_default();
    let payload = URL_SAFE_NO_PAD.encode(json);
    let signed = format!("{VERSION}.{payload}");
    mac.update(signed.as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signed}.{sig}")
}

/// Checks shape, version and signature, then decodes the claims. Time is not checked here.
pub(crate) fn decode(token: &str, mut mac: impl hmac::Mac) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed("token too long"));
    }
    let (signed, sig) = token
        .rsplit_once('.')
        .ok_or(TokenError::Malformed("expected VERSION.PAYLOAD.SIGNATURE"))?;
    let (version, payload) = signed
        .split_once('.')
        .ok_or(TokenError::Malformed("expected VERSION.PAYLOAD.SIGNATURE"))?;
    if version != VERSION {
        return Err(TokenError::UnsupportedVersion(
            version.chars().take(16).collect(),
        ));
    }
    if payload.contains('.') {
        return Err(TokenError::Malformed("expected VERSION.PAYLOAD.SIGNATURE"));
    }
    let sig = URL_SAFE_NO_PAD
        .decode(sig)
        .map_err(|_| TokenError::Malformed("signature is not base64url"))?;
    if sig.len() != SIG_LEN {
        return Err(TokenError::Malformed("signature has the wrong length"));
    }
    mac.update(signed.as_bytes());
    mac.verify_slice(&sig)
        .map_err(|_| TokenError::BadSignature)?;
    let json = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| TokenError::Malformed("payload is not base64url"))?;
    let claims: Claims = serde_json::from_slice(&json)
        .map_err(|_| TokenError::Malformed("payload is not a claims object"))?;
    validate(&claims)?;
    Ok(claims)
}

fn validate(claims: &Claims) -> Result<(), TokenError> {
    let (iat, exp, nonce) = match claims {
        Claims::Identity(c) => {
            if c.user.is_empty() || c.user.len() > MAX_NAME || c.host.len() > MAX_NAME {
                return Err(TokenError::Malformed("user or host name too long or empty"));
            }
            (c.iat, c.exp, &c.nonce)
        }
        Claims::Step(c) => {
            if c.nodes.is_empty()
                || c.nodes.len() > MAX_NODES
                || c.nodes.iter().any(|n| n.is_empty() || n.len() > MAX_NAME)
            {
                return Err(TokenError::Malformed("step grant node list is invalid"));
            }
            (c.iat, c.exp, &c.nonce)
        }
    };
    parse_nonce(nonce)?;
    if exp <= iat {
        return Err(TokenError::Malformed("expiry is not after issue"));
    }
    if exp.saturating_sub(iat) > MAX_LIFETIME {
        return Err(TokenError::Malformed("lifetime exceeds the maximum"));
    }
    Ok(())
}

/// Refuses a credential outside its validity window at `now`.
pub(crate) fn check_time(iat: i64, exp: i64, now: i64) -> Result<(), TokenError> {
    if now >= exp {
        return Err(TokenError::Expired { exp, now });
    }
    if iat > now.saturating_add(CLOCK_SKEW) {
        return Err(TokenError::NotYetValid { iat, now });
    }
    Ok(())
}

pub(crate) fn credential_of(c: IdentityClaims) -> Result<Credential, TokenError> {
    let nonce = parse_nonce(&c.nonce)?;
    Ok(Credential {
        identity: Identity {
            user: c.user,
            uid: c.uid,
            gid: c.gid,
            role: c.role,
        },
        host: c.host,
        iat: c.iat,
        exp: c.exp,
        nonce,
    })
}

pub(crate) fn grant_of(c: StepClaims) -> StepGrant {
    StepGrant {
        job_id: c.job,
        step_id: c.step,
        nodes: c.nodes,
        uid: c.uid,
        gid: c.gid,
        exp: c.exp,
    }
}
