//! A refusal, before it is rendered (`pipeline::refusal::render`) or recorded: one type for
//! everything the agent is refused, whichever layer refused it.

use super::{ErrorCode, Verdict};

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
