//! The one place that makes Tandem's TCP sockets: every listener's accepted connections and
//! every client connection come from here, with `TCP_NODELAY` set on each.
//!
//! # Why
//!
//! gRPC writes a request as several small frames (HEADERS, DATA, sometimes a WINDOW_UPDATE).
//! With Nagle's algorithm on, the second small write waits for the ACK of the first, and the
//! peer delays that ACK by up to 40 ms: about a third of all `sbatch` calls used to take
//! 45 ms instead of 6. tonic's `Server::tcp_nodelay(true)` only reaches sockets tonic accepts
//! itself, not the ones a server passes in through `serve_with_incoming*`, so the option is set
//! here, where the socket is made, and nowhere else needs to remember it.
//!
//! # TLS
//!
//! Whether a connection speaks TLS is decided here too, once per listener or client:
//! [`ServerSecurity`] for what a listener accepts, [`ClientSecurity`] for what a client
//! opens (both made from the daemon's flags by [`crate::tls::Options`], or from the cluster
//! file by [`crate::endpoint::Endpoint::security`]). A TLS listener completes each handshake
//! off the accept loop (many at once, each with a deadline), so a client that connects and
//! says nothing, or speaks plain text, delays no one and is dropped.
//!
//! # The local socket
//!
//! The controller may also listen on a Unix socket ([`bind_local`]) for clients on its own
//! host: no TCP, no TLS handshake (the two cost a researcher's `sbatch` about 1.5 ms of its
//! 6), and no credential to fetch, because the kernel names the peer (`SO_PEERCRED`, read
//! at accept into [`LocalPeer`]). Nothing on the wire can be observed or forged by another
//! unprivileged user, and only the controller's user can create the socket in its
//! directory, which is how a client knows it is the controller; the same two facts
//! `munge` and the identity agent rest on.
//!
//! # Use
//!
//! - servers: `net::bind(addr).await?` then `.incoming(security)` (or
//!   `.incoming_with_local(security, Some(net::bind_local(path)?))`) into
//!   `serve_with_incoming_shutdown` (or `.accept()` for a hand-written protocol such as the
//!   metrics endpoint);
//! - clients: build a `tonic::transport::Endpoint` and `net::connect(&endpoint, &security)`,
//!   or `net::connect_local(path)`.
//!
//! # Which name is verified
//!
//! [`connect`] verifies the host it dials, as any TLS client does: the controller's
//! certificate names its addresses. [`connect_verifying`] dials one address and verifies
//! another name: a worker's step service is reached at the address the worker advertises
//! (on Kubernetes its pod IP, known only once the pod runs) but certified for its *node
//! name*, which the operator knows when it renders the pod and issues a certificate for
//! (srun, through [`crate::endpoint::connect_to_node`]). A certificate for another node is
//! refused even at the right address.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt as _};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint, Uri};

mod conn;

/// What a listener accepts and what a client opens are decided by the TLS layer below
/// ([`crate::tls`]); they are named here too, where they are used.
pub use crate::tls::{ClientSecurity, ServerSecurity};
pub use conn::{ClientConn, LocalPeer, PeerInfo, ServerConn};

/// A client that opened TCP but has not finished its TLS handshake within this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many handshakes in flight per listener; more connections wait in the
/// kernel's accept queue, so a flood of silent clients costs bounded memory.
const MAX_HANDSHAKES: usize = 1024;

/// How long an accept loop pauses after the process ran out of descriptors or memory, so
/// the loop does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A bound TCP listener whose accepted sockets all have `TCP_NODELAY`.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

/// Binds `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
pub async fn bind(addr: SocketAddr) -> io::Result<Listener> {
    Ok(Listener {
        inner: TcpListener::bind(addr).await?,
    })
}

impl Listener {
    /// Adopts a listener bound elsewhere (tests bind first to learn the port).
    pub fn from_std(listener: std::net::TcpListener) -> io::Result<Listener> {
        listener.set_nonblocking(true)?;
        Ok(Listener {
            inner: TcpListener::from_std(listener)?,
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accepts one connection, `TCP_NODELAY` set.
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = self.inner.accept().await?;
        no_delay(&stream);
        Ok((stream, peer))
    }

    /// The listener itself, for an HTTP stack that sets per-socket options through its own
    /// hook; the caller must set `TCP_NODELAY` there (the metrics endpoint uses axum's
    /// `tap_io`).
    pub fn into_tokio(self) -> TcpListener {
        self.inner
    }

    /// The accepted connections, secured as `security` says, as a stream for tonic's
    /// `serve_with_incoming*`.
    pub fn incoming(self, security: ServerSecurity) -> Incoming {
        self.incoming_with_local(security, None)
    }

    /// As [`Listener::incoming`], and also the connections of `local` (the controller's
    /// Unix socket), each with its [`LocalPeer`].
    pub fn incoming_with_local(
        self,
        security: ServerSecurity,
        local: Option<LocalListener>,
    ) -> Incoming {
        Incoming {
            listener: self.inner,
            local: local.map(|l| l.inner),
            pause: None,
            tls: match security {
                ServerSecurity::Tls(config) => Some(tokio_rustls::TlsAcceptor::from(config)),
                ServerSecurity::Plaintext => None,
            },
            handshakes: FuturesUnordered::new(),
        }
    }
}

impl From<TcpListener> for Listener {
    fn from(inner: TcpListener) -> Self {
        Listener { inner }
    }
}

type Handshake = Pin<Box<dyn Future<Output = io::Result<ServerConn>> + Send>>;

/// Accepted connections, each with `TCP_NODELAY`, after their TLS handshake if the listener
/// has TLS. Accept errors are passed on (tonic logs and skips them); after one that says the
/// process is out of descriptors or memory the stream waits [`ACCEPT_BACKOFF`] before
/// accepting again. A failed or timed-out handshake (a plain-text client, a client that
/// does not trust the certificate) only closes that connection.
pub struct Incoming {
    listener: TcpListener,
    local: Option<UnixListener>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handshakes: FuturesUnordered<Handshake>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("listener", &self.listener)
            .field("local", &self.local)
            .field("tls", &self.tls.is_some())
            .field("handshakes", &self.handshakes.len())
            .finish()
    }
}

impl Incoming {
    /// Accepts while connections are ready: a plain one is returned at once, a TLS one
    /// starts its handshake. `Pending` once the accept queue is empty (or the handshake
    /// bound is reached: a finishing handshake wakes the stream again).
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<ServerConn>> {
        if let Some(pause) = self.pause.as_mut() {
            ready!(pause.as_mut().poll(cx));
            self.pause = None;
        }
        while self.handshakes.len() < MAX_HANDSHAKES {
            // One connection from each listener per round: a flood on the local socket
            // cannot keep the workers' and remote users' TCP connections waiting.
            let mut took_local = false;
            if let Some(local) = &self.local {
                match local.poll_accept(cx) {
                    Poll::Ready(Ok((stream, _))) => {
                        self.handshakes.push(Box::pin(identify_local(stream)));
                        took_local = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(self.accept_failed(e))),
                    Poll::Pending => {}
                }
            }
            let stream = match self.listener.poll_accept(cx) {
                Poll::Ready(Ok((stream, _))) => stream,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(self.accept_failed(e))),
                Poll::Pending if took_local => continue,
                Poll::Pending => return Poll::Pending,
            };
            no_delay(&stream);
            let Some(acceptor) = self.tls.clone() else {
                return Poll::Ready(Ok(ServerConn::Plain(stream)));
            };
            self.handshakes.push(Box::pin(async move {
                let peer = stream.peer_addr().ok();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => Ok(ServerConn::Tls(Box::new(tls))),
                    Ok(Err(e)) => {
                        tracing::debug!(?peer, error = %e, "TLS handshake failed");
                        Err(e)
                    }
                    Err(_) => {
                        tracing::debug!(?peer, "TLS handshake timed out");
                        Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "TLS handshake timed out",
                        ))
                    }
                }
            }));
        }
        Poll::Pending
    }
}

impl Incoming {
    /// Passes an accept error on; after one that says the process is out of descriptors or
    /// memory, the stream first waits [`ACCEPT_BACKOFF`].
    fn accept_failed(&mut self, e: io::Error) -> io::Error {
        if out_of_resources(&e) {
            self.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
        }
        e
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<ServerConn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(r) = this.poll_accept(cx) {
            return Poll::Ready(Some(r));
        }
        // A failed handshake is not the listener's error: skip it and look at the next.
        while let Poll::Ready(Some(done)) = this.handshakes.poll_next_unpin(cx) {
            if let Ok(conn) = done {
                return Poll::Ready(Some(Ok(conn)));
            }
        }
        Poll::Pending
    }
}

/// Connection numbers of the local socket: even, so they never equal a TCP peer's (odd)
/// number in the replay cache.
static LOCAL_CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// How long a uid's name from the password database is reused for local connections.
const NAME_TTL: Duration = Duration::from_secs(60);

/// Names of recent local peers: a researcher's loop of `sbatch` looks its name up once.
static NAMES: std::sync::Mutex<Option<std::collections::HashMap<u32, (String, Instant)>>> =
    std::sync::Mutex::new(None);

/// Reads who connected to the local socket. The name comes from the password database,
/// which may be a network service (sssd, LDAP): a lookup runs off the async workers, so a
/// slow one delays only this connection, and is reused for [`NAME_TTL`].
async fn identify_local(stream: UnixStream) -> io::Result<ServerConn> {
    let cred = stream.peer_cred()?;
    let (uid, gid) = (cred.uid(), cred.gid());
    let names = || {
        NAMES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let cached = names()
        .as_ref()
        .and_then(|m| m.get(&uid))
        .filter(|(_, at)| at.elapsed() < NAME_TTL)
        .map(|(name, _)| name.clone());
    let user = match cached {
        Some(name) => name,
        None => {
            let name = tokio::task::spawn_blocking(move || user_name_of(uid))
                .await
                .map_err(io::Error::other)?;
            let mut map = names();
            let map = map.get_or_insert_with(Default::default);
            // Bounded: past this many users, start over rather than grow.
            if map.len() >= 4096 {
                map.clear();
            }
            map.insert(uid, (name.clone(), Instant::now()));
            name
        }
    };
    let connection = LOCAL_CONNECTIONS.fetch_add(1, Ordering::Relaxed) << 1;
    Ok(ServerConn::Local(
        stream,
        LocalPeer {
            uid,
            gid,
            user,
            connection,
        },
    ))
}

/// The name of `uid` in this host's password database, else the uid itself.
pub fn user_name_of(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

/// The controller's local socket, bound by [`bind_local`].
#[derive(Debug)]
pub struct LocalListener {
    inner: UnixListener,
}

/// Binds a Unix socket at `path` that every local user may connect to (mode 0666: the
/// kernel, not the file mode, says who each caller is), replacing a stale socket left by a
/// process that died, never a live one nor anything that is not a socket. Needs a Tokio
/// runtime.
pub fn bind_local(path: &Path) -> io::Result<LocalListener> {
    let listener = bind_unix_std(path)?;
    listener.set_nonblocking(true)?;
    Ok(LocalListener {
        inner: UnixListener::from_std(listener)?,
    })
}

/// [`bind_local`]'s checks and binding, for servers that run their own accept loop (the
/// identity agent).
pub fn bind_unix_std(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    let err = |kind, what: &str| io::Error::new(kind, format!("{}: {what}", path.display()));
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket; refusing to replace it",
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err(
                io::ErrorKind::AddrInUse,
                "another process already listens on this socket",
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| err(e.kind(), &format!("cannot remove the stale socket: {e}")))?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| err(e.kind(), &format!("cannot listen: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| err(e.kind(), &format!("cannot open it to local users: {e}")))?;
    Ok(listener)
}

/// The longest socket path the kernel takes (`sun_path`, 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Seconds a client waits for the answer to one call ([`message_timeout`]).
pub const ENV_MSG_TIMEOUT: &str = "TANDEM_MSG_TIMEOUT";

/// How long a client waits for the answer to one call (for a stream, for its start; what
/// streams after is not timed), as Slurm's commands give up after `MessageTimeout`: a
/// server that accepts connections but never answers must not hang a researcher's shell or
/// a daemon's loop. A minute, far beyond any healthy answer (a submit waits for one
/// fsync); `TANDEM_MSG_TIMEOUT` (whole seconds, at least 1) sets another.
pub fn message_timeout() -> Duration {
    message_timeout_from(std::env::var(ENV_MSG_TIMEOUT).ok().as_deref())
}

fn message_timeout_from(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(Duration::from_secs(60), Duration::from_secs)
}

/// Connects to the controller's local socket at `path` (see [`bind_local`]).
pub async fn connect_local(path: &Path) -> Result<Channel, tonic::transport::Error> {
    // The authority is only what HTTP/2's `:authority` header carries; the socket is `path`.
    Endpoint::from_static("http://localhost")
        .connect_timeout(Duration::from_secs(5))
        .timeout(message_timeout())
        .connect_with_connector(LocalConnector {
            path: Arc::from(path),
        })
        .await
}

/// tonic's connector for the local socket: every connection goes to `path`.
#[derive(Clone)]
struct LocalConnector {
    path: Arc<Path>,
}

impl Service<Uri> for LocalConnector {
    type Response = TokioIo<ClientConn>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let path = self.path.clone();
        Box::pin(async move {
            let stream = UnixStream::connect(&*path).await?;
            Ok(TokioIo::new(ClientConn::Local(stream)))
        })
    }
}

fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Sets `TCP_NODELAY`. A socket that refuses it has already failed (the peer reset it); the
/// next read or write reports that, so this only logs.
fn no_delay(stream: &TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}

/// Opens a TCP connection to `addr` with `TCP_NODELAY` set.
pub async fn connect_tcp(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    no_delay(&stream);
    Ok(stream)
}

/// Connects `endpoint` (its address, timeouts and HTTP/2 settings) over a socket made here,
/// secured as `security` says. With TLS the server's certificate must name the host of the
/// endpoint's URI (an IP address or a DNS name) and chain to the CA; the URI's scheme is
/// not consulted (the `:scheme` header is all it sets).
pub async fn connect(
    endpoint: &Endpoint,
    security: &ClientSecurity,
) -> Result<Channel, tonic::transport::Error> {
    endpoint
        .connect_with_connector(Connector::new(security, None))
        .await
}

/// As [`connect`], but with TLS the server's certificate must name `server_name` (a DNS
/// name or an IP address) instead of the host of the endpoint's URI, which is only dialled:
/// a worker's step service, dialled at its advertised address and verified as its node.
/// A `server_name` that is neither fails each connection attempt (`InvalidInput`); plain
/// text ignores it.
pub async fn connect_verifying(
    endpoint: &Endpoint,
    security: &ClientSecurity,
    server_name: &str,
) -> Result<Channel, tonic::transport::Error> {
    endpoint
        .connect_with_connector(Connector::new(security, Some(server_name)))
        .await
}

/// tonic's connector: resolves the URI's host and port, opens the socket and, with TLS,
/// completes the handshake, verifying `name` if set, else the URI's host.
#[derive(Clone)]
struct Connector {
    tls: Option<tokio_rustls::TlsConnector>,
    name: Option<Arc<str>>,
}

impl Connector {
    fn new(security: &ClientSecurity, name: Option<&str>) -> Connector {
        Connector {
            tls: match security {
                ClientSecurity::Tls(c) => Some(tokio_rustls::TlsConnector::from(c.clone())),
                ClientSecurity::Plaintext => None,
            },
            name: name.map(Arc::from),
        }
    }
}

impl Service<Uri> for Connector {
    type Response = TokioIo<ClientConn>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let verify = self.name.clone();
        Box::pin(async move {
            let invalid = || {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("address {uri} has no host and port"),
                )
            };
            let host = uri.host().ok_or_else(invalid)?;
            // `http::Uri` keeps the brackets of an IPv6 literal.
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port = uri.port_u16().ok_or_else(invalid)?;
            let stream = TcpStream::connect((host, port)).await?;
            no_delay(&stream);
            let Some(tls) = tls else {
                return Ok(TokioIo::new(ClientConn::Plain(stream)));
            };
            let name = verify.as_deref().unwrap_or(host);
            let name = rustls::pki_types::ServerName::try_from(name.to_owned()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{name:?} cannot be verified in a certificate: {e}"),
                )
            })?;
            let stream = tls.connect(name, stream).await?;
            Ok(TokioIo::new(ClientConn::Tls(Box::new(stream))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_and_connected_sockets_have_nodelay() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = listener.incoming(ServerSecurity::Plaintext);
        let client = connect_tcp(addr).await.unwrap();
        let server = incoming.next().await.unwrap().unwrap();
        let server = server.tcp().unwrap();
        assert!(
            server.nodelay().unwrap(),
            "accepted socket lacks TCP_NODELAY"
        );
        assert!(
            client.nodelay().unwrap(),
            "connected socket lacks TCP_NODELAY"
        );
    }

    #[tokio::test]
    async fn the_local_socket_names_its_peers_and_replaces_only_stale_sockets() {
        use std::os::unix::fs::PermissionsExt as _;
        use tonic::transport::server::Connected as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.sock");
        let tcp = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let local = bind_local(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666, "every local user may connect");

        let mut incoming = tcp.incoming_with_local(ServerSecurity::Plaintext, Some(local));
        let mut connections = Vec::new();
        for _ in 0..2 {
            let (client, accepted) = tokio::join!(UnixStream::connect(&path), incoming.next());
            client.unwrap();
            let conn = accepted.unwrap().unwrap();
            assert!(conn.tcp().is_none());
            let PeerInfo::Local(peer) = conn.connect_info() else {
                panic!("a local connection reported {:?}", conn.connect_info());
            };
            let uid = nix::unistd::getuid().as_raw();
            assert_eq!((peer.uid, peer.gid), (uid, nix::unistd::getgid().as_raw()));
            assert_eq!(peer.user, user_name_of(uid));
            assert!(peer.connection > 0 && peer.connection % 2 == 0);
            connections.push(peer.connection);
        }
        assert_ne!(connections[0], connections[1]);
        // TCP connections still come through the same stream.
        let (client, accepted) = tokio::join!(connect_tcp(tcp_addr(&incoming)), incoming.next());
        client.unwrap();
        let info = accepted.unwrap().unwrap().connect_info();
        assert!(matches!(info, PeerInfo::Tcp(_)), "{info:?}");

        // A live socket is not taken over (the check connects: last, so it queues no
        // connection ahead of the ones above).
        let taken = bind_local(&path).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse, "{taken}");

        // The server is gone: its socket is stale and the next server takes its place.
        drop(incoming);
        drop(bind_local(&path).unwrap());
        // Anything that is not a socket is left alone.
        let file = dir.path().join("notes");
        std::fs::write(&file, "keep").unwrap();
        let refused = bind_local(&file).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists, "{refused}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    }

    fn tcp_addr(incoming: &Incoming) -> SocketAddr {
        incoming.listener.local_addr().unwrap()
    }

    #[tokio::test]
    async fn channel_connections_have_nodelay_on_the_server_end() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
        // `connect` completes the TCP handshake before it returns; the HTTP/2 preface
        // follows on the same socket.
        let (channel, accepted) = tokio::join!(
            connect(&endpoint, &ClientSecurity::Plaintext),
            listener.accept()
        );
        channel.unwrap();
        let (server, _) = accepted.unwrap();
        assert!(server.nodelay().unwrap());
    }

    #[tokio::test]
    async fn the_connector_sets_nodelay_and_reads_ipv6_literals() {
        let listener = match bind("[::1]:0".parse().unwrap()).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "SKIP the_connector_sets_nodelay_and_reads_ipv6_literals: no IPv6 loopback ({e})"
                );
                return;
            }
        };
        let addr = listener.local_addr().unwrap();
        let uri: Uri = format!("http://[::1]:{}", addr.port()).parse().unwrap();
        let mut plain = Connector::new(&ClientSecurity::Plaintext, None);
        let (io, accepted) = tokio::join!(plain.call(uri), listener.accept());
        assert!(io.unwrap().inner().tcp().unwrap().nodelay().unwrap());
        assert!(accepted.unwrap().0.nodelay().unwrap());
        let no_port: Uri = "http://[::1]".parse().unwrap();
        assert!(plain.call(no_port).await.is_err());
    }

    #[test]
    fn the_message_timeout_is_a_minute_unless_set_to_whole_seconds() {
        assert_eq!(message_timeout_from(None), Duration::from_secs(60));
        assert_eq!(message_timeout_from(Some("5")), Duration::from_secs(5));
        assert_eq!(message_timeout_from(Some(" 7 ")), Duration::from_secs(7));
        for bad in ["0", "-3", "1.5", "soon", ""] {
            assert_eq!(
                message_timeout_from(Some(bad)),
                Duration::from_secs(60),
                "{bad}"
            );
        }
    }

    /// A CA and a server certificate for 127.0.0.1 in `dir`; the server and client configs.
    fn tls_pair(dir: &std::path::Path) -> (ServerSecurity, ClientSecurity) {
        let ca = crate::tls::ca::ClusterCa::load_or_create(&dir.join("ca")).unwrap();
        ca.write_server_dir(&dir.join("srv"), &["127.0.0.1".into()])
            .unwrap();
        let server = crate::tls::server_config(
            &dir.join("srv").join(crate::tls::CERT_FILE),
            &dir.join("srv").join(crate::tls::KEY_FILE),
        )
        .unwrap();
        let client = crate::tls::client_config(&dir.join("ca").join(crate::tls::CA_FILE)).unwrap();
        (ServerSecurity::Tls(server), ClientSecurity::Tls(client))
    }

    fn tls_connector(security: &ClientSecurity) -> Connector {
        Connector::new(security, None)
    }

    #[tokio::test]
    async fn tls_round_trip_and_refusals() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let dir = tempfile::tempdir().unwrap();
        let (server, client) = tls_pair(dir.path());
        let other = tempfile::tempdir().unwrap();
        let (_, wrong_ca) = tls_pair(other.path());

        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = listener.incoming(server);
        // A silent plain-text client and one with the wrong CA do not hold up the listener.
        let silent = connect_tcp(addr).await.unwrap();
        let uri: Uri = format!("http://{addr}").parse().unwrap();
        let (refused, _) = tokio::join!(tls_connector(&wrong_ca).call(uri.clone()), async {
            // The server's half of the failed handshake ends in a skip, not an item.
            tokio::time::timeout(Duration::from_millis(300), incoming.next())
                .await
                .ok()
        });
        let err = refused.expect_err("a client with another CA connected");
        assert!(err.to_string().contains("certificate"), "{err}");

        let (io, accepted) = tokio::join!(tls_connector(&client).call(uri), incoming.next());
        let mut io = io.unwrap().into_inner();
        let mut conn = accepted.unwrap().unwrap();
        assert!(matches!(conn, ServerConn::Tls(_)));
        assert!(conn.tcp().unwrap().nodelay().unwrap() && io.tcp().unwrap().nodelay().unwrap());
        io.write_all(b"ping").await.unwrap();
        io.flush().await.unwrap();
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        drop(silent);
    }

    /// A step service certified for node `kn-a` only (no address), as the operator issues
    /// it: dialled at 127.0.0.1, it is accepted as `kn-a` and refused as any other node or
    /// as its address.
    #[tokio::test]
    async fn a_server_is_verified_by_the_name_asked_for_not_the_address_dialled() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let dir = tempfile::tempdir().unwrap();
        let ca = crate::tls::ca::ClusterCa::load_or_create(&dir.path().join("ca")).unwrap();
        let srv = dir.path().join("kn-a");
        ca.write_server_dir(&srv, &["kn-a".into()]).unwrap();
        let server = crate::tls::server_config(
            &srv.join(crate::tls::CERT_FILE),
            &srv.join(crate::tls::KEY_FILE),
        )
        .unwrap();
        let client = ClientSecurity::Tls(
            crate::tls::client_config(&dir.path().join("ca").join(crate::tls::CA_FILE)).unwrap(),
        );
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = listener.incoming(ServerSecurity::Tls(server));
        // The server side runs on its own, so refused handshakes complete (and are skipped).
        let (tx, mut served) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            while let Some(conn) = incoming.next().await {
                if tx.send(conn).await.is_err() {
                    break;
                }
            }
        });
        let uri: Uri = format!("http://{addr}").parse().unwrap();

        let refused = |name: Option<&'static str>| {
            let mut c = Connector::new(&client, name);
            let uri = uri.clone();
            async move { c.call(uri).await.map(|_| ()) }
        };
        for wrong in [Some("kn-b"), None, Some("127.0.0.1")] {
            let err = refused(wrong)
                .await
                .expect_err(&format!("a certificate for kn-a passed as {wrong:?}"));
            assert!(err.to_string().contains("certificate"), "{wrong:?}: {err}");
        }
        let err = refused(Some("not a name")).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");

        let mut right = Connector::new(&client, Some("kn-a"));
        let io = right.call(uri).await;
        let mut io = io.expect("kn-a refused at its address").into_inner();
        let mut conn = served.recv().await.unwrap().unwrap();
        io.write_all(b"ping").await.unwrap();
        io.flush().await.unwrap();
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }

    #[tokio::test]
    async fn a_plain_text_client_gets_no_connection_from_a_tls_listener() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let dir = tempfile::tempdir().unwrap();
        let (server, _) = tls_pair(dir.path());
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = listener.incoming(server);
        let mut plain = connect_tcp(addr).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        // The stream yields nothing for it, and the server closes the socket.
        let served = tokio::time::timeout(Duration::from_millis(500), incoming.next()).await;
        assert!(served.is_err(), "a plain-text client was served");
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut buf))
            .await
            .expect("the server kept the plain-text socket open");
        // Closed (possibly after a TLS alert record, never an HTTP/2 frame).
        assert!(read.is_err() || buf.is_empty() || buf[0] == 0x15, "{buf:?}");
    }
}
