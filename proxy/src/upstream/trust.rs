//! What the proxy trusts towards upstreams: the system roots plus the operator's extra CA
//! files, and the rustls client config that verifies every upstream against them.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// The one crypto provider, on both sides of the proxy.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TrustError {
    #[error("extra CA file {path}: {reason}")]
    ExtraCa { path: String, reason: String },
    #[error("no trusted roots: the system store is empty and upstream.extra_ca is not set")]
    NoRoots,
    #[error("TLS client set-up: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What the upstream side trusts: the system roots plus the operator's extra CA files.
pub(crate) struct UpstreamTrust {
    pub roots: RootCertStore,
    pub system_roots: usize,
    pub extra_roots: usize,
}

impl UpstreamTrust {
    pub(crate) fn load(extra_ca: &[impl AsRef<Path>]) -> Result<UpstreamTrust, TrustError> {
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
    pub(crate) fn client_config(&self) -> Result<ClientConfig, TrustError> {
        Ok(ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth())
    }
}
