//! Authentication: the cluster key, signed identity tokens, and the tonic interceptors that
//! attach (client) and verify (server) them.
//!
//! # Model
//!
//! Every daemon and client of one cluster shares a 32-byte key, stored hex-encoded in a file
//! only its owner may read (like munge's key). Holding the key is the credential: a process that
//! can read it may sign any identity, so the file's mode is the security boundary and
//! [`ClusterKey::load`] refuses a key readable by group or others.
//!
//! A request carries `authorization: Bearer <token>` with
//! `token = base64url(json{user,uid,gid,role,iat}) "." base64url(HMAC-SHA256(key, payload))`.
//! The server interceptor ([`ServerAuth`]) verifies the MAC in constant time and puts the
//! [`Identity`] into the request extensions, where handlers read it with [`identity`].

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

type HmacSha256 = Hmac<Sha256>;

/// Length of the cluster key in bytes.
pub const KEY_LEN: usize = 32;

/// Metadata key that carries the token.
pub const AUTH_HEADER: &str = "authorization";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot generate a cluster key: {0}")]
    Random(String),
    #[error("cannot write cluster key {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read cluster key {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cluster key {path} is readable by group or others (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error("cluster key {path} is malformed: expected {expected} hex digits")]
    Malformed { path: PathBuf, expected: usize },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("missing authorization header (no cluster credentials were sent)")]
    Missing,
    #[error("authorization header is not a Bearer token")]
    NotBearer,
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("token signature does not match this cluster's key")]
    BadSignature,
}

/// The shared secret of one cluster.
#[derive(Clone)]
pub struct ClusterKey {
    bytes: [u8; KEY_LEN],
}

// Never print key material, not even in debug logs.
impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0u8; KEY_LEN];
        getrandom::fill(&mut bytes).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self { bytes })
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self { bytes }
    }

    /// Writes the key hex-encoded to a new file with mode 0600. Fails if the file exists, so
    /// an existing cluster's key is never overwritten by accident.
    pub fn write_new(&self, path: &Path) -> Result<(), KeyError> {
        let err = |source| KeyError::Write {
            path: path.to_owned(),
            source,
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        let mut text = hex_encode(&self.bytes);
        text.push('\n');
        f.write_all(text.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)
    }

    /// Loads the key at `path`, or generates and writes one if the file does not exist.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        match Self::load(path) {
            Err(KeyError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate()?;
                match key.write_new(path) {
                    Ok(()) => Ok(key),
                    // Another process created it between our read and write: use theirs.
                    Err(KeyError::Write { source, .. })
                        if source.kind() == std::io::ErrorKind::AlreadyExists =>
                    {
                        Self::load(path)
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
    }

    /// Loads a key file, refusing one that group or others may read.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let read_err = |source| KeyError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = fs::metadata(path).map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        let text = fs::read_to_string(path).map_err(read_err)?;
        let bytes = hex_decode(text.trim()).ok_or_else(|| KeyError::Malformed {
            path: path.to_owned(),
            expected: KEY_LEN * 2,
        })?;
        Ok(Self { bytes })
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length; ours is always 32 bytes.
        match HmacSha256::new_from_slice(&self.bytes) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC-SHA256 accepts any key length"),
        }
    }

    /// Signs an identity. `iat` (issued-at, unix seconds) is informative only: whoever holds
    /// the key can mint tokens, so expiry would add no security.
    pub fn sign(&self, identity: &Identity, iat: i64) -> String {
        let claims = Claims {
            user: identity.user.clone(),
            uid: identity.uid,
            gid: identity.gid,
            role: identity.role,
            iat,
        };
        // Serializing a struct of strings and integers cannot fail.
        let json = serde_json::to_vec(&claims).unwrap_or_default();
        let payload = URL_SAFE_NO_PAD.encode(json);
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{payload}.{sig}")
    }

    /// Verifies a token and returns the identity it carries.
    pub fn verify(&self, token: &str) -> Result<Identity, TokenError> {
        let (payload, sig) = token
            .split_once('.')
            .ok_or(TokenError::Malformed("expected PAYLOAD.SIGNATURE"))?;
        let sig = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| TokenError::Malformed("signature is not base64url"))?;
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed("payload is not base64url"))?;
        let claims: Claims = serde_json::from_slice(&json)
            .map_err(|_| TokenError::Malformed("payload is not a claims object"))?;
        Ok(Identity {
            user: claims.user,
            uid: claims.uid,
            gid: claims.gid,
            role: claims.role,
        })
    }

    /// Verifies the `authorization` metadata of a request.
    pub fn verify_metadata(&self, meta: &MetadataMap) -> Result<Identity, TokenError> {
        let value = meta.get(AUTH_HEADER).ok_or(TokenError::Missing)?;
        let value = value.to_str().map_err(|_| TokenError::NotBearer)?;
        let token = value.strip_prefix("Bearer ").ok_or(TokenError::NotBearer)?;
        self.verify(token.trim())
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn hex_decode(text: &str) -> Option<[u8; KEY_LEN]> {
    let text = text.as_bytes();
    if text.len() != KEY_LEN * 2 {
        return None;
    }
    let mut out = [0u8; KEY_LEN];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

// === Identity ===

/// What a caller may do. `uid 0` maps to `Admin` when identities are built from a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A researcher: submits and controls their own jobs.
    User,
    /// A node agent: may open the WorkerLink stream.
    Worker,
    /// An operator or root: may control every job and node.
    Admin,
}

/// The authenticated caller of a request, as signed into its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
    pub role: Role,
}

impl Identity {
    /// A user identity; uid 0 becomes an admin, as root is in Slurm.
    pub fn user(user: impl Into<String>, uid: u32, gid: u32) -> Self {
        let role = if uid == 0 { Role::Admin } else { Role::User };
        Self {
            user: user.into(),
            uid,
            gid,
            role,
        }
    }

    /// The identity a worker daemon presents. It runs as whatever user started it; what
    /// matters to the controller is the role.
    pub fn worker(node_name: impl Into<String>, uid: u32, gid: u32) -> Self {
        Self {
            user: node_name.into(),
            uid,
            gid,
            role: Role::Worker,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

#[derive(Serialize, Deserialize)]
struct Claims {
    user: String,
    uid: u32,
    gid: u32,
    role: Role,
    iat: i64,
}

/// The verified identity of a request, or `unauthenticated` if the interceptor did not run
/// (a server wired without [`ServerAuth`] must fail closed, not open).
#[allow(clippy::result_large_err)]
pub fn identity<T>(request: &Request<T>) -> Result<&Identity, Status> {
    request
        .extensions()
        .get::<Identity>()
        .ok_or_else(|| Status::unauthenticated("request carries no verified identity"))
}

// === Interceptors ===

/// Server half: verifies the token of every request and stores the [`Identity`].
#[derive(Debug, Clone)]
pub struct ServerAuth {
    key: Arc<ClusterKey>,
}

impl ServerAuth {
    pub fn new(key: Arc<ClusterKey>) -> Self {
        Self { key }
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        match self.key.verify_metadata(request.metadata()) {
            Ok(identity) => {
                request.extensions_mut().insert(identity);
                Ok(request)
            }
            Err(e) => Err(Status::unauthenticated(format!(
                "authentication failed: {e}"
            ))),
        }
    }
}

/// Client half: attaches one pre-signed token to every request.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    header: AsciiMetadataValue,
}

impl ClientAuth {
    /// Signs `identity` once; the token is reused for the life of the client.
    pub fn new(key: &ClusterKey, identity: &Identity, now: i64) -> Self {
        let token = key.sign(identity, now);
        // base64url and '.' are visible ASCII, so this always parses.
        let header = format!("Bearer {token}")
            .parse()
            .unwrap_or_else(|_| AsciiMetadataValue::from_static(""));
        Self { header }
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert(AUTH_HEADER, self.header.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_LEN])
    }

    #[test]
    fn round_trip_keeps_identity() {
        let k = key(7);
        let token = k.sign(&alice(), 1_700_000_000);
        assert_eq!(k.verify(&token).unwrap(), alice());
    }

    #[test]
    fn root_is_admin() {
        assert!(Identity::user("root", 0, 0).is_admin());
        assert!(!alice().is_admin());
    }

    #[test]
    fn tampered_payload_is_rejected() {
        let k = key(7);
        let token = k.sign(&alice(), 1);
        let (payload, sig) = token.split_once('.').unwrap();
        // Claim to be root with alice's signature.
        let forged = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap())
                .unwrap()
                .replace("\"uid\":1000", "\"uid\":0")
                .replace("\"user\"", "\"admin\""),
        );
        assert_ne!(forged, payload);
        assert_eq!(
            k.verify(&format!("{forged}.{sig}")),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn wrong_key_is_rejected() {
        let token = key(7).sign(&alice(), 1);
        assert_eq!(key(8).verify(&token), Err(TokenError::BadSignature));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        let k = key(7);
        for bad in ["", "nodot", "a.b.c", "!!!.!!!", "e30.AAAA"] {
            assert!(k.verify(bad).is_err(), "{bad:?} accepted");
        }
        // A correctly signed payload that is not a claims object.
        let payload = URL_SAFE_NO_PAD.encode(b"[1,2]");
        let mut mac = k.mac();
        mac.update(payload.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        assert!(matches!(
            k.verify(&format!("{payload}.{sig}")),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn server_interceptor_rejects_missing_and_non_bearer_headers() {
        let mut server = ServerAuth::new(Arc::new(key(1)));
        let status = server.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("missing authorization"));

        let mut req = Request::new(());
        req.metadata_mut()
            .insert(AUTH_HEADER, "Basic abc".parse().unwrap());
        let status = server.call(req).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("Bearer"));
    }

    #[test]
    fn client_then_server_interceptor_yields_identity() {
        let k = key(3);
        let mut client = ClientAuth::new(&k, &alice(), 5);
        let mut server = ServerAuth::new(Arc::new(k));
        let req = server.call(client.call(Request::new(())).unwrap()).unwrap();
        assert_eq!(identity(&req).unwrap(), &alice());
    }

    #[test]
    fn unintercepted_request_has_no_identity() {
        let req = Request::new(());
        assert_eq!(
            identity(&req).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn key_file_round_trip_and_permission_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let k = ClusterKey::load_or_create(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = ClusterKey::load(&path).unwrap();
        assert_eq!(again.bytes, k.bytes);
        // A second load_or_create keeps the existing key.
        assert_eq!(ClusterKey::load_or_create(&path).unwrap().bytes, k.bytes);
        assert!(matches!(k.write_new(&path), Err(KeyError::Write { .. })));

        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = ClusterKey::load(&path).unwrap_err();
        assert!(matches!(err, KeyError::Permissions { mode: 0o640, .. }));
        assert!(err.to_string().contains("chmod 600"));
    }

    #[test]
    fn malformed_key_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        fs::write(&path, "not hex\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            ClusterKey::load(&path),
            Err(KeyError::Malformed { .. })
        ));
    }

    #[test]
    fn debug_does_not_leak_key() {
        assert_eq!(format!("{:?}", key(0xab)), "ClusterKey(..)");
    }
}
