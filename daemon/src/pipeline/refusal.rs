//! The refusal the agent sees: a status and a small JSON body that says which rule and why
//! (the refusal itself, plain data, is `record::Refusal`, its error code a
//! `record::ErrorCode`). Never carries a secret; the explanation is built from policy facts
//! only.

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use serde::Serialize;

use crate::admission::NotAdmitted;
use crate::body::{full, ProxyBody};
use crate::record::ErrorCode;
pub(crate) use crate::record::Refusal;
use crate::upstream::error::UpstreamError;

/// A user the listener or the rule's secrets do not serve: its code, its message, and the
/// rule whose secrets were refused.
impl From<NotAdmitted> for Refusal {
    fn from(e: NotAdmitted) -> Refusal {
        Refusal {
            rule_id: e.rule().map(str::to_string),
            ..Refusal::new(e.code(), e.to_string())
        }
    }
}

/// An upstream failure, as the agent is told it: its code and its message.
impl From<UpstreamError> for Refusal {
    fn from(e: UpstreamError) -> Refusal {
        Refusal::new(e.code(), e.to_string())
    }
}

#[derive(Serialize)]
struct Body<'a> {
    error_code: ErrorCode,
    message: &'a str,
    rule_id: Option<&'a str>,
    request_id: &'a str,
    policy_hash: &'a str,
    explanation: &'a str,
    retryable: bool,
    /// A spent token budget: its limit, the spend and when it resets.
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<&'a crate::record::BudgetFacts>,
}

/// Renders a refusal as the response the agent receives.
pub(crate) fn render(r: &Refusal, request_id: &str, policy_hash: &str) -> Response<ProxyBody> {
    let body = Body {
        error_code: r.code,
        message: &r.message,
        rule_id: r.rule_id.as_deref(),
        request_id,
        policy_hash,
        explanation: &r.explanation,
        retryable: r.code.retryable(),
        budget: r.budget.as_deref(),
    };
    let mut json = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
    json.push(b'\n');
    let mut resp = Response::new(full(Bytes::from(json)));
    *resp.status_mut() = r.code.status();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(secs) = r.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-agenshield-request-id", v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn deny_body_has_every_contract_field() {
        let mut r = Refusal::new(ErrorCode::PolicyDenied, "GET x.test:443/ is not allowed");
        r.rule_id = Some("block-x".into());
        let resp = render(&r, "req-1", "sha256:abc");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["error_code"], "policy_denied");
        assert_eq!(v["rule_id"], "block-x");
        assert_eq!(v["request_id"], "req-1");
        assert_eq!(v["policy_hash"], "sha256:abc");
        assert_eq!(v["retryable"], false);
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(v["explanation"].as_str().is_some());
    }
}
