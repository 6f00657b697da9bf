//! What the proxy trusts towards upstreams: the system roots plus the operator's extra CA
//! files, and the rustls client config that verifies every upstream against them.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The one crypto provider, on both sides of the proxy: *ring*'s, with AES-128-GCM first
/// where the CPU has AES instructions ([`prefer_our_order`]).
///
/// Every TLS 1.3 session here is keyed by an X25519 or P-256 exchange, about 128-bit
/// strength, so AES-256 adds no strength to it; it costs 14 AES rounds instead of 10 on
/// every byte both ways, and its SHA-384 key schedule has no hardware help where SHA-256
/// has (SHA-NI). AES-128-GCM is TLS 1.3's mandatory suite and what Go and BoringSSL prefer.
/// The server side picks in this order (`ignore_client_order`, `conn::server_tls`: the
/// agent runs on this machine, so what is fast for us is fast for it); towards upstreams it
/// is our offer's order, which servers usually follow. Nothing is removed: a peer that
/// wants AES-256 or ChaCha20 still gets it.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    if prefer_our_order() {
        provider
            .cipher_suites
            .sort_by_key(|suite| suite_rank(*suite));
    }
    Arc::new(provider)
}

/// Whether our suite order is the faster one here: with AES in hardware, yes. Without it
/// (software AES is slow and not constant-time friendly) the client's order stands, so a
/// client preferring ChaCha20 gets it.
pub(crate) fn prefer_our_order() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Where a suite goes in our order: TLS 1.3 before 1.2, AES-128-GCM first within each
/// (the sort is stable, so *ring*'s order stands otherwise).
fn suite_rank(suite: rustls::SupportedCipherSuite) -> (u8, u8) {
    let version = match suite {
        rustls::SupportedCipherSuite::Tls13(_) => 0,
        _ => 1,
    };
    let aes128 = matches!(
        suite.suite(),
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
            | rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
    );
    (version, if aes128 { 0 } else { 1 })
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("extra CA file {path}: {reason}")]
    ExtraCa { path: String, reason: String },
    #[error("no trusted roots: the system store is empty and upstream.extra_ca is not set")]
    NoRoots,
    #[error("TLS client set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What the upstream side trusts: the system roots plus the operator's extra CA files.
pub struct UpstreamTrust {
    pub roots: RootCertStore,
    pub system_roots: usize,
    pub extra_roots: usize,
}

impl UpstreamTrust {
    pub fn load(extra_ca: &[impl AsRef<Path>]) -> Result<UpstreamTrust, TrustError> {
        let mut roots = RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for err in &native.errors {
            tracing::warn!("loading system roots: {err}");
        }
        let (system_roots, _) = roots.add_parsable_certificates(native.certs);
        let mut extra_roots = 0;
        for path in extra_ca {
            let path = path.as_ref();
            let fail = |reason: String| TrustError::ExtraCa {
                path: path.display().to_string(),
                reason,
            };
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| fail(e.to_string()))?
                .collect::<Result<_, _>>()
                .map_err(|e| fail(e.to_string()))?;
            if certs.is_empty() {
                return Err(fail("no PEM certificate in the file".into()));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| fail(format!("not a usable CA certificate: {e}")))?;
                extra_roots += 1;
            }
        }
        if roots.is_empty() {
            return Err(TrustError::NoRoots);
        }
        Ok(UpstreamTrust {
            roots,
            system_roots,
            extra_roots,
        })
    }

    /// Client config verifying every upstream against these roots. ALPN is set by the
    /// connector, independently of what the agent negotiated with us.
    pub fn client_config(&self) -> Result<ClientConfig, TrustError> {
        Ok(ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth())
    }
}

#[cfg(test)]
mod tests {
    use rustls::CipherSuite::*;

    #[test]
    fn aes_128_first_and_nothing_removed() {
        assert!(
            super::prefer_our_order(),
            "this test machine has AES instructions"
        );
        let ours: Vec<_> = super::provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            ours[..3],
            [
                TLS13_AES_128_GCM_SHA256,
                TLS13_AES_256_GCM_SHA384,
                TLS13_CHACHA20_POLY1305_SHA256
            ]
        );
        assert_eq!(ours[3], TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256);
        let mut all: Vec<_> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        let mut sorted = ours.clone();
        all.sort_by_key(|s| u16::from(*s));
        sorted.sort_by_key(|s| u16::from(*s));
        assert_eq!(sorted, all);
    }
}
