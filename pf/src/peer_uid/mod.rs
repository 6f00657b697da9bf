//! Which local user owns the other end of a TCP connection.
//!
//! The proxy only ever sees connections from processes on this host: either an agent's
//! outbound connection redirected to the proxy by nftables `REDIRECT`, or an agent connecting
//! to the proxy's explicit listener on loopback. Either way the client's socket lives in this
//! host's (network namespace's) TCP tables, and the kernel can tell which uid created it. That
//! uid is what the audit log records as `agent_uid`.
//!
//! On Linux the lookup is one `NETLINK_SOCK_DIAG` (`inet_diag`) request that names exactly one
//! socket by its 4-tuple, answered by one reply carrying `idiag_uid`. Other platforms are not
//! supported (see [`socket_uid`]).

use std::io;
use std::net::SocketAddr;

/// The uid owning the local socket whose address is `client` and whose peer (as that socket
/// sees it: the address it connect()ed to) is `peer`. `Ok(None)` if no such socket exists.
///
/// `client` is the connection's remote address as the proxy sees it (`TcpStream::peer_addr`
/// of the accepted stream). What to pass as `peer` depends on how the connection arrived:
///
/// * **Transparent (nftables `REDIRECT`) connection:** the client socket's peer is the
///   *original destination* the agent connected to (recovered with `SO_ORIGINAL_DST` /
///   `IP6T_SO_ORIGINAL_DST`), **not** the proxy's local address: `REDIRECT` rewrites the
///   packets, not the agent's socket.
/// * **Explicit-listener connection:** the client socket's peer is the listener's address,
///   i.e. the accepted stream's `local_addr`.
///
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, as a dual-stack listener reports IPv4
/// clients) are treated as the IPv4 addresses they map. A `client`/`peer` pair mixing IPv4 and
/// (non-mapped) IPv6 cannot name a socket and yields `Ok(None)`.
///
/// `Ok(None)` is also returned when no process holds the socket any more (the client wrote
/// and closed): a timewait record (`TIME_WAIT`, or `FIN_WAIT2` as its substate) or an orphaned
/// socket (inode 0). The kernel reports uid 0 for those; the owner is unknown, never root.
///
/// This call is **blocking but fast**: it opens a netlink socket, sends one request and reads
/// the one reply, which the kernel queues synchronously while handling the request (a few
/// microseconds in total; a 1 s receive timeout guards against the unexpected). It does no
/// other I/O, so calling it directly from an async task is acceptable.
///
/// Needs no privileges on Linux (sock_diag lookups of TCP sockets are open to all users, in
/// the caller's network namespace).
///
/// On platforms other than Linux this returns an error of kind
/// [`io::ErrorKind::Unsupported`].
#[cfg(target_os = "linux")]
pub fn socket_uid(client: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    linux::socket_uid(client, peer)
}

/// The uid owning the local socket whose address is `client` and whose peer (as that socket
/// sees it: the address it connect()ed to) is `peer`. `Ok(None)` if no such socket exists.
///
/// Not supported on this platform: always an error of kind [`io::ErrorKind::Unsupported`].
#[cfg(not(target_os = "linux"))]
pub fn socket_uid(client: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    // macOS would need the uid recorded in the pf state for the redirected connection (or
    // the owning process via libproc); out of scope for now.
    let _ = (client, peer);
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "looking up the uid owning a TCP socket is only supported on Linux",
    ))
}

/// The uid owning (and the peer of) the local UDP socket bound to `local` (a datagram's source as its receiver
/// sees it; nftables `REDIRECT` leaves the source alone). `Ok(None)` if no socket is bound
/// there (the sender closed it already).
///
/// Blocking but fast: one `sock_diag` dump of the UDP sockets (the kernel's exact UDP lookup
/// needs the socket's peer, which a redirected datagram no longer names). Needs no privileges.
#[cfg(target_os = "linux")]
pub fn udp_socket_owner(local: SocketAddr) -> io::Result<Option<UdpOwner>> {
    linux::udp_socket_owner(local)
}

/// The uid owning the UDP socket bound to `local` and connected to `peer` (`None`: not
/// connected): one exact lookup, for a socket whose peer [`udp_socket_owner`] already told.
#[cfg(target_os = "linux")]
pub fn udp_socket_uid_exact(
    local: SocketAddr,
    peer: Option<SocketAddr>,
) -> io::Result<Option<u32>> {
    linux::udp_socket_uid_exact(local, peer)
}

/// Not supported on this platform: always an error of kind [`io::ErrorKind::Unsupported`].
#[cfg(not(target_os = "linux"))]
pub fn udp_socket_uid_exact(
    local: SocketAddr,
    peer: Option<SocketAddr>,
) -> io::Result<Option<u32>> {
    let _ = (local, peer);
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "looking up the uid owning a UDP socket is only supported on Linux",
    ))
}

/// The owner of a UDP socket, and the address it is connected to, if it is (glibc's and most
/// stub resolvers connect theirs: that is where the agent sent its query).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpOwner {
    pub uid: u32,
    pub peer: Option<SocketAddr>,
}

/// Not supported on this platform: always an error of kind [`io::ErrorKind::Unsupported`].
#[cfg(not(target_os = "linux"))]
pub fn udp_socket_owner(local: SocketAddr) -> io::Result<Option<UdpOwner>> {
    let _ = local;
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "looking up the uid owning a UDP socket is only supported on Linux",
    ))
}

#[cfg(target_os = "linux")]
mod linux;
