//! `tls = "passthrough"`: a TLS connection whose ClientHello names a host a passthrough rule
//! allows on this port is spliced to that host without interception (certificate-pinning
//! apps, clients with compiled-in roots). The ClientHello is read whole first (rustls parses
//! it) and kept, so that it can be replayed either upstream or into interception.
//!
//! The name in the ClientHello is what is decided and what is dialed, through our resolver and
//! the address guard: never the address the agent chose. No name, or an address for a name,
//! is never passed through. A CONNECT whose ClientHello names another host is not either.
//! What the proxy cannot see inside (methods, paths, secrets, leaks, and a different host
//! behind the name: domain fronting) is what passthrough gives up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rustls::server::Acceptor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

use super::intercept::intercept;
use super::opaque::{refuse, Splice};
use super::{ConnCtx, DestHost};
use crate::pipeline::limit;
use crate::pipeline::record;
use crate::policy::{normalize_host, Decision, Policy};
use crate::proxy::Proxy;
use crate::read_side::ReadSide;
use crate::record::{Protocol, Record};
use crate::tunnels::TunnelFacts;

/// A ClientHello larger than this (post-quantum key shares make them ~2 KiB) is not waited
/// for; the connection is intercepted as usual, which reads it itself.
const MAX_HELLO: usize = 64 * 1024;

/// The ClientHello as read: every byte so far, and the server name it gives.
struct Hello {
    pub bytes: Bytes,
    pub sni: Option<String>,
}

/// Reads until rustls has a whole ClientHello (or it cannot be one, or `wait` passes, or
/// [`MAX_HELLO`]): what was read is returned either way, to be replayed.
async fn read_hello<S>(stream: &mut S, wait: Duration) -> Hello
where
    S: AsyncRead + Unpin,
{
    let mut buf = BytesMut::with_capacity(4096);
    let mut acceptor = Acceptor::default();
    let mut fed = 0;
    let deadline = tokio::time::Instant::now() + wait;
    let mut sni = None;
    while buf.len() < MAX_HELLO {
        match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
        let mut fresh = &buf[fed..];
        while !fresh.is_empty() {
            match acceptor.read_tls(&mut fresh) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        fed = buf.len() - fresh.len();
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                sni = accepted.client_hello().server_name().map(str::to_owned);
                break;
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
    Hello {
        bytes: buf.freeze(),
        sni,
    }
}

/// A TLS connection under a policy with passthrough rules (the one it was accepted under):
/// spliced if one decides its ClientHello, otherwise intercepted with the hello replayed.
pub(super) async fn serve<S>(proxy: Arc<Proxy>, ctx: ConnCtx, policy: Arc<Policy>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let hello = read_hello(&mut stream, proxy.limits.tls_handshake_timeout).await;
    match decide(&policy, &ctx, &hello) {
        Some((sni, d)) => splice(proxy, ctx, policy, sni, d, hello.bytes, stream).await,
        None => intercept(proxy, ctx, ReadSide::prefixed(hello.bytes, stream)).await,
    }
}

/// The passthrough decision for this connection's ClientHello, if a passthrough rule makes
/// one: the normalised name and the decision.
fn decide(policy: &Policy, ctx: &ConnCtx, hello: &Hello) -> Option<(String, Decision)> {
    let sni = normalize_host(hello.sni.as_deref()?).ok()?;
    if let DestHost::Name(n) = &ctx.dest.host {
        if *n != sni {
            return None;
        }
    }
    let d = policy.decide_passthrough(&sni, ctx.dest.port, ctx.agent_uid)?;
    Some((sni, d))
}

/// Records the decision and splices `client` (the ClientHello replayed first) to `sni`.
async fn splice<S>(
    proxy: Arc<Proxy>,
    ctx: ConnCtx,
    policy: Arc<Policy>,
    sni: String,
    decision: Decision,
    hello: Bytes,
    client: S,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let secrets = proxy.vault.current();
    let shown: Arc<str> = secrets.redact(&sni).into();
    let at = record::stamp(&policy, None);
    let rule = decision.rule_id.clone();
    let rec = Record {
        sni: Some(shown.clone()),
        ..ctx
            .base(&secrets)
            .decided(Protocol::TlsPassthrough, shown, rule, at)
    };
    drop(secrets);
    let admitted = match record::ready(&proxy) {
        Ok(()) => limit::connection(&proxy, &decision, &sni, ctx.agent_uid).await,
        Err(r) => Err(r),
    };
    let permit = match admitted {
        Ok(permit) => permit,
        Err(r) => return refuse(&proxy, rec, &r, started).await,
    };
    let spliced = Splice {
        dial: &sni,
        first: Some(hello),
        facts: TunnelFacts::Passthrough {
            host: sni.clone(),
            port: ctx.dest.port,
            agent: ctx.agent_uid,
        },
        protocol: Protocol::TlsPassthrough,
        started,
    };
    spliced.run(&proxy, &ctx, rec, permit, client).await;
}
