//! A stream that first replays bytes already read from it. Classification has to read the
//! first bytes of a connection before it knows who should consume them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};

pub(super) struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(super) fn new(prefix: Bytes, inner: S) -> Prefixed<S> {
        Prefixed { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

crate::write_through::write_through!(Prefixed, inner);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn replays_prefix_then_reads_inner_and_writes_through() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut p = Prefixed::new(Bytes::from_static(b"GET "), a);
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
