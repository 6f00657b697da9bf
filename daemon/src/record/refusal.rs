//! A refusal, before it is rendered (`pipeline::refusal::render`) or recorded: one type for
//! everything the agent is refused, whichever layer refused it.

use serde::Serialize;

use super::{ErrorCode, Verdict};

/// Which bucket refused a request under a rate: this daemon's, the fleet's shared one, or this
/// daemon's standing in for a fleet rate whose store did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LimitScope {
    Local,
    Fleet,
    LocalFallback,
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
    /// A rate's refusal: whose bucket refused (recorded as `limit_scope`).
    pub limit_scope: Option<LimitScope>,
    /// A spent token budget's standing (sent in the refusal's JSON and recorded); boxed, so
    /// every other refusal stays small.
    pub budget: Option<Box<super::BudgetFacts>>,
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
            limit_scope: None,
            budget: None,
        }
    }
}
