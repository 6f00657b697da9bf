//! The OAuth2 token client: the daemon's own requests to token endpoints go out like the
//! agent's, through the upstream forwarder (our dialer and its address guard, verified TLS,
//! the pool), bounded in time and in the size of the answer.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::BodyExt;
use zeroize::Zeroizing;

use super::oauth::{TokenClient, MAX_RESPONSE};
use crate::body;
use crate::policy::Scheme;
use crate::upstream::client::{Forwarded, Forwarder};
use crate::upstream::error::UpstreamError;
use crate::upstream::target::Target;

/// Why a token request got no answer. Carries what went wrong on the way, never the form
/// (which may hold the client secret) nor the answer's body.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenRequestError {
    #[error("token URL: {0}")]
    Url(http::uri::InvalidUri),
    #[error("token URL: no host")]
    NoHost,
    #[error("{0}")]
    Build(http::Error),
    #[error("the token endpoint switched protocols")]
    SwitchedProtocols,
    #[error("{0}")]
    Upstream(UpstreamError),
    #[error("reading the token response: {0}")]
    Reading(body::BodyError),
    #[error("the token response is longer than {MAX_RESPONSE} bytes")]
    TooLong,
    #[error("the token endpoint did not answer within {0:?}")]
    Timeout(Duration),
}

impl TokenClient for Forwarder {
    fn post_form<'a>(
        &'a self,
        url: &'a str,
        authorization: Option<HeaderValue>,
        form: Zeroizing<String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(StatusCode, Bytes), TokenRequestError>> {
        Box::pin(async move {
            let uri: http::Uri = url.parse().map_err(TokenRequestError::Url)?;
            let host = uri.host().ok_or(TokenRequestError::NoHost)?;
            let target = Target {
                scheme: Scheme::Https,
                host: host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .trim_end_matches('.')
                    .to_ascii_lowercase(),
                port: uri.port_u16().unwrap_or(443),
            };
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let mut req = Request::builder()
                .method(Method::POST)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::ACCEPT, "application/json")
                .body(body::full(Bytes::copy_from_slice(form.as_bytes())))
                .map_err(TokenRequestError::Build)?;
            if let Some(a) = authorization {
                req.headers_mut().insert(header::AUTHORIZATION, a);
            }
            let exchange = async {
                let resp = match self.forward(&target, path, req, false).await {
                    Ok(Forwarded::Response(resp)) => resp,
                    Ok(Forwarded::Upgraded(..)) => {
                        return Err(TokenRequestError::SwitchedProtocols)
                    }
                    Err(e) => return Err(TokenRequestError::Upstream(e)),
                };
                let status = resp.status();
                let mut body = resp.into_body();
                let mut got = bytes::BytesMut::new();
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(TokenRequestError::Reading)?;
                    if let Some(d) = frame.data_ref() {
                        if got.len() + d.len() > MAX_RESPONSE {
                            return Err(TokenRequestError::TooLong);
                        }
                        got.extend_from_slice(d);
                    }
                }
                Ok((status, got.freeze()))
            };
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| TokenRequestError::Timeout(timeout))?
        })
    }
}
