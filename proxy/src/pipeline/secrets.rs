//! The secrets phase, in two steps around the limits: `inspect` checks where the secrets a
//! request carries may go (before limits, which count per secret); `apply` injects what the
//! rule binds and puts the leak guard on the body (after limits, so a refused request costs
//! no injection). The engine is `crate::secrets`; this file adapts it to a request.

use http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::refusal::Refusal;
use super::RequestCtx;
use crate::body::counted::CountedBody;
use crate::body::ProxyBody;
use crate::policy::Scheme;
use crate::record::ErrorCode;
use crate::secrets::phase::{Head, SecretPhase};
use crate::secrets::{SecretRefusal, Violation};

pub(super) async fn inspect<B>(ctx: &mut RequestCtx, req: &Request<B>) -> Result<(), Refusal> {
    let bindings = ctx.decision.as_ref().and_then(|d| d.secrets.clone());
    if let (Some(_), Some(d)) = (&bindings, &ctx.decision) {
        // Whose requests the rule's secrets serve (`conn::identity`): refused, never sent on
        // without them.
        ctx.proxy
            .identities
            .secrets(ctx.conn.agent_uid, d.names_agents, d.rule_id.as_deref())?;
    }
    if let Some(b) = &bindings {
        // A fetched secret the rule binds (a command's output, an OAuth2 token) must have a
        // value in force before anything is checked or swapped.
        // Boxed: fetching is a large future, and most requests bind no secret; unboxed it
        // made every request's future several KiB larger (copied on each start).
        let fresh = Box::pin(ctx.proxy.vault.fresh(&b.needs)).await;
        fresh.map_err(|e| refused(ctx, &e))?;
    }
    let target = ctx.target.as_ref().expect("the target phase ran");
    let raw_pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let head = Head {
        method: req.method().as_str(),
        host: &target.host,
        headers: req.headers(),
        path_and_query: raw_pq,
        tls: target.scheme == Scheme::Https,
        upgrade: ctx.upgrade.as_deref(),
    };
    ctx.secrets =
        SecretPhase::inspect(&ctx.proxy.vault, bindings, &head).map_err(|e| refused(ctx, &e))?;
    Ok(())
}

/// Counts the body going up, injects, swaps, and guards the body; the path and query sent
/// upstream may change (`ctx.upstream_path`, `ctx.query`).
pub(super) async fn apply(
    ctx: &mut RequestCtx,
    req: Request<Incoming>,
) -> Result<Request<ProxyBody>, Refusal> {
    let up = ctx.bytes_up.clone();
    let req = req.map(|b| BodyExt::boxed(CountedBody::new(crate::body::stream(b), up)));
    let Some(phase) = &ctx.secrets else {
        return Ok(req);
    };
    let (req, url) = phase
        .apply(
            req,
            &ctx.path,
            ctx.query.as_deref(),
            ctx.proxy.scan_body_bytes,
        )
        .await
        .map_err(|e| refused(ctx, &e))?;
    if url.query.is_some() {
        ctx.query = url.query;
    }
    ctx.upstream_path = url.path;
    ctx.proxy.vault.record_use(&phase.used);
    Ok(req)
}

/// The agent's view of a leak-guard refusal, and a warning for the operator.
pub(super) fn refused(ctx: &RequestCtx, e: &SecretRefusal) -> Refusal {
    let r = refusal(e, ctx.rule().map(|r| &**r));
    tracing::warn!(secret = %e.secret, place = e.place.as_str(), code = r.code.as_str(), "refused: {}", r.message);
    r
}

pub(crate) fn refusal(e: &SecretRefusal, rule: Option<&str>) -> Refusal {
    let code = match e.violation {
        Violation::Scope | Violation::Transport | Violation::NotSwapped | Violation::OutOfScope => {
            ErrorCode::SecretScope
        }
        Violation::Leak | Violation::Echoed => ErrorCode::SecretLeak,
        Violation::Unsignable => ErrorCode::BadRequest,
        Violation::Unavailable | Violation::Unfetched => ErrorCode::SecretUnavailable,
    };
    Refusal {
        rule_id: rule.map(str::to_string),
        ..Refusal::new(code, e.message(rule))
    }
}
