//! The target phase: which upstream a request is for, and the checks that it is well formed:
//! every name the client gave for it agrees (SNI, Host / :authority, and the destination it
//! connected or CONNECTed to), its path normalizes, and its head is within
//! `limits.max_header_bytes` (the HTTP server's own cap is set above that, so the agent gets
//! this refusal, with its JSON body and its record, rather than a bare 431), and any protocol
//! it asks to switch to is in `upstream.upgrades`.

use http::{header, Request};

use super::refusal::Refusal;
use super::RequestCtx;
use crate::policy::{normalize_host, normalize_path, Scheme};
use crate::record::ErrorCode;
use crate::record::{ConnCtx, DestHost};
use crate::upstream::client::upgrade_allowed;
use crate::upstream::target::Target;

/// Finds the target and normalizes the path (`ctx.path` becomes the form sent upstream).
pub(super) fn find<B>(ctx: &mut RequestCtx, req: &Request<B>) -> Result<(), Refusal> {
    head_within(req, ctx.proxy.limits.max_header_bytes)?;
    ctx.target = Some(for_request(&ctx.conn, req)?);
    if let Some(offered) = &ctx.upgrade {
        if !upgrade_allowed(offered, &ctx.proxy.upgrades) {
            return Err(Refusal::new(
                ErrorCode::UpgradeRefused,
                format!(
                    "switching protocols to {offered:?} is not allowed (upstream.upgrades: {})",
                    ctx.proxy.upgrades.join(", ")
                ),
            ));
        }
    }
    let path = normalize_path(req.uri().path())
        .map_err(|e| Refusal::new(ErrorCode::BadRequest, format!("invalid request path: {e}")))?;
    ctx.path = path.forward;
    ctx.matching_path = path.matching;
    Ok(())
}

/// Refuses a head larger than `max` bytes.
pub(crate) fn head_within<B>(req: &Request<B>, max: usize) -> Result<(), Refusal> {
    let size = head_size(req);
    if size > max {
        return Err(Refusal::new(
            ErrorCode::HeadTooLarge,
            format!("the request head is {size} bytes; at most {max} are accepted"),
        ));
    }
    Ok(())
}

/// The size of a request head as its protocol counts it. HTTP/1: the request line and every
/// header line (`name: value` and CRLF). HTTP/2: each field's name and value plus 32 bytes
/// (RFC 9113 §6.5.2, as the h2 layer counts against its own cap), so that a head under the
/// limit here is always under the server's cap too.
fn head_size<B>(req: &Request<B>) -> usize {
    let per_field = if req.version() == http::Version::HTTP_2 {
        32
    } else {
        4
    };
    // Two spaces, `HTTP/1.1`, CRLF (or the pseudo-header fields).
    let line = req.method().as_str().len()
        + req.uri().path_and_query().map_or(1, |p| p.as_str().len())
        + 12;
    req.headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + per_field)
        .sum::<usize>()
        + line
}

fn mismatch(msg: String) -> Refusal {
    Refusal::new(ErrorCode::HostMismatch, msg)
}

/// Splits `host[:port]` (IPv6 in brackets) and normalizes the host.
pub(crate) fn split_authority(auth: &str) -> Result<(String, Option<u16>), Refusal> {
    // The raw value is not echoed: a malformed authority may carry credentials.
    let bad = || Refusal::new(ErrorCode::BadRequest, "invalid request authority (Host)");
    let parsed: http::uri::Authority = auth.parse().map_err(|_| bad())?;
    if auth.contains('@') {
        return Err(Refusal::new(
            ErrorCode::BadRequest,
            "userinfo in the request authority is not allowed",
        ));
    }
    let host = normalize_host(parsed.host()).map_err(|_| bad())?;
    Ok((host, parsed.port_u16()))
}

/// The target of a request received on `ctx` (an intercepted TLS connection, a plain HTTP
/// connection, or an absolute-URI request whose destination the caller put in `ctx.dest`).
pub(crate) fn for_request<B>(ctx: &ConnCtx, req: &Request<B>) -> Result<Target, Refusal> {
    let (scheme, identity) = match &ctx.tls {
        Some(tls) => {
            let identity = tls.identity.clone();
            (
                Scheme::Https,
                Some(identity.map_err(|e| mismatch(e.to_string()))?),
            )
        }
        None => (Scheme::Http, None),
    };
    let host_header = match req.headers().get_all(header::HOST).iter().count() {
        0 => None,
        1 => req.headers().get(header::HOST).map(|v| {
            v.to_str()
                .map_err(|_| Refusal::new(ErrorCode::BadRequest, "Host header is not ASCII"))
        }),
        _ => {
            return Err(Refusal::new(
                ErrorCode::BadRequest,
                "more than one Host header",
            ))
        }
    }
    .transpose()?;
    let uri_auth = req.uri().authority().map(|a| a.as_str());
    let named = match (uri_auth, host_header) {
        (Some(u), Some(h)) => {
            let (uh, up) = split_authority(u)?;
            let (hh, hp) = split_authority(h)?;
            if uh != hh || (up.is_some() && hp.is_some() && up != hp) {
                return Err(mismatch(format!(
                    "request URI names {u} but Host names {h}"
                )));
            }
            Some((uh, up.or(hp)))
        }
        (Some(a), None) | (None, Some(a)) => Some(split_authority(a)?),
        (None, None) => None,
    };
    let named_port = named.as_ref().and_then(|(_, p)| *p);
    let host = match (identity, named) {
        (Some(id), Some((h, _))) if h != id => {
            return Err(mismatch(format!(
                "TLS server name {id} does not match request host {h}"
            )))
        }
        (Some(id), _) => id,
        (None, Some((h, _))) => h,
        (None, None) => match &ctx.dest.host {
            DestHost::Ip(ip) => ip.to_string(),
            DestHost::Name(n) => n.clone(),
        },
    };
    if let Some(p) = named_port {
        if p != ctx.dest.port {
            return Err(mismatch(format!(
                "request names port {p} but the connection is to port {}",
                ctx.dest.port
            )));
        }
    }
    Ok(Target {
        scheme,
        host,
        port: ctx.dest.port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ListenerKind;
    use crate::record::{Dest, HostMismatch, TlsSide};

    fn ctx(dest: &str, tls: Option<(&str, Result<&str, &str>)>) -> ConnCtx {
        let set = std::sync::Arc::new(crate::secrets::set::SecretSet::default());
        let client = "127.0.0.1:5000".parse().expect("addr");
        let dest = Dest::from_addr(dest.parse().expect("addr"));
        let ctx = ConnCtx::new(1, client, ListenerKind::Transparent, dest, None, &set);
        match tls {
            Some((sni, id)) => ctx.with_tls(
                TlsSide {
                    sni: Some(sni.into()),
                    identity: id.map(str::to_string).map_err(|host| HostMismatch {
                        sni: sni.into(),
                        host: host.into(),
                    }),
                },
                &set,
            ),
            None => ctx,
        }
    }

    fn req(uri: &str, host: Option<&str>) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header("host", h);
        }
        b.body(()).expect("request")
    }

    #[test]
    fn sni_and_host_agree_case_and_dot_insensitively() {
        let c = ctx("10.0.0.1:443", Some(("api.test", Ok("api.test"))));
        let t = for_request(&c, &req("/", Some("API.Test.:443"))).expect("agree");
        assert_eq!(t.host, "api.test");
        assert_eq!(t.port, 443);
        assert_eq!(t.authority(), "api.test");
    }

    #[test]
    fn sni_and_host_disagreeing_is_host_mismatch() {
        let c = ctx("10.0.0.1:443", Some(("a.test", Ok("a.test"))));
        let r = for_request(&c, &req("/", Some("b.test"))).expect_err("mismatch");
        assert_eq!(r.code, ErrorCode::HostMismatch);
    }

    #[test]
    fn h2_authority_is_checked_like_host() {
        let c = ctx("10.0.0.1:443", Some(("a.test", Ok("a.test"))));
        assert!(for_request(&c, &req("https://b.test/", None)).is_err());
        assert!(for_request(&c, &req("https://a.test/", None)).is_ok());
    }

    #[test]
    fn port_in_host_must_match_the_connection() {
        let c = ctx("10.0.0.1:8443", None);
        assert!(for_request(&c, &req("/", Some("a.test:8443"))).is_ok());
        let r = for_request(&c, &req("/", Some("a.test:9999"))).expect_err("port");
        assert_eq!(r.code, ErrorCode::HostMismatch);
        let t = for_request(&c, &req("/", Some("a.test"))).expect("no port named");
        assert_eq!((t.host.as_str(), t.port), ("a.test", 8443));
        assert_eq!(t.authority(), "a.test:8443");
    }

    #[test]
    fn no_host_falls_back_to_destination() {
        let c = ctx("[::1]:80", None);
        let t = for_request(&c, &req("/", None)).expect("dest");
        assert_eq!(t.host, "::1");
        assert_eq!(t.authority(), "[::1]");
    }

    #[test]
    fn userinfo_and_duplicate_host_are_refused() {
        let c = ctx("10.0.0.1:80", None);
        assert!(for_request(&c, &req("/", Some("user@a.test"))).is_err());
        let mut r = req("/", Some("a.test"));
        r.headers_mut()
            .append("host", http::HeaderValue::from_static("b.test"));
        assert_eq!(
            for_request(&c, &r).expect_err("dup").code,
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn refused_identity_refuses_every_request() {
        let c = ctx("10.0.0.1:443", Some(("a.test", Err("b.test"))));
        let r = for_request(&c, &req("/", Some("a.test"))).expect_err("refused");
        assert_eq!(r.code, ErrorCode::HostMismatch);
    }
}
