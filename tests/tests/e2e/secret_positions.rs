//! Placeholders in every position a tool puts a credential: the URL's path and query, a
//! URL's userinfo, Basic credentials, JSON and form bodies (split across chunks, over
//! HTTP/1.1 and as HTTP/2 DATA frames), WebSocket text messages (split across fragments).
//! The real daemon, curl and a WebSocket client on loopback; the upstream gets the value,
//! the agent only ever the placeholder, and nothing the daemon wrote (logs, audit log,
//! metrics, ctl output) holds a value in any form.

use std::process::Stdio;
use std::time::Duration;

use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::DaemonOptions;
use agenshield_e2e::pki::client_config;
use agenshield_e2e::upstream::{SeenRequest, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A bot token: a URL carries it as it is.
const BOT: &str = "8123456789:AAE-botTOKEN_0123456789abcdef";
/// A client secret with bytes JSON and forms must escape.
const CLIENT: &str = "cs_\"q\"\\back/slash+plus=eq&amp-0123456789";

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "bot"
hosts = ["bot.test"]
action = "allow"
secrets = ["bot"]
swap = ["path", "query:token"]

[[rule]]
id = "oauth"
hosts = ["auth.test"]
methods = ["POST"]
paths = ["/echo/token/**"]
action = "allow"
secrets = ["client"]
swap = ["headers", "url", "body"]
# The secret guard alone: the credential check would refuse the fake gzip body first (400).
dlp = "off"

[[rule]]
id = "notes"
hosts = ["notes.test"]
action = "allow"
secrets = ["client"]

[[rule]]
id = "chat"
hosts = ["chat.test"]
paths = ["/ws"]
action = "allow"
secrets = ["bot"]
swap = ["websocket"]

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"
"#;

const HOSTS: [&str; 5] = [
    "bot.test",
    "auth.test",
    "notes.test",
    "chat.test",
    "other.test",
];

async fn world() -> World {
    let api = ApiUpstream::start(
        "positions upstream CA",
        &HOSTS,
        UpstreamOptions {
            name: "up".into(),
            ..Default::default()
        },
    )
    .await;
    let opts = DaemonOptions {
        secrets: vec![("bot".into(), BOT.into()), ("client".into(), CLIENT.into())],
        ..api.daemon_options(POLICY)
    };
    api.world(opts)
}

/// A WebSocket to `host`'s `/ws` through the transparent listener, as the agent opens
/// one (TLS to the daemon's leaf, then the upgrade).
async fn websocket(w: &World, host: &str) -> WebSocketStream<TlsStream<TcpStream>> {
    let tls = tokio_rustls::TlsConnector::from(client_config(&[&w.daemon.ca_pem], &[b"http/1.1"]));
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let name = ServerName::try_from(host.to_string()).expect("name");
    let stream = tls.connect(name, tcp).await.expect("TLS");
    let url = format!("wss://{host}:{}/ws", w.port());
    let (ws, resp) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// The explicit listener, with a trace of what curl sent on stderr.
fn base_args(w: &World) -> Vec<String> {
    let mut args = w.via_explicit();
    args.extend(["--trace-ascii".into(), "/dev/stderr".into()]);
    args
}

/// curl through the explicit listener, with a trace of what it sent on stderr.
async fn explicit(w: &World, url: &str, extra: &[&str]) -> CurlOut {
    let mut args = base_args(w);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push(url.to_string());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    curl(&refs, false).await
}

/// curl uploading `parts` from its stdin as they come (`-T -`: chunked on HTTP/1.1, DATA
/// frames on HTTP/2), `gap` apart, so each reaches the proxy as its own read.
async fn upload(w: &World, url: &str, extra: &[&str], parts: &[&[u8]], gap: Duration) -> CurlOut {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "30",
        "-o",
        "-",
        "-w",
        "\n@@ %{http_code} %{http_version}",
    ])
    .args(base_args(w))
    .args(["-X", "POST", "-T", "-"])
    .args(extra)
    .arg(url)
    .env_remove("https_proxy")
    .env_remove("HTTPS_PROXY")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("curl runs");
    let mut stdin = child.stdin.take().expect("stdin");
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        stdin.write_all(p).await.expect("write part");
        stdin.flush().await.expect("flush");
    }
    drop(stdin);
    let out = child.wait_with_output().await.expect("curl ends");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = stdout.rsplit_once("\n@@ ").expect("curl's -w line");
    let mut tail = tail.split_whitespace();
    CurlOut {
        exit: out.status.code().unwrap_or(-1),
        status: tail.next().and_then(|s| s.parse().ok()).unwrap_or(0),
        http_version: tail.next().unwrap_or("").to_string(),
        size_download: body.len() as u64,
        body: body.as_bytes().to_vec(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn last(w: &World) -> SeenRequest {
    w.requests()
        .last()
        .cloned()
        .expect("the upstream saw a request")
}

fn header(r: &SeenRequest, name: &str) -> Option<String> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

fn body(r: &SeenRequest) -> String {
    String::from_utf8_lossy(&r.body.lock().expect("body")).into_owned()
}

/// Everything the agent saw: its request as sent (curl's trace), the response, curl's errors.
fn agent_view(out: &CurlOut) -> String {
    format!("{}\n{}", out.text(), out.stderr)
}

/// Every form a value could be written in by the daemon or shown to the agent.
fn forms(v: &str) -> Vec<String> {
    let upper: String = v.bytes().map(|b| format!("%{b:02X}")).collect();
    let url = percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC);
    let json = serde_json::to_string(v).expect("json");
    vec![
        v.to_string(),
        upper,
        url.to_string(),
        json.trim_matches('"').to_string(),
        base64::engine::general_purpose::STANDARD.encode(v),
    ]
}

fn assert_no_secret(what: &str, text: &str) {
    for (name, v) in [("bot", BOT), ("client", CLIENT)] {
        for f in forms(v) {
            assert!(
                !text.contains(&f),
                "{what} contains secret {name} (as {f:?}):\n{text}"
            );
        }
    }
}

async fn next_message(ws: &mut WebSocketStream<TlsStream<TcpStream>>) -> Message {
    tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("a message in time")
        .expect("a message")
        .expect("a valid message")
}

/// The audit log's WebSocket close records, once there are `n`.
fn wait_for_closes(w: &World, n: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let audit = std::fs::read_to_string(w.daemon.audit_path()).expect("audit log");
        let closes: Vec<serde_json::Value> = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["kind"] == "close" && r["upgrade"] == "websocket")
            .collect();
        if closes.len() >= n || std::time::Instant::now() > deadline {
            return closes;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_refused(out: &CurlOut, code: &str, rule: &str, says: &str) {
    assert_eq!(out.exit, 0, "curl failed: {out:?}");
    assert_eq!(out.status, 403, "body: {}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], code, "{v}");
    assert_eq!(v["rule_id"], rule, "{v}");
    let msg = v["message"].as_str().unwrap_or("");
    assert!(msg.contains(says), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_become_values_in_every_position_and_nothing_the_daemon_wrote_holds_one() {
    let w = world().await;
    let mut agent_saw = String::new();

    // 1. Path: a bot token in the path (as Telegram's API wants it).
    let out = explicit(
        &w,
        &w.url(
            "https",
            "bot.test",
            "/echo/botagenshield:secret:bot/sendMessage",
        ),
        &[],
    )
    .await;
    assert_eq!(out.status, 200, "{}", agent_view(&out));
    assert_eq!(
        last(&w).path_and_query,
        format!("/echo/bot{BOT}/sendMessage")
    );
    assert_eq!(
        out.json()["path"],
        "/echo/botagenshield:secret:bot/sendMessage",
        "the echoed path comes back redacted"
    );
    agent_saw.push_str(&agent_view(&out));

    // 2. Query: as written, and with its colons percent-encoded (as a URL encoder writes it).
    for q in ["agenshield:secret:bot", "agenshield%3Asecret%3Abot"] {
        let out = explicit(
            &w,
            &w.url("https", "bot.test", &format!("/echo/q?token={q}&n=1")),
            &[],
        )
        .await;
        assert_eq!(out.status, 200, "{}", agent_view(&out));
        assert_eq!(last(&w).path_and_query, format!("/echo/q?token={BOT}&n=1"));
        agent_saw.push_str(&agent_view(&out));
    }

    // 3. Userinfo in the URL (curl sends it as Basic credentials), and -u: Basic.
    let userinfo = format!(
        "https://x-access-token:agenshield:secret:bot@bot.test:{}/echo/userinfo",
        w.up.addr.port()
    );
    let out = explicit(&w, &userinfo, &[]).await;
    assert_eq!(out.status, 200, "{}", agent_view(&out));
    let basic = |user: &str| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{BOT}"));
        format!("Basic {b64}")
    };
    assert_eq!(
        header(&last(&w), "authorization"),
        Some(basic("x-access-token"))
    );
    agent_saw.push_str(&agent_view(&out));
    let out = explicit(
        &w,
        &w.url("https", "bot.test", "/echo/basic"),
        &["-u", "me:agenshield:secret:bot"],
    )
    .await;
    assert_eq!(out.status, 200, "{}", agent_view(&out));
    assert_eq!(header(&last(&w), "authorization"), Some(basic("me")));
    agent_saw.push_str(&agent_view(&out));

    // 4. A JSON body split inside the placeholder, 300 ms apart, over HTTP/1.1 (chunked)
    //    and HTTP/2 (DATA frames): the upstream gets valid JSON holding the value.
    let json: &[u8] =
        br#"{"grant_type":"client_credentials","client_secret":"agenshield:secret:client","n":1}"#;
    let cut = json.windows(6).position(|w| w == b"secret").expect("cut") + 3;
    for version in ["--http1.1", "--http2"] {
        let out = upload(
            &w,
            &w.url("https", "auth.test", "/echo/token/up"),
            &[version, "-H", "Content-Type: application/json"],
            &[&json[..cut], &json[cut..]],
            Duration::from_millis(300),
        )
        .await;
        assert_eq!(out.status, 200, "{version}: {}", agent_view(&out));
        let want_version = if version == "--http2" { "2" } else { "1.1" };
        assert_eq!(out.http_version, want_version, "the agent spoke {version}");
        let seen = last(&w);
        let v: serde_json::Value = serde_json::from_str(&body(&seen)).unwrap_or_else(|e| {
            panic!("{version}: the upstream got no JSON ({e}): {}", body(&seen))
        });
        assert_eq!(v["client_secret"], CLIENT, "{version}");
        assert_eq!(v["grant_type"], "client_credentials");
        assert_eq!(
            header(&seen, "content-length"),
            None,
            "{version}: re-framed"
        );
        agent_saw.push_str(&agent_view(&out));
    }

    // 5. A form body (curl percent-encodes the placeholder's colons): the value goes in
    //    form-encoded, and Content-Length states the new length.
    let out = explicit(
        &w,
        &w.url("https", "auth.test", "/echo/token/up"),
        &[
            "--data-urlencode",
            "client_secret=agenshield:secret:client",
            "--data-urlencode",
            "grant_type=client_credentials",
        ],
    )
    .await;
    assert_eq!(out.status, 200, "{}", agent_view(&out));
    let seen = last(&w);
    let sent = body(&seen);
    let fields: std::collections::HashMap<String, String> = form_urlencoded::parse(sent.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(fields["client_secret"], CLIENT, "{sent}");
    assert_eq!(
        header(&seen, "content-length"),
        Some(sent.len().to_string()),
        "the length is restated"
    );
    agent_saw.push_str(&agent_view(&out));

    // 6. Where the placeholder may not become the value, it is refused, naming why; the
    //    upstream sees none of them.
    let before = w.up.requests().len();
    let form = ["--data-binary", "k=agenshield:secret:client"];
    let out = explicit(&w, &w.url("https", "notes.test", "/echo"), &form).await;
    assert_refused(
        &out,
        "secret_scope",
        "notes",
        "is in the body, where rule notes does not swap it",
    );
    agent_saw.push_str(&agent_view(&out));
    let gz = [
        "--data-binary",
        "agenshield:secret:client",
        "-H",
        "Content-Encoding: gzip",
    ];
    let out = explicit(&w, &w.url("https", "auth.test", "/echo/token/x"), &gz).await;
    assert_refused(&out, "secret_scope", "oauth", "gzip-encoded body");
    let bin = [
        "--data-binary",
        "agenshield:secret:client",
        "-H",
        "Content-Type: application/octet-stream",
    ];
    let out = explicit(&w, &w.url("https", "auth.test", "/echo/token/x"), &bin).await;
    assert_refused(&out, "secret_scope", "oauth", "application/octet-stream");
    // Over plain HTTP the value would travel in clear: refused, not swapped.
    let plain = format!("http://auth.test:{}/echo/token/x", w.up.addr.port());
    let json = ["-H", "Content-Type: application/json", "--data-binary"];
    let out = explicit(
        &w,
        &plain,
        &[&json[..], &[r#"{"s":"agenshield:secret:client"}"#]].concat(),
    )
    .await;
    assert_refused(&out, "secret_scope", "oauth", "body sent over plain HTTP");
    // The path binds: a GET to the token URL is not the rule's, so nothing is swapped.
    let out = explicit(
        &w,
        &w.url(
            "https",
            "auth.test",
            "/echo/token/x?s=agenshield:secret:client",
        ),
        &[],
    )
    .await;
    assert_eq!(out.status, 403, "{}", out.text());
    // Out of scope, as ever: the placeholder to a host whose rule binds nothing.
    let out = explicit(
        &w,
        &w.url("https", "other.test", "/echo/agenshield:secret:bot"),
        &[],
    )
    .await;
    assert_refused(&out, "secret_scope", "other", "does not");
    assert_eq!(
        w.up.requests().len(),
        before,
        "none of them reached the upstream"
    );
    agent_saw.push_str(&agent_view(&out));

    // 7. WebSocket: a text message split inside the placeholder across two fragments goes
    //    up holding the value; the upstream's echo comes back with the placeholder.
    let mut ws = websocket(&w, "chat.test").await;
    let msg = r#"{"auth":"agenshield:secret:bot","op":"hello"}"#;
    let cut = msg.find("secret").expect("cut") + 2;
    for (i, part) in [&msg[..cut], &msg[cut..]].into_iter().enumerate() {
        let op = if i == 0 { Data::Text } else { Data::Continue };
        let frame = Frame::message(Bytes::from(part.to_string()), OpCode::Data(op), i == 1);
        ws.send(Message::Frame(frame)).await.expect("send fragment");
    }
    let echo = next_message(&mut ws).await;
    assert_eq!(
        echo,
        Message::text(msg),
        "the echo comes back as the placeholder"
    );
    let seen = last(&w);
    assert_eq!(seen.path_and_query, "/ws");
    assert_eq!(
        body(&seen),
        format!("{}\n", msg.replace("agenshield:secret:bot", BOT))
    );
    agent_saw.push_str(&format!("{echo:?}"));
    ws.close(None).await.expect("close");
    while ws.next().await.is_some() {}
    //    Under a rule that does not swap in WebSocket messages, the placeholder closes the
    //    connection (1008) and the upstream never sees the message.
    let mut ws = websocket(&w, "notes.test").await;
    ws.send(Message::text("k=agenshield:secret:client"))
        .await
        .expect("send");
    let close = next_message(&mut ws).await;
    assert!(
        matches!(&close, Message::Close(Some(f)) if f.code == CloseCode::Policy),
        "{close:?}"
    );
    assert_eq!(body(&last(&w)), "", "the upstream saw nothing of it");
    agent_saw.push_str(&format!("{close:?}"));

    assert_no_secret("the agent's view", &agent_saw);

    // 8. Every byte the daemon wrote: its log (debug), the audit log, the metrics, ctl.
    let audit = std::fs::read_to_string(w.daemon.audit_path()).expect("audit log");
    assert!(
        audit.contains("\"secrets\":[\"client\"]") && audit.contains("\"secrets\":[\"bot\"]"),
        "the audit records name the secrets used, body swaps included"
    );
    let records: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let closes = wait_for_closes(&w, 2);
    let chat = closes
        .iter()
        .find(|r| r["host"] == "chat.test")
        .expect("chat's close");
    assert_eq!(chat["end"], "closed", "{chat}");
    assert_eq!(chat["secrets"], serde_json::json!(["bot"]), "{chat}");
    let notes = closes
        .iter()
        .find(|r| r["host"] == "notes.test")
        .expect("notes' close");
    assert_eq!(notes["end"], "refused", "{notes}");
    assert_eq!(notes["error_code"], "secret_scope", "{notes}");
    assert!(records.iter().any(|r| r["upgrade"] == "websocket"));
    assert_no_secret(
        "what the daemon wrote",
        &w.daemon.everything_written().await,
    );
}
