//! The Redis client for `[ratelimit] store`: the URL, the password from where the config
//! says (the URL, a file, or the vault, resolved by the caller), and for `rediss://` the CA
//! that signs the store's certificate (else the system roots). Nothing here logs the
//! password; errors name the file, never its content.

use std::path::PathBuf;

use redis::{Client, IntoConnectionInfo, TlsCertificates};

use crate::config::RateLimitConfig;

/// Why the store's client could not be set up (at start: the daemon does not start).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreSetupError {
    #[error("ratelimit.password_file {path}: {source}")]
    PasswordFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ratelimit.password_file {0}: empty or not UTF-8")]
    PasswordText(PathBuf),
    #[error("ratelimit.ca {path}: {source}")]
    Ca {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("ratelimit.store {shown}: {reason}")]
    Client { shown: String, reason: String },
}

/// The client for `cfg.store` (which the caller checked is set). `password`: from the vault
/// (`password_secret`), already looked up.
pub(super) fn client(
    cfg: &RateLimitConfig,
    password: Option<String>,
) -> Result<Option<Client>, StoreSetupError> {
    let Some(store) = &cfg.store else {
        return Ok(None);
    };
    let shown = store.to_string();
    let failed = |e: redis::RedisError| StoreSetupError::Client {
        shown: shown.clone(),
        // A redis error names the kind and the server's words, never the URL's password.
        reason: e.to_string(),
    };
    let password = match (&cfg.password_file, password) {
        (Some(path), _) => Some(read_password(path)?),
        (None, from_vault) => from_vault,
    };
    let mut info = store.expose().into_connection_info().map_err(failed)?;
    if let Some(pw) = password {
        let redis = info.redis_settings().clone().set_password(pw);
        info = info.set_redis_settings(redis);
    }
    let client = match &cfg.ca {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|source| StoreSetupError::Ca {
                path: path.clone(),
                source,
            })?;
            let certs = TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            Client::build_with_tls(info, certs).map_err(failed)?
        }
        None => Client::open(info).map_err(failed)?,
    };
    Ok(Some(client))
}

/// The file's first line, without its line end.
fn read_password(path: &PathBuf) -> Result<String, StoreSetupError> {
    let bytes = std::fs::read(path).map_err(|source| StoreSetupError::PasswordFile {
        path: path.clone(),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|_| StoreSetupError::PasswordText(path.clone()))?;
    let line = text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches('\r');
    if line.is_empty() {
        return Err(StoreSetupError::PasswordText(path.clone()));
    }
    Ok(line.to_string())
}
