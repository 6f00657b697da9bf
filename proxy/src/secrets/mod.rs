//! Secrets: the agent never holds a credential.
//!
//! * `value`, `store`, `file_store` (and `keychain` on macOS): names, zeroized values and
//!   where they live at rest.
//! * `placeholder`: what the agent holds instead (`agenshield:secret:NAME`).
//! * `matcher`, `stream`: one automaton over every value and placeholder, applied to whole
//!   texts and across body chunks; `set`: the secrets loaded now, with that automaton;
//!   `vault`: the store, the set swapped in on change, use times and fetched values.
//! * `provider`, `command`, `oauth`: secrets the daemon fetches (a command's output, an
//!   OAuth2 client-credentials token) rather than holds.
//! * `phase`: the pipeline's secret phases for one request; `scan` (the head) and
//!   `scan_body`, `swap` (the body, as it streams) are the leak guard and the placeholder
//!   swap; `inject`: what a rule's `inject` entries set; `websocket`: the same per message.
//! * `redact`: values never reach the agent in a response; `aws_fields`: credentials an AWS
//!   response hands out, redacted.
//! * `sigv4`, `aws_chunked`: AWS Signature V4 made again with keys the agent never holds, for
//!   a whole body or chunk by chunk.

pub(crate) mod aws_chunked;
pub(crate) mod aws_fields;
pub(crate) mod command;
pub(crate) mod file_store;
pub(crate) mod inject;
#[cfg(target_os = "macos")]
pub(crate) mod keychain;
pub(crate) mod matcher;
pub(crate) mod oauth;
pub(crate) mod phase;
pub(crate) mod placeholder;
pub(crate) mod provider;
pub(crate) mod redact;
pub(crate) mod scan;
pub(crate) mod scan_body;
pub(crate) mod set;
pub(crate) mod sigv4;
pub(crate) mod store;
pub(crate) mod stream;
pub(crate) mod swap;
pub(crate) mod value;
pub(crate) mod vault;
pub(crate) mod websocket;

pub(crate) use file_store::FileStore;
pub(crate) use scan::{SecretRefusal, Violation};
pub(crate) use store::{SecretStore, StoreError};
pub(crate) use value::{SecretName, SecretValue};
pub(crate) use vault::Vault;

/// The store the configuration names; `create`: make the file vault if it is missing (a start
/// does), else `None` for a missing one (`run --check`).
pub(crate) fn open_store(
    cfg: &crate::config::Config,
    create: bool,
) -> Result<Option<std::sync::Arc<dyn SecretStore>>, StoreError> {
    use crate::config::SecretStoreKind;
    match cfg.secrets.store {
        SecretStoreKind::File if create => {
            Ok(Some(std::sync::Arc::new(FileStore::open(&cfg.vault)?)))
        }
        SecretStoreKind::File => Ok(FileStore::open_existing(&cfg.vault)?
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
