//! What a request record says of an MCP exchange (issue 37): the JSON-RPC method and, for
//! `tools/call`, the tool. Text from the agent, redacted before it is put here.

use serde::Serialize;

use super::ErrorCode;

/// The method and tool of the message that decided: the first refused one when the request
/// was refused, else the first forwarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct McpFacts {
    /// `None` for a message without a method (a client's answer to a server's request).
    pub method: Option<String>,
    pub tool: Option<String>,
    /// The number of messages, when the body was a JSON-RPC batch. Written only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    /// In a batch, every message the proxy refused (and answered itself), in order; the
    /// others went to the server unless the record refuses the request. Written only when
    /// there is one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<McpRefusedMessage>,
}

/// One refused message of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct McpRefusedMessage {
    pub method: Option<String>,
    pub tool: Option<String>,
    pub error_code: ErrorCode,
}
