//! The socket owner on Linux: one `NETLINK_SOCK_DIAG` (`inet_diag`) exact lookup by 4-tuple.

use std::io;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{
    AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, TCP_LISTEN, TCP_TIME_WAIT,
};
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponseHeader, SocketId, StateFlags, Timer,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::protocols::NETLINK_SOCK_DIAG;
use netlink_sys::{Socket, SocketAddr as NetlinkAddr};
use nix::errno::Errno;
use nix::sys::socket::{setsockopt, sockopt, MsgFlags};
use nix::sys::time::TimeVal;

/// Upper bound on waiting for the kernel's reply (1 s). The reply is queued while the
/// kernel handles our `send`, so in practice `recv` never waits.
const REPLY_TIMEOUT: TimeVal = TimeVal::new(1, 0);

/// Room for one `inet_diag_msg` plus the few attributes the kernel always adds. The
/// reply to an exact-match request is a couple of hundred bytes.
const RECV_BUF_LEN: usize = 8192;

/// `inet_diag_sockid.idiag_cookie` value meaning "any socket cookie"
/// (`INET_DIAG_NOCOOKIE`, both 32-bit halves all-ones). A zero cookie would make the
/// kernel compare it with the socket's cookie and answer `ESTALE`.
const NO_COOKIE: [u8; 8] = [0xff; 8];

/// Arbitrary request sequence number, checked in the reply.
const SEQ: u32 = 0x6167_7569; // "agui"

pub(super) fn socket_uid(client: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    let (src, dst) = (client.ip().to_canonical(), peer.ip().to_canonical());
    let family = match (src, dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => AF_INET,
        (IpAddr::V6(_), IpAddr::V6(_)) => AF_INET6,
        // No socket has one IPv4 and one (non-mapped) IPv6 end.
        _ => return Ok(None),
    };
    // A link-local IPv6 client socket is bound to its interface; the lookup must name it.
    let interface_id = match client {
        SocketAddr::V6(a) if family == AF_INET6 => a.scope_id(),
        _ => 0,
    };
    let wanted = SocketId {
        source_port: client.port(),
        destination_port: peer.port(),
        source_address: src,
        destination_address: dst,
        interface_id,
        cookie: NO_COOKIE,
    };

    // Exact match: no NLM_F_DUMP. No NLM_F_ACK either: the kernel answers with either the
    // socket's record or an error message, never both.
    let socket = send_request(NLM_F_REQUEST, family, IPPROTO_TCP, wanted.clone())?;

    let mut reply = Vec::with_capacity(RECV_BUF_LEN);
    // MSG_TRUNC: return the datagram's real length, so truncation is detected.
    let n = socket.recv(&mut reply, MsgFlags::MSG_TRUNC.bits())?;
    if n > reply.len() {
        return Err(invalid_data(format!(
            "sock_diag reply truncated ({n} bytes)"
        )));
    }
    parse_reply(&reply, &wanted)
}

/// Interprets the kernel's answer to the exact-match request for `wanted`.
fn parse_reply(mut buf: &[u8], wanted: &SocketId) -> io::Result<Option<u32>> {
    while !buf.is_empty() {
        let msg = NetlinkMessage::<SockDiagMessage>::deserialize(buf)
            .map_err(|e| invalid_data(format!("malformed sock_diag reply: {e}")))?;
        let len = msg.header.length as usize;
        if msg.header.sequence_number != SEQ {
            return Err(invalid_data(format!(
                "sock_diag reply has sequence number {}, expected {SEQ}",
                msg.header.sequence_number
            )));
        }
        match msg.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(resp)) => {
                let h = &resp.header;
                // The kernel's exact lookup falls back to a *listening* socket on the
                // client's address when no connection matches; that is someone else's
                // socket, not the client. Only a record naming our 4-tuple counts.
                if h.state == TCP_LISTEN || !same_socket(&h.socket_id, wanted) {
                    tracing::debug!(
                        state = h.state,
                        "sock_diag: no socket with this 4-tuple (a listener answered)"
                    );
                    return Ok(None);
                }
                let owner = owner(h);
                if owner.is_none() {
                    tracing::debug!(
                        state = h.state,
                        timer = ?h.timer,
                        inode = h.inode,
                        uid = h.uid,
                        "sock_diag: the socket keeps no owner"
                    );
                }
                return Ok(owner);
            }
            // An ACK (not requested): skip it.
            NetlinkPayload::Error(e) if e.code.is_none() => {}
            NetlinkPayload::Error(e) => {
                let err = e.to_io();
                return if err.raw_os_error() == Some(Errno::ENOENT as i32) {
                    tracing::debug!(src = %wanted.source_address, sport = wanted.source_port, dst = %wanted.destination_address, dport = wanted.destination_port, "sock_diag: no such socket");
                    Ok(None)
                } else {
                    Err(err)
                };
            }
            NetlinkPayload::Done(_) => return Ok(None),
            // Noop / overrun / anything else: skip to the next message.
            _ => {}
        }
        if len == 0 || len >= buf.len() {
            break;
        }
        // Netlink messages are 4-byte aligned.
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    Err(invalid_data("sock_diag reply without an answer".to_owned()))
}

/// The owner a record names, if it still knows it. A timewait minisocket (`TIME_WAIT`, and
/// `FIN_WAIT2` after an orphan's FIN was acknowledged: its state is the substate, its timer
/// the timewait one) keeps no owner: the kernel reports uid 0 for it, which is nobody's. An
/// orphaned full socket (its process closed it: inode 0, e.g. `FIN_WAIT1` right after a
/// write-and-close) keeps the uid that created it (`sk_uid`) on current kernels, which is
/// believed; older kernels report 0 for it, which is not (it would read as root). Unknown,
/// never root.
fn owner(h: &InetResponseHeader) -> Option<u32> {
    let timewait = h.state == TCP_TIME_WAIT || h.timer == Some(Timer::TimeWait);
    let orphan_without_uid = h.inode == 0 && h.uid == 0;
    (!timewait && !orphan_without_uid).then_some(h.uid)
}

/// The uid owning the UDP socket bound to `local` (a datagram's source address as its
/// receiver sees it). The kernel's exact UDP lookup needs the socket's peer, which a
/// redirected datagram no longer names, so this dumps the family's UDP sockets and picks the
/// one on that port: bound to exactly that address if there is one, else to the wildcard.
/// An IPv4 source is also looked for among IPv6 (dual-stack) sockets.
pub(super) fn udp_socket_owner(local: SocketAddr) -> io::Result<Option<super::UdpOwner>> {
    let ip = local.ip().to_canonical();
    let families: &[u8] = if ip.is_ipv4() {
        &[AF_INET, AF_INET6]
    } else {
        &[AF_INET6]
    };
    let mut wildcard = None;
    for family in families {
        for (id, uid) in dump_udp(*family)? {
            if id.source_port != local.port() {
                continue;
            }
            let bound = id.source_address.to_canonical();
            let owner = super::UdpOwner {
                uid,
                peer: (id.destination_port != 0).then(|| {
                    SocketAddr::new(id.destination_address.to_canonical(), id.destination_port)
                }),
            };
            if bound == ip {
                return Ok(Some(owner));
            }
            if bound.is_unspecified() && wildcard.is_none() {
                wildcard = Some(owner);
            }
        }
    }
    Ok(wildcard)
}

/// The uid owning the UDP socket bound to `local` that would receive a datagram from `peer`
/// (its connected peer; `None` for an unconnected socket): one exact `sock_diag` lookup, as
/// cheap as the TCP one. `Ok(None)` when no such socket exists.
pub(super) fn udp_socket_uid_exact(
    local: SocketAddr,
    peer: Option<SocketAddr>,
) -> io::Result<Option<u32>> {
    let ip = local.ip().to_canonical();
    let (family, any) = match ip {
        IpAddr::V4(_) => (AF_INET, IpAddr::from([0u8; 4])),
        IpAddr::V6(_) => (AF_INET6, IpAddr::from([0u8; 16])),
    };
    let (remote, remote_port) = match peer {
        Some(p) if p.ip().to_canonical().is_ipv4() == ip.is_ipv4() => {
            (p.ip().to_canonical(), p.port())
        }
        Some(_) => return Ok(None),
        None => (any, 0),
    };
    // For UDP the kernel reads the request as a datagram's addresses: source = the socket's
    // peer, destination = the socket itself.
    let id = SocketId {
        source_port: remote_port,
        destination_port: local.port(),
        source_address: remote,
        destination_address: ip,
        interface_id: 0,
        cookie: NO_COOKIE,
    };
    let socket = send_request(NLM_F_REQUEST, family, IPPROTO_UDP, id)?;
    let mut reply = Vec::with_capacity(RECV_BUF_LEN);
    let n = socket.recv(&mut reply, MsgFlags::MSG_TRUNC.bits())?;
    if n > reply.capacity() {
        return Err(invalid_data(format!(
            "sock_diag reply truncated ({n} bytes)"
        )));
    }
    let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&reply)
        .map_err(|e| invalid_data(format!("malformed sock_diag reply: {e}")))?;
    match msg.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(resp)) => {
            let got = &resp.header.socket_id;
            let bound = got.source_address.to_canonical();
            let same = got.source_port == local.port() && (bound == ip || bound.is_unspecified());
            Ok(same.then_some(resp.header.uid))
        }
        NetlinkPayload::Error(e) if e.code.is_some() => {
            let err = e.to_io();
            if err.raw_os_error() == Some(Errno::ENOENT as i32) {
                Ok(None)
            } else {
                Err(err)
            }
        }
        _ => Ok(None),
    }
}

/// Every UDP socket of `family` in this network namespace: (its id, its owner).
fn dump_udp(family: u8) -> io::Result<Vec<(SocketId, u32)>> {
    let any = match family {
        AF_INET => IpAddr::from([0u8; 4]),
        _ => IpAddr::from([0u8; 16]),
    };
    let id = SocketId {
        source_port: 0,
        destination_port: 0,
        source_address: any,
        destination_address: any,
        interface_id: 0,
        cookie: NO_COOKIE,
    };
    let socket = send_request(NLM_F_REQUEST | NLM_F_DUMP, family, IPPROTO_UDP, id)?;
    let mut found = Vec::new();
    loop {
        let mut reply = Vec::with_capacity(RECV_BUF_LEN * 4);
        let n = socket.recv(&mut reply, MsgFlags::MSG_TRUNC.bits())?;
        if n > reply.capacity() {
            return Err(invalid_data(format!(
                "sock_diag dump part truncated ({n} bytes)"
            )));
        }
        let mut buf = &reply[..];
        while !buf.is_empty() {
            let msg = NetlinkMessage::<SockDiagMessage>::deserialize(buf)
                .map_err(|e| invalid_data(format!("malformed sock_diag dump: {e}")))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(resp)) => {
                    found.push((resp.header.socket_id.clone(), resp.header.uid));
                }
                NetlinkPayload::Done(_) => return Ok(found),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                _ => {}
            }
            if len == 0 || len >= buf.len() {
                break;
            }
            buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        }
    }
}

/// A `sock_diag` socket that has sent one `inet_diag` request (`flags`: exact or dump) for
/// sockets of `family` and `protocol` matching `id`; the reply is the caller's to read.
fn send_request(flags: u16, family: u8, protocol: u8, id: SocketId) -> io::Result<Socket> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = SEQ;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: id,
        })
        .into(),
    );
    request.finalize();
    let mut out = vec![0u8; request.buffer_len()];
    request.serialize(&mut out);
    let socket = Socket::new(NETLINK_SOCK_DIAG)?;
    setsockopt(&socket, sockopt::ReceiveTimeout, &REPLY_TIMEOUT).map_err(io::Error::from)?;
    // Port 0 is the kernel.
    socket.connect(&NetlinkAddr::new(0, 0))?;
    let sent = socket.send(&out, 0)?;
    if sent != out.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short write of sock_diag request",
        ));
    }
    Ok(socket)
}

/// Whether the record `got` describes the socket `wanted` (addresses compared with
/// IPv4-mapped IPv6 folded to IPv4, since an `AF_INET6` socket talking IPv4 is reported
/// with mapped addresses).
fn same_socket(got: &SocketId, wanted: &SocketId) -> bool {
    got.source_port == wanted.source_port
        && got.destination_port == wanted.destination_port
        && got.source_address.to_canonical() == wanted.source_address
        && got.destination_address.to_canonical() == wanted.destination_address
}

fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::socket_uid;
    use std::io::{BufRead, BufReader, Read};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::path::Path;
    use std::process::{Child, Command, Stdio};

    fn euid() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    /// Connects to a fresh listener on `ip` and checks the lookup from the proxy's point of
    /// view: `client` = accepted stream's peer, `peer` = listener's address.
    fn own_connection_on(ip: &str) {
        let listener = TcpListener::bind((ip, 0)).expect("bind listener");
        let listen_addr = listener.local_addr().expect("listener addr");
        let client = TcpStream::connect(listen_addr).expect("connect");
        let (accepted, client_addr) = listener.accept().expect("accept");
        assert_eq!(client_addr, client.local_addr().expect("client addr"));
        assert_eq!(accepted.local_addr().expect("accepted addr"), listen_addr);

        assert_eq!(
            socket_uid(client_addr, listen_addr).expect("lookup"),
            Some(euid())
        );
        // The server side of the same connection is a different socket: reversed 4-tuple.
        assert_eq!(
            socket_uid(listen_addr, client_addr).expect("lookup"),
            Some(euid())
        );
    }

    #[test]
    fn own_connection_ipv4() {
        own_connection_on("127.0.0.1");
    }

    #[test]
    fn own_connection_ipv6() {
        if TcpListener::bind(("::1", 0)).is_err() {
            eprintln!("skipped: IPv6 loopback unavailable");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "IPv6 loopback unavailable under CI"
            );
            return;
        }
        own_connection_on("::1");
    }

    #[test]
    fn ipv4_mapped_addresses_are_folded() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
        let listen_addr = listener.local_addr().expect("listener addr");
        let _client = TcpStream::connect(listen_addr).expect("connect");
        let (_accepted, client_addr) = listener.accept().expect("accept");
        let mapped = |a: SocketAddr| match a {
            SocketAddr::V4(v4) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
            v6 => v6,
        };
        assert_eq!(
            socket_uid(mapped(client_addr), mapped(listen_addr)).expect("lookup"),
            Some(euid())
        );
        assert_eq!(
            socket_uid(mapped(client_addr), listen_addr).expect("lookup"),
            Some(euid())
        );
    }

    #[test]
    fn unknown_four_tuple_is_none() {
        // Free ports: bind, note, drop.
        let free_port = || {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port()
        };
        let a: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let b: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        assert_eq!(socket_uid(a, b).expect("lookup"), None);

        let a6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, free_port()).into();
        let b6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, free_port()).into();
        assert_eq!(socket_uid(a6, b6).expect("lookup"), None);

        // Mixed families cannot name a socket.
        assert_eq!(socket_uid(a, b6).expect("lookup"), None);
    }

    #[test]
    fn udp_sockets_are_found_by_their_bound_address() {
        let udp_socket_uid = |a: SocketAddr| super::udp_socket_owner(a).map(|o| o.map(|o| o.uid));
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let addr = sock.local_addr().expect("addr");
        assert_eq!(udp_socket_uid(addr).expect("lookup"), Some(euid()));
        // Connected, as glibc's resolver leaves its socket: still found.
        sock.connect("127.0.0.1:9").expect("connect");
        let owner = super::udp_socket_owner(addr)
            .expect("lookup")
            .expect("found");
        assert_eq!(owner.uid, euid());
        assert_eq!(owner.peer, Some(([127, 0, 0, 1], 9).into()));
        // A wildcard-bound socket answers for any address on its port.
        let any = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
        let port = any.local_addr().expect("addr").port();
        let seen: SocketAddr = ([127, 0, 0, 1], port).into();
        assert_eq!(udp_socket_uid(seen).expect("lookup"), Some(euid()));
        // The exact lookup: the unconnected socket with no peer, the connected one with its own.
        use super::udp_socket_uid_exact as exact;
        assert_eq!(exact(seen, None).expect("lookup"), Some(euid()));
        assert_eq!(
            exact(addr, Some(([127, 0, 0, 1], 9).into())).expect("lookup"),
            Some(euid())
        );
        assert_eq!(
            exact(addr, Some(([127, 0, 0, 1], 10).into())).expect("lookup"),
            None
        );
        drop((sock, any));
        assert_eq!(udp_socket_uid(addr).expect("lookup"), None);
        assert_eq!(exact(seen, None).expect("lookup"), None);
    }

    /// The kernel's reply to an exact lookup of `id`: one record with these fields.
    fn reply(
        id: &super::SocketId,
        state: u8,
        timer: Option<super::Timer>,
        uid: u32,
        inode: u32,
    ) -> Vec<u8> {
        use netlink_packet_core::{NetlinkHeader, NetlinkMessage};
        use netlink_packet_sock_diag::inet::{InetResponse, InetResponseHeader};
        use netlink_packet_sock_diag::SockDiagMessage;
        let mut header = NetlinkHeader::default();
        header.sequence_number = super::SEQ;
        let mut msg = NetlinkMessage::new(
            header,
            SockDiagMessage::InetResponse(Box::new(InetResponse {
                header: InetResponseHeader {
                    family: super::AF_INET,
                    state,
                    timer,
                    socket_id: id.clone(),
                    recv_queue: 0,
                    send_queue: 0,
                    uid,
                    inode,
                },
                nlas: Default::default(),
            }))
            .into(),
        );
        msg.finalize();
        let mut out = vec![0u8; msg.buffer_len()];
        msg.serialize(&mut out);
        out
    }

    /// Records of sockets no process holds any more carry uid 0: their owner is unknown,
    /// never root. A live socket's record is believed.
    #[test]
    fn records_of_let_go_sockets_name_no_owner() {
        use netlink_packet_sock_diag::constants::{
            TCP_ESTABLISHED, TCP_FIN_WAIT1, TCP_FIN_WAIT2, TCP_TIME_WAIT,
        };
        let id = super::SocketId {
            source_port: 40000,
            destination_port: 443,
            source_address: [127, 0, 0, 1].into(),
            destination_address: [10, 0, 0, 1].into(),
            interface_id: 0,
            cookie: super::NO_COOKIE,
        };
        let parse = |state, timer, uid, inode| {
            super::parse_reply(&reply(&id, state, timer, uid, inode), &id).expect("parses")
        };
        assert_eq!(parse(TCP_ESTABLISHED, None, 5200, 7711), Some(5200));
        // The process closed its socket before the FIN was acknowledged: an orphan.
        assert_eq!(parse(TCP_FIN_WAIT1, None, 0, 0), None, "orphaned socket");
        // Acknowledged: a timewait minisocket in its FIN_WAIT2 substate.
        assert_eq!(
            parse(TCP_FIN_WAIT2, Some(super::Timer::TimeWait), 0, 0),
            None,
            "FIN_WAIT2 timewait record"
        );
        assert_eq!(
            parse(TCP_TIME_WAIT, Some(super::Timer::TimeWait), 0, 0),
            None
        );
        // Whatever uid a timewait record carries, it is not believed.
        assert_eq!(
            parse(TCP_FIN_WAIT2, Some(super::Timer::TimeWait), 5200, 0),
            None
        );
        // An orphan that still names its creator (current kernels keep `sk_uid`): believed.
        assert_eq!(parse(TCP_FIN_WAIT1, None, 5200, 0), Some(5200));
    }

    /// A real write-and-close: by the time the proxy looks, the client's socket is a
    /// timewait minisocket the kernel reports as uid 0. Unknown, not root.
    #[test]
    fn a_closed_client_socket_has_no_owner() {
        use std::io::Write;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
        let listen_addr = listener.local_addr().expect("listener addr");
        let mut client = TcpStream::connect(listen_addr).expect("connect");
        let (_accepted, client_addr) = listener.accept().expect("accept");
        assert_eq!(
            socket_uid(client_addr, listen_addr).expect("lookup"),
            Some(euid())
        );
        client.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
        drop(client);
        // Loopback delivers the FIN and its ACK within the close; allow for a slow machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let seen = socket_uid(client_addr, listen_addr).expect("lookup");
            if seen.is_none() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a closed socket still reads as owned by uid {seen:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn listening_socket_is_not_a_client() {
        // The kernel's exact lookup falls back to a listener bound to the "client" address;
        // that must not be reported as the client's owner.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
        let listen_addr = listener.local_addr().expect("listener addr");
        let elsewhere: SocketAddr = ([127, 0, 0, 1], 9).into();
        assert_eq!(socket_uid(listen_addr, elsewhere).expect("lookup"), None);
    }

    /// Kills and reaps the child when dropped, so a failing assertion does not leak it.
    struct KillOnDrop(Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn skip_or_fail(why: &str) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cannot run under CI: {why}"
        );
        eprintln!("skipped: {why}");
    }

    #[test]
    fn other_users_connection() {
        const NOBODY: u32 = 65534;
        if euid() != 0 {
            skip_or_fail("needs root to run a client as uid 65534 (setpriv)");
            return;
        }
        // An absolute interpreter path: one under root's home (pyenv) is not executable by
        // uid 65534.
        let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
            .into_iter()
            .find(|p| Path::new(p).exists())
        else {
            skip_or_fail("no system python3 to run as uid 65534");
            return;
        };
        let Some(setpriv) = ["/usr/bin/setpriv", "/bin/setpriv"]
            .into_iter()
            .find(|p| Path::new(p).exists())
        else {
            skip_or_fail("setpriv (util-linux) not installed");
            return;
        };

        let listener = TcpListener::bind("127.0.0.1:0").expect("bind listener");
        let listen_addr = listener.local_addr().expect("listener addr");
        let script = format!(
            "import socket,time; s=socket.create_connection(('127.0.0.1',{})); \
             print(s.getsockname()[1], flush=True); time.sleep(5)",
            listen_addr.port()
        );
        let child = Command::new(setpriv)
            .args([
                &format!("--reuid={NOBODY}"),
                &format!("--regid={NOBODY}"),
                "--clear-groups",
                python,
                "-c",
                &script,
            ])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn setpriv");
        let mut child = KillOnDrop(child);

        let mut line = String::new();
        let stdout = child.0.stdout.take().expect("child stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read child's port");
        if line.trim().is_empty() {
            let mut err = String::new();
            if let Some(mut e) = child.0.stderr.take() {
                let _ = child.0.kill();
                let _ = e.read_to_string(&mut err);
            }
            panic!("child printed no port; stderr: {err}");
        }
        let port: u16 = line.trim().parse().expect("child's port");
        let client_addr: SocketAddr = ([127, 0, 0, 1], port).into();

        // The connection completed in the backlog; accepting it is what the proxy does and
        // confirms the 4-tuple.
        let (_accepted, accepted_peer) = listener.accept().expect("accept");
        assert_eq!(accepted_peer, client_addr);

        assert_eq!(
            socket_uid(client_addr, listen_addr).expect("lookup"),
            Some(NOBODY)
        );
        drop(child);
    }
}
