//! Fleet-wide budgets (`scope = "fleet"`): one counter per rule and window in the shared
//! store (`[ratelimit] store`), so every daemon of the fleet spends from it. A check reads it
//! (GET, within `ratelimit.timeout`); a settled response adds its tokens (INCRBY with an
//! expiry just after the window, atomically, in a task of its own: the agent never waits
//! for it). Without an answer, `ratelimit.on_store_error` says, as for fleet rates:
//! `"local"`, this daemon's own count of the counter stands in (what it last saw plus what
//! it added since); `"deny"`, the request is refused (`rate_limit_store_unavailable`).

use std::sync::Arc;

use crate::config::OnStoreError;
use crate::policy::TokenBudget;
pub(crate) use crate::ratelimit::fleet::FleetCounter;
use crate::ratelimit::fleet::StoreErrorReason;

use super::window::{self, Window};
use super::{Standing, Subject, TokenBudgets};

/// How long past its window's end a counter is kept (then it expires).
const KEEP_AFTER_MS: u64 = 1000;

/// What the fleet's counter says for a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FleetStanding {
    /// The store answered.
    Known(Standing),
    /// No answer; `on_store_error = "local"`: this daemon's own count.
    Local(Standing),
    /// No answer; `on_store_error = "deny"`.
    Refused(StoreErrorReason),
}

/// The key of `rule`'s counter in `window`: the rule's id as written (length-prefixed, so no
/// id spells another's key), the window's length and index, so a changed `per` starts anew.
pub(crate) fn key(counter: &FleetCounter, rule: &str, budget: TokenBudget, w: Window) -> String {
    counter.key(&format!(
        "budget:{}:{rule}:{}:{}",
        rule.len(),
        budget.per.as_millis(),
        w.index
    ))
}

/// The fleet counter of `rule` now.
pub(crate) async fn standing(
    counter: &FleetCounter,
    budgets: &TokenBudgets,
    rule: &Arc<str>,
    budget: TokenBudget,
) -> FleetStanding {
    let now = window::now_ms();
    let w = Window::at(budget.per, now);
    match counter.get(&key(counter, rule, budget, w)).await {
        Ok(spent) => FleetStanding::Known(budgets.seen(rule, budget, &Subject::Fleet, spent, now)),
        Err(reason) => match counter.on_error {
            OnStoreError::Local => {
                FleetStanding::Local(budgets.standing(rule, budget, &Subject::Fleet, None, now))
            }
            OnStoreError::Deny => FleetStanding::Refused(reason),
        },
    }
}

impl FleetCounter {
    /// Adds `tokens` to `rule`'s counter of the window now, in a task of its own; what the
    /// store then says becomes this daemon's view of it.
    pub(crate) fn add_later(
        &self,
        budgets: Arc<TokenBudgets>,
        rule: Arc<str>,
        budget: TokenBudget,
        tokens: u64,
    ) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let counter = self.clone();
        rt.spawn(async move {
            let now = window::now_ms();
            let w = Window::at(budget.per, now);
            let key = key(&counter, &rule, budget, w);
            let expire = w.ends_ms.saturating_add(KEEP_AFTER_MS);
            if let Ok(spent) = counter.add(&key, tokens, expire).await {
                budgets.seen(&rule, budget, &Subject::Fleet, spent, window::now_ms());
            }
        });
    }
}
