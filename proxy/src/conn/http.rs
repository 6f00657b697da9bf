//! Serving HTTP (1.1 or 2) on a client connection, decrypted or plain, into the pipeline.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::Instrument;

use crate::conn::ConnCtx;
use crate::pipeline;
use crate::proxy::Proxy;

/// Which HTTP versions the client may speak on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HttpVersions {
    /// ALPN said http/1.1 (or said nothing over TLS).
    Http1,
    /// ALPN said h2.
    Http2,
    /// Plain TCP: HTTP/1.x, or HTTP/2 with prior knowledge.
    Any,
}

pub(super) async fn serve_http<S>(
    proxy: Arc<Proxy>,
    ctx: Arc<ConnCtx>,
    io: S,
    versions: HttpVersions,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = proxy.limits.clone();
    // Plain connections are counted as h1: HTTP/2 with prior knowledge is rare there.
    let _open = proxy.metrics.connection(match versions {
        HttpVersions::Http2 => crate::control::metrics::Protocol::H2,
        HttpVersions::Http1 | HttpVersions::Any => crate::control::metrics::Protocol::H1,
    });
    let svc = service_fn(move |req| {
        let proxy = proxy.clone();
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(pipeline::handle(proxy, ctx, req).await) }
    });
    let mut builder = auto::Builder::new(SpanExecutor);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256);
    let builder = match versions {
        HttpVersions::Http1 => builder.http1_only(),
        HttpVersions::Http2 => builder.http2_only(),
        HttpVersions::Any => builder,
    };
    if let Err(e) = builder
        .serve_connection_with_upgrades(TokioIo::new(io), svc)
        .await
    {
        tracing::debug!("client connection ended: {e}");
    }
}

/// Spawns hyper's per-stream HTTP/2 tasks inside the connection's tracing span, so their log
/// lines stay attributable to the connection.
#[derive(Clone, Copy)]
struct SpanExecutor;

impl<F> hyper::rt::Executor<F> for SpanExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        tokio::spawn(fut.in_current_span());
    }
}
