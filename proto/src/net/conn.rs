//! One connection type per side, plain or TLS, so a server or client is the same code
//! whichever its transport is.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// A connection a server accepted.
#[derive(Debug)]
pub enum ServerConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection a client opened.
#[derive(Debug)]
pub enum ClientConn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl ServerConn {
    /// The TCP socket underneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ServerConn::Plain(s) => s,
            ServerConn::Tls(s) => s.get_ref().0,
        }
    }
}

impl ClientConn {
    pub fn tcp(&self) -> &TcpStream {
        match self {
            ClientConn::Plain(s) => s,
            ClientConn::Tls(s) => s.get_ref().0,
        }
    }
}

/// Requests see the peer's address either way (the replay cache keys on it).
impl Connected for ServerConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp().connect_info()
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
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $ty::Plain(s) => s.is_write_vectored(),
                    $ty::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_flush(cx),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                match self.get_mut() {
                    $ty::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    $ty::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(ServerConn);
delegate_io!(ClientConn);
