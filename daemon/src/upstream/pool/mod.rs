//! Upstream connections, kept and shared. Every connection is dialed through our `Dialer`
//! (our resolver, the private-address guard, the exact address checked) and, for `https`,
//! verified with rustls; ALPN says whether the upstream speaks HTTP/2.
//!
//! HTTP/2 connections are shared: a request goes to the least loaded one of its host, and a new
//! one is opened once every connection carries [`STREAMS_PER_CONN`] streams (up to
//! [`MAX_SHARED`] per host). Each connection's flow-control window is that many stream windows,
//! so streams whose readers stall can hold at most their own windows: never the connection's,
//! never the others' (at most `MAX_SHARED × STREAMS_PER_CONN × STREAM_WINDOW` bytes per host
//! wait for slow readers). HTTP/1.1 connections carry one request at a time and go back to the
//! pool when its response has been read to the end.
//!
//! A request the upstream provably did not process is sent again on another connection, up to
//! [`ATTEMPTS`] times in all ([`retry`]): one a closed connection never took (HTTP/1.1 and
//! HTTP/2), and, when its body is small enough to have been kept ([`replay::REPLAY_LIMIT`]),
//! one refused with `REFUSED_STREAM` or above the last stream id of the upstream's `GOAWAY`
//! (servers such as nginx close connections this way every thousand requests). Both are
//! protocol facts h2 reports ([`h2_client`]), never guesses from timing. A connection that has
//! received a `GOAWAY` lends no new stream ([`Shared::usable`], asked at every checkout).

mod h2_client;
mod replay;
mod retry;
mod returning;
mod shared;

use crate::flush_coalesce::Coalesced;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;

use crate::body::joined::Joined;
use crate::body::ProxyBody;
use crate::upstream::dial::Dialer;
use h2_client::StreamFailure;
use retry::{Failed, ATTEMPTS};
use returning::Returning;
use shared::{Shared, Stream};

pub(crate) use retry::Retry;

/// HTTP/2 stream window towards upstreams: enough for ~100 MB/s per stream at 10 ms RTT.
const STREAM_WINDOW: u32 = 1024 * 1024;
/// Streams a shared connection carries before another is opened.
const STREAMS_PER_CONN: usize = 32;
/// A connection's window: room for every stream's, so stalled streams cannot exhaust it.
const CONNECTION_WINDOW: u32 = STREAM_WINDOW * STREAMS_PER_CONN as u32;
/// Shared connections per host at most (then the least loaded takes more streams).
const MAX_SHARED: usize = 8;
/// Idle HTTP/1.1 connections kept per host (and connection thread), the newest: a burst of
/// 200 requests in flight otherwise left 200 (11 MB, 200 descriptors) for 90 s.
const MAX_IDLE: usize = 32;
/// The largest response head an upstream may send over HTTP/2.
const MAX_HEADER_LIST: u32 = 256 * 1024;

/// The address an upstream response came from: the one we dialed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpstreamAddr(pub SocketAddr);

/// Where a request goes, and from which connection thread: each shard
/// (`conn::shards`) keeps its own upstream connections, whose tasks run beside the requests
/// that use them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub tls: bool,
    pub host: Arc<str>,
    pub port: u16,
    pub shard: usize,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    #[error(transparent)]
    Dial(#[from] crate::upstream::dial::DialError),
    #[error("TLS with the upstream: {0}")]
    Tls(#[source] std::io::Error),
    #[error("{0:?} is not a name TLS can verify")]
    Name(String),
    #[error("the upstream's HTTP connection failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the upstream's HTTP/2 connection failed: {0}")]
    Http2(#[from] h2::Error),
}

pub(crate) struct Pool {
    dialer: Arc<Dialer>,
    /// ALPN h2 and http/1.1.
    tls_any: tokio_rustls::TlsConnector,
    /// ALPN http/1.1 only: upgrades need HTTP/1.1 end to end.
    tls_h1: tokio_rustls::TlsConnector,
    idle_timeout: Duration,
    hosts: Mutex<HashMap<Key, Host>>,
    next_id: AtomicU64,
    /// `agenshield_proxy_upstream_retries_total{reason}`.
    retries: prometheus::IntCounterVec,
}

#[derive(Default)]
struct Host {
    /// What ALPN said last time; `None`: not asked yet.
    speaks_h2: Option<bool>,
    shared: Vec<Shared>,
    idle: Vec<Idle>,
    /// One dial of a shareable connection at a time, so a burst of first requests does not
    /// open one connection each.
    dial_gate: Arc<tokio::sync::Mutex<()>>,
}

/// An HTTP/1.1 connection, carrying one request at a time.
struct Own {
    send: http1::SendRequest<ProxyBody>,
    /// The address dialed: the upstream's, or the operator's proxy's.
    addr: SocketAddr,
    form: Form,
}

/// How an HTTP/1.1 connection names the request's target.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `GET /path` to the upstream itself (directly or through a `CONNECT` tunnel).
    Origin,
    /// `GET http://host/path` to the operator's proxy (plain HTTP through `[upstream] proxy`).
    Absolute,
}

/// An HTTP/1.1 connection waiting for its next request.
struct Idle {
    own: Own,
    since: Instant,
}

/// A connection checked out for one request.
enum Conn {
    Shared(Stream),
    Own(Own),
}

impl Pool {
    pub(crate) fn new(
        dialer: Arc<Dialer>,
        tls: rustls::ClientConfig,
        idle_timeout: Duration,
        retries: prometheus::IntCounterVec,
    ) -> Arc<Pool> {
        let with_alpn = |alpn: &[&[u8]]| {
            let mut c = tls.clone();
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            tokio_rustls::TlsConnector::from(Arc::new(c))
        };
        let pool = Arc::new(Pool {
            dialer,
            tls_any: with_alpn(&[b"h2", b"http/1.1"]),
            tls_h1: with_alpn(&[b"http/1.1"]),
            idle_timeout,
            hosts: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            retries,
        });
        // Idle connections are closed even when nothing asks for their host again.
        let weak = Arc::downgrade(&pool);
        tokio::spawn(sweep(weak, idle_timeout.min(Duration::from_secs(30))));
        pool
    }

    /// Sends `req` to `key`, on a shared HTTP/2 connection when the upstream speaks it (never
    /// for an `upgrade`), and again on another connection while the upstream provably did not
    /// process it (up to [`ATTEMPTS`] times in all).
    pub(crate) async fn send(
        self: &Arc<Self>,
        key: &Key,
        req: Request<ProxyBody>,
        upgrade: bool,
    ) -> Result<Response<ProxyBody>, PoolError> {
        let (mut req, replay) = replay::replayable(req, upgrade).await;
        let mut attempt = 1;
        loop {
            let conn = self.checkout(key, upgrade).await?;
            let failed = match self.send_on(key, conn, req).await {
                Ok(resp) => return Ok(resp),
                Err(failed) => failed,
            };
            let (again, why, e) = match failed {
                Failed::NotSent(req, e) if attempt < ATTEMPTS => (*req, Retry::NotSent, e),
                Failed::Unprocessed(why, e) if attempt < ATTEMPTS => match &replay {
                    Some(replay) => (replay.request(), why.into(), e),
                    None => return Err(e),
                },
                failed => return Err(failed.into_error()),
            };
            tracing::debug!(
                attempt,
                reason = why.as_str(),
                "the upstream did not process the request ({e}); sending it again"
            );
            self.retries.with_label_values(&[why.as_str()]).inc();
            req = again;
            attempt += 1;
        }
    }

    async fn send_on(
        self: &Arc<Self>,
        key: &Key,
        conn: Conn,
        req: Request<ProxyBody>,
    ) -> Result<Response<ProxyBody>, Failed> {
        match conn {
            Conn::Shared(s) => match h2_client::send(&s.send, req).await {
                Ok(resp) => Ok(finish(resp, s.addr, move |b| {
                    crate::body::guarded(crate::body::stream(b), s.in_flight)
                })),
                Err(failure) => {
                    // It is going away (or gone): no further request goes there.
                    self.forget(key, s.id);
                    Err(match failure {
                        StreamFailure::NotOpened(req, e) => {
                            tracing::debug!(conn = s.id, "upstream connection took no stream: {e}");
                            Failed::NotSent(req, e.into())
                        }
                        StreamFailure::Unprocessed(why, stream, e) => {
                            tracing::debug!(
                                conn = s.id,
                                stream = u32::from(stream),
                                ?why,
                                "upstream stream not processed: {e}"
                            );
                            Failed::Unprocessed(why, e.into())
                        }
                        StreamFailure::Failed(stream, e) => {
                            tracing::debug!(
                                conn = s.id,
                                stream = u32::from(stream),
                                "upstream stream failed: {e}"
                            );
                            Failed::Other(e.into())
                        }
                    })
                }
            },
            Conn::Own(mut own) => {
                if let Err(e) = own.send.ready().await {
                    return Err(Failed::Other(e.into()));
                }
                let req = match own.form {
                    Form::Origin => origin_form(req),
                    Form::Absolute => self.absolute_form(req),
                };
                match own.send.try_send_request(req).await {
                    Ok(resp) => {
                        let addr = own.addr;
                        let back = Returning {
                            pool: Arc::downgrade(self),
                            key: key.clone(),
                            own,
                        };
                        Ok(finish(resp, addr, move |b| back.wrap(b)))
                    }
                    Err(mut e) => match e.take_message() {
                        Some(req) => Err(Failed::NotSent(Box::new(req), e.into_error().into())),
                        None => Err(Failed::Other(e.into_error().into())),
                    },
                }
            }
        }
    }

    /// A connection for one request: a shared one with room, an idle one, or a new one.
    /// (Dialing is boxed: its future, with the resolver's, TLS's and the handshakes', is
    /// several KiB, and every request's future would carry and copy it though most reuse.)
    async fn checkout(self: &Arc<Self>, key: &Key, upgrade: bool) -> Result<Conn, PoolError> {
        if let Some(conn) = self.reuse(key, upgrade) {
            return Ok(conn);
        }
        let shareable = !upgrade && key.tls && self.speaks_h2(key) != Some(false);
        if !shareable {
            return Box::pin(self.dial(key, upgrade)).await;
        }
        let gate = self.gate(key);
        let _one_at_a_time = gate.lock().await;
        // Someone else may have just opened one.
        if let Some(conn) = self.reuse(key, upgrade) {
            return Ok(conn);
        }
        Box::pin(self.dial(key, upgrade)).await
    }

    fn speaks_h2(&self, key: &Key) -> Option<bool> {
        self.lock().get(key).and_then(|h| h.speaks_h2)
    }

    fn gate(&self, key: &Key) -> Arc<tokio::sync::Mutex<()>> {
        self.lock()
            .entry(key.clone())
            .or_default()
            .dial_gate
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Host>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection already open that can take the request, if any.
    fn reuse(&self, key: &Key, upgrade: bool) -> Option<Conn> {
        let mut hosts = self.lock();
        let host = hosts.get_mut(key)?;
        let now = Instant::now();
        host.prune(now, self.idle_timeout);
        if !upgrade {
            let full = host.shared.len() >= MAX_SHARED;
            let least = host
                .shared
                .iter_mut()
                .min_by_key(|c| c.active.load(Ordering::Relaxed));
            if let Some(c) = least {
                let load = c.active.load(Ordering::Relaxed);
                // Every connection carries its share and no more may open: the least loaded
                // takes more.
                if load < STREAMS_PER_CONN || full {
                    return Some(Conn::Shared(c.stream(now)));
                }
            }
        }
        // The most recently used idle connection (the likeliest to be alive); an upgrade
        // needs one to the upstream itself, not to a proxy.
        let usable = host
            .idle
            .iter()
            .rposition(|c| !upgrade || c.own.form == Form::Origin)?;
        Some(Conn::Own(host.idle.remove(usable).own))
    }

    /// Dials, verifies, and sets up HTTP/2 or HTTP/1.1 as ALPN says. Plain HTTP through the
    /// operator's proxy goes to the proxy itself (an upgrade through a tunnel instead).
    async fn dial(self: &Arc<Self>, key: &Key, upgrade: bool) -> Result<Conn, PoolError> {
        if !key.tls && !upgrade {
            if let Some(dialed) = self.dialer.dial_proxy().await {
                let (tcp, addr) = dialed?;
                return own(TokioIo::new(tcp), addr, Form::Absolute).await;
            }
        }
        let (tcp, addr) = self.dialer.dial(&key.host, key.port).await?;
        if !key.tls {
            return own(TokioIo::new(tcp), addr, Form::Origin).await;
        }
        let name = ServerName::try_from(key.host.to_string())
            .map_err(|_| PoolError::Name(key.host.to_string()))?;
        let tls = if upgrade { &self.tls_h1 } else { &self.tls_any };
        let stream = tls.connect(name, tcp).await.map_err(PoolError::Tls)?;
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        if !upgrade {
            if let Some(host) = self.lock().get_mut(key) {
                host.speaks_h2 = Some(h2);
            }
        }
        if !h2 {
            return own(TokioIo::new(stream), addr, Form::Origin).await;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (send, conn) = h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake::<_, Bytes>(Coalesced::new(stream))
            .await?;
        tracing::debug!(conn = id, %addr, "upstream HTTP/2 connection open");
        tokio::spawn(async move {
            match conn.await {
                Ok(()) => tracing::debug!(conn = id, "upstream HTTP/2 connection ended"),
                Err(e) => tracing::debug!(conn = id, "upstream HTTP/2 connection ended: {e}"),
            }
        });
        let mut shared = Shared::new(id, send, addr);
        let stream = shared.stream(Instant::now());
        self.lock()
            .entry(key.clone())
            .or_default()
            .shared
            .push(shared);
        Ok(Conn::Shared(stream))
    }

    /// Takes a shared connection out of use (it failed a request: it is going away).
    fn forget(&self, key: &Key, id: u64) {
        if let Some(host) = self.lock().get_mut(key) {
            host.shared.retain(|c| c.id != id);
        }
    }

    fn give_back(&self, key: &Key, own: Own) {
        if own.send.is_closed() {
            return;
        }
        let mut hosts = self.lock();
        let idle = &mut hosts.entry(key.clone()).or_default().idle;
        // A burst leaves as many idle connections as it had requests in flight; beyond
        // MAX_IDLE the oldest closes now rather than after `upstream_idle_timeout`.
        let oldest = (idle.len() >= MAX_IDLE).then(|| idle.remove(0));
        idle.push(Idle {
            own,
            since: Instant::now(),
        });
        drop(hosts);
        drop(oldest);
    }

    /// The request as the operator's proxy takes it: the absolute URI kept, `Host` from it,
    /// our credentials for the proxy (the agent's `Proxy-Authorization` was removed as
    /// hop-by-hop).
    fn absolute_form(&self, mut req: Request<ProxyBody>) -> Request<ProxyBody> {
        set_host(&mut req);
        if let Some(auth) = self.dialer.proxy().and_then(|p| p.authorization()) {
            req.headers_mut()
                .insert(http::header::PROXY_AUTHORIZATION, auth);
        }
        req
    }
}

impl Host {
    /// Drops connections that are closed, going away, or idle too long.
    fn prune(&mut self, now: Instant, idle_timeout: Duration) {
        self.shared
            .retain_mut(|c| c.usable() && c.idle_for(now).is_none_or(|d| d <= idle_timeout));
        self.idle
            .retain(|c| !c.own.send.is_closed() && now.duration_since(c.since) <= idle_timeout);
    }
}

/// An HTTP/1.1 connection of its own (with upgrades) over `io`.
async fn own<T>(io: TokioIo<T>, addr: SocketAddr, form: Form) -> Result<Conn, PoolError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = http1::Builder::new().handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("upstream HTTP/1.1 connection ended: {e}");
        }
    });
    Ok(Conn::Own(Own { send, addr, form }))
}

/// Drops idle connections that no request came back for.
async fn sweep(pool: Weak<Pool>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        let idle_timeout = pool.idle_timeout;
        pool.lock().retain(|_, host| {
            host.prune(now, idle_timeout);
            !(host.shared.is_empty() && host.idle.is_empty() && host.speaks_h2.is_none())
        });
    }
}

/// HTTP/1.1 sends the path as the request target and the authority as `Host`; the request
/// comes with the absolute URI HTTP/2 takes.
fn origin_form(mut req: Request<ProxyBody>) -> Request<ProxyBody> {
    set_host(&mut req);
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    if let Ok(origin) = target.parse() {
        *req.uri_mut() = origin;
    }
    req
}

/// `Host` from the request's absolute URI.
fn set_host(req: &mut Request<ProxyBody>) {
    let host = req
        .uri()
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    if let Some(host) = host {
        req.headers_mut().insert(http::header::HOST, host);
    }
}

/// The response as the pipeline takes it: the dialed address noted, the body's ready chunks
/// joined (`body::joined`, over HTTP/2 and HTTP/1.1 alike), then wrapped.
fn finish<B: http_body::Body>(
    resp: Response<B>,
    addr: SocketAddr,
    wrap: impl FnOnce(Joined<B>) -> ProxyBody,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    parts.extensions.insert(UpstreamAddr(addr));
    Response::from_parts(parts, wrap(Joined::new(body)))
}
