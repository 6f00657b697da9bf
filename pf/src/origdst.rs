//! Original destination (and, when NAT moved it, source) of a redirected TCP connection.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use crate::conntrack::OrigTuple;

/// Why the original destination of a connection could not be recovered.
#[derive(Debug, thiserror::Error)]
pub enum OrigDstError {
    #[error("original destination lookup failed: {0}")]
    Lookup(#[source] std::io::Error),
    #[error("original destination lookup is not available on this platform yet ({0})")]
    Unsupported(&'static str),
}

/// Recovers where a redirected connection was originally headed.
///
/// `local` is the address the connection was accepted on, `peer` the client's address; some
/// backends (pf's natlook) need them, the Linux one reads the socket alone.
pub trait OrigDst: Send + Sync + 'static {
    fn orig_dst(
        &self,
        sock: BorrowedFd<'_>,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Result<SocketAddr, OrigDstError>;

    /// The connection's 4-tuple as the client sent it (conntrack's original tuple): where
    /// its socket really is when NAT moved its source port on the way (see
    /// [`crate::conntrack`]). `Ok(None)`: not known to this lookup.
    fn orig_tuple(
        &self,
        sock: BorrowedFd<'_>,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Result<Option<OrigTuple>, OrigDstError> {
        let _ = (sock, local, peer);
        Ok(None)
    }

    /// A short name for logs ("so_original_dst", "fixed", ...).
    fn name(&self) -> &'static str;
}

/// Every connection claims the same original destination. For tests only: it lets the
/// transparent listener run on loopback without firewall rules.
#[derive(Debug, Clone, Copy)]
pub struct FixedOrigDst(pub SocketAddr);

impl OrigDst for FixedOrigDst {
    fn orig_dst(
        &self,
        _sock: BorrowedFd<'_>,
        _local: SocketAddr,
        _peer: SocketAddr,
    ) -> Result<SocketAddr, OrigDstError> {
        Ok(self.0)
    }

    fn name(&self) -> &'static str {
        "fixed"
    }
}

/// The lookup for the platform we run on.
pub fn platform_orig_dst() -> Box<dyn OrigDst> {
    #[cfg(target_os = "linux")]
    {
        Box::new(linux::SoOriginalDst)
    }
    #[cfg(target_os = "macos")]
    {
        Box::new(crate::pf::PfNatlook::new())
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Box::new(Unsupported)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
struct Unsupported;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
impl OrigDst for Unsupported {
    fn orig_dst(
        &self,
        _sock: BorrowedFd<'_>,
        _local: SocketAddr,
        _peer: SocketAddr,
    ) -> Result<SocketAddr, OrigDstError> {
        Err(OrigDstError::Unsupported(
            "no original-destination lookup for this operating system",
        ))
    }

    fn name(&self) -> &'static str {
        "unsupported"
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::{OrigDst, OrigDstError, OrigTuple};
    use nix::sys::socket::{getsockopt, sockopt};
    use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::BorrowedFd;

    /// netfilter's `SO_ORIGINAL_DST` (v4) / `IP6T_SO_ORIGINAL_DST` (v6): the destination
    /// conntrack recorded before the nat `redirect` rewrote it.
    pub(super) struct SoOriginalDst;

    impl OrigDst for SoOriginalDst {
        fn orig_dst(
            &self,
            sock: BorrowedFd<'_>,
            local: SocketAddr,
            _peer: SocketAddr,
        ) -> Result<SocketAddr, OrigDstError> {
            let lookup = |e: nix::Error| OrigDstError::Lookup(std::io::Error::from(e));
            match local {
                SocketAddr::V4(_) => {
                    let sin = getsockopt(&sock, sockopt::OriginalDst).map_err(lookup)?;
                    let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    Ok(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
                }
                SocketAddr::V6(_) => {
                    let sin6 = getsockopt(&sock, sockopt::Ip6tOriginalDst).map_err(lookup)?;
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                    Ok(SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), 0, 0).into())
                }
            }
        }

        /// ctnetlink, by the reply tuple (the socket's own two addresses). Needs
        /// `CAP_NET_ADMIN`: a split daemon's worker asks its supervisor instead.
        fn orig_tuple(
            &self,
            _sock: BorrowedFd<'_>,
            local: SocketAddr,
            peer: SocketAddr,
        ) -> Result<Option<OrigTuple>, OrigDstError> {
            crate::conntrack::original_tuple(local, peer).map_err(OrigDstError::Lookup)
        }

        fn name(&self) -> &'static str {
            "so_original_dst"
        }
    }
}
