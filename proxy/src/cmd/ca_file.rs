//! The CA certificate file as the commands read it (`ctl ca`, `run --check`): exactly one
//! certificate, and what it says about itself. The key is never opened here.

use std::path::Path;

use agenshield_certs::CertFacts;

/// The PEM text of the CA certificate at `path` and its facts; the reason, with the OS
/// error, when it cannot be read or is not one certificate.
pub(crate) fn read(path: &Path) -> Result<(String, CertFacts), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the CA certificate {}: {e}", path.display()))?;
    let certs = crate::cmd::trust::bundle::certs_of(&text);
    let [der] = certs.as_slice() else {
        return Err(format!(
            "{} holds {} certificates, not one CA",
            path.display(),
            certs.len()
        ));
    };
    let facts =
        agenshield_certs::inspect(der.as_ref()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((text, facts))
}
