//! `tls = "passthrough"`: TLS whose ClientHello names a host a passthrough rule allows is
//! spliced to that host unopened (the agent sees the upstream's own certificate, so a client
//! that trusts only the upstream's CA succeeds), decided and dialed by the name, recorded as
//! `tls-passthrough` with the bytes at close. Anything else is intercepted as before.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenshield_e2e::audit;
use agenshield_e2e::daemon::Daemon;
use agenshield_e2e::pki::client_config;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const POLICY: &str = r#"version = 1
default = "deny"

[[rule]]
id = "pinned"
hosts = ["pinned.test"]
action = "allow"
tls = "passthrough"

[[rule]]
id = "guarded"
hosts = ["guarded.test"]
action = "allow"
tls = "passthrough"

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"
"#;

async fn world() -> World {
    let api = ApiUpstream::start(
        "passthrough upstream CA",
        &["pinned.test", "api.test"],
        UpstreamOptions {
            name: "pinned".into(),
            ..Default::default()
        },
    )
    .await;
    let mut opts = api.daemon_options(POLICY);
    // Outside `allow_private` (127.0.0.0/8): the guard refuses it.
    opts.hosts
        .push(("guarded.test".into(), "::1".parse().expect("ip")));
    // The agent "meant" an address where nothing listens: a passthrough connection is
    // dialed by its name, never there.
    opts.orig_dst = Some(SocketAddr::new(
        "127.0.0.3".parse().expect("ip"),
        api.up.addr.port(),
    ));
    api.world(opts)
}

/// What the upstream's own CA signs: a client trusting only this cannot be intercepted.
fn upstream_ca(w: &World) -> String {
    w.upstream_ca.cert_pem()
}

/// TLS to `addr` (or through `stream`) as `name`, trusting only `ca`.
async fn tls<S>(
    stream: S,
    name: &str,
    ca: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let cfg: Arc<rustls::ClientConfig> = client_config(&[ca], &[b"http/1.1"]);
    let server = ServerName::try_from(name.to_string()).expect("server name");
    tokio_rustls::TlsConnector::from(cfg)
        .connect(server, stream)
        .await
}

/// One HTTP/1.1 GET on `s`; the status line.
async fn get<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, host: &str, path: &str) -> String {
    let ask = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(ask.as_bytes()).await.expect("write");
    let mut all = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all)).await;
    String::from_utf8_lossy(&all)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn records(d: &Daemon) -> Vec<Value> {
    audit::lines(&d.audit_path())
}

async fn wait_for(d: &Daemon, what: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..100 {
        if let Some(v) = records(d).into_iter().find(|v| what(v)) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no such record in:\n{:#?}", records(d));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthrough_rule_splices_tls_to_the_name_unopened_and_records_it() {
    let w = world().await;

    // The transparent path: the upstream's own certificate reaches the agent.
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let mut s = tls(tcp, "pinned.test", &upstream_ca(&w))
        .await
        .expect("the upstream's own certificate, not a minted leaf");
    assert_eq!(
        get(&mut s, "pinned.test", "/pinned").await,
        "HTTP/1.1 200 OK"
    );
    drop(s);
    assert!(w
        .up
        .requests()
        .iter()
        .any(|r| r.path_and_query == "/pinned"));
    let decided = wait_for(&w.daemon, |v| {
        v["protocol"] == "tls-passthrough" && v["decision"] == "allow" && v["kind"] == "connection"
    })
    .await;
    assert_eq!(decided["rule"], "pinned", "{decided}");
    assert_eq!(decided["sni"], "pinned.test", "{decided}");
    assert_eq!(decided["host"], "pinned.test", "{decided}");
    assert_eq!(
        decided["upstream"],
        w.up.addr.to_string(),
        "dialed by name, not the address the agent chose: {decided}"
    );
    let closed = wait_for(&w.daemon, |v| {
        v["protocol"] == "tls-passthrough" && v["kind"] == "close"
    })
    .await;
    assert!(closed["bytes_up"].as_u64().unwrap_or(0) > 200, "{closed}");
    assert!(closed["bytes_down"].as_u64().unwrap_or(0) > 500, "{closed}");

    // Through CONNECT with the same name: spliced too.
    let port = w.up.addr.port();
    let mut tcp = TcpStream::connect(w.daemon.explicit)
        .await
        .expect("connect");
    let connect =
        format!("CONNECT pinned.test:{port} HTTP/1.1\r\nHost: pinned.test:{port}\r\n\r\n");
    tcp.write_all(connect.as_bytes()).await.expect("write");
    let mut r = BufReader::new(tcp);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        r.read_line_lossy(&mut line).await;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut s = tls(r, "pinned.test", &upstream_ca(&w))
        .await
        .expect("spliced through CONNECT");
    assert_eq!(
        get(&mut s, "pinned.test", "/via-connect").await,
        "HTTP/1.1 200 OK"
    );

    audit::assert_matches_schema(&records(&w.daemon));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anything_a_passthrough_rule_does_not_decide_is_intercepted() {
    let w = world().await;
    // Another rule's host: intercepted, so a client trusting only the upstream's CA fails...
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let err = tls(tcp, "api.test", &upstream_ca(&w))
        .await
        .expect_err("intercepted: our leaf");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    // ...and one trusting our CA is served by the proxy.
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let mut s = tls(tcp, "api.test", &w.daemon.ca_pem)
        .await
        .expect("our leaf");
    assert_eq!(get(&mut s, "api.test", "/api").await, "HTTP/1.1 200 OK");

    // No server name (an address): never passed through.
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let err = tls(tcp, "127.0.0.3", &upstream_ca(&w))
        .await
        .expect_err("no SNI");
    assert!(
        err.to_string().contains("UnknownIssuer") || err.to_string().contains("NotValidForName"),
        "{err}"
    );

    // A CONNECT to one host whose ClientHello names the passthrough host: not spliced.
    let port = w.up.addr.port();
    let mut tcp = TcpStream::connect(w.daemon.explicit)
        .await
        .expect("connect");
    let connect = format!("CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    tcp.write_all(connect.as_bytes()).await.expect("write");
    let mut r = BufReader::new(tcp);
    let mut line = String::new();
    r.read_line_lossy(&mut line).await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    loop {
        let mut l = String::new();
        r.read_line_lossy(&mut l).await;
        if l == "\r\n" || l.is_empty() {
            break;
        }
    }
    assert!(
        tls(r, "pinned.test", &upstream_ca(&w)).await.is_err(),
        "fronted: not spliced"
    );

    // Nothing but the passthrough host's own connections were recorded as spliced.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        records(&w.daemon)
            .iter()
            .all(|v| v["protocol"] != "tls-passthrough"),
        "{:#?}",
        records(&w.daemon)
    );
    let rejected = wait_for(&w.daemon, |v| v["error_code"] == "client_rejected_ca").await;
    assert_eq!(rejected["protocol"], "tls", "{rejected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passthrough_name_the_guard_forbids_is_refused_before_anything_is_dialed() {
    let w = world().await;
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    assert!(tls(tcp, "guarded.test", &upstream_ca(&w)).await.is_err());
    let refused = wait_for(&w.daemon, |v| {
        v["protocol"] == "tls-passthrough" && v["decision"] != "allow"
    })
    .await;
    assert_eq!(refused["error_code"], "destination_forbidden", "{refused}");
    assert_eq!(refused["rule"], "guarded", "{refused}");
    assert!(refused["upstream"].is_null(), "{refused}");
}

/// `read_line` that tolerates non-UTF-8 (none is expected here).
trait ReadLineLossy {
    async fn read_line_lossy(&mut self, out: &mut String);
}

impl<R: AsyncRead + Unpin> ReadLineLossy for BufReader<R> {
    async fn read_line_lossy(&mut self, out: &mut String) {
        use tokio::io::AsyncBufReadExt;
        let mut buf = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(10), self.read_until(b'\n', &mut buf)).await;
        out.push_str(&String::from_utf8_lossy(&buf));
    }
}
