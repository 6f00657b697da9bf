//! Secrets whose value the daemon fetches rather than holds: from a command (`gh auth token`)
//! or an OAuth2 token endpoint (client credentials). What is stored is how to fetch it (the
//! "spec", in the store like any value, so it is as durable and as protected as one: every
//! backend keeps it, `secrets rm` removes it); the fetched value lives in memory only, for
//! its time to live, and is fetched again on the first use after that.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::secrets::store::value::{InvalidSecretValue, SecretValue};

/// How a stored spec starts, so it is never taken for a value.
const SPEC_PREFIX: &str = "agenshield-provider:v1:";

/// What kind of secret a name holds, as `ctl secrets list` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SecretKind {
    /// A value, as stored.
    Static,
    /// The output of a command.
    Command,
    /// An OAuth2 access token (client credentials grant).
    Oauth2,
}

impl SecretKind {
    /// `ctl secrets list`'s spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SecretKind::Static => "static",
            SecretKind::Command => "command",
            SecretKind::Oauth2 => "oauth2",
        }
    }
}

/// How a fetched secret gets its value.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProviderSpec {
    /// COMMAND run by `/bin/sh` as the daemon's (worker) user, given on the shell's standard
    /// input, never as an argument (`command.rs`); its standard output, one trailing newline
    /// dropped, is the value for `ttl_secs`. Only root may define one (the admin API).
    Command {
        command: String,
        ttl_secs: u64,
        timeout_secs: u64,
    },
    /// An access token from `token_url` for `client_id` and the client secret, for the
    /// `expires_in` the endpoint gives (less a minute), or `ttl_secs` where it gives none.
    Oauth2 {
        token_url: String,
        client_id: String,
        client_secret: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
        /// How the client authenticates (`basic`: HTTP Basic; `post`: in the form body).
        auth: ClientAuth,
        ttl_secs: u64,
        timeout_secs: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    Basic,
    Post,
}

impl std::fmt::Debug for ProviderSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client secret never appears, even in a debug print.
        match self {
            ProviderSpec::Command { command, .. } => write!(f, "Command({command:?})"),
            ProviderSpec::Oauth2 {
                token_url,
                client_id,
                ..
            } => write!(f, "Oauth2({token_url:?}, client {client_id:?})"),
        }
    }
}

/// What is wrong with a fetched secret's definition: what an operator gave, or what the
/// store holds. Carries the token URL, never the client secret.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("the time to live must be at least 1s")]
    TtlTooShort,
    #[error("the timeout must be between 1s and 5m")]
    TimeoutOutOfRange,
    #[error("the command is empty")]
    EmptyCommand,
    #[error("the command holds a NUL byte")]
    NulInCommand,
    #[error("token URL {url:?}: {source}")]
    TokenUrlUnparsed {
        url: String,
        source: http::uri::InvalidUri,
    },
    #[error(
        "token URL {url:?}: an https:// URL with a host is needed (the client secret travels in it)"
    )]
    TokenUrlNotHttps { url: String },
    #[error("the client id and the client secret are needed")]
    NoClientCredentials,
    /// Serialising the spec failed.
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("the secret's definition cannot be stored: {0}")]
    NotStorable(InvalidSecretValue),
    #[error("a stored definition: {0}")]
    StoredUnreadable(serde_json::Error),
}

impl ProviderSpec {
    pub(crate) fn kind(&self) -> SecretKind {
        match self {
            ProviderSpec::Command { .. } => SecretKind::Command,
            ProviderSpec::Oauth2 { .. } => SecretKind::Oauth2,
        }
    }

    /// How long a fetched value is used when its source does not say.
    pub(crate) fn ttl(&self) -> Duration {
        match self {
            ProviderSpec::Command { ttl_secs, .. } | ProviderSpec::Oauth2 { ttl_secs, .. } => {
                Duration::from_secs(*ttl_secs)
            }
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        match self {
            ProviderSpec::Command { timeout_secs, .. }
            | ProviderSpec::Oauth2 { timeout_secs, .. } => Duration::from_secs(*timeout_secs),
        }
    }

    /// What `ctl secrets list` shows of it: the command, or the token URL and client id;
    /// never the client secret.
    pub(crate) fn source(&self) -> String {
        match self {
            ProviderSpec::Command { command, .. } => command.clone(),
            ProviderSpec::Oauth2 {
                token_url,
                client_id,
                ..
            } => format!("{token_url} (client {client_id})"),
        }
    }

    /// Checks what an operator gave; `Err` says what to fix.
    pub fn validate(&self) -> Result<(), SpecError> {
        let (ttl, timeout) = (self.ttl(), self.timeout());
        if ttl < Duration::from_secs(1) {
            return Err(SpecError::TtlTooShort);
        }
        if timeout < Duration::from_secs(1) || timeout > Duration::from_secs(300) {
            return Err(SpecError::TimeoutOutOfRange);
        }
        match self {
            ProviderSpec::Command { command, .. } => {
                if command.trim().is_empty() {
                    return Err(SpecError::EmptyCommand);
                }
                // A shell drops NUL bytes: what ran would not be what was given.
                if command.contains('\0') {
                    return Err(SpecError::NulInCommand);
                }
            }
            ProviderSpec::Oauth2 {
                token_url,
                client_id,
                client_secret,
                ..
            } => {
                let url: http::Uri =
                    token_url
                        .parse()
                        .map_err(|source| SpecError::TokenUrlUnparsed {
                            url: token_url.clone(),
                            source,
                        })?;
                if url.scheme_str() != Some("https") || url.host().is_none() {
                    return Err(SpecError::TokenUrlNotHttps {
                        url: token_url.clone(),
                    });
                }
                if client_id.is_empty() || client_secret.is_empty() {
                    return Err(SpecError::NoClientCredentials);
                }
            }
        }
        Ok(())
    }

    /// The spec as the store keeps it: a value that says it is a spec.
    pub(crate) fn to_stored(&self) -> Result<SecretValue, SpecError> {
        let json = Zeroizing::new(serde_json::to_string(self).map_err(SpecError::Encode)?);
        let text = Zeroizing::new(format!("{SPEC_PREFIX}{}", *json));
        SecretValue::new(text.as_bytes().to_vec()).map_err(SpecError::NotStorable)
    }

    /// The spec a stored value holds, if it holds one; `Err` if it claims to and is not valid.
    pub(crate) fn from_stored(value: &SecretValue) -> Result<Option<ProviderSpec>, SpecError> {
        let Some(json) = value.expose().strip_prefix(SPEC_PREFIX.as_bytes()) else {
            return Ok(None);
        };
        let spec: ProviderSpec =
            serde_json::from_slice(json).map_err(SpecError::StoredUnreadable)?;
        spec.validate()?;
        Ok(Some(spec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(cmd: &str) -> ProviderSpec {
        ProviderSpec::Command {
            command: cmd.into(),
            ttl_secs: 3300,
            timeout_secs: 10,
        }
    }

    #[test]
    fn a_spec_round_trips_through_the_store_and_a_plain_value_is_none() {
        let spec = command("gh auth token");
        let stored = spec.to_stored().expect("stored");
        assert_eq!(
            ProviderSpec::from_stored(&stored).expect("read"),
            Some(spec)
        );
        let plain = SecretValue::new(b"ghp_plain_value_123".to_vec()).expect("value");
        assert_eq!(ProviderSpec::from_stored(&plain).expect("read"), None);
        let broken = SecretValue::new(format!("{SPEC_PREFIX}{{\"kind\":\"nope\"}}").into_bytes())
            .expect("value");
        assert!(ProviderSpec::from_stored(&broken).is_err());
    }

    #[test]
    fn bad_specs_say_what_to_fix_and_debug_never_shows_the_client_secret() {
        assert!(command(" ")
            .validate()
            .expect_err("refused")
            .to_string()
            .contains("empty"));
        assert!(command("printf a\0b")
            .validate()
            .expect_err("refused")
            .to_string()
            .contains("NUL"));
        let oauth = |url: &str| ProviderSpec::Oauth2 {
            token_url: url.into(),
            client_id: "id".into(),
            client_secret: "very-secret-client".into(),
            scope: None,
            auth: ClientAuth::Basic,
            ttl_secs: 3600,
            timeout_secs: 10,
        };
        assert!(oauth("http://auth.test/token")
            .validate()
            .expect_err("refused")
            .to_string()
            .contains("https://"));
        assert!(oauth("https://auth.test/token").validate().is_ok());
        let shown = format!(
            "{:?} {}",
            oauth("https://a.test/t"),
            oauth("https://a.test/t").source()
        );
        assert!(!shown.contains("very-secret-client"), "{shown}");
    }
}
