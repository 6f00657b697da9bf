//! The explicit proxy listener: `CONNECT host:port` tunnels (then treated exactly like a
//! transparent connection to that destination) and absolute-URI plain HTTP requests. A user
//! the listener does not admit (`identity`) gets its JSON refusal to the first request, and
//! the connection is closed.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::accept::{admission, refused};
use super::dispatch::serve_stream;
use super::http::{serve_watched, server_head_cap, unparsed, HttpVersions};
use super::{ConnCtx, Dest, DestHost};
use crate::body::{self, ProxyBody};
use crate::pipeline;
use crate::pipeline::record;
use crate::pipeline::refusal::{self, Refusal};
use crate::pipeline::target::split_authority;
use crate::proxy::Proxy;
use crate::record::{ErrorCode, Protocol, Record};

pub(super) async fn serve_explicit(proxy: Arc<Proxy>, base: ConnCtx, stream: TcpStream) {
    let base = Arc::new(base);
    let limits = proxy.limits.clone();
    let started = Instant::now();
    let answer = {
        let (proxy, base) = (proxy.clone(), base.clone());
        move |req| handle(proxy.clone(), base.clone(), req)
    };
    let served = serve_watched(&limits, stream, HttpVersions::Http1, answer).await;
    if let Err(e) = served {
        match e.downcast_ref::<hyper::Error>() {
            Some(h) if h.is_parse() => unparsed(&proxy, &base, h, started).await,
            _ => tracing::debug!("explicit proxy connection ended: {e}"),
        }
    }
}

/// Answers the first request of a user the listener does not admit with `refusal` (its
/// record names the destination asked for), then closes. A client that asks nothing in
/// time, or nothing parsable, leaves one connection record with the refusal instead.
pub(super) async fn serve_refused(
    proxy: Arc<Proxy>,
    base: ConnCtx,
    stream: TcpStream,
    refusal: Refusal,
) {
    let base = Arc::new(base);
    let answered = Arc::new(AtomicBool::new(false));
    let limits = proxy.limits.clone();
    let svc = {
        let (proxy, base, refusal, answered) = (
            proxy.clone(),
            base.clone(),
            refusal.clone(),
            answered.clone(),
        );
        service_fn(move |req: Request<Incoming>| {
            let (proxy, base, refusal, answered) = (
                proxy.clone(),
                base.clone(),
                refusal.clone(),
                answered.clone(),
            );
            async move {
                answered.store(true, Ordering::Relaxed);
                let dest = destination(&req).unwrap_or(Dest {
                    host: DestHost::Name(String::new()),
                    port: 0,
                });
                let ctx = base.with_dest(dest, &proxy.vault.current());
                let mut resp = refuse_connect(&proxy, &ctx, &req, refusal).await;
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
                Ok::<_, Infallible>(resp)
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(false)
        .header_read_timeout(limits.first_request_timeout)
        .max_buf_size(server_head_cap(&limits))
        .serve_connection(TokioIo::new(stream), svc);
    let bound = limits.first_request_timeout + limits.header_read_timeout;
    match tokio::time::timeout(bound, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("refused explicit connection ended: {e}"),
        Err(_) => tracing::debug!("refused explicit connection timed out"),
    }
    if !answered.load(Ordering::Relaxed) {
        refused(&proxy, &base, refusal).await;
    }
}

async fn handle(
    proxy: Arc<Proxy>,
    base: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let dest = match destination(&req) {
        Ok(d) => d,
        Err(r) => {
            // No usable destination: the record names none (empty host and destination,
            // port 0), not the listener the client reached.
            let nowhere = Dest {
                host: DestHost::Name(String::new()),
                port: 0,
            };
            let nowhere = base.with_dest(nowhere, &proxy.vault.current());
            return refuse_connect(&proxy, &nowhere, &req, r).await;
        }
    };
    let ctx = base.with_dest(dest, &proxy.vault.current());
    if req.method() != Method::CONNECT {
        return pipeline::handle(proxy, Arc::new(ctx), req).await;
    }
    tracing::debug!(dest = %proxy.vault.current().redact(&ctx.dest.to_string()), "CONNECT");
    // The tunnel's contents are decided like a transparent connection's; the CONNECT head
    // itself is held to the same bound as every request head.
    if let Err(r) = pipeline::target::head_within(&req, proxy.limits.max_header_bytes) {
        return refuse_connect(&proxy, &ctx, &req, r).await;
    }
    // The tunnel outlives this HTTP connection's task, so it needs a slot and a seat in its
    // agent's budget of its own.
    let admitted = match admission(&proxy, &ctx) {
        Ok(a) => a,
        Err(r) => return refuse_connect(&proxy, &ctx, &req, r).await,
    };
    tokio::spawn(async move {
        let _admitted = admitted;
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => serve_stream(proxy, ctx, TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!("CONNECT upgrade failed: {e}"),
        }
    });
    let mut ok = Response::new(body::empty());
    *ok.status_mut() = StatusCode::OK;
    ok
}

/// Refuses a proxy request before any pipeline phase could take it (no usable destination,
/// a head over the limit, no slot for its tunnel), with the JSON body and a record like every
/// refusal.
async fn refuse_connect<B>(
    proxy: &Arc<Proxy>,
    ctx: &ConnCtx,
    req: &Request<B>,
    r: Refusal,
) -> Response<ProxyBody> {
    let secrets = proxy.vault.current();
    let policy = proxy.policy();
    let at = record::stamp(&policy, None);
    let id = at.id;
    let shown = record::shown(&secrets, r);
    let mut record = Record {
        method: Some(secrets.redact(req.method().as_str()).into_owned()),
        status: Some(shown.code.status().as_u16()),
        ..ctx
            .base(&secrets)
            .request(Protocol::Http, None, at)
            .refused(&shown)
    };
    if ctx.dest.port == 0 {
        record.dst = "".into();
    }
    record::connection(proxy, record).await;
    refusal::render(&shown, &id.to_string(), policy.hash())
}

/// Where a proxy request is headed: the CONNECT authority, or an `http://` absolute URI.
fn destination<B>(req: &Request<B>) -> Result<Dest, Refusal> {
    let bad = |m: &str| Refusal::new(ErrorCode::BadRequest, m);
    let Some(auth) = req.uri().authority() else {
        return Err(bad(
            "this is AgenShield's explicit proxy listener: send CONNECT host:port or an absolute http:// URI",
        ));
    };
    let (host, port) = split_authority(auth.as_str())?;
    let port = if req.method() == Method::CONNECT {
        port.ok_or_else(|| bad("CONNECT needs host:port"))?
    } else {
        match req.uri().scheme_str() {
            Some("http") => port.unwrap_or(80),
            _ => {
                return Err(bad(
                    "only http:// absolute URIs are proxied; use CONNECT for https",
                ))
            }
        }
    };
    let host = match host.parse::<IpAddr>() {
        Ok(ip) => DestHost::Ip(ip),
        Err(_) => DestHost::Name(host),
    };
    Ok(Dest { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, uri: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .expect("req")
    }

    #[test]
    fn connect_needs_a_port_and_keeps_names() {
        let d = destination(&req("CONNECT", "Api.Test:443")).expect("dest");
        assert_eq!(d.host, DestHost::Name("api.test".into()));
        assert_eq!(d.port, 443);
        assert!(destination(&req("CONNECT", "api.test")).is_err());
        let ip = destination(&req("CONNECT", "[::1]:8443")).expect("dest");
        assert_eq!(ip.host, DestHost::Ip("::1".parse().expect("ip")));
    }

    #[test]
    fn absolute_http_uri_defaults_to_port_80() {
        let d = destination(&req("GET", "http://a.test/x")).expect("dest");
        assert_eq!((d.host, d.port), (DestHost::Name("a.test".into()), 80));
        assert!(destination(&req("GET", "https://a.test/x")).is_err());
        assert!(destination(&req("GET", "/x")).is_err());
    }
}
