//! One client connection after its destination is known: decide it as raw TCP first (the
//! policy needs nothing else), then read the first bytes and hand the stream to TLS
//! interception, the HTTP server, or the raw relay.
//!
//! A server that speaks first (SMTP, MySQL, FTP, POP3, IMAP, SSH banners) gets nothing from
//! its client until it greets, so waiting for the client's first bytes would delay it. When
//! raw TCP to the destination is allowed and no HTTP request to it could be, the connection is
//! relayed at once; when both could be, the wait is `limits.server_first_wait` (short: a
//! client-first protocol sends its first bytes right after connecting); when raw TCP is
//! refused, the client has `limits.first_bytes_timeout` to show it speaks HTTP or TLS.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use super::classify::{classify, ClassifyError, Kind};
use super::http::{serve_http, HttpVersions};
use super::intercept::intercept;
use super::opaque::{self, relay_opaque};
use super::prefixed::Prefixed;
use super::{ConnCtx, DestHost};
use crate::proxy::Proxy;

pub(crate) async fn serve_stream<S>(proxy: Arc<Proxy>, ctx: ConnCtx, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tcp = opaque::decide(&proxy, &ctx);
    let name = match &ctx.dest.host {
        DestHost::Name(n) => Some(n.as_str()),
        DestHost::Ip(_) => None,
    };
    let http_possible = tcp.policy().may_allow_http(name, ctx.dest.port);
    if tcp.allowed() && !http_possible {
        return relay_opaque(proxy, ctx, tcp, stream).await;
    }
    let limits = &proxy.limits;
    let wait = if tcp.allowed() {
        limits.server_first_wait
    } else {
        limits.first_bytes_timeout
    };
    let (kind, prefix) = match classify(&mut stream, wait, limits.max_header_bytes).await {
        Ok(found) => found,
        // Silent: a server-first protocol, decided as raw TCP. Closed or failed before a byte
        // arrived: still a connection to that destination, decided the same way.
        Err(ClassifyError::Timeout { got, .. }) => (Kind::Other, got),
        Err(e) => {
            tracing::debug!("before classification: {e}");
            (Kind::Other, Default::default())
        }
    };
    let stream = Prefixed::new(prefix.freeze(), stream);
    match kind {
        Kind::Tls => intercept(proxy, ctx, stream).await,
        Kind::Http => serve_http(proxy, Arc::new(ctx), stream, HttpVersions::Any).await,
        Kind::Other => relay_opaque(proxy, ctx, tcp, stream).await,
    }
}
