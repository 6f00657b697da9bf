//! One client connection after its destination is known: classify the first bytes and hand
//! the stream to TLS interception, the HTTP server, or the opaque relay.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::classify::{classify, ClassifyError, Protocol};
use crate::conn::http::{serve_http, HttpVersions};
use crate::conn::intercept::intercept;
use crate::conn::opaque::relay_opaque;
use crate::conn::prefixed::Prefixed;
use crate::conn::ConnCtx;
use crate::proxy::Proxy;

pub(super) async fn handle_stream<S>(proxy: Arc<Proxy>, ctx: ConnCtx, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &proxy.limits;
    let (protocol, prefix) = match classify(
        &mut stream,
        limits.first_bytes_timeout,
        limits.max_header_bytes,
    )
    .await
    {
        Ok(found) => found,
        // A client that stays silent may be waiting for a server-speaks-first protocol
        // (SMTP, SSH banners...): decide it on the destination like any opaque stream.
        Err(ClassifyError::Timeout { .. }) => (Protocol::Other, Default::default()),
        Err(e) => {
            tracing::debug!("closing: {e}");
            return;
        }
    };
    let stream = Prefixed::new(prefix.freeze(), stream);
    match protocol {
        Protocol::Tls => intercept(proxy, ctx, stream).await,
        Protocol::Http => serve_http(proxy, Arc::new(ctx), stream, HttpVersions::Any).await,
        Protocol::Other => relay_opaque(proxy, ctx, stream).await,
    }
}
