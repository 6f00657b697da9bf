//! The JVM's trust store: a PKCS12 file of trusted-certificate entries (the agent's bundle),
//! which Java 9+ reads as `-Djavax.net.ssl.trustStoreType=PKCS12`. Java ignores every CA
//! variable and ships its own roots, so without this file it refuses our leaves.

use std::collections::BTreeSet;
use std::io;

use p12_keystore::{Certificate, KeyStore, KeyStoreEntry, Pkcs12ImportPolicy};

/// The store's password: it only protects integrity (the entries are public certificates),
/// and it is the JDK's own default, so tools that assume it work.
pub const PASSWORD: &str = "changeit";

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// A PKCS12 trust store holding every certificate of `bundle_pem`, aliased `agenshield-N`.
pub fn from_bundle(bundle_pem: &str) -> io::Result<Vec<u8>> {
    let certs = super::bundle::certs_of(bundle_pem);
    if certs.is_empty() {
        return Err(invalid("the bundle holds no certificate"));
    }
    let mut ks = KeyStore::new();
    for (i, c) in certs.iter().enumerate() {
        let cert = Certificate::from_der(c.as_ref()).map_err(invalid)?;
        ks.add_entry(&format!("agenshield-{i}"), KeyStoreEntry::Certificate(cert));
    }
    ks.writer(PASSWORD).write().map_err(invalid)
}

/// The DER certificates a trust store holds (`None` if it is no PKCS12 store we can read):
/// the store is written with fresh salts each time, so install compares it by content.
pub fn certs_in(p12: &[u8]) -> Option<BTreeSet<Vec<u8>>> {
    certs_in_store(p12, PASSWORD)
}

/// The DER certificates of a PKCS12 store opened with `password` (`None` if it does not open).
pub fn certs_in_store(p12: &[u8], password: &str) -> Option<BTreeSet<Vec<u8>>> {
    let ks = KeyStore::from_pkcs12(p12, password, Pkcs12ImportPolicy::Strict).ok()?;
    Some(
        ks.entries()
            .filter_map(|(_, e)| match e {
                KeyStoreEntry::Certificate(c) => Some(c.as_der().to_vec()),
                _ => None,
            })
            .collect(),
    )
}

/// The certificates of a PEM bundle, as [`certs_in`] returns them.
pub fn certs_of_bundle(bundle_pem: &str) -> BTreeSet<Vec<u8>> {
    super::bundle::certs_of(bundle_pem)
        .iter()
        .map(|c| c.as_ref().to_vec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_holds_exactly_the_bundles_certificates() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec!["ca.test".into()]).expect("params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ours = p.self_signed(&key).expect("cert").pem();
        let bundle = super::super::bundle::bundle_pem(&ours, &[]).expect("bundle");
        let p12 = from_bundle(&bundle).expect("store");
        let inside = certs_in(&p12).expect("readable");
        assert_eq!(inside, certs_of_bundle(&bundle));
        assert!(certs_in(b"not pkcs12").is_none());
        assert!(from_bundle("").is_err());
    }
}
