//! Opaque (non-HTTP) TCP: decided on the destination alone, then relayed byte for byte with
//! an idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use crate::conn::ConnCtx;
use crate::policy::{Action, RequestFacts, Scheme};
use crate::state::Proxy;

pub async fn relay_opaque<S>(proxy: Arc<Proxy>, ctx: ConnCtx, client: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = ctx.dest.host.to_string();
    // A name can carry a secret value too (to whoever answers the DNS query for it); opaque
    // streams bind no secret, so any value or placeholder in the name is refused.
    let secrets = proxy.vault.current();
    let shown = secrets.redact(&host);
    if let Some(m) = secrets.matcher() {
        if m.find_iter(host.as_bytes()).next().is_some() || shown != host {
            tracing::warn!(
                decision = "deny",
                error_code = "secret_leak",
                "opaque TCP to {shown}:{} refused: the name carries a secret",
                ctx.dest.port
            );
            return;
        }
    }
    let policy = proxy.policy();
    let decision = policy.decide(&RequestFacts {
        host: &host,
        port: ctx.dest.port,
        scheme: Scheme::Tcp,
        method: None,
        path: None,
    });
    let rule = decision.rule_id.as_deref().unwrap_or("(default)");
    // An opaque stream cannot be held for approval: `ask` refuses it like `deny`.
    if decision.action != Action::Allow {
        tracing::info!(
            decision = "deny",
            rule,
            "opaque TCP to {} refused: {}",
            ctx.dest,
            decision.explanation
        );
        return;
    }
    let (upstream, addr) = match proxy.dialer.dial(&host, ctx.dest.port).await {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(decision = "allow", rule, "opaque TCP to {}: {e}", ctx.dest);
            return;
        }
    };
    tracing::info!(decision = "allow", rule, upstream = %addr, "opaque TCP to {}", ctx.dest);
    let _open = proxy.metrics.connection(crate::metrics::Protocol::Tcp);
    match relay(client, upstream, proxy.limits.tunnel_idle_timeout).await {
        Ok((up, down)) => tracing::debug!(bytes_up = up, bytes_down = down, "opaque TCP closed"),
        Err(e) => tracing::debug!("opaque TCP ended: {e}"),
    }
}

/// Copies both ways until either side closes, or nothing moves for `idle`.
pub async fn relay<A, B>(a: A, b: B, idle: Duration) -> io::Result<(u64, u64)>
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
