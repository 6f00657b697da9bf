//! The bundle's signature: a minisign signature (`minisign -S`, prehashed Ed25519) by the
//! key whose public half is `policy.source.public_key`, checked with `minisign-verify` on
//! the bundle's bytes before anything reads them.

use std::path::Path;

use minisign_verify::{PublicKey, Signature};

/// The public key a bundle must be signed by.
pub struct BundleKey(PublicKey);

/// Why a key or a signature is refused.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("policy.source.public_key {path}: {source}")]
    ReadKey {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("policy.source.public_key {path}: not a minisign public key ({why})")]
    Key { path: String, why: String },
    #[error("the signature is not a minisign signature ({0})")]
    Malformed(String),
    #[error("the signature was made by another key (key id differs)")]
    OtherKey,
    #[error("the signature does not match the bundle's bytes")]
    Mismatch,
    #[error("the signature does not verify: {0}")]
    Other(String),
}

impl BundleKey {
    /// Reads a minisign public key file (`minisign -G` writes `untrusted comment:` and the
    /// base64 key) or a file holding the base64 line alone.
    pub fn load(path: &Path) -> Result<BundleKey, SignatureError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| SignatureError::ReadKey {
            path: shown.clone(),
            source,
        })?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("untrusted comment:"))
            .unwrap_or("");
        PublicKey::from_base64(line)
            .map(BundleKey)
            .map_err(|e| SignatureError::Key {
                path: shown,
                why: e.to_string(),
            })
    }

    /// Verifies `signature` (the `.minisig` file's text) over `bundle`.
    pub fn verify(&self, bundle: &[u8], signature: &[u8]) -> Result<(), SignatureError> {
        let text = std::str::from_utf8(signature)
            .map_err(|_| SignatureError::Malformed("not text".into()))?;
        let sig = Signature::decode(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
        self.0.verify(bundle, &sig, false).map_err(|e| match e {
            minisign_verify::Error::UnexpectedKeyId => SignatureError::OtherKey,
            minisign_verify::Error::InvalidSignature => SignatureError::Mismatch,
            other => SignatureError::Other(other.to_string()),
        })
    }
}
