//! MCP-aware rules (issue 37): JSON-RPC as MCP clients send it to remote MCP servers
//! (Streamable HTTP: JSON-RPC in POST bodies, answers as JSON or SSE; the older HTTP+SSE
//! transport: POSTs to the endpoint an SSE stream announced, answers on that stream).
//!
//! `message.rs` reads a request body (serde_json, under a cap) into the calls a rule decides;
//! `decide.rs` decides each against the rule's `mcp` and the pins; `filter.rs` filters list
//! results in answers, `sse.rs` does it event by event in `text/event-stream` bodies;
//! `pins.rs` keeps tool definitions pinned per server. The pipeline's `mcp` phase
//! (`pipeline/mcp.rs`) calls them; nothing here does network I/O.

pub(crate) mod decide;
pub(crate) mod filter;
pub(crate) mod message;
pub(crate) mod pins;
pub(crate) mod sessions;
pub(crate) mod sse;
pub(crate) mod unique_keys;

/// What the daemon keeps for MCP: the pins, and the older transport's open SSE sessions.
#[derive(Debug)]
pub(crate) struct McpState {
    pub(crate) pins: pins::PinStore,
    pub(crate) sessions: std::sync::Arc<sessions::SseSessions>,
}

/// Largest request body read under an `mcp` rule.
pub(crate) const MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Largest JSON answer (or single SSE event) filtered; a larger one is refused.
pub(crate) const MAX_RESPONSE_BODY: usize = 16 * 1024 * 1024;

#[cfg(test)]
#[path = "mcp_tests.rs"]
mod tests;
