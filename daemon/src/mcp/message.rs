//! A POST body under an `mcp` rule, read as JSON-RPC 2.0 (one message or a batch) with
//! serde_json: each message's id, method and what it names (a tool, a prompt, a resource).
//! Anything else is refused whole: a body the proxy cannot read is not forwarded, nor one a
//! server could read otherwise (a key twice in one object, `unique_keys.rs`).

use serde_json::Value;

/// What one JSON-RPC message asks for, as far as a rule decides it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    /// `None`: a notification, or a client's answer to a server's request (no answer owed).
    pub(crate) id: Option<Value>,
    /// `None`: a response (it has `result` or `error`, no method).
    pub(crate) method: Option<String>,
    pub(crate) target: Option<Named>,
}

/// What a message names, by method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Named {
    /// `tools/call` `params.name`.
    Tool(String),
    /// `prompts/get` `params.name`.
    Prompt(String),
    /// `resources/read`, `resources/subscribe`, `resources/unsubscribe` `params.uri`.
    Resource(String),
}

/// A body as JSON-RPC: one message or a batch (kept in order).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Body {
    pub(crate) calls: Vec<Call>,
    pub(crate) batch: bool,
}

/// Why a body is not JSON-RPC.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum BodyError {
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("the body is not a JSON-RPC 2.0 message or batch: {0}")]
    NotJsonRpc(&'static str),
    /// A server could read it otherwise than the proxy did (`unique_keys.rs`).
    #[error("the body is ambiguous: {0}")]
    DuplicateKey(String),
}

/// Longest batch read (each element is decided and may be answered by the proxy).
pub(crate) const MAX_BATCH: usize = 256;

/// Reads a body of at most `cap` bytes.
pub(crate) fn parse(bytes: &[u8], cap: usize) -> Result<Body, BodyError> {
    if bytes.len() > cap {
        return Err(BodyError::TooLarge(cap));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| BodyError::NotJson(e.to_string()))?;
    super::unique_keys::check(bytes).map_err(|e| BodyError::DuplicateKey(e.to_string()))?;
    match v {
        Value::Array(items) => {
            if items.is_empty() {
                return Err(BodyError::NotJsonRpc("an empty batch"));
            }
            if items.len() > MAX_BATCH {
                return Err(BodyError::NotJsonRpc("a batch of more than 256 messages"));
            }
            let calls = items.iter().map(call).collect::<Result<_, _>>()?;
            Ok(Body { calls, batch: true })
        }
        v => Ok(Body {
            calls: vec![call(&v)?],
            batch: false,
        }),
    }
}

fn call(v: &Value) -> Result<Call, BodyError> {
    let Value::Object(m) = v else {
        return Err(BodyError::NotJsonRpc("a message is not an object"));
    };
    if m.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(BodyError::NotJsonRpc("`jsonrpc` is not \"2.0\""));
    }
    let id = match m.get("id") {
        None => None,
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id.clone()),
        Some(_) => return Err(BodyError::NotJsonRpc("`id` is not a string or number")),
    };
    let method = match m.get("method") {
        None if m.contains_key("result") || m.contains_key("error") => None,
        None => return Err(BodyError::NotJsonRpc("a message has no `method`")),
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(BodyError::NotJsonRpc("`method` is not a string")),
    };
    let param = |key: &str| -> Result<String, BodyError> {
        m.get("params")
            .and_then(|p| p.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(BodyError::NotJsonRpc(
                "a call names no tool, prompt or resource",
            ))
    };
    let target = match method.as_deref() {
        Some("tools/call") => Some(Named::Tool(param("name")?)),
        Some("prompts/get") => Some(Named::Prompt(param("name")?)),
        Some("resources/read" | "resources/subscribe" | "resources/unsubscribe") => {
            Some(Named::Resource(param("uri")?))
        }
        _ => None,
    };
    Ok(Call { id, method, target })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_call_names_its_tool() {
        let b = parse(
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"search","arguments":{}}}"#,
            1024,
        )
        .expect("parses");
        assert!(!b.batch);
        assert_eq!(b.calls[0].id, Some(Value::from(7)));
        assert_eq!(b.calls[0].method.as_deref(), Some("tools/call"));
        assert_eq!(b.calls[0].target, Some(Named::Tool("search".into())));
    }

    #[test]
    fn batch_keeps_order_and_notifications_have_no_id() {
        let b = parse(
            br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},
                 {"jsonrpc":"2.0","id":"a","method":"resources/read","params":{"uri":"file:///x"}},
                 {"jsonrpc":"2.0","id":3,"result":{}}]"#,
            1024,
        )
        .expect("parses");
        assert!(b.batch);
        assert_eq!(b.calls.len(), 3);
        assert_eq!(b.calls[0].id, None);
        assert_eq!(b.calls[1].target, Some(Named::Resource("file:///x".into())));
        assert_eq!(b.calls[2].method, None);
    }

    #[test]
    fn what_is_not_json_rpc_is_refused() {
        assert_eq!(parse(b"{}", 1), Err(BodyError::TooLarge(1)));
        assert!(matches!(parse(b"{nope", 64), Err(BodyError::NotJson(_))));
        assert!(matches!(parse(b"[]", 64), Err(BodyError::NotJsonRpc(_))));
        assert!(matches!(
            parse(br#"{"jsonrpc":"1.0","id":1,"method":"x"}"#, 64),
            Err(BodyError::NotJsonRpc(_))
        ));
        assert!(matches!(
            parse(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
                128
            ),
            Err(BodyError::NotJsonRpc(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, 128),
            Err(BodyError::NotJsonRpc(_))
        ));
    }
}
