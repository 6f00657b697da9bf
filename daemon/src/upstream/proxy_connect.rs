//! A tunnel to a destination through the operator's proxy: `CONNECT host:port` (hyper's
//! HTTP/1.1 client, its upgrade for the tunnel). What runs inside is ours: TLS to the origin is
//! verified by us as on a direct connection, whatever the proxy is.

use http::{header, Method, Request, StatusCode};
use http_body_util::Empty;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::{authority, UpstreamProxy};

/// Why the proxy gave no tunnel.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TunnelError {
    #[error("it answered CONNECT with {0}{hint}", hint = hint(*.0))]
    Refused(StatusCode),
    #[error("the CONNECT exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("{0:?} is not a destination CONNECT can name")]
    Target(String),
}

fn hint(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
            " (give credentials in upstream.proxy: http://user:password@host:port)"
        }
        _ => "",
    }
}

/// Asks `proxy`, over `tcp` (a connection to it), for a tunnel to `host:port`.
pub(crate) async fn open(
    proxy: &UpstreamProxy,
    tcp: TcpStream,
    host: &str,
    port: u16,
) -> Result<TokioIo<Upgraded>, TunnelError> {
    let target = authority(host, port);
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("CONNECT exchange with the upstream proxy ended: {e}");
        }
    });
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(target.as_str())
        .header(header::HOST, target.as_str())
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|_| TunnelError::Target(target.clone()))?;
    if let Some(auth) = proxy.authorization() {
        req.headers_mut().insert(header::PROXY_AUTHORIZATION, auth);
    }
    let resp = send.send_request(req).await?;
    if !resp.status().is_success() {
        return Err(TunnelError::Refused(resp.status()));
    }
    Ok(TokioIo::new(hyper::upgrade::on(resp).await?))
}
