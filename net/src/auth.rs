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
//! extensions, where handlers read it with [`identity`].

pub mod agent;
pub mod credential;
pub mod replay;

pub use credential::{
    CLOCK_SKEW, Credential, DEFAULT_LIFETIME, MAX_LIFETIME, MAX_TOKEN_LEN, StepGrant,
};
pub use replay::ReplayCache;

/// The credentials' clock; it lives in [`crate::clock`], below the CA that dates by it too.
pub use crate::clock::unix_now;

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::net::{LocalPeer, PeerInfo};

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
        // A Kubernetes Secret mounted with `defaultMode: 0400` in a pod with `fsGroup` is
        // `root:<fsGroup> 0440` (the kubelet adds group read to every file): accepted, as
        // PostgreSQL accepts root-owned keys its group may read. Writable or
        // world-readable is still refused.
        let kubernetes_secret = {
            use std::os::unix::fs::MetadataExt as _;
            meta.uid() == 0 && mode & 0o277 == 0o040
        };
        if mode & 0o077 != 0 && !kubernetes_secret {
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

    /// Signs an identity credential issued at `iat` and valid [`DEFAULT_LIFETIME`] seconds.
    pub fn sign(&self, identity: &Identity, iat: i64) -> String {
        self.issue(identity, "", iat, DEFAULT_LIFETIME).0
    }

    /// Issues an identity credential from `host`, valid `lifetime` seconds from `now`
    /// (clamped to 1..=[`MAX_LIFETIME`]), with a fresh nonce. Returns it and its expiry.
    pub fn issue(&self, identity: &Identity, host: &str, now: i64, lifetime: i64) -> (String, i64) {
        let exp = now.saturating_add(lifetime.clamp(1, MAX_LIFETIME));
        let claims = credential::Claims::Identity(credential::IdentityClaims {
            user: identity.user.clone(),
            uid: identity.uid,
            gid: identity.gid,
            role: identity.role,
            host: host.to_owned(),
            iat: now,
            exp,
            nonce: credential::nonce_hex(credential::new_nonce()),
        });
        (credential::encode(&claims, self.mac()), exp)
    }

    /// Signs a step launch grant valid `lifetime` seconds from `now`.
    pub fn issue_step(&self, grant: &StepGrant, now: i64, lifetime: i64) -> String {
        let claims = credential::Claims::Step(credential::StepClaims {
            job: grant.job_id,
            step: grant.step_id,
            nodes: grant.nodes.clone(),
            uid: grant.uid,
            gid: grant.gid,
            iat: now,
            exp: now.saturating_add(lifetime.clamp(1, MAX_LIFETIME)),
            nonce: credential::nonce_hex(credential::new_nonce()),
        });
        credential::encode(&claims, self.mac())
    }

    /// Verifies an identity credential now (signature, shape, expiry).
    pub fn verify(&self, token: &str) -> Result<Identity, TokenError> {
        self.verify_at(token, unix_now()).map(|c| c.identity)
    }

    /// Verifies an identity credential at time `now`.
    pub fn verify_at(&self, token: &str, now: i64) -> Result<Credential, TokenError> {
        match credential::decode(token, self.mac())? {
            credential::Claims::Identity(c) => {
                credential::check_time(c.iat, c.exp, now)?;
                credential::credential_of(c)
            }
            credential::Claims::Step(_) => Err(TokenError::WrongKind),
        }
    }

    /// Verifies a step launch grant at time `now`.
    pub fn verify_step(&self, token: &str, now: i64) -> Result<StepGrant, TokenError> {
        match credential::decode(token, self.mac())? {
            credential::Claims::Step(c) => {
                credential::check_time(c.iat, c.exp, now)?;
                Ok(credential::grant_of(c))
            }
            credential::Claims::Identity(_) => Err(TokenError::WrongKind),
        }
    }

    /// The bearer token of a request's metadata.
    pub fn bearer(meta: &MetadataMap) -> Result<&str, TokenError> {
        let value = meta.get(AUTH_HEADER).ok_or(TokenError::Missing)?;
        let value = value.to_str().map_err(|_| TokenError::NotBearer)?;
        let token = value.strip_prefix("Bearer ").ok_or(TokenError::NotBearer)?;
        Ok(token.trim())
    }

    /// Verifies the `authorization` metadata of a request now (no replay check).
    pub fn verify_metadata(&self, meta: &MetadataMap) -> Result<Identity, TokenError> {
        self.verify(Self::bearer(meta)?)
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

/// What a caller may do. Each role is a distinct credential: the agent issues only `user`
/// (and `admin` for uid 0); `worker`, `bridge` and `operator` are signed by daemons that hold
/// the key. The controller also raises configured users to `admin` ([`Admins`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A researcher: submits and controls their own jobs.
    User,
    /// A node agent: speaks only for the node its credential names (`Identity::user`).
    Worker,
    /// Root or a configured administrator: may control every job, node and account.
    Admin,
    /// The Kubernetes scheduler bridge: submits and controls placeholder jobs.
    Bridge,
    /// The Kubernetes operator: drains, resumes and removes nodes.
    Operator,
}

/// The authenticated caller of a request, as signed into its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user name; for a worker, the node it speaks for; for a service, its name.
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

    /// The identity a worker daemon presents: it names the node it speaks for.
    pub fn worker(node_name: impl Into<String>, uid: u32, gid: u32) -> Self {
        Self {
            user: node_name.into(),
            uid,
            gid,
            role: Role::Worker,
        }
    }

    /// A service identity (`Role::Bridge` or `Role::Operator`).
    pub fn service(role: Role, name: impl Into<String>, uid: u32, gid: u32) -> Self {
        Self {
            user: name.into(),
            uid,
            gid,
            role,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The node a worker identity speaks for.
    pub fn node(&self) -> Option<&str> {
        (self.role == Role::Worker).then_some(self.user.as_str())
    }
}

/// Users raised to administrator by the controller's configuration (Slurm's AdminLevel),
/// so staff need not be root to run `sacctmgr` or `scontrol update node`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admins {
    pub uids: std::collections::HashSet<u32>,
    pub users: std::collections::HashSet<String>,
}

impl Admins {
    /// Parses `alice,1234,bob`: numbers are uids, anything else user names.
    pub fn parse(list: &[String]) -> Self {
        let mut a = Self::default();
        for item in list.iter().flat_map(|s| s.split(',')) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            match item.parse::<u32>() {
                Ok(uid) => {
                    a.uids.insert(uid);
                }
                Err(_) => {
                    a.users.insert(item.to_owned());
                }
            }
        }
        a
    }

    /// `who` with the role the configuration gives it: a listed user becomes an admin.
    pub fn apply(&self, mut who: Identity) -> Identity {
        if who.role == Role::User
            && (self.uids.contains(&who.uid) || self.users.contains(&who.user))
        {
            who.role = Role::Admin;
        }
        who
    }
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

/// A stable number for the connection a request arrived on (its peer address over TCP, the
/// accept-time number on the local socket), for the replay cache. Requests without
/// connection info (in-process transports) share number 0.
fn connection_of<T>(request: &Request<T>) -> u64 {
    use std::hash::{Hash, Hasher};
    match request.extensions().get::<PeerInfo>() {
        Some(PeerInfo::Tcp(info)) => match info.remote_addr() {
            Some(addr) => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                addr.hash(&mut h);
                h.finish() | 1
            }
            None => 0,
        },
        Some(PeerInfo::Local(peer)) => peer.connection,
        None => 0,
    }
}

/// The peer of a request on the controller's local socket, as the kernel named it.
fn local_peer<T>(request: &Request<T>) -> Option<&LocalPeer> {
    match request.extensions().get::<PeerInfo>() {
        Some(PeerInfo::Local(peer)) => Some(peer),
        _ => None,
    }
}

/// Server half: verifies the credential of every request and stores the [`Identity`].
#[derive(Debug, Clone)]
pub struct ServerAuth {
    key: Arc<ClusterKey>,
    replay: Arc<std::sync::Mutex<ReplayCache>>,
    admins: Arc<Admins>,
}

impl ServerAuth {
    pub fn new(key: Arc<ClusterKey>) -> Self {
        Self::with_admins(key, Admins::default())
    }

    /// Also raises the configured administrators to [`Role::Admin`].
    pub fn with_admins(key: Arc<ClusterKey>, admins: Admins) -> Self {
        Self {
            key,
            replay: Arc::new(std::sync::Mutex::new(ReplayCache::default())),
            admins: Arc::new(admins),
        }
    }

    /// Authenticates one request at time `now`: the identity it may act as.
    ///
    /// A request with a credential is whom the credential names, on any transport. One
    /// without, on the local socket, is the user the kernel named at accept
    /// ([`crate::net::LocalPeer`]), as the identity agent would have named them; anywhere
    /// else it is refused.
    #[allow(clippy::result_large_err)]
    pub fn authenticate<T>(&self, request: &Request<T>, now: i64) -> Result<Identity, Status> {
        let fail = |e: TokenError| match e {
            TokenError::CacheFull => Status::resource_exhausted(format!("authentication: {e}")),
            _ => Status::unauthenticated(format!("authentication failed: {e}")),
        };
        let token = match (ClusterKey::bearer(request.metadata()), local_peer(request)) {
            (Err(TokenError::Missing), Some(peer)) => {
                let who = Identity::user(peer.user.clone(), peer.uid, peer.gid);
                return Ok(self.admins.apply(who));
            }
            (token, _) => token.map_err(fail)?,
        };
        let cred = self.key.verify_at(token, now).map_err(fail)?;
        let conn = connection_of(request);
        {
            // A poisoned lock only means another request panicked mid-check; the map is
            // still consistent (each check is one insert).
            let mut replay = self
                .replay
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            replay
                .check(cred.nonce, conn, cred.exp, now)
                .map_err(fail)?;
        }
        Ok(self.admins.apply(cred.identity))
    }
}

impl Interceptor for ServerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let who = self.authenticate(&request, unix_now())?;
        request.extensions_mut().insert(who);
        Ok(request)
    }
}

/// Where a client gets its credentials: the agent, or the key if it can read it.
pub trait CredentialSource: Send + Sync + fmt::Debug {
    /// A fresh credential (blocking, but quick: signing or one agent round trip).
    fn issue(&self) -> Result<agent::Issued, String>;
}

/// Signs with the cluster key directly (the key's owner, daemons).
#[derive(Debug, Clone)]
pub struct KeySigner {
    pub key: ClusterKey,
    pub identity: Identity,
    pub host: String,
}

impl CredentialSource for KeySigner {
    fn issue(&self) -> Result<agent::Issued, String> {
        let (token, exp) = self
            .key
            .issue(&self.identity, &self.host, unix_now(), DEFAULT_LIFETIME);
        Ok(agent::Issued {
            token,
            identity: self.identity.clone(),
            exp,
        })
    }
}

/// Asks the local identity agent on its Unix socket.
#[derive(Debug, Clone)]
pub struct AgentSource {
    pub socket: PathBuf,
}

impl CredentialSource for AgentSource {
    fn issue(&self) -> Result<agent::Issued, String> {
        agent::request(&self.socket).map_err(|e| error_chain(&e))
    }
}

/// An error and its sources on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// A client renews its credential this long before it expires.
const RENEW_BEFORE: i64 = 60;

#[derive(Debug)]
struct Cached {
    header: AsciiMetadataValue,
    exp: i64,
}

/// Client half: attaches a credential to every request, renewing it before it expires (a
/// long `srun` still reports its end with a valid one).
#[derive(Debug, Clone)]
pub struct ClientAuth {
    source: Arc<dyn CredentialSource>,
    cached: Arc<std::sync::Mutex<Cached>>,
    identity: Identity,
    /// `false` on the controller's local socket, where the kernel names the caller.
    attach: bool,
}

/// The source of [`ClientAuth::unattached`]: nothing to issue.
#[derive(Debug)]
struct NoCredential;

impl CredentialSource for NoCredential {
    fn issue(&self) -> Result<agent::Issued, String> {
        Err("this connection carries no credential (the kernel names its caller)".to_owned())
    }
}

fn header_of(token: &str) -> Result<AsciiMetadataValue, String> {
    format!("Bearer {token}")
        .parse()
        .map_err(|_| "credential is not visible ASCII".to_owned())
}

impl ClientAuth {
    /// Signs `identity` with `key` (issued at `now`), renewing as needed.
    pub fn new(key: &ClusterKey, identity: &Identity, now: i64) -> Self {
        let (token, exp) = key.issue(identity, "", now, DEFAULT_LIFETIME);
        // base64url and '.' are visible ASCII, so this always parses.
        let header = header_of(&token).unwrap_or_else(|_| AsciiMetadataValue::from_static(""));
        Self {
            source: Arc::new(KeySigner {
                key: key.clone(),
                identity: identity.clone(),
                host: String::new(),
            }),
            cached: Arc::new(std::sync::Mutex::new(Cached { header, exp })),
            identity: identity.clone(),
            attach: true,
        }
    }

    /// No credential on requests: for a channel to the controller's local socket, where the
    /// server learns the caller from the kernel ([`crate::net::LocalPeer`]). `identity` is
    /// what the process knows of itself (its uid, gid and user name).
    pub fn unattached(identity: Identity) -> Self {
        Self {
            source: Arc::new(NoCredential),
            cached: Arc::new(std::sync::Mutex::new(Cached {
                header: AsciiMetadataValue::from_static(""),
                exp: 0,
            })),
            identity,
            attach: false,
        }
    }

    /// Gets a first credential from `source` now.
    pub fn from_source(source: Arc<dyn CredentialSource>) -> Result<Self, String> {
        let issued = source.issue()?;
        let header = header_of(&issued.token)?;
        Ok(Self {
            source,
            cached: Arc::new(std::sync::Mutex::new(Cached {
                header,
                exp: issued.exp,
            })),
            identity: issued.identity,
            attach: true,
        })
    }

    /// Whom the credentials name.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The current credential, renewed first if it is about to expire.
    pub fn token(&self) -> Result<String, String> {
        let h = self.header()?;
        let s = h.to_str().map_err(|e| e.to_string())?;
        Ok(s.strip_prefix("Bearer ").unwrap_or(s).to_owned())
    }

    fn header(&self) -> Result<AsciiMetadataValue, String> {
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = unix_now();
        if cached.exp - now <= RENEW_BEFORE {
            match self.source.issue() {
                Ok(issued) => {
                    cached.header = header_of(&issued.token)?;
                    cached.exp = issued.exp;
                }
                // Keep using the old one while it lasts; the server says when it is over.
                Err(e) if cached.exp <= now => return Err(e),
                Err(_) => {}
            }
        }
        Ok(cached.header.clone())
    }
}

impl Interceptor for ClientAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if !self.attach {
            return Ok(request);
        }
        let header = self
            .header()
            .map_err(|e| Status::unauthenticated(format!("no credential: {e}")))?;
        request.metadata_mut().insert(AUTH_HEADER, header);
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    fn alice() -> Identity {
        Identity::user("alice", 1000, 1000)
    }

    fn key(b: u8) -> ClusterKey {
        ClusterKey::from_bytes([b; KEY_LEN])
    }

    /// Signs arbitrary payload bytes as a v1 credential (for tests of what the MAC covers).
    fn sign_raw(k: &ClusterKey, payload_json: &[u8]) -> String {
        let payload = URL_SAFE_NO_PAD.encode(payload_json);
        let signed = format!("v1.{payload}");
        let mut mac = k.mac();
        mac.update(signed.as_bytes());
        format!(
            "{signed}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn round_trip_keeps_identity_host_and_window() {
        let k = key(7);
        let (token, exp) = k.issue(&alice(), "login1", 1_700_000_000, 300);
        assert!(token.starts_with("v1."));
        assert_eq!(exp, 1_700_000_300);
        let c = k.verify_at(&token, 1_700_000_001).unwrap();
        assert_eq!(c.identity, alice());
        assert_eq!(c.host, "login1");
        assert_eq!((c.iat, c.exp), (1_700_000_000, 1_700_000_300));
    }

    #[test]
    fn expired_and_future_credentials_are_refused() {
        let k = key(7);
        let (token, _) = k.issue(&alice(), "", 1_000, 300);
        assert!(matches!(
            k.verify_at(&token, 1_300),
            Err(TokenError::Expired { .. })
        ));
        assert!(matches!(
            k.verify_at(&token, 1_000 - CLOCK_SKEW - 1),
            Err(TokenError::NotYetValid { .. })
        ));
        assert!(k.verify_at(&token, 1_000 - CLOCK_SKEW).is_ok());
    }

    #[test]
    fn lifetimes_are_capped_when_issued_and_when_verified() {
        let k = key(7);
        let (token, exp) = k.issue(&alice(), "", 0, 1_000_000);
        assert_eq!(exp, MAX_LIFETIME);
        assert!(k.verify_at(&token, 1).is_ok());
        // A key holder hand-crafting a longer one is refused anyway.
        let long = sign_raw(
            &k,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":99999,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
        );
        assert!(matches!(
            k.verify_at(&long, 1),
            Err(TokenError::Malformed(_))
        ));
    }

    #[test]
    fn nonces_differ() {
        let k = key(7);
        let a = k.verify_at(&k.sign(&alice(), 5), 6).unwrap();
        let b = k.verify_at(&k.sign(&alice(), 5), 6).unwrap();
        assert_ne!(a.nonce, b.nonce);
    }

    #[test]
    fn root_is_admin_and_admins_are_configurable() {
        assert!(Identity::user("root", 0, 0).is_admin());
        assert!(!alice().is_admin());
        let admins = Admins::parse(&["staff, 1234".into()]);
        assert!(admins.apply(Identity::user("staff", 5, 5)).is_admin());
        assert!(admins.apply(Identity::user("x", 1234, 5)).is_admin());
        assert!(!admins.apply(alice()).is_admin());
        // Only users are raised: a worker named like an admin stays a worker.
        assert_eq!(
            admins.apply(Identity::worker("staff", 0, 0)).role,
            Role::Worker
        );
    }

    #[test]
    fn tampered_payload_is_rejected() {
        let k = key(7);
        let token = k.sign(&alice(), 1);
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(
            String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap())
                .unwrap()
                .replace("\"uid\":1000", "\"uid\":0"),
        );
        assert_ne!(forged, parts[1]);
        parts[1] = &forged;
        assert_eq!(
            k.verify_at(&parts.join("."), 2),
            Err(TokenError::BadSignature)
        );
    }

    #[test]
    fn wrong_key_version_and_kind_are_rejected() {
        let token = key(7).sign(&alice(), 1);
        assert_eq!(key(8).verify_at(&token, 2), Err(TokenError::BadSignature));
        let v2 = token.replacen("v1.", "v2.", 1);
        assert!(matches!(
            key(7).verify_at(&v2, 2),
            Err(TokenError::UnsupportedVersion(_))
        ));
        let grant = StepGrant {
            job_id: 1,
            step_id: 0,
            nodes: vec!["n1".into()],
            uid: 1000,
            gid: 1000,
            exp: 0,
        };
        let step = key(7).issue_step(&grant, 1, 60);
        assert_eq!(key(7).verify_at(&step, 2), Err(TokenError::WrongKind));
        assert_eq!(key(7).verify_step(&token, 2), Err(TokenError::WrongKind));
        let back = key(7).verify_step(&step, 2).unwrap();
        assert_eq!((back.job_id, back.nodes, back.exp), (1, grant.nodes, 61));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        let k = key(7);
        for bad in [
            "",
            "nodot",
            "a.b.c",
            "!!!.!!!",
            "e30.AAAA",
            "v1.e30.AAAA",
            "v1...",
        ] {
            assert!(k.verify_at(bad, 0).is_err(), "{bad:?} accepted");
        }
        // Correctly signed payloads that are not valid claims.
        for json in [
            &b"[1,2]"[..],
            br#"{"kind":"identity"}"#,
            br#"{"kind":"other","user":"a"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"zz"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"god","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":10,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f"}"#,
            br#"{"kind":"identity","user":"a","uid":1,"gid":1,"role":"user","host":"","iat":0,"exp":10,"nonce":"000102030405060708090a0b0c0d0e0f","extra":1}"#,
        ] {
            assert!(
                matches!(k.verify_at(&sign_raw(&k, json), 1), Err(TokenError::Malformed(_))),
                "{} accepted",
                String::from_utf8_lossy(json)
            );
        }
        let huge = "v1.".to_owned() + &"A".repeat(MAX_TOKEN_LEN) + ".AAAA";
        assert!(matches!(
            k.verify_at(&huge, 0),
            Err(TokenError::Malformed(_))
        ));
    }

    fn request_with(token: &str) -> Request<()> {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert(AUTH_HEADER, format!("Bearer {token}").parse().unwrap());
        req
    }

    #[test]
    fn server_interceptor_rejects_missing_non_bearer_and_expired() {
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

        let old = key(1).sign(&alice(), 1);
        let status = server.call(request_with(&old)).unwrap_err();
        assert!(status.message().contains("expired"), "{status:?}");
    }

    #[test]
    fn server_refuses_a_nonce_from_a_second_connection() {
        let k = key(4);
        let server = ServerAuth::new(Arc::new(k.clone()));
        let token = k.sign(&alice(), unix_now());
        let from = |port: u16| {
            let mut r = request_with(&token);
            r.extensions_mut()
                .insert(PeerInfo::Tcp(tonic::transport::server::TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some(([127, 0, 0, 1], port).into()),
                }));
            r
        };
        let now = unix_now();
        assert!(server.authenticate(&from(5000), now).is_ok());
        // The same connection may send many requests with it.
        assert!(server.authenticate(&from(5000), now).is_ok());
        let replay = server.authenticate(&from(5001), now).unwrap_err();
        assert_eq!(replay.code(), tonic::Code::Unauthenticated);
        assert!(replay.message().contains("replayed"), "{replay:?}");
    }

    fn on_local_socket(mut req: Request<()>, uid: u32, connection: u64) -> Request<()> {
        req.extensions_mut().insert(PeerInfo::Local(LocalPeer {
            uid,
            gid: 100,
            user: format!("user{uid}"),
            connection,
        }));
        req
    }

    #[test]
    fn the_local_socket_stands_in_for_a_credential_but_never_overrides_one() {
        let k = key(5);
        let server = ServerAuth::with_admins(Arc::new(k.clone()), Admins::parse(&["7".into()]));
        let now = unix_now();
        // No credential: the kernel's uid, named as the agent would name it.
        let who = server
            .authenticate(&on_local_socket(Request::new(()), 1000, 2), now)
            .unwrap();
        assert_eq!(who, Identity::user("user1000", 1000, 100));
        // Root and configured administrators are administrators here too.
        for uid in [0, 7] {
            let who = server
                .authenticate(&on_local_socket(Request::new(()), uid, 2), now)
                .unwrap();
            assert_eq!(who.role, Role::Admin, "uid {uid}");
        }
        // A credential that fails is refused, not passed over for the kernel's word.
        let forged = key(6).sign(&alice(), now);
        let refused = server
            .authenticate(&on_local_socket(request_with(&forged), 1000, 2), now)
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
        // A valid one speaks for its holder, as on TCP, and its replay rules hold.
        let token = k.sign(&alice(), now);
        let who = server
            .authenticate(&on_local_socket(request_with(&token), 1000, 4), now)
            .unwrap();
        assert_eq!(who, alice());
        let replay = server
            .authenticate(&on_local_socket(request_with(&token), 1000, 6), now)
            .unwrap_err();
        assert!(replay.message().contains("replayed"), "{replay:?}");
        // Without the local socket a request with no credential is refused.
        let status = server.authenticate(&Request::new(()), now).unwrap_err();
        assert!(status.message().contains("missing authorization"));
    }

    #[test]
    fn an_unattached_client_sends_no_credential() {
        let mut client = ClientAuth::unattached(alice());
        let req = client.call(Request::new(())).unwrap();
        assert!(req.metadata().get(AUTH_HEADER).is_none());
        assert_eq!(client.identity(), &alice());
        assert!(client.token().is_err());
    }

    #[test]
    fn client_then_server_interceptor_yields_identity() {
        let k = key(3);
        let mut client = ClientAuth::new(&k, &alice(), unix_now());
        let mut server = ServerAuth::with_admins(Arc::new(k), Admins::parse(&["alice".into()]));
        let req = server.call(client.call(Request::new(())).unwrap()).unwrap();
        let who = identity(&req).unwrap();
        assert_eq!(who.uid, 1000);
        assert_eq!(who.role, Role::Admin);
    }

    #[test]
    fn client_renews_an_expiring_credential() {
        let k = key(3);
        // Issued long ago: the client must sign a fresh one before sending.
        let client = ClientAuth::new(&k, &alice(), 1);
        let token = client.token().unwrap();
        assert!(k.verify_at(&token, unix_now()).is_ok());
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
        // A Secret mounted with defaultMode 0400 and fsGroup: 0440, accepted when root
        // owns it (as the kubelet makes it), refused otherwise.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o440)).unwrap();
        let root_owned = {
            use std::os::unix::fs::MetadataExt as _;
            fs::metadata(&path).unwrap().uid() == 0
        };
        assert_eq!(ClusterKey::load(&path).is_ok(), root_owned);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
        assert!(ClusterKey::load(&path).is_err(), "others may never read it");
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

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any string: no panic, and nothing but a real credential is accepted.
            #[test]
            fn arbitrary_text_is_refused(s in ".{0,400}") {
                let k = key(9);
                prop_assert!(k.verify_at(&s, 0).is_err());
                prop_assert!(k.verify_step(&s, 0).is_err());
            }

            /// Text shaped like a credential (three dot-separated base64url parts).
            #[test]
            fn credential_shaped_text_is_refused(
                v in "v[0-9]{1,2}",
                p in "[A-Za-z0-9_-]{0,200}",
                sig in "[A-Za-z0-9_-]{0,60}",
            ) {
                let k = key(9);
                let t = format!("{v}.{p}.{sig}");
                prop_assert!(k.verify_at(&t, 0).is_err());
            }

            /// Signed claims of any JSON value: refused unless exactly the claims shape.
            #[test]
            fn signed_junk_json_is_refused(
                user in ".{0,20}",
                uid in any::<u32>(),
                iat in any::<i64>(),
                exp in any::<i64>(),
                nonce in "[0-9a-fg]{0,40}",
                extra in proptest::option::of("[a-z]{1,8}"),
            ) {
                let k = key(9);
                let mut obj = serde_json::json!({
                    "kind": "identity", "user": user, "uid": uid, "gid": 1, "role": "user",
                    "host": "", "iat": iat, "exp": exp, "nonce": nonce,
                });
                if let Some(x) = &extra {
                    obj[x] = serde_json::json!(1);
                }
                let t = sign_raw(&k, obj.to_string().as_bytes());
                let ok_shape = !user.is_empty()
                    && nonce.len() == 32 && !nonce.contains('g')
                    && exp > iat && exp.saturating_sub(iat) <= MAX_LIFETIME
                    && extra.as_deref().is_none_or(|x| ![
                        "kind","user","uid","gid","role","host","iat","exp","nonce"
                    ].contains(&x));
                let r = k.verify_at(&t, iat);
                if !ok_shape {
                    prop_assert!(r.is_err(), "accepted {obj}");
                } else if let Ok(c) = r {
                    prop_assert_eq!(c.identity.uid, uid);
                }
            }

            /// Flipping any one character of a real credential breaks it.
            #[test]
            fn any_single_change_is_refused(pos in any::<prop::sample::Index>(), c in "[A-Za-z0-9_.-]") {
                let k = key(9);
                let t = k.sign(&alice(), 100);
                let i = pos.index(t.len());
                let mut b = t.clone().into_bytes();
                let nc = c.as_bytes()[0];
                prop_assume!(b[i] != nc);
                b[i] = nc;
                let t2 = String::from_utf8(b).unwrap();
                prop_assert!(k.verify_at(&t2, 101).is_err());
            }
        }
    }
}
