//! The agent's PEM bundle: the machine's trusted roots, the certificates of bundles the
//! machine's tools are already configured with (kept, not replaced), and our CA, each
//! certificate once.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::runtimes::CA_FILE_VARS;

/// A bundle an operator configured for the machine's tools, and where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    /// `"/etc/npmrc cafile"`, say.
    pub source: String,
    pub path: PathBuf,
}

/// The machine-wide settings that name a CA bundle, read under `etc` (`/etc` in use, a
/// fixture directory in tests): `/etc/environment` (the CA variables), npm's `cafile`, pip's
/// `cert`, git's `http.sslCAInfo`, wget's `ca_certificate`. Relative paths are ignored.
pub fn configured_bundles(etc: &Path) -> Vec<Configured> {
    let files: [(&str, &[&str]); 5] = [
        ("environment", &CA_FILE_VARS),
        ("npmrc", &["cafile"]),
        ("pip.conf", &["cert"]),
        ("gitconfig", &["sslcainfo"]),
        ("wgetrc", &["ca_certificate"]),
    ];
    let mut out: Vec<Configured> = Vec::new();
    for (file, keys) in files {
        let Ok(text) = std::fs::read_to_string(etc.join(file)) else {
            continue;
        };
        for (key, v) in super::settings::settings(&text, keys) {
            let path = PathBuf::from(v);
            if path.is_absolute() && !out.iter().any(|c| c.path == path) {
                out.push(Configured {
                    source: format!("{} {key}", etc.join(file).display()),
                    path,
                });
            }
        }
    }
    out
}

/// The bundle's text: the system's trusted roots (as `rustls-native-certs` finds them), the
/// certificates of `configured` bundles (an unreadable one is named in a comment), then our
/// CA; a certificate already in the bundle is not repeated. Fails if our CA is not a PEM
/// certificate.
pub fn bundle_pem(our_ca_pem: &str, configured: &[Configured]) -> io::Result<String> {
    let ours: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(our_ca_pem.as_bytes())
        .filter_map(Result::ok)
        .collect();
    if ours.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the AgenShield CA file holds no PEM certificate",
        ));
    }
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut out = String::new();
    for cert in rustls_native_certs::load_native_certs().certs {
        if seen.insert(cert.as_ref().to_vec()) {
            out.push_str(&pem_block(cert.as_ref()));
        }
    }
    for c in configured {
        match std::fs::read(&c.path) {
            Ok(bytes) => {
                let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
                    .filter_map(Result::ok)
                    .collect();
                out.push_str(&format!(
                    "# kept from {} ({}): {} certificates\n",
                    c.path.display(),
                    c.source,
                    certs.len()
                ));
                for cert in certs {
                    if seen.insert(cert.as_ref().to_vec()) {
                        out.push_str(&pem_block(cert.as_ref()));
                    }
                }
            }
            Err(e) => out.push_str(&format!(
                "# not kept: {} ({}): {e}\n",
                c.path.display(),
                c.source
            )),
        }
    }
    out.push_str("# AgenShield local CA\n");
    for cert in &ours {
        out.push_str(&pem_block(cert.as_ref()));
    }
    Ok(out)
}

/// The DER certificates of a PEM bundle, in order.
pub fn certs_of(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .collect()
}

/// `bytes` to `path` through a uniquely named temp file beside it and a rename, mode 0644:
/// concurrent writers each rename a complete file into place.
pub fn write_public(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".agenshield-trust.")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn pem_block(der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec![name.into()]).expect("params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key).expect("cert").pem()
    }

    #[test]
    fn the_bundle_ends_with_our_ca_and_keeps_configured_bundles_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let (corp, ours) = (cert_pem("corp.test"), cert_pem("ours.test"));
        let corp_file = d.path().join("corp.pem");
        std::fs::write(&corp_file, format!("{corp}{corp}")).expect("write");
        let configured = vec![
            Configured {
                source: "/etc/npmrc cafile".into(),
                path: corp_file.clone(),
            },
            Configured {
                source: "/etc/pip.conf cert".into(),
                path: d.path().join("missing.pem"),
            },
        ];
        let b = bundle_pem(&ours, &configured).expect("bundle");
        assert!(
            b.ends_with(&format!("# AgenShield local CA\n{ours}")),
            "{b}"
        );
        assert_eq!(b.matches(corp.trim_end()).count(), 1, "kept once");
        assert!(b.contains(&format!(
            "# kept from {} (/etc/npmrc cafile): 2 certificates",
            corp_file.display()
        )));
        assert!(
            b.contains("# not kept: ") && b.contains("missing.pem"),
            "{b}"
        );
        assert!(certs_of(&b).len() >= 2);
        assert!(bundle_pem("not a cert", &[]).is_err());
    }

    #[test]
    fn configured_bundles_are_found_in_the_machines_settings() {
        let etc = tempfile::tempdir().expect("tempdir");
        let w = |f: &str, t: &str| std::fs::write(etc.path().join(f), t).expect("write");
        w(
            "environment",
            "PATH=\"/usr/bin\"\nSSL_CERT_FILE=\"/corp/env.pem\"\n# NODE_EXTRA_CA_CERTS=/no.pem\n",
        );
        w(
            "npmrc",
            "registry=https://r.test/\ncafile = /corp/npm.pem\n",
        );
        w(
            "pip.conf",
            "[global]\ncert = /corp/pip.pem\nindex-url = x\n",
        );
        w("gitconfig", "[http]\n\tsslCAInfo = /corp/git.pem\n");
        w("wgetrc", "ca_certificate = relative.pem\n");
        let found: Vec<(String, String)> = configured_bundles(etc.path())
            .into_iter()
            .map(|c| {
                let src = c.source.rsplit('/').next().unwrap_or_default().to_string();
                (src, c.path.display().to_string())
            })
            .collect();
        let want = [
            ("environment SSL_CERT_FILE", "/corp/env.pem"),
            ("npmrc cafile", "/corp/npm.pem"),
            ("pip.conf cert", "/corp/pip.pem"),
            ("gitconfig sslcainfo", "/corp/git.pem"),
        ];
        assert_eq!(
            found,
            want.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>()
        );
    }
}
