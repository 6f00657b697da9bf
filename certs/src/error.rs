//! The crate's single error type.
//!
//! Display strings are one operator-readable line and never repeat the `#[source]`;
//! print the chain (e.g. anyhow's `{:#}`) to see the underlying cause.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Errors from loading/creating the CA and from minting leaf certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// The CA directory could not be created.
    #[error("cannot create CA directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A CA file could not be read or inspected.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A CA file could not be written.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The CA private key is accessible to other users.
    #[error(
        "CA key {path} is readable or writable by group/others (mode {mode:04o}); run: chmod 600 {path}"
    )]
    KeyPermissions { path: PathBuf, mode: u32 },

    /// Exactly one of `ca.pem` / `ca-key.pem` exists.
    #[error(
        "found {present} but not {missing}; refusing to create a new CA over a partial one \
         (restore {missing}, or remove {present} to create a new CA)"
    )]
    HalfPresent { present: PathBuf, missing: PathBuf },

    /// The certificate file holds no parseable PEM certificate (or more than one).
    #[error("{path} must contain exactly one PEM certificate")]
    CertPem { path: PathBuf },

    /// The certificate could not be parsed, or is not usable as a CA.
    #[error("{path} is not a usable CA certificate: {reason}")]
    NotCa { path: PathBuf, reason: String },

    /// The key file does not hold a usable PKCS#8 private key.
    #[error("{path} does not contain a usable PKCS#8 private key")]
    Key {
        path: PathBuf,
        #[source]
        source: rcgen::Error,
    },

    /// The key does not belong to the certificate.
    #[error("CA key {key} does not match the certificate {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },

    /// Generating the CA key or certificate failed.
    #[error("cannot generate a new CA")]
    Generate {
        #[source]
        source: rcgen::Error,
    },

    /// The system random number generator failed.
    #[error("the system random number generator failed")]
    Random,

    /// A server name was rejected by [`LeafName::parse`](crate::LeafName::parse).
    #[error("invalid server name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },

    /// The configured leaf validity does not fit in a certificate.
    #[error("leaf validity {validity:?} is out of range")]
    LeafValidity { validity: Duration },

    /// Building or signing a leaf certificate failed.
    #[error("cannot mint a leaf certificate for {name}")]
    Mint {
        name: String,
        #[source]
        source: rcgen::Error,
    },

    /// rustls refused the freshly generated leaf key.
    #[error("cannot load the leaf key for {name} into rustls")]
    LeafKey {
        name: String,
        #[source]
        source: rustls::Error,
    },

    /// A minting error shared by several concurrent callers (single-flight).
    #[error(transparent)]
    Shared(Arc<CaError>),
}
