//! Proves the test upstream works over TLS h1/h2, plain HTTP, WebSocket and with the
//! real curl binary, so proxy e2e failures are never the upstream's fault.

use std::net::SocketAddr;
use std::sync::Arc;

use agenshield_e2e::pki::{client_config, TestCa};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message;

const HOST: &str = "upstream.test";

async fn tls_connect(addr: SocketAddr, cfg: Arc<rustls::ClientConfig>) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.expect("connect upstream");
    let name = ServerName::try_from(HOST).expect("server name");
    TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// One GET over HTTP/1.1 on `io`; returns (status, body).
async fn get_h1<I>(io: I, path: &str) -> (StatusCode, Bytes)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("h1 handshake");
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", HOST)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("h1 response");
    let status = resp.status();
    (
        status,
        resp.into_body()
            .collect()
            .await
            .expect("h1 body")
            .to_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_serves_tls_plain_ws_and_curl() {
    let ca = TestCa::new("e2e upstream CA");
    let leaf = ca.leaf(&[HOST, "127.0.0.1"]);
    let up = Upstream::start(UpstreamOptions {
        tls: Some(leaf),
        name: "alpha".into(),
        ..Default::default()
    })
    .await;
    let hello = Bytes::from_static(b"hello from alpha\n");
    let pem = ca.cert_pem();

    // TLS + HTTP/1.1: hello and a streamed 1 MiB body with the expected pattern.
    let h1 = client_config(&[&pem], &[b"http/1.1"]);
    let tls = tls_connect(up.addr, h1.clone()).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(get_h1(tls, "/").await, (StatusCode::OK, hello.clone()));
    let (status, body) = get_h1(tls_connect(up.addr, h1.clone()).await, "/bytes/1048576").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 1 << 20);
    assert!(
        body.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8),
        "byte pattern"
    );

    // TLS + h2 negotiated via ALPN.
    let tls = tls_connect(up.addr, client_config(&[&pem], &[b"h2", b"http/1.1"])).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let uri = format!("https://{HOST}:{}/", up.addr.port());
    let resp = send
        .send_request(Request::get(uri).body(Empty::<Bytes>::new()).expect("req"))
        .await
        .expect("h2 resp");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(
        resp.into_body()
            .collect()
            .await
            .expect("h2 body")
            .to_bytes(),
        hello
    );

    // Plain HTTP/1.1 on the same port.
    let tcp = TcpStream::connect(up.addr).await.expect("connect plain");
    assert_eq!(get_h1(tcp, "/status/418").await.0, StatusCode::IM_A_TEAPOT);
    let tcp = TcpStream::connect(up.addr).await.expect("connect plain");
    assert_eq!(get_h1(tcp, "/").await, (StatusCode::OK, hello.clone()));

    // WebSocket echo over TLS (HTTP/1.1 Upgrade).
    let tls = tls_connect(up.addr, h1.clone()).await;
    let url = format!("wss://{HOST}:{}/ws", up.addr.port());
    let (mut ws, resp) = tokio_tungstenite::client_async(url, tls)
        .await
        .expect("ws handshake");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws.send(Message::text("ping me"))
        .await
        .expect("ws send text");
    assert_eq!(
        ws.next().await.expect("ws msg").expect("ws ok"),
        Message::text("ping me")
    );
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .expect("ws send binary");
    assert_eq!(
        ws.next().await.expect("ws msg").expect("ws ok"),
        Message::binary(vec![0u8, 1, 2, 255])
    );
    ws.close(None).await.expect("ws close");

    // Real curl, both protocols.
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_path = dir.path().join("ca.pem");
    ca.write_pem(&ca_path).expect("write CA");
    for (flag, want_version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let out = tokio::process::Command::new("/usr/bin/curl")
            .args([
                "-sS",
                "--noproxy",
                "*",
                "--max-time",
                "20",
                flag,
                "--cacert",
            ])
            .arg(&ca_path)
            .arg("--resolve")
            .arg(format!("{HOST}:{}:127.0.0.1", up.addr.port()))
            .args(["--data-binary", "hello", "-w", "%{http_version}"])
            .arg(format!("https://{HOST}:{}/echo?via=curl", up.addr.port()))
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("all_proxy")
            .env_remove("ALL_PROXY")
            .output()
            .await
            .expect("run curl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "curl {flag} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json = stdout
            .strip_suffix(want_version)
            .unwrap_or_else(|| panic!("curl {flag}: {stdout}"));
        let v: serde_json::Value = serde_json::from_str(json).expect("echo JSON");
        assert_eq!(v["path"], "/echo?via=curl");
        assert_eq!(v["tls"], true);
        assert_eq!(v["sni"], HOST);
        assert_eq!((&v["method"], &v["body_len"]), (&"POST".into(), &5.into()));
    }

    // The request log saw SNI, ALPN and plain requests.
    let seen = up.requests();
    assert!(
        seen.len() == 9,
        "expected every request recorded, got {}",
        seen.len()
    );
    let h2 = seen
        .iter()
        .find(|r| r.version == http::Version::HTTP_2 && r.path_and_query == "/")
        .expect("h2 seen");
    assert_eq!(
        (h2.tls, h2.sni.as_deref(), h2.alpn.as_deref()),
        (true, Some(HOST), Some("h2"))
    );
    assert_eq!(
        h2.authority.as_deref(),
        Some(&*format!("{HOST}:{}", up.addr.port()))
    );
    let ws = seen
        .iter()
        .find(|r| r.path_and_query == "/ws")
        .expect("ws seen");
    assert_eq!(
        (ws.sni.as_deref(), ws.alpn.as_deref()),
        (Some(HOST), Some("http/1.1"))
    );
    let plain = seen.iter().filter(|r| !r.tls).count();
    assert_eq!(plain, 2, "plain requests");
    assert!(seen.iter().all(|r| r.peer.ip().is_loopback()));
}

#[tokio::test]
async fn plain_only_upstream_and_drop_stops_it() {
    let up = Upstream::start(UpstreamOptions {
        tls: None,
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let addr = up.addr;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(
        get_h1(tcp, "/nope").await,
        (StatusCode::OK, Bytes::from_static(b"hello from plain\n"))
    );
    assert_eq!(up.requests()[0].path_and_query, "/nope");
    drop(up);
    tokio::task::yield_now().await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "listener closed after drop"
    );
}
