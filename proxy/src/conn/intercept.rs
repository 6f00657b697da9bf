//! TLS interception: read the ClientHello with rustls, mint (or reuse) a leaf for the name
//! the client asked for, complete the handshake, and serve the decrypted HTTP.

use std::sync::Arc;

use agenshield_certs::LeafName;
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::timeout;
use tokio_rustls::LazyConfigAcceptor;

use crate::conn::http::{serve_http, HttpVersions};
use crate::conn::server_tls::ALPN_H2;
use crate::conn::{ConnCtx, Dest, DestHost, TlsSide};
use crate::policy::normalize_host;
use crate::proxy::Proxy;

pub(super) async fn intercept<S>(proxy: Arc<Proxy>, mut ctx: ConnCtx, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limit = proxy.limits.tls_handshake_timeout;
    let start = match timeout(limit, LazyConfigAcceptor::new(Acceptor::default(), stream)).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::info!("closing: not a valid TLS ClientHello: {e}");
            return;
        }
        Err(_) => {
            tracing::info!("closing: ClientHello not received within {limit:?}");
            return;
        }
    };
    let hello = start.client_hello();
    let sni = match hello.server_name().map(normalize_host).transpose() {
        Ok(sni) => sni,
        Err(e) => {
            tracing::info!("closing: unusable TLS server name: {e}");
            return;
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
            tracing::info!("closing: cannot mint a certificate for {leaf_for:?}: {e}");
            return;
        }
    };
    let leaf = match proxy.leaves.get(&leaf_name).await {
        Ok(leaf) => leaf,
        Err(e) => {
            tracing::error!("closing: minting a leaf for {leaf_name} failed: {e}");
            return;
        }
    };
    let config = match proxy.tls.server_config(leaf) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("closing: TLS server set-up failed: {e}");
            return;
        }
    };
    let tls = match timeout(limit, start.into_stream(config)).await {
        Ok(Ok(tls)) => {
            proxy.metrics.tls_ok.inc();
            tls
        }
        Ok(Err(e)) => {
            proxy.metrics.tls_failed.inc();
            tracing::info!("closing: TLS handshake with the client failed: {e}");
            return;
        }
        Err(_) => {
            proxy.metrics.tls_failed.inc();
            tracing::info!("closing: TLS handshake not completed within {limit:?}");
            return;
        }
    };
    let versions = if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
        HttpVersions::Http2
    } else {
        HttpVersions::Http1
    };
    ctx.tls = Some(TlsSide { sni, identity });
    serve_http(proxy, Arc::new(ctx), tls, versions).await;
}

/// The name to mint a leaf for, and the host this connection may address. The SNI wins over
/// an IP destination (we dial what we resolve for it); a CONNECT name must agree with it.
fn identity(dest: &Dest, sni: Option<&str>) -> (String, Result<String, String>) {
    match (sni, &dest.host) {
        (Some(s), DestHost::Name(n)) if s != n => (
            s.to_string(),
            Err(format!(
                "TLS server name {s} does not match the CONNECT host {n}"
            )),
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
    fn sni_disagreeing_with_connect_host_is_refused() {
        let n = dest(DestHost::Name("b.test".into()));
        let (leaf, id) = identity(&n, Some("a.test"));
        assert_eq!(leaf, "a.test");
        assert!(id.is_err());
    }
}
