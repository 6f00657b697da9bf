//! Dialing upstreams: resolve with our resolver, check every address against the guard, and
//! connect to exactly an address that passed. The agent's choice of IP is never trusted.

use std::net::SocketAddr;
use std::time::Duration;

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
