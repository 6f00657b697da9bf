//! The limit phase: the deciding rule's rate, each used secret's rate (all or nothing), then
//! the rule's concurrency cap, whose slot is held until the response body ends. Every one of
//! them is the asking agent's own (its uid; connections of unknown owner share one), so one
//! agent that exhausts a limit does not refuse another. A refusal is a 429 with
//! `Retry-After`.
//!
//! A rule rate with `scope = "fleet"` is taken from the shared store first (the only await
//! here, and only for such rules; `ratelimit::fleet` bounds it): taken, the local buckets
//! (secrets) follow; refused, the request is refused naming the fleet limit; with no answer,
//! `on_store_error` says: the rule's local bucket joins the local check, or a refusal
//! (`rate_limit_store_unavailable`). A token the store gave is not returned if a secret's
//! local bucket then refuses (the fleet errs on fewer requests, never more).

use std::time::Duration;

use super::refusal::Refusal;
use super::RequestCtx;
use crate::policy::{Decision, RateScope};
use crate::proxy::Proxy;
use crate::ratelimit::fleet::StoreErrorReason;
use crate::ratelimit::{AgentKey, ConcurrencyPermit, FleetVerdict, LimitKey, Limited};
use crate::record::{ErrorCode, LimitScope};

pub(super) async fn check(ctx: &mut RequestCtx) -> Result<(), Refusal> {
    let decision = ctx.decision.as_ref().expect("the decide phase ran");
    let host = &ctx.target.as_ref().expect("the target phase ran").host;
    let agent = AgentKey::of(ctx.conn.agent_uid);
    let rule_id = decision.rule_id.as_deref().map(str::to_string);
    let mut keys = Vec::new();
    let mut fallback = false;
    if let (Some(rate), Some(id)) = (decision.obligations.rate, &decision.rule_id) {
        match rate.scope {
            RateScope::Local => keys.push((LimitKey::Rule(id.clone()), rate.into())),
            RateScope::Fleet => match fleet(&ctx.proxy, id, agent, host, rate).await {
                Ok(Taken::Fleet) => {}
                Ok(Taken::Fallback) => {
                    fallback = true;
                    keys.push((LimitKey::Rule(id.clone()), rate.into()));
                }
                Err(r) => return Err(Refusal { rule_id, ..r }),
            },
        }
    }
    for name in ctx.secrets.iter().flat_map(|p| &p.used) {
        if let Some(rate) = ctx.policy.secret_rate(name) {
            keys.push((LimitKey::Secret(name.to_string()), rate.into()));
        }
    }
    if let Err(l) = ctx.proxy.limiter.check(agent, &keys) {
        let fell_back = fallback && matches!(l.key, LimitKey::Rule(_));
        return Err(Refusal {
            rule_id,
            ..rate_refusal(&l, host, agent, fell_back)
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
pub(crate) async fn connection(
    proxy: &Proxy,
    decision: &Decision,
    host: &str,
    uid: Option<u32>,
) -> Result<Option<ConcurrencyPermit>, Refusal> {
    let agent = AgentKey::of(uid);
    let rule_id = decision.rule_id.as_deref().map(str::to_string);
    if let (Some(rate), Some(id)) = (decision.obligations.rate, &decision.rule_id) {
        let local = match rate.scope {
            RateScope::Local => Some(false),
            RateScope::Fleet => match fleet(proxy, id, agent, host, rate).await {
                Ok(Taken::Fleet) => None,
                Ok(Taken::Fallback) => Some(true),
                Err(r) => return Err(Refusal { rule_id, ..r }),
            },
        };
        if let Some(fell_back) = local {
            let key = [(LimitKey::Rule(id.clone()), rate.into())];
            if let Err(l) = proxy.limiter.check(agent, &key) {
                return Err(Refusal {
                    rule_id,
                    ..rate_refusal(&l, host, agent, fell_back)
                });
            }
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

/// Where a fleet rule's token came from.
enum Taken {
    /// The shared store's bucket.
    Fleet,
    /// None yet: the store did not answer, take it from the rule's local bucket.
    Fallback,
}

/// A fleet rule's token from the shared store, or the refusal.
async fn fleet(
    proxy: &Proxy,
    rule: &str,
    agent: AgentKey,
    host: &str,
    rate: crate::policy::RateLimit,
) -> Result<Taken, Refusal> {
    // The policy loads fleet rules only with a store configured; without one, fail closed.
    let verdict = match &proxy.fleet {
        Some(f) => f.check(rule, agent, host, rate.into()).await,
        None => FleetVerdict::Refused(StoreErrorReason::Unreachable),
    };
    match verdict {
        FleetVerdict::Allowed => Ok(Taken::Fleet),
        FleetVerdict::Local(_) => Ok(Taken::Fallback),
        FleetVerdict::Limited(wait) => {
            let secs = secs_up(wait);
            Err(Refusal {
                retry_after: Some(secs),
                limit_scope: Some(LimitScope::Fleet),
                ..Refusal::new(
                    ErrorCode::RateLimited,
                    format!(
                        "fleet rate limit of rule:{rule} reached for {host} (shared by every \
                         daemon of the fleet); retry in {secs} s"
                    ),
                )
            })
        }
        FleetVerdict::Refused(reason) => Err(Refusal {
            retry_after: Some(1),
            limit_scope: Some(LimitScope::Fleet),
            ..Refusal::new(
                ErrorCode::RateLimitStoreUnavailable,
                format!(
                    "fleet rate limit of rule:{rule} could not be checked: its store is {} \
                     (ratelimit.on_store_error = \"deny\")",
                    match reason {
                        StoreErrorReason::Timeout => "too slow to answer",
                        StoreErrorReason::Reply => "answering with errors",
                        StoreErrorReason::Unreachable | StoreErrorReason::Io => "unreachable",
                    }
                ),
            )
        }),
    }
}

/// Whole seconds, rounded up, at least 1.
fn secs_up(d: Duration) -> u64 {
    let up = u64::from(d.subsec_nanos() > 0);
    d.as_secs().saturating_add(up).max(1)
}

fn rate_refusal(l: &Limited, host: &str, agent: AgentKey, fleet_fallback: bool) -> Refusal {
    let secs = l.retry_after_secs();
    let (scope, shown) = if fleet_fallback {
        (
            LimitScope::LocalFallback,
            " (local fallback of a fleet rate: its store is unreachable)",
        )
    } else {
        (LimitScope::Local, "")
    };
    Refusal {
        retry_after: Some(secs),
        limit_scope: Some(scope),
        ..Refusal::new(
            ErrorCode::RateLimited,
            format!(
                "rate limit of {}{shown} reached for {host} by {agent}; retry in {secs} s",
                l.key
            ),
        )
    }
}
