//! Secrets the daemon fetches rather than holds: what is stored is how to fetch the value
//! (`provider`), and the value lives in memory only, for as long as it is valid.
//!
//! * `provider`: the stored spec (a command, or an OAuth2 client), checked and serialised;
//! * `command`: a command's output as the value, run bounded in time and size;
//! * `oauth`: an OAuth2 client-credentials token, asked of the endpoint through a
//!   `TokenClient`; `token_client`: the one the daemon uses, the upstream forwarder.

pub(crate) mod command;
pub(crate) mod oauth;
pub mod provider;
pub(crate) mod token_client;

/// Why a fetched secret's value could not be had. The text may hold what the command wrote
/// to its standard error or what the token endpoint said: redact it before it is shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{0}")]
    Command(#[from] command::CommandFailure),
    #[error("{0}")]
    Token(#[from] oauth::TokenError),
    #[error("no upstream client to fetch the token with")]
    NoTokenClient,
}
