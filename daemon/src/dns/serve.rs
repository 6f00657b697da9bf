//! The stub's loops. UDP: one datagram is one question, read while fewer than
//! [`MAX_UNATTRIBUTED`] wait for their owner to be found, each answered by its own task once
//! its agent's budget takes it (`DnsState::take`: per agent uid, so one agent's flood
//! leaves the others served). TCP: connections admitted like every other (the daemon's slots
//! and the agent's connection budget), framed by hickory-net, questions answered in order
//! under the same per-agent budget, closed after [`TCP_IDLE`] without one.
//!
//! The asker's uid is the socket owner's (`sock_diag`); its original destination is the
//! connected peer of its UDP socket (glibc and most stub resolvers connect) or the TCP
//! connection's `SO_ORIGINAL_DST`.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use std::net::SocketAddr;

use agenshield_pf::peer_uid::{self, UdpOwner};
use agenshield_pf::OrigDst;
use futures_util::StreamExt;
use hickory_resolver::net::runtime::iocompat::AsyncIoTokioAsStd;
use hickory_resolver::net::tcp::TcpStream as DnsTcpStream;
use hickory_resolver::net::DnsStreamHandle;
use hickory_resolver::proto::op::SerialMessage;
use tokio::net::{TcpListener, UdpSocket};
use tracing::Instrument;

use super::message::{respond, Asker};
use crate::conn::accept::admit;
use crate::conn::redirected_uid::redirected_agent_uid;
use crate::dns_state::{Crowded, InHand, MAX_IN_FLIGHT, MAX_IN_FLIGHT_PER_AGENT, MAX_UNATTRIBUTED};
use crate::proxy::Proxy;
use crate::record::ListenerKind;
use crate::record::{ConnCtx, Dest};

/// A TCP connection that asks nothing for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Room for the largest DNS message (a datagram is at most 64 KiB).
const MAX_MESSAGE: usize = 65_535;

pub(crate) async fn serve_udp(proxy: Arc<Proxy>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let stub = match socket.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!("DNS stub: no local address: {e}");
            return;
        }
    };
    let owners = Arc::new(UdpOwners::default());
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (n, client) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!("DNS stub {stub}: receive failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(unattributed) = proxy.dns.unattributed.clone().try_acquire_owned() else {
            proxy.dns.metrics.dropped.inc();
            tracing::debug!(%client, "DNS stub: {MAX_UNATTRIBUTED} datagrams wait for their owner; dropped");
            continue;
        };
        let bytes = buf[..n].to_vec();
        let (proxy, socket, owners) = (proxy.clone(), socket.clone(), owners.clone());
        let id = proxy.next_conn_id();
        tokio::spawn(
            async move {
                let owner = owners.owner(client);
                let uid = owner.map(|o| o.uid);
                let taken = take(&proxy, uid);
                drop(unattributed);
                let Some(_in_hand) = taken else {
                    return;
                };
                let asker = Asker {
                    conn_id: id,
                    client,
                    dst: owner.and_then(|o| o.peer).unwrap_or(stub),
                    uid,
                    udp: true,
                };
                if let Some(resp) = respond(&proxy, &asker, &bytes).await {
                    if let Err(e) = socket.send_to(&resp, client).await {
                        tracing::debug!("DNS stub: answering {client}: {e}");
                    }
                }
            }
            .instrument(tracing::info_span!("dns", id, %client, transport = "udp")),
        );
    }
}

/// A question of `uid` taken in hand, or `None` (dropped and counted) when its agent or the
/// stub has no room.
fn take(proxy: &Proxy, uid: Option<u32>) -> Option<InHand> {
    match proxy.dns.take(uid) {
        Ok(in_hand) => Some(in_hand),
        Err(crowded) => {
            proxy.dns.metrics.dropped.inc();
            match crowded {
                Crowded::Agent(agent) => tracing::debug!(
                    "DNS stub: {agent} has {} questions in hand; dropped",
                    MAX_IN_FLIGHT_PER_AGENT
                ),
                Crowded::All => {
                    tracing::debug!("DNS stub: {} questions in hand; dropped", MAX_IN_FLIGHT)
                }
            }
            None
        }
    }
}

/// Who owns the socket a datagram came from. Finding it among all UDP sockets takes a dump
/// of the kernel's whole UDP table (tens of microseconds); once its peer is known, one exact
/// lookup confirms the owner (a few). The peer is what is cached, never the uid: a port
/// reused by another user's socket is looked up afresh.
struct UdpOwners {
    peers: moka::sync::Cache<SocketAddr, Option<SocketAddr>>,
}

impl Default for UdpOwners {
    fn default() -> Self {
        UdpOwners {
            peers: moka::sync::Cache::builder()
                .max_capacity(4096)
                .time_to_live(Duration::from_secs(60))
                .build(),
        }
    }
}

impl UdpOwners {
    fn owner(&self, client: SocketAddr) -> Option<UdpOwner> {
        if let Some(peer) = self.peers.get(&client) {
            if let Ok(Some(uid)) = peer_uid::udp_socket_uid_exact(client, peer) {
                return Some(UdpOwner { uid, peer });
            }
        }
        match peer_uid::udp_socket_owner(client) {
            Ok(Some(owner)) => {
                self.peers.insert(client, owner.peer);
                Some(owner)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("agent uid of {client}: {e}");
                None
            }
        }
    }
}

pub(crate) async fn serve_tcp(proxy: Arc<Proxy>, listener: TcpListener, orig: Arc<dyn OrigDst>) {
    loop {
        let (sock, client) = match listener.accept().await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!("DNS stub: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = proxy.next_conn_id();
        let Ok(local) = sock.local_addr() else {
            continue;
        };
        // Not redirected (a client that dialed the stub itself): its destination is the stub.
        let dst = orig.orig_dst(sock.as_fd(), local, client).unwrap_or(local);
        let proxy = proxy.clone();
        let orig = orig.clone();
        tokio::spawn(
            async move {
                let uid = redirected_agent_uid(orig.as_ref(), sock.as_fd(), local, client, dst);
                let dest = Dest::from_addr(dst);
                let secrets = proxy.vault.current();
                let ctx = ConnCtx::new(id, client, ListenerKind::Dns, dest, uid, &secrets);
                drop(secrets);
                let Some(_admitted) = admit(&proxy, &ctx).await else {
                    return;
                };
                let asker = Asker {
                    conn_id: id,
                    client,
                    dst,
                    uid: ctx.agent_uid,
                    udp: false,
                };
                serve_connection(&proxy, &asker, sock).await;
            }
            .instrument(tracing::info_span!("dns", id, %client, transport = "tcp")),
        );
    }
}

/// Questions on one TCP connection, answered in order until it closes or idles.
async fn serve_connection(proxy: &Arc<Proxy>, asker: &Asker, sock: tokio::net::TcpStream) {
    let (mut stream, mut sender) = DnsTcpStream::from_stream(AsyncIoTokioAsStd(sock), asker.client);
    loop {
        let message = match tokio::time::timeout(TCP_IDLE, stream.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => {
                tracing::debug!("DNS stub: TCP stream ended: {e}");
                return;
            }
            Ok(None) | Err(_) => return,
        };
        let Some(in_hand) = take(proxy, asker.uid) else {
            continue;
        };
        let resp = respond(proxy, asker, message.bytes()).await;
        drop(in_hand);
        let Some(resp) = resp else {
            continue;
        };
        if sender.send(SerialMessage::new(resp, asker.client)).is_err() {
            return;
        }
    }
}
