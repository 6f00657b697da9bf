//! The upstream side under a broken or hostile agent and a routinely closing upstream: slow
//! readers cannot starve other requests to the same host, and an upstream that closes its
//! connections every hundred requests (GOAWAY, as nginx does after `keepalive_requests`) costs
//! the agents nothing, and a response that streams reaches the agent as it comes (the pool
//! joins chunks that are already here, never waiting for more).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::Daemon;
use agenshield_e2e::pki::client_config;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::World;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLICY: &str =
    "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n";

/// The tests of this file run one at a time. How many streams a closing upstream connection
/// still takes depends on how soon the daemon reads its GOAWAY, i.e. on the machine's load:
/// alone the busiest connection carries 112–113 requests here; beside the other tests' daemons it
/// once carried 218 in six runs, and alone on a CI runner once 217 (so that test bounds the
/// median connection, not the busiest).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Held for the whole of a test of this file (taken before its world, dropped after it).
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().await
}

async fn world(goaway_every: Option<usize>) -> World {
    World::start(
        "pool upstream CA",
        &["api.test"],
        UpstreamOptions {
            name: "up".into(),
            goaway_every,
            ..Default::default()
        },
        POLICY,
    )
    .await
}

/// A TLS session with the transparent listener as the agent would have, for api.test.
async fn agent_tls(d: &Daemon, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tls = tokio_rustls::TlsConnector::from(client_config(&[&d.ca_pem], &[alpn]));
    let tcp = TcpStream::connect(d.transparent).await.expect("connect");
    tls.connect(ServerName::try_from("api.test").expect("name"), tcp)
        .await
        .expect("TLS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_stalled_downloads_do_not_slow_a_sixth_client() {
    let _one_at_a_time = one_at_a_time().await;
    let w = world(None).await;
    let port = w.up.addr.port();
    // Five agents ask for 64 MiB each and stop reading after the first bytes.
    let mut stalled = Vec::new();
    for _ in 0..5 {
        let mut s = agent_tls(&w.daemon, b"http/1.1").await;
        let ask = format!("GET /bytes/67108864 HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
        s.write_all(ask.as_bytes()).await.expect("write");
        let mut first = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut first))
            .await
            .expect("the download starts")
            .expect("read");
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        stalled.push(s);
    }
    // Let every window between them and the upstream fill.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A sixth agent, same host: 200 requests, each answered within 1 s.
    let s = agent_tls(&w.daemon, b"http/1.1").await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut slowest = Duration::ZERO;
    for i in 0..200 {
        let req = http::Request::get(format!("https://api.test:{port}/echo?n={i}"))
            .header("host", format!("api.test:{port}"))
            .body(Empty::<Bytes>::new())
            .expect("request");
        let started = Instant::now();
        let resp = tokio::time::timeout(Duration::from_secs(1), async {
            send.ready().await.expect("connection ready");
            let resp = send.send_request(req).await.expect("response");
            let status = resp.status();
            resp.into_body().collect().await.expect("body");
            status
        })
        .await
        .unwrap_or_else(|_| panic!("request {i} waited over 1 s"));
        assert_eq!(resp, 200, "request {i}");
        slowest = slowest.max(started.elapsed());
    }
    eprintln!("slowest of 200 beside five stalled downloads: {slowest:?}");
    drop(stalled);
}

/// The upstream sends `first` at once and `second` 3 s later: over HTTP/2 and HTTP/1.1 from
/// the agent, `first` arrives long before `second` exists, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_reaches_the_agent_as_it_comes() {
    let _one_at_a_time = one_at_a_time().await;
    let w = world(None).await;
    let port = w.up.addr.port();
    let gap = Duration::from_secs(3);
    for alpn in [&b"h2"[..], b"http/1.1"] {
        let s = agent_tls(&w.daemon, alpn).await;
        let io = TokioIo::new(s);
        let req = http::Request::get(format!("https://api.test:{port}/drip/{}", gap.as_millis()));
        let started = Instant::now();
        let resp = if alpn == b"h2" {
            let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .expect("h2 handshake");
            tokio::spawn(conn);
            let req = req.body(Empty::<Bytes>::new()).expect("request");
            send.send_request(req).await.expect("response")
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .expect("h1 handshake");
            tokio::spawn(conn);
            let req = req
                .header(http::header::HOST, format!("api.test:{port}"))
                .body(Empty::<Bytes>::new())
                .expect("request");
            send.send_request(req).await.expect("response")
        };
        assert_eq!(resp.status(), 200, "{}", String::from_utf8_lossy(alpn));
        let mut body = resp.into_body();
        let mut got = Vec::new();
        let mut first_at = None;
        while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("the stream goes on")
        {
            if let Ok(data) = frame.expect("frame").into_data() {
                got.extend_from_slice(&data);
            }
            if first_at.is_none() && got.starts_with(b"first\n") {
                first_at = Some(started.elapsed());
            }
        }
        let first_at = first_at.expect("first arrived");
        println!(
            "{}: first after {first_at:?}, all after {:?}",
            String::from_utf8_lossy(alpn),
            started.elapsed()
        );
        assert!(
            first_at < gap / 2,
            "{}: the first chunk waited {first_at:?} for the rest",
            String::from_utf8_lossy(alpn)
        );
        assert_eq!(got, b"first\nsecond\n");
        assert!(
            started.elapsed() >= gap,
            "the second chunk came after the gap"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_every_hundred_requests_costs_the_agent_nothing() {
    let _one_at_a_time = one_at_a_time().await;
    let w = world(Some(100)).await;
    let port = w.up.addr.port();
    // HTTP/2 from the agent, several streams at a time.
    let s = agent_tls(&w.daemon, b"h2").await;
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let total = 20_000;
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (mut send, next, failures) = (send.clone(), next.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                // Every fourth a POST: not idempotent, so only a provably unprocessed one may
                // be sent again.
                let req = if i % 4 == 0 {
                    http::Request::post(format!("https://api.test:{port}/echo?n={i}"))
                        .body(Full::new(Bytes::from(format!("payload {i}"))).boxed())
                } else {
                    http::Request::get(format!("https://api.test:{port}/echo?n={i}"))
                        .body(Empty::<Bytes>::new().boxed())
                }
                .expect("request");
                let outcome = match send.send_request(req).await {
                    Ok(resp) if resp.status() == 200 => resp
                        .into_body()
                        .collect()
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string()),
                    Ok(resp) => {
                        let status = resp.status();
                        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                        Err(format!("{status}: {:?}", body.unwrap_or_default()))
                    }
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = outcome {
                    failures
                        .lock()
                        .expect("lock")
                        .push(format!("request {i}: {e}"));
                }
            }
        }));
    }
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(300), worker)
            .await
            .expect("bounded")
            .expect("join");
    }
    let failures = std::mem::take(&mut *failures.lock().expect("lock"));
    eprintln!(
        "{total} h2 requests in {:?}, {} upstream requests seen, {} failures",
        started.elapsed(),
        w.up.requests().len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    // Each exactly once: only what the upstream provably did not process was sent again, and a
    // POST sent again carried its whole body.
    let requests = w.up.requests();
    for r in requests.iter().filter(|r| r.method == "POST") {
        let n = r.path_and_query.trim_start_matches("/echo?n=");
        let body = r.body.lock().expect("lock").clone();
        assert_eq!(body, format!("payload {n}").into_bytes(), "POST {n}");
    }
    let mut seen: Vec<String> = requests.into_iter().map(|r| r.path_and_query).collect();
    seen.sort();
    let twice: Vec<&String> = seen
        .windows(2)
        .filter(|p| p[0] == p[1])
        .map(|p| &p[0])
        .collect();
    if !twice.is_empty() {
        let logs = w.daemon.logs();
        let again: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("sending it again"))
            .map(|l| l.get(l.len().saturating_sub(300)..).unwrap_or(l))
            .collect();
        panic!("processed twice: {twice:?}; the daemon sent again: {again:#?}");
    }
    assert_eq!(seen.len(), total, "every request reached the upstream");
    // The upstream closed a connection every hundred requests: the proxy moved on to a new one
    // each time, without a failure above. A connection carries its hundred, the up to 16
    // already under way and those the proxy opened before the closing GOAWAY reached it (the
    // upstream's graceful shutdown accepts streams until its PING is answered). How many that
    // last group is depends on scheduling: alone here it is a dozen, but a CI runner that
    // stalls a few milliseconds lets one connection take 217. So the bound is on the typical
    // connection, the median, well under 150, and the proxy used each connection for its
    // hundred rather than a new connection for a few requests (at most total / 50).
    let mut per_conn: std::collections::HashMap<std::net::SocketAddr, usize> = Default::default();
    for r in w.up.requests() {
        *per_conn.entry(r.peer).or_default() += 1;
    }
    let mut carried: Vec<usize> = per_conn.values().copied().collect();
    carried.sort_unstable();
    let median = carried.get(carried.len() / 2).copied().unwrap_or(0);
    let busiest = carried.last().copied().unwrap_or(0);
    eprintln!(
        "{} upstream connections, carrying {median} requests (median), the busiest {busiest}",
        per_conn.len()
    );
    assert!(
        median < 150 && per_conn.len() <= total / 50,
        "{} upstream connections, the median carried {median}, the busiest {busiest}",
        per_conn.len()
    );
    let conns = per_conn;
    // Requests the upstream provably did not process are sent again and counted. Since each
    // agent connection is served on one thread with its upstream connections, the pool
    // learns of the upstream's GOAWAY before it opens another stream there, so this is
    // usually 0 here; nothing above may have failed either way.
    let metrics = metrics_text(&w.daemon).await;
    let retried: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("agenshield_proxy_upstream_retries_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    eprintln!(
        "{} upstream connections; retried transparently: {retried}",
        conns.len()
    );

    // HTTP/1.1 upstream connections (plain http through the explicit listener): a pooled
    // connection the upstream closed is not an error either.
    let proxy = format!("http://{}", w.daemon.explicit);
    let mut urls = Vec::new();
    for i in 0..400 {
        urls.push(format!("http://api.test:{port}/echo?h1={i}"));
    }
    let mut args = vec!["-sS", "--proxy", &proxy, "-w", "%{http_code}\n"];
    for url in &urls {
        args.extend(["-o", "/dev/null", url.as_str()]);
    }
    let out = tokio::process::Command::new("curl")
        .args(&args)
        .env_remove("http_proxy")
        .output()
        .await
        .expect("curl");
    let codes = String::from_utf8_lossy(&out.stdout);
    let bad = codes.lines().filter(|c| *c != "200").count();
    assert_eq!(codes.lines().count(), 400, "{codes}");
    let mut kinds: Vec<&str> = codes.lines().collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(bad, 0, "{bad} of 400 not 200: {kinds:?}");
}

/// The daemon's `/metrics` text.
async fn metrics_text(d: &Daemon) -> String {
    let url = format!("http://{}/metrics", d.metrics);
    agenshield_e2e::curl::curl(&[&url], false).await.text()
}
