//! `[upstream] proxy`: every upstream connection through the operator's own HTTP proxy —
//! `CONNECT` for TLS (h1 and h2) and raw TCP, absolute-form for plain HTTP, with our
//! credentials for it and our verification of the origin inside the tunnel; the
//! private-address guard covers the proxy's own address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use agenshield_e2e::audit;
use agenshield_e2e::corp_proxy::{CorpProxy, CorpProxyOptions};
use agenshield_e2e::curl::curl;
use agenshield_e2e::daemon::{binary, prepare, Daemon, DaemonOptions};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World};
use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const PASSWORD: &str = "s3cret-corp-pw";

fn policy(echo_port: u16) -> String {
    format!(
        "version = 1\ndefault = \"deny\"\n\
         [[rule]]\nid = \"api\"\nhosts = [\"api.test\", \"evil.test\", \"unknown.test\"]\naction = \"allow\"\n\
         [[rule]]\nid = \"raw\"\nhosts = [\"127.0.0.1\"]\nports = [{echo_port}]\nschemes = [\"tcp\"]\naction = \"allow\"\n"
    )
}

fn basic(user: &str, password: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

async fn echo_server() -> u16 {
    let echo = TcpListener::bind((LOCAL, 0)).await.expect("bind");
    let port = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// What this file adds to the shared world: the operator's proxy, the impostor it sends
/// evil.test to, and a plain TCP echo server.
struct Corp {
    proxy: CorpProxy,
    impostor: Upstream,
    echo_port: u16,
}

/// api.test is served by the world's upstream (its CA trusted through `extra_ca`); the
/// corporate proxy sends evil.test to an impostor whose certificate comes from a CA nobody
/// trusts. The daemon has no resolver entry for either: only the corporate proxy knows where
/// they are.
async fn world(user_password: (&str, &str)) -> (World, Corp) {
    world_with(user_password, false).await
}

/// As `world`, with a corporate proxy that passes our `Proxy-Authorization` on to origins.
async fn world_with(user_password: (&str, &str), leaks_credentials: bool) -> (World, Corp) {
    let api = ApiUpstream::start(
        "origin CA",
        &["api.test"],
        UpstreamOptions {
            name: "up".into(),
            ..Default::default()
        },
    )
    .await;
    let rogue = TestCa::new("a CA nobody trusts");
    let impostor = Upstream::start(UpstreamOptions {
        tls: Some(rogue.leaf(&["evil.test"])),
        name: "impostor".into(),
        ..Default::default()
    })
    .await;
    let proxy = CorpProxy::start(CorpProxyOptions {
        routes: HashMap::from([
            ("api.test".to_string(), api.up.addr),
            ("evil.test".to_string(), impostor.addr),
        ]),
        authorization: Some(basic("corp", PASSWORD)),
        leaks_credentials,
    })
    .await;
    let echo_port = echo_server().await;
    let (user, password) = user_password;
    let opts = DaemonOptions {
        policies: vec![("main.toml".into(), policy(echo_port))],
        extra_ca: vec![api.ca_file.clone()],
        orig_dst: Some(api.up.addr),
        upstream_proxy: Some(format!("http://{user}:{password}@{}", proxy.addr)),
        ..Default::default()
    };
    let corp = Corp {
        proxy,
        impostor,
        echo_port,
    };
    (api.world(opts), corp)
}

fn explicit(w: &World) -> String {
    format!("http://{}", w.daemon.explicit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_upstream_connection_goes_through_the_operators_proxy() {
    let (w, corp) = world(("corp", PASSWORD)).await;
    let port = w.up.addr.port();
    let ours = basic("corp", PASSWORD);
    let ca = w.daemon.ca_path.to_str().expect("path");

    // HTTPS through the explicit listener: a CONNECT tunnel, TLS to the origin inside it.
    let url = format!("https://api.test:{port}/echo?via=connect");
    let out = curl(&["--proxy", &explicit(&w), "--cacert", ca, &url], false).await;
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(out.json()["name"], "up");

    // HTTP/2 on the transparent path: h2 end to end through the tunnel.
    let connect_to = format!("api.test:{port}:127.0.0.1:{}", w.daemon.transparent.port());
    let url = format!("https://api.test:{port}/echo?via=h2");
    let args = ["--http2", "--connect-to", &connect_to, "--cacert", ca, &url];
    let out = curl(&args, false).await;
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(out.json()["version"], "HTTP/2.0", "{}", out.text());

    // Plain HTTP: absolute-form to the corporate proxy, with our credentials, never the
    // agent's (its Proxy-Authorization was for us and is not passed on).
    let url = format!("http://api.test:{port}/echo?via=absolute");
    let args = [
        "--proxy",
        &explicit(&w),
        "--proxy-user",
        "agent:its-own",
        &url,
    ];
    let out = curl(&args, false).await;
    assert_eq!(out.status, 200, "{out:?}");
    let seen_up = w.up.requests();
    let plain = seen_up
        .iter()
        .find(|r| r.path_and_query.ends_with("via=absolute"))
        .expect("the upstream got the plain request");
    assert!(
        plain
            .headers
            .iter()
            .all(|(k, _)| k != "proxy-authorization"),
        "{:?}",
        plain.headers
    );

    // Raw TCP: a tunnel to the address the agent connected to.
    let mut s = TcpStream::connect(w.daemon.explicit)
        .await
        .expect("connect");
    let echo = corp.echo_port;
    let head = format!("CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nHost: 127.0.0.1:{echo}\r\n\r\n");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut got = vec![0u8; 256];
    let n = s.read(&mut got).await.expect("read");
    assert!(String::from_utf8_lossy(&got[..n]).starts_with("HTTP/1.1 200"));
    s.write_all(b"\x00raw bytes\n").await.expect("write");
    let mut echoed = [0u8; 11];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echoed))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(&echoed, b"\x00raw bytes\n");
    drop(s);

    // What the corporate proxy saw: each with our credentials.
    let seen = corp.proxy.seen();
    let targets: Vec<(String, String)> = seen
        .iter()
        .map(|s| (s.method.clone(), s.target.clone()))
        .collect();
    for want in [
        ("CONNECT".to_string(), format!("api.test:{port}")),
        (
            "GET".to_string(),
            format!("http://api.test:{port}/echo?via=absolute"),
        ),
        ("CONNECT".to_string(), format!("127.0.0.1:{echo}")),
    ] {
        assert!(targets.contains(&want), "{want:?} not in {targets:?}");
    }
    for s in &seen {
        assert_eq!(
            s.proxy_authorization.as_deref(),
            Some(ours.as_str()),
            "{s:?}"
        );
        assert_eq!(s.status, 200, "{s:?}");
    }

    // The records name the address dialed: the corporate proxy's.
    let records = audit::lines(&w.daemon.audit_path());
    let dialed: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["kind"] == "request" || r["kind"] == "connection")
        .collect();
    assert_eq!(dialed.len(), 4, "{dialed:#?}");
    for r in dialed {
        assert_eq!(r["upstream"], corp.proxy.addr.to_string(), "{r}");
    }
    assert!(!std::fs::read_to_string(w.daemon.audit_path())
        .expect("audit")
        .contains(PASSWORD));
    assert!(
        !w.daemon.logs().contains(PASSWORD),
        "the password is never logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origin_is_verified_inside_the_tunnel() {
    let (w, corp) = world(("corp", PASSWORD)).await;
    let port = corp.impostor.addr.port();
    let url = format!("https://evil.test:{port}/echo");
    let ca = w.daemon.ca_path.to_str().expect("path");
    let out = curl(&["--proxy", &explicit(&w), "--cacert", ca, &url], false).await;
    assert_eq!(out.status, 502, "{out:?}");
    assert_eq!(out.json()["error_code"], "upstream_tls", "{}", out.text());
    assert!(
        corp.impostor.requests().is_empty(),
        "nothing reached the impostor"
    );
    let tunnels = corp.proxy.seen();
    assert!(
        tunnels
            .iter()
            .any(|s| s.target == format!("evil.test:{port}")),
        "{tunnels:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_proxy_is_a_clear_error_and_its_password_stays_secret() {
    let wrong = "not-the-password";
    let (w, _corp) = world(("corp", wrong)).await;
    let port = w.up.addr.port();
    let ca = w.daemon.ca_path.to_str().expect("path");
    let url = format!("https://api.test:{port}/echo");
    let out = curl(&["--proxy", &explicit(&w), "--cacert", ca, &url], false).await;
    assert_eq!(out.status, 502, "{out:?}");
    let body = out.json();
    assert_eq!(body["error_code"], "upstream_connect", "{body}");
    let message = body["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("407"), "{message}");
    assert!(message.contains("http://corp:***@"), "{message}");
    assert!(!message.contains(wrong), "{message}");
    assert!(
        !w.daemon.logs().contains(wrong),
        "the password is never logged"
    );
    assert!(w.up.requests().is_empty());

    // A name the corporate proxy cannot route: its 502, told as such.
    let (w, _corp) = world(("corp", PASSWORD)).await;
    let url = format!("https://unknown.test:{port}/echo");
    let out = curl(
        &["--proxy", &explicit(&w), "--cacert", ca_of(&w), &url],
        false,
    )
    .await;
    assert_eq!(out.status, 502, "{out:?}");
    let message = out.json()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("gave no tunnel to unknown.test"),
        "{message}"
    );
    assert!(message.contains("502"), "{message}");
}

fn ca_of(w: &World) -> &str {
    w.daemon.ca_path.to_str().expect("path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_covers_the_proxys_own_address() {
    // A corporate proxy on [::1]: loopback, which this guard lets through on 127.0.0.0/8 only.
    let Ok(v6) = TcpListener::bind("[::1]:0").await else {
        eprintln!("SKIP: no IPv6 loopback on this machine");
        return;
    };
    let corp = CorpProxy::serve(v6, CorpProxyOptions::default());
    let ca = TestCa::new("origin CA");
    let up = Upstream::start(UpstreamOptions {
        tls: Some(ca.leaf(&["api.test"])),
        name: "up".into(),
        ..Default::default()
    })
    .await;
    let allow_api =
        "version = 1\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n";

    // Given as an address: the daemon refuses to start, and says how to allow it.
    let opts = DaemonOptions {
        policies: vec![("main.toml".into(), allow_api.into())],
        upstream_proxy: Some(format!("http://{}", corp.addr)),
        ..Default::default()
    };
    let dir = prepare(&opts);
    let out = tokio::process::Command::new(binary())
        .args(["proxy", "run", "--config"])
        .arg(dir.path().join("proxy.toml"))
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("exits in time")
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("upstream.allow_private = [\"::1/128\"]"),
        "{stderr}"
    );

    // Given as a name that resolves there: refused at each dial, nothing sent to it.
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), allow_api.into())],
        hosts: vec![("corp.test".into(), "::1".parse().expect("ip"))],
        upstream_proxy: Some(format!("http://corp.test:{}", corp.addr.port())),
        ..Default::default()
    });
    let url = format!("https://api.test:{}/echo", up.addr.port());
    let proxy = format!("http://{}", daemon.explicit);
    let ca_path = daemon.ca_path.to_str().expect("path");
    let out = curl(&["--proxy", &proxy, "--cacert", ca_path, &url], false).await;
    assert_eq!(out.status, 403, "{out:?}");
    assert_eq!(
        out.json()["error_code"],
        "destination_forbidden",
        "{}",
        out.text()
    );
    assert!(corp.seen().is_empty(), "nothing reached the proxy");
    assert!(up.requests().is_empty());
}

/// TRACE through the operator's proxy would come back with the request as the proxy got it:
/// our `Proxy-Authorization` for it included. Refused before anything is sent, unless a rule
/// names the method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_never_reaches_the_proxy_or_the_origin() {
    let (w, corp) = world(("corp", PASSWORD)).await;
    let port = w.up.addr.port();
    let ca = w.daemon.ca_path.to_str().expect("path");
    let before = (corp.proxy.seen().len(), w.up.requests().len());
    for method in ["TRACE", "TRACK"] {
        for url in [
            format!("http://api.test:{port}/echo"),
            format!("https://api.test:{port}/echo"),
        ] {
            let args = ["--proxy", &explicit(&w), "--cacert", ca, "-X", method, &url];
            let out = curl(&args, false).await;
            assert_eq!(out.status, 403, "{method} {url}: {out:?}");
            let v = out.json();
            assert_eq!(v["error_code"], "policy_denied", "{v}");
            assert!(
                v["message"].as_str().unwrap_or("").contains("not allowed"),
                "{v}"
            );
            assert!(!out.text().contains(PASSWORD), "{}", out.text());
        }
    }
    // CONNECTs for the HTTPS attempts reached the proxy; no request did.
    assert_eq!(w.up.requests().len(), before.1, "the origin saw no TRACE");
    assert!(
        corp.proxy.seen()[before.0..]
            .iter()
            .all(|s| s.method == "CONNECT"),
        "{:?}",
        corp.proxy.seen()
    );
}

/// A corporate proxy that passes our credentials on to the origin, and an origin that echoes
/// its request: the password (and its base64 in `Proxy-Authorization`) is redacted like a
/// stored secret, so the agent never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_credentials_reflected_back_are_redacted() {
    let (w, _corp) = world_with(("corp", PASSWORD), true).await;
    let port = w.up.addr.port();
    let url = format!("http://api.test:{port}/echo?via=reflect");
    let out = curl(&["--proxy", &explicit(&w), &url], false).await;
    // The rule binds no secret: the echo is cut short before the credentials.
    assert_ne!(out.exit, 0, "cut short: {out:?}");
    // The origin did get them (the corporate proxy leaked them)…
    let seen =
        w.up.requests()
            .into_iter()
            .find(|r| r.path_and_query.ends_with("via=reflect"))
            .expect("seen");
    let reflected = seen
        .headers
        .iter()
        .find(|(k, _)| k == "proxy-authorization")
        .map(|(_, v)| v.clone());
    assert_eq!(reflected.as_deref(), Some(&*basic("corp", PASSWORD)));
    // …and the agent sees neither the password nor its base64.
    let text = out.text();
    let b64 = basic("corp", PASSWORD);
    let b64 = b64.trim_start_matches("Basic ");
    assert!(!text.contains(PASSWORD), "{text}");
    assert!(!text.contains(b64), "{text}");
    let recs = audit::lines(&w.daemon.audit_path());
    assert!(
        recs.iter()
            .any(|r| r["path"] == "/echo?via=[redacted]" && r["error_code"] == "secret_leak"),
        "{recs:?}\n{}",
        w.daemon.logs()
    );
    // The leak guard: the agent sending the password on is refused.
    let url = format!("http://api.test:{port}/echo?note={PASSWORD}");
    let out = curl(&["--proxy", &explicit(&w), &url], false).await;
    assert_eq!(out.status, 403, "{out:?}");
    assert_eq!(out.json()["error_code"], "secret_leak", "{}", out.text());
}
