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
//! # Use
//!
//! - servers: `net::bind(addr).await?` then `.incoming()` into `serve_with_incoming_shutdown`
//!   (or `.accept()` for a hand-written protocol such as the metrics endpoint);
//! - clients: build a `tonic::transport::Endpoint` and `net::connect(&endpoint).await`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tonic::codegen::Service;
use tonic::transport::{Channel, Endpoint, Uri};

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

    /// The accepted connections as a stream for tonic's `serve_with_incoming*`.
    pub fn incoming(self) -> Incoming {
        Incoming {
            listener: self.inner,
            pause: None,
        }
    }
}

impl From<TcpListener> for Listener {
    fn from(inner: TcpListener) -> Self {
        Listener { inner }
    }
}

/// Accepted connections, each with `TCP_NODELAY`. Accept errors are passed on (tonic logs
/// and skips them); after one that says the process is out of descriptors or memory the
/// stream waits [`ACCEPT_BACKOFF`] before accepting again.
#[derive(Debug)]
pub struct Incoming {
    listener: TcpListener,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl tokio_stream::Stream for Incoming {
    type Item = io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(pause) = self.pause.as_mut() {
            ready!(pause.as_mut().poll(cx));
            self.pause = None;
        }
        match ready!(self.listener.poll_accept(cx)) {
            Ok((stream, _)) => {
                no_delay(&stream);
                Poll::Ready(Some(Ok(stream)))
            }
            Err(e) => {
                if out_of_resources(&e) {
                    self.pause = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
                Poll::Ready(Some(Err(e)))
            }
        }
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

/// Connects `endpoint` (its address, timeouts and HTTP/2 settings) over a socket made here.
pub async fn connect(endpoint: &Endpoint) -> Result<Channel, tonic::transport::Error> {
    endpoint.connect_with_connector(Connector).await
}

/// tonic's connector: resolves the URI's host and port and opens the socket.
#[derive(Debug, Clone, Copy)]
struct Connector;

impl Service<Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
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
            Ok(TokioIo::new(stream))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt as _;

    #[tokio::test]
    async fn accepted_and_connected_sockets_have_nodelay() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = listener.incoming();
        let client = connect_tcp(addr).await.unwrap();
        let server = incoming.next().await.unwrap().unwrap();
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
    async fn channel_connections_have_nodelay_on_the_server_end() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
        // `connect` completes the TCP handshake before it returns; the HTTP/2 preface
        // follows on the same socket.
        let (channel, accepted) = tokio::join!(connect(&endpoint), listener.accept());
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
        let (io, accepted) = tokio::join!(Connector.call(uri), listener.accept());
        assert!(io.unwrap().inner().nodelay().unwrap());
        assert!(accepted.unwrap().0.nodelay().unwrap());
        let no_port: Uri = "http://[::1]".parse().unwrap();
        assert!(Connector.call(no_port).await.is_err());
    }
}
