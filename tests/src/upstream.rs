//! A real upstream server on 127.0.0.1 for end-to-end tests: one port speaks TLS
//! (h2 + http/1.1 via ALPN) and plain HTTP, and records every request it sees.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::{handshake::derive_accept_key, protocol::Role, Message};
use tokio_tungstenite::WebSocketStream;

use crate::pki::{server_config, TestLeaf};

type Body = BoxBody<Bytes, Infallible>;
const CHUNK: usize = 64 * 1024;
const TXT: &str = "text/plain";

/// How to run an [`Upstream`].
#[derive(Clone, Debug, Default)]
pub struct UpstreamOptions {
    /// Leaf to serve over TLS; `None` = plain HTTP only (TLS handshakes are then dropped).
    pub tls: Option<TestLeaf>,
    /// Shown in response bodies (`hello from {name}\n`), to tell upstreams apart.
    pub name: String,
    /// Close each connection gracefully once it has taken this many requests (HTTP/2: a
    /// `GOAWAY(NO_ERROR)`), as nginx does after `keepalive_requests` (1000 by default).
    pub goaway_every: Option<usize>,
    /// Serve `POST /oauth/token` (client credentials) for this client.
    pub oauth: Option<OauthClient>,
    /// Serve requests signed with AWS SigV4 as S3 and STS would, for this account.
    pub aws: Option<crate::aws::AwsAccount>,
    /// What `GET /content` answers (`application/octet-stream`, with its length): content
    /// the test put there, such as a file a content API would serve back.
    pub content: Option<Bytes>,
}

/// The one client a test token endpoint knows. Tokens are `access-token-000N`, N counting
/// up from 1 with each one issued.
#[derive(Clone, Debug)]
pub struct OauthClient {
    pub id: String,
    /// What the client must present; change it to revoke the old one.
    pub secret: Arc<Mutex<String>>,
    pub expires_in: u64,
    /// Tokens issued so far.
    pub issued: Arc<std::sync::atomic::AtomicUsize>,
}

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    pub path_and_query: String,
    pub version: http::Version,
    /// URI authority (h2 `:authority` or absolute-form) else the Host header.
    pub authority: Option<String>,
    /// Lower-case names, in received order.
    pub headers: Vec<(String, String)>,
    pub tls: bool,
    pub sni: Option<String>,
    pub alpn: Option<String>,
    pub peer: SocketAddr,
    /// Body bytes received so far (`/echo` only), filled as they arrive, so a body cut off
    /// mid-stream shows exactly what got through.
    pub body: Arc<Mutex<Vec<u8>>>,
}

/// A running upstream server; dropping it stops the server and all its connections.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    accept_task: tokio::task::JoinHandle<()>,
    _shutdown: watch::Sender<()>,
}

#[derive(Clone)]
struct ConnInfo {
    name: Arc<str>,
    tls: bool,
    sni: Option<String>,
    alpn: Option<String>,
    peer: SocketAddr,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    shutdown: watch::Receiver<()>,
    goaway_every: Option<usize>,
    oauth: Option<OauthClient>,
    aws: Option<crate::aws::AwsAccount>,
    content: Option<Bytes>,
}

impl Upstream {
    /// Binds 127.0.0.1:0 and serves TLS and plain HTTP on that one port (first byte 0x16 → TLS).
    pub async fn start(opts: UpstreamOptions) -> Upstream {
        let bound = TcpListener::bind(("127.0.0.1", 0)).await;
        Self::serve(bound.expect("bind 127.0.0.1:0"), opts)
    }

    /// Serves on a listener the caller bound (e.g. inside a network namespace).
    pub fn serve_std(listener: std::net::TcpListener, opts: UpstreamOptions) -> Upstream {
        listener.set_nonblocking(true).expect("nonblocking");
        Self::serve(
            TcpListener::from_std(listener).expect("tokio listener"),
            opts,
        )
    }

    fn serve(listener: TcpListener, opts: UpstreamOptions) -> Upstream {
        let addr = listener.local_addr().expect("local_addr");
        let cfg = opts
            .tls
            .as_ref()
            .map(|leaf| server_config(leaf, &[b"h2", b"http/1.1"]));
        let acceptor = cfg.map(TlsAcceptor::from);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (shutdown_tx, shutdown) = watch::channel(());
        let base = ConnInfo {
            name: opts.name.into(),
            tls: false,
            sni: None,
            alpn: None,
            peer: addr,
            seen: seen.clone(),
            shutdown,
            goaway_every: opts.goaway_every,
            oauth: opts.oauth.clone(),
            aws: opts.aws.clone(),
            content: opts.content.clone(),
        };
        let accept_task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        eprintln!("upstream {}: accept error: {e}", base.name);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                // As nginx (`tcp_nodelay on`): small writes go out at once, not after an ACK.
                let _ = stream.set_nodelay(true);
                let mut info = base.clone();
                info.peer = peer;
                spawn_guarded(&base.shutdown, handle_conn(stream, acceptor.clone(), info));
            }
        });
        Upstream {
            addr,
            seen,
            accept_task,
            _shutdown: shutdown_tx,
        }
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().expect("requests lock").clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Dropping `_shutdown` right after this ends every connection task.
        self.accept_task.abort();
    }
}

/// Runs `fut` until it finishes or the owning [`Upstream`] is dropped.
fn spawn_guarded(shutdown: &watch::Receiver<()>, fut: impl Future<Output = ()> + Send + 'static) {
    let mut shutdown = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.changed() => {}
            _ = fut => {}
        }
    });
}

/// Serves one connection; one that we close (`goaway_every`) is closed as nginx does
/// (`lingering_close`): our side is shut and what the client still sends is read and dropped
/// for a while, so the client reads every response before the end. (Closing a socket with unread bytes would send a reset instead, and
/// a reset can destroy responses the client has not read yet.)
async fn handle_conn(stream: TcpStream, acceptor: Option<TlsAcceptor>, info: ConnInfo) {
    let linger = stream
        .into_std()
        .and_then(|s| Ok((s.try_clone()?, s)))
        .and_then(|(linger, s)| Ok((TcpStream::from_std(linger)?, TcpStream::from_std(s)?)));
    let Ok((mut linger, stream)) = linger else {
        return eprintln!(
            "upstream {}: cannot keep the socket for a lingering close",
            info.name
        );
    };
    if serve_conn(stream, acceptor, info).await != Ended::ClosedByUs {
        return;
    }
    let _ = linger.shutdown().await;
    let mut sink = [0u8; 16 * 1024];
    let drain = async { while matches!(linger.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
}

/// How a served connection ended.
#[derive(PartialEq)]
enum Ended {
    /// The client closed it, it failed, or it was upgraded (the socket is still in use).
    Otherwise,
    /// We closed it gracefully after `goaway_every` requests.
    ClosedByUs,
}

async fn serve_conn(stream: TcpStream, acceptor: Option<TlsAcceptor>, mut info: ConnInfo) -> Ended {
    let mut first = [0u8; 1];
    if !matches!(stream.peek(&mut first).await, Ok(1)) {
        return Ended::Otherwise;
    }
    if first[0] != 0x16 {
        return serve(stream, info).await;
    }
    let Some(acceptor) = acceptor else {
        eprintln!("upstream {}: TLS but no leaf configured", info.name);
        return Ended::Otherwise;
    };
    match acceptor.accept(stream).await {
        Ok(tls) => {
            let conn = tls.get_ref().1;
            info.tls = true;
            info.sni = conn.server_name().map(str::to_owned);
            let alpn = conn.alpn_protocol().map(String::from_utf8_lossy);
            info.alpn = alpn.map(Into::into);
            serve(tls, info).await
        }
        Err(e) => {
            eprintln!("upstream {}: TLS handshake: {e}", info.name);
            Ended::Otherwise
        }
    }
}

/// HTTP/1.1 or h2 (by preface, which also covers h2c prior knowledge) with upgrades.
async fn serve(io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static, info: ConnInfo) -> Ended {
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let enough = Arc::new(tokio::sync::Notify::new());
    let every = info.goaway_every;
    let svc = {
        let (taken, enough) = (taken.clone(), enough.clone());
        service_fn(move |req| {
            let n = taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if every.is_some_and(|every| n == every) {
                enough.notify_one();
            }
            route(req, info.clone())
        })
    };
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::pin!(conn);
    let (served, ended) = tokio::select! {
        r = conn.as_mut() => (r, Ended::Otherwise),
        () = enough.notified() => {
            conn.as_mut().graceful_shutdown();
            (conn.as_mut().await, Ended::ClosedByUs)
        }
    };
    if let Err(e) = served {
        eprintln!("upstream: connection error: {e}");
    }
    ended
}

fn text(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = status;
    let ctype = http::HeaderValue::from_static(ctype);
    resp.headers_mut().insert(header::CONTENT_TYPE, ctype);
    resp
}

/// A JSON-RPC server that answers every call with what it was asked (`result.method`,
/// `result.name`: the tool), and `tools/list` with tools `a` and `b`: a batch with an array,
/// one message with one; nothing owed (only notifications): 202. `sse`: each answer as an
/// event of a `text/event-stream` instead.
fn jsonrpc(body: &[u8], sse: bool) -> Response<Body> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return text(StatusCode::BAD_REQUEST, TXT, "not JSON\n");
    };
    let (batch, items) = match v {
        serde_json::Value::Array(items) => (true, items),
        one => (false, vec![one]),
    };
    let answers: Vec<serde_json::Value> = items
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.clone();
            let method = m.get("method")?.as_str()?;
            let result = if method == "tools/list" {
                serde_json::json!({"tools": [{"name": "a"}, {"name": "b"}]})
            } else {
                serde_json::json!({"method": method, "name": m.pointer("/params/name")})
            };
            Some(serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}))
        })
        .collect();
    if answers.is_empty() {
        let mut resp = text(StatusCode::ACCEPTED, TXT, "");
        resp.headers_mut().remove(header::CONTENT_TYPE);
        return resp;
    }
    if sse {
        let events: String = answers
            .iter()
            .map(|a| format!("event: message\ndata: {a}\n\n"))
            .collect();
        return text(StatusCode::OK, "text/event-stream", events);
    }
    let json = if batch {
        serde_json::Value::Array(answers)
    } else {
        answers.into_iter().next().unwrap_or_default()
    };
    text(StatusCode::OK, "application/json", json.to_string())
}

async fn route(mut req: Request<Incoming>, info: ConnInfo) -> Result<Response<Body>, Infallible> {
    let seen = record(&req, &info);
    let path = req.uri().path().to_owned();
    let num = |prefix: &str| path.strip_prefix(prefix)?.parse::<u64>().ok();
    let resp = if let (Some(account), true) = (&info.aws, crate::aws::is_signed(req.headers())) {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        seen.body
            .lock()
            .expect("body lock")
            .extend_from_slice(&body);
        let host = seen.authority.clone().unwrap_or_default();
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let a = account.serve(&parts.method, &host, pq, &parts.headers, &body);
        let mut resp = Response::builder()
            .status(a.status)
            .header(header::CONTENT_TYPE, a.content_type);
        if let Some(etag) = &a.etag {
            resp = resp.header(header::ETAG, etag);
        }
        resp.body(BodyExt::boxed(
            http_body_util::Full::new(Bytes::from(a.body)).map_err(|e| match e {}),
        ))
        .expect("valid response")
    } else if path == "/jsonrpc" || path == "/jsonrpc-sse" {
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        let body = body.unwrap_or_default();
        seen.body
            .lock()
            .expect("body lock")
            .extend_from_slice(&body);
        jsonrpc(&body, path == "/jsonrpc-sse")
    } else if path.starts_with("/echo") {
        let mut body = req.into_body();
        let mut body_len = 0;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(d) = frame.data_ref() {
                body_len += d.len();
                seen.body.lock().expect("body lock").extend_from_slice(d);
            }
        }
        let mut headers = std::collections::BTreeMap::<&str, String>::new();
        for (k, v) in &seen.headers {
            let join = |old: &mut String| *old = format!("{old}, {v}");
            let entry = headers.entry(k).and_modify(join);
            entry.or_insert_with(|| v.clone());
        }
        let json = serde_json::json!({
            "method": seen.method, "path": seen.path_and_query,
            "version": format!("{:?}", seen.version), "authority": seen.authority,
            "headers": headers, "body_len": body_len, "tls": seen.tls, "sni": seen.sni,
            "alpn": seen.alpn, "name": &*info.name,
        });
        text(StatusCode::OK, "application/json", json.to_string())
    } else if let Some(n) = num("/bytes/") {
        bytes_response(n)
    } else if let Some(code) = num("/status/") {
        match u16::try_from(code).map(StatusCode::from_u16) {
            Ok(Ok(s)) if (200..600).contains(&code) => {
                let body = match code {
                    204 | 304 => String::new(),
                    _ => format!("status {code}\n"),
                };
                text(s, TXT, body)
            }
            _ => text(StatusCode::BAD_REQUEST, TXT, "bad status code\n"),
        }
    } else if let Some(ms) = num("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        text(StatusCode::OK, TXT, format!("slept {ms}ms\n"))
    } else if let Some(ms) = num("/drip/") {
        drip_response(Duration::from_millis(ms))
    } else if path == "/split" {
        split_echo(&seen)
    } else if let (Some(content), "/content") = (&info.content, path.as_str()) {
        Response::builder()
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .header(header::CONTENT_LENGTH, content.len())
            .body(Full::new(content.clone()).boxed())
            .expect("valid response")
    } else if path == "/reason" {
        reason_response(req.uri().query().unwrap_or(""))
    } else if path == "/pause" {
        pause_response(req.uri().query().unwrap_or(""))
    } else if path == "/ws" {
        websocket(&mut req, &info)
    } else if let (Some(client), "/oauth/token") = (&info.oauth, path.as_str()) {
        let creds = basic_credentials(req.headers());
        let body = req.into_body().collect().await.map(|b| b.to_bytes());
        oauth_token(client, creds, &body.unwrap_or_default())
    } else {
        text(StatusCode::OK, TXT, format!("hello from {}\n", info.name))
    };
    Ok(resp)
}

fn lossy(v: &http::HeaderValue) -> String {
    String::from_utf8_lossy(v.as_bytes()).into_owned()
}

fn record(req: &Request<Incoming>, info: &ConnInfo) -> SeenRequest {
    let uri = req.uri();
    let host = req.headers().get(header::HOST).map(lossy);
    let headers = req.headers().iter().map(|(k, v)| (k.to_string(), lossy(v)));
    let seen = SeenRequest {
        method: req.method().to_string(),
        path_and_query: uri.path_and_query().map_or("/".into(), |p| p.to_string()),
        version: req.version(),
        authority: uri.authority().map(|a| a.to_string()).or(host),
        headers: headers.collect(),
        tls: info.tls,
        sni: info.sni.clone(),
        alpn: info.alpn.clone(),
        peer: info.peer,
        body: Arc::default(),
    };
    info.seen.lock().expect("requests lock").push(seen.clone());
    seen
}

/// `first\n` at once, `second\n` after `gap`: a stream whose first bytes must reach the
/// client before the rest exists.
fn drip_response(gap: Duration) -> Response<Body> {
    let stream = futures_util::stream::unfold(0u8, move |step| async move {
        let chunk: &'static [u8] = match step {
            0 => b"first\n",
            1 => {
                tokio::time::sleep(gap).await;
                b"second\n"
            }
            _ => return None,
        };
        Some((
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(chunk))),
            step + 1,
        ))
    });
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// `/reason?text=T&header=H`: 200 with the reason phrase T (HTTP/1.1) and a header named H
/// (value `1`): free text an upstream controls outside header values and the body.
fn reason_response(query: &str) -> Response<Body> {
    let mut resp = text(StatusCode::OK, TXT, "reason\n");
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "text" => {
                if let Ok(r) = hyper::ext::ReasonPhrase::try_from(v.as_bytes().to_vec()) {
                    resp.extensions_mut().insert(r);
                }
            }
            "header" => {
                if let Ok(n) = http::HeaderName::from_bytes(v.as_bytes()) {
                    resp.headers_mut()
                        .insert(n, http::HeaderValue::from_static("1"));
                }
            }
            _ => {}
        }
    }
    resp
}

/// `/pause?first=TEXT&gap=MS`: TEXT (percent-decoded) at once, then `END\n` after MS
/// milliseconds (default 1500): what reaches the client before the pause is what the proxy
/// released without waiting for more.
fn pause_response(query: &str) -> Response<Body> {
    let mut first = Vec::new();
    let mut gap = Duration::from_millis(1500);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "first" => first = v.as_bytes().to_vec(),
            "gap" => gap = Duration::from_millis(v.parse().unwrap_or(1500)),
            _ => {}
        }
    }
    let first = Bytes::from(first);
    let stream = futures_util::stream::unfold(0u8, move |step| {
        let first = first.clone();
        async move {
            let chunk = match step {
                0 => first,
                1 => {
                    tokio::time::sleep(gap).await;
                    Bytes::from_static(b"END\n")
                }
                _ => return None,
            };
            Some((Ok::<_, Infallible>(Frame::data(chunk)), step + 1))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, TXT)
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response")
}

/// Streams exactly `n` bytes (byte i = i % 251) in 64 KiB chunks sliced from one shared buffer.
fn bytes_response(n: u64) -> Response<Body> {
    let pattern = Bytes::from_iter((0..CHUNK + 251).map(|i| (i % 251) as u8));
    let stream = futures_util::stream::unfold(0u64, move |off| {
        let len = (n.saturating_sub(off)).min(CHUNK as u64) as usize;
        let start = (off % 251) as usize;
        let frame = Frame::data(pattern.slice(start..start + len));
        let item = (len > 0).then(|| (Ok::<_, Infallible>(frame), off + len as u64));
        std::future::ready(item)
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, n)
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response")
}

/// Echoes the request's Authorization in a response header and in a body sent 3 bytes at a
/// time (a few ms apart, so each is its own read at the proxy): a credential split across
/// chunks.
fn split_echo(seen: &SeenRequest) -> Response<Body> {
    let auth = seen
        .headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let text = Bytes::from(format!("you sent: {auth}\nend\n"));
    let stream = futures_util::stream::unfold(0usize, move |off| {
        let text = text.clone();
        async move {
            if off >= text.len() {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
            let end = (off + 3).min(text.len());
            Some((Ok::<_, Infallible>(Frame::data(text.slice(off..end))), end))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, TXT)
        .header("x-seen-authorization", auth)
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .expect("valid response")
}

/// `Authorization: Basic` as (id, secret), URL-decoded (RFC 6749 §2.3.1).
fn basic_credentials(h: &http::HeaderMap) -> Option<(String, String)> {
    use base64::Engine as _;
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let b64 = v.strip_prefix("Basic ")?;
    let pair = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let pair = String::from_utf8(pair).ok()?;
    let (id, secret) = pair.split_once(':')?;
    let dec = |s: &str| {
        form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    };
    Some((dec(id)?, dec(secret)?))
}

/// A client credentials token endpoint: Basic or form credentials, checked against the one
/// client it knows.
fn oauth_token(
    client: &OauthClient,
    basic: Option<(String, String)>,
    body: &[u8],
) -> Response<Body> {
    const JSON: &str = "application/json";
    let form: std::collections::HashMap<String, String> =
        form_urlencoded::parse(body).into_owned().collect();
    if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
        let e = r#"{"error":"unsupported_grant_type"}"#;
        return text(StatusCode::BAD_REQUEST, JSON, e);
    }
    let creds = basic.or_else(|| {
        Some((
            form.get("client_id")?.clone(),
            form.get("client_secret")?.clone(),
        ))
    });
    let good = client.secret.lock().expect("secret lock").clone();
    if creds != Some((client.id.clone(), good)) {
        let e = r#"{"error":"invalid_client","error_description":"client authentication failed"}"#;
        return text(StatusCode::UNAUTHORIZED, JSON, e);
    }
    let n = client
        .issued
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        + 1;
    let body = serde_json::json!({
        "access_token": format!("access-token-{n:04}"),
        "token_type": "Bearer",
        "expires_in": client.expires_in,
    });
    text(StatusCode::OK, JSON, body.to_string())
}

/// HTTP/1.1 Upgrade to a WebSocket that echoes text and binary messages, and records them
/// (the request's `body`, one line each).
fn websocket(req: &mut Request<Incoming>, info: &ConnInfo) -> Response<Body> {
    let headers = req.headers();
    let upgrade = headers.get(header::UPGRADE).map(lossy).unwrap_or_default();
    let key = headers.get(header::SEC_WEBSOCKET_KEY);
    let Some(accept) = key.filter(|_| upgrade.eq_ignore_ascii_case("websocket")) else {
        return text(StatusCode::BAD_REQUEST, TXT, "expected websocket upgrade\n");
    };
    let accept = derive_accept_key(accept.as_bytes());
    // Each message received is appended to the request's body, a newline after each.
    let received = record(req, info).body;
    let on_upgrade = hyper::upgrade::on(req);
    spawn_guarded(&info.shutdown, async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => return eprintln!("upstream: websocket upgrade failed: {e}"),
        };
        let mut ws = WebSocketStream::from_raw_socket(upgraded, Role::Server, None).await;
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Text(_) | Message::Binary(_) = &msg {
                let mut got = received.lock().expect("body lock");
                got.extend_from_slice(&msg.clone().into_data());
                got.push(b'\n');
            }
            if matches!(msg, Message::Text(_) | Message::Binary(_)) && ws.send(msg).await.is_err() {
                break;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Full::new(Bytes::new()).boxed())
        .expect("valid response")
}

/// A raw TCP server on 127.0.0.1 that echoes what it gets, until the test ends.
pub async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}
