//! The private-address guard: the agent must not use the proxy to reach the host's own
//! services, the LAN or a cloud metadata endpoint unless the operator allowed that range.
//!
//! An IPv6 address that carries an IPv4 one (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
//! `::a.b.c.d`, NAT64 `64:ff9b::/96` and the local-use `64:ff9b:1::/48`) is judged as that
//! IPv4 address, since that is where the packets end up. The local-use prefix may embed it at
//! any of the RFC 6052 positions its operator chose (/48, /56, /64, /96), so an address there
//! is judged as each: one forbidden reading refuses it.
//!
//! The proxy's own listeners (transparent, explicit, DNS stub, metrics) are always refused: a
//! listener on a wildcard address on every address of this host. Every address of this host
//! is refused like a private one (unless `allow_private` covers it): on a host with a public
//! address, that address reaches the same services as loopback.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

use super::local_addrs::LocalAddrs;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forbidden {
    /// Loopback, private, link-local (incl. metadata), CGNAT, multicast, reserved...
    NonPublic(&'static str),
    /// An address of one of this host's interfaces.
    LocalAddress,
    /// One of the proxy's own listeners: forwarding there would loop.
    OwnListener,
}

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forbidden::NonPublic(kind) => write!(f, "{kind} address"),
            Forbidden::LocalAddress => f.write_str("local address of this host"),
            Forbidden::OwnListener => f.write_str("the proxy's own listener"),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct AddressGuard {
    allow: Vec<IpNet>,
    own: Vec<SocketAddr>,
    local: Arc<LocalAddrs>,
}

impl AddressGuard {
    /// `own_listeners`: every address the proxy listens on, metrics included.
    pub fn new(allow: Vec<IpNet>, own_listeners: Vec<SocketAddr>) -> AddressGuard {
        AddressGuard {
            allow,
            own: own_listeners,
            local: Arc::new(LocalAddrs::host()),
        }
    }

    /// The guard with this host's addresses fixed, for tests.
    #[cfg(test)]
    fn with_local(allow: Vec<IpNet>, own: Vec<SocketAddr>, local: Vec<IpAddr>) -> AddressGuard {
        AddressGuard {
            allow,
            own,
            local: Arc::new(LocalAddrs::fixed(local)),
        }
    }

    /// `Ok` when the proxy may connect to `addr`.
    pub(crate) fn check(&self, addr: SocketAddr) -> Result<(), Forbidden> {
        let mut verdict = Ok(());
        readings(addr.ip(), |ip| {
            if verdict.is_ok() {
                verdict = self.check_one(ip, addr.port());
            }
        });
        verdict
    }

    /// The verdict on one reading of the address.
    fn check_one(&self, ip: IpAddr, port: u16) -> Result<(), Forbidden> {
        let local = ip.is_loopback() || self.local.contains(ip);
        if self.own.iter().any(|l| {
            l.port() == port && (l.ip().to_canonical() == ip || (l.ip().is_unspecified() && local))
        }) {
            return Err(Forbidden::OwnListener);
        }
        if self.allow.iter().any(|net| net.contains(&ip)) {
            return Ok(());
        }
        match non_public_kind(ip) {
            Some(kind) => Err(Forbidden::NonPublic(kind)),
            None if local => Err(Forbidden::LocalAddress),
            None => Ok(()),
        }
    }
}

/// Calls `each` with every address `ip` is judged as: the IPv4 address an IPv6 one carries
/// (one reading, or one per position for the local-use NAT64 prefix), else `ip` itself.
fn readings(ip: IpAddr, mut each: impl FnMut(IpAddr)) {
    let IpAddr::V6(v6) = ip else {
        return each(ip);
    };
    let o = v6.octets();
    let s = v6.segments();
    let v4 = |at: [usize; 4]| IpAddr::V4(Ipv4Addr::new(o[at[0]], o[at[1]], o[at[2]], o[at[3]]));
    if let Some(mapped) = v6.to_ipv4_mapped() {
        each(IpAddr::V4(mapped));
    } else if s[..6] == [0; 6] && !matches!(s[6..], [0, 0] | [0, 1]) {
        // IPv4-compatible `::a.b.c.d` (deprecated, RFC 4291); `::` and `::1` are themselves.
        each(v4([12, 13, 14, 15]));
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        // The well-known NAT64 prefix, /96 (RFC 6052).
        each(v4([12, 13, 14, 15]));
    } else if s[..3] == [0x64, 0xff9b, 1] {
        // Local-use NAT64 (RFC 8215): /48, /56, /64 and /96 prefixes, byte 8 skipped.
        for at in [
            [6, 7, 9, 10],
            [7, 9, 10, 11],
            [9, 10, 11, 12],
            [12, 13, 14, 15],
        ] {
            each(v4(at));
        }
    } else {
        each(ip);
    }
}

fn non_public_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(match o {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        _ if ip.is_link_local() => "link-local (cloud metadata lives here)",
        [0, ..] => "unspecified/this-network",
        [100, b, ..] if (64..128).contains(&b) => "shared (CGNAT)",
        [192, 0, 0, _] => "IETF protocol assignment",
        [198, b, ..] if b == 18 || b == 19 => "benchmarking",
        _ if ip.is_multicast() => "multicast",
        [a, ..] if a >= 240 => "reserved",
        _ => return None,
    })
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(match s[0] {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        a if a & 0xfe00 == 0xfc00 => "unique local (private)",
        a if a & 0xffc0 == 0xfe80 => "link-local",
        a if a & 0xffc0 == 0xfec0 => "site-local (deprecated private)",
        a if a & 0xff00 == 0xff00 => "multicast",
        // 2002::/16 6to4 and the discard/documentation prefixes are not ordinary destinations.
        0x2002 => "6to4",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only",
        0x2001 if s[1] == 0x0db8 => "documentation",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn refuses_non_public_by_default() {
        let g = AddressGuard::default();
        for a in [
            "127.0.0.1:443",
            "10.1.2.3:443",
            "172.16.0.1:443",
            "192.168.1.1:80",
            "169.254.169.254:80",
            "100.64.0.1:443",
            "0.0.0.0:443",
            "[::1]:443",
            "[fd00:ec2::254]:80",
            "[fe80::1]:443",
            "[::ffff:127.0.0.1]:443",
            "[::ffff:169.254.169.254]:80",
            "[64:ff9b::a9fe:a9fe]:80",
            "224.0.0.1:443",
        ] {
            assert!(g.check(sa(a)).is_err(), "{a} must be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        let g = AddressGuard::default();
        for a in ["93.184.216.34:443", "[2606:4700::1111]:443", "8.8.8.8:53"] {
            assert_eq!(g.check(sa(a)), Ok(()), "{a}");
        }
    }

    #[test]
    fn allowed_range_lets_through_but_not_neighbours() {
        let g = AddressGuard::new(vec!["127.0.0.0/8".parse().expect("net")], vec![]);
        assert_eq!(g.check(sa("127.0.0.2:8443")), Ok(()));
        assert_eq!(g.check(sa("[::ffff:127.0.0.2]:8443")), Ok(()));
        assert!(g.check(sa("10.0.0.1:443")).is_err());
        assert!(g.check(sa("[::1]:443")).is_err());
    }

    /// An IPv6 address carrying an IPv4 one is judged as that IPv4 address: compatible
    /// (`::a.b.c.d`) and NAT64, the well-known /96 and every position of the local-use /48.
    #[test]
    fn embedded_ipv4_is_judged_as_ipv4() {
        let g = AddressGuard::with_local(vec![], vec![], vec![]);
        for a in [
            // IPv4-compatible: loopback, private, metadata.
            "[::127.0.0.1]:443",
            "[::10.0.0.1]:443",
            "[::169.254.169.254]:80",
            "[::7f00:1]:443",
            // Well-known NAT64 /96.
            "[64:ff9b::10.0.0.1]:443",
            "[64:ff9b::127.0.0.1]:443",
            // Local-use NAT64, 64:ff9b:1::/48, at the /48, /56, /64 and /96 positions of
            // 10.0.0.1 (RFC 6052: byte 8 is skipped), with public-looking bytes elsewhere.
            "[64:ff9b:1:a00:0:101:101:101]:443",
            "[64:ff9b:1:10a:0:1:101:101]:443",
            "[64:ff9b:1:101:a:0:101:101]:443",
            "[64:ff9b:1:101:101:101:a00:1]:443",
            "[64:ff9b:1:101:101:101:a9fe:a9fe]:80",
        ] {
            assert!(
                matches!(g.check(sa(a)), Err(Forbidden::NonPublic(_))),
                "{a} must be refused: {:?}",
                g.check(sa(a))
            );
        }
        // Public IPv4 inside them passes, judged as what it carries.
        for a in [
            "[::5db8:d822]:443",
            "[64:ff9b::93.184.216.34]:443",
            "[64:ff9b:1:5db8:d8:2263:55d:b8d8]:443",
        ] {
            assert_eq!(g.check(sa(a)), Ok(()), "{a}");
        }
        // An allowed IPv4 range covers its embeddings too.
        let allowed =
            AddressGuard::with_local(vec!["10.0.0.0/8".parse().expect("net")], vec![], vec![]);
        assert_eq!(allowed.check(sa("[::10.0.0.1]:443")), Ok(()));
        assert_eq!(allowed.check(sa("[64:ff9b::10.0.0.1]:443")), Ok(()));
        // `::` and `::1` are themselves.
        assert_eq!(
            g.check(sa("[::1]:443")),
            Err(Forbidden::NonPublic("loopback"))
        );
    }

    /// Every address of this host is its own: refused unless allowed, and the proxy's
    /// listeners on a wildcard address (metrics included) are refused on each of them.
    #[test]
    fn this_hosts_addresses_and_every_listener_are_the_proxys_own() {
        let public_here: IpAddr = "203.0.113.7".parse().expect("ip");
        let g = AddressGuard::with_local(
            vec!["127.0.0.0/8".parse().expect("net")],
            vec![sa("127.0.0.1:15001"), sa("0.0.0.0:15090"), sa("[::]:15053")],
            vec![public_here, "127.0.0.1".parse().expect("ip")],
        );
        assert_eq!(
            g.check(sa("203.0.113.7:22")),
            Err(Forbidden::LocalAddress),
            "a public address of this host is no upstream"
        );
        assert_eq!(
            g.check(sa("[::ffff:203.0.113.7]:22")),
            Err(Forbidden::LocalAddress)
        );
        assert_eq!(
            g.check(sa("[::203.0.113.7]:22")),
            Err(Forbidden::LocalAddress)
        );
        assert_eq!(
            g.check(sa("[64:ff9b::203.0.113.7]:22")),
            Err(Forbidden::LocalAddress)
        );
        // The metrics listener, on a wildcard address: by any address of this host.
        for a in ["127.0.0.1:15090", "127.0.0.9:15090", "203.0.113.7:15090"] {
            assert_eq!(g.check(sa(a)), Err(Forbidden::OwnListener), "{a}");
        }
        assert_eq!(
            g.check(sa("203.0.113.7:15053")),
            Err(Forbidden::OwnListener)
        );
        // Loopback is allowed here, but not where the proxy listens.
        assert_eq!(g.check(sa("127.0.0.1:8443")), Ok(()));
        assert_eq!(g.check(sa("127.0.0.1:15001")), Err(Forbidden::OwnListener));
        // Another host's public address is an upstream like any.
        assert_eq!(g.check(sa("203.0.113.8:15090")), Ok(()));
        // An operator may allow this host's address, never the proxy's listeners on it.
        let allowed = AddressGuard::with_local(
            vec!["203.0.113.7/32".parse().expect("net")],
            vec![sa("0.0.0.0:15090")],
            vec![public_here],
        );
        assert_eq!(allowed.check(sa("203.0.113.7:22")), Ok(()));
        assert_eq!(
            allowed.check(sa("203.0.113.7:15090")),
            Err(Forbidden::OwnListener)
        );
    }

    #[test]
    fn own_listener_is_refused_even_when_range_allowed() {
        let g = AddressGuard::new(
            vec!["127.0.0.0/8".parse().expect("net")],
            vec![sa("127.0.0.1:15001"), sa("0.0.0.0:15080")],
        );
        assert_eq!(g.check(sa("127.0.0.1:15001")), Err(Forbidden::OwnListener));
        assert_eq!(g.check(sa("127.0.0.5:15080")), Err(Forbidden::OwnListener));
        assert_eq!(g.check(sa("127.0.0.1:15002")), Ok(()));
    }
}
