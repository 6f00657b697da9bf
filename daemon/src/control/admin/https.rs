//! The admin API over HTTPS with mutual TLS (`[listen] admin_https`): the same routes as
//! the Unix socket, for an operator on another machine (`ctl --remote`).
//!
//! Who is served: a client whose certificate chains to `listen.client_ca` (rustls'
//! `WebPkiClientVerifier`: no certificate, or one that does not chain, fails the handshake).
//! Never an agent, certificate or not: every connection's client socket is looked up in the
//! kernel (`sock_diag`, the lookup the transparent listener uses to name agents). When it is
//! a socket of this machine (any local address, loopback or not) owned by an agent uid, the
//! connection is closed before the handshake; when the peer is local (loopback, or our own
//! address) and its owner cannot be told, it is closed too. A peer on another machine has no
//! local socket to look up and is judged by its certificate alone; so is a process in
//! another network namespace of this machine (its sockets are not in ours), which reaches the
//! listener only through an address routed to that namespace.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::caller::Caller;
use super::{routes, Admin};
use crate::config::AdminHttpsConfig;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a request's head may take, from the first byte or an idle keep-alive.
const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;

/// Why the listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    #[error("listen.client_ca {path}: {why}")]
    ClientCa { path: String, why: String },
    #[error("listen.admin_https_cert {path}: {why}")]
    Cert { path: String, why: String },
    #[error("listen.admin_https_key {path}: {why}")]
    Key { path: String, why: String },
    #[error("the admin HTTPS listener's TLS settings: {0}")]
    Tls(#[from] rustls::Error),
    #[error("binding the admin HTTPS listener on {addr}: {cause}")]
    Bind {
        addr: SocketAddr,
        cause: std::io::Error,
    },
}

/// Why a connection is closed before the handshake.
#[derive(Debug, thiserror::Error)]
enum NotAdmitted {
    #[error("its client socket belongs to agent uid {0}")]
    Agent(u32),
    #[error("it comes from this machine and its owner cannot be told ({0})")]
    UnknownOwner(String),
}

/// The listener, bound, with its TLS settings read.
pub(crate) struct AdminHttps {
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    pub addr: SocketAddr,
}

impl AdminHttps {
    pub(crate) async fn bind(cfg: &AdminHttpsConfig) -> Result<AdminHttps, HttpsError> {
        let tls = Arc::new(server_config(cfg)?);
        let listener = TcpListener::bind(cfg.addr)
            .await
            .map_err(|cause| HttpsError::Bind {
                addr: cfg.addr,
                cause,
            })?;
        let addr = listener.local_addr().map_err(|cause| HttpsError::Bind {
            addr: cfg.addr,
            cause,
        })?;
        Ok(AdminHttps {
            listener,
            tls,
            addr,
        })
    }
}

/// `run --check`: the listener's files (`client_ca`, its certificate and key) read and
/// assembled as a start does.
pub fn check_tls(cfg: &AdminHttpsConfig) -> Result<(), HttpsError> {
    server_config(cfg).map(drop)
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate in the file".into());
    }
    Ok(certs)
}

/// TLS 1.2+ with our provider, the listener's certificate, and client certificates required
/// and verified against `client_ca`.
fn server_config(cfg: &AdminHttpsConfig) -> Result<ServerConfig, HttpsError> {
    let shown = |p: &Path| p.display().to_string();
    let mut roots = RootCertStore::empty();
    for ca in certs(&cfg.client_ca).map_err(|why| HttpsError::ClientCa {
        path: shown(&cfg.client_ca),
        why,
    })? {
        roots.add(ca).map_err(|e| HttpsError::ClientCa {
            path: shown(&cfg.client_ca),
            why: format!("not a usable CA certificate: {e}"),
        })?;
    }
    let provider = crate::upstream::trust::provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| HttpsError::ClientCa {
            path: shown(&cfg.client_ca),
            why: e.to_string(),
        })?;
    let chain = certs(&cfg.cert).map_err(|why| HttpsError::Cert {
        path: shown(&cfg.cert),
        why,
    })?;
    let key = PrivateKeyDer::from_pem_file(&cfg.key).map_err(|e| HttpsError::Key {
        path: shown(&cfg.key),
        why: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The agent check, before any byte of TLS: `peer` connected to our `local`.
fn admit(peer: SocketAddr, local: SocketAddr, agents: &[u32]) -> Result<(), NotAdmitted> {
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`.
    let local_peer =
        canonical(peer.ip()).is_loopback() || canonical(peer.ip()) == canonical(local.ip());
    match agenshield_pf::peer_uid::socket_uid(peer, local) {
        Ok(Some(uid)) if agents.contains(&uid) => Err(NotAdmitted::Agent(uid)),
        Ok(Some(_)) => Ok(()),
        Ok(None) if local_peer => Err(NotAdmitted::UnknownOwner(
            "no such socket: its owner closed it".into(),
        )),
        Ok(None) => Ok(()),
        Err(e) if local_peer => Err(NotAdmitted::UnknownOwner(e.to_string())),
        Err(e) => {
            tracing::debug!("admin HTTPS: owner of {peer}: {e}");
            Ok(())
        }
    }
}

fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    }
}

pub(crate) async fn serve(https: AdminHttps, admin: Arc<Admin>) {
    let AdminHttps { listener, tls, .. } = https;
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("admin HTTPS accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(local) = stream.local_addr() else {
                return;
            };
            if let Err(why) = admit(peer, local, &admin.auth.agent_uids) {
                tracing::warn!(%peer, "admin HTTPS: refused before the handshake: {why}");
                return;
            }
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, "admin HTTPS: handshake refused: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "admin HTTPS: no handshake within {HANDSHAKE_TIMEOUT:?}");
                    return;
                }
            };
            let Some(caller) = caller(peer, &tls) else {
                tracing::warn!(%peer, "admin HTTPS: no client certificate after the handshake");
                return;
            };
            tracing::debug!(caller = %caller, "admin HTTPS: connected");
            let caller = Arc::new(caller);
            let svc = service_fn(move |req| {
                let admin = admin.clone();
                let caller = caller.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(routes::route(&admin, &caller, req).await)
                }
            });
            // Over the network: a request's head must come in time (a `tail -f` answer may
            // stream for as long as the operator wants).
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tls), svc);
            if let Err(e) = conn.await {
                tracing::debug!("admin HTTPS connection ended: {e}");
            }
        });
    }
}

/// Who the verified client certificate names.
fn caller(
    peer: SocketAddr,
    tls: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> Option<Caller> {
    let leaf = tls.get_ref().1.peer_certificates()?.first()?;
    let (subject, fingerprint) = match agenshield_certs::inspect(leaf.as_ref()) {
        Ok(facts) => (facts.subject, facts.fingerprint_sha256),
        Err(_) => ("(unreadable subject)".to_string(), String::new()),
    };
    Some(Caller::Remote {
        addr: peer,
        subject,
        fingerprint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client on loopback whose socket has gone (or never was ours to see) is refused:
    /// only a peer on another machine may go without a looked-up owner.
    #[test]
    fn a_local_peer_without_an_owner_is_refused_and_a_remote_one_is_not() {
        let local: SocketAddr = "127.0.0.1:15443".parse().expect("addr");
        let gone: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert!(matches!(
            admit(gone, local, &[]),
            Err(NotAdmitted::UnknownOwner(_))
        ));
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:1".parse().expect("addr");
        let wide6: SocketAddr = "[::ffff:127.0.0.1]:15443".parse().expect("addr");
        assert!(matches!(
            admit(mapped, wide6, &[]),
            Err(NotAdmitted::UnknownOwner(_))
        ));
        let other: SocketAddr = "192.0.2.7:40000".parse().expect("addr");
        let wide: SocketAddr = "192.0.2.1:15443".parse().expect("addr");
        assert!(admit(other, wide, &[]).is_ok());
    }

    /// A real loopback connection made by this process: admitted, unless its uid is named
    /// an agent's.
    #[tokio::test]
    async fn an_agent_uids_loopback_socket_is_refused() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (server, peer) = l.accept().await.expect("accept");
        let local = server.local_addr().expect("local");
        let me = nix::unistd::geteuid().as_raw();
        assert!(admit(peer, local, &[me + 1]).is_ok());
        assert!(matches!(
            admit(peer, local, &[me]),
            Err(NotAdmitted::Agent(uid)) if uid == me
        ));
        drop(client);
    }
}
