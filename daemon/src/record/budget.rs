//! What a request under a rule's LLM token budget (`policy/budget.rs`) records, and what a
//! refusal for a spent budget tells the agent.

use std::sync::Arc;

use serde::Serialize;

/// A budget's standing for one request: the tokens this request counted (0 for a refused
/// one), whether they are an estimate (no readable `usage`: body bytes / 4), what the window
/// has spent with them, its limit, and when it resets (RFC 3339, UTC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct BudgetFacts {
    pub tokens: u64,
    pub estimated: bool,
    pub spent: u64,
    pub limit: u64,
    pub resets: Arc<str>,
}
