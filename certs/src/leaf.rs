//! Server names for leaves, and minting a leaf certificate signed by the CA.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use crate::ca::Ca;
use crate::error::CaError;

/// Backdating covers clients whose clocks run a little behind ours.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);
const MAX_NAME_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;
/// Cap on how much of a rejected input is echoed into an error message.
const MAX_ECHO: usize = 64;

/// What a leaf certificate is for: a DNS name or an IP literal.
///
/// Build it with [`LeafName::parse`], which normalizes DNS names (lowercase, no trailing dot).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeafName {
    /// A normalized DNS name, e.g. `api.example.com` or `*.example.com`.
    Dns(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl LeafName {
    /// Parses a server name (SNI, Host header or CONNECT target without port).
    ///
    /// IP literals (v4, v6, v6 in `[brackets]`) become [`LeafName::Ip`]. Anything else must be
    /// a DNS name: it is lowercased and one trailing dot removed; empty names, names over 253
    /// chars, empty labels or labels over 63 chars, and characters outside `[a-z0-9-_.*]` are
    /// rejected. `*` is only accepted as a whole leftmost label (a wildcard).
    pub fn parse(s: &str) -> Result<LeafName, CaError> {
        let invalid = |reason| CaError::InvalidName {
            name: s.chars().take(MAX_ECHO).collect(),
            reason,
        };
        if let Some(inner) = s.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| invalid("unbalanced '['"))?;
            let ip: Ipv6Addr = inner
                .parse()
                .map_err(|_| invalid("brackets must enclose an IPv6 address"))?;
            return Ok(LeafName::Ip(IpAddr::V6(ip)));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(LeafName::Ip(ip));
        }

        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        if name.is_empty() {
            return Err(invalid("empty name"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(invalid("longer than 253 characters"));
        }
        for (i, label) in name.split('.').enumerate() {
            if label.is_empty() {
                return Err(invalid("empty label"));
            }
            if label.len() > MAX_LABEL_LEN {
                return Err(invalid("label longer than 63 characters"));
            }
            if label == "*" {
                if i != 0 {
                    return Err(invalid("'*' is only allowed as the leftmost label"));
                }
                continue;
            }
            let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
            if !label.chars().all(ok) {
                return Err(invalid("characters must be in [a-z0-9-_.*]"));
            }
        }
        if name == "*" {
            return Err(invalid("a bare '*' is not a name"));
        }
        Ok(LeafName::Dns(name))
    }
}

impl fmt::Display for LeafName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeafName::Dns(name) => f.write_str(name),
            LeafName::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Mints one leaf for `name`: fresh P-256 key, SAN = name, signed by the CA.
///
/// Returns a rustls [`CertifiedKey`] whose chain is `[leaf, CA]`.
pub(crate) fn mint(ca: &Ca, name: &LeafName, validity: Duration) -> Result<CertifiedKey, CaError> {
    let mint_err = |source| CaError::Mint {
        name: name.to_string(),
        source,
    };
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(mint_err)?;

    let now = OffsetDateTime::now_utc();
    let not_after = time::Duration::try_from(validity)
        .ok()
        .and_then(|v| now.checked_add(v))
        .ok_or(CaError::LeafValidity { validity })?;

    let mut params = CertificateParams::default();
    params.not_before = now - CLOCK_SKEW;
    params.not_after = not_after;
    params.serial_number = Some(random_serial()?);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name.to_string());
    params.distinguished_name = dn;
    params.subject_alt_names = vec![match name {
        LeafName::Dns(dns) => SanType::DnsName(dns.clone().try_into().map_err(mint_err)?),
        LeafName::Ip(ip) => SanType::IpAddress(*ip),
    }];
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;

    let cert = params.signed_by(&key, ca.issuer()).map_err(mint_err)?;

    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signer = rustls::crypto::ring::sign::any_ecdsa_type(&key_der).map_err(|source| {
        CaError::LeafKey {
            name: name.to_string(),
            source,
        }
    })?;
    let chain = vec![cert.der().clone(), ca.cert_der().clone()];
    Ok(CertifiedKey::new(chain, signer))
}

/// Fills `N` bytes from the OS CSPRNG.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], CaError> {
    use ring::rand::SecureRandom;
    let mut buf = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| CaError::Random)?;
    Ok(buf)
}

/// A random, positive, exactly 16-byte serial (126 bits of entropy).
pub(crate) fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = random_bytes::<16>()?;
    // Clear the sign bit (positive INTEGER) and set the next one so DER keeps all 16 bytes.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

    pub(crate) fn test_ca() -> (tempfile::TempDir, Ca) {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = Ca::load_or_create(dir.path()).unwrap();
        (dir, ca)
    }

    /// Verifies `leaf` chains to `ca` for server auth and is valid for `name`.
    fn verify(ca: &Ca, leaf: &CertificateDer<'_>, name: &str) -> Result<(), webpki::Error> {
        let anchor = webpki::anchor_from_trusted_cert(ca.cert_der())?;
        let ee = webpki::EndEntityCert::try_from(leaf)?;
        ee.verify_for_usage(
            &[webpki::ring::ECDSA_P256_SHA256],
            &[anchor],
            &[],
            UnixTime::now(),
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )?;
        let name = ServerName::try_from(name).unwrap();
        ee.verify_is_valid_for_subject_name(&name)
    }

    fn parse(s: &str) -> LeafName {
        LeafName::parse(s).unwrap()
    }

    #[test]
    fn parse_normalizes_dns_names() {
        assert_eq!(
            parse("API.Example.COM"),
            LeafName::Dns("api.example.com".into())
        );
        assert_eq!(parse("example.com."), LeafName::Dns("example.com".into()));
        assert_eq!(parse("localhost"), LeafName::Dns("localhost".into()));
        assert_eq!(
            parse("_dmarc.a-b.test"),
            LeafName::Dns("_dmarc.a-b.test".into())
        );
        assert_eq!(
            parse("*.example.com"),
            LeafName::Dns("*.example.com".into())
        );
        assert_eq!(parse("A.Test.").to_string(), "a.test");
    }

    #[test]
    fn parse_recognizes_ip_literals() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(parse("10.1.2.3"), LeafName::Ip(v4));
        assert_eq!(parse("2001:db8::1"), LeafName::Ip(v6));
        assert_eq!(parse("[2001:db8::1]"), LeafName::Ip(v6));
        assert_eq!(parse("[::1]").to_string(), "::1");
    }

    #[test]
    fn parse_rejects_invalid_names() {
        let long_label = format!("{}.test", "a".repeat(64));
        let long_name = vec!["abcdefghi"; 26].join("."); // 259 chars
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "exa mple.com",
            "exa$mple.com",
            "example.com:443",
            "ex\u{e4}mple.com",
            "a/b",
            long_label.as_str(),
            long_name.as_str(),
            "*",
            "a.*.test",
            "a*.test",
            "[10.0.0.1]",
            "[::1",
            "fe80::1%eth0",
        ] {
            let err = LeafName::parse(bad).expect_err(bad);
            assert!(matches!(err, CaError::InvalidName { .. }), "{bad}: {err}");
        }
        let max_label = format!("{}.test", "a".repeat(63));
        assert!(LeafName::parse(&max_label).is_ok());
        let huge = "x".repeat(10_000);
        let msg = LeafName::parse(&huge).unwrap_err().to_string();
        assert!(msg.len() < 200, "error echoes the whole input: {msg}");
    }

    #[test]
    fn dns_leaf_verifies_against_ca() {
        let (_dir, ca) = test_ca();
        let leaf = mint(&ca, &parse("a.test"), Duration::from_secs(3600)).unwrap();
        assert_eq!(leaf.cert.len(), 2);
        assert_eq!(&leaf.cert[1], ca.cert_der());
        verify(&ca, &leaf.cert[0], "a.test").unwrap();
        assert!(verify(&ca, &leaf.cert[0], "b.test").is_err());
        assert!(verify(&ca, &leaf.cert[0], "x.a.test").is_err());
        leaf.keys_match().unwrap();
    }

    #[test]
    fn ip_leaf_verifies_against_ca() {
        let (_dir, ca) = test_ca();
        for ip in ["127.0.0.1", "::1"] {
            let leaf = mint(&ca, &parse(ip), Duration::from_secs(3600)).unwrap();
            verify(&ca, &leaf.cert[0], ip).unwrap();
            assert!(verify(&ca, &leaf.cert[0], "127.0.0.2").is_err());
        }
    }

    #[test]
    fn leaf_from_other_ca_does_not_verify() {
        let (_d1, ca) = test_ca();
        let (_d2, other) = test_ca();
        let leaf = mint(&other, &parse("a.test"), Duration::from_secs(3600)).unwrap();
        assert!(verify(&ca, &leaf.cert[0], "a.test").is_err());
        verify(&other, &leaf.cert[0], "a.test").unwrap();
    }

    #[test]
    fn leaf_from_reloaded_ca_verifies_against_original() {
        let (dir, ca) = test_ca();
        let (reloaded, _) = Ca::load_or_create(dir.path()).unwrap();
        let leaf = mint(&reloaded, &parse("a.test"), Duration::from_secs(3600)).unwrap();
        verify(&ca, &leaf.cert[0], "a.test").unwrap();
    }

    #[test]
    fn leaf_has_expected_fields() {
        use x509_parser::extensions::GeneralName;
        let (_dir, ca) = test_ca();
        let validity = Duration::from_secs(7 * 3600);
        let leaf = mint(&ca, &parse("a.test"), validity).unwrap();
        let (_, x) = x509_parser::parse_x509_certificate(&leaf.cert[0]).unwrap();
        let (_, ca_x) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();

        let v = x.validity();
        let lifetime = v.not_after.to_datetime() - v.not_before.to_datetime();
        let expected = time::Duration::try_from(validity).unwrap() + CLOCK_SKEW;
        assert!(
            (lifetime - expected).abs() <= time::Duration::seconds(2),
            "{lifetime}"
        );
        let now = OffsetDateTime::now_utc();
        assert!(v.not_before.to_datetime() <= now - time::Duration::minutes(4));

        assert_eq!(x.raw_serial().len(), 16);
        assert!(x.raw_serial()[0] & 0x80 == 0);
        let cn = x.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "a.test");
        let san = x.subject_alternative_name().unwrap().unwrap().value;
        assert_eq!(san.general_names, vec![GeneralName::DNSName("a.test")]);
        let bc = x.basic_constraints().unwrap().unwrap().value;
        assert!(!bc.ca);
        let ku = x.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && !ku.key_cert_sign());
        let eku = x.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth);
        use x509_parser::extensions::ParsedExtension;
        let aki = x
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(k) => k.key_identifier.as_ref(),
                _ => None,
            })
            .unwrap();
        let ca_ski = ca_x
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => Some(k),
                _ => None,
            })
            .unwrap();
        assert_eq!(aki.0, ca_ski.0);
        assert_eq!(x.issuer(), ca_x.subject());
    }

    #[test]
    fn leaves_for_same_name_have_distinct_serials_and_keys() {
        let (_d1, ca1) = test_ca();
        let (_d2, ca2) = test_ca();
        let name = parse("a.test");
        let day = Duration::from_secs(86_400);
        let leaves = [
            mint(&ca1, &name, day).unwrap(),
            mint(&ca1, &name, day).unwrap(),
            mint(&ca2, &name, day).unwrap(),
        ];
        let parsed: Vec<_> = leaves
            .iter()
            .map(|l| x509_parser::parse_x509_certificate(&l.cert[0]).unwrap().1)
            .collect();
        for i in 0..parsed.len() {
            for j in i + 1..parsed.len() {
                assert_ne!(parsed[i].raw_serial(), parsed[j].raw_serial());
                assert_ne!(parsed[i].public_key().raw, parsed[j].public_key().raw);
            }
        }
    }

    #[test]
    fn absurd_validity_is_an_error() {
        let (_dir, ca) = test_ca();
        let err = mint(&ca, &parse("a.test"), Duration::MAX).unwrap_err();
        assert!(matches!(err, CaError::LeafValidity { .. }), "{err}");
    }
}
