//! A fake OpenAI- and Anthropic-compatible LLM API for token-budget tests: a small hyper
//! server (TLS, h2 and http/1.1) on a listener the test picks (loopback, or inside a test
//! network namespace). Every answer reports the usage the request asked for, so a test knows
//! exactly how many tokens each response spends:
//!
//! - `POST /v1/chat/completions?tokens=N` (OpenAI): `prompt_tokens = N/2`,
//!   `completion_tokens = N - N/2`, `total_tokens = N`; JSON, or with `&stream=1` an event
//!   stream whose last chunk carries the usage (as `stream_options.include_usage` does);
//! - `POST /v1/messages?tokens=N` (Anthropic): `input_tokens = N/2`, `output_tokens = N - N/2`;
//!   JSON, or with `&stream=1` `message_start` / `message_delta` events;
//! - `POST /v1/nousage?bytes=B`: B bytes of JSON without any usage (the proxy estimates).
//!
//! `&gzip=1` on a JSON answer sends it `Content-Encoding: gzip`.
//! `&pause_ms=M` on a stream waits M ms after the first event before the rest, so a test can
//! see that the first event reached the agent before the stream ended.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::pki::{server_config, TestLeaf};

type Body = BoxBody<Bytes, Infallible>;

/// The running fake API; it stops when dropped.
pub struct LlmUpstream {
    pub addr: SocketAddr,
    /// Requests answered so far.
    pub served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmUpstream {
    /// Serves TLS with `leaf` on 127.0.0.1 (a free port).
    pub async fn start(leaf: &TestLeaf) -> LlmUpstream {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        Self::serve(l, leaf)
    }

    /// Serves TLS with `leaf` on a listener the caller bound (e.g. inside a namespace).
    pub fn serve_std(listener: std::net::TcpListener, leaf: &TestLeaf) -> LlmUpstream {
        listener.set_nonblocking(true).expect("nonblocking");
        Self::serve(TcpListener::from_std(listener).expect("listener"), leaf)
    }

    fn serve(listener: TcpListener, leaf: &TestLeaf) -> LlmUpstream {
        let addr = listener.local_addr().expect("addr");
        let acceptor = TlsAcceptor::from(server_config(leaf, &[b"h2", b"http/1.1"]));
        let served = Arc::new(AtomicUsize::new(0));
        let count = served.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let count = count.clone();
                tokio::spawn(async move {
                    let Ok(Ok(tls)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    else {
                        return;
                    };
                    let svc = service_fn(move |req| {
                        count.fetch_add(1, Ordering::Relaxed);
                        answer(req)
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        LlmUpstream { addr, served, task }
    }
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn answer(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let q = query(&req);
    let path = req.uri().path().to_string();
    // Read the whole request (it is what the agent sent: the prompt).
    let _ = req.into_body().collect().await;
    let n = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let (tokens, stream, pause) = (n("tokens"), n("stream") == 1, n("pause_ms"));
    let (first, second) = (tokens / 2, tokens - tokens / 2);
    let gzip = n("gzip") == 1;
    let json = |text: String| if gzip { gzipped(text) } else { json(text) };
    Ok(match (path.as_str(), stream) {
        ("/v1/chat/completions", false) => json(format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"fake","choices":[{{"index":0,"message":{{"role":"assistant","content":"hello \"usage\": {{\"total_tokens\": 999999}}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{first},"completion_tokens":{second},"total_tokens":{tokens}}}}}"#
        )),
        ("/v1/chat/completions", true) => sse(
            vec![
                r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}],"usage":null}"#.to_string() + "\n\n",
                r#"data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"}}],"usage":null}"#.to_string() + "\n\n",
                format!(r#"data: {{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{{"prompt_tokens":{first},"completion_tokens":{second},"total_tokens":{tokens}}}}}"#) + "\n\n",
                "data: [DONE]\n\n".to_string(),
            ],
            pause,
        ),
        ("/v1/messages", false) => json(format!(
            r#"{{"id":"msg_1","type":"message","role":"assistant","model":"fake","content":[{{"type":"text","text":"hello"}}],"stop_reason":"end_turn","usage":{{"input_tokens":{first},"output_tokens":{second}}}}}"#
        )),
        ("/v1/messages", true) => sse(
            vec![
                format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{{\"input_tokens\":{first},\"output_tokens\":1}}}}}}\n\n"),
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n".to_string(),
                format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{second}}}}}\n\n"),
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string(),
            ],
            pause,
        ),
        ("/v1/nousage", _) => {
            let pad = "x".repeat(usize::try_from(n("bytes")).unwrap_or(0).min(1 << 20));
            json(format!(r#"{{"result":"{pad}"}}"#))
        }
        _ => Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found\n")).boxed())
            .expect("response"),
    })
}

fn json(text: String) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(text)).boxed())
        .expect("response")
}

fn gzipped(text: String) -> Response<Body> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).expect("gzip");
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_ENCODING, "gzip")
        .body(Full::new(Bytes::from(gz.finish().expect("gzip"))).boxed())
        .expect("response")
}

/// An event stream of `events`, the first at once, the rest `pause_ms` later, each its own
/// write.
fn sse(events: Vec<String>, pause_ms: u64) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(8);
    tokio::spawn(async move {
        for (i, e) in events.into_iter().enumerate() {
            if i == 1 && pause_ms > 0 {
                tokio::time::sleep(Duration::from_millis(pause_ms.min(10_000))).await;
            }
            if tx.send(Ok(Frame::data(Bytes::from(e)))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let body = StreamBody::new(tokio_stream_from(rx));
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(BodyExt::boxed(body))
        .expect("response")
}

/// The receiver as a stream (no tokio-stream dependency needed).
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
