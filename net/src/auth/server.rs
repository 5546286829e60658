//! The server half of authentication: the tonic interceptor ([`ServerAuth`]) that verifies
//! the credential of every request (MAC, expiry, replay), stands the kernel's word in for a
//! credential on the controller's local socket, raises configured administrators, and stores
//! the caller's [`Identity`] in the request's extensions.

use std::sync::Arc;

use tonic::service::Interceptor;
use tonic::{Request, Status};

use super::{Admins, ClusterKey, Identity, ReplayCache, TokenError, unix_now};
use crate::net::{LocalPeer, PeerInfo};

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

    /// Also raises the configured administrators to [`Role::Admin`](super::Role::Admin).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::test_util::{alice, key};
    use crate::auth::{AUTH_HEADER, Role};

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
}
