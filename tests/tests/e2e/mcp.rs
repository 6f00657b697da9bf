//! MCP-aware rules (issue 37), with a real MCP server and client: the official Python SDK
//! (`tests/mcp/server.py`, three tools over Streamable HTTP; `tests/mcp/client.py`) through
//! the explicit listener. The rule allows `search` and `read_*` and pins definitions: the
//! client sees only those, an allowed call works, a call to `delete_repo` comes back as a
//! JSON-RPC error naming the rule, the list is filtered in SSE answers (the server's default),
//! JSON ones and the older HTTP+SSE transport's stream (where the proxy's error is sent too), a server that changes a pinned tool's description is refused until `ctl mcp
//! accept`, and every record names the method and tool.

use agenshield_e2e::audit;
use agenshield_e2e::curl::curl;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::mcp::{python, session, McpServer, Transport};
use agenshield_e2e::world::LOCAL;
use serde_json::Value;

const POLICY: &str = r#"version = 1
default = "deny"

[[rule]]
id = "mcp-tools"
hosts = ["mcp.test"]
action = "allow"
mcp = { tools = ["search", "read_*"], deny_tools = ["read_secret*"], pin = true }
"#;

fn daemon() -> Daemon {
    Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        hosts: vec![("mcp.test".into(), LOCAL)],
        ..Default::default()
    })
}

fn requests(d: &Daemon) -> Vec<Value> {
    audit::lines(&d.audit_path())
        .into_iter()
        .filter(|l| l["kind"] == "request")
        .collect()
}

fn calls(report: &Value) -> &Vec<Value> {
    report["calls"].as_array().expect("calls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sees_allowed_tools_and_a_denied_call_is_a_json_rpc_error() {
    let Ok(py) = python().map_err(|why| eprintln!("{why}")) else {
        return;
    };
    let d = daemon();
    let proxy = format!("http://{}", d.explicit);
    let transports = [
        Transport::StreamableSse,
        Transport::StreamableJson,
        Transport::HttpSse,
    ];
    for transport in transports {
        let server = McpServer::start(&py, transport);
        let report = session(
            &py,
            &proxy,
            transport,
            server.addr.port(),
            &[
                r#"search={"query":"x"}"#,
                r#"delete_repo={"name":"r"}"#,
                r#"read_file={"path":"/a"}"#,
            ],
        )
        .await;
        assert_eq!(
            report["tools"],
            serde_json::json!(["search", "read_file"]),
            "{transport:?}: the list holds only what the rule allows: {report}"
        );
        let c = calls(&report);
        assert_eq!(c[0]["text"], "results for x", "{report}");
        assert_eq!(c[1]["code"], -32001, "{report}");
        let message = c[1]["message"].as_str().expect("a JSON-RPC error");
        assert!(
            message.contains("tools/call \"delete_repo\"")
                && message.contains("not allowed by rule mcp-tools (mcp.tools)"),
            "{message}"
        );
        assert_eq!(c[2]["text"], "contents of /a", "{report}");
    }
    let records = requests(&d);
    audit::assert_matches_schema(&audit::lines(&d.audit_path()));
    let denied: Vec<&Value> = records
        .iter()
        .filter(|r| r["mcp"]["tool"] == "delete_repo")
        .collect();
    assert_eq!(denied.len(), 3, "one refusal per server: {records:?}");
    for (r, status) in denied.iter().zip([200, 200, 202]) {
        assert_eq!(r["mcp"]["method"], "tools/call");
        assert_eq!(r["error_code"], "mcp_tool_denied");
        assert_eq!(r["decision"], "deny");
        assert_eq!(r["rule"], "mcp-tools");
        // Streamable HTTP: the JSON-RPC error in the POST's answer; HTTP+SSE: 202, the error
        // on the session's stream.
        assert_eq!(r["status"], status, "{r}");
    }
    for tool in ["search", "read_file"] {
        assert!(
            records.iter().any(|r| r["mcp"]["tool"] == tool
                && r["mcp"]["method"] == "tools/call"
                && r["decision"] == "allow"),
            "an allowed call to {tool} is recorded: {records:?}"
        );
    }
    assert!(records.iter().any(|r| r["mcp"]["method"] == "tools/list"));
    let (code, tail, _) = d.ctl(&[], &["tail"]);
    assert_eq!(code, 0);
    assert!(tail.contains("mcp=tools/call:delete_repo"), "{tail}");
    let (code, check, err) = d.ctl(
        &[],
        &[
            "policy",
            "check",
            "POST",
            "http://mcp.test/mcp",
            "--mcp-tool",
            "delete_repo",
            "--exit-code",
        ],
    );
    assert_eq!(code, 1, "{check}{err}");
    assert!(check.contains("mcp.tools"), "{check}{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_pinned_tool_is_refused_until_accepted() {
    let Ok(py) = python().map_err(|why| eprintln!("{why}")) else {
        return;
    };
    let d = daemon();
    let proxy = format!("http://{}", d.explicit);
    let t = Transport::StreamableSse;
    let server = McpServer::start(&py, t);
    let port = server.addr.port();
    // First sight pins both; the search call makes the server rewrite read_file's description.
    let first = session(&py, &proxy, t, port, &[r#"search={"query":"rug-pull"}"#]).await;
    assert_eq!(first["tools"], serde_json::json!(["search", "read_file"]));
    assert_eq!(calls(&first)[0]["text"], "changed");
    let after = session(&py, &proxy, t, port, &[r#"read_file={"path":"/a"}"#]).await;
    assert_eq!(
        after["tools"],
        serde_json::json!(["search"]),
        "the changed tool is no longer listed: {after}"
    );
    let refused = &calls(&after)[0];
    assert_eq!(refused["code"], -32002, "{after}");
    assert!(
        refused["message"]
            .as_str()
            .is_some_and(|m| m.contains("rule mcp-tools") && m.contains("mcp.pin")),
        "{after}"
    );
    let server_name = format!("mcp.test:{port}");
    let (code, list, _) = d.ctl(&[], &["mcp", "list"]);
    assert_eq!(code, 0);
    assert!(
        list.lines()
            .any(|l| l.contains(&server_name) && l.contains("read_file") && l.contains("CHANGED")),
        "{list}"
    );
    let (code, out, err) = d.ctl(&[], &["mcp", "accept", &server_name, "read_file"]);
    assert_eq!(code, 0, "{out}{err}");
    let accepted = session(&py, &proxy, t, port, &[r#"read_file={"path":"/a"}"#]).await;
    assert_eq!(
        accepted["tools"],
        serde_json::json!(["search", "read_file"])
    );
    assert!(accepted["descriptions"]["read_file"]
        .as_str()
        .is_some_and(|t| t.contains("~/.ssh")));
    assert_eq!(calls(&accepted)[0]["text"], "contents of /a");
    let records = requests(&d);
    assert!(
        records.iter().any(|r| r["error_code"] == "mcp_tool_changed"
            && r["mcp"]["tool"] == "read_file"
            && r["mcp"]["method"] == "tools/call"),
        "{records:?}"
    );
    // The pins are the daemon's file, kept across restarts.
    let pins = std::fs::read_to_string(d.dir.path().join("mcp/mcp-pins.json")).expect("pin file");
    assert!(
        pins.contains(&server_name) && pins.contains("read_file"),
        "{pins}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_rpc_is_refused_and_recorded() {
    let d = daemon();
    let proxy = format!("http://{}", d.explicit);
    let out = curl(
        &[
            "--proxy",
            &proxy,
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "--data",
            "{not json",
            "http://mcp.test:9/mcp",
        ],
        false,
    )
    .await;
    assert_eq!(out.status, 400, "{}", out.text());
    assert_eq!(out.json()["error_code"], "mcp_body_invalid");
    assert!(requests(&d)
        .iter()
        .any(|r| r["error_code"] == "mcp_body_invalid" && r["rule"] == "mcp-tools"));
}

/// The tests' upstream, which answers JSON-RPC at `/jsonrpc` (and `/jsonrpc-sse`).
async fn rpc_upstream() -> agenshield_e2e::upstream::Upstream {
    use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
    Upstream::start(UpstreamOptions {
        name: "rpc".into(),
        ..Default::default()
    })
    .await
}

/// POSTs `body` as JSON to `url` through `proxy`; `sse`: accepting JSON or SSE as
/// Streamable HTTP clients do (the proxy then answers refusals as JSON-RPC errors).
async fn post_rpc(proxy: &str, url: &str, body: &str, sse: bool) -> agenshield_e2e::curl::CurlOut {
    let mut args = vec![
        "--proxy",
        proxy,
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
    ];
    if sse {
        args.extend(["-H", "accept: application/json, text/event-stream"]);
    }
    args.extend(["--data", body, url]);
    curl(&args, false).await
}

/// A key named twice in one object could be read one way here (serde_json keeps the last)
/// and another by the server (a parser keeping the first): the body is refused whole, never
/// forwarded, and recorded, however the key is spelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_naming_a_key_twice_is_refused_and_never_reaches_the_server() {
    let up = rpc_upstream().await;
    let d = daemon();
    let proxy = format!("http://{}", d.explicit);
    let url = format!("http://mcp.test:{}/jsonrpc", up.addr.port());
    let post = |body: &'static str| post_rpc(&proxy, &url, body, false);
    // The allowed tool decides nothing: the same call without the twin goes through.
    let out =
        post(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"}}"#).await;
    assert_eq!(out.status, 200, "{}", out.text());
    let forwarded = up.requests().len();
    assert_eq!(forwarded, 1);
    for body in [
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"delete_repo","name":"search"}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"delete_repo","na\u006de":"search"}}"#,
        r#"[{"jsonrpc":"2.0","id":4,"method":"tools/call","method":"tools/list","params":{"name":"delete_repo"}}]"#,
    ] {
        let out = post(body).await;
        assert_eq!(out.status, 400, "{body}: {}", out.text());
        assert_eq!(out.json()["error_code"], "mcp_body_invalid", "{body}");
        let message = out.json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(message.contains("appears twice"), "{message}");
    }
    assert_eq!(
        up.requests().len(),
        forwarded,
        "nothing ambiguous was forwarded"
    );
    let refused = requests(&d)
        .into_iter()
        .filter(|r| r["error_code"] == "mcp_body_invalid" && r["rule"] == "mcp-tools")
        .count();
    assert_eq!(refused, 3, "each refusal recorded");
}

/// The JSON-RPC messages of an answer, JSON (one or a batch) or SSE (one per event).
fn messages(out: &agenshield_e2e::curl::CurlOut) -> Vec<Value> {
    let text = out.text();
    let v: Vec<Value> = if text.trim_start().starts_with(['[', '{']) {
        match serde_json::from_str(&text).expect("a JSON answer") {
            Value::Array(items) => items,
            one => vec![one],
        }
    } else {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).expect("an SSE event's JSON"))
            .collect()
    };
    v
}

fn by_id(messages: &[Value], id: i64) -> &Value {
    messages
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no answer with id {id}: {messages:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_decided_message_by_message() {
    let up = rpc_upstream().await;
    let d = daemon();
    let proxy = format!("http://{}", d.explicit);
    let batch = serde_json::json!([
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search"}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "delete_repo"}},
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    ])
    .to_string();
    let post = |path: &str, body: &str| {
        let url = format!("http://mcp.test:{}{path}", up.addr.port());
        let (proxy, body) = (proxy.clone(), body.to_string());
        async move { post_rpc(&proxy, &url, &body, true).await }
    };
    for path in ["/jsonrpc", "/jsonrpc-sse"] {
        let out = post(path, &batch).await;
        assert_eq!(out.status, 200, "{path}: {}", out.text());
        let m = messages(&out);
        assert_eq!(m.len(), 3, "{path}: one answer per message owed one: {m:?}");
        // The allowed call reached the server and its answer came back.
        assert_eq!(by_id(&m, 1)["result"]["name"], "search", "{path}");
        // The refused one is answered by the proxy, with the rule's reason.
        let refused = by_id(&m, 2);
        assert_eq!(refused["error"]["code"], -32001, "{path}: {refused}");
        let message = refused["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("tools/call \"delete_repo\"") && message.contains("mcp-tools"),
            "{message}"
        );
        // The list went to the server and came back filtered (it lists `a` and `b`, which
        // the rule does not allow).
        assert_eq!(
            by_id(&m, 3)["result"]["tools"],
            serde_json::json!([]),
            "{path}"
        );
    }
    // The server never saw the refused message; it saw the other three, in order.
    for seen in up.requests().iter().take(2) {
        let body: Value =
            serde_json::from_slice(&seen.body.lock().expect("body")).expect("the server's JSON");
        let items = body.as_array().expect("a batch");
        assert_eq!(items.len(), 3, "{body}");
        assert_eq!(items[0]["id"], 1);
        assert_eq!(items[1]["method"], "notifications/progress");
        assert_eq!(items[2]["id"], 3);
    }
    // What the server owes nothing for (a notification) goes on; the refused call's error
    // is the whole answer.
    let only_notification = serde_json::json!([
        {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "delete_repo"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ])
    .to_string();
    let out = post("/jsonrpc", &only_notification).await;
    assert_eq!(out.status, 200, "{}", out.text());
    let m = messages(&out);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(by_id(&m, 5)["error"]["code"], -32001);
    // Every message whole refused: nothing reaches the server.
    let before = up.requests().len();
    let all_refused = serde_json::json!([
        {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "delete_repo"}},
        {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "read_secret_x"}}
    ])
    .to_string();
    let out = post("/jsonrpc", &all_refused).await;
    assert_eq!(out.status, 200, "{}", out.text());
    assert_eq!(messages(&out).len(), 2);
    assert_eq!(up.requests().len(), before, "nothing of it was forwarded");

    let lines = audit::lines(&d.audit_path());
    audit::assert_matches_schema(&lines);
    let records = requests(&d);
    let parted: Vec<&Value> = records.iter().filter(|r| r["mcp"]["batch"] == 4).collect();
    assert_eq!(parted.len(), 2, "{records:?}");
    for r in parted {
        assert_eq!(r["decision"], "allow", "{r}");
        assert_eq!(r["mcp"]["method"], "tools/call");
        assert_eq!(r["mcp"]["tool"], "search");
        assert_eq!(
            r["mcp"]["refused"],
            serde_json::json!([{"method": "tools/call", "tool": "delete_repo", "error_code": "mcp_tool_denied"}]),
            "{r}"
        );
    }
    let whole = records
        .iter()
        .find(|r| {
            r["mcp"]["batch"] == 2
                && r["decision"] == "deny"
                && r["mcp"]["refused"].as_array().is_some_and(|a| a.len() == 2)
        })
        .unwrap_or_else(|| panic!("the batch refused whole is recorded: {records:?}"));
    assert_eq!(whole["error_code"], "mcp_tool_denied");
}
