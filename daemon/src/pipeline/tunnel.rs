//! One driver for every tunnel a decision allowed (raw TCP, passthrough TLS, an upgraded
//! connection): registered as live (so a policy change can revoke it), counted open, relayed
//! both ways (a WebSocket under a rule that binds secrets message by message, through its
//! frame guard) until either side ends, the policy revokes it or it idles out, then recorded
//! as closed with what it moved. Its decision's record is in the audit log before it runs.

use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};

use super::record;
use crate::proxy::Proxy;
use crate::record::Protocol;
use crate::record::Record;
use crate::secrets::rewrite::websocket::FrameGuard;
use crate::tunnels::TunnelFacts;
use crate::upstream::relay::relay;

/// An allowed tunnel: what it is registered as, its metric label, and its decision's record
/// (written already).
pub(crate) struct Tunnel {
    pub facts: TunnelFacts,
    pub protocol: Protocol,
    pub decided: Record,
}

impl Tunnel {
    /// Relays `client` (the agent's side) and `upstream`, through `guard` where there is
    /// one, and records the close.
    pub(crate) async fn run<A, B>(
        self,
        proxy: &Arc<Proxy>,
        client: A,
        upstream: B,
        guard: Option<FrameGuard>,
    ) where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
    {
        let _open = proxy.metrics.connections.open(self.protocol);
        let mut live = proxy.tunnels.open(self.facts);
        let started = Instant::now();
        let idle = proxy.limits.tunnel_idle_timeout;
        let Some(guard) = guard else {
            let relayed = relay(client, upstream, idle, &mut live.revoked).await;
            return record::tunnel_closed(proxy, &self.decided, &relayed, started).await;
        };
        let guarded = guard.relay(client, upstream, idle, &mut live.revoked).await;
        let swapped = guard.swapped_names();
        proxy.vault.record_use(&swapped);
        let dlp = guard.dlp.as_ref().and_then(|c| c.facts());
        record::guarded_tunnel_closed(proxy, &self.decided, &guarded, &swapped, dlp, started).await;
    }
}
