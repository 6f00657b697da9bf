//! Accept loops. Each connection gets its own task and one tracing span carrying its
//! addresses, so every log line inside it is attributable, and is admitted before it is
//! served: its local user must be one the listener serves (`identity`), and it takes a slot
//! of the daemon's (`limits.max_connections`) and a seat in its agent's budget
//! (`limits.max_connections_per_agent`). A connection refused is closed at once, with a
//! record, rather than left waiting; on the explicit listener a refused user is first told
//! why, in the JSON refusal every proxy request gets.
//!
//! An agent behind the redirect that dials the explicit listener itself (`agenshield proxy
//! exec` run as the agent) arrives on the transparent listener, its original destination our
//! own explicit address: once the transparent listener's rule held (an agent user's), it is
//! served exactly as the explicit listener serves that user. Nothing else changes: the
//! firewall still sends the agent nowhere but into the proxy, and every request it makes
//! there is decided by the same policy.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use agenshield_pf::OrigDst;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::admission::{Agent, Seat};
use crate::conn::dispatch::serve_stream;
use crate::conn::explicit::{serve_explicit, serve_refused};
use crate::conn::redirected_uid::redirected_agent_uid;
use crate::conn::{ConnCtx, Dest};
use crate::pipeline::record;
use crate::pipeline::refusal::Refusal;
use crate::proxy::Proxy;
use crate::record::{ErrorCode, ListenerKind, Protocol};
use crate::runtime::memory_release::Open;
use crate::runtime::shards;

/// Accepts until the listener fails for good. Nothing is reserved while it waits, so an
/// idle listener costs no slot.
async fn accept_loop<F>(listener: TcpListener, mut on_conn: F)
where
    F: FnMut(TcpStream, SocketAddr),
{
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => on_conn(sock, peer),
            Err(e) => {
                // EMFILE and friends: back off instead of spinning; the backlog holds clients.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// What a connection holds while it is served.
pub(crate) struct Admission {
    _slot: OwnedSemaphorePermit,
    _seat: Seat,
    _open: Open,
}

/// Admits a connection: a daemon slot, then a seat in its agent's budget. `None`: refused,
/// recorded; the caller closes it.
pub(crate) async fn admit(proxy: &Arc<Proxy>, ctx: &ConnCtx) -> Option<Admission> {
    match admission(proxy, ctx) {
        Ok(admitted) => Some(admitted),
        Err(r) => {
            refused(proxy, ctx, r).await;
            None
        }
    }
}

/// Records a connection refused before it was served (one `connection` record); the caller
/// closes it.
pub(crate) async fn refused(proxy: &Arc<Proxy>, ctx: &ConnCtx, refused: Refusal) {
    let at = record::stamp(&proxy.policy(), None);
    let base = ctx.base(&proxy.vault.current()).into_owned();
    record::connection(proxy, base.refused(Protocol::Tcp, &refused, at)).await;
}

/// A daemon slot and a seat in the agent's budget, or why not (`busy`, `connection_budget`).
pub(crate) fn admission(proxy: &Proxy, ctx: &ConnCtx) -> Result<Admission, Refusal> {
    let slot = proxy.slots.clone().try_acquire_owned().map_err(|_| {
        Refusal::new(
            ErrorCode::Busy,
            format!(
                "the proxy holds {} connections already (limits.max_connections)",
                proxy.limits.max_connections
            ),
        )
    })?;
    let agent = agent_of(ctx);
    let seat = proxy.budgets.take(agent).ok_or_else(|| {
        Refusal::new(
            ErrorCode::ConnectionBudget,
            format!(
                "{agent} already holds {} connections (limits.max_connections_per_agent)",
                proxy.budgets.per_agent()
            ),
        )
    })?;
    Ok(Admission {
        _slot: slot,
        _seat: seat,
        _open: Open::new(),
    })
}

/// The agent a connection counts against: its local uid, else its address.
pub(crate) fn agent_of(ctx: &ConnCtx) -> Agent {
    ctx.agent_uid
        .map_or(Agent::Addr(ctx.client.ip()), Agent::Uid)
}

/// Whether `dst`, a redirected connection's original destination, is our own explicit
/// listener at `explicit`: that address, or, for a listener on every address of a family,
/// its port on loopback (where `exec` dials it).
pub(crate) fn is_own_explicit(dst: SocketAddr, explicit: SocketAddr) -> bool {
    if dst == explicit {
        return true;
    }
    dst.port() == explicit.port()
        && explicit.ip().is_unspecified()
        && dst.ip().is_loopback()
        && dst.is_ipv4() == explicit.is_ipv4()
}

/// `explicit`: the explicit listener's bound address (see the module doc).
pub(crate) async fn transparent(
    proxy: Arc<Proxy>,
    listener: TcpListener,
    orig: Arc<dyn OrigDst>,
    explicit: SocketAddr,
) {
    accept_loop(listener, move |sock, peer| {
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
        let span = tracing::info_span!("conn", id, client = %peer, orig_dst = %dst, sni = tracing::field::Empty);
        let proxy = proxy.clone();
        let orig = orig.clone();
        let Some(sock) = hand_over(sock, id) else {
            return;
        };
        shards::spawn(move || {
            async move {
                let Some(sock) = take_over(sock, id) else {
                    return;
                };
                // The agent's socket sees the original destination as its peer (the
                // redirect is NAT); with a testing override it really dialed `local`.
                let uid = redirected_agent_uid(orig.as_ref(), sock.as_fd(), local, peer, dst);
                let secrets = proxy.vault.current();
                let dest = Dest::from_addr(dst);
                let ctx = ConnCtx::new(id, peer, ListenerKind::Transparent, dest, uid, &secrets);
                if let Err(r) = proxy.identities.transparent(ctx.agent_uid) {
                    tracing::debug!("closing: {r}");
                    refused(&proxy, &ctx, r.into()).await;
                    return;
                }
                let own_explicit = is_own_explicit(dst, explicit);
                let ctx = if own_explicit {
                    tracing::debug!(
                        "an agent dialed the explicit listener from behind the redirect: \
                         serving it as the explicit listener"
                    );
                    ctx.with_listener(ListenerKind::Explicit, &secrets)
                } else {
                    ctx
                };
                drop(secrets);
                let Some(_admitted) = admit(&proxy, &ctx).await else {
                    return;
                };
                if own_explicit {
                    // An agent user: the explicit listener admits it too.
                    match proxy.identities.explicit(ctx.agent_uid) {
                        Ok(()) => serve_explicit(proxy, ctx, sock).await,
                        Err(r) => serve_refused(proxy, ctx, sock, r.into()).await,
                    }
                    return;
                }
                serve_stream(proxy, ctx, sock).await;
            }
            .instrument(span)
        });
    })
    .await;
}

pub(crate) async fn explicit(proxy: Arc<Proxy>, listener: TcpListener) {
    accept_loop(listener, move |sock, peer| {
        let id = proxy.next_conn_id();
        let _ = sock.set_nodelay(true);
        let local = sock.local_addr().unwrap_or(peer);
        let span = tracing::info_span!("conn", id, client = %peer, listener = "explicit", sni = tracing::field::Empty);
        let proxy = proxy.clone();
        let Some(sock) = hand_over(sock, id) else {
            return;
        };
        shards::spawn(move || {
            async move {
                let Some(sock) = take_over(sock, id) else {
                    return;
                };
                let uid = agent_uid(peer, &[local]);
                let dest = Dest::from_addr(local);
                let secrets = proxy.vault.current();
                let ctx = ConnCtx::new(id, peer, ListenerKind::Explicit, dest, uid, &secrets);
                drop(secrets);
                let Some(_admitted) = admit(&proxy, &ctx).await else {
                    return;
                };
                match proxy.identities.explicit(ctx.agent_uid) {
                    Ok(()) => serve_explicit(proxy, ctx, sock).await,
                    Err(r) => {
                        tracing::debug!("refusing: {r}");
                        serve_refused(proxy, ctx, sock, r.into()).await
                    }
                }
            }
            .instrument(span)
        });
    })
    .await;
}

/// The accepted socket, out of the accepting runtime's reactor, for a shard to take over.
fn hand_over(sock: TcpStream, id: u64) -> Option<std::net::TcpStream> {
    sock.into_std()
        .inspect_err(|e| tracing::warn!(conn = id, "closing: handing the connection over: {e}"))
        .ok()
}

/// The socket in the reactor of the shard this runs on.
fn take_over(sock: std::net::TcpStream, id: u64) -> Option<TcpStream> {
    TcpStream::from_std(sock)
        .inspect_err(|e| tracing::warn!(conn = id, "closing: registering the connection: {e}"))
        .ok()
}

/// The uid owning the client's socket (`client`, connected to one of `peers`), if it is a
/// local socket the OS will tell us about: the agent, for the record and its budget.
pub(crate) fn agent_uid(
    client: std::net::SocketAddr,
    peers: &[std::net::SocketAddr],
) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::is_own_explicit;

    #[test]
    fn the_own_explicit_listener_is_its_address_or_its_port_on_loopback_when_unspecified() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().expect("addr");
        assert!(is_own_explicit(a("127.0.0.1:15080"), a("127.0.0.1:15080")));
        assert!(!is_own_explicit(a("127.0.0.1:15081"), a("127.0.0.1:15080")));
        assert!(!is_own_explicit(a("127.0.0.2:15080"), a("127.0.0.1:15080")));
        assert!(!is_own_explicit(a("10.0.0.5:15080"), a("127.0.0.1:15080")));
        assert!(is_own_explicit(a("127.0.0.1:15080"), a("0.0.0.0:15080")));
        assert!(is_own_explicit(a("[::1]:15080"), a("[::]:15080")));
        assert!(!is_own_explicit(a("[::1]:15080"), a("0.0.0.0:15080")));
        // Not a local address: another host's port, whatever we listen on.
        assert!(!is_own_explicit(a("192.0.2.1:15080"), a("0.0.0.0:15080")));
    }
}
