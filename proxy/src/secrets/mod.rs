//! Secrets: the agent never holds a credential.
//!
//! * `value`, `store`, `file_store` (and `keychain` on macOS): names, zeroized values and
//!   where they live at rest.
//! * `placeholder`: what the agent holds instead (`agenshield:secret:NAME`).
//! * `matcher`, `stream`: one automaton over every value and placeholder, applied to whole
//!   texts and across body chunks.

pub mod file_store;
pub mod inject;
#[cfg(target_os = "macos")]
pub mod keychain;
pub mod matcher;
pub mod phase;
pub mod placeholder;
pub mod redact;
pub mod scan;
pub mod scan_body;
pub mod set;
pub mod store;
pub mod stream;
pub mod value;
pub mod vault;

pub use file_store::FileStore;
pub use scan::{SecretRefusal, Violation};
pub use set::SecretSet;
pub use store::{SecretStore, StoreError, StoredSecret};
pub use value::{SecretName, SecretValue};
pub use vault::{SecretStatus, Vault};

/// The store the configuration names.
pub fn open_store(
    cfg: &crate::config::Config,
) -> Result<std::sync::Arc<dyn SecretStore>, StoreError> {
    use crate::config::SecretStoreKind;
    match cfg.secrets.store {
        SecretStoreKind::File => Ok(std::sync::Arc::new(FileStore::open(&cfg.vault)?)),
        #[cfg(target_os = "macos")]
        SecretStoreKind::Keychain => Ok(std::sync::Arc::new(keychain::KeychainStore::open(
            &cfg.secrets.keychain_service,
        )?)),
        #[cfg(not(target_os = "macos"))]
        SecretStoreKind::Keychain => Err(StoreError::Backend(
            "the keychain store is available on macOS only".into(),
        )),
    }
}
