//! `[ratelimit]`: the shared store that `rate.scope = "fleet"` rules count in (Redis), how
//! long a check may wait for it, and what a check does when it cannot be reached.
//!
//! The password may be written in the URL, read from a file (`password_file`) or taken
//! from the vault (`password_secret`); it is never shown: [`StoreUrl`]'s `Debug` and
//! `Display` print the URL with the password replaced.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::forms;

/// Bounds of `ratelimit.timeout`: a check never waits longer than this for the store.
pub const MIN_STORE_TIMEOUT: Duration = Duration::from_millis(1);
pub const MAX_STORE_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// `redis://[user:password@]host[:port][/db]`, or `rediss://` for TLS. None: no shared
    /// store (a `scope = "fleet"` rule is then a policy error).
    pub store: Option<StoreUrl>,
    /// A file holding the store's password (its first line), instead of the URL's.
    pub password_file: Option<PathBuf>,
    /// A vault secret holding the store's password, instead of the URL's.
    pub password_secret: Option<String>,
    /// `rediss://`: a PEM file of the CA that signs the store's certificate, instead of the
    /// system roots.
    pub ca: Option<PathBuf>,
    /// What a fleet check does when the store fails or misses `timeout`.
    pub on_store_error: OnStoreError,
    /// The longest a check waits for the store.
    #[serde(deserialize_with = "forms::duration")]
    pub timeout: Duration,
    /// Every key the daemon writes starts with this (several fleets may share a store).
    pub key_prefix: String,
    /// Whose bucket a fleet rule's request spends from, besides the rule's.
    pub fleet_key: FleetKey,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            store: None,
            password_file: None,
            password_secret: None,
            ca: None,
            on_store_error: OnStoreError::Local,
            timeout: Duration::from_millis(5),
            key_prefix: "agenshield:rl:".into(),
            fleet_key: FleetKey::Agent,
        }
    }
}

/// When the store cannot answer in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    /// Count the rule in this daemon's own bucket until the store is back.
    #[default]
    Local,
    /// Refuse the rule's requests (429 `rate_limit_store_unavailable`) until it is back.
    Deny,
}

impl OnStoreError {
    pub fn as_str(self) -> &'static str {
        match self {
            OnStoreError::Local => "local",
            OnStoreError::Deny => "deny",
        }
    }
}

/// A fleet bucket is per rule and per …
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FleetKey {
    /// … agent uid: the same uid on every host shares one bucket.
    #[default]
    Agent,
    /// … destination host: every agent on every host shares one bucket per host.
    Host,
}

/// The store's URL, checked: `redis://` or `rediss://`, a host, an optional numeric database,
/// nothing else. Shown with its password replaced.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct StoreUrl(url::Url);

/// Why `ratelimit.store` (or another `[ratelimit]` key) is refused. Never shows a password.
#[derive(Debug, thiserror::Error)]
pub enum StoreConfigError {
    #[error("ratelimit.store: {shown:?} is not a URL like \"redis://127.0.0.1:6379/0\": {error}")]
    NotAUrl {
        shown: String,
        error: url::ParseError,
    },
    #[error("ratelimit.store: the scheme must be redis:// or rediss:// (TLS), not {0}://")]
    Scheme(String),
    #[error("ratelimit.store: the host is missing")]
    NoHost,
    #[error("ratelimit.store: the path must be a database number (\"/0\"), not {0:?}")]
    Database(String),
    #[error("ratelimit.store: give the address, user, password and database only (no query)")]
    Query,
    #[error(
        "ratelimit.timeout must be between {}ms and {}s: a check waits that long for the store",
        MIN_STORE_TIMEOUT.as_millis(),
        MAX_STORE_TIMEOUT.as_secs()
    )]
    Timeout,
    #[error("ratelimit.key_prefix must be 1 to 64 printable ASCII characters without spaces")]
    KeyPrefix,
    #[error("ratelimit.password_file and ratelimit.password_secret: give one password source")]
    TwoPasswords,
    #[error("ratelimit.{0} is set but ratelimit.store is not")]
    NoStore(&'static str),
    #[error("ratelimit.ca applies to a rediss:// (TLS) store only")]
    CaWithoutTls,
}

impl StoreUrl {
    pub fn parse(text: &str) -> Result<StoreUrl, StoreConfigError> {
        let url = url::Url::parse(text).map_err(|error| StoreConfigError::NotAUrl {
            shown: hide_password(text),
            error,
        })?;
        if !matches!(url.scheme(), "redis" | "rediss") {
            return Err(StoreConfigError::Scheme(url.scheme().to_string()));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(StoreConfigError::NoHost);
        }
        let db = url.path().trim_start_matches('/');
        if !db.is_empty() && db.parse::<u16>().is_err() {
            return Err(StoreConfigError::Database(url.path().to_string()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(StoreConfigError::Query);
        }
        Ok(StoreUrl(url))
    }

    /// The URL as written, password included: for the store client only.
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }

    pub fn is_tls(&self) -> bool {
        self.0.scheme() == "rediss"
    }

    pub fn has_password(&self) -> bool {
        self.0.password().is_some()
    }
}

impl TryFrom<String> for StoreUrl {
    type Error = StoreConfigError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        StoreUrl::parse(&s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.clone();
        if shown.password().is_some() {
            // Brackets would be percent-encoded in a URL: the plain word reads better.
            let _ = shown.set_password(Some("redacted"));
        }
        f.write_str(shown.as_str())
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// `text` with whatever sits between `scheme://user:` and `@` replaced.
fn hide_password(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    match rest.split_once('@') {
        Some((creds, host)) if creds.contains(':') => {
            let user = creds.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:redacted@{host}")
        }
        _ => text.to_string(),
    }
}

/// What `[ratelimit]` must satisfy beyond its types.
pub(super) fn check(r: &RateLimitConfig) -> Result<(), StoreConfigError> {
    if !(MIN_STORE_TIMEOUT..=MAX_STORE_TIMEOUT).contains(&r.timeout) {
        return Err(StoreConfigError::Timeout);
    }
    let p = &r.key_prefix;
    if p.is_empty() || p.len() > 64 || !p.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(StoreConfigError::KeyPrefix);
    }
    if r.password_file.is_some() && r.password_secret.is_some() {
        return Err(StoreConfigError::TwoPasswords);
    }
    let Some(store) = &r.store else {
        let set = [
            (r.password_file.is_some(), "password_file"),
            (r.password_secret.is_some(), "password_secret"),
            (r.ca.is_some(), "ca"),
        ];
        return match set.into_iter().find(|(set, _)| *set) {
            Some((_, key)) => Err(StoreConfigError::NoStore(key)),
            None => Ok(()),
        };
    };
    if r.ca.is_some() && !store.is_tls() {
        return Err(StoreConfigError::CaWithoutTls);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `Config::parse` reports it: the error's message, never the source line (which, for
    /// a bad URL, holds the password).
    fn parse(text: &str) -> Result<RateLimitConfig, String> {
        let r: RateLimitConfig = toml::from_str(text).map_err(|e| e.message().to_string())?;
        check(&r).map_err(|e| e.to_string())?;
        Ok(r)
    }

    #[test]
    fn defaults_are_no_store_local_fallback_and_a_few_milliseconds() {
        let r = parse("").expect("empty");
        assert!(r.store.is_none());
        assert_eq!(r.on_store_error, OnStoreError::Local);
        assert_eq!(r.timeout, Duration::from_millis(5));
        assert_eq!(r.fleet_key, FleetKey::Agent);
        assert_eq!(r.key_prefix, "agenshield:rl:");
    }

    #[test]
    fn a_full_section_parses() {
        let r = parse(
            "store = \"rediss://shield:pw@redis.corp:6380/2\"\non_store_error = \"deny\"\n\
             timeout = \"20ms\"\nkey_prefix = \"fleet-a:\"\nfleet_key = \"host\"\nca = \"/ca.pem\"",
        )
        .expect("valid");
        let store = r.store.expect("store");
        assert!(store.is_tls() && store.has_password());
        assert_eq!(store.expose(), "rediss://shield:pw@redis.corp:6380/2");
        assert_eq!(r.on_store_error, OnStoreError::Deny);
        assert_eq!(r.timeout, Duration::from_millis(20));
        assert_eq!(r.fleet_key, FleetKey::Host);
    }

    #[test]
    fn the_password_is_never_shown() {
        let u = StoreUrl::parse("redis://user:s3cret-pw@127.0.0.1:6379/0").expect("valid");
        assert_eq!(u.to_string(), "redis://user:redacted@127.0.0.1:6379/0");
        assert!(!format!("{u:?}").contains("s3cret"));
        let r = parse("store = \"redis://user:s3cret-pw@127.0.0.1:6379/0\"").expect("valid");
        assert!(!format!("{r:?}").contains("s3cret"), "{r:?}");
        let e = parse("store = \"redis://user:s3cret-pw@[::1:6379/0\"").expect_err("bad URL");
        assert!(!e.contains("s3cret"), "{e}");
        assert!(e.contains("user:redacted@"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        for (text, expect) in [
            ("store = \"http://127.0.0.1:6379\"", "redis:// or rediss://"),
            ("store = \"redis:///0\"", "host is missing"),
            ("store = \"redis://127.0.0.1/zero\"", "database number"),
            ("store = \"redis://127.0.0.1/0?protocol=resp3\"", "no query"),
            (
                "timeout = \"0s\"",
                "ratelimit.timeout must be between 1ms and 1s",
            ),
            (
                "timeout = \"5s\"",
                "ratelimit.timeout must be between 1ms and 1s",
            ),
            ("timeout = 5", "not a duration"),
            ("key_prefix = \"\"", "key_prefix"),
            ("key_prefix = \"a b\"", "key_prefix"),
            ("on_store_error = \"allow\"", "local"),
            ("fleet_key = \"rule\"", "agent"),
            (
                "password_file = \"/pw\"",
                "ratelimit.password_file is set but ratelimit.store",
            ),
            (
                "ca = \"/ca.pem\"",
                "ratelimit.ca is set but ratelimit.store",
            ),
            (
                "store = \"redis://h\"\npassword_file = \"/a\"\npassword_secret = \"b\"",
                "one password source",
            ),
            ("store = \"redis://h\"\nca = \"/ca.pem\"", "rediss://"),
            ("stor = \"redis://h\"", "unknown field"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.contains(expect), "{text}: {e}");
        }
    }
}
