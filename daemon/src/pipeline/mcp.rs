//! The MCP phase (issue 37), for requests a rule with `mcp` allowed: `request` reads a POST
//! body as JSON-RPC (serde_json, under a cap) and decides each message against the rule's
//! lists and the pins; `response` filters list results in what the server answers (JSON
//! whole, SSE event by event); `answer` renders a refusal as the JSON-RPC error the MCP
//! client shows.
//!
//! A refused message is answered by the proxy with HTTP 200 and a JSON-RPC error carrying
//! the same message as the 403 JSON names (the rule, the list), and recorded as a refusal.
//! A batch with a refused element is refused whole: every element that expects an answer
//! gets an error, the refused ones their reason, the others "not forwarded" (nothing of the
//! batch reaches the server). Clients of the older HTTP+SSE transport read answers on the
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
use crate::record::{ErrorCode, McpFacts};

/// What the MCP phase learned of one request.
pub(crate) struct McpExchange {
    rule: Arc<McpRule>,
    /// `host:port`: whose pins.
    server: Arc<str>,
    /// For the record: the deciding message's method and tool.
    pub facts: Option<McpFacts>,
    /// The client reads JSON-RPC answers in the POST's response (Streamable HTTP).
    answers_inline: bool,
    /// Set when the proxy answers for the server: each message's id and, if refused, why.
    refused: Option<Vec<(Option<Value>, Option<Refused>)>>,
    batch: bool,
    /// Older transport: the errors went to the session's SSE stream; the POST gets 202.
    injected: bool,
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
    let deciding = &parsed.calls[first_refused.unwrap_or(0)];
    let exchange = ctx.mcp.as_mut().expect("just set");
    exchange.facts = Some(facts(deciding, parsed.batch.then_some(parsed.calls.len())));
    exchange.batch = parsed.batch;
    let Some(at) = first_refused else {
        return Ok(Request::from_parts(parts, body::full(bytes)));
    };
    let why = verdicts[at].expect_err("the first refused");
    exchange.refused = Some(
        parsed
            .calls
            .iter()
            .zip(&verdicts)
            .map(|(c, v)| (c.id.clone(), v.err()))
            .collect(),
    );
    let rule_id = ctx.rule().map(|r| r.to_string()).unwrap_or_default();
    let message = format!(
        "{} to {server} is not allowed by rule {rule_id} {}",
        decide::shown(deciding),
        why.why()
    );
    let refusal = Refusal {
        rule_id: Some(rule_id),
        ..Refusal::new(why.code(), message)
    };
    if !answers_inline {
        // The older transport: answer on the session's SSE stream, where the client reads.
        let exchange = ctx.mcp.as_ref().expect("just set");
        let messages: Vec<String> =
            errors(exchange, &refusal, &ctx.id.to_string(), ctx.policy.hash())
                .iter()
                .map(Value::to_string)
                .collect();
        let endpoint = match &ctx.query {
            Some(q) => format!("{}?{q}", ctx.path),
            None => ctx.path.clone(),
        };
        let injected =
            !messages.is_empty() && ctx.proxy.mcp.sessions.inject(&server, &endpoint, &messages);
        ctx.mcp.as_mut().expect("just set").injected = injected;
    }
    Err(refusal)
}

fn facts(call: &Call, batch: Option<usize>) -> McpFacts {
    McpFacts {
        method: call.method.clone(),
        tool: match &call.target {
            Some(message::Named::Tool(n)) => Some(n.clone()),
            _ => None,
        },
        batch,
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
    if !["tools", "prompts", "resources"]
        .iter()
        .any(|k| rule.filters(k))
    {
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
    if stream {
        let body = sse::filtered(
            body,
            rule.clone(),
            ctx.proxy.mcp.clone(),
            exchange.server.clone(),
            MAX_RESPONSE_BODY,
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
    let bytes = match filter.bytes(&bytes) {
        (Some(filtered), _) => Bytes::from(filtered),
        (None, _) => bytes,
    };
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    Ok(Response::from_parts(parts, body::full(bytes)))
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

/// The JSON-RPC errors answering a refused body: one per message owed an answer, in order.
fn errors(exchange: &McpExchange, r: &Refusal, request_id: &str, policy_hash: &str) -> Vec<Value> {
    let Some(items) = exchange.refused.as_ref() else {
        return Vec::new();
    };
    let data = json!({
        "error_code": r.code,
        "rule_id": r.rule_id,
        "request_id": request_id,
        "policy_hash": policy_hash,
        "explanation": r.explanation,
    });
    items
        .iter()
        .filter_map(|(id, refused)| {
            let id = id.as_ref()?;
            let (code, message) = match refused {
                Some(Refused::Changed) => (RPC_CHANGED, r.message.clone()),
                Some(Refused::Rule(_)) => (RPC_DENIED, r.message.clone()),
                None => (
                    RPC_NOT_FORWARDED,
                    format!(
                        "not forwarded: another message of the batch was refused: {}",
                        r.message
                    ),
                ),
            };
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
            Some(items) if items.iter().any(|(id, _)| id.is_some()) => 200,
            Some(_) => 202,
            None => r.code.status().as_u16(),
        },
        _ => r.code.status().as_u16(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::McpRefusal;

    fn exchange(refused: Vec<(Option<Value>, Option<Refused>)>, batch: bool) -> McpExchange {
        let rule = crate::policy::Policy::from_sources(&[crate::policy::PolicySource {
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
        .expect("mcp");
        McpExchange {
            rule,
            server: "m.test:80".into(),
            facts: None,
            answers_inline: true,
            refused: Some(refused),
            batch,
            injected: false,
        }
    }

    #[test]
    fn a_refused_batch_answers_every_request_in_order_and_skips_notifications() {
        let e = exchange(
            vec![
                (Some(json!(1)), None),
                (None, None),
                (
                    Some(json!("b")),
                    Some(Refused::Rule(McpRefusal::ToolNotListed)),
                ),
            ],
            true,
        );
        let r = Refusal {
            rule_id: Some("r".into()),
            ..Refusal::new(
                ErrorCode::McpToolDenied,
                "tools/call \"x\" to m.test:80 is not allowed by rule r (mcp.tools)",
            )
        };
        let v = errors(&e, &r, "req-1", "sha256:h");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["id"], 1);
        assert_eq!(v[0]["error"]["code"], RPC_NOT_FORWARDED);
        assert_eq!(v[1]["id"], "b");
        assert_eq!(v[1]["error"]["code"], RPC_DENIED);
        assert_eq!(v[1]["error"]["message"], r.message.as_str());
        assert_eq!(v[1]["error"]["data"]["error_code"], "mcp_tool_denied");
        assert_eq!(v[1]["error"]["data"]["rule_id"], "r");
        assert_eq!(v[1]["error"]["data"]["request_id"], "req-1");
    }
}
