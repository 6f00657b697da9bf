//! Secrets: the agent never holds a credential.
//!
//! * `value`, `store`, `file_store` (and `keychain` on macOS): names, zeroized values and
//!   where they live at rest.
//! * `placeholder`: what the agent holds instead (`agenshield:secret:NAME`).
//! * `matcher`, `stream`: one automaton over every value and placeholder, applied to whole
//!   texts and across body chunks.

pub mod file_store;
pub mod matcher;
pub mod placeholder;
pub mod store;
pub mod stream;
pub mod value;

pub use file_store::FileStore;
pub use store::{SecretStore, StoreError, StoredSecret};
pub use value::{SecretName, SecretValue};
