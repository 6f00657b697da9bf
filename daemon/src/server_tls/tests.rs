//! The agent-facing TLS server over real loopback sockets: which suite it picks and that a
//! session resumes once.

use std::sync::Arc;

use agenshield_certs::{Ca, LeafCache, LeafConfig, LeafName};
use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::{CipherSuite, ClientConfig, HandshakeKind, RootCertStore};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::InterceptTls;

struct Server {
    addr: std::net::SocketAddr,
    roots: RootCertStore,
    _dir: tempfile::TempDir,
}

/// A loopback listener presenting a minted `api.test` leaf; each connection is handshaken
/// and dropped.
async fn server() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, _) = Ca::load_or_create(dir.path()).expect("ca");
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone()).expect("root");
    let leaves = LeafCache::new(Arc::new(ca), LeafConfig::default());
    let leaf = leaves
        .get(&LeafName::parse("api.test").expect("name"))
        .await
        .expect("leaf");
    let config = InterceptTls::new().server_config(leaf).expect("config");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // The same config for every connection is what the daemon does per host, and the
    // session store behind it is shared by all of them anyway.
    tokio::spawn(async move {
        let acceptor = TlsAcceptor::from(config);
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    // Let the client read its tickets before the close.
                    let _ = tokio::io::AsyncReadExt::read(&mut tls, &mut [0u8; 1]).await;
                }
            });
        }
    });
    Server {
        addr,
        roots,
        _dir: dir,
    }
}

async fn handshake(s: &Server, client: &Arc<ClientConfig>) -> (CipherSuite, Option<HandshakeKind>) {
    let tcp = TcpStream::connect(s.addr).await.expect("connect");
    let mut tls = TlsConnector::from(client.clone())
        .connect(ServerName::try_from("api.test").expect("name"), tcp)
        .await
        .expect("handshake");
    // Read the session tickets that follow the handshake (the server then waits for us).
    let _ = tokio::time::timeout(
        std::time::Duration::from_millis(100),
        tokio::io::AsyncReadExt::read(&mut tls, &mut [0u8; 1]),
    )
    .await;
    let (_, conn) = tls.get_ref();
    let suite = conn.negotiated_cipher_suite().expect("suite").suite();
    (suite, conn.handshake_kind())
}

/// A client that prefers AES-256 (as OpenSSL's curl, wrk and h2load do).
fn client_preferring(s: &Server, first: CipherSuite) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != first);
    let mut cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(s.roots.clone())
        .with_no_client_auth();
    cfg.resumption = Resumption::in_memory_sessions(8);
    Arc::new(cfg)
}

#[tokio::test]
async fn the_server_picks_aes_128_even_when_the_client_prefers_aes_256() {
    let s = server().await;
    let client = client_preferring(&s, CipherSuite::TLS13_AES_256_GCM_SHA384);
    let (suite, _) = handshake(&s, &client).await;
    assert_eq!(suite, CipherSuite::TLS13_AES_128_GCM_SHA256);
}

#[tokio::test]
async fn a_client_offering_only_aes_256_still_gets_it() {
    let s = server().await;
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|suite| suite.suite() == CipherSuite::TLS13_AES_256_GCM_SHA384);
    let cfg = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(s.roots.clone())
        .with_no_client_auth();
    let (suite, _) = handshake(&s, &Arc::new(cfg)).await;
    assert_eq!(suite, CipherSuite::TLS13_AES_256_GCM_SHA384);
}

#[tokio::test]
async fn sessions_resume_through_the_shared_store() {
    let s = server().await;
    let client = client_preferring(&s, CipherSuite::TLS13_AES_128_GCM_SHA256);
    let (_, first) = handshake(&s, &client).await;
    assert_eq!(first, Some(HandshakeKind::Full));
    // The server sent two tickets: the next two connections resume (each takes one out).
    for n in 0..2 {
        let (_, kind) = handshake(&s, &client).await;
        assert_eq!(kind, Some(HandshakeKind::Resumed), "connection {n}");
    }
}
