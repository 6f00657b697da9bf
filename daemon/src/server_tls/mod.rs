//! The server side of interception: the rustls config that presents a minted leaf to the
//! agent, offering h2 and http/1.1, with one session cache shared by every connection.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

mod sessions;

use crate::upstream::trust::{prefer_our_order, provider};
use sessions::{TlsSessions, CAPACITY};

pub(crate) const ALPN_H2: &[u8] = b"h2";
pub(crate) const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Builds the per-connection server config around a minted leaf. Session storage is shared
/// so agents that resume TLS sessions skip the full handshake on their next connection.
pub(crate) struct InterceptTls {
    provider: Arc<CryptoProvider>,
    sessions: Arc<dyn StoresServerSessions>,
}

#[derive(Debug)]
struct FixedLeaf(Arc<CertifiedKey>);

impl ResolvesServerCert for FixedLeaf {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl InterceptTls {
    pub(crate) fn new() -> InterceptTls {
        InterceptTls {
            provider: provider(),
            sessions: TlsSessions::new(CAPACITY),
        }
    }

    /// A server config presenting `leaf`, offering h2 and http/1.1 (rustls picks what the
    /// client offered; a client offering neither gets a handshake failure, not a guess).
    pub(crate) fn server_config(
        &self,
        leaf: Arc<CertifiedKey>,
    ) -> Result<Arc<ServerConfig>, rustls::Error> {
        let mut cfg = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(FixedLeaf(leaf)));
        cfg.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP11.to_vec()];
        cfg.session_storage = self.sessions.clone();
        // Our suite order, not the client's, where AES is in hardware
        // (`upstream::trust::provider` says why).
        cfg.ignore_client_order = prefer_our_order();
        Ok(Arc::new(cfg))
    }
}

impl Default for InterceptTls {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests;
