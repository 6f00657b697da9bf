//! What a server answers, filtered to what the rule allows: the result of `tools/list`
//! (and of `prompts/list`, `resources/list` where the rule names prompts or resources) keeps
//! only the entries the rule allows and, under `pin`, only tools whose definition is as
//! pinned. Results are recognised by their shape (`result.tools`, `result.prompts`,
//! `result.resources`), not by matching ids to requests: under the older HTTP+SSE transport
//! the answers arrive on another connection than the calls.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::value::RawValue;
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
        // Read with raw values: only the list entries are looked into (their name, or their
        // definition under `pin`), and kept entries are copied as they came. A body this
        // cannot read (not UTF-8 JSON) goes the whole-value way, which says it is not JSON.
        if let Some(done) = self.raw_bytes(bytes) {
            return done;
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else {
            return (None, Removed::default());
        };
        let removed = self.message(&mut v);
        if !removed.any() {
            return (None, removed);
        }
        (serde_json::to_vec(&v).ok(), removed)
    }

    /// [`Self::bytes`] over raw values; `None` if the body is not readable so.
    pub(super) fn raw_bytes(&self, bytes: &[u8]) -> Option<(Option<Vec<u8>>, Removed)> {
        let top: &RawValue = serde_json::from_slice(bytes).ok()?;
        let mut removed = Removed::default();
        let rewritten = if top.get().starts_with('[') {
            let items: Vec<&RawValue> = serde_json::from_str(top.get()).ok()?;
            let mut changed = false;
            let mut parts: Vec<Box<RawValue>> = Vec::with_capacity(items.len());
            for item in items {
                match self.raw_message(item, &mut removed)? {
                    Some(new) => {
                        changed = true;
                        parts.push(new);
                    }
                    None => parts.push(item.to_owned()),
                }
            }
            changed.then(|| serde_json::to_vec(&parts).ok()).flatten()
        } else {
            self.raw_message(top, &mut removed)?
                .map(|m| m.get().as_bytes().to_vec())
        };
        if self.rule.pin {
            self.pins.flush();
        }
        if !removed.any() {
            return Some((None, removed));
        }
        Some((rewritten, removed))
    }

    /// One message with its list results filtered: `Some(None)` when nothing in it changed,
    /// `None` when it is not readable so.
    fn raw_message(&self, msg: &RawValue, removed: &mut Removed) -> Option<Option<Box<RawValue>>> {
        if !msg.get().starts_with('{') {
            return Some(None);
        }
        let fields: BTreeMap<String, &RawValue> = serde_json::from_str(msg.get()).ok()?;
        let Some(result) = fields.get("result").filter(|r| r.get().starts_with('{')) else {
            return Some(None);
        };
        let members: BTreeMap<String, &RawValue> = serde_json::from_str(result.get()).ok()?;
        let mut lists: Vec<(&str, Box<RawValue>)> = Vec::new();
        for (kind, key) in [("tools", "name"), ("prompts", "name"), ("resources", "uri")] {
            if !self.rule.filters(kind) {
                continue;
            }
            let Some(list) = members.get(kind).filter(|l| l.get().starts_with('[')) else {
                continue;
            };
            let entries: Vec<&RawValue> = serde_json::from_str(list.get()).ok()?;
            let total = entries.len();
            let kept: Vec<&RawValue> = entries
                .into_iter()
                .filter(|e| {
                    let keep = match (kind, entry_name(e, key)) {
                        (_, None) => false,
                        ("tools", Some(n)) => self.raw_tool(&n, e, removed),
                        ("prompts", Some(n)) => self.rule.prompt(&n).is_ok(),
                        (_, Some(n)) => self.rule.resource(&n).is_ok(),
                    };
                    if !keep {
                        removed.entries += 1;
                    }
                    keep
                })
                .collect();
            if kept.len() != total {
                lists.push((kind, serde_json::value::to_raw_value(&kept).ok()?));
            }
        }
        if lists.is_empty() {
            return Some(None);
        }
        let mut result: BTreeMap<&str, &RawValue> =
            members.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        for (kind, list) in &lists {
            result.insert(kind, list);
        }
        let result = serde_json::value::to_raw_value(&result).ok()?;
        let mut message: BTreeMap<&str, &RawValue> =
            fields.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        message.insert("result", &result);
        Some(Some(serde_json::value::to_raw_value(&message).ok()?))
    }

    /// A tool entry (its definition raw): allowed by the rule and, under `pin`, as pinned.
    fn raw_tool(&self, name: &str, entry: &RawValue, removed: &mut Removed) -> bool {
        if self.rule.tool(name).is_err() {
            return false;
        }
        if !self.rule.pin {
            return true;
        }
        match serde_json::from_str::<Value>(entry.get()) {
            Ok(definition) => self.tool(name, &definition, removed),
            Err(_) => false,
        }
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

/// An entry's `key` member when it is a string (`None` for anything else, as the value
/// filter reads it: such an entry is removed).
fn entry_name<'a>(entry: &'a RawValue, key: &str) -> Option<Cow<'a, str>> {
    #[derive(serde::Deserialize)]
    struct Name<'a> {
        #[serde(borrow)]
        name: Option<Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct Uri<'a> {
        #[serde(borrow)]
        uri: Option<Cow<'a, str>>,
    }
    if !entry.get().starts_with('{') {
        return None;
    }
    if key == "uri" {
        serde_json::from_str::<Uri<'a>>(entry.get()).ok()?.uri
    } else {
        serde_json::from_str::<Name<'a>>(entry.get()).ok()?.name
    }
}
