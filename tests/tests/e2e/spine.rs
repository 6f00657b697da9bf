//! The spine end to end: the real daemon, real curl, real TLS on both sides, upstreams on
//! loopback with a CA made at test time. Both listeners are exercised: the transparent one
//! (original destination fixed by the test, since there is no firewall here) and the
//! explicit one (CONNECT and absolute-URI).

use std::sync::Arc;
use std::time::Duration;

use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::binary;
use agenshield_e2e::pki::{client_config, TestCa};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World, LOCAL};
use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "upstreams"
hosts = ["allowed.test", "a.test", "b.test", "untrusted.test", "wrongname.test"]
action = "allow"

[[rule]]
id = "no-admin"
hosts = ["allowed.test"]
paths = ["/admin/**"]
action = "deny"
priority = 10

[[rule]]
id = "block-denied"
hosts = ["denied.test"]
action = "deny"
"#;

/// The upstream for every name the policy knows, and a daemon in front of it under `POLICY`
/// (and `extra_policy`, `limits`, when given).
async fn world(extra_policy: &str, limits: &[&str]) -> World {
    let api = ApiUpstream::start(
        "spine upstream CA",
        &[
            "allowed.test",
            "denied.test",
            "a.test",
            "b.test",
            "127.0.0.1",
        ],
        UpstreamOptions {
            name: "main".into(),
            ..Default::default()
        },
    )
    .await;
    let mut opts = api.daemon_options(POLICY);
    // Resolved, with no leaf of the upstream's: the daemon must refuse them.
    for n in ["untrusted.test", "wrongname.test", "nobody.test"] {
        opts.hosts.push((n.to_string(), LOCAL));
    }
    if !extra_policy.is_empty() {
        opts.policies
            .push(("extra.toml".to_string(), extra_policy.to_string()));
    }
    opts.limits = limits.iter().map(|s| s.to_string()).collect();
    api.world(opts)
}

async fn assert_still_serving(w: &mut World) {
    assert!(
        w.daemon.is_alive(),
        "daemon died; log:\n{}",
        w.daemon.logs()
    );
    let out = w.transparent("https", "allowed.test", "/", &[]).await;
    assert_eq!(out.status, 200, "{out:?}");
}

fn assert_refused(out: &CurlOut, status: u16, code: &str, rule: Option<&str>) {
    assert_eq!(out.exit, 0, "curl failed: {out:?}");
    assert_eq!(out.status, status, "body: {}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], code, "{v}");
    match rule {
        Some(r) => assert_eq!(v["rule_id"], r, "{v}"),
        None => assert!(v["rule_id"].is_null(), "{v}"),
    }
    for key in ["message", "request_id", "policy_hash", "explanation"] {
        assert!(
            v[key].as_str().is_some_and(|s| !s.is_empty()),
            "{key} missing: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_https_get_returns_upstream_body_through_both_listeners() {
    let w = world("", &[]).await;
    for out in w.both("https", "allowed.test", "/", &[]).await {
        assert_eq!(out.exit, 0, "{out:?}");
        assert_eq!(out.status, 200);
        assert_eq!(out.text(), "hello from main\n");
    }
    let seen = w.up.requests();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|r| r.tls && r.sni.as_deref() == Some("allowed.test")));
    let _ = &w.upstream_ca;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_host_gets_403_json_naming_the_rule() {
    let w = world("", &[]).await;
    for out in w.both("https", "denied.test", "/", &[]).await {
        assert_refused(&out, 403, "policy_denied", Some("block-denied"));
    }
    // A host no rule mentions falls to the policy's default, named `default` in the body.
    for out in w.both("https", "nobody.test", "/", &[]).await {
        assert_refused(&out, 403, "policy_denied", Some("default"));
    }
    for out in w.both("https", "a.test", "/", &[]).await {
        assert_eq!(out.status, 200, "a.test is allowed: {out:?}");
    }
    assert!(w
        .up
        .requests()
        .iter()
        .all(|r| !matches!(r.sni.as_deref(), Some("denied.test" | "nobody.test"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_path_on_allowed_host_gets_403_and_path_tricks_do_not_dodge_it() {
    let w = world("", &[]).await;
    for out in w.both("https", "allowed.test", "/admin/users", &[]).await {
        assert_refused(&out, 403, "policy_denied", Some("no-admin"));
    }
    for trick in [
        "/x/../admin/users",
        "/%61dmin/users",
        "//admin//users",
        "/admin%2Fusers",
        "/./admin/./users",
    ] {
        let out = w
            .transparent("https", "allowed.test", trick, &["--path-as-is"])
            .await;
        assert_refused(&out, 403, "policy_denied", Some("no-admin"));
    }
    assert!(w
        .up
        .requests()
        .iter()
        .all(|r| !r.path_and_query.contains("admin")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_negotiated_with_the_agent_and_reaches_the_upstream() {
    let w = world("", &[]).await;
    for out in w.both("https", "allowed.test", "/echo", &["--http2"]).await {
        assert_eq!(out.status, 200, "{out:?}");
        assert_eq!(out.http_version, "2", "client side must be h2");
        assert_eq!(out.json()["path"], "/echo");
    }
    let out = w
        .transparent("https", "allowed.test", "/", &["--http1.1"])
        .await;
    assert_eq!((out.status, out.http_version.as_str()), (200, "1.1"));
    assert_eq!(w.up.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_works_through_both_listeners_and_is_policy_checked() {
    let w = world("", &[]).await;
    for out in w.both("http", "allowed.test", "/", &[]).await {
        assert_eq!(
            (out.status, out.text().as_str()),
            (200, "hello from main\n"),
            "{out:?}"
        );
    }
    for out in w.both("http", "denied.test", "/", &[]).await {
        assert_refused(&out, 403, "policy_denied", Some("block-denied"));
    }
    let plain: Vec<_> = w.up.requests().into_iter().filter(|r| !r.tls).collect();
    assert_eq!(plain.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_and_host_that_disagree_are_refused() {
    let w = world("", &[]).await;
    let host = format!("Host: b.test:{}", w.port());
    for version in ["--http1.1", "--http2"] {
        for out in w
            .both("https", "a.test", "/", &[version, "-H", &host])
            .await
        {
            assert_refused(&out, 403, "host_mismatch", None);
        }
    }
    assert!(w.up.requests().is_empty(), "nothing may reach the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_or_wrong_name_upstream_certificate_is_502_never_a_pass() {
    let w = world("", &[]).await;
    let stranger = TestCa::new("nobody trusts me");
    let untrusted = Upstream::start(UpstreamOptions {
        tls: Some(stranger.leaf(&["untrusted.test"])),
        name: "untrusted".into(),
        ..Default::default()
    })
    .await;
    let wrong = Upstream::start(UpstreamOptions {
        tls: Some(w.upstream_ca.leaf(&["someone-else.test"])),
        name: "wrong".into(),
        ..Default::default()
    })
    .await;
    let proxy = format!("http://{}", w.daemon.explicit);
    let ca = w.daemon.ca_path.display().to_string();
    for (host, up) in [("untrusted.test", &untrusted), ("wrongname.test", &wrong)] {
        let url = format!("https://{host}:{}/", up.addr.port());
        let out = curl(&["--cacert", &ca, "--proxy", &proxy, &url], false).await;
        assert_refused(&out, 502, "upstream_tls", Some("upstreams"));
        assert!(up.requests().is_empty(), "{host}: no request may be sent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_round_trips_through_both_listeners() {
    let w = world("", &[]).await;
    let tls = tokio_rustls::TlsConnector::from(client_config(&[&w.daemon.ca_pem], &[b"http/1.1"]));
    let name = ServerName::try_from("allowed.test").expect("name");
    let url = w.url("wss", "allowed.test", "/ws");

    let direct = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let mut via_connect = TcpStream::connect(w.daemon.explicit)
        .await
        .expect("connect");
    let connect = format!(
        "CONNECT allowed.test:{0} HTTP/1.1\r\nHost: allowed.test:{0}\r\n\r\n",
        w.port()
    );
    via_connect
        .write_all(connect.as_bytes())
        .await
        .expect("CONNECT");
    let head = read_head(&mut via_connect).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    for tcp in [direct, via_connect] {
        let stream = tls
            .connect(name.clone(), tcp)
            .await
            .expect("TLS to the proxy");
        let (mut ws, resp) = tokio_tungstenite::client_async(url.as_str(), stream)
            .await
            .expect("websocket handshake");
        assert_eq!(resp.status(), 101);
        ws.send(Message::text("hello through the shield"))
            .await
            .expect("send");
        let echo = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo in time")
            .expect("a message")
            .expect("no error");
        assert_eq!(echo, Message::text("hello through the shield"));
        ws.send(Message::binary(vec![0u8, 1, 2, 255]))
            .await
            .expect("send");
        let echo = ws.next().await.expect("message").expect("ok");
        assert_eq!(echo, Message::binary(vec![0u8, 1, 2, 255]));
        ws.close(None).await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_of_64_mib_streams_with_bounded_proxy_memory() {
    let w = world("", &[]).await;
    const SIZE: u64 = 64 * 1024 * 1024;
    let connect_to = format!(
        "allowed.test:{}:127.0.0.1:{}",
        w.port(),
        w.daemon.transparent.port()
    );
    let url = w.url("https", "allowed.test", &format!("/bytes/{SIZE}"));
    let ca = w.daemon.ca_path.display().to_string();
    // Warm up (leaf minted, pools and buffers allocated), so the peak below is the body's cost.
    let warm = w
        .transparent("https", "allowed.test", "/bytes/65536", &[])
        .await;
    assert_eq!(warm.status, 200);
    let before_kib = w.daemon.peak_rss_kib();
    let out = curl(&["--cacert", &ca, "--connect-to", &connect_to, &url], true).await;
    assert_eq!((out.exit, out.status), (0, 200), "{out:?}");
    assert_eq!(out.size_download, SIZE);
    let peak_kib = w.daemon.peak_rss_kib();
    eprintln!("daemon peak RSS: {before_kib} KiB before, {peak_kib} KiB after a 64 MiB download");
    assert!(
        peak_kib.saturating_sub(before_kib) < 8 * 1024,
        "peak RSS grew from {before_kib} to {peak_kib} KiB: the body must stream, not be buffered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_client_bytes_are_closed_cleanly_and_the_daemon_keeps_serving() {
    let mut w = world(
        "",
        &[
            "first_bytes_timeout = \"500ms\"",
            "tls_handshake_timeout = \"1s\"",
        ],
    )
    .await;
    let t = w.daemon.transparent;

    // Garbage, then nothing more.
    let mut s = TcpStream::connect(t).await.expect("connect");
    s.write_all(b"\x00\x01\x02garbage\r\n\r\n")
        .await
        .expect("write");
    assert_closed(&mut s).await;

    // A ClientHello cut short: once with the client hanging up, once with it waiting.
    let hello = client_hello_bytes("allowed.test");
    for hang_up in [true, false] {
        let mut s = TcpStream::connect(t).await.expect("connect");
        s.write_all(&hello[..hello.len() / 2]).await.expect("write");
        if hang_up {
            s.shutdown().await.expect("shutdown");
        }
        assert_closed(&mut s).await;
    }

    // A client that connects and says nothing is timed out (and its destination, the
    // upstream's raw port, is not allowed as opaque TCP).
    let mut s = TcpStream::connect(t).await.expect("connect");
    let started = std::time::Instant::now();
    assert_closed(&mut s).await;
    assert!(started.elapsed() < Duration::from_secs(5));

    assert_still_serving(&mut w).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hello_without_sni_is_judged_by_its_destination() {
    let mut w = world("", &[]).await;
    // Without SNI the only name is the original destination's address: the leaf is minted
    // for that IP, and the request is decided on it (no rule allows 127.0.0.1 → default deny).
    let cfg = client_config(&[&w.daemon.ca_pem], &[b"http/1.1"]);
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let ip = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let mut tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(ip, tcp)
        .await
        .expect("handshake with an IP leaf");
    let req = format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
        w.port()
    );
    tls.write_all(req.as_bytes()).await.expect("write");
    let mut resp = String::new();
    tls.read_to_string(&mut resp).await.ok();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(resp.contains("\"error_code\":\"policy_denied\""), "{resp}");
    assert_still_serving(&mut w).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_tcp_is_decided_by_destination_alone() {
    let echo = tokio::net::TcpListener::bind((LOCAL, 0))
        .await
        .expect("bind");
    let echo_port = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let rule = format!(
        "version = 1\n[[rule]]\nid = \"raw-echo\"\nhosts = [\"127.0.0.1\"]\nschemes = [\"tcp\"]\nports = [{echo_port}]\naction = \"allow\"\n"
    );
    let w = world(&rule, &[]).await;
    for (port, allowed) in [(echo_port, true), (w.port(), false)] {
        let mut s = TcpStream::connect(w.daemon.explicit)
            .await
            .expect("connect");
        let connect =
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        s.write_all(connect.as_bytes()).await.expect("write");
        assert!(read_head(&mut s).await.starts_with("HTTP/1.1 200"));
        s.write_all(b"\x00raw bytes, not HTTP\n")
            .await
            .expect("write");
        if allowed {
            let mut got = vec![0u8; 21];
            tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
                .await
                .expect("echo in time")
                .expect("echoed");
            assert_eq!(&got, b"\x00raw bytes, not HTTP\n");
        } else {
            assert_closed(&mut s).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_cannot_turn_an_https_allowance_into_a_raw_tunnel() {
    // allowed.test is allowed for HTTP(S) only: after CONNECT, a client that stays silent past
    // the classification timeout (and would then speak TLS to the real server) is refused.
    let w = world("", &["first_bytes_timeout = \"300ms\""]).await;
    let mut s = TcpStream::connect(w.daemon.explicit)
        .await
        .expect("connect");
    let connect = format!(
        "CONNECT allowed.test:{0} HTTP/1.1\r\nHost: allowed.test:{0}\r\n\r\n",
        w.port()
    );
    s.write_all(connect.as_bytes()).await.expect("write");
    assert!(read_head(&mut s).await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _ = s.write_all(&client_hello_bytes("allowed.test")).await;
    assert_closed(&mut s).await;
    assert!(w.up.requests().is_empty());
    let audit = std::fs::read_to_string(w.daemon.audit_path()).expect("audit log");
    let refused = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["protocol"] == "tcp" && v["host"] == "allowed.test")
        .expect("the refusal is recorded");
    assert_eq!(refused["decision"], "deny", "{refused}");
    assert!(
        w.daemon.logs().contains("TCP to allowed.test"),
        "and logged"
    );
}

#[test]
fn malformed_policy_fails_run_with_file_line_and_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).expect("mkdir");
    std::fs::write(
        policies.join("broken.toml"),
        "version = 1\n\n[[rule]]\nid = \"x\"\nhosts = [\"a.test\"\naction = \"allow\"\n",
    )
    .expect("write");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\ntransparent = [\"127.0.0.1:0\"]\nexplicit = \"127.0.0.1:0\"\ndns = \"127.0.0.1:0\"\nadmin = {:?}\nmetrics = \"off\"\n[paths]\npolicies = {:?}\ncerts = {:?}\nvault = {:?}\naudit = {:?}\n",
            dir.path().join("admin.sock"),
            policies,
            dir.path().join("certs"),
            dir.path().join("vault"),
            dir.path().join("audit.jsonl")
        ),
    )
    .expect("write");
    let out = std::process::Command::new(binary())
        .args(["proxy", "run", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad input exits 2; stderr: {stderr}"
    );
    assert!(
        stderr.contains("broken.toml:6:"),
        "file and line expected: {stderr}"
    );
}

async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte))
            .await
            .expect("response head in time")
            .expect("read");
        assert_eq!(n, 1, "closed before the response head ended");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// The peer must close (EOF or reset) within a few seconds, without sending anything useful.
async fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            // A TLS alert may precede the close; HTTP bytes would not be a clean close.
            Ok(Ok(n)) => assert!(!buf[..n].starts_with(b"HTTP/"), "unexpected reply"),
            Err(_) => panic!("connection not closed within 5 s"),
        }
    }
}

/// The bytes of a real ClientHello for `name`, as rustls would send it.
fn client_hello_bytes(name: &str) -> Vec<u8> {
    let cfg: Arc<rustls::ClientConfig> = client_config(&[], &[b"h2"]);
    let mut conn =
        rustls::ClientConnection::new(cfg, ServerName::try_from(name.to_string()).expect("name"))
            .expect("client");
    let mut out = Vec::new();
    conn.write_tls(&mut out).expect("hello");
    out
}
