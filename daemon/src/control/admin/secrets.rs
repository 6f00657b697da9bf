//! `/v1/secrets`: list (names, bindings, use; never values), set (the value is the raw
//! request body, read into zeroized memory and never logged), remove (refused while a rule
//! binds the secret).
//!
//! A fetched secret's definition (a command, an OAuth2 token endpoint) is taken from root
//! alone (and from the daemon's own uid, which holds everything already): the daemon runs
//! the command, and sends the request, as itself, with the vault, the CA key and the audit
//! log within reach, so defining one is running code as the daemon. Members of the admin
//! group store values.

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use zeroize::Zeroizing;

use super::caller::Caller;
use super::routes::{error, json};
use super::Admin;
use crate::audit::ReloadTrigger;
use crate::body::ProxyBody;
use crate::control::reload::reload;
use crate::secrets::fetch::provider::ProviderSpec;
use crate::secrets::store::value::MAX_VALUE_LEN;
use crate::secrets::vault::ProviderError;
use crate::secrets::{SecretName, SecretValue};

pub(super) fn list(admin: &Admin) -> Response<ProxyBody> {
    let policy = admin.proxy.policy();
    let secrets: Vec<serde_json::Value> = admin
        .proxy
        .vault
        .list()
        .into_iter()
        .map(|s| {
            let rules = policy.secret_binders(&s.name);
            let rate = policy.secret_rate(&s.name).map(|r| r.to_string());
            let mut v = serde_json::to_value(&s).unwrap_or_default();
            v["rules"] = serde_json::json!(rules);
            v["rate"] = serde_json::json!(rate);
            v
        })
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({ "store": admin.proxy.vault.location(), "secrets": secrets }),
    )
}

pub(super) async fn set(
    admin: &Admin,
    caller: &Caller,
    name: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let name = match SecretName::new(name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let is_json = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        if !may_define_fetched(admin, caller) {
            tracing::warn!(caller = %caller, secret = %name, "admin API: a fetched secret's definition refused: not root");
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "secret {name}: only root may define a fetched secret (--from-command, \
                     --oauth2-token-url): the daemon runs it as itself, with every secret, the \
                     CA key and the audit log within reach. {caller} may store a value (on \
                     stdin); run this as root (sudo) on the daemon's machine"
                ),
            );
        }
        return set_provider(admin, caller, name, req).await;
    }
    let bytes = match read_value(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let value = match SecretValue::new(bytes.to_vec()) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("secret {name}: {e}")),
    };
    drop(bytes);
    // A value that reads as a fetched secret's definition would be taken for one when the
    // store is next read.
    if !matches!(ProviderSpec::from_stored(&value), Ok(None)) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("secret {name}: a value may not start with a fetched secret's marker"),
        );
    }
    let vault = &admin.proxy.vault;
    let replaced = vault.contains(name.as_str());
    if let Err(e) = vault.put(&name, value).await {
        tracing::error!(secret = %name, "storing the secret failed: {e}");
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("storing {name}: {e}"),
        );
    }
    tracing::info!(caller = %caller, secret = %name, replaced, "secret stored over the admin API");
    // A policy that was refused for want of this secret can load now.
    if admin.proxy.policies.info().last_error.is_some() {
        let _ = reload(&admin.proxy, ReloadTrigger::SecretStored(name.to_string()));
    }
    let rules = admin.proxy.policy().secret_binders(name.as_str());
    json(
        StatusCode::OK,
        &serde_json::json!({
            "ok": true,
            "name": name.as_str(),
            "replaced": replaced,
            "placeholder": crate::secrets::placeholder::placeholder(&name),
            "rules": rules,
        }),
    )
}

/// Root, or the daemon's own uid (which runs the command anyway).
fn may_define_fetched(admin: &Admin, caller: &Caller) -> bool {
    caller
        .uid()
        .is_some_and(|uid| uid == 0 || uid == admin.auth.own_uid)
}

/// A fetched secret: the body is its definition (`ProviderSpec` as JSON). It is fetched
/// once before it is stored; a definition that does not work is refused with why.
async fn set_provider(
    admin: &Admin,
    caller: &Caller,
    name: SecretName,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let bytes = match read_value(req.into_body()).await {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let spec: ProviderSpec = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("secret {name}: not a secret definition: {e}"),
            )
        }
    };
    drop(bytes);
    let kind = spec.kind();
    let vault = &admin.proxy.vault;
    let replaced = vault.contains(name.as_str());
    match vault.put_provider(&name, spec).await {
        Ok(()) => {}
        Err(ProviderError::Invalid(e)) => {
            return error(StatusCode::BAD_REQUEST, format!("secret {name}: {e}"))
        }
        Err(ProviderError::Fetch(e)) => {
            let e = vault.current().redact(&e.to_string()).into_owned();
            tracing::warn!(caller = %caller, secret = %name, "a fetched secret was refused: its first fetch failed: {e}");
            return error(
                StatusCode::BAD_GATEWAY,
                format!("secret {name} not stored: fetching it failed: {e}"),
            );
        }
        Err(ProviderError::Store(e)) => {
            tracing::error!(secret = %name, "storing the secret failed: {e}");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("storing {name}: {e}"),
            );
        }
    }
    tracing::info!(caller = %caller, secret = %name, kind = kind.as_str(), replaced, "fetched secret stored over the admin API");
    if admin.proxy.policies.info().last_error.is_some() {
        let _ = reload(&admin.proxy, ReloadTrigger::SecretStored(name.to_string()));
    }
    let rules = admin.proxy.policy().secret_binders(name.as_str());
    let expires = vault
        .list()
        .into_iter()
        .find(|s| s.name == name.as_str())
        .and_then(|s| s.expires);
    json(
        StatusCode::OK,
        &serde_json::json!({
            "ok": true,
            "name": name.as_str(),
            "kind": kind,
            "replaced": replaced,
            "placeholder": crate::secrets::placeholder::placeholder(&name),
            "rules": rules,
            "expires": expires,
        }),
    )
}

pub(super) async fn remove(admin: &Admin, caller: &Caller, name: &str) -> Response<ProxyBody> {
    let name = match SecretName::new(name) {
        Ok(n) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let rules = admin.proxy.policy().secret_binders(name.as_str());
    if !rules.is_empty() {
        return error(
            StatusCode::CONFLICT,
            format!(
                "secret {name} is bound by rule(s) {}; remove it from their `secrets`/`inject` first \
                 (the policy would not load without it)",
                rules.join(", ")
            ),
        );
    }
    match admin.proxy.vault.remove(&name).await {
        Ok(true) => {
            tracing::info!(caller = %caller, secret = %name, "secret removed over the admin API");
            json(
                StatusCode::OK,
                &serde_json::json!({ "ok": true, "name": name.as_str() }),
            )
        }
        Ok(false) => error(StatusCode::NOT_FOUND, format!("no secret named {name}")),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("removing {name}: {e}"),
        ),
    }
}

/// Why a value could not be read from a request body.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("reading the value: {0}")]
    Body(#[source] hyper::Error),
    #[error("the value is longer than {MAX_VALUE_LEN} bytes")]
    TooLong,
}

/// The request body, at most a value's size, in memory that is zeroized when dropped.
async fn read_value(mut body: Incoming) -> Result<Zeroizing<Vec<u8>>, ReadError> {
    let cap = MAX_VALUE_LEN + 2;
    let mut out = Zeroizing::new(Vec::with_capacity(cap));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ReadError::Body)?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > cap {
                return Err(ReadError::TooLong);
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out)
}
