//! `ctl --remote https://host:15443 --cert FILE --key FILE [--ca FILE]`: the daemon's admin
//! API over its HTTPS listener (`[listen] admin_https`), proving who we are with a client
//! certificate. Without `--ca`, the listener's certificate is checked against the system's
//! roots.

use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::client::CtlError;

/// How long connecting and the TLS handshake may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The listener to talk to, and the TLS settings to do it with.
pub struct Remote {
    url: url::Url,
    host: String,
    port: u16,
    tls: Arc<ClientConfig>,
}

impl Remote {
    /// Reads the certificate, key and CA files; checks the URL (`https://host[:port]`).
    pub fn new(url: &str, cert: &Path, key: &Path, ca: Option<&Path>) -> Result<Remote, CtlError> {
        let bad = |why: String| CtlError::BadInput(format!("--remote {url}: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        if parsed.scheme() != "https" {
            return Err(bad("https:// only (the listener speaks TLS alone)".into()));
        }
        if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
            return Err(bad("give the listener alone: https://HOST:PORT".into()));
        }
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host".into()))?
            .to_string();
        let port = parsed.port_or_known_default().unwrap_or(443);
        let file = |flag: &str, path: &Path, e: &dyn std::fmt::Display| {
            CtlError::BadInput(format!("{flag} {}: {e}", path.display()))
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| file("--cert", cert, &e))?
            .collect::<Result<_, _>>()
            .map_err(|e| file("--cert", cert, &e))?;
        if chain.is_empty() {
            return Err(file("--cert", cert, &"no PEM certificate in the file"));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file("--key", key, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(ca) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
                    .map_err(|e| file("--ca", ca, &e))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| file("--ca", ca, &e))?;
                if certs.is_empty() {
                    return Err(file("--ca", ca, &"no PEM certificate in the file"));
                }
                for c in certs {
                    roots.add(c).map_err(|e| file("--ca", ca, &e))?;
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(native.certs);
            }
        }
        let mut tls =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| CtlError::Protocol(e.to_string()))?
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| file("--cert/--key", cert, &e))?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Remote {
            url: parsed,
            host,
            port,
            tls: Arc::new(tls),
        })
    }

    /// `host:port`, for the `Host` header.
    pub(super) fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// A TCP connection and a finished TLS handshake.
    pub(super) async fn connect(&self) -> Result<TlsStream<TcpStream>, CtlError> {
        let work = async {
            let unreachable = |e: &dyn std::fmt::Display| {
                CtlError::Unreachable(format!("cannot reach {}: {e}", self.url))
            };
            let bare = self.host.trim_start_matches('[').trim_end_matches(']');
            let tcp = TcpStream::connect((bare, self.port))
                .await
                .map_err(|e| unreachable(&e))?;
            let name = ServerName::try_from(bare.to_string()).map_err(|e| unreachable(&e))?;
            tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| {
                    CtlError::Unreachable(format!(
                        "TLS with {}: {e} (--ca must be the CA of the listener's certificate; \
                         the daemon accepts client certificates its listen.client_ca issued, \
                         and never an agent user)",
                        self.url
                    ))
                })
        };
        tokio::time::timeout(CONNECT_TIMEOUT, work)
            .await
            .unwrap_or_else(|_| {
                Err(CtlError::Unreachable(format!(
                    "cannot reach {}: no answer within {CONNECT_TIMEOUT:?}",
                    self.url
                )))
            })
    }

    /// What to say when the daemon closed the connection after the handshake (TLS 1.3
    /// reports a refused client certificate only then).
    pub(super) fn closed(&self, e: &dyn std::fmt::Display) -> CtlError {
        CtlError::Unreachable(format!(
            "{}: the daemon closed the connection: {e} (the daemon accepts client \
             certificates its listen.client_ca issued, and never an agent user)",
            self.url
        ))
    }
}
