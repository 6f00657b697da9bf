//! Forwarding an allowed request upstream through the pool (`pool.rs`: verified rustls, our
//! dialer, shared HTTP/2), streaming bodies both ways: the request's URI and Host rebuilt from
//! the checked target, hop-by-hop headers dropped both ways, upgrades handed back to the
//! pipeline, failures turned into what the agent is told (an `UpstreamError`).

use std::sync::Arc;

use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Version};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;

use crate::body::{self, ProxyBody};
use crate::config::Limits;
use crate::policy::Scheme;
use crate::upstream::dial::{DialError, Dialer};
use crate::upstream::error::UpstreamError;
use crate::upstream::pool::{Key, Pool, PoolError};
use crate::upstream::target::Target;

/// Forwards checked requests to their upstreams through the pool.
#[derive(Clone)]
pub(crate) struct Forwarder {
    pool: Arc<Pool>,
}

impl Forwarder {
    pub(crate) fn new(
        dialer: Arc<Dialer>,
        tls: rustls::ClientConfig,
        limits: &Limits,
        retries: prometheus::IntCounterVec,
    ) -> Forwarder {
        Forwarder {
            pool: Pool::new(dialer, tls, limits.upstream_idle_timeout, retries),
        }
    }

    /// Sends `req` to `target` with `path_and_query` as its request target; `upgrade`:
    /// it asks to switch protocols (see [`upgrade_token`]).
    pub(crate) async fn forward(
        &self,
        target: &Target,
        path_and_query: &str,
        mut req: Request<ProxyBody>,
        upgrade: bool,
    ) -> Result<Forwarded, UpstreamError> {
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let uri: http::Uri = format!(
            "{}://{}{}",
            target.scheme_str(),
            target.authority(),
            path_and_query
        )
        .parse()
        .map_err(UpstreamError::BadTarget)?;

        let (mut parts, req_body) = req.into_parts();
        let upgrade_proto = parts.headers.get(header::UPGRADE).cloned();
        strip_hop_by_hop(&mut parts.headers);
        // hyper writes Host (HTTP/1) or :authority (HTTP/2) from the URI we checked.
        parts.headers.remove(header::HOST);
        if let Some(proto) = &upgrade_proto {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, proto.clone());
        }
        parts.uri = uri;
        parts.version = Version::HTTP_11;
        let out = Request::from_parts(parts, req_body);

        let key = Key {
            tls: target.scheme == Scheme::Https,
            host: target.host.as_str().into(),
            port: target.port,
            shard: crate::runtime::shards::current(),
        };
        let mut resp = self
            .pool
            .send(&key, out, upgrade)
            .await
            .map_err(|e| failure(target, &e))?;

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client) = client_upgrade else {
                return Err(UpstreamError::UnaskedSwitch);
            };
            let upstream = hyper::upgrade::on(&mut resp);
            let (parts, _) = resp.into_parts();
            return Ok(Forwarded::Upgraded(
                Response::from_parts(parts, body::empty()),
                Upgrades { client, upstream },
            ));
        }

        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // The upstream's own reason phrase is never relayed (the agent gets the canonical one
        // for the status): it is free text no redaction reads, and nothing depends on it.
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
        Ok(Forwarded::Response(Response::from_parts(parts, body)))
    }
}

/// What an upstream answered.
pub(crate) enum Forwarded {
    Response(Response<ProxyBody>),
    /// It switched protocols (101): the response for the agent, and the two connections to
    /// join once the agent has it.
    Upgraded(Response<ProxyBody>, Upgrades),
}

/// Both sides of a protocol upgrade, resolving once each side has switched.
pub(crate) struct Upgrades {
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
}

impl Upgrades {
    /// The agent's and the upstream's upgraded connections.
    pub(crate) async fn join(self) -> hyper::Result<(TokioIo<Upgraded>, TokioIo<Upgraded>)> {
        let (c, u) = tokio::try_join!(self.client, self.upstream)?;
        Ok((TokioIo::new(c), TokioIo::new(u)))
    }
}

/// The protocols an HTTP/1.1 request asks to switch to (`Upgrade` with `Connection:
/// upgrade`), if it does: the header's value, shown lossily if it is not ASCII (the request
/// still counts as an upgrade).
pub(crate) fn upgrade_token<B>(req: &Request<B>) -> Option<String> {
    if req.version() != Version::HTTP_11
        || !connection_tokens(req.headers()).any(|t| t.eq_ignore_ascii_case("upgrade"))
    {
        return None;
    }
    let values: Vec<String> = req
        .headers()
        .get_all(header::UPGRADE)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
        .collect();
    if values.is_empty() {
        return None;
    }
    Some(values.join(", "))
}

/// Whether every protocol `offered` (an `Upgrade` value: comma-separated, with optional
/// `/version`s) is one of `allowed`. Any one not allowed refuses the lot: the upstream picks
/// which to switch to.
pub(crate) fn upgrade_allowed(offered: &str, allowed: &[String]) -> bool {
    let mut tokens = offered.split(',').map(str::trim).peekable();
    tokens.peek().is_some()
        && tokens.all(|t| !t.is_empty() && allowed.iter().any(|a| a.eq_ignore_ascii_case(t)))
}

fn connection_tokens(h: &HeaderMap) -> impl Iterator<Item = &str> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The hop-by-hop headers (RFC 9110 §7.6.1) that are removed whatever Connection says.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "keep-alive",
    "proxy-connection",
];

/// Removes the headers that describe one hop (RFC 9110 §7.6.1), including any the
/// Connection header names.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Most requests carry none (HTTP/2 forbids them): one look at the names, instead of a
    // removal per name (a hash each). Without a Connection header no other name is named.
    if !h.keys().any(|n| HOP_BY_HOP.contains(&n.as_str())) {
        return;
    }
    // `te: trailers` is the one TE value that must pass (gRPC needs it end to end).
    let te_trailers = h
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    let named: Vec<HeaderName> = connection_tokens(h)
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for name in HOP_BY_HOP {
        h.remove(name);
    }
    if te_trailers {
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Turns a client error into what the agent is told. The cause is found by walking the
/// error chain (io::Error hides its payload from `source()`, so look inside it too).
fn failure(target: &Target, err: &PoolError) -> UpstreamError {
    // `Dial` is transparent: its `source()` skips the dial error itself.
    if let PoolError::Dial(d) = err {
        return UpstreamError::from(d);
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = classify_cause(target, e) {
            return r;
        }
        cur = e.source();
    }
    let mut message = format!(
        "upstream {} failed: {}",
        target.authority(),
        crate::error_chain::chain(err)
    );
    if let Some(hint) = wrong_protocol(target, err) {
        message.push_str("; ");
        message.push_str(&hint);
    }
    UpstreamError::Failed(message)
}

/// A failure that looks like the wrong protocol for the port: TLS that the upstream cut off
/// or answered with something else (it may speak plain HTTP there), or plain HTTP it did
/// not answer in HTTP (it may want TLS there). Says what to try.
fn wrong_protocol(target: &Target, err: &PoolError) -> Option<String> {
    let port = target.port;
    match (target.scheme, err) {
        (Scheme::Https, PoolError::Tls(io))
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::InvalidData
            ) =>
        {
            Some(format!(
                "the upstream did not complete a TLS handshake on port {port}: if it speaks \
                 plain HTTP there, use http:// instead of https://"
            ))
        }
        (Scheme::Http, PoolError::Http(h)) if h.is_parse() || h.is_incomplete_message() => {
            Some(format!(
                "the upstream did not answer plain HTTP on port {port}: if it wants TLS there, \
                 use https:// instead of http://"
            ))
        }
        _ => None,
    }
}

fn classify_cause(target: &Target, e: &(dyn std::error::Error + 'static)) -> Option<UpstreamError> {
    if let Some(d) = e.downcast_ref::<DialError>() {
        return Some(UpstreamError::from(d));
    }
    if let Some(t) = e.downcast_ref::<rustls::Error>() {
        let message = match t {
            // What came back was not TLS at all.
            rustls::Error::InvalidMessage(_) if target.scheme == Scheme::Https => format!(
                "upstream {} did not answer TLS ({t}): if it speaks plain HTTP on port {}, use \
                 http:// instead of https://",
                target.authority(),
                target.port
            ),
            _ => format!(
                "TLS to upstream {} failed verification: {t}",
                target.authority()
            ),
        };
        return Some(UpstreamError::Tls(message));
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        if let Some(inner) = io.get_ref() {
            return classify_cause(target, inner);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::ACCEPT));
        let mut grpc = HeaderMap::new();
        grpc.insert(header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut grpc);
        assert_eq!(
            grpc.get(header::TE).map(|v| v.as_bytes()),
            Some(&b"trailers"[..])
        );
    }

    /// Each hop-by-hop header alone is removed (the fast path for maps without one must
    /// not skip any), and a map without one is left as it was.
    #[test]
    fn every_hop_by_hop_header_alone_is_removed_and_others_stay() {
        for name in HOP_BY_HOP {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
            h.insert(HeaderName::from_static(name), HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} stayed");
        }
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        h.append("x-custom", HeaderValue::from_static("1"));
        h.append("x-custom", HeaderValue::from_static("2"));
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }

    #[test]
    fn websocket_request_names_its_upgrade() {
        let req = Request::builder()
            .header("connection", "keep-alive, Upgrade")
            .header("upgrade", "websocket")
            .body(())
            .expect("req");
        assert_eq!(upgrade_token(&req).as_deref(), Some("websocket"));
        let allowed = ["websocket".to_string()];
        assert!(upgrade_allowed("websocket", &allowed));
        assert!(upgrade_allowed("WebSocket", &allowed));
        assert!(!upgrade_allowed("h2c", &allowed));
        assert!(
            !upgrade_allowed("websocket, h2c", &allowed),
            "the upstream picks"
        );
        assert!(!upgrade_allowed("", &allowed));
        assert!(!upgrade_allowed("websocket,", &allowed));
        let plain = Request::builder().body(()).expect("req");
        assert_eq!(upgrade_token(&plain), None);
        let no_connection = Request::builder()
            .header("upgrade", "websocket")
            .body(())
            .expect("req");
        assert_eq!(upgrade_token(&no_connection), None);
    }
}
