//! Dialing upstreams: resolve with our resolver, check every address against the guard, and
//! connect to exactly an address that passed. The agent's choice of IP is never trusted.
//!
//! With `[upstream] proxy` set, every destination is reached through the operator's proxy
//! instead: the proxy's own address is resolved and guarded as any upstream's, and the tunnel
//! asked for by name. The proxy then resolves the name, so the guard sees the addresses of
//! destinations given as IPs (raw TCP) only; a name is left to the proxy.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::config::UpstreamProxy;
use crate::upstream::connection::Connection;
use crate::upstream::guard::{AddressGuard, Forbidden};
use crate::upstream::proxy_connect::{self, TunnelError};
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
    #[error("the upstream proxy {proxy} gave no tunnel to {target}: {source}")]
    Tunnel {
        proxy: String,
        target: String,
        #[source]
        source: TunnelError,
    },
    #[error("the upstream proxy {proxy} gave no tunnel to {target} within {after:?}")]
    TunnelTimeout {
        proxy: String,
        target: String,
        after: Duration,
    },
}

pub(crate) struct Dialer {
    resolver: Resolver,
    guard: AddressGuard,
    connect_timeout: Duration,
    connect_time: prometheus::Histogram,
    /// The operator's proxy every destination is reached through, if any.
    proxy: Option<UpstreamProxy>,
}

impl Dialer {
    /// `connect_time` observes each successful dial (resolution included), in seconds.
    pub(crate) fn new(
        resolver: Resolver,
        guard: AddressGuard,
        connect_timeout: Duration,
        connect_time: prometheus::Histogram,
        proxy: Option<UpstreamProxy>,
    ) -> Dialer {
        Dialer {
            resolver,
            guard,
            connect_timeout,
            connect_time,
            proxy,
        }
    }

    /// The resolver every dial uses (the DNS stub answers from it too).
    pub(crate) fn resolver(&self) -> &Resolver {
        &self.resolver
    }

    /// The private-address guard every dial applies (the DNS stub filters answers with it).
    pub(crate) fn guard(&self) -> &AddressGuard {
        &self.guard
    }

    /// The operator's proxy, when destinations are reached through one.
    pub(crate) fn proxy(&self) -> Option<&UpstreamProxy> {
        self.proxy.as_ref()
    }

    /// A connection to `host:port`: directly, trying each permitted address in resolver
    /// order, or through the operator's proxy. Also the address dialed (the proxy's).
    pub(crate) async fn dial(
        &self,
        host: &str,
        port: u16,
    ) -> Result<(Connection, SocketAddr), DialError> {
        let started = std::time::Instant::now();
        let dialed = match &self.proxy {
            None => self
                .dial_untimed(host, port)
                .await
                .map(|(tcp, addr)| (Connection::Direct(tcp), addr)),
            Some(proxy) => self.through(proxy, host, port).await,
        };
        if dialed.is_ok() {
            self.connect_time.observe(started.elapsed().as_secs_f64());
        }
        dialed
    }

    /// A connection to the operator's proxy itself (plain HTTP goes to it in absolute form).
    pub(crate) async fn dial_proxy(&self) -> Option<Result<(TcpStream, SocketAddr), DialError>> {
        let proxy = self.proxy.as_ref()?;
        Some(self.dial_untimed(&proxy.host, proxy.port).await)
    }

    /// The guard's verdict on `addr`, which `host` names.
    fn check(&self, host: &str, addr: SocketAddr) -> Result<(), DialError> {
        self.guard
            .check(addr)
            .map_err(|reason| DialError::Forbidden {
                host: host.to_string(),
                addr,
                reason,
            })
    }

    /// A tunnel to `host:port` through `proxy`. A destination given as an address is guarded
    /// here, before the proxy is asked.
    async fn through(
        &self,
        proxy: &UpstreamProxy,
        host: &str,
        port: u16,
    ) -> Result<(Connection, SocketAddr), DialError> {
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            self.check(host, SocketAddr::new(ip, port))?;
        }
        let (tcp, addr) = self.dial_untimed(&proxy.host, proxy.port).await?;
        let target = crate::config::authority(host, port);
        let opened = tokio::time::timeout(
            self.connect_timeout,
            proxy_connect::open(proxy, tcp, host, port),
        );
        match opened.await {
            Ok(Ok(tunnel)) => Ok((Connection::Tunnel(tunnel), addr)),
            Ok(Err(source)) => Err(DialError::Tunnel {
                proxy: proxy.to_string(),
                target,
                source,
            }),
            Err(_) => Err(DialError::TunnelTimeout {
                proxy: proxy.to_string(),
                target,
                after: self.connect_timeout,
            }),
        }
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
            self.check(host, SocketAddr::new(*ip, port))?;
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
