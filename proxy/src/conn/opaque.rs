//! Opaque (non-HTTP) TCP: decided on the destination alone, then relayed byte for byte with
//! an idle timeout.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::ConnCtx;
use crate::policy::{Action, RequestFacts, Scheme};
use crate::proxy::Proxy;

pub(super) async fn relay_opaque<S>(proxy: Arc<Proxy>, ctx: ConnCtx, client: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let host = ctx.dest.host.to_string();
    // A name can carry a secret value too (to whoever answers the DNS query for it); opaque
    // streams bind no secret, so any value or placeholder in the name is refused.
    let secrets = proxy.vault.current();
    let shown = secrets.redact(&host);
    if let Some(m) = secrets.matcher() {
        if m.find_iter(host.as_bytes()).next().is_some() || shown != host {
            tracing::warn!(
                decision = "deny",
                error_code = "secret_leak",
                "opaque TCP to {shown}:{} refused: the name carries a secret",
                ctx.dest.port
            );
            return;
        }
    }
    let policy = proxy.policy();
    let decision = policy.decide(&RequestFacts {
        host: &host,
        port: ctx.dest.port,
        scheme: Scheme::Tcp,
        method: None,
        path: None,
    });
    let rule = decision.rule_id.as_deref().unwrap_or("(default)");
    // An opaque stream cannot be held for approval: `ask` refuses it like `deny`.
    if decision.action != Action::Allow {
        tracing::info!(
            decision = "deny",
            rule,
            "opaque TCP to {} refused: {}",
            ctx.dest,
            decision.explanation
        );
        return;
    }
    let (upstream, addr) = match proxy.dialer.dial(&host, ctx.dest.port).await {
        Ok(c) => c,
        Err(e) => {
            tracing::info!(decision = "allow", rule, "opaque TCP to {}: {e}", ctx.dest);
            return;
        }
    };
    tracing::info!(decision = "allow", rule, upstream = %addr, "opaque TCP to {}", ctx.dest);
    let _open = proxy
        .metrics
        .connection(crate::control::metrics::Protocol::Tcp);
    match crate::upstream::relay::relay(client, upstream, proxy.limits.tunnel_idle_timeout).await {
        Ok((up, down)) => tracing::debug!(bytes_up = up, bytes_down = down, "opaque TCP closed"),
        Err(e) => tracing::debug!("opaque TCP ended: {e}"),
    }
}
