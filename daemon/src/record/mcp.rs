//! What a request record says of an MCP exchange (issue 37): the JSON-RPC method and, for
//! `tools/call`, the tool. Text from the agent, redacted before it is put here.

use serde::Serialize;

/// The method and tool of the message that decided (the first refused one, else the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct McpFacts {
    /// `None` for a message without a method (a client's answer to a server's request).
    pub method: Option<String>,
    pub tool: Option<String>,
    /// The number of messages, when the body was a JSON-RPC batch. Written only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
}
