//! pf's `DIOCNATLOOK`: the original destination of a connection pf's `rdr` redirected.
//!
//! The structures mirror xnu's `bsd/net/pfvar.h` (Apple extensions on, the only variant
//! macOS ships):
//!
//! ```c
//! struct pfioc_natlook {
//!     struct pf_addr saddr, daddr, rsaddr, rdaddr;            // 16 bytes each: 0/16/32/48
//!     union pf_state_xport sxport, dxport, rsxport, rdxport;  // 4 bytes each: 64/68/72/76
//!     sa_family_t af; u_int8_t proto, proto_variant, direction; // 80..83
//! };                                                            // 84 bytes, align 4
//! #define DIOCNATLOOK _IOWR('D', 23, struct pfioc_natlook)
//! ```
//!
//! `pf_addr` is a union of `in_addr`/`in6_addr`/`u_int32_t[4]` (16 bytes, 4-aligned),
//! `pf_state_xport` a union of `u_int16_t port`/`call_id` and `u_int32_t spi` (4 bytes,
//! 4-aligned); `sa_family_t` is one byte on Darwin. Ports and addresses are in network byte
//! order (pf(4): "Fields of ioctl(2) parameter structures that refer to packet data (like
//! addresses and ports) are generally expected in network byte-order").
//!
//! How the kernel answers (xnu `bsd/net/pf_ioctl.c`, `pfioctl_ioc_natlook`): with
//! `direction == PF_OUT` it looks the state up by `lan = (daddr, dxport)` and
//! `ext_lan = (saddr, sxport)` and writes the state's `gwy` address/port into
//! `rdaddr`/`rdxport`. For a connection `rdr` redirected on its way in, `lan` is the
//! translated destination (our listener), `ext_lan` the client and `gwy` the destination
//! the client asked for. So: `saddr` = the client (the accepted socket's peer), `daddr` =
//! our listener (its local address), answer in `rdaddr`/`rdxport`. sshuttle's pf method
//! asks the same way (`query_nat(family, proto, peer ip/port, sock ip/port)` with
//! `PF_OUT`, reading `rdaddr`/`rdxport`). `EINVAL` when a port or address is zero,
//! `ENOENT` when no state matches, `E2BIG` when several do.
//!
//! Privileges: `pfioctl` refuses every request from a non-root credential with `EPERM`
//! (`kauth_cred_issuser`), per call, whoever opened the device; a read-only descriptor is
//! enough (`DIOCNATLOOK` is in the `!(flags & FWRITE)` allow-list).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `AF_INET` on Darwin (same as Linux).
pub const DARWIN_AF_INET: u8 = 2;
/// `AF_INET6` on Darwin (30; Linux uses 10, so never take this from the host's libc).
pub const DARWIN_AF_INET6: u8 = 30;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u8 = 6;
/// `enum { PF_INOUT, PF_IN, PF_OUT, PF_FWD }` in pfvar.h.
pub const PF_OUT: u8 = 2;

/// `struct pf_addr`: 16 address bytes as they travel on the wire (v4 in the first four).
#[repr(C, align(4))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PfAddr {
    pub bytes: [u8; 16],
}

/// `union pf_state_xport`: for TCP the port, big-endian, in the first two bytes.
#[repr(C, align(4))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PfStateXport {
    pub bytes: [u8; 4],
}

impl PfStateXport {
    pub fn from_port(port: u16) -> PfStateXport {
        let [hi, lo] = port.to_be_bytes();
        PfStateXport {
            bytes: [hi, lo, 0, 0],
        }
    }

    pub fn port(&self) -> u16 {
        u16::from_be_bytes([self.bytes[0], self.bytes[1]])
    }
}

/// `struct pfioc_natlook`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PfiocNatlook {
    pub saddr: PfAddr,
    pub daddr: PfAddr,
    pub rsaddr: PfAddr,
    pub rdaddr: PfAddr,
    pub sxport: PfStateXport,
    pub dxport: PfStateXport,
    pub rsxport: PfStateXport,
    pub rdxport: PfStateXport,
    pub af: u8,
    pub proto: u8,
    pub proto_variant: u8,
    pub direction: u8,
}

/// BSD `_IOWR(group, num, len)` (sys/ioccom.h): `IOC_INOUT` (0x80000000 | 0x40000000),
/// the parameter length masked with `IOCPARM_MASK` (0x1fff) at bit 16, the group at bit 8.
pub const fn bsd_iowr(group: u8, num: u8, len: usize) -> u64 {
    0xc000_0000 | (((len as u64) & 0x1fff) << 16) | ((group as u64) << 8) | num as u64
}

/// `DIOCNATLOOK`, 0xc0544417.
pub const DIOCNATLOOK: u64 = bsd_iowr(b'D', 23, std::mem::size_of::<PfiocNatlook>());

/// Why a natlook request could not be built or answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NatlookError {
    #[error("client {client} and listener {listener} are not of one address family")]
    MixedFamilies {
        client: SocketAddr,
        listener: SocketAddr,
    },
    #[error("pf answered an address family it was not asked about ({0})")]
    BadAnswer(u8),
}

/// A v4-mapped v6 address (`::ffff:a.b.c.d`, what a dual-stack listener reports for v4
/// clients) is the v4 address pf's state holds.
fn unmap(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

fn pf_addr(ip: IpAddr) -> PfAddr {
    let mut a = PfAddr::default();
    match ip {
        IpAddr::V4(v4) => a.bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => a.bytes = v6.octets(),
    }
    a
}

/// The request for the connection `client` -> `listener` (the accepted socket's peer and
/// local address): `saddr`/`sxport` the client, `daddr`/`dxport` the listener, TCP,
/// `PF_OUT`. Pure.
pub fn natlook_request(
    client: SocketAddr,
    listener: SocketAddr,
) -> Result<PfiocNatlook, NatlookError> {
    let (c, l) = (unmap(client), unmap(listener));
    let af = match (c, l) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => DARWIN_AF_INET,
        (SocketAddr::V6(_), SocketAddr::V6(_)) => DARWIN_AF_INET6,
        _ => return Err(NatlookError::MixedFamilies { client, listener }),
    };
    Ok(PfiocNatlook {
        saddr: pf_addr(c.ip()),
        daddr: pf_addr(l.ip()),
        sxport: PfStateXport::from_port(c.port()),
        dxport: PfStateXport::from_port(l.port()),
        af,
        proto: IPPROTO_TCP,
        direction: PF_OUT,
        ..PfiocNatlook::default()
    })
}

/// The original destination in a request the kernel answered (`rdaddr`/`rdxport`). Pure.
pub fn natlook_answer(answered: &PfiocNatlook) -> Result<SocketAddr, NatlookError> {
    let b = answered.rdaddr.bytes;
    let ip = match answered.af {
        DARWIN_AF_INET => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        DARWIN_AF_INET6 => IpAddr::V6(Ipv6Addr::from(b)),
        other => return Err(NatlookError::BadAnswer(other)),
    };
    Ok(SocketAddr::new(ip, answered.rdxport.port()))
}

#[cfg(target_os = "macos")]
pub use macos::PfNatlook;

#[cfg(target_os = "macos")]
mod macos {
    use std::fs::File;
    use std::net::SocketAddr;
    use std::os::fd::{AsRawFd, BorrowedFd};
    use std::sync::OnceLock;

    use super::{natlook_answer, natlook_request, PfiocNatlook};
    use crate::origdst::{OrigDst, OrigDstError};

    // nix's macro computes the request with the platform's own `_IOWR` (the test below
    // checks it equals our hand-computed `DIOCNATLOOK`) and wraps ioctl(2).
    nix::ioctl_readwrite!(diocnatlook, b'D', 23, PfiocNatlook);

    /// `OrigDst` through `DIOCNATLOOK` on `/dev/pf`. Needs euid 0 at every call (xnu checks
    /// the caller's credential per ioctl, not at open), so it belongs in the privileged part
    /// of the daemon.
    #[derive(Debug, Default)]
    pub struct PfNatlook {
        dev: OnceLock<File>,
    }

    impl PfNatlook {
        pub fn new() -> PfNatlook {
            PfNatlook::default()
        }

        /// `/dev/pf`, opened read-only on first use (enough for `DIOCNATLOOK`) and kept.
        fn dev(&self) -> Result<&File, OrigDstError> {
            if let Some(f) = self.dev.get() {
                return Ok(f);
            }
            let f = File::open("/dev/pf").map_err(OrigDstError::Lookup)?;
            let _ = self.dev.set(f);
            self.dev
                .get()
                .ok_or_else(|| OrigDstError::Lookup(std::io::Error::other("/dev/pf not kept")))
        }

        /// The original destination of the TCP connection `client` -> `listener`.
        pub fn lookup(
            &self,
            client: SocketAddr,
            listener: SocketAddr,
        ) -> Result<SocketAddr, OrigDstError> {
            let invalid =
                |e: super::NatlookError| OrigDstError::Lookup(std::io::Error::other(e.to_string()));
            let mut req = natlook_request(client, listener).map_err(invalid)?;
            let fd = self.dev()?.as_raw_fd();
            // SAFETY: `fd` is /dev/pf, open for as long as `self` lives; `req` is an
            // exclusively borrowed, initialized `PfiocNatlook` whose size (84) and field
            // offsets match xnu's `struct pfioc_natlook` (asserted by the layout tests), so
            // the kernel's copyin/copyout of `sizeof(struct pfioc_natlook)` bytes stays
            // within it.
            let done = unsafe { diocnatlook(fd, &mut req) };
            done.map_err(|e| {
                OrigDstError::Lookup(std::io::Error::other(format!(
                    "DIOCNATLOOK {client} -> {listener}: {e}{}",
                    if e == nix::errno::Errno::ENOENT {
                        " (no pf state: the connection was not redirected by pf)"
                    } else {
                        ""
                    }
                )))
            })?;
            natlook_answer(&req).map_err(invalid)
        }
    }

    impl OrigDst for PfNatlook {
        fn orig_dst(
            &self,
            _sock: BorrowedFd<'_>,
            local: SocketAddr,
            peer: SocketAddr,
        ) -> Result<SocketAddr, OrigDstError> {
            self.lookup(peer, local)
        }

        fn name(&self) -> &'static str {
            "pf_natlook"
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn nix_computes_the_same_request_number() {
            let nix =
                nix::request_code_readwrite!(b'D', 23, std::mem::size_of::<super::PfiocNatlook>());
            assert_eq!(nix as u64, super::super::DIOCNATLOOK);
        }

        #[test]
        fn darwin_constants_match_libc() {
            assert_eq!(libc::AF_INET as u8, super::super::DARWIN_AF_INET);
            assert_eq!(libc::AF_INET6 as u8, super::super::DARWIN_AF_INET6);
            assert_eq!(libc::IPPROTO_TCP as u8, super::super::IPPROTO_TCP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layout_matches_xnu_pfioc_natlook() {
        assert_eq!(size_of::<PfAddr>(), 16);
        assert_eq!(align_of::<PfAddr>(), 4);
        assert_eq!(size_of::<PfStateXport>(), 4);
        assert_eq!(align_of::<PfStateXport>(), 4);
        assert_eq!(size_of::<PfiocNatlook>(), 84);
        assert_eq!(offset_of!(PfiocNatlook, saddr), 0);
        assert_eq!(offset_of!(PfiocNatlook, daddr), 16);
        assert_eq!(offset_of!(PfiocNatlook, rsaddr), 32);
        assert_eq!(offset_of!(PfiocNatlook, rdaddr), 48);
        assert_eq!(offset_of!(PfiocNatlook, sxport), 64);
        assert_eq!(offset_of!(PfiocNatlook, dxport), 68);
        assert_eq!(offset_of!(PfiocNatlook, rsxport), 72);
        assert_eq!(offset_of!(PfiocNatlook, rdxport), 76);
        assert_eq!(offset_of!(PfiocNatlook, af), 80);
        assert_eq!(offset_of!(PfiocNatlook, proto), 81);
        assert_eq!(offset_of!(PfiocNatlook, proto_variant), 82);
        assert_eq!(offset_of!(PfiocNatlook, direction), 83);
    }

    #[test]
    fn request_number_is_the_bsd_iowr_encoding() {
        let by_hand = 0xc000_0000u64 | ((84u64 & 0x1fff) << 16) | (u64::from(b'D') << 8) | 23;
        assert_eq!(DIOCNATLOOK, by_hand);
        assert_eq!(DIOCNATLOOK, 0xc054_4417);
    }

    /// The raw bytes of a request, as the kernel would read them.
    fn bytes(req: &PfiocNatlook) -> Vec<u8> {
        let mut out = Vec::with_capacity(84);
        for a in [req.saddr, req.daddr, req.rsaddr, req.rdaddr] {
            out.extend_from_slice(&a.bytes);
        }
        for x in [req.sxport, req.dxport, req.rsxport, req.rdxport] {
            out.extend_from_slice(&x.bytes);
        }
        out.extend_from_slice(&[req.af, req.proto, req.proto_variant, req.direction]);
        out
    }

    #[test]
    fn v4_request_puts_the_client_in_source_and_ports_big_endian() {
        let client: SocketAddr = "192.168.1.20:54321".parse().expect("addr");
        let listener: SocketAddr = "127.0.0.1:15001".parse().expect("addr");
        let req = natlook_request(client, listener).expect("request");
        let b = bytes(&req);
        assert_eq!(&b[0..4], &[192, 168, 1, 20]);
        assert!(b[4..16].iter().all(|x| *x == 0));
        assert_eq!(&b[16..20], &[127, 0, 0, 1]);
        assert!(b[32..64].iter().all(|x| *x == 0), "answers start zeroed");
        assert_eq!(
            &b[64..68],
            &[0xd4, 0x31, 0, 0],
            "54321 = 0xd431, network order"
        );
        assert_eq!(
            &b[68..72],
            &[0x3a, 0x99, 0, 0],
            "15001 = 0x3a99, network order"
        );
        assert_eq!(
            &b[80..84],
            &[2, 6, 0, 2],
            "AF_INET, TCP, no variant, PF_OUT"
        );
    }

    #[test]
    fn v6_request_and_darwin_af_inet6() {
        let client: SocketAddr = "[2001:db8::20]:40000".parse().expect("addr");
        let listener: SocketAddr = "[::1]:15001".parse().expect("addr");
        let req = natlook_request(client, listener).expect("request");
        let b = bytes(&req);
        assert_eq!(
            &b[0..16],
            &"2001:db8::20".parse::<Ipv6Addr>().expect("ip").octets()
        );
        assert_eq!(&b[16..32], &Ipv6Addr::LOCALHOST.octets());
        assert_eq!(b[80], 30, "Darwin's AF_INET6");
    }

    #[test]
    fn v4_mapped_addresses_are_asked_as_v4() {
        let client: SocketAddr = "[::ffff:192.168.1.20]:54321".parse().expect("addr");
        let listener: SocketAddr = "[::ffff:127.0.0.1]:15001".parse().expect("addr");
        let req = natlook_request(client, listener).expect("request");
        assert_eq!(req.af, DARWIN_AF_INET);
        assert_eq!(&req.saddr.bytes[..4], &[192, 168, 1, 20]);
    }

    #[test]
    fn mixed_families_are_refused() {
        let client: SocketAddr = "192.168.1.20:1".parse().expect("addr");
        let listener: SocketAddr = "[::1]:15001".parse().expect("addr");
        assert!(matches!(
            natlook_request(client, listener),
            Err(NatlookError::MixedFamilies { .. })
        ));
    }

    #[test]
    fn answer_is_read_from_rdaddr_and_rdxport() {
        let client: SocketAddr = "192.168.1.20:54321".parse().expect("addr");
        let listener: SocketAddr = "127.0.0.1:15001".parse().expect("addr");
        let mut req = natlook_request(client, listener).expect("request");
        // What the kernel writes for PF_OUT: rd* = the state's gwy (the original
        // destination), rs* = a copy of the source.
        req.rdaddr.bytes[..4].copy_from_slice(&[93, 184, 215, 14]);
        req.rdxport = PfStateXport {
            bytes: [0x01, 0xbb, 0, 0],
        };
        req.rsaddr = req.saddr;
        req.rsxport = req.sxport;
        assert_eq!(
            natlook_answer(&req),
            Ok("93.184.215.14:443".parse().expect("addr"))
        );

        let client: SocketAddr = "[2001:db8::20]:40000".parse().expect("addr");
        let listener: SocketAddr = "[::1]:15001".parse().expect("addr");
        let mut req = natlook_request(client, listener).expect("request");
        req.rdaddr.bytes = "2606:4700::1".parse::<Ipv6Addr>().expect("ip").octets();
        req.rdxport = PfStateXport::from_port(8443);
        assert_eq!(
            natlook_answer(&req),
            Ok("[2606:4700::1]:8443".parse().expect("addr"))
        );

        req.af = 10;
        assert_eq!(natlook_answer(&req), Err(NatlookError::BadAnswer(10)));
    }
}
