//! Serving HTTP (1.1 or 2) on a client connection, decrypted or plain, into the pipeline.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use std::future::Future;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::Instrument;

use super::watchdog::{serve_until_expired, watched, Activity};
use crate::pipeline::record;
use crate::record::{ErrorCode, Protocol, Record, Refusal};

use crate::body::ProxyBody;
use crate::config::Limits;
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
    let _open = proxy.metrics.connections.open(match versions {
        HttpVersions::Http2 => Protocol::H2,
        HttpVersions::Http1 | HttpVersions::Any => Protocol::H1,
    });
    let started = Instant::now();
    let handle = {
        let (proxy, ctx) = (proxy.clone(), ctx.clone());
        move |req| {
            // Boxed: the pipeline's future is large, and hyper moves the service future
            // (into each HTTP/2 stream's task, among others); a pointer moves for free.
            Box::pin(pipeline::handle(proxy.clone(), ctx.clone(), req))
        }
    };
    let served = serve_watched(&limits, io, versions, handle);
    // Each stream h2 answered with its own 431 (a head over the cap): recorded as HTTP/1.1's.
    let served = super::h2_own_431::counting(served, |n| {
        for _ in 0..n {
            let (proxy, ctx) = (proxy.clone(), ctx.clone());
            let why = format!(
                "the HTTP/2 layer answered a stream 431 and reset it: its request head was \
                 over the server's cap of {} bytes (twice limits.max_header_bytes)",
                server_head_cap(&limits)
            );
            tokio::spawn(async move {
                let code = ErrorCode::HeadTooLarge;
                refused_by_server(&proxy, &ctx, code, Some(431), why, started).await;
            });
        }
    })
    .await;
    if let Err(e) = served {
        match e.downcast_ref::<hyper::Error>() {
            Some(h) if h.is_parse() => unparsed(&proxy, &ctx, h, started).await,
            Some(h) => match closed_by_h2(h) {
                Some(reason) => {
                    let why = if reason == h2::Reason::ENHANCE_YOUR_CALM {
                        format!(
                            "the HTTP/2 connection was closed (GOAWAY ENHANCE_YOUR_CALM): the \
                             client went past one of the HTTP/2 layer's abuse bounds (a header \
                             block far over the server's cap of {} bytes, or a flood of resets \
                             or frames)",
                            server_head_cap(&limits)
                        )
                    } else {
                        format!(
                            "the HTTP/2 connection was closed (GOAWAY {reason:?}): the client \
                             broke the protocol"
                        )
                    };
                    let code = ErrorCode::BadRequest;
                    refused_by_server(&proxy, &ctx, code, None, why, started).await;
                }
                None => tracing::debug!("client connection ended: {e}"),
            },
            None => tracing::debug!("client connection ended: {e}"),
        }
    }
}

/// Serves HTTP on the client's `io`, each request answered by `handle`, until the connection
/// ends or the watchdog closes it (idle, or a head too slow): the hyper server set-up of every
/// listener. Returns hyper's error.
pub(super) async fn serve_watched<S, H, F>(
    limits: &Limits,
    io: S,
    versions: HttpVersions,
    handle: H,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let activity = Activity::new(versions != HttpVersions::Http2);
    let svc = {
        let activity = activity.clone();
        service_fn(move |req| {
            let in_flight = activity.start();
            let answer = handle(req);
            async move {
                let resp = answer.await;
                // In flight until hyper has sent (or dropped) the whole body.
                Ok::<_, Infallible>(resp.map(|b| crate::body::guarded(b, in_flight)))
            }
        })
    };
    let mut builder = auto::Builder::new(SpanExecutor);
    builder
        .http1()
        .timer(TokioTimer::new())
        // `watchdog` times heads: hyper's timer would also cut idle keep-alive.
        .header_read_timeout(None)
        .max_buf_size(server_head_cap(limits))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(server_head_cap(limits)).unwrap_or(u32::MAX))
        .max_concurrent_streams(256);
    let builder = match versions {
        HttpVersions::Http1 => builder.http1_only(),
        HttpVersions::Http2 => builder.http2_only(),
        HttpVersions::Any => builder,
    };
    let io = TokioIo::new(watched(io, activity.clone()));
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    serve_until_expired(conn.as_mut(), &activity, limits, |c| c.graceful_shutdown()).await
}

/// Why the HTTP/2 layer closed the connection (a GOAWAY it sent) for what the client sent,
/// if it did; `None` when the client or the I/O ended it. (h2 drops the GOAWAY's debug data
/// from the error it returns, so a header block over its bound and a reset flood both read
/// as ENHANCE_YOUR_CALM.)
fn closed_by_h2(e: &hyper::Error) -> Option<h2::Reason> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cur {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return (h2.is_go_away() && h2.is_library())
                .then(|| h2.reason())
                .flatten();
        }
        cur = c.source();
    }
    None
}

/// The request head size the HTTP server itself accepts: twice `limits.max_header_bytes`, so
/// that a head over the limit reaches the pipeline, which refuses it with the JSON 431 every
/// refusal has (`pipeline::target`), over HTTP/1.1 and HTTP/2 alike. Only a head over this
/// cap is refused by the server itself: HTTP/1.1 gets hyper's bare 431 and the connection
/// closes (recorded); over HTTP/2, h2 answers that stream a bare 431 and resets it, the
/// connection staying usable (recorded too, through `h2_own_431`), and a header block far
/// beyond it (more CONTINUATION frames than the cap needs,
/// or four times the cap decoded) makes h2 close the connection with GOAWAY
/// ENHANCE_YOUR_CALM (recorded, as `bad_request`). The cap bounds what one request head holds in
/// memory; raising it to widen the JSON 431 would let each of a connection's streams hold
/// that much.
pub(super) fn server_head_cap(limits: &crate::config::Limits) -> usize {
    limits.max_header_bytes.saturating_mul(2)
}

/// A request the HTTP server could not parse (malformed; a head over its own cap or with more
/// than 100 fields): hyper answered it (400, 414 or 431, no body) and closed; this records
/// it.
pub(super) async fn unparsed(
    proxy: &Arc<Proxy>,
    ctx: &ConnCtx,
    e: &hyper::Error,
    started: Instant,
) {
    let code = if e.is_parse_too_large() {
        ErrorCode::HeadTooLarge
    } else {
        ErrorCode::BadRequest
    };
    let why = format!("the HTTP server refused a request it could not parse: {e}");
    refused_by_server(proxy, ctx, code, Some(code.status().as_u16()), why, started).await;
}

/// Records a refusal by the HTTP server itself (no request reached the pipeline): `status`
/// is what the server answered, `None` when it closed the connection instead.
async fn refused_by_server(
    proxy: &Arc<Proxy>,
    ctx: &ConnCtx,
    code: ErrorCode,
    status: Option<u16>,
    why: String,
    started: Instant,
) {
    let at = record::stamp(&proxy.policy(), None);
    let protocol = if ctx.tls.is_some() {
        Protocol::Https
    } else {
        Protocol::Http
    };
    let refusal = Refusal::new(code, why);
    let record = Record {
        status,
        ms: record::ms_since(started),
        ..ctx
            .base(&proxy.vault.current())
            .refused(protocol, &refusal, at)
    };
    record::connection(proxy, record).await;
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
