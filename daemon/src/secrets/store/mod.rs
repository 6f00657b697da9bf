//! Where secret values live at rest. The daemon talks to one `SecretStore`; backends are the
//! file vault (the default everywhere), the macOS System keychain, and whatever comes next
//! (a HashiCorp Vault KV v2 backend needs only these four methods: list = `LIST metadata/`,
//! get = `GET data/NAME`, put = `POST data/NAME`, remove = `DELETE metadata/NAME`).
//!
//! Methods return boxed futures so a network backend fits without changing callers; the
//! local backends do their (small, rare) blocking work inline.

//!
//! * `value`: a secret's value, zeroized when dropped, never printed;
//! * `file`: the file vault, one 0600 file per secret;
//! * `keychain` (macOS): the System keychain.

pub(crate) mod file;
#[cfg(target_os = "macos")]
pub(crate) mod keychain;
pub mod value;

use std::path::PathBuf;

use futures_util::future::BoxFuture;

use crate::secrets::{SecretName, SecretValue};

pub(crate) type StoreResult<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// A stored secret, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSecret {
    pub name: SecretName,
    /// When the value was last written (RFC 3339), if the backend knows.
    pub updated: Option<String>,
}

/// Which backend holds the values, and where: `{"kind": "file", "path": …}` in JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum StoreLocation {
    /// The file vault directory.
    File { path: PathBuf },
    /// A macOS keychain file and the service name of its items.
    #[cfg_attr(not(target_os = "macos"), allow(dead_code))]
    Keychain { path: PathBuf, service: String },
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::File { path } => write!(f, "file vault {}", path.display()),
            StoreLocation::Keychain { path, service } => {
                write!(f, "keychain {} (service {service})", path.display())
            }
        }
    }
}

pub trait SecretStore: Send + Sync {
    /// The backend and where it keeps values.
    fn location(&self) -> StoreLocation;

    /// One line for logs: the backend and where it keeps values.
    fn describe(&self) -> String {
        self.location().to_string()
    }

    /// Every secret held, sorted by name.
    fn list(&self) -> StoreResult<'_, Vec<StoredSecret>>;

    /// The value, or `None` if there is no such secret.
    fn get<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, Option<SecretValue>>;

    /// Creates or replaces a secret; once this returns, the value is durable.
    fn put<'a>(&'a self, name: &'a SecretName, value: &'a SecretValue) -> StoreResult<'a, ()>;

    /// Removes a secret; `false` if there was none.
    fn remove<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, bool>;
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file or directory whose ownership or mode would expose secrets; refused, not fixed.
    #[error("{path}: {why}")]
    Insecure { path: PathBuf, why: String },
    /// A stored value that is not a valid secret (edited by hand, say).
    #[error("secret {name}: {why}")]
    BadValue { name: String, why: String },
    #[error("{0}")]
    Backend(String),
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { path, source }
    }
}

/// The store the configuration names; `create`: make the file vault if it is missing (a start
/// does), else `None` for a missing one (`run --check`).
pub fn open_store(
    cfg: &crate::config::Config,
    create: bool,
) -> Result<Option<std::sync::Arc<dyn SecretStore>>, StoreError> {
    use crate::config::SecretStoreKind;
    match cfg.secrets.store {
        SecretStoreKind::File if create => Ok(Some(std::sync::Arc::new(file::FileStore::open(
            &cfg.vault,
        )?))),
        SecretStoreKind::File => Ok(file::FileStore::open_existing(&cfg.vault)?
            .map(|s| std::sync::Arc::new(s) as std::sync::Arc<dyn SecretStore>)),
        #[cfg(target_os = "macos")]
        SecretStoreKind::Keychain => Ok(Some(std::sync::Arc::new(keychain::KeychainStore::open(
            &cfg.secrets.keychain_service,
        )?))),
        #[cfg(not(target_os = "macos"))]
        SecretStoreKind::Keychain => Err(StoreError::Backend(
            "the keychain store is available on macOS only".into(),
        )),
    }
}
