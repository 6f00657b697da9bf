//! The local CA: load it from disk, or create and persist it once.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;

use crate::error::CaError;
use crate::leaf::{random_bytes, random_serial};

const CERT_FILE: &str = "ca.pem";
const KEY_FILE: &str = "ca-key.pem";
const CA_VALIDITY_DAYS: i64 = 3650;
/// Warn when a loaded CA is this close to expiry, so operators rotate it in time.
pub(crate) const EXPIRY_WARNING_DAYS: i64 = 30;

/// Whether [`Ca::load_or_create`] found an existing CA or made a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    /// Both files existed and were loaded.
    Loaded,
    /// Neither file existed; a new CA was generated and written.
    Created,
}

/// The local CA: certificate plus key, able to sign leaf certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
}

impl fmt::Debug for Ca {
    // Never print the key; the fingerprint identifies the CA.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("fingerprint_sha256", &self.fingerprint_sha256())
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Load `dir/ca.pem` + `dir/ca-key.pem`, or create them (ECDSA P-256) if both are absent.
    ///
    /// Creates `dir` (0755) if missing. The key is written atomically with mode 0600,
    /// the certificate with 0644. A key readable or writable by group/others is refused,
    /// as is a directory holding only one of the two files.
    pub fn load_or_create(dir: &Path) -> Result<(Ca, CaOrigin), CaError> {
        match Self::load_existing(dir)? {
            Some(ca) => Ok((ca, CaOrigin::Loaded)),
            None => Ok((
                create(dir, &dir.join(CERT_FILE), &dir.join(KEY_FILE))?,
                CaOrigin::Created,
            )),
        }
    }

    /// What [`Ca::load_or_create`] would load, without creating anything: the CA in `dir`,
    /// `None` if neither file exists (a new one would be made), an error for anything that
    /// `load_or_create` refuses.
    pub fn load_existing(dir: &Path) -> Result<Option<Ca>, CaError> {
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        match (exists(&cert_path)?, exists(&key_path)?) {
            (true, true) => Ok(Some(load(&cert_path, &key_path)?)),
            (false, false) => Ok(None),
            (true, false) => Err(CaError::HalfPresent {
                present: cert_path,
                missing: key_path,
            }),
            (false, true) => Err(CaError::HalfPresent {
                present: key_path,
                missing: cert_path,
            }),
        }
    }

    /// The CA certificate in PEM form (what users install into trust stores).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate in DER form (the last element of every leaf chain).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// SHA-256 fingerprint of the CA certificate DER, uppercase hex joined by colons.
    pub fn fingerprint_sha256(&self) -> String {
        fingerprint(&self.cert_der)
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

fn exists(path: &Path) -> Result<bool, CaError> {
    path.try_exists().map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })
}

fn load(cert_path: &Path, key_path: &Path) -> Result<Ca, CaError> {
    // Check permissions before reading, so a leaked key is never silently used.
    let meta = fs::metadata(key_path).map_err(|source| CaError::Read {
        path: key_path.to_owned(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(CaError::KeyPermissions {
            path: key_path.to_owned(),
            mode,
        });
    }
    let key_pem = read_to_string(key_path)?;
    let key = KeyPair::from_pem(&key_pem).map_err(|source| CaError::Key {
        path: key_path.to_owned(),
        source,
    })?;
    let cert_pem = read_to_string(cert_path)?;
    let ca = from_parts(cert_path, key_path, cert_pem, key)?;
    tracing::debug!(cert = ?cert_path, fingerprint = %ca.fingerprint_sha256(), "loaded CA");
    Ok(ca)
}

/// Validates a cert/key pair and builds the signing [`Issuer`] from the certificate itself,
/// so loaded and freshly created CAs take the same path.
fn from_parts(
    cert_path: &Path,
    key_path: &Path,
    cert_pem: String,
    key: KeyPair,
) -> Result<Ca, CaError> {
    let not_ca = |reason: String| CaError::NotCa {
        path: cert_path.to_owned(),
        reason,
    };
    let mut certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes());
    let cert_der = match (certs.next(), certs.next()) {
        (Some(Ok(der)), None) => der,
        _ => {
            return Err(CaError::CertPem {
                path: cert_path.to_owned(),
            })
        }
    };
    let (_, x509) = x509_parser::parse_x509_certificate(&cert_der)
        .map_err(|e| not_ca(format!("cannot parse X.509: {e}")))?;
    let bc = x509
        .basic_constraints()
        .map_err(|e| not_ca(format!("bad basicConstraints: {e}")))?;
    if !bc.is_some_and(|bc| bc.value.ca) {
        return Err(not_ca("basicConstraints does not say CA:true".into()));
    }
    // Compare raw public keys: robust to how algorithm parameters were encoded.
    if x509.public_key().subject_public_key.data.as_ref() != key.der_bytes() {
        return Err(CaError::KeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
        });
    }
    let not_after = x509.validity().not_after.to_datetime();
    let now = OffsetDateTime::now_utc();
    if not_after < now {
        tracing::warn!(cert = ?cert_path, not_after = %not_after.date(), "CA certificate has expired; clients will reject every leaf");
    } else if not_after < now + time::Duration::days(EXPIRY_WARNING_DAYS) {
        tracing::warn!(cert = ?cert_path, not_after = %not_after.date(), "CA certificate expires soon");
    }
    let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| not_ca(e.to_string()))?;
    Ok(Ca {
        issuer,
        cert_pem,
        cert_der,
    })
}

fn create(dir: &Path, cert_path: &Path, key_path: &Path) -> Result<Ca, CaError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| CaError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;

    let generate = |source| CaError::Generate { source };
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(generate)?;
    let params = ca_params()?;
    let cert = params.self_signed(&key).map_err(generate)?;
    let cert_pem = cert.pem();
    let key_pem = key.serialize_pem();

    // Both temp files are complete and synced before either rename, which keeps the
    // window for a half-present CA (refused on next start) as small as possible.
    let key_tmp = write_temp(dir, KEY_FILE, key_pem.as_bytes(), 0o600)?;
    let cert_tmp = match write_temp(dir, CERT_FILE, cert_pem.as_bytes(), 0o644) {
        Ok(tmp) => tmp,
        Err(e) => {
            let _ = fs::remove_file(&key_tmp);
            return Err(e);
        }
    };
    rename(&key_tmp, key_path)?;
    rename(&cert_tmp, cert_path)?;
    if let Ok(d) = File::open(dir) {
        // Persist the directory entries; best effort (not all filesystems support it).
        let _ = d.sync_all();
    }

    let ca = from_parts(cert_path, key_path, cert_pem, key)?;
    tracing::info!(cert = ?cert_path, fingerprint = %ca.fingerprint_sha256(), "created new CA");
    Ok(ca)
}

fn ca_params() -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    // A random suffix keeps two installs distinguishable in trust-store UIs.
    let suffix: String = random_bytes::<4>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("AgenShield Local CA {suffix}"));
    dn.push(DnType::OrganizationName, "AgenShield");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial()?);
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(CA_VALIDITY_DAYS);
    Ok(params)
}

fn read_to_string(path: &Path) -> Result<String, CaError> {
    fs::read_to_string(path).map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Writes `data` to a fresh temp file next to `name` with `mode` set from creation, fsynced.
fn write_temp(dir: &Path, name: &str, data: &[u8], mode: u32) -> Result<PathBuf, CaError> {
    let suffix: String = random_bytes::<6>()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tmp = dir.join(format!(".{name}.tmp-{suffix}"));
    let write = |tmp: &Path| -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(tmp)?;
        // The umask may have cleared bits at creation; set the exact mode explicitly.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()
    };
    write(&tmp).map_err(|source| {
        let _ = fs::remove_file(&tmp);
        CaError::Write {
            path: tmp.clone(),
            source,
        }
    })?;
    Ok(tmp)
}

fn rename(from: &Path, to: &Path) -> Result<(), CaError> {
    fs::rename(from, to).map_err(|source| {
        let _ = fs::remove_file(from);
        CaError::Write {
            path: to.to_owned(),
            source,
        }
    })
}

/// SHA-256 of `der`, uppercase hex joined by colons.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_ca_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nested").join("ca");
        let (created, origin) = Ca::load_or_create(&dir).unwrap();
        assert_eq!(origin, CaOrigin::Created);
        assert_eq!(mode(&dir), 0o755);
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join(CERT_FILE)), 0o644);

        let (loaded, origin) = Ca::load_or_create(&dir).unwrap();
        assert_eq!(origin, CaOrigin::Loaded);
        assert_eq!(loaded.fingerprint_sha256(), created.fingerprint_sha256());
        assert_eq!(loaded.cert_der(), created.cert_der());
        assert_eq!(loaded.cert_pem(), created.cert_pem());
        // No temp files left behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2);
    }

    #[test]
    fn ca_certificate_has_expected_fields() {
        let tmp = tempfile::tempdir().unwrap();
        let (ca, _) = Ca::load_or_create(tmp.path()).unwrap();
        let (_, x509) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
        let bc = x509.basic_constraints().unwrap().unwrap();
        assert!(bc.critical && bc.value.ca);
        assert_eq!(bc.value.path_len_constraint, Some(0));
        let ku = x509.key_usage().unwrap().unwrap().value;
        assert!(ku.key_cert_sign() && ku.crl_sign());
        let cn = x509.subject().iter_common_name().next().unwrap();
        assert!(cn.as_str().unwrap().starts_with("AgenShield Local CA "));
        let org = x509.subject().iter_organization().next().unwrap();
        assert_eq!(org.as_str().unwrap(), "AgenShield");
        assert_eq!(x509.raw_serial().len(), 16);
        assert!(x509.raw_serial()[0] & 0x80 == 0, "serial must be positive");
        let v = x509.validity();
        let lifetime = v.not_after.to_datetime() - v.not_before.to_datetime();
        assert!(lifetime > time::Duration::days(3649));
        assert!(OffsetDateTime::now_utc() - v.not_before.to_datetime() >= time::Duration::hours(1));

        let fp = ca.fingerprint_sha256();
        assert_eq!(fp.len(), 32 * 3 - 1);
        assert!(fp
            .chars()
            .all(|c| c == ':' || c.is_ascii_digit() || c.is_ascii_uppercase()));
    }

    #[test]
    fn two_installs_are_distinguishable() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (ca_a, _) = Ca::load_or_create(a.path()).unwrap();
        let (ca_b, _) = Ca::load_or_create(b.path()).unwrap();
        let cn = |ca: &Ca| {
            let (_, x) = x509_parser::parse_x509_certificate(ca.cert_der()).unwrap();
            x.subject().to_string()
        };
        assert_ne!(cn(&ca_a), cn(&ca_b));
        assert_ne!(ca_a.fingerprint_sha256(), ca_b.fingerprint_sha256());
    }

    #[test]
    fn refuses_group_or_world_accessible_key() {
        let tmp = tempfile::tempdir().unwrap();
        Ca::load_or_create(tmp.path()).unwrap();
        let key = tmp.path().join(KEY_FILE);
        for bad in [0o644, 0o640, 0o604, 0o620] {
            fs::set_permissions(&key, fs::Permissions::from_mode(bad)).unwrap();
            let err = Ca::load_or_create(tmp.path()).unwrap_err();
            assert!(matches!(err, CaError::KeyPermissions { mode, .. } if mode == bad));
            let msg = err.to_string();
            assert!(msg.contains(&format!("mode {bad:04o}")), "{msg}");
            assert!(
                msg.contains(&format!("chmod 600 {}", key.display())),
                "{msg}"
            );
        }
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).unwrap();
        assert!(Ca::load_or_create(tmp.path()).is_ok());
    }

    #[test]
    fn refuses_half_present_ca() {
        for keep in [CERT_FILE, KEY_FILE] {
            let tmp = tempfile::tempdir().unwrap();
            Ca::load_or_create(tmp.path()).unwrap();
            let removed = if keep == CERT_FILE {
                KEY_FILE
            } else {
                CERT_FILE
            };
            fs::remove_file(tmp.path().join(removed)).unwrap();
            let err = Ca::load_or_create(tmp.path()).unwrap_err();
            assert!(matches!(err, CaError::HalfPresent { .. }), "{err}");
            assert!(err.to_string().contains(removed));
            // Nothing was regenerated over the remaining file.
            assert!(!tmp.path().join(removed).exists());
        }
    }

    #[test]
    fn refuses_mismatched_key() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        Ca::load_or_create(a.path()).unwrap();
        Ca::load_or_create(b.path()).unwrap();
        fs::copy(b.path().join(KEY_FILE), a.path().join(KEY_FILE)).unwrap();
        let err = Ca::load_or_create(a.path()).unwrap_err();
        assert!(matches!(err, CaError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn refuses_non_ca_certificate() {
        let tmp = tempfile::tempdir().unwrap();
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = CertificateParams::new(vec!["leaf.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        fs::write(tmp.path().join(CERT_FILE), cert.pem()).unwrap();
        let key_path = tmp.path().join(KEY_FILE);
        fs::write(&key_path, key.serialize_pem()).unwrap();
        fs::set_permissions(&key_path, fs::Permissions::from_mode(0o600)).unwrap();
        let err = Ca::load_or_create(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::NotCa { .. }), "{err}");
    }

    #[test]
    fn refuses_garbage_files() {
        let tmp = tempfile::tempdir().unwrap();
        Ca::load_or_create(tmp.path()).unwrap();
        fs::write(tmp.path().join(CERT_FILE), "not a certificate").unwrap();
        let err = Ca::load_or_create(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::CertPem { .. }), "{err}");

        let key_path = tmp.path().join(KEY_FILE);
        fs::write(&key_path, "not a key").unwrap();
        let err = Ca::load_or_create(tmp.path()).unwrap_err();
        assert!(matches!(err, CaError::Key { .. }), "{err}");
    }
}
