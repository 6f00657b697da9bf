//! LLM token budgets (`budget = { tokens, per, scope }` on a rule, `policy/budget.rs`): the
//! counters, and the meter that counts each response's tokens as it streams to the agent.
//!
//! # Counting
//! A response's tokens are what its `usage` says (`usage.rs`): OpenAI's `total_tokens` (or
//! `prompt_tokens + completion_tokens`), Anthropic's `input_tokens + output_tokens`, read
//! from a JSON body (`json_scan.rs`: the top-level `usage`) or an event stream (`sse.rs`:
//! the usage-bearing events), in one pass as the bytes go by, never holding a byte back
//! (`meter.rs`); a gzip, deflate or br body is decoded on the way (`decode.rs`). A response
//! whose usage cannot be read (none in it, another format, another coding, an overlong
//! value) counts `(request body + response body bytes) / 4`, rounded up: an estimate, and
//! the record says so (`budget.estimated`).
//!
//! # Windows and counters
//! A budget's window is fixed and aligned to the Unix epoch (`window.rs`); a counter belongs
//! to its window and reads 0 in the next. `scope = "agent"` counts per rule and agent uid,
//! `"host"` per rule and destination host (both in this daemon), `"fleet"` per rule in the
//! shared store (`fleet.rs`). A request is refused once its counter has reached the budget;
//! one already in flight when that happens completes and is counted (so a window may end a
//! response's worth over its budget, never more than the requests then in flight).
//! A response is charged to the window it ends in.
//!
//! # Bounds
//! At most [`MAX_COUNTERS`] host counters (the subjects an agent can multiply, by naming
//! hosts a wildcard rule matches); when full, counters of past windows go, and if it is still
//! full a new host is counted in the requesting agent's overflow counter of that rule, which
//! every host that agent reaches then also answers to (refusing sooner, never later). An agent
//! that fills the table spends only its own overflow: another agent's hosts are never charged
//! to it. Agent and fleet counters are bounded by the local users and the rules, and always
//! kept.

mod decode;
pub(crate) mod fleet;
mod json_scan;
pub(crate) mod meter;
mod metrics;
mod sse;
#[cfg(test)]
mod tests;
mod usage;
pub(crate) mod window;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::Registry;
use serde::Serialize;

use crate::policy::{format_budget_per, BudgetScope, TokenBudget};
pub(crate) use meter::Meter;
pub(crate) use metrics::BudgetMetrics;
use window::Window;

/// The most counters kept at once.
pub(crate) const MAX_COUNTERS: usize = 16 * 1024;

/// Whose counter a request spends from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Subject {
    /// An agent uid (`None`: connections whose owner the OS could not tell share one).
    Agent(Option<u32>),
    /// A destination host (as records show it).
    Host(Arc<str>),
    /// The fleet's shared counter (this daemon keeps what it last saw of it).
    Fleet,
    /// The counter of an agent's new hosts when [`MAX_COUNTERS`] host counters are in use.
    Overflow(Option<u32>),
}

impl Subject {
    /// The subject of a request by `uid` to `host` under a budget of `scope`.
    pub(crate) fn of(scope: BudgetScope, uid: Option<u32>, host: &str) -> Subject {
        match scope {
            BudgetScope::Agent => Subject::Agent(uid),
            BudgetScope::Host => Subject::Host(host.into()),
            BudgetScope::Fleet => Subject::Fleet,
        }
    }

    /// As `ctl status` shows it.
    fn shown(&self) -> String {
        match self {
            Subject::Agent(Some(uid)) => format!("uid {uid}"),
            Subject::Agent(None) => "unknown uid".into(),
            Subject::Host(h) => h.to_string(),
            Subject::Fleet => "fleet".into(),
            Subject::Overflow(Some(uid)) => format!("overflow of uid {uid}"),
            Subject::Overflow(None) => "overflow of unknown uid".into(),
        }
    }
}

/// The metric label of an agent uid.
pub(crate) fn agent_label(uid: Option<u32>) -> String {
    uid.map_or_else(|| "unknown".into(), |u| u.to_string())
}

/// A counter's window and what it has spent in it.
#[derive(Debug, Clone, Copy)]
struct Counter {
    per_ms: u64,
    window: u64,
    spent: u64,
    limit: u64,
    ends_ms: u64,
}

/// A budget's standing: what its window has spent, and the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Standing {
    pub spent: u64,
    pub window: Window,
}

/// One counter, as `ctl status` shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Spend {
    pub rule: String,
    pub scope: &'static str,
    /// `uid 1001`, a host, `fleet` or `overflow`.
    pub who: String,
    pub spent: u64,
    pub limit: u64,
    pub per: String,
    pub resets: String,
}

type Key = (Arc<str>, Subject);
type Entry = (Counter, BudgetScope, u64);

/// The counters, and how many of them are host counters (the bounded kind).
#[derive(Default)]
struct Table {
    map: HashMap<Key, Entry>,
    hosts: usize,
    /// When counters of past windows were last dropped to make room.
    swept_ms: u64,
}

/// Every rule's token counters in this daemon.
pub(crate) struct TokenBudgets {
    counters: Mutex<Table>,
    pub(crate) metrics: BudgetMetrics,
}

impl TokenBudgets {
    /// Its series go into `registry` under `namespace`.
    pub(crate) fn new(registry: &Registry, namespace: &str) -> TokenBudgets {
        TokenBudgets {
            counters: Mutex::new(Table::default()),
            metrics: BudgetMetrics::register(registry, namespace),
        }
    }

    /// What `subject` has spent of `rule`'s budget in the window of `now_ms`; for a host, with
    /// what `agent`'s overflow counter of the rule holds.
    pub(crate) fn standing(
        &self,
        rule: &Arc<str>,
        budget: TokenBudget,
        subject: &Subject,
        agent: Option<u32>,
        now_ms: u64,
    ) -> Standing {
        let window = Window::at(budget.per, now_ms);
        let counters = self.lock();
        let spent_by = |who: Subject| {
            counters
                .map
                .get(&(rule.clone(), who))
                .filter(|(c, _, _)| c.window == window.index && c.per_ms == per_ms(budget))
                .map_or(0, |(c, _, _)| c.spent)
        };
        let mut spent = spent_by(subject.clone());
        if matches!(subject, Subject::Host(_)) {
            spent = spent.saturating_add(spent_by(Subject::Overflow(agent)));
        }
        Standing { spent, window }
    }

    /// Adds `tokens` spent by `agent` to `subject`'s counter of `rule` in the window of
    /// `now_ms`; its standing after (as [`Self::standing`] reads it).
    pub(crate) fn charge(
        &self,
        rule: &Arc<str>,
        budget: TokenBudget,
        subject: &Subject,
        agent: Option<u32>,
        tokens: u64,
        now_ms: u64,
    ) -> Standing {
        self.update(rule, budget, subject, agent, now_ms, |spent| {
            spent.saturating_add(tokens)
        });
        self.standing(rule, budget, subject, agent, now_ms)
    }

    /// Sets `subject`'s counter to `spent` (what the fleet's store said).
    pub(crate) fn seen(
        &self,
        rule: &Arc<str>,
        budget: TokenBudget,
        subject: &Subject,
        spent: u64,
        now_ms: u64,
    ) -> Standing {
        self.update(rule, budget, subject, None, now_ms, |_| spent)
    }

    /// Applies `f` to the counter `subject`'s spend goes to: its own, or, for a new host while
    /// the table is full, `agent`'s overflow counter of the rule.
    fn update(
        &self,
        rule: &Arc<str>,
        budget: TokenBudget,
        subject: &Subject,
        agent: Option<u32>,
        now_ms: u64,
        f: impl FnOnce(u64) -> u64,
    ) -> Standing {
        let window = Window::at(budget.per, now_ms);
        let fresh = Counter {
            per_ms: per_ms(budget),
            window: window.index,
            spent: 0,
            limit: budget.tokens,
            ends_ms: window.ends_ms,
        };
        let mut counters = self.lock();
        let mut key = (rule.clone(), subject.clone());
        let is_host = matches!(subject, Subject::Host(_));
        if is_host && counters.hosts >= MAX_COUNTERS && !counters.map.contains_key(&key) {
            // Counters of past windows go, at most once a second (each sweep walks them all).
            if now_ms.saturating_sub(counters.swept_ms) >= 1000 {
                counters.swept_ms = now_ms;
                counters.map.retain(|_, (c, _, _)| {
                    c.window == Window::at(std::time::Duration::from_millis(c.per_ms), now_ms).index
                });
                counters.hosts = counters
                    .map
                    .keys()
                    .filter(|(_, who)| matches!(who, Subject::Host(_)))
                    .count();
            }
            if counters.hosts >= MAX_COUNTERS {
                key.1 = Subject::Overflow(agent);
            }
        }
        if matches!(key.1, Subject::Host(_)) && !counters.map.contains_key(&key) {
            counters.hosts += 1;
        }
        let entry = counters
            .map
            .entry(key)
            .or_insert((fresh, budget.scope, budget.per.as_secs()));
        if entry.0.window != fresh.window || entry.0.per_ms != fresh.per_ms {
            entry.0 = fresh;
        }
        entry.0.limit = budget.tokens;
        entry.1 = budget.scope;
        entry.2 = budget.per.as_secs();
        entry.0.spent = f(entry.0.spent);
        Standing {
            spent: entry.0.spent,
            window,
        }
    }

    /// The counters of windows not yet over, by rule then subject.
    pub(crate) fn snapshot(&self) -> Vec<Spend> {
        let now = window::now_ms();
        let counters = self.lock();
        let mut out: Vec<Spend> = counters
            .map
            .iter()
            .filter(|(_, (c, _, _))| c.ends_ms > now)
            .map(|((rule, who), (c, scope, per))| Spend {
                rule: rule.to_string(),
                scope: scope.as_str(),
                who: who.shown(),
                spent: c.spent,
                limit: c.limit,
                per: format_budget_per(std::time::Duration::from_secs(*per)),
                resets: Window {
                    index: c.window,
                    ends_ms: c.ends_ms,
                }
                .resets(),
            })
            .collect();
        out.sort_by(|a, b| (&a.rule, &a.who).cmp(&(&b.rule, &b.who)));
        out
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding it cannot leave a counter half-written: take it back.
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn per_ms(budget: TokenBudget) -> u64 {
    u64::try_from(budget.per.as_millis()).unwrap_or(u64::MAX)
}
