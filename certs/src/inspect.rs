//! What a CA certificate says about itself, read without its key: for checks (`doctor`) that
//! must not touch the private key.

use time::OffsetDateTime;

/// The facts of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// The subject, as `CN=…, O=…`.
    pub subject: String,
    pub not_after: OffsetDateTime,
    /// basicConstraints says CA:true.
    pub is_ca: bool,
    /// SHA-256 of the DER, uppercase hex joined by colons (as [`crate::Ca::fingerprint_sha256`]).
    pub fingerprint_sha256: String,
}

/// Whether a certificate's validity has run out, or will within the warning window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Valid,
    ExpiresSoon,
    Expired,
}

impl CertFacts {
    pub fn expiry(&self, now: OffsetDateTime) -> Expiry {
        if self.not_after < now {
            Expiry::Expired
        } else if self.not_after < now + time::Duration::days(crate::ca::EXPIRY_WARNING_DAYS) {
            Expiry::ExpiresSoon
        } else {
            Expiry::Valid
        }
    }
}

/// Parses one DER certificate.
pub fn inspect(der: &[u8]) -> Result<CertFacts, String> {
    let (_, x509) =
        x509_parser::parse_x509_certificate(der).map_err(|e| format!("cannot parse X.509: {e}"))?;
    let is_ca = x509
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|bc| bc.value.ca);
    Ok(CertFacts {
        subject: x509.subject().to_string(),
        not_after: x509.validity().not_after.to_datetime(),
        is_ca,
        fingerprint_sha256: crate::ca::fingerprint(der),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_ca_is_described() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca, _) = crate::Ca::load_or_create(dir.path()).expect("ca");
        let facts = inspect(ca.cert_der()).expect("inspect");
        assert!(facts.is_ca);
        assert!(facts.subject.contains("AgenShield"), "{}", facts.subject);
        assert_eq!(facts.fingerprint_sha256, ca.fingerprint_sha256());
        let now = OffsetDateTime::now_utc();
        assert_eq!(facts.expiry(now), Expiry::Valid);
        assert_eq!(
            facts.expiry(facts.not_after - time::Duration::days(1)),
            Expiry::ExpiresSoon
        );
        assert_eq!(
            facts.expiry(facts.not_after + time::Duration::days(1)),
            Expiry::Expired
        );
        assert!(inspect(b"not a certificate").is_err());
    }
}
