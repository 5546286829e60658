//! The client half of authentication: where a process gets its credentials
//! ([`CredentialSource`]: the cluster key it can read, [`KeySigner`], or the local identity
//! agent, [`AgentSource`]) and the tonic interceptor ([`ClientAuth`]) that attaches one to
//! every request and renews it before it expires.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::{AUTH_HEADER, ClusterKey, DEFAULT_LIFETIME, Identity, agent, unix_now};

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
    use crate::auth::test_util::{alice, key};
    use crate::auth::{Admins, Role, ServerAuth, identity};

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
}
