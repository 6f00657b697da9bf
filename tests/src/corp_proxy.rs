//! An operator's corporate HTTP proxy on loopback, for `[upstream] proxy`: `CONNECT` tunnels
//! and absolute-form plain HTTP, Basic proxy credentials, and a routing table of its own in
//! place of DNS (a name it does not know gets 502; it never dials anything but loopback).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Body = BoxBody<Bytes, hyper::Error>;

/// What the corporate proxy does.
#[derive(Clone, Default)]
pub struct CorpProxyOptions {
    /// `host` → where it really connects (loopback only).
    pub routes: HashMap<String, SocketAddr>,
    /// Required `Proxy-Authorization` value (e.g. `Basic …`); `None`: none required.
    pub authorization: Option<String>,
    /// Pass `Proxy-Authorization` on to the origin (a misconfigured proxy: an origin that
    /// echoes its request then shows the credentials).
    pub leaks_credentials: bool,
}

/// One request the corporate proxy received.
#[derive(Clone, Debug)]
pub struct CorpSeen {
    pub method: String,
    /// The request target as sent: `host:port` for CONNECT, an absolute URI otherwise.
    pub target: String,
    pub proxy_authorization: Option<String>,
    /// What it answered.
    pub status: u16,
}

pub struct CorpProxy {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<CorpSeen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CorpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CorpProxy {
    pub async fn start(opts: CorpProxyOptions) -> CorpProxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        CorpProxy::serve(listener, opts)
    }

    /// Serves on a listener the caller bound (e.g. on `[::1]`).
    pub fn serve(listener: TcpListener, opts: CorpProxyOptions) -> CorpProxy {
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let opts = Arc::new(opts);
        let record = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (opts, record) = (opts.clone(), record.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(req, opts.clone(), record.clone()));
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    let _ = conn.await;
                });
            }
        });
        CorpProxy { addr, seen, task }
    }

    pub fn seen(&self) -> Vec<CorpSeen> {
        self.seen.lock().expect("lock").clone()
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = code;
    resp
}

async fn handle(
    req: Request<Incoming>,
    opts: Arc<CorpProxyOptions>,
    seen: Arc<Mutex<Vec<CorpSeen>>>,
) -> Result<Response<Body>, Infallible> {
    let proxy_authorization = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let method = req.method().to_string();
    let target = req.uri().to_string();
    let authorized = opts.authorization.is_none() || opts.authorization == proxy_authorization;
    let resp = if !authorized {
        status(StatusCode::PROXY_AUTHENTICATION_REQUIRED)
    } else if req.method() == Method::CONNECT {
        tunnel(req, &opts).await
    } else {
        forward(req, &opts).await
    };
    seen.lock().expect("lock").push(CorpSeen {
        method,
        target,
        proxy_authorization,
        status: resp.status().as_u16(),
    });
    Ok(resp)
}

/// `CONNECT host:port`: 200 and a byte tunnel to where its table says, else 502.
async fn tunnel(req: Request<Incoming>, opts: &CorpProxyOptions) -> Response<Body> {
    let Some(auth) = req.uri().authority().cloned() else {
        return status(StatusCode::BAD_REQUEST);
    };
    let port = auth.port_u16().unwrap_or(443);
    let Some(upstream) = route(opts, auth.host(), port) else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let Ok(mut upstream) = TcpStream::connect(upstream).await else {
        return status(StatusCode::BAD_GATEWAY);
    };
    tokio::spawn(async move {
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let mut client = TokioIo::new(upgraded);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        }
    });
    status(StatusCode::OK)
}

/// `GET http://host:port/path`: sent on in origin form to where its table says, else 502.
async fn forward(req: Request<Incoming>, opts: &CorpProxyOptions) -> Response<Body> {
    let Some(auth) = req.uri().authority().cloned() else {
        // Not absolute-form: a proxy cannot tell where it goes.
        return status(StatusCode::BAD_REQUEST);
    };
    let port = auth.port_u16().unwrap_or(80);
    let Some(upstream) = route(opts, auth.host(), port) else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let Ok(tcp) = TcpStream::connect(upstream).await else {
        return status(StatusCode::BAD_GATEWAY);
    };
    let Ok((mut send, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await
    else {
        return status(StatusCode::BAD_GATEWAY);
    };
    tokio::spawn(conn);
    let (mut parts, body) = req.into_parts();
    if !opts.leaks_credentials {
        parts.headers.remove(header::PROXY_AUTHORIZATION);
    }
    let origin = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = origin.parse().expect("origin form");
    match send.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

/// Where the proxy connects for `host`: its table, or a loopback address as given.
fn route(opts: &CorpProxyOptions, host: &str, port: u16) -> Option<SocketAddr> {
    if let Some(addr) = opts.routes.get(host) {
        return Some(*addr);
    }
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    ip.is_loopback().then_some(SocketAddr::new(ip, port))
}
