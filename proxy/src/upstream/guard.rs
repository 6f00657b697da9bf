//! The private-address guard: the agent must not use the proxy to reach the host's own
//! services, the LAN or a cloud metadata endpoint unless the operator allowed that range.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// Why an address is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forbidden {
    /// Loopback, private, link-local (incl. metadata), CGNAT, multicast, reserved...
    NonPublic(&'static str),
    /// One of the proxy's own listeners: forwarding there would loop.
    OwnListener,
}

impl std::fmt::Display for Forbidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Forbidden::NonPublic(kind) => write!(f, "{kind} address"),
            Forbidden::OwnListener => f.write_str("the proxy's own listener"),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct AddressGuard {
    allow: Vec<IpNet>,
    own: Vec<SocketAddr>,
}

impl AddressGuard {
    pub(crate) fn new(allow: Vec<IpNet>, own_listeners: Vec<SocketAddr>) -> AddressGuard {
        AddressGuard {
            allow,
            own: own_listeners,
        }
    }

    /// `Ok` when the proxy may connect to `addr`.
    pub(crate) fn check(&self, addr: SocketAddr) -> Result<(), Forbidden> {
        let ip = canonical(addr.ip());
        if self.own.iter().any(|l| {
            l.port() == addr.port()
                && (canonical(l.ip()) == ip || (l.ip().is_unspecified() && ip.is_loopback()))
        }) {
            return Err(Forbidden::OwnListener);
        }
        match non_public_kind(ip) {
            Some(kind) if !self.allow.iter().any(|net| net.contains(&ip)) => {
                Err(Forbidden::NonPublic(kind))
            }
            _ => Ok(()),
        }
    }
}

/// IPv4-mapped and NAT64-embedded IPv4 addresses are judged as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            // 64:ff9b::/96, the well-known NAT64 prefix (RFC 6052).
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
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
