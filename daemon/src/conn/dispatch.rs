//! One client connection after its destination is known: decide it as raw TCP first (the
//! policy needs nothing else), then read the first bytes and hand the stream to TLS
//! interception, the HTTP server, or the raw relay.
//!
//! A server that speaks first (SMTP, MySQL, FTP, POP3, IMAP) gets nothing from its client
//! until it greets, so waiting for the client's first bytes would delay it. When raw TCP to
//! the destination is allowed and no rule for HTTP could apply there (so what the client
//! speaks cannot change the decision), the connection is relayed at once. When rules for
//! HTTP could apply too, the client gets `limits.server_first_wait` (short: a client-first
//! protocol sends its first bytes right after connecting) before it is taken for a
//! server-first one. When raw TCP is refused (or only report mode lets it through), it has
//! `limits.first_bytes_timeout` to show that it speaks HTTP or TLS.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::classify::{classify, ClassifyError, Kind};
use super::http::{serve_http, server_head_cap, HttpVersions};
use super::intercept::intercept;
use super::opaque::{self, relay_opaque};
use super::passthrough;
use super::{ConnCtx, DestHost};
use crate::proxy::Proxy;
use crate::read_side::ReadSide;

pub(crate) async fn serve_stream<S>(proxy: Arc<Proxy>, ctx: ConnCtx, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tcp = opaque::decide(&proxy, &ctx);
    let name = match &ctx.dest.host {
        DestHost::Name(n) => Some(n.as_str()),
        DestHost::Ip(_) => tcp.name(),
    };
    let http_rules = tcp.policy().http_rule_may_match(name, ctx.dest.port);
    if tcp.allowed_by_policy() && !http_rules {
        return relay_opaque(proxy, ctx, tcp, stream).await;
    }
    let limits = &proxy.limits;
    let wait = if tcp.allowed_by_policy() {
        limits.server_first_wait
    } else {
        limits.first_bytes_timeout
    };
    let (kind, prefix) = match classify(&mut stream, wait, server_head_cap(limits)).await {
        Ok(found) => found,
        // Silent: a server-first protocol, decided as raw TCP.
        Err(ClassifyError::Timeout { got, .. }) => (Kind::Other, got),
        // Gone before it said anything that could be decided (a connection opened and
        // dropped, as happy-eyeballs losers are): nothing was asked, nothing relayed.
        Err(e) => {
            tracing::debug!("closing before classification: {e}");
            return;
        }
    };
    let stream = ReadSide::prefixed(prefix.freeze(), stream);
    match kind {
        Kind::Tls if tcp.policy().has_passthrough() => {
            passthrough::serve(proxy, ctx, tcp.into_policy(), stream).await
        }
        Kind::Tls => intercept(proxy, ctx, stream).await,
        Kind::Http => serve_http(proxy, Arc::new(ctx), stream, HttpVersions::Any).await,
        Kind::Other => relay_opaque(proxy, ctx, tcp, stream).await,
    }
}
