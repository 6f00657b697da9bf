//! OAuth2 client credentials (RFC 6749 §4.4): the daemon asks the token endpoint for an
//! access token with the client id and secret it holds, and uses the token for as long as
//! the endpoint says (less a margin). The agent never sees the client secret or the token:
//! it holds the secret's placeholder, swapped or injected like any other.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::HeaderValue;
use zeroize::Zeroizing;

use crate::secrets::fetch::provider::{ClientAuth, ProviderSpec};
use crate::secrets::fetch::token_client::TokenRequestError;
use crate::secrets::store::value::{InvalidSecretValue, SecretValue};

/// How much before the endpoint's expiry a token is fetched again.
const MARGIN: Duration = Duration::from_secs(60);
/// The most of a token response read.
pub(crate) const MAX_RESPONSE: usize = 64 * 1024;

/// Sends the token request: a POST of a form, over verified TLS, answering the status and
/// the body (at most `MAX_RESPONSE`).
pub(crate) trait TokenClient: Send + Sync {
    fn post_form<'a>(
        &'a self,
        url: &'a str,
        authorization: Option<HeaderValue>,
        form: Zeroizing<String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(http::StatusCode, Bytes), TokenRequestError>>;
}

/// Why no access token was had. Carries the endpoint's status and its OAuth `error` and
/// `error_description` (at most 200 characters), never the client secret or a token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("not an OAuth2 secret")]
    NotOauth2,
    #[error("the client credentials do not fit a header")]
    CredentialsUnfit,
    #[error("{0}")]
    Request(#[from] TokenRequestError),
    #[error("the token endpoint answered {status}: {error}{}", described(.description))]
    Refused {
        status: http::StatusCode,
        error: String,
        description: String,
    },
    #[error("the token endpoint answered {status} without an access_token")]
    NoAccessToken { status: http::StatusCode },
    #[error("the access token is not a usable value: {0}")]
    BadToken(InvalidSecretValue),
}

fn described(description: &str) -> String {
    if description.is_empty() {
        String::new()
    } else {
        format!(" ({description})")
    }
}

/// Fetches a token; the value and how long to use it. The failure says what the endpoint
/// answered (its status and OAuth `error`), never the client secret.
pub(crate) async fn fetch(
    spec: &ProviderSpec,
    client: &dyn TokenClient,
) -> Result<(SecretValue, Duration), TokenError> {
    let ProviderSpec::Oauth2 {
        token_url,
        client_id,
        client_secret,
        scope,
        auth,
        ..
    } = spec
    else {
        return Err(TokenError::NotOauth2);
    };
    let (form, authorization) = {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        if let Some(scope) = scope {
            form.append_pair("scope", scope);
        }
        let authorization = match auth {
            ClientAuth::Post => {
                form.append_pair("client_id", client_id);
                form.append_pair("client_secret", client_secret);
                None
            }
            ClientAuth::Basic => Some(basic(client_id, client_secret)?),
        };
        (Zeroizing::new(form.finish()), authorization)
    };
    let (status, body) = client
        .post_form(token_url, authorization, form, spec.timeout())
        .await?;
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if !status.is_success() {
        let error = json["error"].as_str().unwrap_or("no OAuth error given");
        let description: String = json["error_description"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect();
        return Err(TokenError::Refused {
            status,
            error: error.to_string(),
            description,
        });
    }
    let Some(token) = json["access_token"].as_str() else {
        return Err(TokenError::NoAccessToken { status });
    };
    let value = SecretValue::new(token.as_bytes().to_vec()).map_err(TokenError::BadToken)?;
    let ttl = match json["expires_in"].as_u64() {
        Some(s) if s > 2 * MARGIN.as_secs() => Duration::from_secs(s) - MARGIN,
        Some(s) => Duration::from_secs(s.max(2) / 2),
        None => spec.ttl(),
    };
    Ok((value, ttl))
}

/// `Basic base64(urlencode(id):urlencode(secret))` (RFC 6749 §2.3.1), marked sensitive.
fn basic(id: &str, secret: &str) -> Result<HeaderValue, TokenError> {
    use base64::Engine as _;
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let pair = Zeroizing::new(format!("{}:{}", enc(id), enc(secret)));
    let b64 = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(pair.as_bytes()));
    let mut v = HeaderValue::from_str(&format!("Basic {}", *b64))
        .map_err(|_| TokenError::CredentialsUnfit)?;
    v.set_sensitive(true);
    Ok(v)
}
