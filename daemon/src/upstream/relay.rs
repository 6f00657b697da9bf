//! Relaying a tunnel (raw TCP, an upgraded connection) byte for byte, both ways, until
//! either side closes or nothing moves for the idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use crate::read_side::{OnRead, ReadSide};
use crate::record::End;
pub(crate) use crate::record::Relayed;

/// Copies both ways until either side closes, nothing moves for `idle`, or `stop` resolves
/// (a policy change revoked the tunnel). `client` is the agent's side. Counts what moved
/// whatever ends it.
pub(crate) async fn relay<A, B, S>(client: A, upstream: B, idle: Duration, stop: S) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    S: std::future::Future,
{
    let activity = Activity::new();
    let mut a = Watched::new(client, &activity);
    let mut b = Watched::new(upstream, &activity);
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    let (end, error) = match supervise(copy, &activity, idle, stop).await {
        Ok(Ok(_)) => (End::Closed, None),
        Ok(Err(e)) => (End::Error, Some(e)),
        Err(end) => (end, None),
    };
    Relayed {
        up: a.read,
        down: b.read,
        end,
        error,
    }
}

/// When a byte last moved either way, shared by a tunnel's `Watched` streams.
#[derive(Clone)]
pub(crate) struct Activity {
    epoch: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            epoch: Instant::now(),
            last_ms: Arc::default(),
        }
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

/// Runs `work` until it ends (`Ok`), nothing moves for `idle` (`Err(IdleTimeout)`), or
/// `stop` resolves (`Err(Revoked)`).
pub(crate) async fn supervise<F, S>(
    work: F,
    activity: &Activity,
    idle: Duration,
    stop: S,
) -> Result<F::Output, End>
where
    F: std::future::Future,
    S: std::future::Future,
{
    tokio::pin!(work);
    tokio::pin!(stop);
    loop {
        let quiet_since = activity.last();
        tokio::select! {
            out = &mut work => return Ok(out),
            _ = &mut stop => return Err(End::Revoked),
            _ = tokio::time::sleep_until(quiet_since + idle) => {
                if activity.last() == quiet_since {
                    return Err(End::IdleTimeout);
                }
            }
        }
    }
}

/// Counts the bytes read from a stream (`read`) and records when the last arrived.
pub(crate) type Watched<S> = ReadSide<S, Activity>;

impl<S> ReadSide<S, Activity> {
    pub(crate) fn new(inner: S, activity: &Activity) -> Watched<S> {
        ReadSide::watched(Bytes::new(), inner, activity.clone())
    }
}

impl OnRead for Activity {
    fn on_read(&self) {
        self.touch();
    }
}

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
