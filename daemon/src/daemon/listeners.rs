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

/// What a listener is for, as its errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Transparent,
    Explicit,
    Dns,
    Metrics,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Transparent => "transparent listener",
            Role::Explicit => "explicit listener",
            Role::Dns => "DNS stub",
            Role::Metrics => "metrics listener",
        })
    }
}

/// A listener that could not be bound: which, where, and (for an address in use) how to find
/// who holds it.
#[derive(Debug, thiserror::Error)]
#[error("binding the {role} on {addr}: {cause}{}", self.hint())]
pub struct BindError {
    pub role: Role,
    pub addr: SocketAddr,
    /// Not `source`: the message already says it, and a chain would say it twice.
    pub cause: std::io::Error,
}

impl BindError {
    pub fn in_use(&self) -> bool {
        self.cause.kind() == std::io::ErrorKind::AddrInUse
    }

    fn hint(&self) -> String {
        let port = self.addr.port();
        match self.cause.kind() {
            std::io::ErrorKind::AddrInUse => {
                let ss = if self.role == Role::Dns {
                    format!("ss -ltunp 'sport = :{port}'")
                } else {
                    format!("ss -ltnp 'sport = :{port}'")
                };
                format!(
                    ": another agenshield daemon, or another program, holds {addr}; see which \
                     with: {ss}",
                    addr = self.addr
                )
            }
            std::io::ErrorKind::AddrNotAvailable => {
                format!(": no interface of this machine has {}", self.addr.ip())
            }
            std::io::ErrorKind::PermissionDenied if port < 1024 => {
                format!(": port {port} needs root")
            }
            _ => String::new(),
        }
    }
}

/// Every address `cfg` asks to listen on: (role, address, whether a failure is tolerated:
/// the default [::1] listeners are optional on hosts without IPv6 loopback).
fn wanted(cfg: &Config) -> Vec<(Role, SocketAddr, bool)> {
    let mut out: Vec<_> = cfg
        .transparent
        .iter()
        .map(|a| {
            (
                Role::Transparent,
                *a,
                cfg.transparent_is_default && a.is_ipv6(),
            )
        })
        .collect();
    out.push((Role::Explicit, cfg.explicit, false));
    out.extend(
        cfg.dns
            .iter()
            .map(|a| (Role::Dns, *a, cfg.dns_is_default && a.is_ipv6())),
    );
    out.extend(cfg.metrics.map(|a| (Role::Metrics, a, false)));
    out
}

/// One listener of `role` on `addr`.
enum One {
    Tcp(TcpListener),
    Dns(DnsSockets),
}

fn bind_one(role: Role, addr: SocketAddr) -> Result<One, BindError> {
    let bound = match role {
        Role::Dns => bind_dns(addr).map(One::Dns),
        _ => listen(addr).map(One::Tcp),
    };
    bound.map_err(|cause| BindError { role, addr, cause })
}

/// What binding each address of `cfg` gives right now, each released at once: `run --check`
/// learns what `run` would, holding nothing. An optional listener that fails is `Ok(None)`.
pub async fn probe(cfg: &Config) -> Vec<(Role, SocketAddr, Result<Option<SocketAddr>, BindError>)> {
    wanted(cfg)
        .into_iter()
        .map(|(role, addr, optional)| {
            let got = match bind_one(role, addr) {
                Ok(One::Tcp(l)) => Ok(l.local_addr().ok()),
                Ok(One::Dns(d)) => Ok(Some(d.addr)),
                Err(_) if optional => Ok(None),
                Err(e) => Err(e),
            };
            (role, addr, got)
        })
        .collect()
}

impl Listeners {
    pub async fn bind(cfg: &Config) -> anyhow::Result<Listeners> {
        let (mut transparent, mut explicit, mut dns, mut metrics) =
            (Vec::new(), None, Vec::new(), None);
        for (role, addr, optional) in wanted(cfg) {
            match (bind_one(role, addr), role) {
                (Ok(One::Tcp(l)), Role::Transparent) => transparent.push(l),
                (Ok(One::Tcp(l)), Role::Explicit) => explicit = Some(l),
                (Ok(One::Tcp(l)), _) => metrics = Some(l),
                (Ok(One::Dns(d)), _) => dns.push(d),
                (Err(e), _) if optional => tracing::warn!("not listening: {e}"),
                (Err(e), _) => return Err(e.into()),
            }
        }
        let explicit = explicit.context("no explicit listener")?;
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
