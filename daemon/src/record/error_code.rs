//! The error codes every record and every refusal uses: stable, machine-readable reasons,
//! with the HTTP status and the verdict each one means.

use http::StatusCode;
use serde::Serialize;

use super::Verdict;

/// Machine-readable reasons, stable for clients and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorCode {
    PolicyDenied,
    RateLimited,
    /// A `scope = "fleet"` rate's store did not answer in time and `ratelimit.on_store_error
    /// = "deny"`.
    RateLimitStoreUnavailable,
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
    /// No policy yet: `[policy.source] require_first_sync` and no verified bundle so far.
    PolicyUnavailable,
    /// A well-known credential (an API key, a token, a private key) headed somewhere other
    /// than its home, or not in a credential header there (`dlp/`).
    CredentialExfiltration,
    /// An MCP call (a tool, a method, a prompt, a resource) the rule's `mcp` does not allow.
    McpToolDenied,
    /// A call to a pinned MCP tool whose definition changed since it was pinned, until an
    /// operator accepts the change.
    McpToolChanged,
    /// A body under an `mcp` rule that is not JSON-RPC, or larger than the cap.
    McpBodyInvalid,
    /// The rule's LLM token budget for this window is spent (`policy/budget.rs`).
    TokenBudgetExhausted,
}

impl ErrorCode {
    /// Every code (the audit schema lists the same; a test compares them).
    #[cfg(test)]
    pub(crate) const ALL: [ErrorCode; 32] = [
        ErrorCode::PolicyDenied,
        ErrorCode::RateLimited,
        ErrorCode::RateLimitStoreUnavailable,
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
        ErrorCode::PolicyUnavailable,
        ErrorCode::CredentialExfiltration,
        ErrorCode::McpToolDenied,
        ErrorCode::McpToolChanged,
        ErrorCode::McpBodyInvalid,
        ErrorCode::TokenBudgetExhausted,
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
            | ErrorCode::SecretNotForUser
            | ErrorCode::PolicyUnavailable
            | ErrorCode::CredentialExfiltration
            | ErrorCode::McpToolDenied
            | ErrorCode::McpToolChanged => StatusCode::FORBIDDEN,
            ErrorCode::SecretUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::BadRequest | ErrorCode::McpBodyInvalid => StatusCode::BAD_REQUEST,
            ErrorCode::RateLimited
            | ErrorCode::RateLimitStoreUnavailable
            | ErrorCode::ConnectionBudget
            | ErrorCode::TokenBudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
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
            | ErrorCode::SecretNotForUser
            | ErrorCode::PolicyUnavailable
            | ErrorCode::CredentialExfiltration
            | ErrorCode::McpToolDenied
            | ErrorCode::McpToolChanged
            | ErrorCode::McpBodyInvalid => Verdict::Deny,
            ErrorCode::RateLimited
            | ErrorCode::RateLimitStoreUnavailable
            | ErrorCode::Busy
            | ErrorCode::ConnectionBudget
            | ErrorCode::TokenBudgetExhausted => Verdict::Limited,
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
            ErrorCode::RateLimitStoreUnavailable => "rate_limit_store_unavailable",
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
            ErrorCode::PolicyUnavailable => "policy_unavailable",
            ErrorCode::CredentialExfiltration => "credential_exfiltration",
            ErrorCode::McpToolDenied => "mcp_tool_denied",
            ErrorCode::McpToolChanged => "mcp_tool_changed",
            ErrorCode::McpBodyInvalid => "mcp_body_invalid",
            ErrorCode::TokenBudgetExhausted => "token_budget_exhausted",
        }
    }

    /// Whether trying again later might succeed without a policy change.
    pub(crate) fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::UpstreamDns
                | ErrorCode::UpstreamConnect
                | ErrorCode::UpstreamError
                | ErrorCode::RateLimited
                | ErrorCode::TokenBudgetExhausted
                | ErrorCode::RateLimitStoreUnavailable
                | ErrorCode::Busy
                | ErrorCode::ConnectionBudget
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_failures_are_502_and_retryable() {
        assert_eq!(ErrorCode::UpstreamConnect.status(), StatusCode::BAD_GATEWAY);
        assert!(ErrorCode::UpstreamConnect.retryable());
        assert!(!ErrorCode::UpstreamTls.retryable());
    }
}
