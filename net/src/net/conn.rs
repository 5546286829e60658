//! One connection type per side (TCP in plain text, TCP with TLS, or the controller's local
//! Unix socket), so a server or client is the same code whichever its transport is.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A connection a server accepted.
#[derive(Debug)]
pub enum ServerConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// On the local Unix socket; the kernel named the peer ([`LocalPeer`]).
    Local(UnixStream, LocalPeer),
}

/// A connection a client opened.
#[derive(Debug)]
pub enum ClientConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Local(UnixStream),
}

/// Who is at the other end of a connection on the local socket, as the kernel says
/// (`SO_PEERCRED` at accept time), never as the client claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPeer {
    pub uid: u32,
    pub gid: u32,
    /// The user name of `uid` in this host's password database (the uid if it has none).
    pub user: String,
    /// Unique per accepted connection in this process (the replay cache's connection key).
    pub connection: u64,
}

/// What a request knows of its connection; tonic puts it in every request's extensions
/// (`request.extensions().get::<PeerInfo>()`).
#[derive(Debug, Clone)]
pub enum PeerInfo {
    Tcp(TcpConnectInfo),
    Local(LocalPeer),
}

impl ServerConn {
    /// The TCP socket underneath (`None` on the local socket).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ServerConn::Plain(s) => Some(s),
            ServerConn::Tls(s) => Some(s.get_ref().0),
            ServerConn::Local(..) => None,
        }
    }
}

impl ClientConn {
    /// The TCP socket underneath (`None` on the local socket).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ClientConn::Plain(s) => Some(s),
            ClientConn::Tls(s) => Some(s.get_ref().0),
            ClientConn::Local(_) => None,
        }
    }
}

/// Requests see their peer: its address over TCP (the replay cache keys on it), the
/// kernel's word on the local socket.
impl Connected for ServerConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        match self {
            ServerConn::Plain(s) => PeerInfo::Tcp(s.connect_info()),
            ServerConn::Tls(s) => PeerInfo::Tcp(s.get_ref().0.connect_info()),
            ServerConn::Local(_, peer) => PeerInfo::Local(peer.clone()),
        }
    }
}

/// Delegates every I/O call to the variant's stream (both are `Unpin`).
macro_rules! delegate_io {
    ($ty:ident) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                    $ty::Local(s, ..) => Pin::new(s).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                    $ty::Local(s, ..) => Pin::new(s).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                    $ty::Local(s, ..) => Pin::new(s).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $ty::Plain(s) => s.is_write_vectored(),
                    $ty::Tls(s) => s.is_write_vectored(),
                    $ty::Local(s, ..) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_flush(cx),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                    $ty::Local(s, ..) => Pin::new(s).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                    $ty::Local(s, ..) => Pin::new(s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(ServerConn);
delegate_io!(ClientConn);
