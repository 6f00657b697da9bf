//! The metrics listener: `GET /metrics` in the Prometheus text format, nothing else. It
//! carries counts and names only (rules, secrets, hosts named in policy), never a value.

use std::convert::Infallible;
use std::sync::Arc;

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::proxy::Proxy;

pub(crate) async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(answer(&proxy, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!("metrics connection ended: {e}");
            }
        });
    }
}

fn answer(proxy: &Proxy, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status, ctype, body: Vec<u8>| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, ctype)
            .body(Full::new(Bytes::from(body)))
            .unwrap_or_default()
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            b"only /metrics here\n".to_vec(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Vec::new());
    }
    let m = &proxy.metrics;
    m.tls
        .sync_cert_cache(proxy.leaves.hits(), proxy.leaves.misses());
    reply(
        StatusCode::OK,
        "text/plain; version=0.0.4; charset=utf-8",
        m.encode(),
    )
}
