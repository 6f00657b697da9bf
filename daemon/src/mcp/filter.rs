//! What a server answers, filtered to what the rule allows: the result of `tools/list`
//! (and of `prompts/list`, `resources/list` where the rule names prompts or resources) keeps
//! only the entries the rule allows and, under `pin`, only tools whose definition is as
//! pinned. Results are recognised by their shape (`result.tools`, `result.prompts`,
//! `result.resources`), not by matching ids to requests: under the older HTTP+SSE transport
//! the answers arrive on another connection than the calls.

use serde_json::Value;

use super::pins::{PinStore, Seen};
use crate::policy::McpRule;

/// The rule, the pins and the server (`host:port`) an answer came from.
pub(crate) struct Filter<'a> {
    pub(crate) rule: &'a McpRule,
    pub(crate) pins: &'a PinStore,
    pub(crate) server: &'a str,
}

/// What filtering removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Removed {
    /// Entries removed (the rule's, or unreadable).
    pub(crate) entries: usize,
    /// Tools removed because their definition changed since pinned.
    pub(crate) changed_tools: Vec<String>,
}

impl Removed {
    pub(crate) fn any(&self) -> bool {
        self.entries > 0 || !self.changed_tools.is_empty()
    }
}

impl Filter<'_> {
    /// Filters one message or a batch in place.
    pub(crate) fn message(&self, v: &mut Value) -> Removed {
        let mut removed = Removed::default();
        match v {
            Value::Array(items) => {
                for item in items {
                    self.one(item, &mut removed);
                }
            }
            other => self.one(other, &mut removed),
        }
        if self.rule.pin {
            self.pins.flush();
        }
        removed
    }

    /// A serialized message or batch: the filtered bytes, or `None` when nothing changed (or
    /// it is not JSON, which the client cannot read either).
    pub(crate) fn bytes(&self, bytes: &[u8]) -> (Option<Vec<u8>>, Removed) {
        let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else {
            return (None, Removed::default());
        };
        let removed = self.message(&mut v);
        if !removed.any() {
            return (None, removed);
        }
        (serde_json::to_vec(&v).ok(), removed)
    }

    fn one(&self, msg: &mut Value, removed: &mut Removed) {
        let Some(result) = msg.get_mut("result").and_then(Value::as_object_mut) else {
            return;
        };
        for (kind, key) in [("tools", "name"), ("prompts", "name"), ("resources", "uri")] {
            if !self.rule.filters(kind) {
                continue;
            }
            let Some(Value::Array(entries)) = result.get_mut(kind) else {
                continue;
            };
            entries.retain(|e| {
                let name = e.get(key).and_then(Value::as_str);
                let keep = match (kind, name) {
                    (_, None) => false,
                    ("tools", Some(n)) => self.tool(n, e, removed),
                    ("prompts", Some(n)) => self.rule.prompt(n).is_ok(),
                    (_, Some(n)) => self.rule.resource(n).is_ok(),
                };
                if !keep {
                    removed.entries += 1;
                }
                keep
            });
        }
    }

    fn tool(&self, name: &str, definition: &Value, removed: &mut Removed) -> bool {
        if self.rule.tool(name).is_err() {
            return false;
        }
        if !self.rule.pin {
            return true;
        }
        match self.pins.observe(self.server, name, definition) {
            Seen::Pinned | Seen::Same => true,
            Seen::Changed => {
                tracing::warn!(
                    server = self.server,
                    tool = name,
                    "MCP tool definition changed since pinned: removed from the list and its calls refused until `ctl mcp accept`"
                );
                removed.changed_tools.push(name.to_string());
                false
            }
        }
    }
}
