//! The secret engine over streams, end to end (the real daemon, real TLS both sides, a real
//! upstream on loopback):
//!
//! * what the scanners release, and when, never depends on a stored value: a body, a
//!   response or a WebSocket message ending in the start of a secret (`xxxxsk-te`) goes on
//!   exactly like one that does not (`xxxxzz-zz`), so an agent watching what an upstream
//!   received cannot guess a value a byte at a time;
//! * no text overlapping a value hides it from redaction (the Hugging Face example: secret
//!   `hf`, tokens `hf_…`, behind the percent-encoded placeholder).

use std::convert::Infallible;
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::DaemonOptions;
use agenshield_e2e::upstream::{SeenRequest, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::Message;

const OPENAI: &str = "sk-test-123456";
const HF: &str = "hf_TOKEN1234567890";

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"
secrets = ["openai"]

[[rule]]
id = "hub"
hosts = ["hub.test"]
action = "allow"
secrets = ["hf"]
swap = ["headers"]
"#;

type Body = BoxBody<Bytes, Infallible>;

async fn world() -> World {
    let up = UpstreamOptions {
        name: "up".into(),
        ..Default::default()
    };
    let api = ApiUpstream::start("secret streams upstream CA", &["api.test", "hub.test"], up).await;
    let opts = DaemonOptions {
        secrets: vec![("openai".into(), OPENAI.into()), ("hf".into(), HF.into())],
        ..api.daemon_options(POLICY)
    };
    api.world(opts)
}

async fn http1(w: &World, host: &str) -> hyper::client::conn::http1::SendRequest<Body> {
    let io = TokioIo::new(w.tls(host, &[b"http/1.1"]).await);
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

fn seen(w: &World, path: &str) -> Option<SeenRequest> {
    w.requests()
        .into_iter()
        .rev()
        .find(|r| r.path_and_query.starts_with(path))
}

/// The request body the upstream has received `wait` after the agent sent `first` and
/// paused (the body then ends).
async fn upstream_got_after_a_pause(w: &World, first: &str, wait: Duration) -> Vec<u8> {
    let mut sender = http1(w, "api.test").await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let body = BodyExt::boxed(StreamBody::new(tokio_stream_of(rx)));
    let path = format!("/echo/{first}");
    let req = http::Request::post(format!("https://api.test{path}"))
        .header("host", "api.test")
        .header("content-type", "text/plain")
        .body(body)
        .expect("request");
    let resp = tokio::spawn(async move { sender.send_request(req).await });
    tx.send(Ok(Frame::data(Bytes::copy_from_slice(first.as_bytes()))))
        .await
        .expect("send");
    // Wait for the request to reach the upstream, then for `wait` more.
    let started = Instant::now();
    while seen(w, &path).is_none() && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(wait).await;
    let got = seen(w, &path)
        .map(|r| r.body.lock().expect("body").clone())
        .unwrap_or_default();
    tx.send(Ok(Frame::data(Bytes::from_static(b"\n"))))
        .await
        .expect("send");
    drop(tx);
    let resp = resp.await.expect("join").expect("response");
    assert_eq!(resp.status(), 200, "{first:?}");
    got
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The agent's body ends (for now) in the start of the stored value, or in bytes that are
/// not: the upstream gets the same bytes, promptly, either way. (The scanner this replaced
/// held `sk-te` until more came, and let `zz-zz` through at once: a guess per byte.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_pausing_in_the_start_of_a_secret_goes_on_like_any_other() {
    let w = world().await;
    for first in ["xxxxsk-te", "xxxxzz-zz", "xxxxs", "xxxxz"] {
        let got = upstream_got_after_a_pause(&w, first, Duration::from_millis(600)).await;
        assert_eq!(
            String::from_utf8_lossy(&got),
            first,
            "what the upstream got of {first:?} while the agent paused"
        );
    }
}

/// The same for a response: the upstream sends the start of the value (or not) and pauses;
/// the agent reads the same bytes before the pause ends either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_pausing_in_the_start_of_a_secret_reaches_the_agent_like_any_other() {
    let w = world().await;
    for first in ["xxxxsk-te", "xxxxzz-zz"] {
        let mut sender = http1(&w, "api.test").await;
        let req = http::Request::get(format!("https://api.test/pause?first={first}&gap=2000"))
            .header("host", "api.test")
            .body(Empty::new().boxed())
            .expect("request");
        let resp = sender.send_request(req).await.expect("response");
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1200);
        while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, body.frame()).await {
            if let Some(d) = frame.data_ref() {
                got.extend_from_slice(d);
            }
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            first,
            "what reached the agent of {first:?} before the upstream's pause ended"
        );
    }
}

/// WebSocket messages are relayed whole: each arrives, unchanged and promptly, whatever it
/// ends in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_messages_go_on_whole_whatever_they_end_in() {
    let w = world().await;
    let stream = w.tls("api.test", &[b"http/1.1"]).await;
    let url = format!("wss://api.test:{}/ws", w.up.addr.port());
    let (mut ws, resp) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    for first in ["xxxxsk-te", "xxxxzz-zz"] {
        ws.send(Message::text(first)).await.expect("send");
        let echo = tokio::time::timeout(Duration::from_millis(1000), ws.next())
            .await
            .expect("echo in time")
            .expect("a message")
            .expect("no error");
        assert_eq!(echo, Message::text(first));
    }
    let got = seen(&w, "/ws").expect("upstream saw the socket").body;
    assert_eq!(
        String::from_utf8_lossy(&got.lock().expect("body")),
        "xxxxsk-te\nxxxxzz-zz\n"
    );
}

/// The Hugging Face example: the percent-encoded placeholder of `hf` runs into the token the
/// swap put in; the upstream echoes it, and the agent gets the placeholder, never `hf_…`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlapping_placeholder_never_hides_a_value_from_redaction() {
    let w = world().await;
    let mut sender = http1(&w, "hub.test").await;
    let req = http::Request::get("https://hub.test/echo")
        .header("host", "hub.test")
        .header("x-echo", "agenshield%3Asecret%3Aagenshield:secret:hf")
        .body(Empty::new().boxed())
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    let text = String::from_utf8_lossy(&body);
    // The upstream did get the value (the rule swaps in headers)…
    let seen = seen(&w, "/echo").expect("seen");
    let echo = seen
        .headers
        .iter()
        .find(|(k, _)| k == "x-echo")
        .map(|(_, v)| v.clone());
    assert_eq!(
        echo.as_deref(),
        Some(&*format!("agenshield%3Asecret%3A{HF}"))
    );
    // …and the agent never does, in the body or a header.
    assert!(!text.contains("hf_TOKEN"), "{text}");
    assert!(
        text.contains("agenshield%3Asecret%3Aagenshield:secret:hf"),
        "{text}"
    );
    for (k, v) in &parts.headers {
        assert!(!v.as_bytes().windows(8).any(|x| x == b"hf_TOKEN"), "{k}");
    }
}

/// An upstream's reason phrase and header names are free text too: neither carries a value
/// to the agent (the reason phrase is never relayed; a value in a name, which HTTP folds to
/// lower case, is replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reason_phrases_and_header_names_never_carry_a_value() {
    let w = world().await;
    let mut sender = http1(&w, "api.test").await;
    let req = http::Request::get(format!(
        "https://api.test/reason?text=leak+{OPENAI}&header=x-{OPENAI}"
    ))
    .header("host", "api.test")
    .body(Empty::new().boxed())
    .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let reason = resp
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned());
    assert_eq!(reason, None, "the canonical reason, not the upstream's");
    let names: Vec<String> = resp.headers().keys().map(|k| k.to_string()).collect();
    assert!(names.iter().all(|n| !n.contains("123456")), "{names:?}");
    assert!(
        names.iter().any(|n| n == "x-agenshield-secret-openai"),
        "{names:?}"
    );
}
