//! Dialing upstreams: resolve with our resolver, check every address against the guard, and
//! connect to exactly an address that passed. The agent's choice of IP is never trusted.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::upstream::guard::{AddressGuard, Forbidden};
use crate::upstream::resolve::{ResolveError, Resolver};

#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("{host} resolves to {addr}, a {reason}; not allowed (see upstream.allow_private)")]
    Forbidden {
        host: String,
        addr: SocketAddr,
        reason: Forbidden,
    },
    #[error("connecting to {host} ({addr}) failed: {source}")]
    Connect {
        host: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {host} ({addr}) timed out after {after:?}")]
    Timeout {
        host: String,
        addr: SocketAddr,
        after: Duration,
    },
    #[error("{0}: request URI has no host")]
    NoHost(String),
}

pub(crate) struct Dialer {
    resolver: Resolver,
    guard: AddressGuard,
    connect_timeout: Duration,
    connect_time: prometheus::Histogram,
}

impl Dialer {
    /// `connect_time` observes each successful dial (resolution included), in seconds.
    pub(crate) fn new(
        resolver: Resolver,
        guard: AddressGuard,
        connect_timeout: Duration,
        connect_time: prometheus::Histogram,
    ) -> Dialer {
        Dialer {
            resolver,
            guard,
            connect_timeout,
            connect_time,
        }
    }

    /// Connects to `host:port`, trying each permitted address in resolver order.
    pub(crate) async fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), DialError> {
        let started = std::time::Instant::now();
        let dialed = self.dial_untimed(host, port).await;
        if dialed.is_ok() {
            self.connect_time.observe(started.elapsed().as_secs_f64());
        }
        dialed
    }

    async fn dial_untimed(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), DialError> {
        let ips = self.resolver.resolve(host).await?;
        // One forbidden address taints the name: an attacker-controlled DNS answer must not
        // mix a public and a private address and hope we try the public one first.
        for ip in &ips {
            let addr = SocketAddr::new(*ip, port);
            if let Err(reason) = self.guard.check(addr) {
                return Err(DialError::Forbidden {
                    host: host.to_string(),
                    addr,
                    reason,
                });
            }
        }
        let mut last_err = None;
        for ip in ips {
            let addr = SocketAddr::new(ip, port);
            let attempt = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr));
            match attempt.await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok((stream, addr));
                }
                Ok(Err(source)) => {
                    last_err = Some(DialError::Connect {
                        host: host.to_string(),
                        addr,
                        source,
                    })
                }
                Err(_) => {
                    last_err = Some(DialError::Timeout {
                        host: host.to_string(),
                        addr,
                        after: self.connect_timeout,
                    })
                }
            }
        }
        Err(last_err.unwrap_or_else(|| {
            DialError::Resolve(ResolveError::NotFound {
                host: host.to_string(),
            })
        }))
    }
}

/// The dialer as a hyper-util connector, so the pooled client connects only through it.
#[derive(Clone)]
pub(crate) struct DialConnector(pub Arc<Dialer>);

impl tower_service::Service<http::Uri> for DialConnector {
    type Response = TokioIo<TcpStream>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let dialer = self.0.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| DialError::NoHost(uri.to_string()))?;
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let (stream, _) = dialer.dial(host, port).await?;
            Ok(TokioIo::new(stream))
        })
    }
}
