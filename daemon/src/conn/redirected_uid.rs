//! The agent behind a redirected connection: the uid owning its client socket.
//!
//! First the exact `sock_diag` lookup of the socket where the proxy sees it (its address as
//! the accepted stream's peer, connected to the original destination). That misses when
//! nf_nat moved the client's source port on the way: a new connection from port P whose
//! reply tuple (`listener -> agent:P`) equals that of an earlier connection conntrack still
//! holds (any destination, up to 120 s after it closed) gets a new source port P', and the
//! proxy sees P' where no socket is. Then conntrack's original tuple of the connection
//! (`OrigDst::orig_tuple`: ctnetlink, or the supervisor's answer in a split daemon) names P,
//! and the socket is looked up there. Nothing else is guessed: a socket found by neither
//! lookup leaves the owner unknown, and the listener refuses the connection.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;

use agenshield_pf::OrigDst;

use crate::conn::accept::agent_uid;

/// The uid owning the client socket of a connection accepted at `local` from `peer` whose
/// original destination is `dst` (`local` too for one that was dialed directly).
pub(crate) fn redirected_agent_uid(
    orig: &dyn OrigDst,
    sock: BorrowedFd<'_>,
    local: SocketAddr,
    peer: SocketAddr,
    dst: SocketAddr,
) -> Option<u32> {
    if let Some(uid) = agent_uid(peer, &[dst, local]) {
        return Some(uid);
    }
    let tuple = match orig.orig_tuple(sock, local, peer) {
        Ok(Some(t)) => t,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!("agent uid of {peer}: conntrack's original tuple: {e}");
            return None;
        }
    };
    let src = moved_source(tuple, peer, dst)?;
    let uid = agent_uid(src, &[dst]);
    if uid.is_some() {
        tracing::debug!(
            agent = %src,
            seen = %peer,
            "nf_nat moved the agent's source port: its socket found by conntrack's original tuple"
        );
    }
    uid
}

/// Where the client socket really is, if conntrack's tuple says NAT moved it: the tuple must
/// be headed where the connection was (`dst`) and come from elsewhere than `peer` (else the
/// exact lookup already looked there).
fn moved_source(
    tuple: agenshield_pf::OrigTuple,
    peer: SocketAddr,
    dst: SocketAddr,
) -> Option<SocketAddr> {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    if canonical(tuple.dst) != canonical(dst) {
        tracing::debug!(
            conntrack_dst = %tuple.dst,
            %dst,
            "conntrack's original tuple is headed elsewhere: not used"
        );
        return None;
    }
    (canonical(tuple.src) != canonical(peer)).then_some(tuple.src)
}

#[cfg(test)]
mod tests {
    use super::moved_source;
    use agenshield_pf::OrigTuple;
    use std::net::SocketAddr;

    fn a(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    #[test]
    fn only_a_tuple_to_the_same_destination_from_another_port_moves_the_source() {
        let dst = a("127.0.0.2:8443");
        let seen = a("127.0.0.1:38890");
        let sent = a("127.0.0.1:41234");
        let t = |src, dst| OrigTuple { src, dst };
        assert_eq!(moved_source(t(sent, dst), seen, dst), Some(sent));
        // IPv4-mapped as a dual-stack listener reports it: the same addresses.
        let mapped = a("[::ffff:127.0.0.2]:8443");
        assert_eq!(moved_source(t(sent, mapped), seen, dst), Some(sent));
        // Not moved: the exact lookup looked there already.
        assert_eq!(moved_source(t(seen, dst), seen, dst), None);
        // Headed elsewhere: not this connection's tuple.
        assert_eq!(moved_source(t(sent, a("127.0.0.2:8080")), seen, dst), None);
    }
}
