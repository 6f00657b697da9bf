//! The refusal the agent sees: a status and a small JSON body that says which rule and why,
//! and the error codes every record uses. Never carries a secret; the explanation is built
//! from policy facts only.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

use super::record::Verdict;
use crate::body::{full, ProxyBody};

/// Machine-readable reasons, stable for clients and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorCode {
    PolicyDenied,
    RateLimited,
    /// The proxy is at its connection limit.
    Busy,
    HostMismatch,
    DestinationForbidden,
    /// A secret's placeholder headed somewhere its secret is not bound.
    SecretScope,
    /// A secret's real value headed somewhere it is not bound.
    SecretLeak,
    /// The rule needs a secret the store does not hold.
    SecretUnavailable,
    BadRequest,
    UpstreamDns,
    UpstreamConnect,
    UpstreamTls,
    UpstreamError,
    /// The audit log could not record the request (a write error): its response is withheld.
    AuditUnavailable,
    /// The request head is larger than `limits.max_header_bytes`.
    HeadTooLarge,
    /// The client ended the TLS handshake with an alert saying it does not trust our leaf
    /// (unknown CA, bad or unknown certificate): a tool that does not trust the AgenShield CA.
    /// Connection records only.
    ClientRejectedCa,
    /// The TLS handshake with the client failed otherwise (no common version or cipher, a
    /// protocol error, the client went away, a timeout). Connection records only.
    TlsHandshakeFailed,
    /// What looked like TLS was not a usable ClientHello (malformed, an unusable server name,
    /// none in time). Connection records only.
    BadClientHello,
    /// The client went away before its request was decided. Request records only.
    ClientGone,
    /// The request asks to switch to a protocol not in `upstream.upgrades`.
    UpgradeRefused,
    /// The agent holds `limits.max_connections_per_agent` connections already.
    ConnectionBudget,
    /// A DNS question of a type (or class, or opcode) the stub does not answer. DNS query
    /// records only.
    QueryTypeRefused,
    /// The OS could not tell which local user opened the connection (the client already let
    /// go of its socket): refused on the transparent and explicit listeners.
    UnknownUser,
    /// The connection's user may not use this listener: not an agent user on the transparent
    /// one; not an agent, root, an admin or a listed user on the explicit one.
    UserNotAdmitted,
    /// The rule binds secrets and the request's user is not an agent user the rule serves.
    SecretNotForUser,
}

impl ErrorCode {
    /// Every code (the audit schema lists the same; a test compares them).
    #[cfg(test)]
    pub(crate) const ALL: [ErrorCode; 25] = [
        ErrorCode::PolicyDenied,
        ErrorCode::RateLimited,
        ErrorCode::Busy,
        ErrorCode::HostMismatch,
        ErrorCode::DestinationForbidden,
        ErrorCode::SecretScope,
        ErrorCode::SecretLeak,
        ErrorCode::SecretUnavailable,
        ErrorCode::BadRequest,
        ErrorCode::UpstreamDns,
        ErrorCode::UpstreamConnect,
        ErrorCode::UpstreamTls,
        ErrorCode::UpstreamError,
        ErrorCode::AuditUnavailable,
        ErrorCode::HeadTooLarge,
        ErrorCode::ClientRejectedCa,
        ErrorCode::TlsHandshakeFailed,
        ErrorCode::BadClientHello,
        ErrorCode::ClientGone,
        ErrorCode::UpgradeRefused,
        ErrorCode::ConnectionBudget,
        ErrorCode::QueryTypeRefused,
        ErrorCode::UnknownUser,
        ErrorCode::UserNotAdmitted,
        ErrorCode::SecretNotForUser,
    ];

    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorCode::PolicyDenied
            | ErrorCode::HostMismatch
            | ErrorCode::DestinationForbidden
            | ErrorCode::SecretScope
            | ErrorCode::SecretLeak
            | ErrorCode::UpgradeRefused
            | ErrorCode::QueryTypeRefused
            | ErrorCode::UnknownUser
            | ErrorCode::UserNotAdmitted
            | ErrorCode::SecretNotForUser => StatusCode::FORBIDDEN,
            ErrorCode::SecretUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::RateLimited | ErrorCode::ConnectionBudget => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Busy | ErrorCode::AuditUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::UpstreamDns
            | ErrorCode::UpstreamConnect
            | ErrorCode::UpstreamTls
            | ErrorCode::UpstreamError => StatusCode::BAD_GATEWAY,
            ErrorCode::HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            // Never rendered: the connection ended before HTTP.
            ErrorCode::ClientRejectedCa
            | ErrorCode::TlsHandshakeFailed
            | ErrorCode::BadClientHello
            | ErrorCode::ClientGone => StatusCode::BAD_REQUEST,
        }
    }

    /// The verdict a refusal with this code records, unless the phase that refused says
    /// otherwise (an `ask` that was denied or timed out).
    pub(crate) fn verdict(self) -> Verdict {
        match self {
            ErrorCode::PolicyDenied
            | ErrorCode::HostMismatch
            | ErrorCode::DestinationForbidden
            | ErrorCode::SecretScope
            | ErrorCode::SecretLeak
            | ErrorCode::BadRequest
            | ErrorCode::HeadTooLarge
            | ErrorCode::BadClientHello
            | ErrorCode::UpgradeRefused
            | ErrorCode::QueryTypeRefused
            | ErrorCode::UnknownUser
            | ErrorCode::UserNotAdmitted
            | ErrorCode::SecretNotForUser => Verdict::Deny,
            ErrorCode::RateLimited | ErrorCode::Busy | ErrorCode::ConnectionBudget => {
                Verdict::Limited
            }
            ErrorCode::SecretUnavailable
            | ErrorCode::UpstreamDns
            | ErrorCode::UpstreamConnect
            | ErrorCode::UpstreamTls
            | ErrorCode::UpstreamError
            | ErrorCode::AuditUnavailable
            | ErrorCode::ClientRejectedCa
            | ErrorCode::TlsHandshakeFailed
            | ErrorCode::ClientGone => Verdict::Error,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorCode::PolicyDenied => "policy_denied",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Busy => "busy",
            ErrorCode::HostMismatch => "host_mismatch",
            ErrorCode::DestinationForbidden => "destination_forbidden",
            ErrorCode::SecretScope => "secret_scope",
            ErrorCode::SecretLeak => "secret_leak",
            ErrorCode::SecretUnavailable => "secret_unavailable",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::UpstreamDns => "upstream_dns",
            ErrorCode::UpstreamConnect => "upstream_connect",
            ErrorCode::UpstreamTls => "upstream_tls",
            ErrorCode::UpstreamError => "upstream_error",
            ErrorCode::AuditUnavailable => "audit_unavailable",
            ErrorCode::HeadTooLarge => "head_too_large",
            ErrorCode::ClientRejectedCa => "client_rejected_ca",
            ErrorCode::TlsHandshakeFailed => "tls_handshake_failed",
            ErrorCode::BadClientHello => "bad_client_hello",
            ErrorCode::ClientGone => "client_gone",
            ErrorCode::UpgradeRefused => "upgrade_refused",
            ErrorCode::ConnectionBudget => "connection_budget",
            ErrorCode::QueryTypeRefused => "query_type_refused",
            ErrorCode::UnknownUser => "unknown_user",
            ErrorCode::UserNotAdmitted => "user_not_admitted",
            ErrorCode::SecretNotForUser => "secret_not_for_user",
        }
    }

    /// Whether trying again later might succeed without a policy change.
    fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::UpstreamDns
                | ErrorCode::UpstreamConnect
                | ErrorCode::UpstreamError
                | ErrorCode::RateLimited
                | ErrorCode::Busy
                | ErrorCode::ConnectionBudget
        )
    }
}

/// A refusal, before it is rendered.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub code: ErrorCode,
    /// What the record says was decided: the code's own verdict, unless the refusing phase
    /// set another.
    pub verdict: Verdict,
    pub message: String,
    pub rule_id: Option<String>,
    pub explanation: String,
    /// Seconds until a retry may succeed (rate limits): sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl Refusal {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Refusal {
        let message = message.into();
        Refusal {
            code,
            verdict: code.verdict(),
            explanation: message.clone(),
            message,
            rule_id: None,
            retry_after: None,
        }
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

    #[test]
    fn upstream_failures_are_502_and_retryable() {
        assert_eq!(ErrorCode::UpstreamConnect.status(), StatusCode::BAD_GATEWAY);
        assert!(ErrorCode::UpstreamConnect.retryable());
        assert!(!ErrorCode::UpstreamTls.retryable());
    }
}
