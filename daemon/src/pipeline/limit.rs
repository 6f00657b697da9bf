//! The limit phase: the deciding rule's rate, each used secret's rate (all or nothing), then
//! the rule's concurrency cap, whose slot is held until the response body ends. Every one of
//! them is the asking agent's own (its uid; connections of unknown owner share one), so one
//! agent that exhausts a limit does not refuse another. A refusal is a 429 with
//! `Retry-After`.

use super::refusal::Refusal;
use super::RequestCtx;
use crate::policy::Decision;
use crate::proxy::Proxy;
use crate::ratelimit::{AgentKey, ConcurrencyPermit, LimitKey, Limited};
use crate::record::ErrorCode;

pub(super) fn check(ctx: &mut RequestCtx) -> Result<(), Refusal> {
    let decision = ctx.decision.as_ref().expect("the decide phase ran");
    let host = &ctx.target.as_ref().expect("the target phase ran").host;
    let agent = AgentKey::of(ctx.conn.agent_uid);
    let mut keys = Vec::new();
    if let (Some(rate), Some(id)) = (decision.obligations.rate, &decision.rule_id) {
        keys.push((LimitKey::Rule(id.clone()), rate.into()));
    }
    for name in ctx.secrets.iter().flat_map(|p| &p.used) {
        if let Some(rate) = ctx.policy.secret_rate(name) {
            keys.push((LimitKey::Secret(name.to_string()), rate.into()));
        }
    }
    let rule_id = decision.rule_id.as_deref().map(str::to_string);
    if let Err(l) = ctx.proxy.limiter.check(agent, &keys) {
        return Err(Refusal {
            rule_id,
            ..rate_refusal(&l, host, agent)
        });
    }
    if let Some(max) = decision.obligations.max_concurrent {
        let permit = ctx
            .proxy
            .caps
            .acquire(agent, host, max)
            .map_err(|_| Refusal {
                retry_after: Some(1),
                rule_id: rule_id.clone(),
                ..Refusal::new(
                    ErrorCode::RateLimited,
                    format!("{agent} already has {max} requests in flight to {host} (rule limit)"),
                )
            })?;
        ctx.permit = Some(permit);
    }
    Ok(())
}

/// The limits of the rule that allowed a raw TCP connection to `host` from the agent `uid`:
/// its rate counts connections, its concurrency cap open connections (the permit lives as
/// long as the relay).
pub(crate) fn connection(
    proxy: &Proxy,
    decision: &Decision,
    host: &str,
    uid: Option<u32>,
) -> Result<Option<ConcurrencyPermit>, Refusal> {
    let agent = AgentKey::of(uid);
    let rule_id = decision.rule_id.as_deref().map(str::to_string);
    if let (Some(rate), Some(id)) = (decision.obligations.rate, &decision.rule_id) {
        if let Err(l) = proxy
            .limiter
            .check(agent, &[(LimitKey::Rule(id.clone()), rate.into())])
        {
            return Err(Refusal {
                rule_id,
                ..rate_refusal(&l, host, agent)
            });
        }
    }
    match decision.obligations.max_concurrent {
        Some(max) => proxy
            .caps
            .acquire(agent, host, max)
            .map(Some)
            .map_err(|_| Refusal {
                rule_id,
                ..Refusal::new(
                    ErrorCode::RateLimited,
                    format!("{agent} already has {max} connections open to {host} (rule limit)"),
                )
            }),
        None => Ok(None),
    }
}

fn rate_refusal(l: &Limited, host: &str, agent: AgentKey) -> Refusal {
    let secs = l.retry_after_secs();
    Refusal {
        retry_after: Some(secs),
        ..Refusal::new(
            ErrorCode::RateLimited,
            format!(
                "rate limit of {} reached for {host} by {agent}; retry in {secs} s",
                l.key
            ),
        )
    }
}
