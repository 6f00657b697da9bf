//! A secret's name: what a rule binds, a placeholder carries and the store keys a value by.
//! It sits here, beneath the secrets engine, because policy checks the names its rules bind
//! and the engine builds on policy; names are not secret (they appear in policy,
//! placeholders, logs and `ctl secrets list`).

use std::fmt;
use std::sync::Arc;

/// Longest name.
pub(crate) const MAX_NAME_LEN: usize = 64;

/// A secret's name: 1..=64 of `A-Z a-z 0-9 _ -`, starting with a letter or digit. Names are
/// not secret: they appear in policy, placeholders, logs and `ctl secrets list`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(Arc<str>);

impl SecretName {
    pub fn new(name: &str) -> Result<SecretName, InvalidSecretName> {
        if is_valid_name(name) {
            Ok(SecretName(Arc::from(name)))
        } else {
            Err(InvalidSecretName(name.to_string()))
        }
    }

    /// A name of the daemon's own for a value it redacts but no rule can bind (it holds a
    /// `.`, which no secret name may: no placeholder of it can ever be swapped).
    pub(crate) fn reserved(name: &'static str) -> SecretName {
        debug_assert!(name.contains('.'));
        SecretName(Arc::from(name))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `b` may appear in a secret name (and so continues a placeholder).
pub(crate) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(is_name_byte)
}

/// A name that breaks the rules of [`SecretName`] (names are not secret: it is quoted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid secret name {0:?}: use 1..={max} of A-Z a-z 0-9 _ -, starting with a letter or digit",
    max = MAX_NAME_LEN
)]
pub struct InvalidSecretName(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["openai", "GITHUB_TOKEN", "a", "x-1_2"] {
            assert!(SecretName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "_x", "a.b", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(SecretName::new(bad).is_err(), "{bad:?}");
        }
    }
}
