//! Relaying a tunnel (raw TCP, an upgraded connection) byte for byte, both ways, until
//! either side closes or nothing moves for the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Copies both ways until either side closes, or nothing moves for `idle`.
pub(crate) async fn relay<A, B>(a: A, b: B, idle: Duration) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut a = Watched::new(a, epoch, last.clone());
    let mut b = Watched::new(b, epoch, last.clone());
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        let quiet_since = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
        tokio::select! {
            r = &mut copy => return r,
            _ = tokio::time::sleep_until(quiet_since + idle) => {
                let now_last = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
                if now_last == quiet_since {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
                }
            }
        }
    }
}

/// Records when bytes last arrived on a stream.
struct Watched<S> {
    inner: S,
    epoch: Instant,
    last: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn new(inner: S, epoch: Instant, last: Arc<AtomicU64>) -> Self {
        Watched { inner, epoch, last }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            let ms = u64::try_from(this.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            this.last.store(ms, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
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

    #[tokio::test(start_paused = true)]
    async fn quiet_relay_times_out() {
        let (a, _a_peer) = tokio::io::duplex(64);
        let (b, _b_peer) = tokio::io::duplex(64);
        let err = relay(a, b, Duration::from_secs(30))
            .await
            .expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn bytes_flow_both_ways() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(a, b, Duration::from_secs(5)));
        a_peer.write_all(b"ping").await.expect("w");
        let mut got = [0u8; 4];
        b_peer.read_exact(&mut got).await.expect("r");
        assert_eq!(&got, b"ping");
        b_peer.write_all(b"pong").await.expect("w");
        a_peer.read_exact(&mut got).await.expect("r");
        assert_eq!(&got, b"pong");
        drop(a_peer);
        drop(b_peer);
        let (up, down) = relay.await.expect("join").expect("clean close");
        assert_eq!((up, down), (4, 4));
    }
}
