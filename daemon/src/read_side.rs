//! The one read-side stream wrapper: a stream that first replays bytes already read from it
//! (classification reads a connection's first bytes before it knows who should consume them),
//! then reads through, counting what each read gave and telling an observer that bytes
//! arrived (the HTTP watchdog's clock, a tunnel's idle timer). Every write goes through to the
//! wrapped stream unchanged (vectored writes included).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Told when bytes arrive.
pub(crate) trait OnRead {
    fn on_read(&self);
}

/// No one to tell.
impl OnRead for () {
    fn on_read(&self) {}
}

pub(crate) struct ReadSide<S, O = ()> {
    prefix: Bytes,
    inner: S,
    observer: O,
    /// Bytes read so far (the replayed ones included).
    pub read: u64,
}

impl<S> ReadSide<S> {
    /// `inner`, with `prefix` (read from it already) replayed first.
    pub(crate) fn prefixed(prefix: Bytes, inner: S) -> ReadSide<S> {
        ReadSide::watched(prefix, inner, ())
    }
}

impl<S, O> ReadSide<S, O> {
    /// `inner`, `prefix` replayed first, telling `observer` when bytes arrive.
    pub(crate) fn watched(prefix: Bytes, inner: S, observer: O) -> ReadSide<S, O> {
        ReadSide {
            prefix,
            inner,
            observer,
            read: 0,
        }
    }
}

impl<S: AsyncRead + Unpin, O: OnRead + Unpin> AsyncRead for ReadSide<S, O> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = if this.prefix.is_empty() {
            Pin::new(&mut this.inner).poll_read(cx, buf)
        } else {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            Poll::Ready(Ok(()))
        };
        let got = buf.filled().len() - before;
        if got > 0 {
            this.read += got as u64;
            this.observer.on_read();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin, O: Unpin> AsyncWrite for ReadSide<S, O> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn replays_prefix_then_reads_inner_and_writes_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut p = ReadSide::prefixed(Bytes::from_static(b"GET "), a);
        b.write_all(b"/ HTTP/1.1\r\n").await.expect("write");
        let mut got = vec![0u8; 16];
        p.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"GET / HTTP/1.1\r\n");
        p.write_all(b"ok").await.expect("write through");
        let mut back = [0u8; 2];
        b.read_exact(&mut back).await.expect("read back");
        assert_eq!(&back, b"ok");
    }
}
