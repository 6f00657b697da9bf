//! `ctl mcp list | accept`: the MCP tool definitions the daemon pinned, and an operator's
//! acceptance of one that changed.

use http::Method;

use super::client::Client;
use super::{fail, print};
use crate::cli::McpCommand;

pub(super) async fn run(client: &Client, cmd: McpCommand, json: bool) -> u8 {
    match cmd {
        McpCommand::List => match client.json(Method::GET, "/v1/mcp/pins", None).await {
            Ok(v) => print(&v, json, list),
            Err(e) => fail(e),
        },
        McpCommand::Accept { server, tool } => {
            let body = serde_json::json!({"server": server, "tool": tool});
            match client
                .json(Method::POST, "/v1/mcp/accept", Some(body))
                .await
            {
                Ok(v) => print(&v, json, |v| {
                    format!(
                        "accepted {} on {}: pinned {}",
                        v["tool"].as_str().unwrap_or("?"),
                        v["server"].as_str().unwrap_or("?"),
                        v["hash"].as_str().unwrap_or("?")
                    )
                }),
                Err(e) => fail(e),
            }
        }
    }
}

fn list(v: &serde_json::Value) -> String {
    let Some(pins) = v.as_array().filter(|a| !a.is_empty()) else {
        return "no MCP tools pinned".into();
    };
    let mut out = Vec::with_capacity(pins.len());
    for p in pins {
        let state = match p["changed"]["seen_at"].as_str() {
            Some(at) => format!("CHANGED since {at}: calls refused until `ctl mcp accept`"),
            None => "as pinned".into(),
        };
        out.push(format!(
            "{}  {}  {}  {state}",
            p["server"].as_str().unwrap_or("?"),
            p["tool"].as_str().unwrap_or("?"),
            p["hash"].as_str().unwrap_or("?"),
        ));
    }
    out.join("\n")
}
