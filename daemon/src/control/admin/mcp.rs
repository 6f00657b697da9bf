//! `/v1/mcp/pins`: the MCP tool definitions pinned per server (`GET`), and an operator's
//! acceptance of a changed definition (`POST /v1/mcp/accept` with `{"server", "tool"}`),
//! after which the tool is listed and callable again with its new definition pinned.

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;

use super::routes::{error, json};
use super::Admin;
use crate::body::ProxyBody;

pub(super) fn list(admin: &Admin) -> Response<ProxyBody> {
    let pins: Vec<serde_json::Value> = admin
        .proxy
        .mcp
        .pins
        .list()
        .into_iter()
        .map(|(server, tool, pin)| {
            serde_json::json!({
                "server": server,
                "tool": tool,
                "hash": pin.hash,
                "pinned_at": pin.pinned_at,
                "changed": pin.changed.as_ref().map(|c| serde_json::json!({"hash": c.hash, "seen_at": c.seen_at})),
            })
        })
        .collect();
    json(StatusCode::OK, &pins)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Accept {
    server: String,
    tool: String,
}

pub(super) async fn accept(
    admin: &Admin,
    caller: &super::caller::Caller,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            )
        }
    };
    let ask: Accept = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("expected {{\"server\": \"host:port\", \"tool\": \"name\"}}: {e}"),
            )
        }
    };
    match admin.proxy.mcp.pins.accept(&ask.server, &ask.tool) {
        Ok(pin) => {
            tracing::info!(caller = %caller, server = %ask.server, tool = %ask.tool, hash = %pin.hash, "MCP tool definition accepted");
            json(
                StatusCode::OK,
                &serde_json::json!({"server": ask.server, "tool": ask.tool, "hash": pin.hash, "pinned_at": pin.pinned_at}),
            )
        }
        Err(e @ crate::mcp::pins::PinError::NotPinned { .. }) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
