//! The forward phase, in two steps (as pingora's `upstream_request_filter` and
//! `response_filter`): `forward` sends the request to the checked target (path normalized,
//! query as injected, signed again where it must be); `respond` takes what came back: a
//! protocol upgrade (101) becomes a tunnel (`tunnel.rs`) whose end is recorded like every raw
//! TCP relay's, the response is redacted for a rule that binds secrets, and the rule's
//! concurrency slot is kept until its body ends.

use std::sync::Arc;

use http::{Request, Response};

use super::refusal::Refusal;
use super::tunnel::Tunnel;
use super::{secrets, RequestCtx};
use crate::body::{self, ProxyBody};
use crate::proxy::Proxy;
use crate::record::{ErrorCode, Protocol, Record};
use crate::secrets::rewrite::websocket::FrameGuard;
use crate::tunnels::TunnelFacts;
use crate::upstream::client::{strip_hop_by_hop, upgrade_allowed, Forwarded, Upgrades};

/// Sends the request upstream: what comes back, a response or an upgrade.
pub(super) async fn forward(
    ctx: &mut RequestCtx,
    req: Request<ProxyBody>,
) -> Result<Forwarded, Refusal> {
    let target = ctx.target.as_ref().expect("the target phase ran");
    let path = ctx.upstream_path.as_deref().unwrap_or(&ctx.path);
    let path_and_query = match &ctx.query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let mut req = req;
    strip_overrides(&ctx.policy, &target.host, req.headers_mut());
    // A request signed with the placeholder of the rule's AWS key id is signed again, last,
    // over exactly what goes upstream.
    let signs = ctx.secrets.as_ref().is_some_and(|p| p.signs());
    let req = if signs {
        let uri = format!(
            "{}://{}{path_and_query}",
            target.scheme_str(),
            target.authority()
        );
        Box::pin(sign_again(ctx, req, &uri)).await?
    } else {
        req
    };
    ctx.proxy
        .forwarder
        .forward(target, &path_and_query, req, ctx.upgrade.is_some())
        .await
        .map_err(|r| {
            // The credential check stopped the upload: that is the reason.
            if let Some(b) = ctx.dlp.as_ref().and_then(|p| p.blocked()) {
                let rule = ctx.rule().map(|r| r.to_string());
                return b.refusal(&target.host, rule.as_deref());
            }
            // The body guard stopped the upload: that, not the aborted stream, is the reason.
            match ctx.secrets.as_ref().and_then(|p| p.body_refusal()) {
                Some(e) => secrets::refused(ctx, e),
                None => Refusal::from(r),
            }
        })
}

/// What goes back to the agent: the response (redacted for a rule that binds secrets,
/// holding the rule's concurrency slot until its body ends), or the 101 of an upgrade the
/// agent asked for, its tunnel waiting for the 101's record.
pub(super) fn respond(
    ctx: &mut RequestCtx,
    forwarded: Forwarded,
) -> Result<Response<ProxyBody>, Refusal> {
    let target = ctx.target.as_ref().expect("the target phase ran");
    let resp = match forwarded {
        Forwarded::Response(resp) => resp,
        Forwarded::Upgraded(resp, upgrades) => {
            // The upstream switched to what was asked for, and only that.
            let to = resp
                .headers()
                .get(http::header::UPGRADE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            let asked = ctx.upgrade.as_deref().unwrap_or("");
            let offered = asked
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(to.trim()));
            if !offered || !upgrade_allowed(&to, &ctx.proxy.upgrades) {
                return Err(Refusal::new(
                    ErrorCode::UpstreamError,
                    format!("the upstream switched to {to:?}, which was not asked for"),
                ));
            }
            // Under a rule that binds secrets, or under the credential check, a WebSocket is
            // relayed message by message, which needs frames as sent: no extension (none was
            // offered).
            let mut guard = ctx.secrets.as_ref().and_then(|p| p.frame_guard());
            if let Some(check) = super::dlp::frame_check(ctx) {
                let g = guard.get_or_insert_with(|| FrameGuard {
                    set: ctx.proxy.vault.current(),
                    bindings: None,
                    dlp: None,
                    swapped: Arc::default(),
                    tls: target.scheme == crate::policy::Scheme::Https,
                });
                g.dlp = Some(check);
            }
            if guard.is_some() {
                crate::secrets::rewrite::websocket::check_accepted(resp.headers())
                    .map_err(|why| Refusal::new(ErrorCode::UpstreamError, why.to_string()))?;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            ctx.on_recorded = Some(tx);
            let facts = TunnelFacts::Upgrade {
                host: target.host.clone(),
                port: target.port,
                scheme: target.scheme,
                path: ctx.matching_path.clone(),
                agent: ctx.conn.agent_uid,
            };
            tokio::spawn(tunnel(ctx.proxy.clone(), upgrades, facts, guard, rx));
            resp
        }
    };
    let resp = match &ctx.secrets {
        Some(phase) => phase
            .response(resp, ctx.method == http::Method::HEAD)
            .map_err(|why| Refusal::new(ErrorCode::UpstreamError, why.to_string()))?,
        None => resp,
    };
    // Under a token budget, the body is read on its way for its usage.
    let resp = match &ctx.budget {
        Some(meter) => {
            meter.respond(resp.headers());
            let meter = meter.clone();
            resp.map(|b| crate::budget::meter::tap(b, meter))
        }
        None => resp,
    };
    Ok(match ctx.permit.take() {
        Some(permit) => resp.map(|b| body::guarded(b, permit)),
        None => resp,
    })
}

/// Headers some servers and frameworks take as the method or the path instead of the request
/// line's (Rails, Symfony, IIS, many API gateways).
const OVERRIDES: [&str; 5] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
];

/// Removes `Max-Forwards` (a proxy chain would answer it itself, with what it added), and,
/// where a rule for the host constrains methods or paths, the headers that would make the
/// upstream take another method or path than the one decided.
fn strip_overrides(policy: &crate::policy::Policy, host: &str, headers: &mut http::HeaderMap) {
    headers.remove(http::header::MAX_FORWARDS);
    if OVERRIDES.iter().any(|h| headers.contains_key(*h)) && policy.constrains_request(host) {
        for h in OVERRIDES {
            headers.remove(h);
        }
        tracing::info!(
            host,
            "removed method/path override headers: the policy decides by the request line"
        );
    }
}

/// Signs the request again with the rule's AWS keys, over exactly what goes upstream (`uri`:
/// the full URL).
async fn sign_again(
    ctx: &RequestCtx,
    req: Request<ProxyBody>,
    uri: &str,
) -> Result<Request<ProxyBody>, Refusal> {
    let Some(phase) = ctx.secrets.as_ref() else {
        return Ok(req);
    };
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let signed = phase.sign(Request::from_parts(parts, body), uri).await;
    signed.map_err(|e| secrets::refused(ctx, &e))
}

/// Joins the agent's and the upstream's upgraded connections once the 101 is recorded and
/// sent, relays (message by message, through `guard`, where there is one), and records the
/// close.
async fn tunnel(
    proxy: Arc<Proxy>,
    upgrades: Upgrades,
    facts: TunnelFacts,
    guard: Option<FrameGuard>,
    recorded: tokio::sync::oneshot::Receiver<Record>,
) {
    // No record (the audit log refused it): the agent got a refusal, not the 101.
    let Ok(decided) = recorded.await else { return };
    let (client, upstream) = match upgrades.join().await {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!("protocol upgrade failed: {e}");
            return;
        }
    };
    let tunnel = Tunnel {
        facts,
        protocol: Protocol::Ws,
        decided,
    };
    tunnel.run(&proxy, client, upstream, guard).await;
}
