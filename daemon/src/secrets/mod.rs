//! Secrets: the agent never holds a credential.
//!
//! * `store/`: where values live at rest (`SecretStore`: the file vault, the macOS keychain)
//!   and the value type, zeroized and never printed;
//! * `fetch/`: secrets the daemon fetches rather than holds (a command's output, an OAuth2
//!   client-credentials token);
//! * `guard/`: the leak guard (a request's head and body) and response redaction, over one
//!   automaton of every value and placeholder;
//! * `rewrite/`: what goes upstream gets the values: `inject` entries, placeholders swapped in
//!   the head and in content, AWS SigV4 signed again, WebSocket messages;
//! * `placeholder`: what the agent holds instead (`agenshield:secret:NAME`); `refusal`: why
//!   a request was refused (the violation, the secret, the `Place`), never the value;
//! * `set`: the secrets loaded now, with their automaton; `vault`: the store, the set swapped
//!   in on change, use times and fetched values.
//!
//! A secret's name (`SecretName`) is policy's vocabulary too: rules bind names. The
//! pipeline's secrets phase (`pipeline/secrets.rs`) drives the engine for one request.

pub mod fetch;
pub(crate) mod guard;
pub(crate) mod placeholder;
pub(crate) mod refusal;
pub(crate) mod rewrite;
pub(crate) mod set;
pub mod store;
pub(crate) mod vault;

pub use crate::policy::SecretName;
pub(crate) use refusal::{Place, SecretRefusal, Violation};
pub use store::file::FileStore;
pub use store::open_store;
pub use store::value::SecretValue;
pub use vault::Vault;
