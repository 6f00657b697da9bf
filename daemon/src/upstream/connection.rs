//! A connection to an upstream as the dialer hands it over: a TCP connection of our own, or a
//! tunnel through the operator's proxy (`[upstream] proxy`). Both are byte streams to the
//! destination; TLS and HTTP run over either the same way.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub(crate) enum Connection {
    Direct(TcpStream),
    /// A `CONNECT` tunnel through the operator's proxy.
    Tunnel(TokioIo<Upgraded>),
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Direct(s) => Pin::new(s).poll_read(cx, buf),
            Connection::Tunnel(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Direct(s) => Pin::new(s).poll_write(cx, buf),
            Connection::Tunnel(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Direct(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Connection::Tunnel(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Direct(s) => s.is_write_vectored(),
            Connection::Tunnel(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Direct(s) => Pin::new(s).poll_flush(cx),
            Connection::Tunnel(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Direct(s) => Pin::new(s).poll_shutdown(cx),
            Connection::Tunnel(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
