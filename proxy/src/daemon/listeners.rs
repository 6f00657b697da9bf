//! Everything the daemon listens on, bound before anything is served (by the supervisor of a
//! split daemon, which hands the sockets to its worker).

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::{TcpListener, TcpSocket};

use crate::config::Config;
use crate::control::admin;

/// Everything the daemon listens on, bound before anything is served.
pub struct Bound {
    pub listeners: Listeners,
    pub admin: tokio::net::UnixListener,
}

impl Bound {
    pub async fn bind(cfg: &Config) -> anyhow::Result<Bound> {
        let listeners = Listeners::bind(cfg).await?;
        let admin = admin::bind(&cfg.admin).await?;
        Ok(Bound { listeners, admin })
    }
}

/// The bound listeners, before anything is served on them.
pub struct Listeners {
    pub transparent: Vec<TcpListener>,
    pub transparent_addrs: Vec<SocketAddr>,
    pub explicit: TcpListener,
    pub explicit_addr: SocketAddr,
    pub metrics: Option<TcpListener>,
    /// The DNS stub: a UDP socket and a TCP listener on each address, same port.
    pub dns: Vec<DnsSockets>,
}

/// One DNS stub address: its UDP socket and TCP listener.
pub struct DnsSockets {
    pub udp: tokio::net::UdpSocket,
    pub tcp: TcpListener,
    pub addr: SocketAddr,
}

impl Listeners {
    pub async fn bind(cfg: &Config) -> anyhow::Result<Listeners> {
        let mut transparent = Vec::new();
        for addr in &cfg.transparent {
            match listen(*addr) {
                Ok(l) => transparent.push(l),
                // The default [::1] listener is optional on hosts without IPv6 loopback.
                Err(e) if cfg.transparent_is_default && addr.is_ipv6() => {
                    tracing::warn!("not listening on {addr}: {e}");
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("binding transparent listener {addr}"))
                }
            }
        }
        let explicit = listen(cfg.explicit)
            .with_context(|| format!("binding explicit listener {}", cfg.explicit))?;
        let mut dns = Vec::new();
        for addr in &cfg.dns {
            match bind_dns(*addr) {
                Ok(d) => dns.push(d),
                Err(e) if cfg.dns_is_default && addr.is_ipv6() => {
                    tracing::warn!("DNS stub: not listening on {addr}: {e}");
                }
                Err(e) => return Err(e).with_context(|| format!("binding the DNS stub on {addr}")),
            }
        }
        let metrics = match cfg.metrics {
            Some(addr) => {
                Some(listen(addr).with_context(|| format!("binding metrics listener {addr}"))?)
            }
            None => None,
        };
        Ok(Listeners {
            metrics,
            transparent_addrs: transparent
                .iter()
                .map(TcpListener::local_addr)
                .collect::<Result<_, _>>()?,
            explicit_addr: explicit.local_addr()?,
            transparent,
            explicit,
            dns,
        })
    }

    /// The DNS stub's bound addresses (UDP and TCP share each).
    pub fn dns_addrs(&self) -> Vec<SocketAddr> {
        self.dns.iter().map(|d| d.addr).collect()
    }

    /// Every address we listen on, the metrics listener included: the proxy must never dial
    /// itself, and the agent must not reach our services through an upstream connection.
    pub fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut own = self.transparent_addrs.clone();
        own.push(self.explicit_addr);
        own.extend(self.dns_addrs());
        own.extend(self.metrics.as_ref().and_then(|m| m.local_addr().ok()));
        own
    }
}

/// Connections the kernel may queue for a listener before we accept them (capped by the
/// system's `somaxconn`). tokio's default (1024) overflows when an agent opens a thousand
/// connections at once: the kernel then drops the handshake's last ACK, and a client that
/// waits to be spoken to (or sends nothing) is stuck on a connection we never saw.
const BACKLOG: u32 = 4096;

/// A UDP socket and a TCP listener on `addr`. With port 0 the TCP listener takes the port the
/// kernel gave the UDP socket (tried a few times: another process may hold it for TCP).
fn bind_dns(addr: SocketAddr) -> std::io::Result<DnsSockets> {
    let mut last = None;
    for _ in 0..8 {
        let udp = std::net::UdpSocket::bind(addr)?;
        let bound = udp.local_addr()?;
        match listen(bound) {
            Ok(tcp) => {
                udp.set_nonblocking(true)?;
                return Ok(DnsSockets {
                    udp: tokio::net::UdpSocket::from_std(udp)?,
                    tcp,
                    addr: bound,
                });
            }
            Err(e) if addr.port() == 0 => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no port for UDP and TCP")))
}

/// A listening socket on `addr` with [`BACKLOG`] (and `SO_REUSEADDR`, as `TcpListener::bind`).
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn own_addrs_are_every_listener_metrics_included() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::defaults_in(dir.path());
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        cfg.transparent = vec![any];
        cfg.explicit = any;
        cfg.dns = vec![any];
        cfg.metrics = Some(any);
        let l = Listeners::bind(&cfg).await.expect("bind");
        let metrics = l
            .metrics
            .as_ref()
            .and_then(|m| m.local_addr().ok())
            .expect("metrics bound");
        let own = l.own_addrs();
        for addr in [
            l.transparent_addrs[0],
            l.explicit_addr,
            l.dns[0].addr,
            metrics,
        ] {
            assert!(own.contains(&addr), "{addr} missing from {own:?}");
        }
    }
}
