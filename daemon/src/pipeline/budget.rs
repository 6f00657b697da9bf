//! The budget phase: under a rule with a token `budget`, a request whose counter has reached
//! the budget in this window is refused (429 `token_budget_exhausted`, with the budget, the
//! spend and the reset time in its JSON, and `Retry-After` until the reset); otherwise it
//! goes on with a meter (`budget::Meter`) that counts its response's tokens, tapped on the
//! response body by `forward` and settled when the record is completed.
//!
//! A fleet-wide budget reads the shared store first (the only await here, bounded by
//! `ratelimit.timeout`); without an answer, `ratelimit.on_store_error` says (`budget::fleet`).

use std::sync::Arc;

use super::refusal::Refusal;
use super::RequestCtx;
use crate::budget::fleet::{self, FleetStanding};
use crate::budget::window::{self, Window};
use crate::budget::{Meter, Standing, Subject};
use crate::policy::{format_budget_per, BudgetScope, TokenBudget};
use crate::ratelimit::fleet::StoreErrorReason;
use crate::record::{BudgetFacts, ErrorCode, LimitScope};

pub(super) async fn check(ctx: &mut RequestCtx) -> Result<(), Refusal> {
    let decision = ctx.decision.as_ref().expect("the decide phase ran");
    let (Some(budget), Some(rule)) = (decision.obligations.budget, decision.rule_id.clone()) else {
        return Ok(());
    };
    let uid = ctx.conn.agent_uid;
    let host = ctx
        .target
        .as_ref()
        .expect("the target phase ran")
        .host
        .clone();
    let shown_host = ctx.proxy.vault.current().redact(&host).into_owned();
    let subject = Subject::of(budget.scope, uid, &shown_host);
    let tokens = &ctx.proxy.tokens;
    let (before, counter) = match budget.scope {
        BudgetScope::Agent | BudgetScope::Host => (
            tokens.standing(&rule, budget, &subject, uid, window::now_ms()),
            None,
        ),
        BudgetScope::Fleet => {
            // The policy loads fleet budgets only with a store configured; without one,
            // fail closed.
            let Some(counter) = ctx.proxy.fleet.as_ref().map(|f| f.counter()) else {
                return Err(store_refusal(&rule, StoreErrorReason::Unreachable));
            };
            match fleet::standing(&counter, tokens, &rule, budget).await {
                FleetStanding::Known(s) | FleetStanding::Local(s) => (s, Some(counter)),
                FleetStanding::Refused(reason) => return Err(store_refusal(&rule, reason)),
            }
        }
    };
    if before.spent >= budget.tokens {
        tokens
            .metrics
            .exhausted(&rule, &crate::budget::agent_label(uid));
        return Err(exhausted(&rule, budget, &subject, before));
    }
    ctx.budget = Some(Arc::new(Meter::new(
        tokens.clone(),
        rule,
        budget,
        subject,
        uid,
        before,
        counter,
    )));
    Ok(())
}

/// The refusal of a request whose budget is spent.
fn exhausted(rule: &str, budget: TokenBudget, subject: &Subject, s: Standing) -> Refusal {
    let now = window::now_ms();
    let resets = s.window.resets();
    let whose = match subject {
        Subject::Agent(Some(uid)) => format!(" for uid {uid}"),
        Subject::Agent(None) => " for agents of unknown uid".into(),
        Subject::Host(h) => format!(" for {h}"),
        Subject::Fleet => " (shared by every daemon of the fleet)".into(),
        Subject::Overflow(_) => " (this agent's overflow counter)".into(),
    };
    let retry = Window::retry_after(&s.window, now);
    Refusal {
        retry_after: Some(retry),
        budget: Some(Box::new(BudgetFacts {
            tokens: 0,
            estimated: false,
            spent: s.spent,
            limit: budget.tokens,
            resets: resets.clone().into(),
        })),
        ..Refusal::new(
            ErrorCode::TokenBudgetExhausted,
            format!(
                "token budget of rule:{rule} ({} tokens per {}) is spent{whose}: {} tokens \
                 used; it resets at {resets}",
                budget.tokens,
                format_budget_per(budget.per),
                s.spent
            ),
        )
    }
}

/// A fleet budget whose store did not answer, with `on_store_error = "deny"`.
fn store_refusal(rule: &str, reason: StoreErrorReason) -> Refusal {
    Refusal {
        retry_after: Some(1),
        limit_scope: Some(LimitScope::Fleet),
        ..Refusal::new(
            ErrorCode::RateLimitStoreUnavailable,
            format!(
                "fleet token budget of rule:{rule} could not be checked: its store is {} \
                 (ratelimit.on_store_error = \"deny\")",
                match reason {
                    StoreErrorReason::Timeout => "too slow to answer",
                    StoreErrorReason::Reply => "answering with errors",
                    StoreErrorReason::Unreachable | StoreErrorReason::Io => "unreachable",
                }
            ),
        )
    }
}
