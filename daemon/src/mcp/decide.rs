//! One JSON-RPC message against a rule's `mcp` and the pins: allowed, or why not. The
//! message says what was refused in words that name the rule's list, for the JSON-RPC error
//! the client shows and for the record.

use super::message::{Call, Named};
use super::pins::PinStore;
use crate::policy::{McpRefusal, McpRule};
use crate::record::ErrorCode;

/// Why a message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The rule's `mcp` lists do not allow it.
    Rule(McpRefusal),
    /// A pinned tool whose definition changed, not yet accepted.
    Changed,
}

impl Refused {
    pub(crate) fn code(self) -> ErrorCode {
        match self {
            Refused::Rule(_) => ErrorCode::McpToolDenied,
            Refused::Changed => ErrorCode::McpToolChanged,
        }
    }

    /// Why, after "… is not allowed by rule R": which list, or the pin.
    pub(crate) fn why(self) -> String {
        match self {
            Refused::Rule(r) => format!("({})", r.key()),
            Refused::Changed => {
                "(mcp.pin: its definition changed since it was pinned; an operator must run `ctl mcp accept`)"
                    .to_string()
            }
        }
    }
}

/// Decides one message from the client to `server` (`host:port`).
pub(crate) fn decide(
    rule: &McpRule,
    pins: &PinStore,
    server: &str,
    call: &Call,
) -> Result<(), Refused> {
    if let Some(m) = &call.method {
        rule.method(m).map_err(Refused::Rule)?;
    }
    match &call.target {
        None => Ok(()),
        Some(Named::Tool(n)) => {
            rule.tool(n).map_err(Refused::Rule)?;
            if rule.pin && pins.refused(server, n) {
                return Err(Refused::Changed);
            }
            Ok(())
        }
        Some(Named::Prompt(n)) => rule.prompt(n).map_err(Refused::Rule),
        Some(Named::Resource(u)) => rule.resource(u).map_err(Refused::Rule),
    }
}

/// The message as refusals name it: `tools/call "delete_repo"`, `resources/list`.
pub(crate) fn shown(call: &Call) -> String {
    let method = call.method.as_deref().unwrap_or("response");
    match &call.target {
        None => method.to_string(),
        Some(Named::Tool(n) | Named::Prompt(n) | Named::Resource(n)) => format!("{method} {n:?}"),
    }
}
