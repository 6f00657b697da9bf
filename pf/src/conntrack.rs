//! What conntrack recorded of a redirected connection: its 4-tuple as the client sent it.
//!
//! Why the proxy needs it: nf_nat keeps every connection's *reply* tuple unique. Everything an
//! agent sends to the transparent listener has the reply tuple `listener -> agent addr:port`,
//! whatever the original destination, so when an agent reuses source port P for a new
//! destination while conntrack still holds an earlier connection from P (its `TIME_WAIT`
//! lasts 120 s), the two reply tuples would be equal and nf_nat moves the new connection's
//! *source* port (P -> P'). The proxy then sees the client at P', where no socket is, while
//! the agent's socket is bound to P: the `sock_diag` lookup of the client's socket finds
//! nothing. Conntrack still holds the tuple as sent (source P); asking it by the reply tuple
//! (what the accepted socket's own addresses are) gives P back.
//!
//! On Linux the lookup is one `NETLINK_NETFILTER` ctnetlink `IPCTNL_MSG_CT_GET` naming the
//! reply tuple, answered by the one entry (or `ENOENT`). ctnetlink answers only callers with
//! `CAP_NET_ADMIN`.

use std::io;
use std::net::SocketAddr;

/// A connection's 4-tuple as its client sent it, before NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrigTuple {
    /// The client socket's own address (its real source port).
    pub src: SocketAddr,
    /// Where the client was going (what `SO_ORIGINAL_DST` reports).
    pub dst: SocketAddr,
}

/// Conntrack's original tuple of the TCP connection that arrived at `local` from `peer` (the
/// accepted socket's `local_addr` and `peer_addr`: the connection's reply tuple, reversed).
/// `Ok(None)` when conntrack tracks no such connection.
///
/// Blocking but fast: one netlink request and its one reply (1 s receive timeout). Needs
/// `CAP_NET_ADMIN`; without it the error is of kind [`io::ErrorKind::PermissionDenied`].
#[cfg(target_os = "linux")]
pub fn original_tuple(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<OrigTuple>> {
    linux::original_tuple(local, peer)
}

/// Not supported on this platform: always an error of kind [`io::ErrorKind::Unsupported`].
#[cfg(not(target_os = "linux"))]
pub fn original_tuple(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<OrigTuple>> {
    let _ = (local, peer);
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "conntrack lookups are only supported on Linux",
    ))
}

#[cfg(target_os = "linux")]
mod linux {
    use std::io;
    use std::net::{IpAddr, SocketAddr};

    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_netfilter::conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
    };
    use netlink_packet_netfilter::{
        NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    };
    use netlink_sys::protocols::NETLINK_NETFILTER;
    use netlink_sys::{Socket, SocketAddr as NetlinkAddr};
    use nix::errno::Errno;
    use nix::sys::socket::{setsockopt, sockopt, MsgFlags};
    use nix::sys::time::TimeVal;

    use super::OrigTuple;

    /// Upper bound on waiting for the kernel's reply (1 s); it is queued while the kernel
    /// handles our `send`.
    const REPLY_TIMEOUT: TimeVal = TimeVal::new(1, 0);

    /// Room for one conntrack entry with every attribute the kernel adds (a few hundred bytes).
    const RECV_BUF_LEN: usize = 8192;

    /// Request sequence number, checked in the reply.
    const SEQ: u32 = 0x6374_6167; // "ctag"

    pub(super) fn original_tuple(
        local: SocketAddr,
        peer: SocketAddr,
    ) -> io::Result<Option<OrigTuple>> {
        let (src, dst) = (local.ip().to_canonical(), peer.ip().to_canonical());
        let family = match (src, dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => NetfilterProtoFamily::IPv4,
            (IpAddr::V6(_), IpAddr::V6(_)) => NetfilterProtoFamily::IPv6,
            // No connection has one IPv4 and one (non-mapped) IPv6 end.
            _ => return Ok(None),
        };
        // The reply direction: from the listener back to the client as the proxy sees it.
        let reply = (
            SocketAddr::new(src, local.port()),
            SocketAddr::new(dst, peer.port()),
        );
        let request = request(family, reply);
        let socket = Socket::new(NETLINK_NETFILTER)?;
        setsockopt(&socket, sockopt::ReceiveTimeout, &REPLY_TIMEOUT).map_err(io::Error::from)?;
        // Port 0 is the kernel.
        socket.connect(&NetlinkAddr::new(0, 0))?;
        let sent = socket.send(&request, 0)?;
        if sent != request.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short write of a ctnetlink request",
            ));
        }
        let mut answer = Vec::with_capacity(RECV_BUF_LEN);
        // MSG_TRUNC: the datagram's real length, so truncation is detected.
        let n = socket.recv(&mut answer, MsgFlags::MSG_TRUNC.bits())?;
        if n > answer.capacity() {
            return Err(invalid_data(format!(
                "ctnetlink reply truncated ({n} bytes)"
            )));
        }
        parse_reply(&answer, reply)
    }

    /// One `IPCTNL_MSG_CT_GET` naming the TCP connection whose reply tuple is `reply`.
    pub(super) fn request(
        family: NetfilterProtoFamily,
        (src, dst): (SocketAddr, SocketAddr),
    ) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        // One entry, not a dump; no ACK: the kernel answers with the entry or an error.
        header.flags = NLM_F_REQUEST;
        header.sequence_number = SEQ;
        let tuple = vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.ip()),
                IPTuple::DestinationAddress(dst.ip()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Tcp),
                ProtoTuple::SourcePort(src.port()),
                ProtoTuple::DestinationPort(dst.port()),
            ]),
        ];
        let mut msg = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(family, 0, 0),
                ConntrackMessage::Get(vec![ConntrackAttribute::CtaTupleReply(tuple)]),
            )),
        );
        msg.finalize();
        let mut out = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut out);
        out
    }

    /// Interprets the kernel's answer to the request for the connection whose reply tuple
    /// is `reply`: its original tuple, `None` if conntrack has no such entry.
    pub(super) fn parse_reply(
        mut buf: &[u8],
        reply: (SocketAddr, SocketAddr),
    ) -> io::Result<Option<OrigTuple>> {
        while !buf.is_empty() {
            let msg = NetlinkMessage::<NetfilterMessage>::deserialize(buf)
                .map_err(|e| invalid_data(format!("malformed ctnetlink reply: {e}")))?;
            let len = msg.header.length as usize;
            if msg.header.sequence_number != SEQ {
                return Err(invalid_data(format!(
                    "ctnetlink reply has sequence number {}, expected {SEQ}",
                    msg.header.sequence_number
                )));
            }
            match msg.payload {
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)),
                    ..
                }) => return entry(&attrs, reply).map(Some),
                NetlinkPayload::Error(e) if e.code.is_none() => {}
                NetlinkPayload::Error(e) => {
                    let err = e.to_io();
                    return if err.raw_os_error() == Some(Errno::ENOENT as i32) {
                        Ok(None)
                    } else {
                        Err(err)
                    };
                }
                NetlinkPayload::Done(_) => return Ok(None),
                _ => {}
            }
            if len == 0 || len >= buf.len() {
                break;
            }
            // Netlink messages are 4-byte aligned.
            buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        }
        Err(invalid_data("ctnetlink reply without an answer".to_owned()))
    }

    /// The original tuple of an entry, which must be the one asked for (its reply tuple
    /// `reply`) and a TCP one.
    fn entry(
        attrs: &[ConntrackAttribute],
        reply: (SocketAddr, SocketAddr),
    ) -> io::Result<OrigTuple> {
        let mut orig = None;
        let mut got_reply = None;
        for a in attrs {
            match a {
                ConntrackAttribute::CtaTupleOrig(t) => orig = tcp_tuple(t),
                ConntrackAttribute::CtaTupleReply(t) => got_reply = tcp_tuple(t),
                _ => {}
            }
        }
        let canonical = |(s, d): (SocketAddr, SocketAddr)| {
            (
                SocketAddr::new(s.ip().to_canonical(), s.port()),
                SocketAddr::new(d.ip().to_canonical(), d.port()),
            )
        };
        if got_reply.map(canonical) != Some(reply) {
            return Err(invalid_data(format!(
                "ctnetlink answered about another connection (reply tuple {got_reply:?})"
            )));
        }
        let (src, dst) = orig
            .map(canonical)
            .ok_or_else(|| invalid_data("ctnetlink entry without a TCP original tuple".into()))?;
        Ok(OrigTuple { src, dst })
    }

    /// A TCP tuple's two ends; `None` if a part is missing or it is not TCP.
    fn tcp_tuple(parts: &[Tuple]) -> Option<(SocketAddr, SocketAddr)> {
        let (mut src_ip, mut dst_ip, mut src_port, mut dst_port, mut tcp) =
            (None, None, None, None, false);
        for part in parts {
            match part {
                Tuple::Ip(ips) => {
                    for ip in ips {
                        match ip {
                            IPTuple::SourceAddress(a) => src_ip = Some(*a),
                            IPTuple::DestinationAddress(a) => dst_ip = Some(*a),
                            _ => {}
                        }
                    }
                }
                Tuple::Proto(protos) => {
                    for p in protos {
                        match p {
                            ProtoTuple::Protocol(p) => tcp = *p == Protocol::Tcp,
                            ProtoTuple::SourcePort(port) => src_port = Some(*port),
                            ProtoTuple::DestinationPort(port) => dst_port = Some(*port),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        tcp.then_some(())?;
        Some((
            SocketAddr::new(src_ip?, src_port?),
            SocketAddr::new(dst_ip?, dst_port?),
        ))
    }

    fn invalid_data(msg: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, msg)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn addr(s: &str) -> SocketAddr {
            s.parse().expect("addr")
        }

        fn tuple(src: SocketAddr, dst: SocketAddr, proto: Protocol) -> Vec<Tuple> {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(src.ip()),
                    IPTuple::DestinationAddress(dst.ip()),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(proto),
                    ProtoTuple::SourcePort(src.port()),
                    ProtoTuple::DestinationPort(dst.port()),
                ]),
            ]
        }

        /// The kernel's answer to a GET: an `IPCTNL_MSG_CT_NEW` message carrying the entry.
        fn kernel_entry(attrs: Vec<ConntrackAttribute>) -> Vec<u8> {
            let mut header = NetlinkHeader::default();
            header.sequence_number = SEQ;
            let mut msg = NetlinkMessage::new(
                header,
                NetlinkPayload::from(NetfilterMessage::new(
                    NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
                    ConntrackMessage::New(attrs),
                )),
            );
            msg.finalize();
            let mut out = vec![0u8; msg.buffer_len()];
            msg.serialize(&mut out);
            out
        }

        /// The clash: the agent sent from port 41234 to 127.0.0.2:8443, nf_nat moved the
        /// source to 38890, and the proxy (127.0.0.1:15001) saw 38890.
        #[test]
        fn the_original_tuple_names_the_port_the_agent_bound() {
            let (orig_src, orig_dst) = (addr("127.0.0.1:41234"), addr("127.0.0.2:8443"));
            let reply = (addr("127.0.0.1:15001"), addr("127.0.0.1:38890"));
            let buf = kernel_entry(vec![
                ConntrackAttribute::CtaTupleOrig(tuple(orig_src, orig_dst, Protocol::Tcp)),
                ConntrackAttribute::CtaTupleReply(tuple(reply.0, reply.1, Protocol::Tcp)),
                ConntrackAttribute::CtaMark(0),
            ]);
            assert_eq!(
                parse_reply(&buf, reply).expect("parses"),
                Some(OrigTuple {
                    src: orig_src,
                    dst: orig_dst
                })
            );
        }

        #[test]
        fn an_entry_for_another_connection_or_not_tcp_is_an_error() {
            let (orig_src, orig_dst) = (addr("127.0.0.1:41234"), addr("127.0.0.2:8443"));
            let reply = (addr("127.0.0.1:15001"), addr("127.0.0.1:38890"));
            let other = (addr("127.0.0.1:15001"), addr("127.0.0.1:38891"));
            let buf = kernel_entry(vec![
                ConntrackAttribute::CtaTupleOrig(tuple(orig_src, orig_dst, Protocol::Tcp)),
                ConntrackAttribute::CtaTupleReply(tuple(other.0, other.1, Protocol::Tcp)),
            ]);
            parse_reply(&buf, reply).expect_err("another connection");
            let buf = kernel_entry(vec![
                ConntrackAttribute::CtaTupleOrig(tuple(orig_src, orig_dst, Protocol::Udp)),
                ConntrackAttribute::CtaTupleReply(tuple(reply.0, reply.1, Protocol::Udp)),
            ]);
            parse_reply(&buf, reply).expect_err("not TCP");
            let buf = kernel_entry(vec![ConntrackAttribute::CtaTupleReply(tuple(
                reply.0,
                reply.1,
                Protocol::Tcp,
            ))]);
            parse_reply(&buf, reply).expect_err("no original tuple");
            parse_reply(&[0u8; 7], reply).expect_err("garbage");
        }

        /// The request is the tuple asked for, read back as the kernel reads it.
        #[test]
        fn the_request_names_the_reply_tuple() {
            let reply = (addr("[::1]:15001"), addr("[::1]:38890"));
            let buf = request(NetfilterProtoFamily::IPv6, reply);
            let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&buf).expect("parses");
            assert_eq!(msg.header.flags, NLM_F_REQUEST);
            let NetlinkPayload::InnerMessage(NetfilterMessage {
                header,
                inner: NetfilterMessageInner::Conntrack(ConntrackMessage::Get(attrs)),
                ..
            }) = msg.payload
            else {
                panic!("not a conntrack GET: {:?}", msg.payload);
            };
            assert_eq!(header.family, NetfilterProtoFamily::IPv6);
            assert_eq!(
                attrs,
                vec![ConntrackAttribute::CtaTupleReply(tuple(
                    reply.0,
                    reply.1,
                    Protocol::Tcp
                ))]
            );
        }

        /// Against the kernel: a tuple nobody uses is not tracked (root), or ctnetlink
        /// refuses the caller (not root). Either way the request is well formed: a malformed
        /// one would be `EINVAL`.
        #[test]
        fn the_kernel_answers_an_unknown_tuple() {
            let got = original_tuple(addr("127.0.0.1:9"), addr("127.0.0.1:10"));
            if nix::unistd::geteuid().is_root() {
                assert_eq!(got.expect("lookup"), None);
            } else {
                assert_eq!(
                    got.expect_err("not root").kind(),
                    io::ErrorKind::PermissionDenied
                );
            }
        }
    }
}
