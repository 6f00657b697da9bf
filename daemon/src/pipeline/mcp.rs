//! The MCP phase (issue 37), for requests a rule with `mcp` allowed: `request` reads a POST
//! body as JSON-RPC (serde_json, under a cap) and decides each message against the rule's
//! lists and the pins; `response` filters list results in what the server answers (JSON
//! whole, SSE event by event); `answer` renders a refusal as the JSON-RPC error the MCP
//! client shows.
//!
//! A refused message is answered by the proxy with HTTP 200 and a JSON-RPC error carrying
//! the same message as the 403 JSON names (the rule, the list), and recorded as a refusal.
//! A batch is decided element by element: the allowed messages go to the server as a batch
//! of their own, and the refused ones are answered by the proxy inside the server's answer
//! (added to its JSON array, or sent first on its SSE stream; an answer of 202, owed
//! nothing, becomes 200 with the errors). When every message of a batch is refused, nothing
//! reaches the server and each message owed an answer gets its error. Clients of the older HTTP+SSE transport read answers on the
//! SSE stream their session opened, not in the POST's response (they do not accept
//! `text/event-stream` on the POST): the errors are sent as events into that stream
//! (`mcp::sessions`) and the POST gets 202, as the server would answer; when no such stream
//! is known, the 403 JSON, so the client fails rather than waits.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::refusal::Refusal;
use super::RequestCtx;
use crate::body::{self, ProxyBody};
use crate::mcp::decide::{self, Refused};
use crate::mcp::message::{self, Call};
use crate::mcp::{filter::Filter, sse, MAX_REQUEST_BODY, MAX_RESPONSE_BODY};
use crate::policy::McpRule;
use crate::record::{ErrorCode, McpFacts, McpRefusedMessage};

/// What the MCP phase learned of one request.
pub(crate) struct McpExchange {
    rule: Arc<McpRule>,
    /// `host:port`: whose pins.
    server: Arc<str>,
    /// For the record: the deciding message's method and tool.
    pub facts: Option<McpFacts>,
    /// The client reads JSON-RPC answers in the POST's response (Streamable HTTP).
    answers_inline: bool,
    /// Set when the proxy answers for the server, in whole or in part: each message.
    refused: Option<Vec<Owed>>,
    batch: bool,
    /// Older transport: the errors went to the session's SSE stream; the POST gets 202.
    injected: bool,
    /// A batch forwarded in part: the refusal of its first refused message, whose errors
    /// (one per refused message owed an answer) go into the server's answer.
    partial: Option<Refusal>,
}

/// One message of a body the proxy answers for, in whole or in part.
struct Owed {
    /// `None`: no answer is owed (a notification, a response).
    id: Option<Value>,
    /// Why it was refused, and the message saying so; `None`: it was allowed.
    refused: Option<(Refused, String)>,
}

/// JSON-RPC error codes of the implementation-defined range.
const RPC_DENIED: i64 = -32001;
const RPC_CHANGED: i64 = -32002;
const RPC_NOT_FORWARDED: i64 = -32003;

/// Reads and decides the body under an `mcp` rule; any other request goes on streaming.
pub(super) async fn request(
    ctx: &mut RequestCtx,
    req: Request<Incoming>,
) -> Result<Request<ProxyBody>, Refusal> {
    let Some(rule) = ctx.decision.as_ref().and_then(|d| d.mcp.clone()) else {
        return Ok(req.map(body::stream));
    };
    let target = ctx.target.as_ref().expect("the target phase ran");
    let server: Arc<str> = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port).into()
    } else {
        format!("{}:{}", target.host, target.port).into()
    };
    let (mut parts, incoming) = req.into_parts();
    // Answers must be readable to be filtered: no compression asked for.
    parts.headers.remove(header::ACCEPT_ENCODING);
    let answers_inline = parts
        .headers
        .get_all(header::ACCEPT)
        .iter()
        .any(|v| String::from_utf8_lossy(v.as_bytes()).contains("text/event-stream"));
    ctx.mcp = Some(McpExchange {
        rule: rule.clone(),
        server: server.clone(),
        facts: None,
        answers_inline,
        refused: None,
        batch: false,
        injected: false,
        partial: None,
    });
    if parts.method != http::Method::POST {
        // A GET opens the server's SSE stream; a DELETE ends a session: nothing to read.
        return Ok(Request::from_parts(parts, body::stream(incoming)));
    }
    let bytes = match Limited::new(incoming, MAX_REQUEST_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            let why = match e.downcast_ref::<http_body_util::LengthLimitError>() {
                Some(_) => message::BodyError::TooLarge(MAX_REQUEST_BODY).to_string(),
                None => format!("the body could not be read: {e}"),
            };
            return Err(invalid(ctx, &why));
        }
    };
    let parsed =
        message::parse(&bytes, MAX_REQUEST_BODY).map_err(|e| invalid(ctx, &e.to_string()))?;
    let verdicts: Vec<Result<(), Refused>> = parsed
        .calls
        .iter()
        .map(|c| decide::decide(&rule, &ctx.proxy.mcp.pins, &server, c))
        .collect();
    let first_refused = verdicts.iter().position(Result::is_err);
    let exchange = ctx.mcp.as_mut().expect("just set");
    exchange.batch = parsed.batch;
    let Some(at) = first_refused else {
        exchange.facts = Some(facts(&parsed.calls[0], &parsed, &verdicts));
        return Ok(Request::from_parts(parts, body::full(bytes)));
    };
    let rule_id = ctx.rule().map(|r| r.to_string()).unwrap_or_default();
    let said = |c: &Call, why: Refused| {
        format!(
            "{} to {server} is not allowed by rule {rule_id} {}",
            decide::shown(c),
            why.why()
        )
    };
    let owed: Vec<Owed> = parsed
        .calls
        .iter()
        .zip(&verdicts)
        .map(|(c, v)| Owed {
            id: c.id.clone(),
            refused: v.err().map(|why| (why, said(c, why))),
        })
        .collect();
    let why = verdicts[at].expect_err("the first refused");
    let refusal = Refusal {
        rule_id: Some(rule_id.clone()),
        ..Refusal::new(why.code(), said(&parsed.calls[at], why))
    };
    let first_allowed = verdicts.iter().position(Result::is_ok);
    let exchange = ctx.mcp.as_mut().expect("just set");
    exchange.refused = Some(owed);
    if let (true, Some(first)) = (parsed.batch, first_allowed) {
        // Element by element: the allowed messages go on, as a batch of their own.
        let forwarded = allowed_only(&bytes, &verdicts).map_err(|e| invalid(ctx, &e))?;
        ctx.mcp.as_mut().expect("just set").facts =
            Some(facts(&parsed.calls[first], &parsed, &verdicts));
        let mut answered_here = answers_inline;
        if !answered_here {
            // The older transport: the refused messages' errors go to the session's stream.
            let exchange = ctx.mcp.as_ref().expect("just set");
            let messages: Vec<String> = errors_for(
                exchange,
                &refusal,
                &ctx.id.to_string(),
                ctx.policy.hash(),
                true,
            )
            .iter()
            .map(Value::to_string)
            .collect();
            answered_here = messages.is_empty()
                || ctx
                    .proxy
                    .mcp
                    .sessions
                    .inject(&server, &endpoint(ctx), &messages);
        }
        if answered_here {
            let exchange = ctx.mcp.as_mut().expect("just set");
            exchange.partial = Some(refusal);
            parts.headers.remove(header::CONTENT_LENGTH);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(forwarded.len()));
            return Ok(Request::from_parts(
                parts,
                body::full(Bytes::from(forwarded)),
            ));
        }
        // Nowhere to send the refused messages' errors: the batch is refused whole.
    }
    let exchange = ctx.mcp.as_mut().expect("just set");
    exchange.facts = Some(facts(&parsed.calls[at], &parsed, &verdicts));
    if !answers_inline {
        // The older transport: answer on the session's SSE stream, where the client reads.
        let exchange = ctx.mcp.as_ref().expect("just set");
        let messages: Vec<String> =
            errors(exchange, &refusal, &ctx.id.to_string(), ctx.policy.hash())
                .iter()
                .map(Value::to_string)
                .collect();
        let injected = !messages.is_empty()
            && ctx
                .proxy
                .mcp
                .sessions
                .inject(&server, &endpoint(ctx), &messages);
        ctx.mcp.as_mut().expect("just set").injected = injected;
    }
    Err(refusal)
}

/// The path (and query) the POST went to: the older transport's session endpoint.
fn endpoint(ctx: &RequestCtx) -> String {
    match &ctx.query {
        Some(q) => format!("{}?{q}", ctx.path),
        None => ctx.path.clone(),
    }
}

/// The batch in `bytes` with only the messages `verdicts` allowed, in order.
fn allowed_only(bytes: &[u8], verdicts: &[Result<(), Refused>]) -> Result<Vec<u8>, String> {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(bytes) else {
        return Err("the batch could not be read again".to_string());
    };
    let kept: Vec<Value> = items
        .into_iter()
        .zip(verdicts)
        .filter_map(|(item, v)| v.is_ok().then_some(item))
        .collect();
    serde_json::to_vec(&Value::Array(kept)).map_err(|e| e.to_string())
}

/// The record's MCP facts: `call` (the message that decided), and for a batch its size and
/// every message refused in it.
fn facts(call: &Call, parsed: &message::Body, verdicts: &[Result<(), Refused>]) -> McpFacts {
    let tool = |c: &Call| match &c.target {
        Some(message::Named::Tool(n)) => Some(n.clone()),
        _ => None,
    };
    McpFacts {
        method: call.method.clone(),
        tool: tool(call),
        batch: parsed.batch.then_some(parsed.calls.len()),
        refused: if parsed.batch {
            parsed
                .calls
                .iter()
                .zip(verdicts)
                .filter_map(|(c, v)| {
                    let why = v.err()?;
                    Some(McpRefusedMessage {
                        method: c.method.clone(),
                        tool: tool(c),
                        error_code: why.code(),
                    })
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

fn invalid(ctx: &RequestCtx, why: &str) -> Refusal {
    let rule_id = ctx.rule().map(|r| r.to_string()).unwrap_or_default();
    Refusal {
        rule_id: Some(rule_id.clone()),
        ..Refusal::new(
            ErrorCode::McpBodyInvalid,
            format!("an MCP request under rule {rule_id} must be JSON-RPC: {why}"),
        )
    }
}

/// The server's answer with its list results filtered, when the rule filters any.
pub(super) async fn response(
    ctx: &RequestCtx,
    resp: Response<ProxyBody>,
) -> Result<Response<ProxyBody>, Refusal> {
    let Some(exchange) = &ctx.mcp else {
        return Ok(resp);
    };
    let rule = &exchange.rule;
    // A batch forwarded in part, answered in the POST's response: the refused messages'
    // errors go into the server's answer.
    let owed = match (&exchange.partial, exchange.answers_inline) {
        (Some(r), true) => errors(exchange, r, &ctx.id.to_string(), ctx.policy.hash()),
        _ => Vec::new(),
    };
    if !owed.is_empty() && resp.status() == http::StatusCode::ACCEPTED {
        // The server owed nothing (the allowed messages were notifications): the errors are
        // the answer.
        let (mut parts, _) = resp.into_parts();
        let mut json = serde_json::to_vec(&Value::Array(owed)).unwrap_or_default();
        json.push(b'\n');
        parts.status = http::StatusCode::OK;
        parts.headers.remove(header::CONTENT_ENCODING);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(json.len()));
        return Ok(Response::from_parts(parts, body::full(Bytes::from(json))));
    }
    let filters = ["tools", "prompts", "resources"]
        .iter()
        .any(|k| rule.filters(k));
    let merges = !owed.is_empty() && resp.status().is_success();
    if !filters && !merges {
        return Ok(resp);
    }
    let media = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let json = media == "application/json" || media.ends_with("+json");
    let stream = media == "text/event-stream";
    if !json && !stream {
        return Ok(resp);
    }
    let encoded = resp
        .headers()
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    if encoded {
        return Err(Refusal::new(
            ErrorCode::UpstreamError,
            "the MCP server compressed its answer, which the proxy must read to filter",
        ));
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let owed = if merges { owed } else { Vec::new() };
    if stream {
        let body = sse::filtered(
            body,
            rule.clone(),
            ctx.proxy.mcp.clone(),
            exchange.server.clone(),
            MAX_RESPONSE_BODY,
            owed.iter().map(Value::to_string).collect(),
        );
        return Ok(Response::from_parts(parts, body));
    }
    let bytes = read_capped(body, MAX_RESPONSE_BODY).await.map_err(|e| {
        Refusal::new(
            ErrorCode::UpstreamError,
            format!("the MCP server's answer could not be read whole: {e}"),
        )
    })?;
    let filter = Filter {
        rule,
        pins: &ctx.proxy.mcp.pins,
        server: &exchange.server,
    };
    let bytes = if owed.is_empty() {
        match filter.bytes(&bytes) {
            (Some(filtered), _) => Bytes::from(filtered),
            (None, _) => bytes,
        }
    } else {
        merged(&bytes, owed, &filter).map_or(bytes, Bytes::from)
    };
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    Ok(Response::from_parts(parts, body::full(bytes)))
}

/// The server's JSON answer to a batch forwarded in part, with the proxy's errors for the
/// refused messages added after its own, and filtered; `None` if it is not JSON (passed on
/// as it came: the client cannot read it either).
fn merged(bytes: &[u8], owed: Vec<Value>, filter: &Filter<'_>) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    filter.message(&mut v);
    let mut all = match v {
        Value::Array(items) => items,
        one => vec![one],
    };
    all.extend(owed);
    serde_json::to_vec(&Value::Array(all)).ok()
}

/// Why a whole body could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadCapped {
    #[error("it is larger than {0} bytes, the most the proxy filters")]
    TooLarge(usize),
    #[error("{0}")]
    Body(body::BodyError),
}

/// The whole of `body`, at most `cap` bytes (a loop over frames: `Limited` over a boxed body
/// trips rustc's higher-ranked `Send` check of the request future).
async fn read_capped(mut body: ProxyBody, cap: usize) -> Result<Bytes, ReadCapped> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ReadCapped::Body)?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > cap {
                return Err(ReadCapped::TooLarge(cap));
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out.freeze())
}

/// The refusal as the MCP client's answer (HTTP 200, JSON-RPC errors in the messages'
/// order), when the proxy answers for the server; `None`: the plain refusal.
pub(super) fn answer(
    ctx: &RequestCtx,
    r: &Refusal,
    request_id: &str,
    policy_hash: &str,
) -> Option<Response<ProxyBody>> {
    let exchange = ctx.mcp.as_ref()?;
    if exchange.injected {
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = http::StatusCode::ACCEPTED;
        return Some(resp);
    }
    if !exchange.answers_inline {
        return None;
    }
    let errors = errors(exchange, r, request_id, policy_hash);
    let mut resp = Response::new(body::empty());
    if !errors.is_empty() {
        let v = if exchange.batch {
            Value::Array(errors)
        } else {
            errors.into_iter().next().unwrap_or(Value::Null)
        };
        let mut json = serde_json::to_vec(&v).unwrap_or_default();
        json.push(b'\n');
        resp = Response::new(body::full(Bytes::from(json)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    } else {
        // Only notifications: nothing is owed but the acknowledgement.
        *resp.status_mut() = http::StatusCode::ACCEPTED;
    }
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-agenshield-request-id", v);
    }
    Some(resp)
}

/// The JSON-RPC errors answering a refused body: one per message owed an answer, in order
/// (for a batch forwarded in part, the refused messages' only).
fn errors(exchange: &McpExchange, r: &Refusal, request_id: &str, policy_hash: &str) -> Vec<Value> {
    let refused_only = exchange.partial.is_some();
    errors_for(exchange, r, request_id, policy_hash, refused_only)
}

/// `refused_only`: no "not forwarded" errors for the allowed messages (they went on).
fn errors_for(
    exchange: &McpExchange,
    r: &Refusal,
    request_id: &str,
    policy_hash: &str,
    refused_only: bool,
) -> Vec<Value> {
    let Some(items) = exchange.refused.as_ref() else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|o| {
            let id = o.id.as_ref()?;
            let (code, message, error_code) = match &o.refused {
                Some((why, message)) => {
                    let rpc = match why {
                        Refused::Changed => RPC_CHANGED,
                        Refused::Rule(_) => RPC_DENIED,
                    };
                    (rpc, message.clone(), why.code())
                }
                None if refused_only => return None,
                None => (
                    RPC_NOT_FORWARDED,
                    format!(
                        "not forwarded: another message of the batch was refused: {}",
                        r.message
                    ),
                    r.code,
                ),
            };
            let data = json!({
                "error_code": error_code,
                "rule_id": r.rule_id,
                "request_id": request_id,
                "policy_hash": policy_hash,
                "explanation": message,
            });
            Some(json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": code, "message": message, "data": data},
            }))
        })
        .collect()
}

/// The status the agent gets for refusal `r`: 200 (or 202) when the proxy answers as the
/// server, else the refusal's.
pub(super) fn answered_status(ctx: &RequestCtx, r: &Refusal) -> u16 {
    match ctx.mcp.as_ref() {
        Some(e) if e.injected => 202,
        Some(e) if e.answers_inline => match &e.refused {
            Some(items) if items.iter().any(|o| o.id.is_some()) => 200,
            Some(_) => 202,
            None => r.code.status().as_u16(),
        },
        _ => r.code.status().as_u16(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::filter::Filter;
    use crate::mcp::pins::PinStore;
    use crate::policy::McpRefusal;

    fn rule() -> Arc<McpRule> {
        crate::policy::Policy::from_sources(&[crate::policy::PolicySource {
            name: "t.toml".into(),
            text: "version = 1\n[[rule]]\nid = \"r\"\nhosts = [\"m.test\"]\naction = \"allow\"\nmcp = { tools = [\"a\"] }\n".into(),
        }])
        .expect("policy")
        .decide(&crate::policy::RequestFacts {
            host: "m.test",
            port: 80,
            scheme: crate::policy::Scheme::Http,
            method: Some("POST"),
            path: Some("/"),
            agent: None,
        })
        .mcp
        .expect("mcp")
    }

    fn exchange(refused: Vec<Owed>, batch: bool, partial: Option<Refusal>) -> McpExchange {
        McpExchange {
            rule: rule(),
            server: "m.test:80".into(),
            facts: None,
            answers_inline: true,
            refused: Some(refused),
            batch,
            injected: false,
            partial,
        }
    }

    fn denied(tool: &str) -> Option<(Refused, String)> {
        Some((
            Refused::Rule(McpRefusal::ToolNotListed),
            format!("tools/call {tool:?} to m.test:80 is not allowed by rule r (mcp.tools)"),
        ))
    }

    fn refusal() -> Refusal {
        Refusal {
            rule_id: Some("r".into()),
            ..Refusal::new(
                ErrorCode::McpToolDenied,
                "tools/call \"x\" to m.test:80 is not allowed by rule r (mcp.tools)",
            )
        }
    }

    fn owed(id: Option<Value>, refused: Option<(Refused, String)>) -> Owed {
        Owed { id, refused }
    }

    #[test]
    fn a_refused_batch_answers_every_request_in_order_and_skips_notifications() {
        let e = exchange(
            vec![
                owed(Some(json!(1)), None),
                owed(None, None),
                owed(Some(json!("b")), denied("x")),
                owed(Some(json!(3)), denied("y")),
            ],
            true,
            None,
        );
        let r = refusal();
        let v = errors(&e, &r, "req-1", "sha256:h");
        assert_eq!(v.len(), 3);
        assert_eq!(v[0]["id"], 1);
        assert_eq!(v[0]["error"]["code"], RPC_NOT_FORWARDED);
        assert_eq!(v[1]["id"], "b");
        assert_eq!(v[1]["error"]["code"], RPC_DENIED);
        assert_eq!(v[1]["error"]["message"], r.message.as_str());
        assert_eq!(v[1]["error"]["data"]["error_code"], "mcp_tool_denied");
        assert_eq!(v[1]["error"]["data"]["rule_id"], "r");
        assert_eq!(v[1]["error"]["data"]["request_id"], "req-1");
        // Each refused message is answered with its own reason.
        assert_eq!(v[2]["id"], 3);
        assert!(
            v[2]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("tools/call \"y\"")),
            "{v:?}"
        );
    }

    #[test]
    fn a_batch_forwarded_in_part_answers_only_its_refused_messages() {
        let e = exchange(
            vec![
                owed(Some(json!(1)), None),
                owed(Some(json!(2)), denied("x")),
                owed(None, denied("z")),
            ],
            true,
            Some(refusal()),
        );
        let v = errors(&e, &refusal(), "req-1", "sha256:h");
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0]["id"], 2);
        assert_eq!(v[0]["error"]["code"], RPC_DENIED);
    }

    #[test]
    fn only_the_allowed_messages_of_a_batch_are_forwarded_in_order() {
        let body = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}},
            {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}},
            {"jsonrpc":"2.0","method":"notifications/initialized"}]"#;
        let verdicts = [
            Ok(()),
            Err(Refused::Rule(McpRefusal::ToolNotListed)),
            Ok(()),
        ];
        let out: Value =
            serde_json::from_slice(&allowed_only(body, &verdicts).expect("batch")).expect("json");
        let items = out.as_array().expect("array");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["id"], 1);
        assert_eq!(items[1]["method"], "notifications/initialized");
        assert!(allowed_only(b"{}", &verdicts).is_err());
    }

    #[test]
    fn the_proxys_errors_follow_the_servers_answers_and_lists_are_filtered() {
        let rule = rule();
        let dir = tempfile::tempdir().expect("tempdir");
        let pins = PinStore::open(dir.path().join("pins.json")).expect("pins");
        let filter = Filter {
            rule: &rule,
            pins: &pins,
            server: "m.test:80",
        };
        let answer =
            br#"[{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"},{"name":"b"}]}}]"#;
        let err = json!({"jsonrpc":"2.0","id":2,"error":{"code":RPC_DENIED,"message":"no"}});
        let out: Value =
            serde_json::from_slice(&merged(answer, vec![err.clone()], &filter).expect("merged"))
                .expect("json");
        assert_eq!(out[0]["result"]["tools"].as_array().map(Vec::len), Some(1));
        assert_eq!(out[1], err);
        // One message answered (not an array): the answer becomes a batch.
        let one = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        let out: Value =
            serde_json::from_slice(&merged(one, vec![err.clone()], &filter).expect("merged"))
                .expect("json");
        assert_eq!(out.as_array().map(Vec::len), Some(2));
        assert!(merged(b"not json", vec![err], &filter).is_none());
    }
}
