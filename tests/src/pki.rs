//! A throwaway upstream PKI generated at test time: a CA the proxy is told to
//! trust (config `extra_ca`) and leaves for the loopback upstream servers.

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::ring::default_provider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A self-signed ECDSA P-256 CA that signs leaves for test upstreams.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
}

/// A leaf certificate chain (leaf first, then the CA) and its private key.
#[derive(Debug)]
pub struct TestLeaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for TestLeaf {
    // PrivateKeyDer deliberately has no Clone; clone_key() is its explicit copy.
    fn clone(&self) -> Self {
        TestLeaf {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl TestLeaf {
    /// The chain (leaf first) and the PKCS#8 key as PEM files, for servers that read files.
    pub fn write_pems(&self, chain: &Path, key: &Path) -> std::io::Result<()> {
        let chain_pem: String = self
            .chain
            .iter()
            .map(|c| pem("CERTIFICATE", c.as_ref()))
            .collect();
        std::fs::write(chain, chain_pem)?;
        std::fs::write(key, pem("PRIVATE KEY", self.key.secret_der()))
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        s.push_str(&String::from_utf8_lossy(line));
        s.push('\n');
    }
    s.push_str(&format!("-----END {label}-----\n"));
    s
}

impl TestCa {
    /// Creates a new CA with the given common name. Panics on failure (test code).
    pub fn new(cn: &str) -> TestCa {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generate CA key");
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        dn.push(DnType::OrganizationName, "AgenShield e2e tests");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign CA");
        TestCa {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate in PEM form.
    pub fn cert_pem(&self) -> String {
        self.cert_pem.clone()
    }

    /// The CA certificate in DER form.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert_der.clone()
    }

    /// Writes the CA certificate as PEM, e.g. for the proxy's `extra_ca` setting.
    pub fn write_pem(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.cert_pem.as_bytes())
    }

    /// A leaf for these SANs (DNS names or IP literals like "127.0.0.1"), signed by this CA.
    pub fn leaf(&self, sans: &[&str]) -> TestLeaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generate leaf key");
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("leaf SANs");
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            sans.first().copied().unwrap_or("test leaf"),
        );
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        TestLeaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}

impl TestCa {
    /// A client certificate (clientAuth) for `cn`, signed by this CA: what a mutual-TLS
    /// server asks of its clients.
    pub fn client_leaf(&self, cn: &str) -> TestLeaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generate leaf key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        TestLeaf {
            chain: vec![cert.der().clone(), self.cert_der.clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }
}

/// Parses every certificate in the given PEM texts. Panics on malformed PEM.
pub fn certs_from_pems(pems: &[&str]) -> Vec<CertificateDer<'static>> {
    let mut out = Vec::new();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            out.push(cert.expect("parse CA PEM"));
        }
    }
    out
}

/// rustls ClientConfig (ring provider) trusting only the given CA PEM(s); ALPN list as given.
pub fn client_config(ca_pems: &[&str], alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_from_pems(ca_pems) {
        roots.add(cert).expect("add CA to root store");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}

/// rustls ServerConfig (ring provider) serving `leaf`; ALPN list as given.
pub fn server_config(leaf: &TestLeaf, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports default TLS versions")
        .with_no_client_auth()
        .with_single_cert(leaf.chain.clone(), leaf.key.clone_key())
        .expect("leaf cert and key match");
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(cfg)
}
