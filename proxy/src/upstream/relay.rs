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

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum End {
    /// One side closed.
    Closed,
    /// Nothing moved either way for the idle timeout.
    IdleTimeout,
    /// A read or write failed (a reset, say).
    Error,
    /// A policy change no longer allows it.
    Revoked,
}

/// What a relay moved, and how it ended.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// Bytes from the agent's side to the upstream's.
    pub up: u64,
    /// Bytes from the upstream's side to the agent's.
    pub down: u64,
    pub end: End,
    /// The failure, when `end` is `Error`.
    pub error: Option<io::Error>,
}

/// Copies both ways until either side closes, nothing moves for `idle`, or `stop` resolves
/// (a policy change revoked the tunnel). `client` is the agent's side. Counts what moved
/// whatever ends it.
pub(crate) async fn relay<A, B, S>(client: A, upstream: B, idle: Duration, stop: S) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    S: std::future::Future,
{
    tokio::pin!(stop);
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut a = Watched::new(client, epoch, last.clone());
    let mut b = Watched::new(upstream, epoch, last.clone());
    let (end, error) = {
        let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
        tokio::pin!(copy);
        loop {
            let quiet_since = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
            tokio::select! {
                r = &mut copy => break match r {
                    Ok(_) => (End::Closed, None),
                    Err(e) => (End::Error, Some(e)),
                },
                _ = &mut stop => break (End::Revoked, None),
                _ = tokio::time::sleep_until(quiet_since + idle) => {
                    let now_last = epoch + Duration::from_millis(last.load(Ordering::Relaxed));
                    if now_last == quiet_since {
                        break (End::IdleTimeout, None);
                    }
                }
            }
        }
    };
    Relayed {
        up: a.read,
        down: b.read,
        end,
        error,
    }
}

/// Counts the bytes read from a stream and records when the last arrived.
struct Watched<S> {
    inner: S,
    epoch: Instant,
    last: Arc<AtomicU64>,
    read: u64,
}

impl<S> Watched<S> {
    fn new(inner: S, epoch: Instant, last: Arc<AtomicU64>) -> Self {
        Watched {
            inner,
            epoch,
            last,
            read: 0,
        }
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
            this.read += (buf.filled().len() - before) as u64;
            let ms = u64::try_from(this.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            this.last.store(ms, Ordering::Relaxed);
        }
        r
    }
}

crate::write_through::write_through!(Watched, inner);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn quiet_relay_times_out_and_counts_what_moved() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        a_peer.write_all(b"hello").await.expect("w");
        let relay = tokio::spawn(relay(
            a,
            b,
            Duration::from_secs(30),
            std::future::pending::<()>(),
        ));
        let mut got = [0u8; 5];
        b_peer.read_exact(&mut got).await.expect("r");
        let relayed = relay.await.expect("join");
        assert_eq!(relayed.end, End::IdleTimeout);
        assert_eq!((relayed.up, relayed.down), (5, 0));
    }

    #[tokio::test]
    async fn bytes_flow_both_ways() {
        let (a, mut a_peer) = tokio::io::duplex(64);
        let (b, mut b_peer) = tokio::io::duplex(64);
        let relay = tokio::spawn(relay(
            a,
            b,
            Duration::from_secs(5),
            std::future::pending::<()>(),
        ));
        a_peer.write_all(b"ping").await.expect("w");
        let mut got = [0u8; 4];
        b_peer.read_exact(&mut got).await.expect("r");
        assert_eq!(&got, b"ping");
        b_peer.write_all(b"pong").await.expect("w");
        a_peer.read_exact(&mut got).await.expect("r");
        assert_eq!(&got, b"pong");
        drop(a_peer);
        drop(b_peer);
        let relayed = relay.await.expect("join");
        assert_eq!(relayed.end, End::Closed);
        assert_eq!((relayed.up, relayed.down), (4, 4));
    }
}
