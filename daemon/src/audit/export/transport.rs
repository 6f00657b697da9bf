//! The connection to a syslog receiver: TCP, or TLS over it with our rustls (RFC 5425): the
//! receiver's certificate verified against the sink's `ca` (or the system roots) for the
//! URL's host, and our client certificate offered when the sink has one.
//!
//! A syslog receiver never answers; so before each write the connection is looked at for
//! what would mean it is gone (end of stream, an error, a TLS alert), and a write goes only
//! to a connection that looked alive (see *Shipping* in docs/audit.md for what that does and
//! does not promise).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::{AuditExport, Transport};

/// How long a connect (and a TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write may take before the receiver is taken for gone.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection could not be had or used: the metrics' `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    Connect,
    Tls,
    Write,
    /// The receiver closed the connection.
    Closed,
    /// The audit log could not be read.
    Read,
}

impl Failure {
    pub(crate) const ALL: [Failure; 5] = [
        Failure::Connect,
        Failure::Tls,
        Failure::Write,
        Failure::Closed,
        Failure::Read,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Tls => "tls",
            Failure::Write => "write",
            Failure::Closed => "closed",
            Failure::Read => "read",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsSetupError {
    #[error("audit.export {sink}: {what} {path}: {source}")]
    File {
        sink: String,
        what: &'static str,
        path: String,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("audit.export {sink}: no trusted roots (the system store is empty; set ca)")]
    NoRoots { sink: String },
    #[error("audit.export {sink}: {0}", sink = .1)]
    Rustls(#[source] rustls::Error, String),
    #[error("audit.export {sink}: {host:?} is not a name TLS can verify")]
    ServerName { sink: String, host: String },
}

/// How a sink connects.
#[derive(Clone)]
pub(crate) struct Connector {
    addr: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Connector {
    pub(crate) fn new(e: &AuditExport, sink: &str) -> Result<Connector, TlsSetupError> {
        let addr = crate::config::authority(&e.url.host, e.url.port);
        let tls = match e.url.transport {
            Transport::Tcp => None,
            Transport::Tls => Some(tls_setup(e, sink)?),
        };
        Ok(Connector { addr, tls })
    }

    pub(crate) async fn connect(&self) -> Result<Conn, Failure> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| Failure::Connect)?
            .map_err(|_| Failure::Connect)?;
        let _ = tcp.set_nodelay(true);
        let Some((connector, name)) = &self.tls else {
            return Ok(Conn::Tcp(tcp));
        };
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), tcp))
            .await
            .map_err(|_| Failure::Tls)?
            .map_err(|_| Failure::Tls)?;
        Ok(Conn::Tls(Box::new(tls)))
    }
}

fn tls_setup(
    e: &AuditExport,
    sink: &str,
) -> Result<(TlsConnector, ServerName<'static>), TlsSetupError> {
    let file_err = |what, path: &std::path::Path| {
        let (sink, path) = (sink.to_string(), path.display().to_string());
        move |source| TlsSetupError::File {
            sink,
            what,
            path,
            source,
        }
    };
    let mut roots = RootCertStore::empty();
    match &e.ca {
        Some(ca) => {
            for cert in CertificateDer::pem_file_iter(ca).map_err(file_err("ca", ca))? {
                let cert = cert.map_err(file_err("ca", ca))?;
                roots
                    .add(cert)
                    .map_err(|err| TlsSetupError::Rustls(err, sink.to_string()))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
        }
    }
    if roots.is_empty() {
        return Err(TlsSetupError::NoRoots {
            sink: sink.to_string(),
        });
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| TlsSetupError::Rustls(err, sink.to_string()))?
    .with_root_certificates(roots);
    let config = match (&e.client_cert, &e.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(file_err("client_cert", cert))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(file_err("client_cert", cert))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(file_err("client_key", key))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|err| TlsSetupError::Rustls(err, sink.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    let name = ServerName::try_from(e.url.host.clone()).map_err(|_| TlsSetupError::ServerName {
        sink: sink.to_string(),
        host: e.url.host.clone(),
    })?;
    Ok((TlsConnector::from(Arc::new(config)), name))
}

/// A connection to the receiver.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Conn {
    /// Whether the receiver is still there as far as can be seen without waiting: it sends
    /// nothing, so anything readable (the end of the stream, an error, an alert) means it
    /// is gone or going.
    pub(crate) fn looks_alive(&mut self) -> bool {
        let mut probe = [0u8; 512];
        let read = match self {
            Conn::Tcp(s) => s.read(&mut probe).now_or_never(),
            Conn::Tls(s) => s.read(&mut probe).now_or_never(),
        };
        matches!(read, None | Some(Ok(1..)))
    }

    /// Writes `bytes` and flushes them to the socket.
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        let done = match self {
            Conn::Tcp(s) => tokio::time::timeout(WRITE_TIMEOUT, write_flush(s, bytes)).await,
            Conn::Tls(s) => {
                tokio::time::timeout(WRITE_TIMEOUT, write_flush(s.as_mut(), bytes)).await
            }
        };
        match done {
            Ok(Ok(())) => Ok(()),
            _ => Err(Failure::Write),
        }
    }

    /// Ends the connection politely (a TLS close_notify), without waiting long.
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            match &mut self {
                Conn::Tcp(s) => s.shutdown().await,
                Conn::Tls(s) => s.shutdown().await,
            }
        })
        .await;
    }
}

async fn write_flush<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    bytes: &[u8],
) -> std::io::Result<()> {
    s.write_all(bytes).await?;
    s.flush().await
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use tokio::net::TcpListener;

    use super::*;

    /// A CA: its PEM, and its issuer for leaves.
    fn ca() -> (String, Issuer<'static, KeyPair>) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("self-sign");
        (cert.pem(), Issuer::new(params, key))
    }

    fn sink(port: u16, ca: &std::path::Path) -> AuditExport {
        let text = format!(
            "type = \"syslog\"\nurl = \"tls://127.0.0.1:{port}\"\nca = {:?}\n",
            ca.display().to_string()
        );
        toml::from_str(&text).expect("sink")
    }

    /// The receiver's certificate is verified: one from another CA is refused (a `tls`
    /// failure, nothing sent); one from the sink's `ca` carries the bytes.
    #[tokio::test]
    async fn the_receiver_is_verified_against_the_sinks_ca() {
        let (ca_pem, issuer) = ca();
        let (other_pem, _) = ca();
        let key = KeyPair::generate().expect("key");
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &issuer)
            .expect("sign");
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
        )
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (got_tx, mut got) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, got_tx) = (acceptor.clone(), got_tx.clone());
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut buf = Vec::new();
                        let _ = tls.read_to_end(&mut buf).await;
                        let _ = got_tx.send(buf).await;
                    }
                });
            }
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let (good, bad) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
        std::fs::write(&good, ca_pem).expect("write");
        std::fs::write(&bad, other_pem).expect("write");

        let wrong = Connector::new(&sink(port, &bad), "t").expect("connector");
        assert_eq!(wrong.connect().await.err(), Some(Failure::Tls));

        let right = Connector::new(&sink(port, &good), "t").expect("connector");
        let mut conn = right.connect().await.expect("verified");
        assert!(conn.looks_alive());
        conn.send(b"5 hello").await.expect("send");
        conn.close().await;
        let got = tokio::time::timeout(Duration::from_secs(10), got.recv())
            .await
            .expect("in time")
            .expect("bytes");
        assert_eq!(got, b"5 hello");
    }
}
