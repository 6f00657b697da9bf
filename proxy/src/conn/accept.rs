//! Accept loops. Each connection gets its own task and one tracing span carrying its
//! addresses, so every log line inside it is attributable.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use agenshield_pf::OrigDst;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::conn::dispatch::serve_stream;
use crate::conn::explicit::serve_explicit;
use crate::conn::{ConnCtx, Dest, ListenerKind};
use crate::proxy::Proxy;

/// Accepts until the listener fails for good. `slots` bounds connections over all listeners.
async fn accept_loop<F>(listener: TcpListener, slots: Arc<Semaphore>, mut on_conn: F)
where
    F: FnMut(TcpStream, SocketAddr, OwnedSemaphorePermit),
{
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((sock, peer)) => on_conn(sock, peer, permit),
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the backlog holds clients.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub(crate) async fn transparent(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    orig: Arc<dyn OrigDst>,
    slots: Arc<Semaphore>,
) {
    accept_loop(listener, slots, move |sock, peer, permit| {
        let id = proxy.next_conn_id();
        let _ = sock.set_nodelay(true);
        let local = match sock.local_addr() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(conn = id, "closing: no local address: {e}");
                return;
            }
        };
        let dst = match orig.orig_dst(sock.as_fd(), local, peer) {
            Ok(dst) => dst,
            Err(e) => {
                tracing::warn!(conn = id, client = %peer, "closing: {e}");
                return;
            }
        };
        if dst == local {
            // Nothing redirected this connection: someone dialed the listener itself.
            tracing::warn!(conn = id, client = %peer, "closing: connection was not redirected (no original destination)");
            return;
        }
        let mut ctx = ConnCtx {
            id,
            client: peer,
            listener: ListenerKind::Transparent,
            dest: Dest::from_addr(dst),
            tls: None,
            agent_uid: None,
        };
        let span = tracing::info_span!("conn", id, client = %peer, orig_dst = %dst, sni = tracing::field::Empty);
        let proxy = proxy.clone();
        tokio::spawn(
            async move {
                let _permit = permit;
                // The agent's socket sees the original destination as its peer (the
                // redirect is NAT); with a testing override it really dialed `local`.
                ctx.agent_uid = agent_uid(peer, &[dst, local]);
                serve_stream(proxy, ctx, sock).await;
            }
            .instrument(span),
        );
    })
    .await;
}

pub(crate) async fn explicit(proxy: Arc<Proxy>, listener: TcpListener, slots: Arc<Semaphore>) {
    accept_loop(listener, slots, move |sock, peer, permit| {
        let id = proxy.next_conn_id();
        let _ = sock.set_nodelay(true);
        let local = sock.local_addr().unwrap_or(peer);
        let mut ctx = ConnCtx {
            id,
            client: peer,
            listener: ListenerKind::Explicit,
            dest: Dest::from_addr(local),
            tls: None,
            agent_uid: None,
        };
        let span = tracing::info_span!("conn", id, client = %peer, listener = "explicit", sni = tracing::field::Empty);
        let proxy = proxy.clone();
        tokio::spawn(
            async move {
                let _permit = permit;
                ctx.agent_uid = agent_uid(peer, &[local]);
                serve_explicit(proxy, ctx, sock).await;
            }
            .instrument(span),
        );
    })
    .await;
}

/// The uid owning the client's socket (`client`, connected to one of `peers`), if it is a
/// local socket the OS will tell us about. Only for the record: no decision rests on it.
fn agent_uid(client: std::net::SocketAddr, peers: &[std::net::SocketAddr]) -> Option<u32> {
    for peer in peers {
        match agenshield_pf::peer_uid::socket_uid(client, *peer) {
            Ok(Some(uid)) => return Some(uid),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!("agent uid of {client}: {e}");
                return None;
            }
        }
    }
    None
}
