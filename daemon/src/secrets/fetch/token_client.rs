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
use crate::upstream::target::Target;

impl TokenClient for Forwarder {
    fn post_form<'a>(
        &'a self,
        url: &'a str,
        authorization: Option<HeaderValue>,
        form: Zeroizing<String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(StatusCode, Bytes), String>> {
        Box::pin(async move {
            let uri: http::Uri = url.parse().map_err(|e| format!("token URL: {e}"))?;
            let host = uri.host().ok_or_else(|| "token URL: no host".to_string())?;
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
                .map_err(|e| e.to_string())?;
            if let Some(a) = authorization {
                req.headers_mut().insert(header::AUTHORIZATION, a);
            }
            let exchange = async {
                let resp = match self.forward(&target, path, req, false).await {
                    Ok(Forwarded::Response(resp)) => resp,
                    Ok(Forwarded::Upgraded(..)) => {
                        return Err("the token endpoint switched protocols".to_string())
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let status = resp.status();
                let mut body = resp.into_body();
                let mut got = bytes::BytesMut::new();
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("reading the token response: {e}"))?;
                    if let Some(d) = frame.data_ref() {
                        if got.len() + d.len() > MAX_RESPONSE {
                            return Err(format!(
                                "the token response is longer than {MAX_RESPONSE} bytes"
                            ));
                        }
                        got.extend_from_slice(d);
                    }
                }
                Ok((status, got.freeze()))
            };
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| format!("the token endpoint did not answer within {timeout:?}"))?
        })
    }
}
