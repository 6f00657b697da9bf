//! Every decision of every protocol leaves one record, against the real daemon: raw TCP
//! (allowed: a decision record and a close record with the bytes; refused: one record), a
//! server-first protocol greeted at once, a client that rejects our CA, a request head over
//! the limit on every listener and protocol, and a WebSocket session (at the 101 and at the
//! close). `ctl tail` shows them and `ctl audit verify` passes over all of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use agenshield_e2e::audit;
use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::pki::{client_config, TestCa};
use agenshield_e2e::upstream::{echo_server, Upstream, UpstreamOptions};
use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The audit log's records (envelope and all).
fn audit(d: &Daemon) -> Vec<Value> {
    audit::lines(&d.audit_path())
}

/// Waits (bounded) until the audit log holds a record `want` accepts; returns them all.
async fn audit_until(d: &Daemon, what: &str, want: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let all = audit(d);
        if all.iter().any(&want) {
            return all;
        }
        assert!(
            Instant::now() < deadline,
            "no audit record for {what} within 10 s:\n{}",
            all.iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The chain verifies, and every line is as `docs/audit.schema.json` says.
fn verify(d: &Daemon) {
    let (code, out, err) = d.ctl(&[], &["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {out}{err}");
    audit::assert_matches_schema(&audit(d));
}

#[test]
fn the_golden_audit_records_match_the_schema() {
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../daemon/tests/golden/audit-records.jsonl");
    let lines = audit::lines(&golden);
    assert!(
        lines.len() >= 8,
        "every kind of record is in the golden file"
    );
    audit::assert_matches_schema(&lines);
    // And the schema is not a rubber stamp: an unknown field, a misspelt decision and a
    // close record without its end are each refused.
    let mut odd = lines[0].clone();
    odd["surprise"] = Value::from(1);
    let mut misspelt = lines[0].clone();
    misspelt["decision"] = Value::from("ask-approved");
    let mut endless = lines
        .iter()
        .find(|l| l["kind"] == "close")
        .expect("a close record")
        .clone();
    endless["end"] = Value::Null;
    for bad in [odd, misspelt, endless] {
        let refused =
            std::panic::catch_unwind(|| audit::assert_matches_schema(std::slice::from_ref(&bad)));
        assert!(refused.is_err(), "the schema let through {bad}");
    }
}

/// A server that speaks first, as SMTP does.
async fn greeter() -> SocketAddr {
    let l = TcpListener::bind((LOCAL, 0)).await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(b"220 greeter.test ESMTP ready\r\n").await;
                let mut sink = [0u8; 64];
                let _ = s.read(&mut sink).await;
            });
        }
    });
    addr
}

fn tcp_policy(port: u16, extra: &str) -> String {
    format!(
        "version = 1\ndefault = \"deny\"\n\n[[rule]]\nid = \"raw\"\nhosts = [\"127.0.0.1\"]\nports = [{port}]\nschemes = [\"tcp\"]\naction = \"allow\"\n{extra}"
    )
}

fn tcp_daemon(dest: SocketAddr, extra_policy: &str) -> Daemon {
    Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), tcp_policy(dest.port(), extra_policy))],
        orig_dst: Some(dest),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_tcp_allowed_and_refused_each_leave_one_decision_record() {
    let echo = echo_server().await;
    let d = tcp_daemon(echo, "");

    // Allowed: the transparent listener, whose original destination is the echo server.
    let mut s = TcpStream::connect(d.transparent).await.expect("connect");
    s.write_all(b"\x01hello raw tcp").await.expect("write");
    let mut got = [0u8; 14];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&got, b"\x01hello raw tcp");
    drop(s);

    // Refused: a CONNECT to a port no rule allows, then bytes that are not HTTP.
    let other = TcpListener::bind((LOCAL, 0)).await.expect("bind");
    let refused_port = other.local_addr().expect("addr").port();
    let mut s = TcpStream::connect(d.explicit).await.expect("connect");
    let connect = format!(
        "CONNECT 127.0.0.1:{refused_port} HTTP/1.1\r\nHost: 127.0.0.1:{refused_port}\r\n\r\n"
    );
    s.write_all(connect.as_bytes()).await.expect("write");
    let mut head = String::new();
    BufReader::new(&mut s)
        .read_line(&mut head)
        .await
        .expect("read");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let _ = s.write_all(b"\x01not http").await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the refused tunnel is closed");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), other.accept())
            .await
            .is_err(),
        "nothing was dialed for the refused connection"
    );

    let all = audit_until(&d, "the allowed relay's close", |v| v["kind"] == "close").await;
    let tcp: Vec<&Value> = all.iter().filter(|v| v["protocol"] == "tcp").collect();
    let decisions: Vec<&&Value> = tcp.iter().filter(|v| v["kind"] == "connection").collect();
    assert_eq!(decisions.len(), 2, "one decision per connection: {tcp:#?}");
    let allowed = decisions
        .iter()
        .find(|v| v["decision"] == "allow")
        .expect("the allowed decision");
    assert_eq!(allowed["rule"], "raw");
    assert_eq!(allowed["port"], echo.port());
    assert_eq!(allowed["upstream"], echo.to_string());
    assert_eq!(allowed["listener"], "transparent");
    let refused = decisions
        .iter()
        .find(|v| v["decision"] == "deny")
        .expect("the refused decision");
    assert_eq!(refused["port"], refused_port);
    assert_eq!(refused["error_code"], "policy_denied");
    assert_eq!(refused["listener"], "explicit");
    assert_eq!(refused["rule"], "default", "the default decided: {refused}");
    let closes: Vec<&&Value> = tcp.iter().filter(|v| v["kind"] == "close").collect();
    assert_eq!(closes.len(), 1, "{tcp:#?}");
    let close = closes[0];
    assert_eq!(close["request_id"], allowed["request_id"]);
    assert_eq!(
        (close["bytes_up"].as_u64(), close["bytes_down"].as_u64()),
        (Some(14), Some(14))
    );
    assert_eq!(close["end"], "closed");
    // The decision is written before the first byte is relayed, so before its close.
    let seq = |v: &Value| v["seq"].as_u64().expect("seq");
    assert!(seq(allowed) < seq(close));

    // `ctl tail --decision deny` shows the refused one, and only it.
    let (code, out, err) = d.ctl(&[], &["tail", "--decision", "deny", "--json"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["request_id"], refused["request_id"]);
    let (code, human, _) = d.ctl(&[], &["tail", "--decision", "deny"]);
    assert_eq!(code, 0);
    assert!(
        human.contains(&format!("tcp://127.0.0.1:{refused_port}")),
        "{human}"
    );
    let (code, _, err) = d.ctl(&[], &["tail", "--decision", "nope"]);
    assert_eq!(code, 2, "an unknown decision is bad input: {err}");
    assert!(
        err.contains("ask_approved"),
        "the valid values are listed: {err}"
    );

    // Metrics count raw TCP decisions like requests.
    let metrics = scrape(&d).await;
    assert!(
        metrics.contains(
            "agenshield_proxy_requests_total{decision=\"allow\",host=\"127.0.0.1\",protocol=\"tcp\",rule=\"raw\"} 1"
        ),
        "{metrics}"
    );
    verify(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_first_protocol_is_greeted_at_once() {
    let server = greeter().await;
    // Only raw TCP is allowed there: decided at accept, connected at once.
    let d = tcp_daemon(server, "");
    let started = Instant::now();
    let s = TcpStream::connect(d.transparent).await.expect("connect");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(s).read_line(&mut line),
    )
    .await
    .expect("greeting in time")
    .expect("read");
    let took = started.elapsed();
    assert!(line.starts_with("220 "), "{line:?}");
    assert!(took < Duration::from_millis(100), "greeted after {took:?}");

    // HTTP could be allowed there too: the client gets `server_first_wait`, not 5 s.
    let web = "\n[[rule]]\nid = \"web\"\nhosts = [\"*\"]\naction = \"allow\"\n";
    let d = tcp_daemon(server, web);
    let started = Instant::now();
    let s = TcpStream::connect(d.transparent).await.expect("connect");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(s).read_line(&mut line),
    )
    .await
    .expect("greeting in time")
    .expect("read");
    let took = started.elapsed();
    assert!(line.starts_with("220 "), "{line:?}");
    assert!(took < Duration::from_secs(1), "greeted after {took:?}");
    verify(&d);
}

/// An upstream serving TLS for `api.test` (and plain HTTP), and a daemon in front of it.
struct Web {
    up: Upstream,
    daemon: Daemon,
    _dir: tempfile::TempDir,
}

impl Web {
    async fn new(limits: &[&str]) -> Web {
        let ca = TestCa::new("records upstream CA");
        let up = Upstream::start(UpstreamOptions {
            tls: Some(ca.leaf(&["api.test", "127.0.0.1"])),
            name: "up".into(),
            ..Default::default()
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("upstream-ca.pem");
        ca.write_pem(&ca_file).expect("write CA");
        let policy = "version = 1\ndefault = \"deny\"\n\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n\n[[rule]]\nid = \"held\"\nhosts = [\"held.test\"]\naction = \"ask\"\n";
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), policy.into())],
            extra_ca: vec![ca_file],
            hosts: vec![("api.test".into(), LOCAL), ("held.test".into(), LOCAL)],
            orig_dst: Some(up.addr),
            limits: limits.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        Web {
            up,
            daemon,
            _dir: dir,
        }
    }

    /// curl to `scheme://api.test:PORT/echo` through the transparent listener.
    async fn transparent(&self, scheme: &str, extra: &[&str], trust: bool) -> CurlOut {
        self.transparent_to("api.test", "/echo", scheme, extra, trust)
            .await
    }

    /// curl to `scheme://HOST:PORT/PATH` through the transparent listener.
    async fn transparent_to(
        &self,
        host: &str,
        path: &str,
        scheme: &str,
        extra: &[&str],
        trust: bool,
    ) -> CurlOut {
        let port = self.up.addr.port();
        let connect_to = format!("{host}:{port}:127.0.0.1:{}", self.daemon.transparent.port());
        let url = format!("{scheme}://{host}:{port}{path}");
        let ca = self.daemon.ca_path.display().to_string();
        let mut args = vec!["--connect-to", &connect_to];
        if trust {
            args.extend(["--cacert", &ca]);
        }
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args, false).await
    }

    /// curl to `scheme://api.test:PORT/echo` through the explicit listener.
    async fn explicit(&self, scheme: &str, extra: &[&str]) -> CurlOut {
        let proxy = format!("http://{}", self.daemon.explicit);
        let url = format!("{scheme}://api.test:{}/echo", self.up.addr.port());
        let ca = self.daemon.ca_path.display().to_string();
        let mut args = vec!["--cacert", &ca, "--proxy", &proxy];
        args.extend_from_slice(extra);
        args.push(&url);
        curl(&args, false).await
    }
}

async fn scrape(d: &Daemon) -> String {
    let url = format!("http://{}/metrics", d.metrics);
    curl(&[&url], false).await.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_rejects_our_ca_leaves_a_client_rejected_ca_record() {
    let w = Web::new(&[]).await;
    // curl with the system's roots only: it does not trust the AgenShield CA.
    let out = w.transparent("https", &[], false).await;
    assert_ne!(out.exit, 0, "the handshake must fail: {out:?}");
    let all = audit_until(&w.daemon, "the rejected handshake", |v| {
        v["error_code"] == "client_rejected_ca"
    })
    .await;
    let rejected: Vec<&Value> = all
        .iter()
        .filter(|v| v["error_code"] == "client_rejected_ca")
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:#?}");
    let r = rejected[0];
    assert_eq!(
        (
            r["kind"].as_str(),
            r["protocol"].as_str(),
            r["decision"].as_str()
        ),
        (Some("connection"), Some("tls"), Some("error"))
    );
    assert_eq!(
        (r["sni"].as_str(), r["host"].as_str()),
        (Some("api.test"), Some("api.test"))
    );
    assert!(w.up.requests().is_empty(), "nothing reached the upstream");
    let metrics = scrape(&w.daemon).await;
    assert!(
        metrics.contains("agenshield_proxy_tls_handshakes_total{result=\"client_rejected_ca\"} 1"),
        "{metrics}"
    );
    // The operator reads it at a glance.
    let (code, tail, _) = w.daemon.ctl(&[], &["tail", "--decision", "error"]);
    assert_eq!(code, 0);
    assert!(
        tail.contains(
            "the client rejected the AgenShield CA for api.test: this tool does not trust the CA"
        ),
        "{tail}"
    );
    verify(&w.daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_limit_gets_the_json_431_and_a_record_everywhere() {
    let w = Web::new(&["max_header_bytes = 16384"]).await;
    let big = format!("X-Big: {}", "b".repeat(20_000));
    let cases: [(&str, CurlOut); 5] = [
        (
            "transparent http",
            w.transparent("http", &["-H", &big], true).await,
        ),
        (
            "transparent https h1",
            w.transparent("https", &["--http1.1", "-H", &big], true)
                .await,
        ),
        (
            "transparent https h2",
            w.transparent("https", &["--http2", "-H", &big], true).await,
        ),
        ("explicit http://", w.explicit("http", &["-H", &big]).await),
        (
            "explicit CONNECT, then https",
            w.explicit("https", &["-H", &big]).await,
        ),
    ];
    for (what, out) in &cases {
        assert_eq!(out.status, 431, "{what}: {out:?}");
        let v = out.json();
        assert_eq!(v["error_code"], "head_too_large", "{what}: {v}");
        assert!(
            v["request_id"].as_str().is_some_and(|id| id.len() == 16),
            "{what}: {v}"
        );
    }
    // The CONNECT head itself over the limit.
    let proxy_header = format!("X-Big-Proxy: {}", "p".repeat(20_000));
    let out = w
        .explicit("https", &["--proxy-header", &proxy_header])
        .await;
    assert_ne!(out.exit, 0, "the tunnel is refused: {out:?}");
    // A head over the server's own cap (twice the limit): hyper answers, and it is recorded.
    let huge = format!("X-Huge: {}", "h".repeat(40_000));
    let out = w.transparent("http", &["-H", &huge], true).await;
    assert_eq!(out.status, 431, "{out:?}");

    let all = audit_until(&w.daemon, "the refusal by the HTTP server", |v| {
        v["kind"] == "connection" && v["error_code"] == "head_too_large"
    })
    .await;
    let refused: Vec<&Value> = all
        .iter()
        .filter(|v| v["error_code"] == "head_too_large")
        .collect();
    assert_eq!(refused.len(), cases.len() + 2, "{refused:#?}");
    for r in &refused {
        assert_eq!(r["decision"], "deny", "{r}");
        assert_eq!(r["status"], 431, "{r}");
    }
    let protocols: Vec<&str> = refused
        .iter()
        .filter_map(|r| r["protocol"].as_str())
        .collect();
    assert_eq!(
        protocols.iter().filter(|p| **p == "https").count(),
        3,
        "{protocols:?}"
    );
    assert!(
        refused
            .iter()
            .any(|r| r["method"] == "CONNECT" && r["listener"] == "explicit"),
        "{refused:#?}"
    );
    assert!(w.up.requests().is_empty(), "nothing reached the upstream");
    verify(&w.daemon);
}

/// An HTTP/2 connection to the transparent listener (TLS, ALPN h2) as a client that sends
/// whatever head it is given (curl's nghttp2 will not send more than 64 KiB).
struct H2 {
    send: hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    base: String,
}

impl H2 {
    async fn connect(w: &Web) -> H2 {
        let tls = tokio_rustls::TlsConnector::from(client_config(&[&w.daemon.ca_pem], &[b"h2"]));
        let tcp = TcpStream::connect(w.daemon.transparent)
            .await
            .expect("connect");
        let stream = tls
            .connect(ServerName::try_from("api.test").expect("name"), tcp)
            .await
            .expect("TLS");
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        H2 {
            send,
            base: format!("https://api.test:{}", w.up.addr.port()),
        }
    }

    /// GET /echo with a header `x-big` of `n` bytes: (status, body), or the error.
    async fn get(&mut self, n: usize) -> Result<(u16, String), String> {
        use http_body_util::BodyExt as _;
        let mut req = http::Request::get(format!("{}/echo", self.base));
        if n > 0 {
            req = req.header("x-big", "h".repeat(n));
        }
        let req = req.body(http_body_util::Empty::new()).expect("request");
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// With the default limit (64 KiB): over HTTP/2 a head over the limit gets the JSON 431 and
/// the record HTTP/1.1 gets; a head under it is forwarded on both alike. A head over the
/// server's own cap (twice the limit) gets h2's bare 431 on its stream, recorded, and the
/// connection stays usable; a header block far beyond it makes h2 close the connection (GOAWAY
/// ENHANCE_YOUR_CALM), and that is recorded as the head it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_head_over_http2_is_answered_and_recorded_as_over_http1() {
    let w = Web::new(&[]).await;
    // 40 KB: under the limit, forwarded over either version: the same answer.
    let big = format!("X-Big: {}", "b".repeat(40_000));
    let h1 = w
        .transparent("https", &["--http1.1", "-H", &big], true)
        .await;
    let h2 = w.transparent("https", &["--http2", "-H", &big], true).await;
    assert_eq!(h1.status, h2.status, "{h1:?} / {h2:?}");
    assert_ne!(h1.status, 0, "{h1:?}");
    // 70 KB: over the limit.
    let big = format!("X-Big: {}", "b".repeat(70_000));
    let h1 = w
        .transparent("https", &["--http1.1", "-H", &big], true)
        .await;
    assert_eq!(h1.status, 431, "{h1:?}");
    let mut c = H2::connect(&w).await;
    let (status, body) = c.get(70_000).await.expect("an answer");
    assert_eq!(status, 431, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("JSON: {body}"));
    assert_eq!(v["error_code"], "head_too_large", "{v}");
    assert_eq!(v["error_code"], h1.json()["error_code"]);
    // 140 KB: over the server's cap: h2 answers this stream itself; the connection lives on.
    let (status, body) = c.get(140_000).await.expect("an answer");
    assert_eq!((status, body.as_str()), (431, ""), "h2's own 431");
    let (status, _) = c.get(0).await.expect("the connection is still usable");
    assert_eq!(status, 200);
    // 600 KB: far beyond: h2 closes the connection.
    let err = c.get(600_000).await.expect_err("the connection is closed");
    assert!(!err.is_empty());

    let all = audit_until(&w.daemon, "the HTTP/2 connection closed", |v| {
        v["kind"] == "connection" && v["error_code"] == "bad_request" && v["sni"] == "api.test"
    })
    .await;
    let requests: Vec<&Value> = all
        .iter()
        .filter(|v| v["error_code"] == "head_too_large" && v["kind"] == "request")
        .collect();
    assert_eq!(
        requests.len(),
        2,
        "HTTP/1.1 and HTTP/2 alike: {requests:#?}"
    );
    for r in &requests {
        assert_eq!(r["status"], 431, "{r}");
        assert_eq!(r["decision"], "deny", "{r}");
        assert_eq!(r["sni"], "api.test", "{r}");
    }
    // h2's own 431 (140 KB, over the server's cap) is recorded as hyper's is over HTTP/1.1:
    // a `connection` record with the 431 and why.
    let own: Vec<&Value> = all
        .iter()
        .filter(|v| v["error_code"] == "head_too_large" && v["kind"] == "connection")
        .collect();
    assert_eq!(own.len(), 1, "h2's own 431, once: {own:#?}");
    assert_eq!(own[0]["status"], 431, "{}", own[0]);
    assert_eq!(own[0]["decision"], "deny", "{}", own[0]);
    assert_eq!(own[0]["sni"], "api.test", "{}", own[0]);
    assert!(
        w.daemon
            .logs()
            .contains("the HTTP/2 layer answered a stream 431"),
        "the log line says why"
    );
    let closed = all
        .iter()
        .find(|v| v["kind"] == "connection" && v["error_code"] == "bad_request")
        .expect("the GOAWAY");
    assert_eq!(closed["decision"], "deny", "{closed}");
    assert!(closed["status"].is_null(), "no HTTP answer: {closed}");
    assert!(
        w.daemon.logs().contains("GOAWAY ENHANCE_YOUR_CALM"),
        "the log says why"
    );
    verify(&w.daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_is_recorded_at_the_101_and_at_the_close() {
    let w = Web::new(&[]).await;
    let tls = tokio_rustls::TlsConnector::from(client_config(&[&w.daemon.ca_pem], &[b"http/1.1"]));
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let stream = tls
        .connect(ServerName::try_from("api.test").expect("name"), tcp)
        .await
        .expect("TLS");
    let url = format!("wss://api.test:{}/ws", w.up.addr.port());
    let (mut ws, resp) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    for msg in ["ping", "a longer second message"] {
        ws.send(Message::text(msg)).await.expect("send");
        let echo = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo in time")
            .expect("a message")
            .expect("not an error");
        assert_eq!(echo.into_text().expect("text"), msg);
    }
    let opened = audit(&w.daemon);
    let upgrade = opened
        .iter()
        .find(|v| v["upgrade"] == "websocket" && v["kind"] == "request")
        .unwrap_or_else(|| panic!("the 101 is recorded while the session is open: {opened:#?}"))
        .clone();
    assert_eq!(upgrade["status"], 101);
    assert_eq!(upgrade["decision"], "allow");
    assert_eq!(upgrade["path"], "/ws");
    ws.close(None).await.expect("close");
    while ws.next().await.is_some() {}
    let all = audit_until(&w.daemon, "the session's close", |v| {
        v["kind"] == "close" && v["request_id"] == upgrade["request_id"]
    })
    .await;
    let close = all
        .iter()
        .find(|v| v["kind"] == "close")
        .expect("close record");
    assert_eq!(close["upgrade"], "websocket");
    assert_eq!(close["protocol"], "https");
    let up = close["bytes_up"].as_u64().expect("bytes up");
    let down = close["bytes_down"].as_u64().expect("bytes down");
    // Two masked text frames and a close frame went up; their echoes and a close came down.
    assert!(up >= 4 + 24 + 2 * 6, "bytes up {up}");
    assert!(down >= 4 + 24 + 2 * 2, "bytes down {down}");
    assert_eq!(
        all.iter().filter(|v| v["upgrade"] == "websocket").count(),
        2
    );
    verify(&w.daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_client_abandons_is_still_recorded() {
    let w = Web::new(&[]).await;
    // Forwarded, then abandoned before the upstream answers.
    let out = w
        .transparent_to(
            "api.test",
            "/slow/3000",
            "https",
            &["--max-time", "1"],
            true,
        )
        .await;
    assert_ne!(out.exit, 0, "curl gave up: {out:?}");
    // Held for an operator, then abandoned before anyone answered.
    let out = w
        .transparent_to("held.test", "/x", "https", &["--max-time", "1"], true)
        .await;
    assert_ne!(out.exit, 0, "curl gave up: {out:?}");
    let all = audit_until(&w.daemon, "both abandoned requests", |v| {
        v["host"] == "held.test" && v["kind"] == "request"
    })
    .await;
    let slow = all
        .iter()
        .find(|v| v["path"] == "/slow/3000")
        .expect("the forwarded request is recorded");
    assert_eq!(slow["decision"], "allow", "{slow}");
    assert_eq!(slow["incomplete"], true, "{slow}");
    assert!(slow["status"].is_null(), "no response was sent: {slow}");
    assert!(
        w.up.requests()
            .iter()
            .any(|r| r.path_and_query == "/slow/3000"),
        "it did reach the upstream"
    );
    let held = all
        .iter()
        .find(|v| v["host"] == "held.test")
        .expect("the held request is recorded");
    assert_eq!(
        (held["decision"].as_str(), held["error_code"].as_str()),
        (Some("error"), Some("client_gone")),
        "{held}"
    );
    assert_eq!(held["rule"], "held", "{held}");
    verify(&w.daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_for_http_still_apply_where_raw_tcp_is_allowed() {
    let echo = echo_server().await;
    // Raw TCP to the echo server is allowed, and a rule for HTTP names the same place.
    let deny = "\n[[rule]]\nid = \"no-admin\"\nhosts = [\"127.0.0.1\"]\npaths = [\"/admin\", \"/admin/**\"]\naction = \"deny\"\n";
    let d = tcp_daemon(echo, deny);
    let mut s = TcpStream::connect(d.transparent).await.expect("connect");
    s.write_all(b"GET /admin HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut resp = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut resp))
        .await
        .expect("answer in time")
        .expect("read");
    assert!(resp.starts_with("HTTP/1.1 403"), "not relayed raw: {resp}");
    assert!(resp.contains("\"rule_id\":\"no-admin\""), "{resp}");
    // Bytes that are not HTTP still go through as raw TCP.
    let mut s = TcpStream::connect(d.transparent).await.expect("connect");
    s.write_all(b"\x01raw").await.expect("write");
    let mut got = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&got, b"\x01raw");
    verify(&d);
}

/// An upstream that speaks the other protocol on its port: the agent's 502 says so and what
/// to try (plain HTTP to a TLS-only port: use https://; TLS to a plain port: use http://),
/// names the cause once, and explains that the policy allowed the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_speaking_the_other_protocol_gets_a_502_that_says_so() {
    let w = Web::new(&[]).await;
    // TLS only: whatever is not a ClientHello fails the handshake.
    let ca = TestCa::new("tls-only upstream CA");
    let acceptor = tokio_rustls::TlsAcceptor::from(agenshield_e2e::pki::server_config(
        &ca.leaf(&["api.test"]),
        &[b"http/1.1"],
    ));
    let tls_only = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let tls_port = tls_only.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = tls_only.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = acceptor.accept(sock).await;
            });
        }
    });
    let plain = Upstream::start(UpstreamOptions {
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let proxy = format!("http://{}", w.daemon.explicit);
    let cacert = w.daemon.ca_path.display().to_string();
    let ask = |url: String| {
        let (proxy, cacert) = (proxy.clone(), cacert.clone());
        async move {
            let out = curl(&["--proxy", &proxy, "--cacert", &cacert, &url], false).await;
            assert_eq!(out.status, 502, "{url}: {out:?}");
            out.json()
        }
    };
    let once = |msg: &str| {
        let parts: Vec<&str> = msg.split(": ").collect();
        assert!(
            parts.windows(2).all(|p| p[0] != p[1]),
            "a cause repeated: {msg}"
        );
    };
    let v = ask(format!("http://api.test:{tls_port}/x")).await;
    let msg = v["message"].as_str().unwrap_or("");
    assert!(msg.contains("use https:// instead of http://"), "{v}");
    once(msg);
    assert!(
        v["explanation"]
            .as_str()
            .is_some_and(|e| e.contains("rule api") && e.contains("the upstream failed it")),
        "{v}"
    );
    let v = ask(format!("https://api.test:{}/x", plain.addr.port())).await;
    let msg = v["message"].as_str().unwrap_or("");
    assert!(msg.contains("use http:// instead of https://"), "{v}");
    once(msg);
    assert_eq!(v["rule_id"], "api", "{v}");
}
