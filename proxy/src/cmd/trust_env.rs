//! Making an agent's tools trust our CA: a PEM bundle of the system roots plus ours, and the
//! environment variables the common tools read it from. Used by `install` (the agent user's
//! environment) and `exec` (the child's environment).

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::Path;

/// The variables, and who reads them: OpenSSL and Go-less tools (`SSL_CERT_FILE`), Python
/// requests (`REQUESTS_CA_BUNDLE`), Node (`NODE_EXTRA_CA_CERTS`, added to its own roots),
/// curl (`CURL_CA_BUNDLE`), git (`GIT_SSL_CAINFO`), pip (`PIP_CERT`), Deno (`DENO_CERT`),
/// the AWS SDKs and CLI (`AWS_CA_BUNDLE`).
pub const CA_ENV_VARS: [&str; 8] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "DENO_CERT",
    "AWS_CA_BUNDLE",
];

/// Every CA variable pointing at `bundle`.
pub fn env_for(bundle: &Path) -> Vec<(&'static str, OsString)> {
    CA_ENV_VARS
        .iter()
        .map(|k| (*k, bundle.as_os_str().to_owned()))
        .collect()
}

/// The bundle's text: the system's trusted roots (as `rustls-native-certs` finds them), then
/// our CA. Fails if our CA is not a PEM certificate.
pub fn bundle_pem(our_ca_pem: &str) -> io::Result<String> {
    if !our_ca_pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the AgenShield CA file holds no PEM certificate",
        ));
    }
    let native = rustls_native_certs::load_native_certs();
    let mut out = String::new();
    for cert in native.certs {
        out.push_str(&pem_block(cert.as_ref()));
    }
    out.push_str("# AgenShield local CA\n");
    out.push_str(our_ca_pem.trim_end());
    out.push('\n');
    Ok(out)
}

/// Writes the bundle to `out` atomically (a uniquely named temp file beside it, then a
/// rename), mode 0644. Concurrent writers each rename a complete file into place.
pub fn write_bundle(our_ca: &Path, out: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let pem = std::fs::read_to_string(our_ca)?;
    let text = bundle_pem(&pem)?;
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".ca-bundle.")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(out).map_err(|e| e.error)?;
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

    #[test]
    fn every_variable_points_at_the_bundle() {
        let env = env_for(Path::new("/opt/agenshield/certs/agent-bundle.pem"));
        assert_eq!(env.len(), 8);
        assert!(env
            .iter()
            .all(|(_, v)| v == "/opt/agenshield/certs/agent-bundle.pem"));
    }

    #[test]
    fn the_bundle_ends_with_our_ca_and_parses() {
        let ours = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let b = bundle_pem(ours).expect("bundle");
        assert!(b.trim_end().ends_with("-----END CERTIFICATE-----"));
        assert!(b.contains("# AgenShield local CA\n-----BEGIN CERTIFICATE-----\nMIIB"));
        assert!(bundle_pem("not a cert").is_err());
    }
}
