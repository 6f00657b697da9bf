//! Why forwarding to an upstream failed, as upstream/ knows it: each failure carries the
//! message the agent is told and the error code it is recorded under (`code()`). The pipeline
//! turns it into the `Refusal` the agent sees; nothing here knows about refusals.

use crate::record::ErrorCode;
use crate::upstream::dial::DialError;

/// A forward (or a dial) that failed. The message is what the agent is told, so it names
/// only what the proxy decided on (the checked target, the address it dialed), never
/// anything the agent could not already see.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// The checked target and path did not make a URI.
    #[error("invalid request target: {0}")]
    BadTarget(http::uri::InvalidUri),
    /// The name resolved to an address the private-address guard refuses.
    #[error("{0}")]
    Forbidden(String),
    /// The name did not resolve.
    #[error("{0}")]
    Dns(String),
    /// Connecting failed (refused, timed out, no tunnel through the operator's proxy).
    #[error("{0}")]
    Connect(String),
    /// The upstream's TLS failed verification, or what came back was not TLS.
    #[error("{0}")]
    Tls(String),
    /// The upstream failed otherwise (the connection, its HTTP).
    #[error("{0}")]
    Failed(String),
    /// It answered 101 to a request that did not ask to switch protocols.
    #[error("upstream switched protocols without being asked")]
    UnaskedSwitch,
}

impl UpstreamError {
    /// The error code a refusal for this failure carries.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            UpstreamError::BadTarget(_) => ErrorCode::BadRequest,
            UpstreamError::Forbidden(_) => ErrorCode::DestinationForbidden,
            UpstreamError::Dns(_) => ErrorCode::UpstreamDns,
            UpstreamError::Connect(_) => ErrorCode::UpstreamConnect,
            UpstreamError::Tls(_) => ErrorCode::UpstreamTls,
            UpstreamError::Failed(_) | UpstreamError::UnaskedSwitch => ErrorCode::UpstreamError,
        }
    }
}

impl From<&DialError> for UpstreamError {
    fn from(d: &DialError) -> UpstreamError {
        let message = d.to_string();
        match d {
            DialError::Forbidden { .. } => UpstreamError::Forbidden(message),
            DialError::Resolve(_) => UpstreamError::Dns(message),
            _ => UpstreamError::Connect(message),
        }
    }
}
