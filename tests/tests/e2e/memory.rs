//! Memory after a burst: once a burst of connections has closed, the daemon gives back what
//! it used, within seconds (issue 33: 10,000 TLS sessions left it at 214 MB, from 20 MB idle,
//! long after they closed). The real daemon, real TLS sessions on loopback, its resident set
//! read from /proc.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::pki::{client_config, TestCa};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "upstream"
hosts = ["burst.test"]
action = "allow"
"#;

/// Sessions held at once: enough that what they use dwarfs the idle daemon.
const SESSIONS: usize = 2_000;
/// TLS handshakes in flight at a time.
const PARALLEL: usize = 100;
/// How long after the last session closed the daemon has to give the memory back.
const GIVE_BACK_WITHIN: Duration = Duration::from_secs(5);

/// One keep-alive HTTP/1.1 session through the transparent listener, open until dropped.
struct Session {
    _send: SendRequest<Empty<Bytes>>,
    conn: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

async fn session(daemon: &Daemon, tls: &TlsConnector, port: u16) -> Session {
    let tcp = TcpStream::connect(daemon.transparent)
        .await
        .expect("connect to the transparent listener");
    let name = ServerName::try_from("burst.test").expect("server name");
    let stream = tls.connect(name, tcp).await.expect("TLS to the proxy");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1");
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = http::Request::get("/bytes/1024")
        .header("host", format!("burst.test:{port}"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.len(), 1024);
    Session { _send: send, conn }
}

/// `SESSIONS` sessions, at most `PARALLEL` handshakes at a time.
async fn open_sessions(daemon: &Arc<Daemon>, tls: &TlsConnector, port: u16) -> Vec<Session> {
    let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL));
    let mut opening = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        let (daemon, tls, gate) = (daemon.clone(), tls.clone(), gate.clone());
        opening.push(tokio::spawn(async move {
            let _turn = gate.acquire_owned().await.expect("gate");
            session(&daemon, &tls, port).await
        }));
    }
    let mut open = Vec::with_capacity(SESSIONS);
    for s in opening {
        open.push(s.await.expect("session task"));
    }
    open
}

/// Back near idle: within twice the idle daemon's resident memory.
fn settled(rss_kib: u64, idle_kib: u64) -> bool {
    rss_kib <= 2 * idle_kib
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_goes_back_within_seconds_after_a_burst_of_tls_sessions() {
    let ca = TestCa::new("burst upstream CA");
    let up = Upstream::start(UpstreamOptions {
        tls: Some(ca.leaf(&["burst.test"])),
        name: "burst".into(),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("upstream-ca.pem");
    ca.write_pem(&ca_file).expect("write CA");
    let daemon = Arc::new(Daemon::start(DaemonOptions {
        policies: vec![("burst.toml".into(), POLICY.into())],
        extra_ca: vec![ca_file],
        hosts: vec![("burst.test".into(), IpAddr::V4(Ipv4Addr::LOCALHOST))],
        orig_dst: Some(up.addr),
        limits: vec![
            format!("max_connections = {}", SESSIONS + 100),
            format!("max_connections_per_agent = {}", SESSIONS + 100),
        ],
        ..Default::default()
    }));
    let tls = TlsConnector::from(client_config(&[&daemon.ca_pem], &[b"http/1.1"]));
    let port = up.addr.port();

    // Warm up (leaf minted, upstream pool, first allocations), then the idle figure.
    drop(futures_util::future::join_all((0..8).map(|_| session(&daemon, &tls, port))).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = daemon.rss_kib();

    let sessions = open_sessions(&daemon, &tls, port).await;
    let held = daemon.rss_kib();
    assert!(
        held >= idle + SESSIONS as u64 * 10,
        "{SESSIONS} sessions should cost the daemon memory: idle {idle} KiB, held {held} KiB"
    );
    drop(sessions);
    let closed = Instant::now();

    let mut samples = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let rss = daemon.rss_kib();
        samples.push((closed.elapsed().as_millis(), rss));
        if settled(rss, idle) {
            break;
        }
        assert!(
            closed.elapsed() < GIVE_BACK_WITHIN,
            "idle {idle} KiB, held {held} KiB; after the sessions closed (ms, KiB): {samples:?}"
        );
    }
    eprintln!("idle {idle} KiB, held {held} KiB; after close (ms, KiB): {samples:?}");

    // And the daemon still serves.
    drop(session(&daemon, &tls, port).await);
}

/// Idle HTTP/1.1 upstream connections the pool keeps per host and connection thread
/// (`upstream/pool`: `MAX_IDLE`).
const MAX_IDLE: usize = 32;

fn open_fds(daemon: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .expect("daemon fds")
        .count()
}

/// One plain HTTP/1.1 request through the transparent listener on its own connection, which
/// closes after the response.
async fn plain_request(daemon: &Daemon, port: u16, path: &str) {
    let tcp = TcpStream::connect(daemon.transparent)
        .await
        .expect("connect to the transparent listener");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("HTTP/1.1");
    let conn = tokio::spawn(conn);
    let req = http::Request::get(path)
        .header("host", format!("burst.test:{port}"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let resp = send.send_request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body");
    conn.abort();
}

/// A burst of requests to one plain-HTTP upstream dials one upstream connection per request
/// in flight; once it is over the pool keeps at most `MAX_IDLE` of them per connection thread,
/// not all of them until `upstream_idle_timeout` (90 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_leaves_a_bounded_number_of_idle_upstream_connections() {
    let up = Upstream::start(UpstreamOptions {
        name: "burst".into(),
        ..Default::default()
    })
    .await;
    // The daemon's connection threads: one per CPU, each with its own pool.
    let shards = std::thread::available_parallelism().map_or(1, |n| n.get());
    let burst = 2 * MAX_IDLE * shards;
    let daemon = Arc::new(Daemon::start(DaemonOptions {
        policies: vec![("burst.toml".into(), POLICY.into())],
        hosts: vec![("burst.test".into(), IpAddr::V4(Ipv4Addr::LOCALHOST))],
        orig_dst: Some(up.addr),
        limits: vec![
            format!("max_connections = {}", burst + 100),
            format!("max_connections_per_agent = {}", burst + 100),
        ],
        ..Default::default()
    }));
    let port = up.addr.port();
    plain_request(&daemon, port, "/bytes/16").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = open_fds(&daemon);

    // Every request waits 1.5 s upstream, so all of them are in flight at once.
    let requests: Vec<_> = (0..burst)
        .map(|_| {
            let daemon = daemon.clone();
            tokio::spawn(async move { plain_request(&daemon, port, "/slow/1500").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let in_flight = open_fds(&daemon);
    for r in requests {
        r.await.expect("request");
    }
    // Each request in flight holds its client's connection and an upstream one.
    assert!(
        in_flight >= base + burst + burst / 2,
        "the burst should have had an upstream connection per request: {base} fds before, \
         {in_flight} with {burst} requests in flight"
    );

    let done = Instant::now();
    let bound = base + MAX_IDLE * shards;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let fds = open_fds(&daemon);
        if fds <= bound {
            break;
        }
        assert!(
            done.elapsed() < Duration::from_secs(5),
            "{fds} fds open 5 s after a burst of {burst} requests ({base} before it): the pool \
             should keep at most {MAX_IDLE} idle connections per connection thread ({shards})"
        );
    }
}
