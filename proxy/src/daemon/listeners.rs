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
        })
    }

    /// Every address we listen on: the proxy must never dial itself.
    pub fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut own = self.transparent_addrs.clone();
        own.push(self.explicit_addr);
        own
    }
}

/// Connections the kernel may queue for a listener before we accept them (capped by the
/// system's `somaxconn`). tokio's default (1024) overflows when an agent opens a thousand
/// connections at once: the kernel then drops the handshake's last ACK, and a client that
/// waits to be spoken to (or sends nothing) is stuck on a connection we never saw.
const BACKLOG: u32 = 4096;

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
