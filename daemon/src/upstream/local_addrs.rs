//! This host's own addresses: every address on every interface, not only loopback. A
//! connection to any of them reaches this host's services (the proxy's metrics and DNS stub
//! on a wildcard address, sshd, a database), so the guard treats them as the host's own.
//!
//! Interfaces gain and lose addresses while the daemon runs (DHCP, a VPN coming up), so the
//! list is read again (`getifaddrs`, a few microseconds) once it is older than [`MAX_AGE`]
//! rather than once at start; between reads a check costs one atomic load.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

/// How old the list may be before a check reads it again.
const MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct LocalAddrs {
    /// `false`: a fixed list (tests), never read again.
    live: bool,
    seen: ArcSwap<Seen>,
}

#[derive(Debug)]
struct Seen {
    at: Instant,
    addrs: Box<[IpAddr]>,
}

impl LocalAddrs {
    /// This host's addresses, as the interfaces have them now and later.
    pub(crate) fn host() -> LocalAddrs {
        LocalAddrs {
            live: true,
            seen: ArcSwap::from_pointee(Seen {
                at: Instant::now(),
                addrs: read().unwrap_or_default(),
            }),
        }
    }

    /// A fixed list, for tests.
    #[cfg(test)]
    pub(crate) fn fixed(addrs: Vec<IpAddr>) -> LocalAddrs {
        LocalAddrs {
            live: false,
            seen: ArcSwap::from_pointee(Seen {
                at: Instant::now(),
                addrs: addrs.into(),
            }),
        }
    }

    /// Whether `ip` (canonical: IPv4 as IPv4) is one of this host's addresses.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let mut seen = self.seen.load();
        if self.live && seen.at.elapsed() > MAX_AGE {
            // Should the OS refuse to say, the last list stands.
            let addrs = read().unwrap_or_else(|| seen.addrs.clone());
            self.seen.store(Arc::new(Seen {
                at: Instant::now(),
                addrs,
            }));
            seen = self.seen.load();
        }
        seen.addrs.contains(&ip)
    }
}

impl Default for LocalAddrs {
    fn default() -> Self {
        LocalAddrs::host()
    }
}

/// The addresses on this host's interfaces now; `None` (said once per read) when the OS
/// refuses to say.
fn read() -> Option<Box<[IpAddr]>> {
    let ifs = nix::ifaddrs::getifaddrs()
        .inspect_err(|e| tracing::warn!("listing this host's addresses failed: {e}"))
        .ok()?;
    let mut all: Vec<IpAddr> = ifs
        .filter_map(|i| i.address)
        .filter_map(|a| {
            a.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        })
        .map(|ip| ip.to_canonical())
        .collect();
    all.sort_unstable();
    all.dedup();
    Some(all.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_has_its_loopback_addresses() {
        let local = LocalAddrs::host();
        assert!(local.contains("127.0.0.1".parse().expect("ip")));
        assert!(!local.contains("192.0.2.77".parse().expect("ip")));
    }
}
