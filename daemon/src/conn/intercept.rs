//! TLS interception: read the ClientHello with rustls, mint (or reuse) a leaf for the name
//! the client asked for, complete the handshake, and serve the decrypted HTTP. A handshake
//! that does not complete leaves a connection record saying why (`client_rejected_ca` when
//! the client's alert says it does not trust our CA).

use std::sync::Arc;
use std::time::Instant;

use agenshield_certs::LeafName;
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::timeout;
use tokio_rustls::LazyConfigAcceptor;

use crate::conn::http::{serve_http, HttpVersions};
use crate::conn::{ConnCtx, Dest, DestHost, TlsSide};
use crate::pipeline::record;
use crate::policy::normalize_host;
use crate::proxy::Proxy;
use crate::record::HostMismatch;
use crate::record::{ErrorCode, Protocol, Record, Refusal};
use crate::server_tls::ALPN_H2;

pub(super) async fn intercept<S>(proxy: Arc<Proxy>, ctx: ConnCtx, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let failed = Failed {
        proxy: &proxy,
        ctx: &ctx,
        started: Instant::now(),
        at: time::OffsetDateTime::now_utc(),
    };
    let limit = proxy.limits.tls_handshake_timeout;
    let start = match timeout(limit, LazyConfigAcceptor::new(Acceptor::default(), stream)).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            let why = format!("not a valid TLS ClientHello: {e}");
            return failed.record(ErrorCode::BadClientHello, None, why).await;
        }
        Err(_) => {
            let why = format!("no ClientHello within {limit:?}");
            return failed.record(ErrorCode::BadClientHello, None, why).await;
        }
    };
    let hello = start.client_hello();
    let sni = match hello.server_name().map(normalize_host).transpose() {
        Ok(sni) => sni,
        Err(e) => {
            let why = format!("unusable TLS server name: {e}");
            return failed.record(ErrorCode::BadClientHello, None, why).await;
        }
    };
    let shown_sni = sni
        .as_deref()
        .map(|s| proxy.vault.current().redact(s).into_owned());
    tracing::Span::current().record("sni", shown_sni.as_deref().unwrap_or("-"));
    let (leaf_for, identity) = identity(&ctx.dest, sni.as_deref());
    let leaf_name = match LeafName::parse(&leaf_for) {
        Ok(n) => n,
        Err(e) => {
            let why = format!("no certificate can name {leaf_for:?}: {e}");
            return failed.record(ErrorCode::BadClientHello, sni, why).await;
        }
    };
    let leaf = match proxy.leaves.get(&leaf_name).await {
        Ok(leaf) => leaf,
        Err(e) => {
            let shown = proxy.vault.current().redact(&leaf_for).into_owned();
            tracing::error!("minting a leaf for {shown} failed: {e}");
            let why = format!("minting a leaf failed: {e}");
            return failed.record(ErrorCode::TlsHandshakeFailed, sni, why).await;
        }
    };
    let config = match proxy.tls.server_config(leaf) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("TLS server set-up failed: {e}");
            let why = format!("TLS server set-up failed: {e}");
            return failed.record(ErrorCode::TlsHandshakeFailed, sni, why).await;
        }
    };
    let tls = match timeout(limit, start.into_stream(config)).await {
        Ok(Ok(tls)) => {
            proxy.metrics.tls.handshake_ok();
            tls
        }
        Ok(Err(e)) => {
            let code = handshake_failure(&e);
            let why = format!("TLS handshake with the client failed: {e}");
            return failed.record(code, sni, why).await;
        }
        Err(_) => {
            let why = format!("TLS handshake not completed within {limit:?}");
            return failed.record(ErrorCode::TlsHandshakeFailed, sni, why).await;
        }
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(ALPN_H2);
    let side = TlsSide { sni, identity };
    let ctx = Arc::new(ctx.with_tls(side, &proxy.vault.current()));
    // The agent's side is flushed as the h2 codec asks, not consolidated as the upstream side
    // is (`flush_coalesce`): a refusal of an upload is a response and then a reset of the
    // stream, and curl 7.88 (Debian 12's) fails with "Stream error in the HTTP/2 framing layer"
    // instead of showing the refusal when both arrive in one read (hardening's disk-full test
    // failed 4 times in 15 with it). Measured gain on this side: none beyond noise.
    let versions = if h2 {
        HttpVersions::Http2
    } else {
        HttpVersions::Http1
    };
    serve_http(proxy, ctx, tls, versions).await;
}

/// Where a handshake started, so that one that fails can be recorded: a connection record
/// with the SNI (when the ClientHello had one) and the error code that says what went wrong.
/// Nothing is built unless it fails.
struct Failed<'a> {
    proxy: &'a Arc<Proxy>,
    ctx: &'a ConnCtx,
    started: Instant,
    at: time::OffsetDateTime,
}

impl Failed<'_> {
    async fn record(&self, code: ErrorCode, sni: Option<String>, why: String) {
        let proxy = self.proxy;
        let secrets = proxy.vault.current();
        let sni: Option<Arc<str>> = sni.map(|s| secrets.redact(&s).into());
        let at = record::stamp(&proxy.policy(), Some(self.at));
        let base = self.ctx.base(&secrets);
        let refusal = record::shown(&secrets, Refusal::new(code, why));
        let record = Record {
            host: sni.clone().unwrap_or_else(|| base.host().clone()),
            sni,
            ms: record::ms_since(self.started),
            ..base.refused(Protocol::Tls, &refusal, at)
        };
        record::connection(proxy, record).await;
    }
}

/// Which failure a handshake error was: the client's alert saying it does not trust our
/// certificate (`UnknownCA` from OpenSSL, rustls and Node; `BadCertificate` from Go and
/// GnuTLS; `CertificateUnknown` from Java), or anything else.
fn handshake_failure(e: &std::io::Error) -> ErrorCode {
    use rustls::AlertDescription as A;
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::AlertReceived(
            A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::UnsupportedCertificate,
        )) => ErrorCode::ClientRejectedCa,
        _ => ErrorCode::TlsHandshakeFailed,
    }
}

/// The name to mint a leaf for, and the host this connection may address. The SNI wins over
/// an IP destination (we dial what we resolve for it); a CONNECT name must agree with it.
fn identity(dest: &Dest, sni: Option<&str>) -> (String, Result<String, HostMismatch>) {
    match (sni, &dest.host) {
        (Some(s), DestHost::Name(n)) if s != n => (
            s.to_string(),
            Err(HostMismatch {
                sni: s.to_string(),
                host: n.clone(),
            }),
        ),
        (Some(s), _) => (s.to_string(), Ok(s.to_string())),
        (None, host) => (host.to_string(), Ok(host.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(host: DestHost) -> Dest {
        Dest { host, port: 443 }
    }

    #[test]
    fn sni_wins_over_ip_destination() {
        let d = dest(DestHost::Ip("10.0.0.9".parse().expect("ip")));
        assert_eq!(
            identity(&d, Some("a.test")),
            ("a.test".into(), Ok("a.test".into()))
        );
    }

    #[test]
    fn no_sni_uses_destination() {
        let d = dest(DestHost::Ip("127.0.0.2".parse().expect("ip")));
        assert_eq!(
            identity(&d, None),
            ("127.0.0.2".into(), Ok("127.0.0.2".into()))
        );
        let n = dest(DestHost::Name("b.test".into()));
        assert_eq!(identity(&n, None), ("b.test".into(), Ok("b.test".into())));
    }

    #[test]
    fn an_untrusting_clients_alert_is_a_rejected_ca() {
        let alert = |a| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(a),
            )
        };
        use rustls::AlertDescription as A;
        for a in [A::UnknownCA, A::BadCertificate, A::CertificateUnknown] {
            assert_eq!(
                handshake_failure(&alert(a)),
                ErrorCode::ClientRejectedCa,
                "{a:?}"
            );
        }
        assert_eq!(
            handshake_failure(&alert(A::HandshakeFailure)),
            ErrorCode::TlsHandshakeFailed
        );
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert_eq!(handshake_failure(&eof), ErrorCode::TlsHandshakeFailed);
    }

    #[test]
    fn sni_disagreeing_with_connect_host_is_refused() {
        let n = dest(DestHost::Name("b.test".into()));
        let (leaf, id) = identity(&n, Some("a.test"));
        assert_eq!(leaf, "a.test");
        assert!(id.is_err());
    }
}
